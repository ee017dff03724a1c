"""How much headroom over use a microservice application needs (docs/microservice-cores.md, "The
action as a headroom over use"): for each user level, the per-load static oracle's cores over each
service's use under that oracle, then fixed-headroom controllers that set every service's limit to
h times its use, over the last second or averaged over the last 5 s (the base of the "usage"
action space), on seeds 1-5.

    .venv/bin/python benchmarks/reclaimer_headroom.py --app hotel --headrooms 1.2,1.3,1.5,1.8
"""
from __future__ import annotations

import argparse
import sys
from collections import deque
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.microservice_cores.control import MIN_CORES  # noqa: E402
from agents.microservice_cores.episode import run_episodes  # noqa: E402
from agents.microservice_cores.experiment import FULL, levels  # noqa: E402
from agents.microservice_cores.static_search import search_static  # noqa: E402
from agents.microservice_cores.topology import load_topology  # noqa: E402
from samm.cli.seeds import parse_seeds  # noqa: E402


class FixedHeadroom:
    """Every service at h times its use, over the last `window` seconds (mean)."""

    def __init__(self, h: float, window: int):
        self.h, self.window, self.name = h, window, f"headroom-{h:g}x{window}s"

    def reset(self, limits) -> None:
        self.limits, self.seen = limits, deque(maxlen=self.window)

    def act(self, m) -> np.ndarray:
        self.seen.append(np.nan_to_num(m.cpu_used, nan=0.0))
        base = np.maximum(np.mean(self.seen, axis=0), MIN_CORES)
        return np.clip(base * self.h, MIN_CORES, self.limits.caps)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--app", default="hotel")
    ap.add_argument("--headrooms", default="1.2,1.3,1.5,1.8")
    ap.add_argument("--windows", default="1,5", help="seconds of use averaged into the base")
    ap.add_argument("--seeds", default="1,2,3,4,5")
    a = ap.parse_args(argv)
    try:  # a bad option as one line, before the oracle's searches
        topo = load_topology(a.app)
        seeds = parse_seeds(a.seeds)
        windows = [int(x) for x in a.windows.split(",")]
        headrooms = [float(x) for x in a.headrooms.split(",")]
        # a window of 0 averaged nothing (NaN cores), a negative one raised, after the oracle's searches
        if min(windows) < 1 or not all(0 < h < float("inf") for h in headrooms):
            raise ValueError("every --windows must be at least 1 and every --headrooms > 0")
    except (ValueError, OSError) as exc:
        ap.error(str(exc))
    users = levels(topo, FULL.level_fractions)
    print(f"{a.app}: the static oracle's cores over use, per service (min / median / max), and its total")
    for u in users:
        r = search_static(topo, u)
        eps = run_episodes(topo, lambda i: r.controller(), u, seeds[:3])
        used = np.mean([e.used.mean(axis=0) for e in eps], axis=0)
        ratio = r.cores / np.maximum(used, 1e-9)
        print(f"  {u:>7g} users: {r.total_cores:.2f} cores for {used.sum():.2f} used; "
              f"cores / use {np.min(ratio):.2f} / {np.median(ratio):.2f} / {np.max(ratio):.2f}")
    print("fixed headroom: mean cores / violating seconds per level, and the mean over levels")
    for w in windows:
        for h in headrooms:
            cells, means = [], []
            for u in users:
                eps = run_episodes(topo, lambda i: FixedHeadroom(h, w), u, seeds)
                c, v = np.mean([e.mean_cores for e in eps]), np.mean([e.violation_rate for e in eps])
                cells.append(f"{c:.2f} / {v:.2%}")
                means.append(c)
            print(f"  h {h:<4g} base {w} s: " + " | ".join(cells) + f" | mean {np.mean(means):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
