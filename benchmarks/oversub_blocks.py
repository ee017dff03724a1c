"""How the oversubscription trace's weeks differ, and how a saved C2MARL policy does on each kind
of episode (docs/oversubscription.md, "Longer training and heavier training weeks").

    .venv/bin/python benchmarks/oversub_blocks.py --setting azure [--policy DIR] [--episodes 6] --json

Per weekday block (the training block; each held-apart test block): VMs, the peak and mean of
live requested cores as a share of the cluster, and VM-hour usage. With `--policy`: PM-Hot-R and
S-Cores on each test block, on redrawn training days, and on bootstrap resamples of them (what
training episodes are).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def block_stats(w, setting) -> dict:
    t = np.arange(setting.episode_steps)
    live = (t[None, :] >= w.arrive[:, None]) & (t[None, :] < w.depart[:, None])
    requested = (live * w.cores[:, None]).sum(0) / (setting.pm_cores * setting.n_pms)
    u = w.usage[live]
    return {"vms": int(w.n_vms), "peak_requested": round(float(requested.max()), 3),
            "mean_requested": round(float(requested.mean()), 3), "mean_usage": round(float(u.mean()), 3),
            "p95_usage": round(float(np.percentile(u, 95)), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--setting", default="azure")
    ap.add_argument("--trace-seed", type=int, default=0)
    ap.add_argument("--policy", default=None, help="a saved C2MARL policy directory")
    ap.add_argument("--episodes", type=int, default=6, help="episodes per kind with --policy")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.episodes < 1:  # a mean over no episode
        ap.error("--episodes must be at least 1")
    # torch and the simulator load here, after the arguments: --help and a usage error took 4 s
    from agents.oversubscription.data import generate_trace
    from agents.oversubscription.settings import get_setting
    from agents.oversubscription.train import bootstrap_vms, evaluate_policy

    # every refusal before the trace is generated, as one line naming the option
    try:
        setting = get_setting(args.setting)
        if args.policy:
            from agents.oversubscription.policy import OversubPolicy

            policy = OversubPolicy.load(args.policy)
    except (ValueError, OSError) as exc:
        ap.error(str(exc))
    trace = generate_trace(setting, args.trace_seed)
    out = {"command": "python " + " ".join(sys.argv),
           "blocks": {"train": block_stats(trace.train_workload(), setting),
                      **{f"test{b}": block_stats(trace.test_workload(b, 1), setting) for b in range(trace.n_test_blocks)}}}
    for name, row in out["blocks"].items():
        print(f"{name:8s} {row}", file=sys.stderr)
    if args.policy:
        n = args.episodes
        kinds = {f"test{b}": [trace.test_workload(b, 100 + i) for i in range(n)] for b in range(trace.n_test_blocks)}
        kinds["train_redrawn"] = [trace.train_redrawn(7000 + i) for i in range(n)]
        kinds["train_bootstrap"] = [bootstrap_vms(trace.train_redrawn(7000 + i), np.random.default_rng(i)) for i in range(n)]
        out["policy"] = {}
        for name, workloads in kinds.items():
            m = evaluate_policy(policy.rates, policy.setting, workloads)
            out["policy"][name] = {k: round(float(m[k]), 3) for k in ("pm_hot_r", "c_hot_r", "s_cores")}
            print(f"{name:16s} {out['policy'][name]}", file=sys.stderr)
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
