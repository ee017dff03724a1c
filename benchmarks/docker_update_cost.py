"""What one live CPU-limit change costs the host: `DockerExecutor.set_cpu_limit` (the path the
microservice testbed's loop takes every time it resizes a service) against a running container
of a private Docker engine, timed and charged in host CPU (all processes: the client, dockerd,
containerd and the runc it starts per update).

    .venv/bin/python benchmarks/docker_update_cost.py [--updates 200] [--idle-s 10] [--json]

Host CPU per update = (busy CPU during the updates - the idle host's busy CPU over the same time)
/ updates, from /proc/stat. Needs root and Debian's docker.io (the private engine of
samm.execute.local_dockerd); prints why not otherwise. Context (docs/microservice-testbed.md,
session 76): the windowed policy resizes 1.2-3.1 services a second at 14 users, AutoScale 0.3-0.4.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def busy_seconds() -> float:
    """CPU seconds the whole host has spent busy (all CPUs; /proc/stat, idle and iowait excluded)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def measure(updates: int, idle_s: float) -> dict:
    from samm.execute.docker_exec import DockerExecutor
    from samm.execute.local_dockerd import LocalDockerd, ensure_busybox_image

    with tempfile.TemporaryDirectory(prefix="samm-upd-") as tmp, LocalDockerd(tmp) as engine:
        client = engine.client()
        ensure_busybox_image(client)
        name = "samm-update-probe"
        box = client.containers.run("local/busybox:samm", ["sleep", "3600"], detach=True, name=name,
                                    cpu_period=100_000, cpu_quota=30_000)
        executor = DockerExecutor([], client=client)
        try:
            time.sleep(1.0)
            b0, t0 = busy_seconds(), time.monotonic()
            time.sleep(idle_s)
            idle_cores = (busy_seconds() - b0) / (time.monotonic() - t0)
            wall, failed = [], 0
            b0, t0 = busy_seconds(), time.monotonic()
            for i in range(updates):
                s = time.perf_counter()
                res = executor.set_cpu_limit(name, 0.10 + 0.01 * (i % 10))
                wall.append((time.perf_counter() - s) * 1000)
                failed += res.status != "succeeded"
            span = time.monotonic() - t0
            busy = busy_seconds() - b0
            held = client.api.inspect_container(name)["HostConfig"]["CpuQuota"]
        finally:
            box.remove(force=True)
            client.close()
    wall.sort()
    return {"updates": updates, "failed": failed, "seconds": round(span, 3), "idle_host_cores": round(idle_cores, 4),
            "wall_ms_p50": round(statistics.median(wall), 2), "wall_ms_p99": round(wall[int(0.99 * (len(wall) - 1))], 2),
            "host_cpu_ms_per_update": round((busy - idle_cores * span) / updates * 1000, 2),
            "last_quota_read_back": held, "cpus": os.cpu_count()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--updates", type=int, default=200)
    ap.add_argument("--idle-s", type=float, default=10.0, help="seconds of idle host measured first")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.updates < 10:
        ap.error("--updates must be at least 10")
    if not 0 <= a.idle_s < float("inf"):  # time.sleep refused it only after the engine had started, as "cannot measure here"
        ap.error(f"--idle-s must be a number of seconds >= 0, not {a.idle_s}")
    try:
        r = measure(a.updates, a.idle_s)
    except Exception as exc:  # noqa: BLE001 - no root, no docker.io: say so
        print(f"cannot measure here: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(r))
    else:
        print(f"{r['updates']} updates ({r['failed']} failed) in {r['seconds']} s: wall p50 {r['wall_ms_p50']} ms, "
              f"p99 {r['wall_ms_p99']} ms; host CPU {r['host_cpu_ms_per_update']} ms per update "
              f"(idle host {r['idle_host_cores']} cores, {r['cpus']} CPUs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
