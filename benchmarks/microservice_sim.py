"""Microservice simulator speed: control steps per second (one step = one application-second),
per application and batch size (issue 18 target: >= 2,000 steps/s for Hotel Reservation on this
machine), every service at half its cap.

    .venv/bin/python -m benchmarks.microservice_sim [--seconds 300] [--envs 1 8 16]
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--apps", nargs="*", default=["hotel", "social"])
    ap.add_argument("--envs", nargs="*", type=int, default=[1, 8, 16])
    ap.add_argument("--seconds", type=int, default=300, help="simulated seconds per copy")
    args = ap.parse_args(argv)
    if args.seconds < 1 or not args.envs or min(args.envs) < 1:  # a rate over no steps reads as 0 steps/s
        ap.error("--seconds and every --envs must be at least 1")
    from agents.microservice_cores.sim import MicroserviceSim
    from agents.microservice_cores.topology import load_topology

    try:
        topos = {app: load_topology(app) for app in args.apps}
    except (ValueError, OSError) as exc:
        ap.error(f"--apps: {exc}")

    out = {"cpu_count": os.cpu_count()}
    for app in args.apps:
        topo = topos[app]
        for E in args.envs:
            sim = MicroserviceSim(topo, n_envs=E, seed=0)
            sim.reset(np.linspace(*topo.users, E))
            cores = np.tile(topo.caps * 0.5, (E, 1))
            for _ in range(10):
                sim.step(cores)
            t0 = time.perf_counter()
            for _ in range(args.seconds):
                sim.step(cores)
            dt = time.perf_counter() - t0
            out[f"{app}/envs={E}"] = round(args.seconds * E / dt, 1)
            print(f"{app:7s} {E:3d} copies: {args.seconds * E / dt:10.0f} steps/s")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
