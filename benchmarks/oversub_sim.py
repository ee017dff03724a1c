"""Oversub Gym speed: simulated days per second on one core, per setting (issue target: >= 50 days/s
for 200 PMs), with the NumPy reference allocator beside the compiled one in the same run.

    .venv/bin/python -m benchmarks.oversub_sim [--episodes 20]
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=20)
    ap.add_argument("--settings", nargs="*", default=["azure", "internal"])
    args = ap.parse_args(argv)
    from agents.oversubscription import cluster
    from agents.oversubscription.data import generate_trace
    from agents.oversubscription.settings import SETTINGS
    from agents.oversubscription.sim import OversubSim, run_episode

    unknown = [name for name in args.settings if name not in SETTINGS]
    if args.episodes < 1 or unknown:  # no episode to time, or a KeyError after minutes of others
        ap.error(f"--episodes must be at least 1 and --settings among {sorted(SETTINGS)}")

    out = {}
    for name in args.settings:
        s = SETTINGS[name]
        trace = generate_trace(s, 0)
        ws = [trace.test_workload(i % trace.n_test_blocks, 100 + i) for i in range(args.episodes)]
        rates = np.full(s.n_subscribers, 0.6)
        row = {"pms": s.n_pms, "vms_per_episode": float(np.mean([w.n_vms for w in ws]))}
        for label, compiled in (("compiled", True), ("numpy", False)):
            saved = cluster._place_batch
            if not compiled:
                cluster._place_batch = None
            try:
                run_episode(OversubSim(s, ws[0]), lambda v: rates)  # warm-up (JIT)
                t0 = time.perf_counter()
                n = len(ws) if compiled else max(2, len(ws) // 5)
                for w in ws[:n]:
                    run_episode(OversubSim(s, w), lambda v: rates)
                dt = (time.perf_counter() - t0) / n
            finally:
                cluster._place_batch = saved
            row[f"{label}_days_per_s"] = round(s.episode_steps / 24 / dt, 1)
        row["speedup"] = round(row["compiled_days_per_s"] / row["numpy_days_per_s"], 2)
        out[name] = row
        print(json.dumps({name: row}))
    print(json.dumps({"cpus": os.cpu_count()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
