"""Wall time of one daemon iteration (`ControlLoop.run_once`) over a real Graphite and moto's
AWS Auto Scaling, at several fleet sizes, with a breakdown by stage.

    .venv/bin/python benchmarks/loop_iteration.py --sizes 30,300,1000 --repeats 10 --json

Per size N (instances spread over the groups S/M/L, each group's max = 2x its share):

1. a fresh prefix in one `LocalGraphite` (carbon-cache + graphite-web) shared by all sizes, and
   moto's server reset, with the three ASGs created at the share as desired capacity (moto
   launches every instance at once);
2. `repeats + 1` consecutive past intervals of collector metrics published for every instance
   (cpu_percent / ram_used_gb / up every 10 s, docs/metric-naming.md) plus the queue counters,
   with five minutes of history before the first; the load changes from interval to interval
   (busy, then idle) so the agent has reasons to scale both ways;
3. the daemon built by `build_daemon` as in production (in-process lstm-ppo agent, aws-asg
   executor against moto, knowledge store in a temporary SQLite file, publishing to Graphite);
4. one warm-up iteration on the first interval (reported apart: it also runs the first-seen
   look-back over 900 s of heartbeats), then one timed iteration per further interval, the
   injected clock stepped to 10 s after each interval's end, so every iteration reads a new
   interval and really decides.

Stages are timed from outside by wrapping the collaborators' methods (no change to the loop);
AWS calls are split with botocore's events into time on the wire (moto's server: HTTP,
emulated back-end, XML) and time in botocore (serialising, parsing); Graphite renders into
time in `requests.get` (graphite-web) and time parsing the JSON in SAMM's client. "SAMM" in
the table is the wall time minus the time spent waiting on those two servers on the critical
path (the inventory's AWS calls run beside the Graphite read, so only what outlasts it counts); its main-thread
CPU time (moto's server is a thread of this process, so it is excluded) is the figure least
disturbed by other load on the machine.

The benchmark's Graphite stores one slot per collector step (`--retentions 10s:6h,1m:7d`, as a
production schema for 10 s collectors would; `LocalGraphite`'s test default has 1 s slots, ten
times the points per render). The AWS executor caches launch times, so EC2 is asked only about
instances it has not seen: the warm-up iteration pays for the whole fleet's lookup, the timed
ones only for instances launched since.
Do not run it in the test suite: it starts servers and takes minutes.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import re
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GROUPS = (("S", 2, 8.0, 0.2, "samm-m5a-large"), ("M", 4, 16.0, 0.4, "samm-m5a-xlarge"),
          ("L", 8, 32.0, 0.8, "samm-m5a-2xlarge"))
INTERVAL_S = 60
STEP_S = 10
HISTORY_S = 300
# CPU % of every instance per interval, cycled: busy, then quiet, so scaling is on the table both ways
CPU_PATTERN = (92.0, 95.0, 70.0, 25.0, 8.0, 5.0, 50.0)


# --- stage timing from outside ------------------------------------------------------------------
class Stopwatch:
    """Accumulates seconds and call counts per stage name for the current iteration."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()

    def add(self, stage: str, dt: float) -> None:
        self.seconds[stage] += dt
        self.calls[stage] += 1

    def wrap(self, owner: Any, attr: str, stage: str | Callable[..., str]) -> None:
        """Replace `owner.attr` (an instance attribute or a module global) with a timed call."""
        inner = getattr(owner, attr)

        @functools.wraps(inner)
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.add(stage(*args, **kwargs) if callable(stage) else stage, time.perf_counter() - t0)

        setattr(owner, attr, timed)

    def watch_botocore(self, client: Any) -> None:
        """Time on the wire per AWS operation: from `before-send` to `before-parse` (calls are
        sequential here, so one start time at a time is enough)."""
        sent = {"at": None}

        def before_send(**_):
            sent["at"] = time.perf_counter()

        def before_parse(operation_model, **_):
            if sent["at"] is not None:
                dt = time.perf_counter() - sent["at"]
                self.add(f"aws.{operation_model.name}.wire", dt)
                if threading.current_thread().name.startswith("samm-inventory"):
                    self.add("aws.inventory.wire", dt)  # beside the Graphite read, not after it
                sent["at"] = None

        client.meta.events.register("before-send", before_send)
        client.meta.events.register("before-parse", before_parse)


def instrument(daemon, sw: Stopwatch) -> None:
    import samm.daemon.loop as loop_mod
    import samm.daemon.monitoring as mon_mod

    loop = daemon.loop
    monitor = loop.monitor
    source = monitor.source
    render = source.render
    sw.wrap(monitor, "read", "monitor")
    sw.wrap(source, "read", "monitor.graphite")
    sw.wrap(render, "render", "monitor.graphite.render")
    # the whole HTTP exchange, GET or POST, headers and body (the session's get returns at the headers
    # since the client reads the body itself, bounded)
    sw.wrap(render, "_fetch", "monitor.graphite.render.http")
    sw.wrap(daemon.executor, "inventory", "monitor.inventory")
    sw.wrap(mon_mod, "assemble_snapshot", "monitor.assemble")
    sw.wrap(daemon.executor, "_call", lambda api, *a, **k: f"aws.{api}")
    sw.watch_botocore(daemon.executor.client)
    if daemon.executor.ec2 is not None:
        sw.watch_botocore(daemon.executor.ec2)
    sw.wrap(loop_mod, "compute_features", "analyze")
    sw.wrap(loop.planner, "decide", "plan")
    sw.wrap(loop_mod, "plan_scaling", "guard")
    sw.wrap(daemon.executor, "apply", "execute")
    for m in ("record_snapshot", "record_observation", "decision", "record_decision", "begin_action",
              "finish_action", "cooldowns"):
        sw.wrap(daemon.store, m, "knowledge")
    if loop.publisher is not None:
        sw.wrap(loop.publisher, "publish", "publish")


def uninstrument() -> None:
    import samm.daemon.loop as loop_mod
    import samm.daemon.monitoring as mon_mod

    for mod, name in ((loop_mod, "compute_features"), (loop_mod, "plan_scaling"), (mon_mod, "assemble_snapshot")):
        f = getattr(mod, name)
        setattr(mod, name, getattr(f, "__wrapped__", f))


# --- set-up -----------------------------------------------------------------------------------
def shares(n: int) -> list[int]:
    k = len(GROUPS)
    return [n // k + (1 if i < n % k else 0) for i in range(k)]


def make_config(graphite, moto, prefix: str, counts: list[int], db: Path, timeout_s: float):
    from samm.config import SammConfig

    groups = [{"name": name, "cores": c, "ram_gb": r, "price_per_hour": p, "min": 1, "max": max(2, 2 * n),
               "asg_name": asg} for (name, c, r, p, asg), n in zip(GROUPS, counts)]
    return SammConfig.model_validate({
        "groups": groups,
        "graphite": {"render_url": graphite.render_url, "carbon_host": graphite.carbon_host,
                     "carbon_port": graphite.carbon_port, "prefix": prefix, "timeout_s": timeout_s},
        "executor": {"kind": "aws-asg", "endpoint_url": moto.endpoint_url},
        "timing": {"interval_s": INTERVAL_S},
        "knowledge": {"url": f"sqlite:///{db}"},
    })


def publish_intervals(graphite, prefix: str, instances: list[tuple[str, str]], ends: list[int], seed: int) -> int:
    """Every instance every 10 s from HISTORY_S before the first interval to the last one's end;
    the queue's counters at the same steps. Returns the number of points sent."""
    from samm.monitor.collector import InstanceReporter, QueueReporter
    from samm.monitor.graphite_client import GraphiteSender

    rng = np.random.default_rng(seed)
    sender = GraphiteSender(graphite.carbon_host, graphite.carbon_port, batch_size=5000)
    reporters = [InstanceReporter(sender, prefix, g, i) for g, i in instances]
    ram = {g: r for g, _, r, _, _ in GROUPS}
    queue = QueueReporter(sender, prefix)
    first = ends[0] - INTERVAL_S - HISTORY_S
    submitted = completed = 0.0
    n_inst = len(instances)
    for t in range(first, ends[-1], STEP_S):
        k = max(0, (t - ends[0] + INTERVAL_S) // INTERVAL_S)  # which timed interval t falls in
        level = CPU_PATTERN[k % len(CPU_PATTERN)]
        cpu = np.clip(level + rng.normal(0, 3, n_inst), 0, 100)
        fill = np.clip(level / 100 + rng.normal(0, 0.05, n_inst), 0.05, 0.95)
        for rep, c, f, (g, _) in zip(reporters, cpu, fill, instances):
            rep.report(float(c), float(f * ram[g] * 0.8), t, flush=False)
        arrivals = 0.02 * n_inst * level / 100
        submitted += arrivals
        completed += arrivals * 0.9
        waiting = round(0.5 * n_inst * max(0.0, level - 60) / 40)
        running = round(0.3 * n_inst * level / 100)
        # the core counts of the `extended` features (the shipped policy reads them): 2-core jobs
        queue.report(round(submitted), waiting, running, round(completed), min(waiting, round(arrivals)), ts=t,
                     flush=False, waiting_cores=2 * waiting, running_cores=2 * running,
                     head_job_cores=2 if waiting else 0)
    sender.flush()
    return sender.sent


def wait_visible(graphite, prefix: str, n_instances: int, last_end: int, timeout_s: float = 180.0) -> float:
    """Poll until every instance's CPU in the last interval and the queue series are readable."""
    from samm.monitor.graphite_client import RenderClient

    client = RenderClient(graphite.render_url, timeout_s=60)
    t0 = time.monotonic()
    while True:
        cpu = client.render(f"{prefix}.groups.*.instances.*.cpu_percent", last_end - INTERVAL_S - 1, last_end - 1)
        q = client.render(f"{prefix}.queue.*", last_end - INTERVAL_S - 1, last_end - 1)
        full = sum(1 for s in cpu if len(s.values()) >= INTERVAL_S // STEP_S)
        if full >= n_instances and len(q) >= 5:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout_s:
            raise RuntimeError(f"Graphite shows {full}/{n_instances} complete instances after {timeout_s} s")
        time.sleep(0.5)


def wait_quiet(max_cpu_percent: float = 10.0, timeout_s: float = 120.0) -> tuple[float, bool]:
    """Wait until the Graphite daemons this process started stop working (carbon writes its cache
    to whisper files in the background), so that work is not timed as the loop's."""
    import psutil

    kids = psutil.Process().children(recursive=True)
    for p in kids:
        p.cpu_percent(None)
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        time.sleep(1.0)
        busy = sum(p.cpu_percent(None) for p in kids if p.is_running())
        if busy < max_cpu_percent:
            return time.monotonic() - t0, True
    return time.monotonic() - t0, False


# --- one size ---------------------------------------------------------------------------------
def run_size(n: int, repeats: int, graphite, moto, tmp: Path, timeout_s: float, log: Callable[[str], None]) -> dict:
    from samm.daemon.build import build_daemon
    from samm.execute.aws_asg import AwsAsgExecutor
    from samm.execute.moto_server import create_paper_asgs

    counts = shares(n)
    prefix = "b" + uuid.uuid4().hex[:8]
    moto.reset()
    t0 = time.perf_counter()
    create_paper_asgs(moto.session(), moto.endpoint_url, min=1, max=[max(2, 2 * c) for c in counts], desired=counts,
                      large_subnets=n > 3000)
    create_s = time.perf_counter() - t0
    cfg = make_config(graphite, moto, prefix, counts, tmp / f"k{n}.db", timeout_s)
    inv = AwsAsgExecutor.from_config(cfg).inventory()
    instances = [(g, i.instance_id) for g, s in inv.items() for i in s.instances]
    assert len(instances) == n, f"moto launched {len(instances)} instances, expected {n}"

    last = (int(time.time()) // INTERVAL_S - 1) * INTERVAL_S
    ends = [last - INTERVAL_S * (repeats - k) for k in range(repeats + 1)]
    t0 = time.perf_counter()
    points = publish_intervals(graphite, prefix, instances, ends, seed=n)
    publish_s = time.perf_counter() - t0
    visible_s = wait_visible(graphite, prefix, n, ends[-1])
    quiet_s, quiet = wait_quiet()
    log(f"N={n}: ASGs {counts} in {create_s:.1f} s; {points} points sent in {publish_s:.1f} s, visible after "
        f"{visible_s:.1f} s, carbon {'quiet' if quiet else 'STILL BUSY'} after {quiet_s:.0f} s")

    clock = {"now": ends[0] + 10.0}
    t0 = time.perf_counter()
    daemon = build_daemon(cfg, clock=lambda: clock["now"])
    build_s = time.perf_counter() - t0
    sw = Stopwatch()
    instrument(daemon, sw)
    iterations = []
    try:
        for k, end in enumerate(ends):
            clock["now"] = end + 10.0
            sw.reset()
            c0, t0 = time.thread_time(), time.perf_counter()
            rep = daemon.loop.run_once()
            wall_ms = (time.perf_counter() - t0) * 1e3
            cpu_ms = (time.thread_time() - c0) * 1e3
            live = sum(v["live"] for v in rep.inventory.values())
            # time waiting on the servers on the iteration's critical path: the inventory's AWS calls
            # run beside the Graphite read (GraphiteMonitor), so only what outlasts the read counts
            sec = sw.seconds
            aws_wire = sum(v for s, v in sec.items() if s.endswith(".wire") and s != "aws.inventory.wire")
            inv_wire = sec.get("aws.inventory.wire", 0.0)
            outside = (sec.get("monitor.graphite.render.http", 0.0) + aws_wire - inv_wire
                       + max(0.0, inv_wire - sec.get("monitor.graphite", 0.0)))
            it = {"key": rep.key, "warmup": k == 0, "wall_ms": round(wall_ms, 2),
                  "servers_ms": round(outside * 1e3, 2), "samm_ms": round(wall_ms - outside * 1e3, 2),
                  "samm_cpu_ms": round(cpu_ms, 2), "status": rep.status,
                  "decided": rep.decided, "action": rep.plan.action_name if rep.plan else None,
                  "outcomes": sorted(f"{a['group']}:{a['status']}" for a in rep.actions), "live": live,
                  "stages_ms": {s: round(v * 1e3, 2) for s, v in sorted(sw.seconds.items())},
                  "calls": dict(sorted(sw.calls.items()))}
            if rep.status != "ok" or rep.key != str(end):
                it["reasons"] = rep.reasons
            iterations.append(it)
            log(f"  {'warm-up' if k == 0 else f'#{k:2d}'} {rep.key}: {wall_ms:8.1f} ms  {rep.status:7s} live {live:4d}  "
                f"{it['action']} {it['outcomes']}")
    finally:
        daemon.close()
        uninstrument()

    timed = [i for i in iterations if not i["warmup"]]
    walls = [i["wall_ms"] for i in timed]
    own = [i["samm_ms"] for i in timed]
    servers = [i["servers_ms"] for i in timed]
    cpu = [i["samm_cpu_ms"] for i in timed]
    stages = sorted({s for i in timed for s in i["stages_ms"]})
    return {
        "instances": n, "groups": dict(zip((g[0] for g in GROUPS), counts)), "prefix": prefix,
        "points_published": points, "build_daemon_s": round(build_s, 2), "carbon_quiet_before_timing": quiet,
        "timed_iterations": len(timed),
        "wall_ms": {"median": _q(walls, 50), "p95": _q(walls, 95), "min": min(walls), "max": max(walls)},
        "samm_ms": {"median": _q(own, 50), "p95": _q(own, 95)},
        "samm_cpu_ms": {"median": _q(cpu, 50), "p95": _q(cpu, 95)},
        "servers_ms": {"median": _q(servers, 50), "p95": _q(servers, 95)},
        "warmup_wall_ms": iterations[0]["wall_ms"],
        "stage_median_ms": {s: _q([i["stages_ms"].get(s, 0.0) for i in timed], 50) for s in stages},
        "iterations_acting": sum(1 for i in timed if any(o.endswith(":succeeded") for o in i["outcomes"])),
        "iterations_blocked": sum(1 for i in timed if any(o.endswith(":blocked") for o in i["outcomes"])),
        "iterations_not_ok": sum(1 for i in timed if i["status"] != "ok"),
        "iterations": iterations,
    }


def _q(xs, q) -> float:
    return round(float(np.percentile(np.asarray(xs, dtype=float), q)), 2)


# --- report -----------------------------------------------------------------------------------
TABLE_STAGES = (
    ("monitor", "monitor (total)"),
    ("monitor.graphite", "  Graphite read (GraphiteSource.read)"),
    ("monitor.graphite.render.http", "    of which graphite-web (HTTP)"),
    ("monitor.graphite.render", "    of which render calls incl. JSON parse"),
    ("monitor.inventory", "  inventory (AwsAsgExecutor.inventory)"),
    ("aws.DescribeAutoScalingGroups.wire", "    DescribeAutoScalingGroups on the wire (moto)"),
    ("aws.DescribeInstances.wire", "    DescribeInstances on the wire (moto)"),
    ("monitor.assemble", "  assemble snapshot"),
    ("analyze", "analyze (compute_features)"),
    ("plan", "plan (lstm-ppo in-process)"),
    ("guard", "guard (plan_scaling)"),
    ("execute", "execute (AwsAsgExecutor.apply)"),
    ("knowledge", "knowledge store (SQLite)"),
    ("publish", "publish to Graphite"),
)


def print_table(results: list[dict]) -> None:
    sizes = [r["instances"] for r in results]
    head = f"{'instances':<52}" + "".join(f"{n:>10,}" for n in sizes)
    print(head)
    print("-" * len(head))
    print(f"{'iteration wall, median ms':<52}" + "".join(f"{r['wall_ms']['median']:>10.1f}" for r in results))
    print(f"{'iteration wall, p95 ms':<52}" + "".join(f"{r['wall_ms']['p95']:>10.1f}" for r in results))
    print(f"{'  of which graphite-web + moto servers, median ms':<52}" + "".join(f"{r['servers_ms']['median']:>10.1f}" for r in results))
    print(f"{'  of which SAMM (incl. boto3/requests), median ms':<52}" + "".join(f"{r['samm_ms']['median']:>10.1f}" for r in results))
    print(f"{'  SAMM, p95 ms':<52}" + "".join(f"{r['samm_ms']['p95']:>10.1f}" for r in results))
    print(f"{'  SAMM main-thread CPU, median ms':<52}" + "".join(f"{r['samm_cpu_ms']['median']:>10.1f}" for r in results))
    print(f"{'warm-up iteration ms (first-seen look-back)':<52}" + "".join(f"{r['warmup_wall_ms']:>10.1f}" for r in results))
    print("stage medians, ms:")
    for key, label in TABLE_STAGES:
        print(f"{label:<52}" + "".join(f"{r['stage_median_ms'].get(key, 0.0):>10.1f}" for r in results))
    print(f"{'timed iterations / acting / blocked / not ok':<52}" + "".join(
        f"{r['timed_iterations']:>4}/{r['iterations_acting']}/{r['iterations_blocked']}/{r['iterations_not_ok']}"
        .rjust(10) for r in results))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="30,300,1000", help="total instances per run, comma-separated")
    ap.add_argument("--repeats", type=int, default=10, help="timed iterations per size (each on a new interval)")
    ap.add_argument("--graphite-timeout", type=float, default=5.0, help="graphite.timeout_s (the config default)")
    ap.add_argument("--retentions", default="10s:6h,1m:7d",
                    help="carbon storage schema for the benchmark's Graphite (one slot per collector step)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON (progress goes to stderr)")
    args = ap.parse_args()
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        ap.error(f"--sizes must be comma-separated integers, got {args.sizes!r}")
    if not sizes or min(sizes) < len(GROUPS):
        ap.error(f"--sizes: each size must be at least {len(GROUPS)} (one instance per group)")
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    if not args.graphite_timeout > 0:  # the daemon config's graphite.timeout_s refuses it after Graphite starts
        ap.error(f"--graphite-timeout must be > 0, got {args.graphite_timeout}")
    # carbon's schema, e.g. 10s:6h,1m:7d; a bad one only shows as carbon-cache failing to start
    if not re.fullmatch(r"\d+[smhdwy]?:\d+[smhdwy]?(,\d+[smhdwy]?:\d+[smhdwy]?)*", args.retentions):
        ap.error(f"--retentions must be carbon's PRECISION:RETENTION[,...] (e.g. 10s:6h,1m:7d), got {args.retentions!r}")

    import logging

    logging.basicConfig(level=logging.ERROR)
    # dummy credentials: nothing here may reach a real AWS account
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    from samm.execute.moto_server import MotoServer
    from samm.monitor.local_graphite import LocalGraphite

    def log(msg: str) -> None:
        print(msg, file=sys.stderr if args.json else sys.stdout, flush=True)

    started = time.perf_counter()
    load_before = os.getloadavg()
    results = []
    with tempfile.TemporaryDirectory(prefix="samm-bench-loop-") as tmp, \
            LocalGraphite(Path(tmp) / "graphite", retentions=args.retentions) as graphite, MotoServer() as moto:
        for n in sizes:
            results.append(run_size(n, args.repeats, graphite, moto, Path(tmp), args.graphite_timeout, log))
    out = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "retentions": args.retentions,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_before": load_before,
                    "load_after": os.getloadavg()},
        "total_s": round(time.perf_counter() - started, 1),
        "results": results,
    }
    if args.json:
        with contextlib.redirect_stdout(sys.stderr):
            print_table(results)
        print(json.dumps(out))
    else:
        print()
        print_table(results)
        print(f"\ntotal {out['total_s']} s; load average before {load_before[0]:.2f}, after {out['machine']['load_after'][0]:.2f}")


if __name__ == "__main__":
    main()
