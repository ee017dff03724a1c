"""Evaluate an agent on a workload over several seeds: per-episode results and mean ± std."""
from __future__ import annotations

import numpy as np

from sim_bridge.config import SimConfig
from sim_bridge.runner import run_episodes
from sim_bridge.workloads import Workload

SUMMARY_KEYS = ("total_cost", "vm_cost", "wait_penalty", "makespan_s", "mean_wait_s", "p95_wait_s",
                "mean_allocated_cores", "mean_allocated_ratio", "mean_cpu_util", "steps", "total_reward")


def summarise(episodes: list[dict]) -> dict:
    out = {}
    for k in SUMMARY_KEYS:
        vals = np.array([e[k] for e in episodes if e.get(k) is not None], dtype=np.float64)
        if len(vals):
            out[k] = {"mean": round(float(vals.mean()), 4), "std": round(float(vals.std(ddof=1)) if len(vals) > 1 else 0.0, 4)}
    out["episodes"] = len(episodes)
    out["jobs_finished_ratio"] = round(sum(e["jobs_finished"] for e in episodes)
                                       / max(1, sum(e["jobs_total"] for e in episodes)), 4)
    out["all_terminated"] = bool(episodes) and all(e["terminated"] for e in episodes)  # none ran: not "all ended"
    return out


def evaluate(agent, sim: SimConfig, workload: Workload, seeds, deterministic: bool = True,
             traces: bool = False) -> dict:
    seeds = list(seeds)  # an iterator, once run, left the report's "seeds" empty
    episodes = run_episodes(sim, workload, agent, seeds, deterministic=deterministic, traces=traces)
    return {
        "agent": agent.kind,
        "policy_version": agent.version,
        "params": agent.params,
        "workload": workload.name,
        "deterministic": deterministic,
        "seeds": [int(s) for s in seeds],
        "summary": summarise(episodes),
        "episodes": episodes,
    }
