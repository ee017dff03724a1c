"""Replay a real testbed run's limits in the twin: the latency-vs-limit model checked without a
controller's feedback (docs/microservice-testbed.md, "The twin's latency tail", session 77).

For each run folder of `samm testbed-microservices` (its steps.csv: the limits in force each second,
the p99 of each second and, since session 76, each service's throttled share of CFS periods) the
twin steps `--copies` copies at the run's users through the same limits, second by second, after
the testbed's 2 s at the caps. Printed per run: the 90th / 99th / 99.5th percentile of the seconds'
p99 and the share over the QoS target, real beside replayed, and per service the real throttled
share beside the model's chance θ of a throttled period. `--topology` takes the `testbed` topology
with JSON overrides of its fields (e.g. '{"throttle_chain": 0.1}'). A run made with `--cpu-burst F`
(its summary.json's cpu_burst) is replayed with the twin's `cfs_burst` at F unless the overrides
set it.

    .venv/bin/python benchmarks/microservice_twin_replay.py RUN_DIR [RUN_DIR ...] [--topology '{...}']
"""
from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from agents.microservice_cores.sim import MicroserviceSim  # noqa: E402
from agents.microservice_cores.topology import Topology, load_topology  # noqa: E402
from microservice_twin_tail import tail  # noqa: E402

WARMUP_S = 2


def _float(x) -> float:
    return float("nan") if x in (None, "", "nan") else float(x)


def read_run(run_dir: Path, services) -> dict:
    """The run's users (summary.json, else the folder name's -uN), CFS burst (summary.json, else
    none), limits (T, M), p99 (T,) and throttled shares (T, M) or None."""
    rows = list(csv.DictReader(open(run_dir / "steps.csv")))
    if not rows:
        raise ValueError(f"{run_dir}: steps.csv has no rows")
    users, burst = None, None
    summary = run_dir / "summary.json"
    if summary.exists():
        info = json.loads(summary.read_text())
        users, burst = info.get("users"), info.get("cpu_burst")
    if users is None:
        m = re.search(r"-u(\d+)", run_dir.name)
        if not m:
            raise ValueError(f"{run_dir}: no summary.json with users and no -uN in the folder name")
        users = int(m.group(1))
    limits = np.array([[_float(r[f"cores_{s}"]) for s in services] for r in rows])
    thr = None
    if f"throttled_{services[0]}" in rows[0]:
        thr = np.array([[_float(r[f"throttled_{s}"]) for s in services] for r in rows])
    return {"users": float(users), "cpu_burst": float(burst or 0.0), "limits": limits, "p99": np.array([_float(r["p99_ms"]) for r in rows]),
            "throttled": thr}


def replay(topo: Topology, run: dict, copies: int = 8, seed: int = 1) -> dict:
    """The twin through the run's limits: every copy's p99 per second (T, copies) and θ (T, copies, M)."""
    sim = MicroserviceSim(topo, n_envs=copies, seed=seed)
    sim.reset(run["users"])
    for _ in range(WARMUP_S):
        sim.step(np.tile(topo.caps, (copies, 1)))
    p99, theta = [], []
    for lim in run["limits"]:
        lim = np.where(np.isfinite(lim), lim, topo.caps)          # an unknown limit read as the cap
        st = sim.step(np.tile(lim, (copies, 1)))
        p99.append(st.p99_ms)
        theta.append(st.throttled)
    return {"p99": np.array(p99), "theta": np.array(theta)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="run folders of samm testbed-microservices")
    ap.add_argument("--topology", default="{}", help="JSON overrides of the testbed topology's fields")
    ap.add_argument("--copies", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    if a.copies < 1:  # the simulator refused it only at the first replay, with a traceback
        ap.error(f"--copies must be at least 1, not {a.copies}")
    try:  # a bad --topology as one line (pydantic names the field)
        overrides = json.loads(a.topology)
        topo = Topology(**{**load_topology("testbed").model_dump(), **overrides})
    except (ValueError, TypeError) as exc:
        ap.error(f"--topology: {' '.join(str(exc).split())[:300]}")
    missing = [d for d in a.runs if not (Path(d) / "steps.csv").is_file()]
    if missing:  # before the first replay, not after the others
        ap.error(f"{missing[0]}: no steps.csv (not a testbed run's folder)")
    services = topo.service_names
    print("| run | users | real q90 / q99 / q99.5 (ms), violating | replayed | throttled share real / model θ |")
    print("|---|---:|---|---|---|")
    for d in a.runs:
        run = read_run(Path(d), services)
        run_topo = topo if "cfs_burst" in overrides else topo.model_copy(update={"cfs_burst": run["cpu_burst"]})
        rep = replay(run_topo, run, a.copies, a.seed)
        real_p, twin_p = run["p99"], rep["p99"].ravel()
        re_t = tail(real_p[np.isfinite(real_p)], topo.qos_ms)
        tw_t = tail(twin_p[np.isfinite(twin_p)], topo.qos_ms)
        fmt = lambda t: f"{' / '.join(f'{x:.0f}' for x in t['quantiles'])}, {100 * t['violation_rate']:.2f} %"
        thr = "-"
        if run["throttled"] is not None:
            real_thr = np.nanmean(run["throttled"], axis=0)
            model = rep["theta"].mean(axis=(0, 1))
            thr = " ".join(f"{s} {r:.3f} / {m:.3f}" for s, r, m in zip(services, real_thr, model))
        burst = f" (burst {run_topo.cfs_burst:g})" if run_topo.cfs_burst else ""
        print(f"| {Path(d).name}{burst} | {run['users']:g} | {fmt(re_t)} | {fmt(tw_t)} | {thr} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
