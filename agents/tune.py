"""Grid search of a baseline's parameters in simulation: fewest episodes cut at the step cap with jobs
queued wins, then the lowest mean total cost."""
from __future__ import annotations

import itertools

import numpy as np

from sim_bridge.config import SimConfig
from sim_bridge.runner import run_episodes
from sim_bridge.workloads import Workload

from .factory import make_agent


def default_grid(kind: str) -> dict[str, list]:
    from .baselines import queue, target_tracking, threshold

    return {"threshold": threshold.GRID, "target-tracking": target_tracking.GRID, "queue": queue.GRID}[kind]


def candidates(kind: str, grid: dict[str, list]):
    keys = sorted(grid)
    for values in itertools.product(*(grid[k] for k in keys)):
        params = dict(zip(keys, values))
        if kind == "threshold" and params["lower"] > params["upper"]:
            continue
        yield params


def tune(kind: str, sim: SimConfig, workload: Workload, seeds, grid: dict[str, list] | None = None,
         progress: bool = True) -> dict:
    grid = grid or default_grid(kind)
    cands = list(candidates(kind, grid))
    rows = []
    it = cands
    if progress:
        from tqdm import tqdm

        it = tqdm(cands, desc=f"tuning {kind}", unit="cfg")
    for params in it:
        agent = make_agent(kind, sim, params)
        eps = run_episodes(sim, workload, agent, seeds)
        # an episode cut at the step cap with jobs queued has no makespan (the runner reports its
        # last finish so far, or None when no job finished): None, not inf (`--json` must be JSON).
        # Counted by jobs, as `generalisation.tune_rules` does: a None makespan missed every cut
        # episode in which some job had finished
        cut = sum(e["jobs_finished"] < e["jobs_total"] for e in eps)
        rows.append({"params": params, "total_cost": float(np.mean([e["total_cost"] for e in eps])),
                     "makespan_s": None if cut else float(np.mean([e["makespan_s"] for e in eps])),
                     "episodes_unfinished": int(cut)})
    rows.sort(key=_rank)
    best = make_agent(kind, sim, rows[0]["params"])
    return {"kind": kind, "best_params": rows[0]["params"], "best_total_cost": rows[0]["total_cost"],
            "grid": grid, "results": rows, "agent": best}


def _rank(row: dict) -> tuple:
    """Fewer episodes cut at the step cap with jobs still queued first, then the lower cost: a
    cut episode stops paying (VMs and waiting) when it stops, so a candidate stuck on the queue
    looked cheapest. As `generalisation_stats.score_candidates` ranks the suite's candidates."""
    return row["episodes_unfinished"], row["total_cost"]
