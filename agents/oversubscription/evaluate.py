"""Evaluate a saved C2MARL policy (or a baseline) on held-apart test days and on redrawn training
days, with the paper's metrics.

    python -m agents.oversubscription.evaluate --policy DIR [--episodes 40] [--json]

The trace and the start (cold or warm) are the policy's own (its training metadata) unless given: a
policy trained with `--warm --trace-seed 3` was tested cold on trace 0, whose "training days" are not
the ones it trained on.
"""
from __future__ import annotations

import argparse
import json

from .train import evaluate_policy


def evaluate_saved(policy_dir, episodes: int = 40, trace_seed: int | None = None, test_seed: int = 100,
                   warm: bool | None = None) -> dict:
    """`trace_seed`, `warm`: None takes the policy's (its training metadata; trace 0, cold when it
    has none)."""
    from .data import generate_trace
    from .policy import OversubPolicy

    if isinstance(episodes, bool) or not isinstance(episodes, int) or episodes < 1:
        # 0 test episodes reported PM-Hot-R 0.0 % and every level "satisfied" from nothing
        raise ValueError(f"episodes must be a whole number >= 1, got {episodes!r}")
    policy = OversubPolicy.load(policy_dir)
    training = policy.training or {}
    trace_seed = int(training.get("trace_seed") or 0) if trace_seed is None else trace_seed
    warm = bool(training.get("warm", False)) if warm is None else warm
    for name, seed in (("trace_seed", trace_seed), ("test_seed", test_seed)):   # NumPy's seeding refuses < 0
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"{name} must be a whole number >= 0, got {seed!r}")
    s = policy.setting
    trace = generate_trace(s, trace_seed)
    out = {}
    for split, workloads in (
            ("test", [trace.test_workload(i % trace.n_test_blocks, test_seed + i, warm=warm) for i in range(episodes)]),
            ("training_days", [trace.train_redrawn(7000 + i, warm=warm) for i in range(max(1, episodes // 2))])):
        out[split] = evaluate_policy(policy.rates, s, workloads, warm=warm)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m agents.oversubscription.evaluate", description=__doc__.split("\n")[0])
    ap.add_argument("--policy", required=True, help="a saved C2MARL policy directory")
    ap.add_argument("--episodes", type=int, default=40)
    ap.add_argument("--trace-seed", type=int, default=None, help="default: the policy's own")
    start = ap.add_mutually_exclusive_group()
    start.add_argument("--warm", action="store_const", const=True, dest="warm", default=None,
                       help="warm start (default: as the policy was trained)")
    start.add_argument("--cold", action="store_const", const=False, dest="warm", help="cold start")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.episodes < 1:
        ap.error(f"--episodes must be at least 1, got {args.episodes}")
    if args.trace_seed is not None and args.trace_seed < 0:
        ap.error(f"--trace-seed must be >= 0, got {args.trace_seed}")
    try:
        res = evaluate_saved(args.policy, args.episodes, args.trace_seed, warm=args.warm)
    except ValueError as e:     # not a saved policy, or a malformed one: named, not a traceback
        ap.error(str(e))
    if args.json:
        print(json.dumps(res))
    else:
        for split, m in res.items():
            print(f"{split:14s} PM-Hot-R {100 * m['pm_hot_r']:5.1f} %  C-Hot-R {100 * m['c_hot_r']:5.1f} %  "
                  f"S-Cores {100 * m['s_cores']:5.1f} %  satisfied {m['satisfied']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
