"""Can a safety margin applied after training make a C2MARL policy safe on held-apart days?

Runs a saved policy with its rates raised three ways, each a one-knob family a user could
calibrate on training days alone:

* add m:   rate + m                       (every subscriber, every step)
* times h: rate x h
* floor g: max(rate, g x the subscriber's highest usage rate of the last 24 h)  (the agent's own
           `usage` feature, what MA / N-sigma forecast from)

each capped at 1, beside Grid-rho rows for scale, on three kinds of episode:
* "bootstrap": the training days' VMs resampled with replacement after their usage was redrawn,
  as `train_usage="bootstrap"` draws its training episodes (copies replay one series);
* "resampled": `Trace.train_resampled`, deployments resampled and moved by whole days, usage
  redrawn afterwards (`train_usage="resampled"`);
* "held-apart": the test days, usage redrawn (what a policy must hold on).
The first two use the training days only (what a calibration may see). PM-Hot-R / S-Cores as in
the paper; "broken" is the mean count of PMs hot on delta or more steps per episode.

    .venv/bin/python benchmarks/oversub_margin_scan.py --policy agents/oversubscription/policies/c2marl-azure-0.95 --episodes 40
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

# torch and the simulator load in the functions, after the arguments: --help and a usage error took 5 s

VALIDATION_SEED = 10**6   # bootstrap draws no training run uses (training: [cfg.seed, episode])


def knobs(policy):
    from agents.oversubscription.features import usage_features

    n = policy.setting.n_subscribers

    def peak(view):
        return usage_features(view, n)[1]

    yield "agent", policy.rates
    for m in (0.2,):
        yield f"add {m:g}", lambda v, m=m: np.minimum(1.0, policy.rates(v) + m)
    for h in (2.0,):
        yield f"times {h:g}", lambda v, h=h: np.minimum(1.0, policy.rates(v) * h)
    for g in (2.5, 4.0):
        yield f"floor {g:g}", lambda v, g=g: np.minimum(1.0, np.maximum(policy.rates(v), g * peak(v)))
    for rho in (0.85, 1.0):
        yield f"Grid-{rho:g}", lambda v, rho=rho: np.full(n, rho)


def evaluate(fn, setting, workloads) -> dict:
    from agents.oversubscription.metrics import broken_pms, summarise
    from agents.oversubscription.sim import OversubSim, run_episode

    records = [run_episode(OversubSim(setting, w), fn) for w in workloads]
    m = summarise(records, setting.delta_steps)
    m["broken_pms"] = broken_pms(records, setting.delta_steps)
    return m


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policy", required=True)
    ap.add_argument("--episodes", type=int, default=40)
    ap.add_argument("--trace-seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.episodes < 1:  # a rate over no episode
        ap.error("--episodes must be at least 1")
    from agents.oversubscription.data import generate_trace
    from agents.oversubscription.policy import OversubPolicy
    from agents.oversubscription.train import bootstrap_vms

    try:
        policy = OversubPolicy.load(args.policy)
    except (ValueError, OSError) as exc:
        ap.error(str(exc))
    s = policy.setting
    trace = generate_trace(s, args.trace_seed)
    e = range(args.episodes)
    splits = {"bootstrap": [bootstrap_vms(trace.train_redrawn(VALIDATION_SEED + i),
                                          np.random.default_rng([VALIDATION_SEED, i])) for i in e],
              "resampled": [trace.train_resampled(VALIDATION_SEED + i) for i in e],
              "held-apart": [trace.test_workload(i % trace.n_test_blocks, 100 + i) for i in e]}
    rows = []
    for name, fn in knobs(policy):
        t0 = time.perf_counter()
        row = {"knob": name}
        for split, ws in splits.items():
            row[split] = evaluate(fn, s, ws)
        row["seconds"] = round(time.perf_counter() - t0, 1)
        rows.append(row)
        if not args.json:
            print(f"{name:12s} " + "  ".join(
                f"{split}: {100 * row[split]['pm_hot_r']:5.1f} / {100 * row[split]['s_cores']:5.1f} "
                f"({row[split]['broken_pms']:.2f} broken)" for split in splits) + f"  [{row['seconds']} s]",
                flush=True)
    if args.json:
        print(json.dumps({"policy": args.policy, "episodes": args.episodes, "trace_seed": args.trace_seed,
                          "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
