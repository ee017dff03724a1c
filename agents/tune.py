"""Grid search of a baseline's parameters in simulation (lowest mean total cost wins)."""
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
        # an episode cut before its last job has no makespan: None, not inf (`--json` must be JSON)
        spans = [e["makespan_s"] for e in eps]
        rows.append({"params": params, "total_cost": float(np.mean([e["total_cost"] for e in eps])),
                     "makespan_s": None if None in spans else float(np.mean(spans)),
                     "episodes_unfinished": spans.count(None)})
    rows.sort(key=lambda r: r["total_cost"])
    best = make_agent(kind, sim, rows[0]["params"])
    return {"kind": kind, "best_params": rows[0]["params"], "best_total_cost": rows[0]["total_cost"],
            "grid": grid, "results": rows, "agent": best}
