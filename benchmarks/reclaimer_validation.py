"""Cost of one training validation (`--eval-every`): a shipped Reclaimer policy on the experiment's
three load levels, one 300-s episode per validation seed, acted the experiment's way (one fork of
the policy per copy, the baseline) and the way training now does (`ReclaimerPolicy.batch`: the
whole simulated batch at once). The two must give the same figures to the bit; the speed-up is
the fork's seconds over the batch's.

    .venv/bin/python -m benchmarks.reclaimer_validation --apps hotel,social --seeds 101-120

The shipped Social recipe validates 20 times on 20 seeds (docs/microservice-cores.md, "Training
speed, a third look").
"""
from __future__ import annotations

import argparse
import json
import time

from samm.cli.seeds import parse_seeds


def measure(app: str, seeds: tuple[int, ...], threads: int) -> dict:
    import numpy as np
    import torch

    from agents.microservice_cores.episode import run_episodes
    from agents.microservice_cores.experiment import FULL, levels
    from agents.microservice_cores.policy import shipped_policy

    torch.set_num_threads(threads)
    policy = shipped_policy(app)
    out = {"app": app, "seeds": len(seeds), "threads": threads}
    figures = {}
    for how in ("forks", "batch"):
        t = time.perf_counter()
        eps = []
        for users in levels(policy.topo, FULL.level_fractions):
            if how == "forks":
                eps += run_episodes(policy.topo, lambda i: policy.fork(), users, seeds)
            else:
                eps += run_episodes(policy.topo, None, users, seeds, batch=policy.batch())
        out[f"{how}_s"] = time.perf_counter() - t
        figures[how] = (np.stack([e.cores for e in eps]), np.stack([e.p99_ms for e in eps]))
        out[f"{how}_mean_cores"] = float(figures[how][0].sum(axis=2).mean())
    out["identical"] = bool(np.array_equal(figures["forks"][0], figures["batch"][0])
                            and np.array_equal(figures["forks"][1], figures["batch"][1], equal_nan=True))
    out["speedup"] = out["forks_s"] / out["batch_s"]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--apps", default="hotel,social")
    ap.add_argument("--seeds", default="101-120", help="validation seeds: LO-HI or a comma list")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (the shipped recipes' 2)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from agents.microservice_cores.policy import shipped_policy
    from agents.microservice_cores.topology import load_topology

    if args.threads < 1:  # torch refused it with a traceback
        ap.error(f"--threads must be at least 1, not {args.threads}")
    try:  # a bad option as one line, before any measurement
        seeds = tuple(parse_seeds(args.seeds))
        for app in args.apps.split(","):
            load_topology(app)
            shipped_policy(app)  # an app without one (chain3) raised after the apps before it
    except (ValueError, OSError) as exc:
        ap.error(str(exc))
    rows = [measure(app, seeds, args.threads) for app in args.apps.split(",")]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'app':8} {'seeds':>5} {'forks s':>8} {'batch s':>8} {'speed-up':>9} {'same figures':>13}")
    for r in rows:
        print(f"{r['app']:8} {r['seeds']:>5} {r['forks_s']:>8.2f} {r['batch_s']:>8.2f} {r['speedup']:>8.2f}x "
              f"{'yes' if r['identical'] else 'NO':>13}")
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
