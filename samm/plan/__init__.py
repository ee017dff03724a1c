"""Plan stage: the Policy Evaluation Service (FastAPI) and its policy registry and sessions."""
