"""VM oversubscription: C2MARL (Sheng et al., "Learning Cooperative Oversubscription for Cloud by
Chance-Constrained Multi-Agent Reinforcement Learning"), see docs/oversubscription.md.

Modules: `settings` (the paper's constants and our step/episode reading), `workload` (the VM table
an episode replays) and `data` (the Azure-schema loader and the calibrated generator), `cluster`
(best fit and hotness, shared with the live path), `sim` (Oversub Gym), `metrics` (PM-Hot-R,
C-Hot-R, S-Cores), `features` (the paper's observation), `env` (Gymnasium), `network` + `c2marl` +
`train` (the agent, Alg. 1), `policy` (what is hosted), `baselines` + `tuning` (Grid, MA, SL and the
production overcommit predictors, tuned on training days), `experiment` (`samm experiment c2marl`),
`service` (the REST admit operation).
"""
from agents.registry import ProblemSpec, register_problem

_RULE_AGENTS = ("nsigma", "percentile", "max-predictor", "ma-des")   # policy.HOSTED_RULES, without importing numpy here

PROBLEM = register_problem(ProblemSpec(
    name="oversubscription",
    title="VM oversubscription (C2MARL)",
    paper="c2marl-oversubscription.txt",
    env_id="samm/Oversubscription-v0",
    env_entry_point="agents.oversubscription.env:OversubscriptionEnv",
    agents={name: "agents.oversubscription.hosting:make_policy" for name in ("c2marl", *_RULE_AGENTS)},
    learner="c2marl",
    default_agent="c2marl",
    policy_loader="agents.oversubscription.policy:OversubPolicy.load",
    make_policy="agents.oversubscription.hosting:make_policy",
    experiment="agents.oversubscription.experiment:run",
    train="agents.oversubscription.train:main",
    routes="agents.oversubscription.service:add_routes",
))
