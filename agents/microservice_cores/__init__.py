"""Microservice CPU cores: Reclaimer (Fettes et al., "Reclaimer: A Reinforcement Learning Approach
to Dynamic Resource Allocation for Cloud Microservices"), see docs/microservice-cores.md.

Modules: `topology` (applications as YAML, shared with the real testbed; topologies/), `sim` (the
vectorised queueing-network simulator), `observation` (what one second measures, on every path),
`features` (the paper's per-service rows), `control` (the Controller contract and bounds),
`episode` (the paper's episode protocol), `env` (Gymnasium), `sac` + `train` (the agent and
Algorithm 2), `policy` + `hosting` (what is served and driven), `autoscale`, `vpa`, `sinan`,
`static_search` (the baselines), `experiment` (`samm experiment reclaimer`), `service` (the
REST allocate operation). The real-container testbed is samm/testbed/microservices/.
"""
from agents.registry import ProblemSpec, register_problem

PROBLEM = register_problem(ProblemSpec(
    name="microservice-cores",
    title="Microservice CPU cores (Reclaimer)",
    paper="reclaimer-microservice-cores.txt",
    env_id="samm/MicroserviceCores-v0",
    env_entry_point="agents.microservice_cores.env:MicroserviceCoresEnv",
    agents={"reclaimer": "agents.microservice_cores.hosting:make_policy"},
    learner="reclaimer",
    default_agent="reclaimer",
    policy_loader="agents.microservice_cores.policy:ReclaimerPolicy.load",
    make_policy="agents.microservice_cores.hosting:make_policy",
    experiment="agents.microservice_cores.experiment:run",
    train="agents.microservice_cores.train:main",
    routes="agents.microservice_cores.service:add_routes",
    loop_config="agents.microservice_cores.daemon_loop:MicroserviceLoopConfig", build_loop="agents.microservice_cores.daemon_loop:build_loop",
))
