"""How close to the per-load static oracle can a policy that does not know the load get?
(docs/microservice-cores.md, "A load-keyed oracle").

The per-load static oracle (`static_search`) is told the user count. This reference is not: the
searched static allocation is found at seven loads that are *not* the experiment's (from 6.7 % below
the app's user range to 10 % above it), and each second the controller estimates the users from
what it observes (the response-time law of a closed loop, N = X (Z + R): X the requests of the last
5 s, Z the think time 1 / rate per user, R the second's median latency), interpolates the searched
allocations service by service at that estimate, and multiplies them by a safety scale s. It is
what a policy would do that learned the searched allocations as a function of the load it sees, with
no reaction to the noise of each second: a reference for the paper's margin over the Sinan-style
baseline, which is measured against the experiment's seeds at a violation rate no higher than
AutoScale's (0 on Hotel).

    .venv/bin/python benchmarks/reclaimer_keyed_oracle.py --app hotel --scales 1,1.03,1.05,1.08

Closed-loop caveat: on Social (10 requests/s per user, so R is a large part of Z + R) the estimate
feeds back on itself (fewer cores, slower requests, fewer requests seen, fewer users estimated), and
the reference needs a larger scale there (`--app social --scales 1.2,1.3,1.4`).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.microservice_cores.control import clip_cores  # noqa: E402
from agents.microservice_cores.episode import run_episodes  # noqa: E402
from agents.microservice_cores.experiment import FULL, levels  # noqa: E402
from agents.microservice_cores.observation import PERCENTILES  # noqa: E402
from agents.microservice_cores.static_search import StaticSearchParams, search_static  # noqa: E402
from agents.microservice_cores.topology import load_topology  # noqa: E402
from agents.report import writable_folder  # noqa: E402
from samm.cli.seeds import parse_seeds  # noqa: E402

#: where in the app's user range the allocations are searched: none of them the experiment's levels
SEARCH_FRACTIONS = (-1 / 15, 0.1, 0.3, 1.4 / 3, 0.7, 0.9, 1.1)
ESTIMATE_S = 5          # seconds of requests behind each estimate of the users
P50 = PERCENTILES.index(50)


class LoadKeyedStatic:
    """The searched allocations interpolated at the users estimated from the last seconds."""

    name = "load-keyed-static"

    def __init__(self, grid, table, rate_per_user: float, scale: float = 1.0):
        self.grid, self.table, self.think_s, self.scale = np.asarray(grid), np.asarray(table), 1.0 / rate_per_user, scale

    def reset(self, limits) -> None:
        self.limits, self.estimates = limits, []

    def observe(self, m) -> None:
        if np.isfinite(m.requests_per_s):
            median_s = m.latency_ms[P50] / 1000.0 if np.isfinite(m.latency_ms[P50]) else 0.0
            self.estimates = (self.estimates + [m.requests_per_s * (self.think_s + median_s)])[-ESTIMATE_S:]

    def users(self) -> float | None:
        return float(np.mean(self.estimates)) if self.estimates else None

    def act(self, m) -> np.ndarray:
        self.observe(m)
        n = self.users()
        if n is None:
            return clip_cores(m.cpu_limit, self.limits)
        cores = np.array([np.interp(n, self.grid, self.table[:, i]) for i in range(self.table.shape[1])])
        return clip_cores(cores * self.scale, self.limits)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--app", default="hotel")
    p.add_argument("--scales", default="1,1.03,1.05,1.08")
    p.add_argument("--seeds", default="1-5,6-10", help="comma-separated seed groups, each evaluated on its own")
    p.add_argument("--max-violation", type=float, default=StaticSearchParams.max_violation,
                   help="the search's violation target on its own seeds (static_search's default)")
    p.add_argument("--out", default=None, help="write the searched table and the results as JSON here")
    args = p.parse_args(argv)
    try:  # a bad option as one line, not after minutes of searching
        topo = load_topology(args.app)
        groups = [parse_seeds(g) for g in args.seeds.split(",")]
        scales = [float(x) for x in args.scales.split(",")]
        if args.out:  # before the work: a path that cannot take the file failed only at the end, losing it
            writable_folder(Path(args.out).parent)
    except (ValueError, OSError) as exc:
        p.error(str(exc))
    lo, hi = topo.users
    grid = [round(lo + f * (hi - lo)) for f in SEARCH_FRACTIONS]
    t0 = time.time()
    table, searched = [], []
    for u in grid:
        r = search_static(topo, u, StaticSearchParams(max_violation=args.max_violation))
        table.append(r.cores)
        searched.append({"users": u, "cores": float(r.cores.sum()), "violation_rate": r.violation_rate,
                         "feasible": r.feasible})
        print(f"searched at {u} users: {r.cores.sum():.3f} cores, {100 * r.violation_rate:.2f} % violating on the "
              f"search seeds ({time.time() - t0:.0f} s)", flush=True)
    users = levels(topo, FULL.level_fractions)
    print(f"\n{args.app}: mean cores / violating seconds per level (the experiment's protocol)")
    print("| scale | seeds | " + " | ".join(f"{u:g} users" for u in users) + " | mean over levels | violating s |")
    print("|---|---|" + "---|" * (len(users) + 2))
    results = []
    for s in scales:
        for seeds in groups:
            cells, cores, bad, total = [], [], 0, 0
            for u in users:
                eps = run_episodes(topo, lambda i: LoadKeyedStatic(grid, table, topo.rate_per_user, s), u, seeds,
                                   steps=FULL.steps)
                c = float(np.mean([e.mean_cores for e in eps]))
                v = sum(int(e.violations.sum()) for e in eps)
                cells.append(f"{c:.2f} / {v}")
                cores.append(c)
                bad, total = bad + v, total + sum(e.violations.size for e in eps)
            print(f"| {s:g} | {seeds[0]}–{seeds[-1]} | " + " | ".join(cells) + f" | {np.mean(cores):.3f} | {bad} of {total} |",
                  flush=True)
            results.append({"scale": s, "seeds": list(seeds), "cores": cores, "mean_cores": float(np.mean(cores)),
                            "violating_seconds": bad, "seconds": total})
    if args.out:
        Path(args.out).write_text(json.dumps({"app": args.app, "grid": grid, "searched": searched,
                                              "table": np.asarray(table).tolist(), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
