"""The testbed's workload driver and queue-metrics publisher.

`Driver` replays a `Workload` into the `JobQueue` compressed in time: job i is submitted
`arrival_s[i] / compression` wall seconds after `t0`, with its nominal `submitted_at =
arrival_s[i]` (workload seconds) even when it goes late, so its wait counts from its arrival as
in the simulator. It knows nothing about the fleet (the paper's driver is isolated from
autoscaling): it only submits.

`QueuePublisher` is the queue's owner in the metric-naming sense: every `every_s` wall seconds
it re-queues expired leases and publishes `QueueReporter` counters to Graphite.
"""
from __future__ import annotations

import logging
import math
import sqlite3
import threading
import time
from dataclasses import asdict

import numpy as np

from samm.monitor.collector import QueueReporter
from samm.monitor.graphite_client import GraphiteSender
from sim_bridge.workloads import Workload

from .jobqueue import JobQueue, QueueCounters, _check_clock
from .options import number_problem

log = logging.getLogger(__name__)

PAPER_HOST_MIPS = 4400.0


def _check_positive(**values: float) -> None:
    # `not v > 0` let inf through: an infinite interval made the publisher's wait overflow and
    # end its thread, an infinite compression submitted the whole workload at once
    for name, v in values.items():
        if problem := number_problem(name, v, strict=True):
            raise ValueError(problem)


class Driver:
    """Submits every job of `workload` at `t0 + arrival_s / compression` (wall). `run()` blocks
    until everything is submitted or `stop()`; `start()` runs it in a daemon thread."""

    def __init__(self, queue: JobQueue, workload: Workload, compression: float, t0: float,
                 host_mips: float = PAPER_HOST_MIPS, clock=time.time):
        _check_positive(host_mips=host_mips)
        _check_clock(t0, compression)
        self.queue, self.workload = queue, workload
        self.compression, self.t0, self.clock = float(compression), float(t0), clock
        self.runtime_s = workload.runtime_s(host_mips)
        self.submitted = 0
        self.late_s_max = 0.0  # worst lateness of a submission, wall seconds
        self._stop = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        queue.set_clock(self.t0, self.compression)

    @property
    def n_jobs(self) -> int:
        return self.workload.n_jobs

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def due_wall(self, i: int) -> float:
        return self.t0 + float(self.workload.arrival_s[i]) / self.compression

    def run(self) -> int:
        """Submit until done or stopped; returns the number submitted. Jobs that are due
        together (a batch) go in one transaction."""
        w = self.workload
        i, n = self.submitted, w.n_jobs
        try:
            while i < n and not self._stop.is_set():
                now = self.clock()
                due_until = (now - self.t0) * self.compression
                j = int(np.searchsorted(w.arrival_s, due_until, side="right"))
                if j > i:
                    try:
                        self.queue.submit_many(
                            (k, int(w.cores[k]), float(self.runtime_s[k]), float(w.arrival_s[k]), float(w.ram_gb[k]))
                            for k in range(i, j))
                    except sqlite3.OperationalError as exc:  # locked past busy_timeout: submit is idempotent, retry
                        log.warning("driver: submitting jobs %d..%d failed (%s); retrying", i, j - 1, exc)
                        self._stop.wait(0.1)
                        continue
                    self.late_s_max = max(self.late_s_max, now - self.due_wall(i))
                    i = self.submitted = j
                    continue
                self._stop.wait(max(0.0, self.due_wall(i) - self.clock()))
        finally:
            if i >= n:
                self._done.set()
        return self.submitted

    def start(self) -> "Driver":
        self._thread = threading.Thread(target=self._run_logged, name="testbed-driver", daemon=True)
        self._thread.start()
        return self

    def _run_logged(self) -> None:
        try:
            self.run()
        except Exception:
            log.exception("driver: stopped by an error after %d of %d jobs", self.submitted, self.n_jobs)

    def stop(self, timeout: float | None = 5.0) -> None:
        self._stop.set()
        self.join(timeout)

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the driver thread; True when every job was submitted."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self.done


def interval_start_clock(now_wall: float, interval_s: float, t0: float, compression: float) -> float:
    """Workload time at which the current epoch-aligned daemon interval (wall) began."""
    start_wall = math.floor(now_wall / interval_s) * interval_s
    return (start_wall - t0) * compression


class QueuePublisher:
    """Every `every_s` wall seconds (aligned on the epoch): re-queue expired leases, then
    publish the queue counters. `interval_s` is the daemon's interval in WALL seconds: the
    `waiting_submitted_this_minute` cohort is the jobs submitted since the start of the current
    epoch-aligned interval, converted to workload time."""

    def __init__(self, queue: JobQueue, sender: GraphiteSender | None, prefix: str, compression: float, t0: float,
                 interval_s: float, every_s: float, clock=time.time):
        _check_positive(interval_s=interval_s, every_s=every_s)
        _check_clock(t0, compression)
        self.queue = queue
        self.reporter = QueueReporter(sender, prefix) if sender is not None else None
        self.compression, self.t0 = float(compression), float(t0)
        self.interval_s, self.every_s, self.clock = float(interval_s), float(every_s), clock
        self.published = 0
        self.requeued = 0
        self.last: QueueCounters | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def publish_once(self, now: float | None = None) -> QueueCounters:
        now = self.clock() if now is None else now
        clock_now = (now - self.t0) * self.compression
        self.requeued += self.queue.requeue_expired(now, clock_now)
        c = self.queue.counters(clock_now, interval_start_clock(now, self.interval_s, self.t0, self.compression))
        if self.reporter is not None:
            self.reporter.report(**asdict(c), ts=now)
        self.published += 1
        self.last = c
        return c

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                self.publish_once()
            except Exception:  # a locked or briefly missing DB must not end the metrics
                log.exception("queue publisher: publish failed; retrying next tick")
            now = self.clock()
            self._stop.wait((math.floor(now / self.every_s) + 1) * self.every_s - now)

    def start(self) -> "QueuePublisher":
        self._thread = threading.Thread(target=self.run, name="testbed-queue-publisher", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
