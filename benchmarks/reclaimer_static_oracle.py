"""The per-load static oracle of `samm experiment reclaimer` at a chosen violation budget: how few
cores a fixed allocation needs when it knows the load (docs/microservice-cores.md, "A lower target
entropy"). For each user level it runs `static_search.search_static` with the budget on the search
seeds, then measures the vector it found on the experiment's seeds 1-5 and 6-10.

    .venv/bin/python benchmarks/reclaimer_static_oracle.py --app hotel --users 500,2000,3500 --max-violation 0 --search-seeds 1001-1005
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.microservice_cores.static_search import (  # noqa: E402
    StaticSearchParams, search_static, violation_rate)
from agents.microservice_cores.topology import load_topology  # noqa: E402
from samm.cli.seeds import parse_seeds  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--app", default="hotel")
    ap.add_argument("--users", default=None, help="comma-separated user levels (default: the experiment's three)")
    ap.add_argument("--max-violation", type=float, default=StaticSearchParams.max_violation,
                    help="the largest share of violating seconds on the search seeds (default %(default)s)")
    ap.add_argument("--search-seeds", default="1001-1003", help="A-B or a comma list (default %(default)s)")
    a = ap.parse_args(argv)
    try:  # a bad option as one line, before any search
        topo = load_topology(a.app)
        lo, hi = topo.users
        users = [float(x) for x in a.users.split(",")] if a.users else [lo, (lo + hi) / 2, hi]
        if not all(0 <= u < float("inf") for u in users):  # the search raised it, after the levels before
            raise ValueError(f"--users must be user counts >= 0, not {a.users}")
        params = StaticSearchParams(max_violation=a.max_violation, seeds=tuple(parse_seeds(a.search_seeds)))
    except (ValueError, OSError) as exc:
        ap.error(str(exc))
    totals = []
    print(f"{a.app}: search budget {a.max_violation:.2%} on seeds {params.seeds}")
    print(f"{'users':>7}{'cores':>8}{'search':>9}{'seeds 1-5':>11}{'seeds 6-10':>12}{'secs':>6}")
    for u in users:
        t0 = time.time()
        r = search_static(topo, u, params)
        v1 = violation_rate(topo, r.cores, u, range(1, 6))
        v2 = violation_rate(topo, r.cores, u, range(6, 11))
        totals.append(r.total_cores)
        print(f"{u:>7g}{r.total_cores:>8.3f}{r.violation_rate:>9.2%}{v1:>11.2%}{v2:>12.2%}{time.time() - t0:>6.0f}")
    print(f"mean over levels: {np.mean(totals):.3f} cores")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
