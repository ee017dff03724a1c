"""Deferrable-job scheduling: OSDEC (Dong et al., "Online Scheduling of Deferrable Jobs in Cloud
with Deep Reinforcement Learning and Auxiliary Tasks"), see docs/deferrable-jobs.md.

Modules: `settings` (the paper's constants, Table 4's cases and our readings), `episode` (the
jobs and capacity an episode replays) and `data` (Alibaba 2017 jobs, datacenter capacity series),
`rules` (the prefix rule and Eq. 6, pure), `sim` (the simulator), `features` (job tokens, slot
summaries), `env` (Gymnasium), `network` + `osdec` + `train` (the agent, its Table 1 variants,
Algorithm 1), `policy` (what is hosted), `baselines` + `tuning` (FIFO, SJF, Tetris, EDF, least
slack, EASY backfilling, tuned on training episodes), `experiment` (`samm experiment osdec`),
`service` (the REST schedule operation), `live` (the scheduling loop over the job queue) and
`daemon_loop` (that loop in `samm run`'s `loops:`).
"""
from agents.registry import ProblemSpec, register_problem

_RULE_AGENTS = ("fifo", "sjf", "tetris", "edf", "least-slack", "easy-backfill")

PROBLEM = register_problem(ProblemSpec(
    name="deferrable-jobs",
    title="Deferrable-job scheduling (OSDEC)",
    paper="osdec-deferrable-scheduling.txt",
    env_id="samm/DeferrableJobs-v0",
    env_entry_point="agents.deferrable_jobs.env:DeferrableJobsEnv",
    agents={name: "agents.deferrable_jobs.hosting:make_policy" for name in ("osdec", *_RULE_AGENTS)},
    learner="osdec",
    default_agent="osdec",
    policy_loader="agents.deferrable_jobs.policy:OsdecPolicy.load",
    make_policy="agents.deferrable_jobs.hosting:make_policy",
    experiment="agents.deferrable_jobs.experiment:run",
    train="agents.deferrable_jobs.train:main",
    routes="agents.deferrable_jobs.service:add_routes",
    loop_config="agents.deferrable_jobs.daemon_loop:DeferrableLoopConfig",
    build_loop="agents.deferrable_jobs.daemon_loop:build_loop",
))
