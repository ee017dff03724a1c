"""What a graphite-web render costs, by form: raw series, server-side aggregation, concurrent
renders. The measurement behind the daemon reader's design (docs/benchmarks.md, "One daemon
iteration"): graphite-web's cost follows the number of series read, not the points returned.

    .venv/bin/python benchmarks/graphite_render_forms.py --instances 1000 --repeats 5 --json

A fresh `LocalGraphite` (`10s:6h,1m:7d`) gets three intervals of collector metrics for N
instances over the groups S/M/L (the daemon benchmark's publisher), waits until carbon is quiet,
then times each render form `--repeats` times (median reported) over the last interval.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    import loop_iteration as bench

    from samm.monitor.graphite_client import RenderClient
    from samm.monitor.local_graphite import LocalGraphite

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--instances", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.instances < 1 or args.repeats < 1:  # no series to render, or a median of no timings
        ap.error("--instances and --repeats must be at least 1")

    g = LocalGraphite(tempfile.mkdtemp(prefix="samm-render-"), retentions="10s:6h,1m:7d").start()
    try:
        prefix = "p"
        instances = [(name, f"i-{name}{k:05d}") for (name, *_), c in zip(bench.GROUPS, bench.shares(args.instances))
                     for k in range(c)]
        now = int(time.time()) // 60 * 60
        ends = [now - 60 * (3 - i) for i in range(3)]
        bench.publish_intervals(g, prefix, instances, ends, seed=1)
        bench.wait_visible(g, prefix, args.instances, ends[-1])
        bench.wait_quiet()
        b = ends[-1]
        a = b - 60
        clients = [RenderClient(g.render_url, timeout_s=120) for _ in range(6)]
        pool = ThreadPoolExecutor(6)
        inst = f"{prefix}.groups.{{S,M,L}}.instances.*"

        def concurrent(targets):
            futures = [pool.submit(clients[i].render, t, a - 1, b - 1) for i, t in enumerate(targets)]
            return sum(len(f.result()) for f in futures)

        forms = {
            "raw cpu+ram (one render)": lambda: len(clients[0].render(f"{inst}.{{cpu_percent,ram_used_gb}}", a - 1, b - 1)),
            "raw cpu only": lambda: len(clients[0].render(f"{inst}.cpu_percent", a - 1, b - 1)),
            "up + queue over 180 s": lambda: len(clients[0].render([f"{inst}.up", f"{prefix}.queue.*"], b - 181, b - 1)),
            "summarize(cpu+ram, 60s, avg)": lambda: len(clients[0].render(
                f"summarize({inst}.{{cpu_percent,ram_used_gb}},'60s','avg',true)", a - 1, b - 1)),
            "percentileOfSeries(cpu, 90)": lambda: len(clients[0].render(
                f"percentileOfSeries({inst}.cpu_percent,90,true)", a - 1, b - 1)),
            "3 concurrent renders (per group)": lambda: concurrent(
                [f"{prefix}.groups.{G}.instances.*.{{cpu_percent,ram_used_gb}}" for G in "SML"]),
            "6 concurrent renders (group x metric)": lambda: concurrent(
                [f"{prefix}.groups.{G}.instances.*.{m}" for G in "SML" for m in ("cpu_percent", "ram_used_gb")]),
        }
        rows = []
        for name, fn in forms.items():
            times, n = [], 0
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                n = fn()
                times.append(time.perf_counter() - t0)
            rows.append({"form": name, "series": n, "median_ms": round(1e3 * statistics.median(times), 1)})
            print(f"{name:42s} {rows[-1]['median_ms']:8.1f} ms  ({n} series)", file=sys.stderr)
    finally:
        g.stop()
    if args.json:
        print(json.dumps({"command": "python " + " ".join(sys.argv), "instances": args.instances, "rows": rows,
                          "machine": {"cpus": os.cpu_count(), "load_after": os.getloadavg()}}))


if __name__ == "__main__":
    main()
