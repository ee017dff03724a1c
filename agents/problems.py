"""The one list of problem packages. Each registers its `ProblemSpec` on import."""
from __future__ import annotations

import importlib

PACKAGES = (
    "agents.autoscaling",      # VM autoscaling, LSTM-PPO (the main paper)
    "agents.lra_placement",    # long-running container placement (DRL-Scheduler)
    "agents.oversubscription", # VM oversubscription (C2MARL)
    "agents.deferrable_jobs",  # deferrable-job scheduling (OSDEC)
    "agents.microservice_cores",  # microservice CPU cores (Reclaimer)
)

_loaded = False


def load_all() -> None:
    global _loaded
    if _loaded:
        return
    for pkg in PACKAGES:
        importlib.import_module(pkg)
    _loaded = True
