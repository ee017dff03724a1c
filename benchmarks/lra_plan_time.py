"""Time to a plan for 400 containers on 81 nodes x 8 slots: the trained policy, greedy-ls and the
exact optimum, in the same run on the same batches (the forest predictor on Metis's data).

Each seed draws one uniform batch of exactly 400 containers (`env.sample_batch`), no constraints.
Every planner plans every batch once; reported per planner: the median seconds and the median
score over the seeds, and the ratios of both to greedy-ls's medians in this run. The predictor's
table is loaded (and cached) before any timer starts; each planner's own set-up (e.g. the policy's
composition table) is inside its timer, as a service would pay it on a cold request.

    .venv/bin/python benchmarks/lra_plan_time.py --seeds 1 2 3
    .venv/bin/python benchmarks/lra_plan_time.py --predictor synthetic   # no data needed
"""
from __future__ import annotations

import argparse
import json
import platform
import os
import statistics
import time

import numpy as np

N_NODES, SLOTS, CONTAINERS = 81, 8, 400


def main(argv=None) -> dict:
    from agents.lra_placement.baselines import PLANNERS
    from agents.lra_placement.cluster import Cluster, Constraints, check_plan, score
    from agents.lra_placement.env import sample_batch
    from agents.lra_placement.experiment import load_trained_policy, make_predictor, method_rng, policy_plan

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--predictor", choices=["forest", "synthetic"], default="forest")
    args = parser.parse_args(argv)
    if min(args.seeds) < 0:  # numpy's generators take no negative seed
        parser.error(f"--seeds must be non-negative integers, got {min(args.seeds)}")

    predictor = make_predictor(args.predictor, SLOTS)
    n_apps = len(predictor.app_names)
    cluster = Cluster(N_NODES, SLOTS)
    constraints = Constraints.none(n_apps)
    policy, why = load_trained_policy()

    planners = {"greedy-ls": PLANNERS["greedy-ls"], "optimum": PLANNERS["optimum"]}
    if policy is not None:
        planners = {"lra-policy": lambda c, b, k, p, r: policy_plan(policy, c, b, k, p, r)[0],
                    "lra-policy + local-search polish": lambda c, b, k, p, r: policy_plan(policy, c, b, k, p, r)[2],
                    **planners}

    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in planners}
    for seed in args.seeds:
        batch = sample_batch(np.random.default_rng(seed), n_apps, (CONTAINERS, CONTAINERS), None, cluster.capacity)
        for name, plan in planners.items():
            t0 = time.perf_counter()
            placement = plan(cluster, batch, constraints, predictor, method_rng(seed, name))
            seconds = time.perf_counter() - t0
            problems = check_plan(placement, batch, cluster, constraints)
            if problems:
                raise AssertionError(f"{name} seed {seed}: invalid plan: {problems}")
            runs[name].append((seconds, score(placement, predictor)))

    med = {name: {"seconds": statistics.median(s for s, _ in r), "score": statistics.median(v for _, v in r)}
           for name, r in runs.items()}
    ref = med["greedy-ls"]
    result = {
        "benchmark": "lra_plan_time", "nodes": N_NODES, "slots": SLOTS, "containers": CONTAINERS,
        "predictor": args.predictor, "seeds": args.seeds,
        "planners": {name: {"median_seconds": round(m["seconds"], 4), "median_score": round(m["score"], 5),
                            "seconds_vs_greedy_ls": round(m["seconds"] / ref["seconds"], 2),
                            "score_vs_greedy_ls": round(m["score"] / ref["score"], 5),
                            "per_seed_seconds": [round(s, 4) for s, _ in runs[name]]}
                     for name, m in med.items()},
        "policy": "shipped" if policy is not None else f"not available ({why})",
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "system": platform.platform()},
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
