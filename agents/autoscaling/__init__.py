"""VM autoscaling (the main paper: LSTM-PPO over heterogeneous VM types in CloudSim Plus).

The problem's modules predate the platform and keep their paths (`agents/base.py`,
`agents/baselines/`, `agents/ppo/`, `agents/experiment.py`, `sim_bridge/`); this package is its
entry in the problem catalogue.
"""
import sim_bridge  # noqa: F401  (registers samm/CloudSim-v0 with its vector entry point)
from agents.registry import ProblemSpec, register_problem

PROBLEM = register_problem(ProblemSpec(
    name="autoscaling",
    title="VM autoscaling (LSTM-PPO, heterogeneous VM types)",
    paper="samm-lstm-ppo-heterogeneous-autoscaling.txt",
    env_id="samm/CloudSim-v0",
    env_entry_point="sim_bridge.envs:CloudSimEnv",
    agents={
        "lstm-ppo": "agents.ppo.agent:LstmPpoAgent",
        "threshold": "agents.baselines.threshold:ThresholdAgent",
        "target-tracking": "agents.baselines.target_tracking:TargetTrackingAgent",
        "queue": "agents.baselines.queue:QueueAgent",
        "noop": "agents.builtin:NoopAgent",
        "random": "agents.builtin:RandomAgent",
        "static": "agents.builtin:StaticAgent",
    },
    learner="lstm-ppo",
    default_agent="lstm-ppo",
    policy_loader="agents.base:load_agent",
    make_policy="agents.factory:make_hosted_agent",
    experiment="agents.experiment:run_paper_experiment",
    train="agents.training:train_lstm_ppo",
))
