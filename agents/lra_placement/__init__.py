"""Long-running application (LRA) container placement: the DRL-Scheduler paper
(Deng et al., IJCCC 18(4):5013, 2023), with Metis's measured co-location data as the
interference model (see docs/lra-placement.md).

Modules: `cluster` (the data model every planner shares), `data` + `predictor` (interference
models), `env` (the paper's MDP as a Gymnasium env), `baselines` and `optimum` (planners),
`reinforce` (the paper's per-batch agent), `network`/`policy`/`train` (a policy trained across
batches), `experiment` (`samm experiment lra`), `place` + `orchestrate` (`samm place`),
`service` (the REST plan operation).
"""
from agents.registry import ProblemSpec, register_problem

PROBLEM = register_problem(ProblemSpec(
    name="lra-placement",
    title="Long-running container placement (DRL-Scheduler)",
    paper="lra-container-placement.txt",
    env_id="samm/LraPlacement-v0",
    env_entry_point="agents.lra_placement.env:LraPlacementEnv",
    agents={"lra-reinforce": "agents.lra_placement.hosting:make_policy"},
    learner="lra-reinforce",
    default_agent="lra-reinforce",
    policy_loader="agents.lra_placement.policy:PlacementPolicy.load",
    make_policy="agents.lra_placement.hosting:make_policy",
    experiment="agents.lra_placement.experiment:run",
    train="agents.lra_placement.train:train_generalist",
    routes="agents.lra_placement.service:add_routes",
))
