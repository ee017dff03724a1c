"""Regressions for the daemon's high availability under systemd (samm/daemon/runner.py) and the
emulated cloud's job queue, workers and reconciler (samm/testbed/worker.py, reconciler.py):
the watchdog through a standby's wait and the start-up recovery, a worker stalled past its job
lease, a worker that cannot start. Real SQLite and PostgreSQL stores, a real sd_notify socket,
real worker processes, moto's ASGs."""
from __future__ import annotations

import logging
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from samm.config import SammConfig
from samm.daemon.build import build_daemon
from samm.daemon.leadership import Leadership
from samm.daemon.runner import DaemonRunner
from samm.knowledge.store import KnowledgeStore
from samm.testbed.jobqueue import JobQueue
from test_runner_timing_audit import _notifications_for
from test_testbed_worker import procs, spawn_worker, wait_until  # noqa: F401  (procs: a fixture)

GROUPS = [{"name": "S", "cores": 2, "ram_gb": 8, "price_per_hour": 0.2, "min": 1, "max": 10}]


def _config(url, interval_s=0.5, **ha) -> SammConfig:
    return SammConfig.model_validate({
        "groups": GROUPS, "agent": {"name": "static:1"}, "executor": {"kind": "sim"},
        "timing": {"interval_s": interval_s, "warmup_s": 0, "cooldown_s": 0}, "simulation": {"seed": 1},
        "knowledge": {"url": url}, **({"ha": ha} if ha else {})})


@pytest.fixture
def notify(tmp_path, monkeypatch):
    """systemd's notify socket, with a watchdog that wants a ping every 0.2 s (WatchdogSec 0.4 s)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify"))
    sock.settimeout(0.1)
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify"))
    monkeypatch.setenv("WATCHDOG_USEC", "400000")
    yield sock
    sock.close()


def _slow_recovery(runner: DaemonRunner, seconds: float) -> list[float]:
    """Each loop's start-up recovery takes `seconds` (an executor's retries, a slow store);
    returns the wall times it ran between."""
    spans: list[float] = []
    for loop in runner.loops:
        recover = loop.recover

        def slow(recover=recover):
            spans.append(time.time())
            time.sleep(seconds)
            out = recover()
            spans.append(time.time())
            return out

        loop.recover = slow
    return spans


# --- 1. the watchdog through the start-up -------------------------------------------------------

def test_a_recovery_longer_than_watchdogsec_keeps_pinging_systemd(tmp_path, notify):
    """The watchdog thread started only once the loops were scheduled: a start-up recovery
    longer than WatchdogSec (here 2 s against 0.4 s) sent no WATCHDOG=1, and systemd killed
    the healthy daemon mid-recovery."""
    runner = DaemonRunner(build_daemon(_config(f"sqlite:///{tmp_path}/k.db")), max_iterations=1000)
    spans = _slow_recovery(runner, 2.5)
    got, rc = _notifications_for(runner, notify, 1.8)
    assert rc == [0] and spans
    assert b"READY=1" not in got                          # still recovering throughout
    assert got.count(b"WATCHDOG=1") >= 5, got


def test_a_start_up_that_makes_no_progress_stops_pinging(tmp_path):
    """The pings through the start-up are bounded as a loop's are: two intervals (or standby
    polls) plus 30 s without progress is a stuck start-up, which systemd should restart."""
    runner = DaemonRunner(build_daemon(_config(f"sqlite:///{tmp_path}/k.db")))
    try:
        assert runner._stuck() == []
        runner._startup_progress -= 2 * 0.5 + 30.0
        (what, age), = runner._stuck()
        assert "start-up" in what and age >= 31.0
    finally:
        runner.daemon.close()


@pytest.mark.postgres
def test_a_standby_taking_over_keeps_pinging_through_its_recovery(pg_url, notify):
    """A standby pinged between its polls, then took the lease and recovered for as long as it
    took without a single ping: a slow recovery got the new leader killed by systemd right
    after a failover."""
    runner = DaemonRunner(build_daemon(_config(pg_url, enabled=True, lease_ttl_s=0.6)), max_iterations=1000)
    spans = _slow_recovery(runner, 3.0)
    with KnowledgeStore(pg_url) as store:
        assert Leadership(store, 1.0, ha=True, holder="dying-host:1").try_acquire()  # never renewed
    got, rc = _notifications_for(runner, notify, 3.5)
    assert rc == [0] and spans, "the standby never took over"
    # the standby's own wait is ~1 s (5 pings); the rest of the 3.5 s is the recovery
    assert got.count(b"WATCHDOG=1") >= 12, got
    # `systemctl status` no longer says "standby" once it leads (it did until the first iteration)
    said = [m for m in got if m.startswith(b"STATUS=")]
    assert said[0].startswith(b"STATUS=standby") and said[-1].startswith(b"STATUS=leading"), said


@pytest.mark.postgres
def test_a_standby_poll_blocked_on_the_lease_row_keeps_pinging(pg_url, notify):
    """The standby pinged only between polls: a poll waiting on the lease row (the leader's
    renewal transaction held by a slow database) sent nothing for as long as it waited."""
    from sqlalchemy import create_engine, text

    with KnowledgeStore(pg_url) as store:
        assert Leadership(store, 60.0, ha=True, holder="leader-host:1").try_acquire()
    runner = DaemonRunner(build_daemon(_config(pg_url, enabled=True, lease_ttl_s=0.6)))  # polls every 0.2 s
    engine = create_engine(pg_url)
    locked = threading.Event()

    def hold_the_lease_row():
        with engine.connect() as c:
            time.sleep(0.3)
            c.execute(text("SELECT 1 FROM leases WHERE name = 'daemon' FOR UPDATE"))
            locked.set()
            time.sleep(3.0)
            c.rollback()

    holder = threading.Thread(target=hold_the_lease_row)
    holder.start()
    try:
        got, rc = _notifications_for(runner, notify, 3.2)
    finally:
        holder.join(10)
        engine.dispose()
    assert locked.is_set() and rc == [0] and not runner.reports
    assert got.count(b"WATCHDOG=1") >= 10, got


# --- 2. a worker stalled past its job lease ---------------------------------------------------

def test_a_worker_stalled_past_its_lease_renews_its_job_instead_of_running_it_again(tmp_path, procs):
    """A worker paused (SIGSTOP, a host stall) for longer than its job's lease leased work first
    on waking: the lease call re-queued every expired lease, its own running job included, and
    handed that job straight back to it, which started it again from zero (attempt 2), or to
    another worker while this one still ran it. Nobody else re-queued it: the lease is renewed."""
    path = tmp_path / "q.db"
    q = JobQueue(path)
    t0 = time.time()
    q.set_clock(t0, 1.0)
    q.submit(0, 1, runtime_s=4.0, submitted_at=0.0)
    w = spawn_worker(path, "w-stalled", cores=2, compression=1.0, t0=t0, lease_s=1.0)
    procs.append(w)
    try:
        wait_until(lambda: q.counters(0, 0).running == 1, 20, "the worker to lease the job")
        time.sleep(0.3)
        w.send_signal(signal.SIGSTOP)
        time.sleep(2.0)                                   # twice the lease: it expired meanwhile
        w.send_signal(signal.SIGCONT)
        wait_until(lambda: q.all_done(), 20, "the job to finish")
        job = q.stats()[0]
        runs = q.runs()
    finally:
        q.close()
    assert (job.attempts, job.requeues, job.completed_by) == (1, 0, "w-stalled"), job
    assert [(r.attempt, r.outcome) for r in runs] == [(1, "done")], runs
    assert job.finished_at - job.first_started_at >= 4.0 - 0.05     # it ran its whole runtime once


def test_a_worker_whose_job_was_re_queued_while_it_stalled_drops_it_and_another_finishes_it(tmp_path, procs):
    """The other side of the lease: a stalled worker whose job another process re-queued (the
    driver's expiry sweep) must stop it on waking, before doing anything else: the job then runs
    once on the other worker, and never on two at the same time."""
    path = tmp_path / "q.db"
    q = JobQueue(path)
    t0 = time.time()
    q.set_clock(t0, 1.0)
    q.submit(0, 1, runtime_s=3.0, submitted_at=0.0)
    a = spawn_worker(path, "w-a", cores=2, compression=1.0, t0=t0, lease_s=1.0)
    procs.append(a)
    try:
        wait_until(lambda: q.counters(0, 0).running == 1, 20, "the first worker to lease the job")
        a.send_signal(signal.SIGSTOP)
        time.sleep(1.5)
        assert q.requeue_expired(time.time()) == 1       # the driver's sweep: the lease is lost
        b = spawn_worker(path, "w-b", cores=2, compression=1.0, t0=t0, lease_s=1.0)
        procs.append(b)
        wait_until(lambda: q.held("w-b"), 20, "the second worker to lease the job")
        a.send_signal(signal.SIGCONT)
        wait_until(lambda: q.all_done(), 20, "the job to finish")
        time.sleep(0.5)                                   # the first worker's next turns
        job = q.stats()[0]
        runs = q.runs()
    finally:
        q.close()
    assert (job.attempts, job.requeues, job.completed_by) == (2, 1, "w-b"), job
    assert [(r.worker_id, r.outcome) for r in runs] == [("w-a", "requeued"), ("w-b", "done")], runs
    assert runs[0].ended_at <= runs[1].started_at                   # never two at once


# --- 3. the reconciler's restart back-off ------------------------------------------------------

@pytest.fixture(scope="module")
def asg():
    from samm.execute.moto_server import MotoServer, create_paper_asgs

    with MotoServer() as moto:
        moto.reset()
        create_paper_asgs(endpoint_url=moto.endpoint_url, names=("tb-gaps-s",), instance_types=("m5a.large",),
                          min=(1,), max=1, desired=1)
        yield moto.client("autoscaling")


def _reconcile(asg, spawn, seconds: float, **kw):
    from samm.testbed.reconciler import Reconciler

    rec = Reconciler(asg, {"tb-gaps-s": ("S", 2)}, spawn, compression=1e4, poll_s=0.05, **kw)
    rec.start()
    try:
        time.sleep(seconds)
    finally:
        rec.stop()
    return rec


def test_a_worker_that_exits_at_start_is_restarted_with_a_bounded_back_off(asg, procs, caplog):
    """A worker that cannot start (a bad queue path: exit 2 at once) was restarted on every
    0.2 s poll for the whole run, a process and a warning each time. Now: at once, then after
    0.2, 0.4, 0.8, 0.8, ... s, one warning per attempt, and never given up."""
    starts: list[float] = []

    def spawn(group, iid, cores):
        starts.append(time.monotonic())
        p = subprocess.Popen([sys.executable, "-c", "raise SystemExit(2)"])
        procs.append(p)
        return p

    with caplog.at_level(logging.WARNING, logger="samm.testbed.reconciler"):
        rec = _reconcile(asg, spawn, 5.0, restart_backoff_s=(0.2, 0.8))
    (vm,) = rec.vms.values()
    assert 4 <= len(starts) <= 12, starts                 # one a poll was dozens
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert max(gaps) <= 0.8 + 2.0, gaps                   # bounded: still retried (a process lives ~0.1 s)
    said = [r.getMessage() for r in caplog.records if "exited with 2" in r.getMessage()]
    assert len(said) == rec.restarts == vm.failures and len(said) in (len(starts), len(starts) - 1), said
    assert any("retrying in 0.8 s" in m for m in said), said


def test_a_spawn_that_keeps_failing_is_retried_with_a_back_off(asg, caplog):
    """`spawn` raising (out of file descriptors, a missing interpreter) was retried on every poll."""
    calls: list[float] = []

    def spawn(group, iid, cores):
        calls.append(time.monotonic())
        raise OSError(24, "Too many open files")

    with caplog.at_level(logging.WARNING, logger="samm.testbed.reconciler"):
        rec = _reconcile(asg, spawn, 3.0, restart_backoff_s=(0.2, 0.8))
    (vm,) = rec.vms.values()
    assert 3 <= len(calls) <= 10 and vm.spawns == 0 and vm.failures == len(calls), calls   # one a poll was dozens
    said = [r.getMessage() for r in caplog.records if "Too many open files" in r.getMessage()]
    assert len(said) == len(calls), said


def test_a_worker_that_ran_healthily_is_restarted_at_once_again(asg, procs):
    """The back-off resets once a worker has run `healthy_s`: a crash after a healthy hour is a
    first failure, restarted at once, not after the longest delay of the last crash loop."""
    from samm.testbed.reconciler import Reconciler

    starts: list[float] = []
    failures_at_start: list[int] = []
    lives = [0.0, 0.0, 0.0, 1.0, 0.0]                      # the fourth runs healthily for 1 s, then crashes

    def spawn(group, iid, cores):
        failures_at_start.append(rec.vms[iid].failures)
        starts.append(time.monotonic())
        life = lives[len(starts) - 1] if len(starts) <= len(lives) else 60.0
        p = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({life})"])
        procs.append(p)
        return p

    rec = Reconciler(asg, {"tb-gaps-s": ("S", 2)}, spawn, compression=1e4, poll_s=0.05,
                     restart_backoff_s=(0.4, 5.0), healthy_s=0.5)
    rec.start()
    try:
        wait_until(lambda: len(starts) >= 6, 20, "six worker starts")
    finally:
        rec.stop()
    assert failures_at_start[:4] == [0, 1, 2, 3], failures_at_start
    assert failures_at_start[4] == 1, failures_at_start   # reset: the healthy run's exit is a first failure
    assert starts[4] - starts[3] < 1.0 + 1.4, starts      # restarted at once, not 0.4 * 2**2 s after it exited
    assert failures_at_start[5] == 2


@pytest.mark.postgres
def test_a_renewal_that_lands_after_the_release_gives_the_lease_back(pg_url):
    """Shutdown releases the lease while a renewal is still under way (its store call stalled, on
    the network say, past the keeper's join). The renewal's write then lands after the release's:
    it used to extend the released lease and lead on it, and a standby waited a whole ttl for a
    daemon that had stopped. The stall is injected in front of the real store call."""
    with KnowledgeStore(pg_url) as store:
        lead = Leadership(store, 30.0, ha=True, holder="stopping-host:1")
        assert lead.try_acquire()
        real_acquire, entered, go_on = store.acquire_lease, threading.Event(), threading.Event()

        def stalled_acquire(*args, **kwargs):
            entered.set()
            go_on.wait(10)
            return real_acquire(*args, **kwargs)

        store.acquire_lease = stalled_acquire
        renewed = []
        renewing = threading.Thread(target=lambda: renewed.append(lead.renew()))
        renewing.start()
        assert entered.wait(10)
        lead.release()                               # the clean stop: the lease ends now
        assert store.lease("daemon").expires_at < time.time()
        go_on.set()                                  # the stalled renewal's write lands after it
        renewing.join(10)
        assert renewed == [False] and not lead.leading
        assert store.lease("daemon").expires_at < time.time()   # given back, not re-extended
