"""Is there slack left in a trained Reclaimer policy? (docs/microservice-cores.md, "Scaling the
shipped policies' limits down"): the policy's limits multiplied by a constant s each second (the
same s for every service and load), on the experiment's three user levels, against s = 1.

A policy with slack would lose cores in proportion to s and keep QoS; one at its own equilibrium
throttles, its services' use (and so, on the "usage" action space, its next limits) rises with the
backlog, and both the cores and the violations go up.

    .venv/bin/python benchmarks/reclaimer_action_scale.py --app hotel --seeds 11-15 --scales 1,0.95,0.92,0.9
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.microservice_cores.control import clip_cores  # noqa: E402
from agents.microservice_cores.episode import run_episodes  # noqa: E402
from agents.microservice_cores.experiment import FULL, levels  # noqa: E402
from agents.microservice_cores.hosting import make_policy  # noqa: E402
from agents.microservice_cores.policy import ReclaimerPolicy  # noqa: E402
from agents.microservice_cores.topology import load_topology  # noqa: E402
from samm.cli.seeds import parse_seeds  # noqa: E402


class ScaledPolicy:
    """A Reclaimer policy whose limits are multiplied by `scale` (then clipped to the bounds)."""

    def __init__(self, policy: ReclaimerPolicy, scale: float):
        self.policy, self.scale, self.name = policy.fork(), scale, f"reclaimer-x{scale:g}"

    def reset(self, limits) -> None:
        self.limits = limits
        self.policy.reset(limits)

    def act(self, m) -> np.ndarray:
        return clip_cores(self.policy.act(m) * self.scale, self.limits)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--app", default="hotel")
    p.add_argument("--policy", default=None, help="a policy directory (default: the shipped policy of --app)")
    p.add_argument("--seeds", default="11-15", help="episode seeds, e.g. 11-15 (default: apart from the experiment's 1-10)")
    p.add_argument("--scales", default="1,0.95,0.92,0.9")
    p.add_argument("--seconds", type=int, default=FULL.steps, help="control seconds per episode (the experiment's)")
    args = p.parse_args(argv)
    try:  # a bad option as one line, before any episode
        topo = load_topology(args.app)
        policy = make_policy("reclaimer", args.policy, app=args.app)
        seeds = parse_seeds(args.seeds)
        scales = [float(x) for x in args.scales.split(",")]
        if args.seconds < 1:  # run_episodes raised it with a traceback
            raise ValueError(f"--seconds must be at least 1, not {args.seconds}")
    except (ValueError, OSError) as exc:
        p.error(str(exc))
    users = levels(topo, FULL.level_fractions)
    print(f"{args.app}, policy {policy.version}, seeds {args.seeds}; mean cores / violating seconds per level")
    print("| scale | " + " | ".join(f"{u:g} users" for u in users) + " | mean over levels |")
    print("|---|" + "---|" * (len(users) + 1))
    for s in scales:
        cells, cores, viol = [], [], []
        for u in users:
            eps = run_episodes(topo, lambda i: ScaledPolicy(policy, s), u, seeds, steps=args.seconds)
            c, v = float(np.mean([e.mean_cores for e in eps])), float(np.mean([e.violation_rate for e in eps]))
            cells.append(f"{c:.2f} / {100 * v:.2f} %")
            cores.append(c)
            viol.append(v)
        print(f"| {s:g} | " + " | ".join(cells) + f" | {np.mean(cores):.3f} / {100 * np.mean(viol):.3f} % |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
