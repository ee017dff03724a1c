"""Cost of one Reclaimer SAC update (critics, actor, entropy, Polyak) and of drawing its batch
from the replay, at the simulator training's networks (SIM_TRAINING: 3 x 64, batch 100), per
application, per precision and torch thread count. The first row of each application, fp32 on
one thread, is the baseline the other rows are divided by.

    .venv/bin/python -m benchmarks.reclaimer_update --apps hotel,social --updates 300

Training runs 0.5 updates per transition (2 per batch step of 4 copies), so the update's cost
is most of a training run's wall time (docs/microservice-cores.md, "Training speed").
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import fields

import numpy as np
import torch

#: (precision, torch threads, fused Adam): the last row is the shipped recipe's (bf16-state, 2 threads)
#: with `--fused-adam`
CONFIGS = (("fp32", 1, False), ("fp32", 2, False), ("bf16", 1, False), ("bf16", 2, False),
           ("bf16-state", 1, False), ("bf16-state", 2, False), ("bf16-state", 2, True))


def _time(fn, n: int, repeats: int) -> float:
    """Median over `repeats` of the mean seconds per call of `n` calls."""
    runs = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        runs.append((time.perf_counter() - t) / n)
    return statistics.median(runs)


def measure(app: str, precision: str, threads: int, updates: int, repeats: int, seed: int = 0,
            fused: bool = False) -> dict:
    from agents.microservice_cores.features import observation_layout
    from agents.microservice_cores.sac import ReplayBuffer, Sac, SacConfig
    from agents.microservice_cores.topology import load_topology
    from agents.microservice_cores.train import sim_config

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    topo = load_topology(app)
    M = topo.n_services
    # the same script measures older trees (the "before" of a change), which may lack a precision
    known = {f.name for f in fields(SacConfig)}
    extra = {"precision": precision} if "precision" in known else {}
    label = precision + ("+fused" if fused else "")
    try:
        if precision != "fp32" and not extra:
            raise ValueError("no precision option")
        if fused:
            if "fused_adam" not in known:
                raise ValueError("no fused Adam option")
            extra["fused_adam"] = True
        cfg = sim_config(**extra)
    except ValueError as e:
        return {"app": app, "precision": label, "threads": threads, "skipped": f"this code: {e}"}
    width, n_scaled = observation_layout(cfg.k, M, cfg.id_width, cfg.observe_queue)
    sac = Sac(width, n_scaled, M, cfg)
    buf = ReplayBuffer(20_000, M, width, cfg.n_envs, seed)
    rng = np.random.default_rng(seed)
    for _ in range(25):  # rows on the standardised scale the networks see in training
        buf.add_batch(rng.normal(size=(400, M, width)), rng.uniform(size=(400, M)), rng.normal(size=400),
                      rng.normal(size=(400, M, width)), np.zeros(400), np.zeros(400, bool), np.zeros(400, int))
    batch = buf.sample(cfg.batch)
    for _ in range(20):  # warm-up: oneDNN picks its kernels on the first calls
        sac.update(*batch)
    update_s = _time(lambda: sac.update(*batch), updates, repeats)
    sample_s = _time(lambda: buf.sample(cfg.batch), updates, repeats)
    return {"app": app, "services": M, "precision": label, "threads": threads,
            "update_ms": update_s * 1e3, "sample_ms": sample_s * 1e3}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--apps", default="hotel,social")
    ap.add_argument("--updates", type=int, default=300, help="updates per timed repeat")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.updates < 1 or args.repeats < 1:  # a time per update over none
        ap.error("--updates and --repeats must be at least 1")
    from agents.microservice_cores.topology import load_topology

    try:  # an unknown app as one line, before the other apps' measurements
        for app in args.apps.split(","):
            load_topology(app)
    except ValueError as exc:
        ap.error(f"--apps: {exc}")
    rows = []
    for app in args.apps.split(","):
        base = None
        for precision, threads, fused in CONFIGS:
            r = measure(app, precision, threads, args.updates, args.repeats, fused=fused)
            if "update_ms" in r:
                base = base or r["update_ms"] + r["sample_ms"]
                r["speedup_vs_fp32_1_thread"] = base / (r["update_ms"] + r["sample_ms"])
            rows.append(r)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(f"{'app':8} {'precision':16} {'threads':>7} {'update ms':>10} {'sample ms':>10} {'speed-up':>9}")
        for r in rows:
            if "skipped" in r:
                print(f"{r['app']:8} {r['precision']:16} {r['threads']:>7}   ({r['skipped']})")
                continue
            print(f"{r['app']:8} {r['precision']:16} {r['threads']:>7} {r['update_ms']:>10.2f} {r['sample_ms']:>10.2f} "
                  f"{r['speedup_vs_fp32_1_thread']:>8.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
