"""The testbed twin's latency tail beside the real containers' (docs/microservice-testbed.md, "The twin's
latency tail", session 77).

The real per-second p99s are `benchmarks/data/microservice_testbed_p99.csv` (600-s runs, Intel machine).
For each candidate tail (the topology options `throttle_chain`, `jitter_p`, `jitter_ms`, with percentiles
over each second's requests) the twin runs each method at each load for `--seeds` copies of 600 s; the
table gives the 90th / 99th / 99.5th percentile of the seconds' p99 and the share of seconds over the
QoS target, twin beside real. The fit is the mean |log(twin / real)| over the three quantiles of the
`--fit` methods' rows (AutoScale by default); the other methods are held out. The first row is the twin
as it was before session 77 (percentiles over 256 draws, no chain, no noise).

    .venv/bin/python benchmarks/microservice_twin_tail.py
    .venv/bin/python benchmarks/microservice_twin_tail.py --chains 0.25 --check reclaimer+window5,reclaimer@runs/x/policy+window5
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from agents.microservice_cores.episode import run_episodes  # noqa: E402
from agents.microservice_cores.topology import Topology, load_topology  # noqa: E402
from agents.policy import one_line  # noqa: E402
from agents.report import writable_folder  # noqa: E402
from microservice_testbed_compare import twin_controllers  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "microservice_testbed_p99.csv"
QUANTILES = (90, 99, 99.5)
BEFORE = {"percentiles_over": "draws", "throttle_chain": 0.0, "jitter_p": 0.0, "jitter_ms": 0.0}


def real_p99(path: Path = DATA) -> dict[tuple[str, int], np.ndarray]:
    """(method, users) -> every known per-second p99 of its runs, pooled."""
    out: dict[tuple[str, int], list[float]] = {}
    with open(path) as f:
        for row in csv.DictReader(line for line in f if not line.startswith("#")):
            vals = np.array([float(x) for x in row["p99_ms"].split()])
            out.setdefault((row["method"], int(row["users"])), []).extend(vals[np.isfinite(vals)].tolist())
    return {k: np.array(v) for k, v in out.items()}


def tail(p99: np.ndarray, qos_ms: float) -> dict:
    return {"quantiles": [float(x) for x in np.percentile(p99, QUANTILES)],
            "violation_rate": float(np.mean(p99 > qos_ms)), "seconds": int(p99.size)}


def twin_tail(topo: Topology, agent: str, users: int, seeds: list[int]) -> dict:
    name, make = twin_controllers(agent, topo)
    res = run_episodes(topo, make, users, seeds, steps=600, warmup=2, method=name)
    p = np.concatenate([r.p99_ms for r in res])
    out = tail(p[np.isfinite(p)], topo.qos_ms)
    out["mean_cores"] = float(np.mean([r.mean_cores for r in res]))
    return out


def loss(twin: dict, real: dict) -> float:
    return float(np.mean([abs(np.log(t / r)) for t, r in zip(twin["quantiles"], real["quantiles"])]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chains", default="0.15,0.2,0.25,0.3", help="throttle_chain values to try")
    ap.add_argument("--jitter-p", type=float, default=0.001)
    ap.add_argument("--jitter-ms", type=float, default=50.0)
    ap.add_argument("--fit", default="autoscale", help="methods whose real tail the candidates are scored on")
    ap.add_argument("--check", default="reclaimer+window5", help="held-out methods (twin agent specs)")
    ap.add_argument("--users", default="6,14")
    ap.add_argument("--seeds", type=int, default=12)
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    a = ap.parse_args(argv)
    real = real_p99()
    base = load_topology("testbed").model_dump()
    qos = base["qos_ms"]
    fit = [m for m in a.fit.split(",") if m]
    check = [m for m in a.check.split(",") if m]
    # every refusal before the first twin runs (minutes), as one line naming the option
    try:
        users = [int(u) for u in a.users.split(",")]
        chains = [float(c) for c in a.chains.split(",")]
    except ValueError as exc:
        ap.error(f"--users and --chains must be comma-separated numbers: {exc}")
    if min(users) < 1 or a.seeds < 1:
        ap.error("--users and --seeds must be at least 1")
    for method in fit + check:
        try:
            twin_controllers(method, Topology(**base))
        except (ValueError, OSError) as exc:
            ap.error(f"--fit/--check {method}: {exc}")
    try:  # before the work: a path that cannot take the file failed only at the end, losing it
        if a.out:
            writable_folder(Path(a.out).parent)
    except OSError as exc:
        ap.error(f"--out {a.out}: {exc}")
    seeds = list(range(a.seeds))
    candidates = [("before (draws)", BEFORE)] + [
        (f"chain {c:g}", {"percentiles_over": "requests", "throttle_chain": c, "jitter_p": a.jitter_p,
                          "jitter_ms": a.jitter_ms}) for c in chains]
    for label, over in candidates:  # a bad --chains/--jitter-* value failed after the first twin's runs
        try:
            Topology(**{**base, **over})
        except ValueError as exc:
            ap.error(f"--chains/--jitter-p/--jitter-ms ({label}): {one_line(exc)}")
    rows = []
    print("| twin | method | users | mean cores | p99 q90 / q99 / q99.5 (ms) | violating | real q90 / q99 / q99.5 | real violating |")
    print("|---|---|---:|---:|---|---:|---|---:|")
    for label, over in candidates:
        topo = Topology(**{**base, **over})
        scored = []
        for method in fit + check:
            for u in users:
                tw = twin_tail(topo, method, u, seeds)
                key = None if "@" in method else (method, u)   # a policy of its own has no real runs here
                re = tail(real[key], qos) if key is not None and key in real else None
                if re is not None and method in fit:
                    scored.append(loss(tw, re))
                rows.append({"twin": label, "overrides": over, "method": method, "users": u, "twin_tail": tw,
                             "real_tail": re, "fit": method in fit})
                rq = "-" if re is None else " / ".join(f"{x:.0f}" for x in re["quantiles"])
                rv = "-" if re is None else f"{100 * re['violation_rate']:.2f} %"
                print(f"| {label} | {method} | {u} | {tw['mean_cores']:.3f} | "
                      f"{' / '.join(f'{x:.0f}' for x in tw['quantiles'])} | {100 * tw['violation_rate']:.2f} % | {rq} | {rv} |",
                      flush=True)
        if scored:
            print(f"| {label} | fit: mean abs log ratio {np.mean(scored):.3f} |  |  |  |  |  |  |", flush=True)
            rows.append({"twin": label, "fit_loss": float(np.mean(scored))})
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
