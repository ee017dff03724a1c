"""The baselines of `samm experiment c2marl`, tuned on the training days at another safety level than
the experiment's 0.95, then tested on the experiment's held-apart episodes: the fair reference for a
C2MARL agent trained to a tighter budget than its level (`--budget-margin`), and the check of whether a
baseline tuned at a level meets it on held-apart days.

    .venv/bin/python benchmarks/oversub_baselines_at.py --case internal-warm --tune-alpha 0.925 --json out.json

Each rule is tuned (`experiment.tune_and_test_baselines`, as the experiment) at --tune-alpha on the experiment's training episodes, as the
experiment tunes at 0.95, and tested with the experiment's own code on the same held-apart episodes;
the verdicts are given for every level of the paper.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", required=True, help="the experiment's case (setting-cold|warm), e.g. internal-warm")
    p.add_argument("--tune-alpha", type=float, required=True, help="the level the rules are tuned to")
    p.add_argument("--test-episodes", type=int, default=None, help="(default: the experiment's, 300)")
    p.add_argument("--tune-episodes", type=int, default=None,
                   help="training episodes each rule is tuned on (default: the experiment's, 20)")
    p.add_argument("--trace-seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--json", default=None, help="also write the rows here")
    args = p.parse_args(argv)
    # torch and the simulator load here, after the arguments: --help and a usage error took 5 s
    from agents.oversubscription.data import generate_trace
    from agents.oversubscription.experiment import (FULL, FULL_CASES, HELD_APART, QUICK_CASES, test_specs,
                                                    tune_and_test_baselines)
    from agents.oversubscription.settings import ALPHAS, get_setting
    from agents.report import writable_folder

    cases = {c.key: c for c in FULL_CASES + QUICK_CASES}
    if args.case not in cases:
        p.error(f"argument --case: invalid choice: {args.case!r} (choose from {', '.join(sorted(cases))})")
    args.test_episodes = FULL.test_episodes if args.test_episodes is None else args.test_episodes
    args.tune_episodes = FULL.tune_episodes if args.tune_episodes is None else args.tune_episodes

    if not 0.0 < args.tune_alpha < 1.0:
        print(f"error: --tune-alpha must lie in (0, 1), not {args.tune_alpha}", file=sys.stderr)
        return 2
    if args.test_episodes < 1 or args.tune_episodes < 1:  # else every rule reads as safe on no episode
        print("error: --test-episodes and --tune-episodes must be at least 1", file=sys.stderr)
        return 2
    try:  # before the work: a path that cannot take the file failed only at the end, losing it
        if args.json:
            writable_folder(Path(args.json).parent)
    except OSError as e:
        print(f"error: --json {args.json}: {e}", file=sys.stderr)
        return 2
    case = cases[args.case]
    setting = get_setting(case.setting)
    trace = generate_trace(setting, args.trace_seed)
    specs = test_specs(trace, args.test_episodes, case.warm)
    t0 = time.perf_counter()
    results, tested = tune_and_test_baselines(case, trace, args.trace_seed, args.tune_alpha, args.tune_episodes,
                                              specs, args.test_episodes, (HELD_APART,), args.workers)
    seconds = time.perf_counter() - t0
    rows = [{"method": name, "params": results[name].params, "safe_on_training_days": results[name].safe,
             "pm_hot_r": m["pm_hot_r"], "s_cores": m["s_cores"],
             "satisfied": {f"{a:.2f}": m["satisfied"][f"{a:.2f}"] for a in ALPHAS}}
            for name, m in tested[HELD_APART].items()]
    print(f"{case.key}: tuned at alpha {args.tune_alpha} and tested in {seconds:.0f} s; {args.test_episodes} held-apart episodes")
    print("| method | params | safe on training days | PM-Hot-R % | S-Cores % | " + " | ".join(f"{a:.2f}" for a in ALPHAS) + " |")
    for r in rows:
        marks = " | ".join("✓" if r["satisfied"][f"{a:.2f}"] else "✗" for a in ALPHAS)
        print(f"| {r['method']} | {r['params']} | {r['safe_on_training_days']} | {100 * r['pm_hot_r']:.1f} | "
              f"{100 * r['s_cores']:.1f} | {marks} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"case": case.key, "tune_alpha": args.tune_alpha,
                                               "test_episodes": args.test_episodes, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
