"""A testbed worker: the process that stands for one VM of an Auto Scaling Group.

It leases jobs from the shared `JobQueue` up to its free cores, runs each for
`runtime_s / compression` wall seconds, completes it, heartbeats its leases and reports its
metrics to Graphite through `InstanceReporter`, idle or not.

What "running a job" means here: the job holds its cores for its (compressed) duration and
the worker does real CPU work (SHA-256 over a buffer) for `duty` of each slice per held core,
sleeping the rest. The duty cycle is tiny on purpose (default 0.5 % of a host core per held
core: a full fleet of 140 cores costs 0.7 host core) so ~30 workers fit on a 2-core machine
next to Graphite, moto and the daemon.

Reported CPU is therefore NOT the host's measured CPU: `cpu_percent` is the share of the
instance's cores held by jobs, time-averaged since the last report — exactly the simulator's
per-VM `cpu_busy` (a cloudlet keeps its PEs 100 % busy while it runs). `ram_used_gb` is the
sum of the running jobs' `ram_gb` at report time, the simulator's definition too (cloudlets
use no RAM inside CloudSim; RAM is not checked against the type's RAM, so neither is it here).

The worker is safe to SIGKILL at any moment (its leases expire, or the reconciler calls
`JobQueue.release_worker`, and its jobs run again elsewhere); SIGTERM stops it cleanly and
hands its jobs back at once. A worker stalled past its lease (SIGSTOP, a paused host) renews
its leases before anything else when it wakes: a job nobody re-queued meanwhile runs on, one
that was re-queued is dropped, so no job runs on two workers at once.
"""
from __future__ import annotations

import argparse
import hashlib
import logging
import math
import signal
import sqlite3
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from samm.monitor.collector import InstanceReporter, parse_host_port
from samm.monitor.graphite_client import GraphiteSender

from .jobqueue import Job, JobQueue

log = logging.getLogger(__name__)

_BUF = bytes(range(256)) * 256  # 64 KiB: ~30 us of SHA-256, fine-grained enough for a 0.1 s slice


@dataclass
class WorkerStats:
    completed: int = 0
    ignored: int = 0  # completions refused: the lease had been re-queued meanwhile
    lost: int = 0  # attempts dropped: the lease was gone at a heartbeat, or expired and came back
    leased: int = 0
    reports: int = 0
    burn_s: float = 0.0  # CPU seconds spent hashing
    completed_ids: list[int] = field(default_factory=list)


def burn(seconds: float) -> float:
    """Real CPU work for about `seconds`; returns the time actually spent."""
    if seconds <= 0:
        return 0.0
    start = time.perf_counter()
    end = start + seconds
    while time.perf_counter() < end:
        hashlib.sha256(_BUF).digest()
    return time.perf_counter() - start


def run_worker(queue: str | JobQueue, group: str, instance: str, cores: int, compression: float, t0: float,
               graphite: str | GraphiteSender | None = None, prefix: str = "samm", report_every: float = 1.0,
               lease_s: float = 5.0, duty: float = 0.005, poll_s: float = 0.1, slice_s: float = 0.1,
               stop: threading.Event | None = None, max_wall_s: float | None = None,
               release_on_stop: bool = True,
               on_report: Callable[[float, float, int], None] | None = None) -> WorkerStats:
    """Run the worker loop until `stop` is set (or `max_wall_s` elapses). `queue`: the queue's
    SQLite path or an open `JobQueue`; `graphite`: "host:port", a sender, or None (no reports).
    `t0`: the testbed's epoch (workload time = (wall - t0) x compression), the same in every
    process. `on_report(cpu_percent, ram_used_gb, ts)` sees every report. Returns counters."""
    if cores < 1:
        raise ValueError(f"cores must be >= 1, got {cores}")
    # `not v > 0` alone lets inf through: an infinite compression makes every job end at once,
    # an infinite lease never expires (a dead worker's jobs would never run again)
    if not (math.isfinite(compression) and compression > 0):
        raise ValueError(f"compression must be a finite number > 0, got {compression}")
    if not math.isfinite(t0):
        raise ValueError(f"t0 must be a finite epoch time, got {t0}")
    if not (0 <= duty <= 1):
        raise ValueError(f"duty must be in [0, 1], got {duty}")
    for name, v in (("report_every", report_every), ("lease_s", lease_s), ("poll_s", poll_s), ("slice_s", slice_s)):
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be a finite number > 0, got {v}")
    if max_wall_s is not None and not max_wall_s >= 0:
        raise ValueError(f"max_wall_s must be >= 0 or None, got {max_wall_s}")
    stop = stop or threading.Event()
    q = queue if isinstance(queue, JobQueue) else JobQueue(queue)
    sender = GraphiteSender(*parse_host_port(graphite)) if isinstance(graphite, str) else graphite
    reporter = InstanceReporter(sender, prefix, group, instance) if sender is not None else None
    stats = WorkerStats()

    def clock(wall: float) -> float:
        return (wall - t0) * compression

    running: dict[int, tuple[Job, float]] = {}  # id -> (job, wall end)
    busy = 0
    start = time.time()
    # a worker restarted on the same instance holds nothing from its previous life
    q.release_worker(instance, start, clock(start))
    heartbeat_every = lease_s / 3.0
    next_poll = next_hb = start
    next_report = start + report_every
    last_report, busy_area = start, 0.0  # core-seconds held since the last report
    last_change = start
    next_slice = start

    def account(now: float) -> None:
        nonlocal busy_area, last_change
        busy_area += busy * (now - last_change)
        last_change = now

    try:
        while not stop.is_set():
            now = time.time()
            if max_wall_s is not None and now - start >= max_wall_s:
                break
            try:
                # 1. finish what is due
                for job_id in [j for j, (_, end) in running.items() if end <= now]:
                    job, end = running[job_id]
                    done = q.complete(job.id, instance, clock(end), attempt=job.attempt)
                    del running[job_id]  # only now: a locked database leaves it due for the next turn
                    account(now)
                    busy -= job.cores
                    if done:
                        stats.completed += 1
                        stats.completed_ids.append(job.id)
                    else:
                        stats.ignored += 1
                        log.warning("worker %s: completion of job %d ignored (its lease was re-queued)", instance, job.id)
                    next_poll = now  # cores just freed: look for work at once
                # 2. keep leases alive, BEFORE taking work: after a stall past the lease, leasing
                # first re-queued this worker's own running jobs (the lease call re-queues every
                # expired lease) and ran them again, here from zero or on another worker at the
                # same time. An expired lease nobody re-queued yet is renewed (nobody else runs
                # the job); one already re-queued is lost, and its job dropped here.
                if now >= next_hb:
                    if running and q.heartbeat(instance, time.time(), lease_s) < len(running):
                        held = q.held(instance)
                        for job_id in [j for j, (job, _) in running.items() if held.get(j) != job.attempt]:
                            job, _ = running.pop(job_id)
                            account(now)
                            busy -= job.cores
                            stats.lost += 1
                            log.warning("worker %s: lease of job %d lost (expired and re-queued); dropped", instance, job_id)
                    next_hb = now + heartbeat_every
                # 3. take work
                if busy < cores and now >= next_poll:
                    got = q.lease(instance, cores - busy, now, lease_s, clock(now))
                    if got:
                        account(now)
                        for job in got:
                            # after a stall past its lease this worker may get its own job back:
                            # the old attempt is lost, and its cores must not stay counted busy
                            old = running.pop(job.id, None)
                            if old is not None:
                                busy -= old[0].cores
                                stats.lost += 1
                                log.warning("worker %s: lease of job %d expired; running it again", instance, job.id)
                            running[job.id] = (job, now + job.runtime_s / compression)
                            busy += job.cores
                        stats.leased += len(got)
                    next_poll = now + poll_s
            except sqlite3.OperationalError as exc:  # e.g. locked past busy_timeout: retry, never die
                log.warning("worker %s: job queue unavailable (%s); retrying", instance, exc)
                next_poll = next_hb = now + poll_s
                stop.wait(poll_s)  # a due job stays due: without this pause the loop would spin
            # 4. report
            if now >= next_report:
                account(now)
                span = max(now - last_report, 1e-9)
                cpu = min(100.0, 100.0 * busy_area / (cores * span))
                ram = sum(job.ram_gb for job, _ in running.values())
                if reporter is not None:
                    reporter.report(cpu, ram, ts=int(now))
                if on_report is not None:
                    on_report(cpu, ram, int(now))
                stats.reports += 1
                busy_area, last_report = 0.0, now
                next_report += report_every
                if next_report <= now:  # a long stall: skip the missed reports instead of bursting
                    next_report = now + report_every
            # 5. real CPU work for the held cores, then sleep to the next event
            if busy and now >= next_slice:
                stats.burn_s += burn(min(duty * busy, 1.0) * slice_s)
                next_slice = now + slice_s
            wake = [next_hb if running else next_report, next_report]
            if busy < cores:
                wake.append(next_poll)
            if running:
                wake.append(min(end for _, end in running.values()))
                wake.append(next_slice)
            if max_wall_s is not None:
                wake.append(start + max_wall_s)
            timeout = min(wake) - time.time()
            if timeout > 0:
                stop.wait(timeout)
    finally:
        if release_on_stop and running:
            now = time.time()
            try:
                q.release_worker(instance, now, clock(now))
            except sqlite3.OperationalError as exc:  # the leases will expire instead
                log.warning("worker %s: could not hand its jobs back (%s); they return when their leases expire",
                            instance, exc)
        if not isinstance(queue, JobQueue):
            q.close()
    return stats


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m samm.testbed.worker", description=__doc__.split("\n\n")[0])
    p.add_argument("--queue", required=True, help="the job queue's SQLite file")
    p.add_argument("--group", required=True, help="the instance's group (Graphite path component)")
    p.add_argument("--instance", required=True, help="instance id: the worker's lease owner id")
    p.add_argument("--cores", type=int, required=True, help="cores of the instance type")
    p.add_argument("--compression", type=float, required=True, help="workload seconds per wall second")
    p.add_argument("--t0", type=float, required=True, help="the testbed's epoch (float seconds), shared by all")
    p.add_argument("--graphite", default="", help="carbon HOST:PORT (empty: no reports)")
    p.add_argument("--prefix", default="samm", help="metric prefix")
    p.add_argument("--report-every", type=float, default=1.0, help="wall seconds between reports")
    p.add_argument("--lease-s", type=float, default=5.0, help="lease length in wall seconds")
    p.add_argument("--duty", type=float, default=0.005, help="host-core share burnt per held core (0..1)")
    p.add_argument("--poll-s", type=float, default=0.1, help="wall seconds between polls for work")
    p.add_argument("--log-level", default="INFO")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.INFO),
                        format=f"%(asctime)s worker {args.instance} %(levelname)s %(message)s", stream=sys.stderr)
    stop = threading.Event()

    def on_signal(signum, _frame):
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        graphite = args.graphite or None
        if graphite:
            parse_host_port(graphite)  # fail fast with a clear message
        stats = run_worker(args.queue, args.group, args.instance, args.cores, args.compression, args.t0,
                           graphite=graphite, prefix=args.prefix, report_every=args.report_every,
                           lease_s=args.lease_s, duty=args.duty, poll_s=args.poll_s, stop=stop)
    except ValueError as exc:
        print(f"worker: {exc}", file=sys.stderr)
        return 2
    except (OSError, sqlite3.Error, RuntimeError) as exc:  # the queue file cannot be created or opened
        print(f"worker: job queue {args.queue}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    log.info("stopped: %d completed, %d ignored, %d lost", stats.completed, stats.ignored, stats.lost)
    return 0


if __name__ == "__main__":
    sys.exit(main())
