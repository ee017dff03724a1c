"""`samm evaluate --problem lra-placement`: one planner on seeded random batches, beside the
exact optimum of each batch (under the same predictor)."""
from __future__ import annotations

import time

import numpy as np

from .cluster import Cluster, Constraints, check_plan, score
from .env import sample_batch
from .predictor import predictor_by_name


def planner_function(agent: str, policy_dir=None):
    """A planner name of `baselines.PLANNERS`, or `lra-reinforce` (a saved or the shipped
    policy trained across batches), or `lra-reinforce-per-batch` (the paper's method)."""
    from .baselines import PLANNERS

    if agent in PLANNERS:
        return PLANNERS[agent]
    if agent == "lra-reinforce-per-batch":
        from .reinforce import plan_reinforce

        return plan_reinforce
    if agent == "lra-reinforce":
        from .hosting import make_policy

        return make_policy(agent, policy_dir).plan
    known = sorted(PLANNERS) + ["lra-reinforce", "lra-reinforce-per-batch"]
    raise ValueError(f"unknown planner {agent!r}; known: {', '.join(known)}")


def evaluate(agent: str, seeds, *, policy_dir=None, n_nodes: int = 9, slots: int = 8,
             size_range=(15, 48), skew: str | None = None, predictor: str = "forest",
             with_optimum: bool = True) -> dict:
    pred = predictor_by_name(predictor, slots=slots)
    plan = planner_function(agent, policy_dir)
    cluster = Cluster(n_nodes, slots)
    constraints = Constraints.none(len(pred.app_names))
    episodes = []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        batch = sample_batch(rng, len(pred.app_names), size_range, skew, capacity=cluster.capacity)
        t0 = time.perf_counter()
        placement = plan(cluster, batch, constraints, pred, np.random.default_rng(seed))
        seconds = time.perf_counter() - t0
        row = {"seed": int(seed), "containers": batch.size, "score": score(placement, pred),
               "seconds": round(seconds, 4), "valid": not check_plan(placement, batch, cluster, constraints)}
        if with_optimum:
            from .optimum import optimum

            opt = optimum(cluster, batch, constraints, pred)
            row["optimum"] = opt.score
            row["ratio_to_optimum"] = row["score"] / opt.score if opt.score else None
        episodes.append(row)
    from agents.report import stats

    keys = ("score", "seconds") + (("ratio_to_optimum",) if with_optimum else ())
    return {"agent": agent, "predictor": predictor, "nodes": n_nodes, "slots": slots, "seeds": list(seeds),
            "episodes": episodes, "summary": {k: stats(e[k] for e in episodes) for k in keys}}
