"""Do shielded or headroom C2MARL policies beat the N-sigma rule's own frontier on held-apart days?

A shielded policy (agents/oversubscription/shield.py) reserves max(its RATES choice, the N-sigma
rule's rate at an aggressive headroom); a headroom policy (`--action headroom`) reserves its chosen
headroom times the N-sigma forecast. Either is worth having only if, at the PM-Hot-R it reaches,
it saves more cores than N-sigma alone reaches by raising its headroom uniformly. This runs the
N-sigma rule (the tuned n = 2, window = 24) at several headrooms and the given policies on the same
held-apart episodes as the Table 3 run of `samm experiment c2marl` (trace seed 0, test seeds
50,000 + i), PM-Hot-R / S-Cores in %.

    .venv/bin/python benchmarks/oversub_shield_frontier.py --episodes 300 --policies runs/shield/A runs/shield/B
"""
from __future__ import annotations

import argparse
import json
import time

# torch and the simulator load after the arguments: --help and a usage error took 5 s


class _Saved:
    """A saved policy as a rate rule (it keeps no state between episodes)."""

    def __init__(self, directory: str):
        from agents.oversubscription.policy import OversubPolicy

        self.policy = OversubPolicy.load(directory)
        shield = self.policy.shield
        if shield is None:
            self.name = directory
        elif shield.spec.mode == "headroom":
            self.name = f"{directory} (headrooms {min(self.policy.action_values):g}-{max(self.policy.action_values):g})"
        else:
            self.name = f"{directory} (shield h={shield.spec.headroom:g})"

    def reset(self) -> None:
        pass

    def rates(self, view):
        return self.policy.rates(view)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--setting", default="azure")
    ap.add_argument("--episodes", type=int, default=300)
    ap.add_argument("--trace-seed", type=int, default=0)
    ap.add_argument("--headrooms", type=float, nargs="+", default=[2.25, 2.5, 2.75, 3.0, 3.25, 3.5])
    ap.add_argument("--policies", nargs="*", default=[])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.episodes < 1:  # a rate over no episode
        ap.error("--episodes must be at least 1")
    from agents.oversubscription.baselines import NSigmaRule, replay_usage_history
    from agents.oversubscription.data import generate_trace
    from agents.oversubscription.experiment import test_specs
    from agents.oversubscription.settings import get_setting
    from agents.oversubscription.tuning import evaluate_rule

    try:
        setting = get_setting(args.setting)
    except ValueError as exc:
        ap.error(str(exc))
    try:  # before the trace and the rules' runs, not after them
        saved = [_Saved(d) for d in args.policies]
    except (ValueError, OSError) as exc:
        ap.error(str(exc))
    trace = generate_trace(setting, args.trace_seed)
    prior = replay_usage_history(setting, trace.train_workload())
    tests = [trace.test_workload(i, s) for i, s in test_specs(trace, args.episodes, False)]
    rules = [NSigmaRule(setting.n_subscribers, n=2.0, window=24, headroom=h, prior=prior) for h in args.headrooms]
    rules += saved
    rows = []
    for rule in rules:
        t0 = time.perf_counter()
        m = evaluate_rule(rule, setting, tests)
        rows.append({"rule": rule.name, "pm_hot_r": m["pm_hot_r"], "s_cores": m["s_cores"],
                     "seconds": time.perf_counter() - t0})
        if not args.json:
            print(f"{rule.name:48s} PM-Hot-R {100 * m['pm_hot_r']:5.1f} %  S-Cores {100 * m['s_cores']:5.1f} %",
                  flush=True)
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
