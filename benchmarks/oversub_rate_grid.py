"""What the learned agent's action set costs a tuned baseline: the rule with continuous rates (as the
experiment runs it) beside the same rule with its rates rounded up to each of the agent's action sets
(settings.RATE_GRIDS), on the experiment's held-apart episodes.

The baselines choose any rate in (0, 1]; C2MARL chooses from the paper's six rates (0.2-0.6 and 1), so
a subscriber that needs 0.65 reserves 1. The rounded rows say how much of a gap between C2MARL and a
baseline that alone explains, and what a finer set (`--rates tenths`, ours) leaves of it.

    .venv/bin/python benchmarks/oversub_rate_grid.py --case internal-cold --rule Max \
        --params '{"n": 3.0, "p": 99.0, "window": 24, "headroom": 2.0}'

Without --params the rule is tuned as the experiment tunes it (training days only, at --alpha), which
takes minutes per rule; --params takes the values of an experiment's report ("Tuned baseline
parameters") so its continuous row reproduces the report's.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    from agents.oversubscription.settings import RATE_GRIDS, get_setting

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", required=True, help="the experiment's case (setting-cold|warm), e.g. internal-warm")
    p.add_argument("--rule", required=True, help="the baseline (baselines.RULES), e.g. NSigma")
    p.add_argument("--params", default=None, help="its parameters as JSON (default: tuned at --alpha)")
    p.add_argument("--alpha", type=float, default=0.95, help="the level the verdicts (and any tuning) use")
    p.add_argument("--grids", default=",".join(RATE_GRIDS), help=f"comma-separated, among {sorted(RATE_GRIDS)}")
    p.add_argument("--test-episodes", type=int, default=None, help="(default: the experiment's, 300)")
    p.add_argument("--trace-seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the rows here")
    args = p.parse_args(argv)
    # torch and the simulator load here, after the arguments: --help and a usage error took 5 s
    from agents.oversubscription.baselines import RULES, RoundedUp, make_rule
    from agents.oversubscription.data import generate_trace
    from agents.oversubscription.experiment import FULL, FULL_CASES, QUICK_CASES, held_apart_episodes, test_specs
    from agents.oversubscription.metrics import satisfied
    from agents.oversubscription.tuning import evaluate_rule, training_context, tune_all
    from agents.report import writable_folder

    cases = {c.key: c for c in FULL_CASES + QUICK_CASES}
    for option, value, known in (("--case", args.case, cases), ("--rule", args.rule, RULES)):
        if value not in known:
            p.error(f"argument {option}: invalid choice: {value!r} (choose from {', '.join(sorted(known))})")
    args.test_episodes = FULL.test_episodes if args.test_episodes is None else args.test_episodes

    grids = [g.strip() for g in args.grids.split(",") if g.strip()]
    unknown = [g for g in grids if g not in RATE_GRIDS]
    if unknown or not 0.0 < args.alpha < 1.0:
        print(f"error: unknown grids {unknown} (choose from {sorted(RATE_GRIDS)}) or --alpha outside (0, 1)",
              file=sys.stderr)
        return 2
    try:
        params = None if args.params is None else dict(json.loads(args.params))
    except (ValueError, TypeError) as e:
        print(f"error: --params must be a JSON object: {e}", file=sys.stderr)
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
    t0 = time.perf_counter()
    if params is None:
        results, ctx = tune_all(setting, trace, args.alpha, rules=[args.rule], episodes=FULL.tune_episodes,
                                warm=case.warm)
        params = results[args.rule].params
    else:
        ctx = training_context(setting, trace, warm=case.warm)
    specs = test_specs(trace, args.test_episodes, case.warm)
    rows = []
    for grid in [None] + grids:
        rule = make_rule(args.rule, ctx, **params)
        if grid is not None:
            rule = RoundedUp(rule, RATE_GRIDS[grid], grid)
        m = evaluate_rule(rule, setting, held_apart_episodes(trace, specs, case.warm), case.warm)
        rows.append({"rates": grid or "continuous", "pm_hot_r": m["pm_hot_r"], "s_cores": m["s_cores"],
                     "satisfied": satisfied(m["pm_hot_r"], args.alpha)})
        r = rows[-1]
        print(f"{case.key} {args.rule} {json.dumps(params)} {r['rates']:>10s}: PM-Hot-R {100 * r['pm_hot_r']:5.1f} %  "
              f"S-Cores {100 * r['s_cores']:5.1f} %  {'meets' if r['satisfied'] else 'fails'} {args.alpha}", flush=True)
    seconds = round(time.perf_counter() - t0, 1)
    print(f"# {seconds} s, {args.test_episodes} held-apart episodes")
    if args.json:
        Path(args.json).write_text(json.dumps({"case": case.key, "rule": args.rule, "params": params,
                                               "alpha": args.alpha, "test_episodes": args.test_episodes,
                                               "rows": rows, "seconds": seconds}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
