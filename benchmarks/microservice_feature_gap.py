"""How far the real containers' observation rows sit from what a Reclaimer policy was trained on.

Runs the policy on the real-container testbed (`run_microservices` with a wrapping controller
that keeps every second's feature rows, frame 0 of the stack), then reports, per feature of the
paper's row (features.py), the real mean, the mean and spread of the policy's own standardiser
(fitted on the simulator's data) and the mean |z| the network reads. A feature many standard
deviations out is one the policy never saw: its action there is an extrapolation.

    .venv/bin/python benchmarks/microservice_feature_gap.py --users 6 --seconds 30 \
        [--policy DIR] [--out runs/feature-gap] [--json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agents.microservice_cores.features import _LOG_FIELDS, ROW, feature_rows  # noqa: E402

FEATURE_NAMES = (list(_LOG_FIELDS) + ["cpu_used/cap", "cpu_limit/cap"] + [f"latency p{i}" for i in range(12)]
                 + ["qos", "log requests/s", "log failures/s", "previous action"])


class RecordingController:
    """The policy, unchanged, plus a copy of each second's rows as the policy builds them."""

    def __init__(self, policy):
        self.policy = policy
        self.name = getattr(policy, "name", "reclaimer")
        self.rows: list[np.ndarray] = []

    def reset(self, limits) -> None:
        self.policy.reset(limits)

    def observe(self, m) -> None:
        if hasattr(self.policy, "observe"):
            self.policy.observe(m)

    def act(self, m):
        caps = self.policy.topo.caps
        self.rows.append(feature_rows(m, np.clip(m.cpu_limit / caps, 0.0, 1.0), caps))
        return self.policy.act(m)


def feature_gap(rows: np.ndarray, mean: np.ndarray, std: np.ndarray) -> list[dict]:
    z = np.abs((rows - mean) / std)
    return [{"feature": n, "real_mean": float(rows[..., j].mean()), "trained_mean": float(mean[j]),
             "trained_std": float(std[j]), "mean_abs_z": float(z[..., j].mean())} for j, n in enumerate(FEATURE_NAMES)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policy", default=None, help="a saved Reclaimer policy (default: the one shipped for the testbed)")
    ap.add_argument("--users", type=int, default=6)
    ap.add_argument("--seconds", type=int, default=30)
    ap.add_argument("--skip", type=int, default=5, help="first seconds left out (the stack filling, the caps)")
    ap.add_argument("--out", default="runs/feature-gap")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    from agents.microservice_cores.policy import ReclaimerPolicy, shipped_policy
    from samm.testbed.microservices.run import MicroservicesRunOptions, check_options, run_microservices

    options = MicroservicesRunOptions(agent="reclaimer", users=args.users, seconds=args.seconds, out_dir=args.out,
                                      plots=False)
    # every refusal before the containers start, as one line naming the option
    try:
        check_options(options)
        policy = ReclaimerPolicy.load(args.policy) if args.policy else shipped_policy("testbed")
    except (ValueError, OSError) as exc:
        ap.error(str(exc))
    if not 0 <= args.skip < args.seconds:  # no row left to compare
        ap.error(f"--skip must be in 0..{args.seconds - 1} (below --seconds), not {args.skip}")
    rec = RecordingController(policy)
    result = run_microservices(options, controller=rec)
    rows = np.array(rec.rows[args.skip:])
    norm = policy.agent.norm
    gap = feature_gap(rows, norm.mean.numpy()[:ROW], norm.std.numpy()[:ROW])
    s = result.summary
    report = {"policy": args.policy or "shipped testbed policy", "users": args.users, "seconds": args.seconds,
              "rows": int(len(rows)), "mean_cores": s["total_cores"]["mean"], "violation_rate": s["violation_rate"],
              "features": gap}
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{report['policy']}: {len(rows)} seconds at {args.users} users; mean cores "
              f"{report['mean_cores']:.3f}, violations {report['violation_rate']:.1%}")
        for g in gap:
            print(f"  {g['feature']:16s} real {g['real_mean']:8.3f}   trained {g['trained_mean']:8.3f} ± "
                  f"{g['trained_std']:6.3f}   mean |z| {g['mean_abs_z']:6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
