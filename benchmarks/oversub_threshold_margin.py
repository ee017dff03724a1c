"""How many PM-steps of ordinary test episodes lie near the hot threshold beta x B: the share whose
count could change with the float32 slack of `cluster.HOT_TOLERANCE` (session 97).

Plays each setting's test episodes (the experiment's `test_specs`) at fixed rates and records every
PM's real use at every step, counting those within --rel of beta x B.

    .venv/bin/python benchmarks/oversub_threshold_margin.py --settings azure internal --episodes 6
"""
from __future__ import annotations

import argparse

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", nargs="+", default=["azure", "internal"])
    ap.add_argument("--episodes", type=int, default=6, help="test episodes per setting and rate")
    ap.add_argument("--rates", type=float, nargs="+", default=[1.0, 0.6, 0.4])
    ap.add_argument("--rel", type=float, default=1e-5, help="relative distance to beta x B counted as near")
    ap.add_argument("--trace-seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.episodes < 1:
        ap.error("--episodes must be at least 1")
    # torch and the simulator load here, after the arguments: --help and a usage error took 5 s
    from agents.oversubscription import sim as oversub_sim
    from agents.oversubscription.data import generate_trace
    from agents.oversubscription.experiment import test_specs
    from agents.oversubscription.settings import get_setting
    from agents.oversubscription.train import roll_out

    try:  # every setting before the first one's episodes: `azure nope` failed after azure's
        settings = [get_setting(name) for name in args.settings]
    except ValueError as exc:
        ap.error(str(exc))
    seen: list[np.ndarray] = []
    real_hot = oversub_sim.hot

    def recording_hot(per_pm, pm_cores, beta):
        seen.append(np.abs(np.asarray(per_pm, dtype=np.float64) / (beta * pm_cores) - 1.0))
        return real_hot(per_pm, pm_cores, beta)

    oversub_sim.hot = recording_hot
    for name, setting in zip(args.settings, settings):
        trace = generate_trace(setting, args.trace_seed)
        tests = [trace.test_workload(i, s) for i, s in test_specs(trace, args.episodes, False)]
        seen.clear()
        for rate in args.rates:
            def rates_fn(view, rate=rate):
                return np.full(setting.n_subscribers, rate)
            for _ in roll_out(rates_fn, setting, tests):
                pass
        gaps = np.concatenate(seen)
        print(f"{name}: {len(tests)} test episodes x {len(args.rates)} rates, {gaps.size:,} PM-steps, "
              f"{int((gaps <= args.rel).sum())} within {args.rel:g} of beta x B, "
              f"{int((gaps <= 1e-6).sum())} within 1e-6")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
