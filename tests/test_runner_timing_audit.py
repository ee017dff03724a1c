"""Regressions from an audit of the daemon runner's timing (samm/daemon/runner.py) with the
deferrable-jobs loop it runs (agents/deferrable_jobs/daemon_loop.py): iterations phased from
`timing.slot_zero_unix`, and the systemd watchdog after a standby's wait. Real SQLite knowledge
stores and job queues, a real APScheduler and a real sd_notify socket."""
from __future__ import annotations

import socket
import threading
import time
from datetime import timezone

import pytest

from samm.config import SammConfig
from samm.daemon.build import build_daemon
from samm.daemon.leadership import Leadership
from samm.daemon.runner import DaemonRunner
from samm.knowledge.store import KnowledgeStore
from samm.localproc import free_port
from samm.testbed.jobqueue import JobQueue


def deferrable_config(tmp_path, **timing) -> SammConfig:
    return SammConfig.model_validate({
        "loops": [{"name": "batch", "problem": "deferrable-jobs", "queue": {"path": str(tmp_path / "q.sqlite")},
                   "capacity": {"kind": "fixed", "cores": 8}, "agent": {"name": "fifo"}, "timing": timing}],
        "knowledge": {"url": f"sqlite:///{tmp_path}/k.db"},
        "graphite": {"publish": False, "render_url": f"http://127.0.0.1:{free_port()}", "lateness_s": 0}})


def run_in_thread(runner: DaemonRunner) -> tuple[threading.Thread, list]:
    rc: list = []
    t = threading.Thread(target=lambda: rc.append(runner.run(install_signals=False)))
    t.start()
    return t, rc


# --- the first iteration of a slot loop --------------------------------------------------------

def test_the_shipped_15_minute_slot_is_phased_from_slot_zero_not_the_epoch(tmp_path):
    """slot_zero_unix 450 with 900 s slots: the first iteration came 450 s into a slot (at an
    epoch multiple of 900), and every later one with it."""
    d = build_daemon(deferrable_config(tmp_path, interval_s=900, slot_zero_unix=1_700_000_450.0))
    try:
        runner = DaemonRunner(d)
        lp = d.loops[0].config
        first = runner._first_run(lp).astimezone(timezone.utc).timestamp()
        phase = min(0.1 * 900, 2.0)                         # lateness_s 0
        assert time.time() < first <= time.time() + 900
        assert abs((first - 1_700_000_450.0 - phase) % 900) < 1e-3      # just after a slot boundary
    finally:
        d.close()


def test_the_first_slot_is_decided_at_its_start_when_slot_zero_is_off_the_epoch_grid(tmp_path):
    """A real run: 4 s slots from slot_zero_unix 2 (boundaries at 4k + 2). The iteration ran at
    4k + 0.4, 2.4 s into its slot, instead of 0.4 s after the boundary."""
    every, zero = 4.0, 2.0
    with JobQueue(tmp_path / "q.sqlite") as q:
        q.submit_deferrable([(1, 2, 1, 0, 10**9, 0, 1.0, 0.0)])
    runner = DaemonRunner(build_daemon(deferrable_config(tmp_path, interval_s=every, slot_zero_unix=zero)),
                          max_iterations=1)
    seen = []
    runner.on_iteration = lambda rep: seen.append((time.time(), rep.key))
    t, rc = run_in_thread(runner)
    t.join(20)
    runner.stop_event.set()
    t.join(10)
    assert rc == [0] and len(seen) == 1
    when, key = seen[0]
    into_slot = (when - zero) % every
    assert into_slot < 1.5, f"decided {into_slot:.2f} s into its slot"
    assert key == f"slot{int((when - zero) // every)}"


# --- the watchdog after a standby's wait -------------------------------------------------------

def test_a_standby_taking_over_keeps_pinging_the_watchdog_until_its_first_slot(tmp_path, monkeypatch):
    """A daemon whose loops were built long before it led (an ha standby's wait, a slow
    recovery) counted that wait as a stuck loop: no WATCHDOG=1 from taking over until its first
    iteration, which a slot loop runs only at the next boundary (up to a whole slot later),
    while systemd's WatchdogSec ran out, and the log said the loop was stuck."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify"))
    sock.settimeout(0.1)
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify"))
    monkeypatch.setenv("WATCHDOG_USEC", "400000")            # a ping every 0.2 s
    every = 60.0
    zero = time.time() + every / 2                            # the next slot boundary is ~30 s away
    runner = DaemonRunner(build_daemon(deferrable_config(tmp_path, interval_s=every, slot_zero_unix=zero)))
    for loop in runner.loops:
        loop.last_progress -= 3600.0                          # built an hour ago: the standby's wait
    got, rc = _notifications_for(runner, sock, 2.0)
    assert rc == [0] and not runner.reports              # no iteration ran meanwhile
    assert b"READY=1" in got and got.count(b"WATCHDOG=1") >= 3, got


# --- memory of a long-running daemon -----------------------------------------------------------

def test_a_long_running_daemon_keeps_a_bounded_window_of_reports(tmp_path, monkeypatch):
    """Every iteration's report was kept for the daemon's lifetime (a 1 s loop: 86,400 a day,
    each with its features, plan and inventory), and each iteration scanned them all to count
    its loop's: memory and time grew without bound. The count goes on past the window."""
    import samm.daemon.runner as runner_mod

    monkeypatch.setattr(runner_mod, "REPORTS_KEPT", 5)
    cfg = SammConfig.model_validate({
        "groups": [{"name": "S", "cores": 2, "ram_gb": 8, "price_per_hour": 0.2, "min": 1, "max": 10}],
        "agent": {"name": "static:1"}, "executor": {"kind": "sim"},
        "timing": {"interval_s": 0.1, "warmup_s": 0, "cooldown_s": 0}, "simulation": {"seed": 1},
        "knowledge": {"url": f"sqlite:///{tmp_path}/k.db"}})
    runner = DaemonRunner(build_daemon(cfg), max_iterations=12)
    assert runner.run(install_signals=False) == 0
    assert runner.iterations == {"default": 12}                 # max_iterations still counts every one
    assert len(runner.reports) == 5                              # the newest five
    with KnowledgeStore(f"sqlite:///{tmp_path}/k.db") as store:  # the store keeps every decision
        assert store.counts()["decisions"] == 12
        assert [r.key for r in runner.reports] == [d.iteration_key for d in store.decisions()][-5:]


# --- the wall clock stepping forward over a run time ---------------------------------------------

@pytest.mark.parametrize("step_s, sleep_s, then", [
    (2.5, 2.0, 1),      # an NTP step just before a boundary: that slot, late, not the one after
    (40.0, 1.0, 10),    # a host suspended for ten slots: the current slot once, no burst of the missed ones
])
def test_a_slot_the_clock_stepped_forward_over_is_still_decided(tmp_path, monkeypatch, step_s, sleep_s, then):
    """The clock stepped forward (an NTP step, a VM paused or suspended) over a slot boundary:
    the runner rescheduled the loop to the boundary after, so the slot under way was never
    decided and its due jobs were dropped unguarded. The scheduler alone would have run it
    late, within its misfire grace; the runner now does the same (one run, no burst)."""
    import datetime as dt
    import types

    import apscheduler.executors.base as apsexec
    import apscheduler.schedulers.base as apsbase

    import samm.daemon.runner as runner_mod

    ahead = [0.0]

    class SteppedDatetime(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return dt.datetime.now(tz) + dt.timedelta(seconds=ahead[0])

    def wall() -> float:
        return time.time() + ahead[0]

    monkeypatch.setattr(apsbase, "datetime", SteppedDatetime)   # the scheduler's clock and its
    monkeypatch.setattr(apsexec, "datetime", SteppedDatetime)   # executor's misfire check
    monkeypatch.setattr(runner_mod, "time", types.SimpleNamespace(time=wall, monotonic=time.monotonic,
                                                                  sleep=time.sleep))
    every = 4.0
    runner = DaemonRunner(build_daemon(deferrable_config(tmp_path, interval_s=every)), max_iterations=3)
    runner.loops[0].clock = wall

    def step_forward_before_the_next_boundary(rep):
        if len(runner.reports) == 1:
            time.sleep(sleep_s)
            ahead[0] = step_s                       # past a run time by 0.1 s, or by 1.1 s ten slots on

    runner.on_iteration = step_forward_before_the_next_boundary
    t, rc = run_in_thread(runner)
    t.join(30)
    runner.stop_event.set()
    t.join(10)
    slots = [int(r.key[len("slot"):]) for r in runner.reports]
    assert rc == [0] and slots == [slots[0], slots[0] + then, slots[0] + then + 1], slots


# --- an iteration longer than its interval -----------------------------------------------------

def test_an_iteration_overrunning_its_interval_is_logged_as_a_skipped_run_naming_the_loop(tmp_path, caplog):
    """An overrun skips the run times it covers (never two iterations of a loop at once; for a
    slot loop, a slot), but the runner said nothing of it: it listened only for "missed" run
    times, which it described as an overrun, and which a stall of the process causes instead."""
    import logging

    cfg = SammConfig.model_validate({
        "groups": [{"name": "S", "cores": 2, "ram_gb": 8, "price_per_hour": 0.2, "min": 1, "max": 10}],
        "agent": {"name": "static:1"}, "executor": {"kind": "sim"},
        "timing": {"interval_s": 0.2, "warmup_s": 0, "cooldown_s": 0}, "simulation": {"seed": 1},
        "knowledge": {"url": f"sqlite:///{tmp_path}/k.db"}})
    runner = DaemonRunner(build_daemon(cfg), max_iterations=2)
    loop = runner.loops[0]
    run_once = loop.run_once

    def slow_first():
        if not runner.reports:
            time.sleep(1.0)                         # five intervals
        return run_once()

    loop.run_once = slow_first
    with caplog.at_level(logging.WARNING, logger="samm.daemon.runner"):
        assert runner.run(install_signals=False) == 0
    said = [r.getMessage() for r in caplog.records if r.name == "samm.daemon.runner"]
    assert any("mape-k-default" in m and "overran" in m for m in said), said
    assert runner.iterations == {"default": 2}


# --- a standby under systemd's watchdog --------------------------------------------------------

@pytest.mark.postgres
def test_a_standby_with_a_long_lease_pings_the_watchdog_as_often_as_systemd_wants(pg_url, tmp_path, monkeypatch):
    """The standby pinged once per poll, every ttl/3: `ha.lease_ttl_s: 600` under WatchdogSec=180
    (the shipped unit) meant a ping every 200 s, so systemd killed the healthy standby every
    180 s, and after five restarts in ten minutes gave up on the unit."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify"))
    sock.settimeout(0.1)
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify"))
    monkeypatch.setenv("WATCHDOG_USEC", "400000")            # systemd wants a ping every 0.4 s at most
    with KnowledgeStore(pg_url) as store:
        assert Leadership(store, 60.0, ha=True, holder="leader-host:1").try_acquire()  # leads on
    cfg = SammConfig.model_validate({
        "groups": [{"name": "S", "cores": 2, "ram_gb": 8, "price_per_hour": 0.2, "min": 1, "max": 10}],
        "agent": {"name": "static:1"}, "executor": {"kind": "sim"},
        "timing": {"interval_s": 0.5, "warmup_s": 0, "cooldown_s": 0}, "simulation": {"seed": 1},
        "knowledge": {"url": pg_url}, "ha": {"enabled": True, "lease_ttl_s": 6.0}})   # polls every 2 s
    runner = DaemonRunner(build_daemon(cfg))
    got, rc = _notifications_for(runner, sock, 2.5)
    assert rc == [0] and not runner.reports                  # a standby throughout
    assert b"READY=1" in got and got.count(b"WATCHDOG=1") >= 4, got


# --- a start or a takeover inside a slot -------------------------------------------------------

def test_a_slot_undecided_when_the_daemon_starts_is_decided_at_once(tmp_path):
    """A daemon (re)started, or a standby taking over, inside a slot nobody decided: the first
    iteration came only at the next boundary, which dropped the jobs due in that slot without
    the agent or the deadline guard ever seeing them."""
    every = 60.0
    zero = time.time() - 5.0                                  # slot 0 began 5 s ago; slot 1 is 55 s away
    with JobQueue(tmp_path / "q.sqlite") as q:
        q.submit_deferrable([(1, 4, 1, 0, 0, 0, 1.0, 0.0),     # must start in slot 0
                             (2, 2, 1, 0, 5, 0, 1.0, 0.0)])
    runner = DaemonRunner(build_daemon(deferrable_config(tmp_path, interval_s=every, slot_zero_unix=zero)))
    t, rc = run_in_thread(runner)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not runner.lease_done.is_set():
            with KnowledgeStore(f"sqlite:///{tmp_path}/k.db") as store:
                if store.decision("slot0", loop="batch") is not None:
                    break
            time.sleep(0.1)
    finally:
        runner.stop_event.set()
        t.join(15)
    assert rc == [0] and not runner.reports                    # decided by the start-up, not an iteration
    with KnowledgeStore(f"sqlite:///{tmp_path}/k.db") as store:
        assert [d.iteration_key for d in store.decisions(loop="batch")] == ["slot0"]
    with JobQueue(tmp_path / "q.sqlite") as q:
        assert {j.id: j.released for j in q.deferrable_jobs()} == {1: 0, 2: 0}


# --- the daemon's own publication ------------------------------------------------------------

@pytest.mark.graphite
def test_a_per_type_decision_is_published_as_its_group_deltas_not_as_no_decision(graphite, graphite_prefix):
    """A per-type agent (threshold, queue, target tracking) answers one change per group: its
    `decision.action` read -1, which docs/metric-naming.md defines as "no decision", and nothing
    published said what it decided."""
    from samm.daemon.loop import IterationReport
    from samm.daemon.publish import GraphitePublisher
    from samm.monitor.graphite_client import GraphiteSender, RenderClient
    from samm.plan.client import PlanOutcome

    now = int(time.time())
    rep = IterationReport(key="k", window_start=now - 60, window_end=now, status="ok", reasons=[],
                          plan=PlanOutcome(deltas={"S": 2, "M": 0, "L": -1}, action=[2, 0, -1], action_name="S+2 L-1"),
                          inventory={"S": {"desired": 1, "live": 1}}, iteration_ms=5.0)
    sender = GraphiteSender(graphite.carbon_host, graphite.carbon_port)
    try:
        GraphitePublisher(sender, None, graphite_prefix).publish(rep)
    finally:
        sender.close()
    render = RenderClient(graphite.render_url)
    want = {f"{graphite_prefix}.daemon.groups.{g}.delta": v for g, v in {"S": 2.0, "M": 0.0, "L": -1.0}.items()}
    got: dict = {}
    deadline = time.monotonic() + 30
    while len(got) < len(want) and time.monotonic() < deadline:
        for s in render.render(f"{graphite_prefix}.daemon.groups.*.delta", now - 600, now + 60):
            vals = [v for v, _ in s.values() if v == v]
            if vals:
                got[s.target] = vals[-1]
        time.sleep(0.3)                             # new whisper files take about a second to appear
    assert got == want


def _notifications_for(runner, sock, seconds: float) -> tuple[list[bytes], list]:
    """What the runner sent to systemd's notify socket in its first `seconds`, then stopped."""
    t, rc = run_in_thread(runner)
    got: list[bytes] = []
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                got.append(sock.recv(4096))
            except TimeoutError:
                pass
    finally:
        runner.stop_event.set()
        t.join(15)
        sock.close()
    return got, rc
