"""Testbed workers (real processes, SIGKILL/SIGTERM), the time-compressed driver and the queue
publisher (samm/testbed/worker.py, driver.py)."""
from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from fixtures_graphite import wait_for_points
from samm.monitor.graphite_client import GraphiteSender, RenderClient
from samm.testbed.driver import Driver, QueuePublisher, interval_start_clock
from samm.testbed.jobqueue import JobQueue
from samm.testbed.worker import run_worker
from sim_bridge.workloads import Workload

ROOT = Path(__file__).resolve().parents[1]


def wait_until(pred, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


class InThreadWorker:
    """`run_worker` in a thread of the test process, stopped on exit."""

    def __init__(self, path, instance, cores, compression, t0, **kw):
        self.stop = threading.Event()
        self.reports: list[tuple[float, float, int]] = []
        self.stats = None
        kw.setdefault("poll_s", 0.02)

        def target():
            self.stats = run_worker(str(path), "g", instance, cores, compression, t0, stop=self.stop,
                                    on_report=lambda *r: self.reports.append(r), **kw)

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()

    def close(self):
        self.stop.set()
        self.thread.join(10)
        assert not self.thread.is_alive()


def spawn_worker(path, instance, cores, compression, t0, lease_s=5.0) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "samm.testbed.worker", "--queue", str(path), "--group", "g", "--instance", instance,
         "--cores", str(cores), "--compression", str(compression), "--t0", repr(t0), "--lease-s", str(lease_s),
         "--poll-s", "0.02", "--report-every", "0.5"],
        cwd=ROOT, stderr=subprocess.PIPE, text=True)


@pytest.fixture
def procs():
    """Worker processes a test started, killed after it (a stopped one is continued first)."""
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.kill()
        p.wait(10)


def test_sigkilled_worker_job_is_released_and_finished_elsewhere(tmp_path, procs):
    path = tmp_path / "q.db"
    q = JobQueue(path)
    t0, comp = time.time(), 20.0
    q.set_clock(t0, comp)
    q.submit(0, 1, runtime_s=40.0, submitted_at=0.0)  # 2 s of wall work
    a = spawn_worker(path, "A", 2, comp, t0)
    procs.append(a)
    wait_until(lambda: q.held("A"), 20, "worker A to lease the job")
    a.send_signal(signal.SIGKILL)  # mid-job: it needs 2 s, it had a few ms
    a.wait(5)
    assert not q.all_done() and q.counters(0.0, 0.0).running == 1  # nobody knows yet
    assert q.release_worker("A") == 1  # what the reconciler does when it kills an instance
    assert q.counters(0.0, 0.0).waiting == 1
    b = InThreadWorker(path, "B", 2, comp, t0)
    try:
        wait_until(lambda: q.all_done(expected=1), 10, "worker B to finish the job")
    finally:
        b.close()
    (r,) = q.stats()
    assert (r.completed_by, r.attempts, r.requeues) == ("B", 2, 1)
    assert [(x.worker_id, x.outcome) for x in q.runs()] == [("A", "requeued"), ("B", "done")]
    assert b.stats.completed_ids == [0]


def test_silent_worker_lease_expires_and_job_runs_again(tmp_path, procs):
    path = tmp_path / "q.db"
    q = JobQueue(path)
    t0, comp = time.time(), 20.0
    q.set_clock(t0, comp)
    q.submit_many([(0, 1, 10.0, 0.0), (1, 1, 10.0, 0.0)])
    a = spawn_worker(path, "A", 2, comp, t0, lease_s=0.6)
    procs.append(a)
    wait_until(lambda: len(q.held("A")) == 2, 20, "worker A to lease both jobs")
    a.send_signal(signal.SIGKILL)
    a.wait(5)
    killed_at = (time.time() - t0) * comp
    # nobody calls release_worker: B's own lease calls re-queue the expired leases
    b = InThreadWorker(path, "B", 2, comp, t0, lease_s=0.6)
    try:
        wait_until(lambda: q.all_done(expected=2), 10, "the expired jobs to finish on B")
    finally:
        b.close()
    recs = q.stats()
    assert all(r.completed_by == "B" and r.requeues == 1 and r.attempts == 2 for r in recs)
    lost = {x.job_id: x for x in q.runs() if x.worker_id == "A"}
    for r in recs:
        # A's run ends when its lease expired (at most one lease after the kill); from then on the
        # job counts as waiting again, until B started it
        assert killed_at - 0.6 * comp <= lost[r.id].ended_at <= killed_at + 0.6 * comp + 1.0
        assert lost[r.id].outcome == "requeued"
        assert r.wait_s == pytest.approx(r.first_started_at - r.submitted_at + r.started_at - lost[r.id].ended_at)


def test_sigterm_stops_cleanly_and_hands_jobs_back(tmp_path, procs):
    path = tmp_path / "q.db"
    q = JobQueue(path)
    t0, comp = time.time(), 1.0
    q.submit(0, 2, runtime_s=600.0, submitted_at=0.0)
    a = spawn_worker(path, "A", 2, comp, t0, lease_s=600.0)
    procs.append(a)
    wait_until(lambda: q.held("A"), 20, "worker A to lease the job")
    a.send_signal(signal.SIGTERM)
    assert a.wait(5) == 0
    assert q.held("A") == {} and q.counters(0.0, 0.0).waiting == 1  # back at once, not after 600 s


def test_worker_cli_refuses_bad_input(tmp_path):
    r = subprocess.run([sys.executable, "-m", "samm.testbed.worker", "--queue", str(tmp_path / "q.db"), "--group", "g",
                        "--instance", "i", "--cores", "0", "--compression", "10", "--t0", "0"],
                       cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "cores must be >= 1" in r.stderr


def test_reported_cpu_is_the_share_of_cores_held_and_ram_the_jobs_ram(tmp_path):
    path = tmp_path / "q.db"
    q = JobQueue(path)
    t0, comp = time.time(), 10.0
    q.submit(0, 1, runtime_s=30.0, submitted_at=0.0, ram_gb=1.5)  # 3 s wall on 1 of 2 cores
    w = InThreadWorker(path, "A", 2, comp, t0, report_every=0.5, duty=0.01)
    try:
        wait_until(lambda: q.all_done(), 10, "the job to finish")
        n = len(w.reports)
        wait_until(lambda: len(w.reports) >= n + 2, 5, "idle reports")
    finally:
        w.close()
    cpus = [c for c, _, _ in w.reports]
    busy = [c for c, r, _ in w.reports if r == 1.5]
    assert len(busy) >= 4
    # full periods inside the job read 50 %; the edges fall between 0 and 50
    assert sum(1 for c in busy if abs(c - 50.0) < 3) >= 3
    assert all(0 <= c <= 50.5 for c in cpus)
    assert cpus[-1] == 0.0 and w.reports[-1][1] == 0.0  # idle workers still report
    assert w.stats.burn_s > 0  # real CPU work was done for the held core


def _synthetic(n=20, span_s=40.0, runtime_s=4.0) -> Workload:
    arrivals = np.linspace(0.0, span_s, n)
    cores = np.array([1, 2, 1, 4] * (n // 4), dtype=np.int32)
    return Workload("synthetic", arrivals, np.full(n, runtime_s * 4400.0), cores, np.full(n, 0.5))


class RecordingQueue(JobQueue):
    """The real queue, remembering when (wall) each job was handed to it."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.submitted_wall: dict[int, float] = {}

    def submit_many(self, jobs):
        jobs = list(jobs)
        now = time.time()
        for j in jobs:
            self.submitted_wall[j[0]] = now
        return super().submit_many(jobs)


def test_driver_workers_and_publisher_run_a_compressed_workload_exactly_once(tmp_path):
    path = tmp_path / "q.db"
    q = RecordingQueue(path)
    wl = _synthetic()  # 20 jobs over 40 workload s = 2 s wall at 20x
    comp = 20.0
    t0 = time.time() + 0.3
    driver = Driver(q, wl, comp, t0)
    pub_q = JobQueue(path)
    pub = QueuePublisher(pub_q, None, "p", comp, t0, interval_s=0.5, every_s=0.1)
    workers = [InThreadWorker(path, name, c, comp, t0, report_every=0.25) for name, c in (("S", 2), ("M", 4), ("L", 8))]
    try:
        driver.start()
        pub.start()
        assert driver.join(10)
        wait_until(lambda: q.all_done(expected=20), 15, "every job to finish")
        wait_until(lambda: pub.last is not None and pub.last.completed_total == 20, 5, "the publisher to see the end")
    finally:
        pub.stop()
        driver.stop()
        for w in workers:
            w.close()
    # driver timing: every job at t0 + arrival / compression (never early, late by little)
    for i, a in enumerate(wl.arrival_s):
        due = t0 + a / comp
        assert due - 0.005 <= q.submitted_wall[i] <= due + 0.5, (i, q.submitted_wall[i] - due)
    recs = q.stats()
    assert [r.submitted_at for r in recs] == pytest.approx(list(wl.arrival_s))  # nominal times kept
    assert all(r.state == "done" and r.attempts == 1 for r in recs)
    done_by = [i for w in workers for i in w.stats.completed_ids]
    assert sorted(done_by) == list(range(20))  # exactly once across workers
    assert all(r.finished_at - r.started_at == pytest.approx(4.0, abs=1e-6) for r in recs)
    assert {r.completed_by for r in recs if r.cores == 4} <= {"M", "L"}
    assert pub.published >= 10 and pub.last.waiting == 0 and pub.last.running == 0
    q.close()
    pub_q.close()


def test_interval_start_is_epoch_aligned_in_wall_time_then_scaled():
    # interval 2 s wall, t0 = 1001: at wall 1006.5 the interval began at 1006 -> workload (1006-1001)*30
    assert interval_start_clock(1006.5, 2.0, 1001.0, 30.0) == pytest.approx(150.0)
    assert interval_start_clock(1005.99, 2.0, 1001.0, 30.0) == pytest.approx(90.0)


def test_waiting_this_interval_counts_only_the_current_cohort(tmp_path):
    q = JobQueue(tmp_path / "q.db")
    t0, comp = 1001.0, 30.0
    q.submit_many([(0, 1, 5.0, 100.0), (1, 1, 5.0, 155.0), (2, 1, 5.0, 160.0)])
    pub = QueuePublisher(q, None, "p", comp, t0, interval_s=2.0, every_s=1.0)
    c = pub.publish_once(now=1006.5)  # interval began at wall 1006 = workload 150; now = 165
    assert (c.submitted_total, c.waiting, c.waiting_submitted_this_minute) == (3, 3, 2)
    q.lease("w", 1, 1006.6, 5.0, 168.0)  # job 0 (the head) leaves the queue: not this cohort
    assert pub.publish_once(now=1006.7).waiting_submitted_this_minute == 2
    q.lease("w", 1, 1006.8, 5.0, 174.0)  # job 1 does
    c = pub.publish_once(now=1006.9)
    assert (c.waiting, c.running, c.waiting_submitted_this_minute) == (1, 2, 1)
    assert pub.publish_once(now=1008.1).waiting_submitted_this_minute == 0  # a new interval: a new cohort
    q.close()


@pytest.mark.graphite
def test_worker_and_publisher_series_reach_graphite(tmp_path, graphite, graphite_prefix):
    path = tmp_path / "q.db"
    q = JobQueue(path)
    t0, comp = time.time(), 10.0
    q.submit(0, 1, runtime_s=20.0, submitted_at=0.0, ram_gb=0.5)
    sender = GraphiteSender(graphite.carbon_host, graphite.carbon_port)
    pub = QueuePublisher(JobQueue(path), sender, graphite_prefix, comp, t0, interval_s=1.0, every_s=0.5).start()
    w = InThreadWorker(path, "i-1", 2, comp, t0, graphite=f"{graphite.carbon_host}:{graphite.carbon_port}",
                       prefix=graphite_prefix, report_every=0.5)
    try:
        start = int(t0) - 1
        client = RenderClient(graphite.render_url)

        def series():
            got = {s.target.rsplit(".", 1)[-1]: s.values()
                   for s in client.render(f"{graphite_prefix}.groups.g.instances.i-1.*", start, "now")}
            return got if any(v > 0 for v, _ in got.get("cpu_percent", [])) and got.get("up") else None

        got = wait_until(series, 15, "a busy cpu_percent point in Graphite")
        assert all(v == 1 for v, _ in got["up"])
        assert any(v == 0.5 for v, _ in got["ram_used_gb"])
        wait_for_points(graphite.render_url, f"{graphite_prefix}.queue.*", start, "now", expect_series=5)
    finally:
        w.close()
        pub.stop()
        q.close()
