"""Regression tests from an audit of the daemon's lifecycle and its knowledge store: leadership
when two daemons share a holder name, a deposed leader's recovery, a leader stalled inside a
fenced write (PostgreSQL), a store lock outlasting the lease, the wall clock stepping back,
SIGHUP, a deleted SQLite file, text PostgreSQL refuses, a store failing or unreachable at
start, and a database from a newer SAMM."""
import logging
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time

import pytest
import yaml

from samm.config import SammConfig
from samm.daemon.build import build_daemon
from samm.daemon.leadership import Leadership, default_holder, holder_name
from samm.daemon.runner import STORE_FAILED, DaemonRunner, build_daemon_waiting_for_store
from samm.knowledge.store import KnowledgeError, KnowledgeStore, LeaseLost

GROUPS = [{"name": "S", "cores": 2, "ram_gb": 8, "price_per_hour": 0.2, "min": 1, "max": 10},
          {"name": "M", "cores": 4, "ram_gb": 16, "price_per_hour": 0.4, "min": 0, "max": 10},
          {"name": "L", "cores": 8, "ram_gb": 32, "price_per_hour": 0.8, "min": 0, "max": 10}]


def _config(url, interval_s=0.2, **ha) -> SammConfig:
    return SammConfig.model_validate({
        "groups": GROUPS, "agent": {"name": "static:2,1,1"}, "executor": {"kind": "sim"},
        "timing": {"interval_s": interval_s, "warmup_s": 0, "cooldown_s": 0}, "simulation": {"seed": 1},
        "knowledge": {"url": url}, **({"ha": ha} if ha else {})})


# --- leadership: one holder name, two processes ------------------------------------------------

def test_two_daemons_given_one_holder_name_do_not_both_lead(tmp_path):
    """`ha.holder: samm` in a config file copied to two hosts: each daemon renewed the other's
    lease as its own, and both passed the fence with one token (both acted)."""
    url = f"sqlite:///{tmp_path}/k.db"
    with KnowledgeStore(url) as a, KnowledgeStore(url) as b:
        first, second = Leadership(a, 5.0, ha=True, holder="samm"), Leadership(b, 5.0, ha=True, holder="samm")
        assert first.try_acquire()
        assert not second.try_acquire()            # the lease is another process's, whatever its name
        assert first.renew() and first.current.token == 1
        assert not second.try_acquire() and not second.leading  # still not: the first renews it
        assert a.lease("daemon").token == 1
    # the daemon's own names: a configured name carries this process's host:pid
    assert holder_name("samm") == f"samm@{default_holder()}"
    assert len(holder_name("x" * 300)) == 200 and holder_name(None) == default_holder()


def test_a_predecessor_with_our_own_host_and_pid_is_taken_over_with_a_new_token(tmp_path):
    """A container restarted with the same hostname and pid 1 finds its predecessor's lease
    under its own name: taken at once (the predecessor is dead: that pid is us), but with a new
    fencing token, never renewed as if it had been ours."""
    url = f"sqlite:///{tmp_path}/k.db"
    with KnowledgeStore(url) as store:
        store.acquire_lease("daemon", default_holder(), 600.0)
        lead = Leadership(store, 5.0)
        assert lead.try_acquire()
        assert lead.current.token == 2 and store.lease("daemon").holder == default_holder()


def test_a_deposed_leader_does_not_resolve_the_new_leaders_action_in_flight(tmp_path):
    """`recover()` runs before every Execute step: a leader deposed while it planned (a pause)
    found the new leader's claimed action in flight and finished it as failed, unfenced, while
    the new leader's call was under way (whose real outcome was then dropped)."""
    url = f"sqlite:///{tmp_path}/k.db"
    old = build_daemon(_config(url))
    new = KnowledgeStore(url)
    try:
        lead = Leadership(old.store, 0.2, holder="old")
        assert lead.try_acquire()
        time.sleep(0.3)                                    # the old leader's lease lapses
        assert Leadership(new, 5.0, holder="new").try_acquire()
        d, _ = new.record_decision("120", agent="x", action=1, source="agent")
        assert new.begin_action(d, "120:S", "sim", "S", {"target": 2})[1]
        with pytest.raises(LeaseLost):
            old.loop.recover(inventory={})
        assert new.action("120:S").status == "in_flight"   # the new leader's call is still its own
        new.finish_action("120:S", "succeeded", {"desired": 2})
        assert new.action("120:S").status == "succeeded"
    finally:
        old.close()
        new.close()


@pytest.mark.postgres
def test_a_leader_stalled_inside_a_fenced_write_neither_blocks_the_standby_nor_commits_late(pg_url):
    """The fenced write holds FOR SHARE on the lease row: a leader stalled inside it (a pause, a
    frozen VM: its connection stays open) held the standby's takeover back for as long as it
    stalled, then claimed an action seconds after its lease had ended."""
    from samm.knowledge.store import Fence

    leader, standby = KnowledgeStore(pg_url), KnowledgeStore(pg_url)
    try:
        leader.fence = Fence("daemon", "a", leader.acquire_lease("daemon", "a", 1.0).token)
        d, _ = leader.record_decision("1", agent="x", action=None, source="none")
        check = leader._check_fence

        def stalls_after_the_check(session, now):
            check(session, now)
            time.sleep(3.0)

        leader._check_fence = stalls_after_the_check
        claim = []

        def claim_it():
            try:
                claim.append(leader.begin_action(d, "1:S", "sim", "S", {"target": 2})[1])
            except KnowledgeError as exc:
                claim.append(exc)

        t = threading.Thread(target=claim_it)
        t.start()
        time.sleep(1.3)                                     # the leader's lease has ended
        t0 = time.monotonic()
        assert standby.acquire_lease("daemon", "b", 5.0).token == 2
        assert time.monotonic() - t0 < 1.0                  # not held back until the stall ends
        t.join(10)
        assert claim and isinstance(claim[0], KnowledgeError)
        assert standby.action("1:S") is None
    finally:
        leader.close()
        standby.close()


# --- a store lock outlasting the lease ---------------------------------------------------------

def test_a_renewal_that_waited_for_the_lock_writes_an_expiry_from_when_it_got_it(tmp_path):
    """The renewal read the clock before waiting for SQLite's write lock, then wrote an expiry
    already past, over a newer renewal's."""
    path = tmp_path / "k.db"
    with KnowledgeStore(f"sqlite:///{path}") as store:
        store.acquire_lease("daemon", "a", 1.0)
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        out = []
        t = threading.Thread(target=lambda: out.append(store.acquire_lease("daemon", "a", 1.0)))
        t.start()
        time.sleep(1.5)
        released = time.time()
        holder.execute("COMMIT")
        holder.close()
        t.join(10)
        assert out and out[0].expires_at >= released + 1.0 - 0.05


def test_a_store_lock_outlasting_the_lease_does_not_depose_the_only_daemon(tmp_path, caplog):
    """Another process holding the SQLite file's lock for longer than the lease: the iteration's
    fenced write found the lease lapsed (nobody else took it) and the daemon stepped down (exit 3)."""
    path = tmp_path / "k.db"
    runner = DaemonRunner(build_daemon(_config(f"sqlite:///{path}", interval_s=0.3, lease_ttl_s=0.6)),
                          max_iterations=8)

    def lock_the_file():
        while len(runner.reports) < 2:
            time.sleep(0.02)
        c = sqlite3.connect(path, isolation_level=None)
        c.execute("BEGIN EXCLUSIVE")
        time.sleep(2.0)
        c.execute("COMMIT")
        c.close()

    threading.Thread(target=lock_the_file, daemon=True).start()
    with caplog.at_level(logging.WARNING):
        assert runner.run(install_signals=False) == 0
    assert not runner.lost_leadership and len(runner.reports) == 8
    with KnowledgeStore(f"sqlite:///{path}") as store:
        assert store.lease("daemon").token == 1


def test_iterations_go_on_after_the_wall_clock_steps_back(tmp_path, monkeypatch):
    """APScheduler waits for wall-clock run times: after the clock stepped back (NTP at boot, a
    VM resumed) the daemon ran nothing for as long as the step (here 30 s)."""
    import datetime as dt
    import types

    import apscheduler.executors.base as apsexec
    import apscheduler.schedulers.base as apsbase

    import samm.daemon.runner as runner_mod

    back = [0.0]

    class SteppedDatetime(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return dt.datetime.now(tz) - dt.timedelta(seconds=back[0])

    monkeypatch.setattr(apsbase, "datetime", SteppedDatetime)   # the scheduler's clock and its
    monkeypatch.setattr(apsexec, "datetime", SteppedDatetime)   # executor's misfire check
    monkeypatch.setattr(runner_mod, "time", types.SimpleNamespace(
        time=lambda: time.time() - back[0], monotonic=time.monotonic, sleep=time.sleep))
    runner = DaemonRunner(build_daemon(_config(f"sqlite:///{tmp_path}/k.db")), max_iterations=10)

    def step_back(rep):
        if len(runner.reports) == 3:
            back[0] = 30.0

    runner.on_iteration = step_back
    rc = []
    t = threading.Thread(target=lambda: rc.append(runner.run(install_signals=False)))
    t.start()
    t.join(15)
    runner.stop_event.set()
    t.join(15)
    assert len(runner.reports) == 10 and rc == [0]


# --- signals -------------------------------------------------------------------------------------

def test_sighup_is_logged_and_ignored_and_sigterm_still_stops_cleanly(tmp_path):
    """SIGHUP's default action killed the daemon on the spot (lease held, iteration cut), and
    systemd counts SIGHUP as a clean exit: Restart=on-failure would not restart it."""
    cfg_path = tmp_path / "samm.yaml"
    cfg_path.write_text(yaml.safe_dump({
        "groups": GROUPS, "agent": {"name": "static:2,1,1"}, "executor": {"kind": "sim"},
        "timing": {"interval_s": 0.2, "warmup_s": 0, "cooldown_s": 0},
        "knowledge": {"url": f"sqlite:///{tmp_path}/k.db"}}))
    proc = subprocess.Popen([sys.executable, "-m", "samm.cli.main", "run", "--config", str(cfg_path), "--json",
                             "--log-level", "WARNING"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=os.environ | {"OMP_NUM_THREADS": "1"})
    try:
        assert proc.stdout.readline(), proc.stderr.read() if proc.poll() is not None else "no iteration"
        proc.send_signal(signal.SIGHUP)
        for _ in range(3):  # still iterating after the SIGHUP
            assert proc.stdout.readline()
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "SIGHUP ignored" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with KnowledgeStore(f"sqlite:///{tmp_path}/k.db") as store:
        assert store.lease("daemon").expires_at < time.time()  # released on the clean stop


# --- the SQLite file deleted while open ----------------------------------------------------------

@pytest.mark.parametrize("replace_with", ["nothing", "a directory"])
def test_a_deleted_or_replaced_sqlite_file_is_an_error_not_a_silent_loss(tmp_path, replace_with):
    """Open connections went on writing to the unlinked file, lost at exit, without an error."""
    path = tmp_path / "k.db"
    with KnowledgeStore(f"sqlite:///{path}") as store:
        store.record_decision("1", agent="x", action=None, source="none")
        for p in tmp_path.glob("k.db*"):
            p.unlink()
        if replace_with == "a directory":
            path.mkdir()
        with pytest.raises(KnowledgeError, match="deleted or replaced"):
            store.record_decision("2", agent="x", action=None, source="none")
        with pytest.raises(KnowledgeError, match="deleted or replaced"):
            store.acquire_lease("daemon", "a", 5.0)


# --- text PostgreSQL refuses ---------------------------------------------------------------------

def test_text_postgresql_refuses_is_stored_alike_on_both_databases(knowledge_url, caplog):
    """An error or reason with a NUL character, undecodable characters, or an action name over
    its column: stored on SQLite, refused by PostgreSQL (the outcome of an action was lost)."""
    with KnowledgeStore(knowledge_url) as store:
        with caplog.at_level(logging.WARNING):
            d, created = store.record_decision("1", agent="x", action=None, source="none", action_name="n" * 300,
                                               reason="bad\x00byte \udcff")
            store.begin_action(d, "1:S", "sim", "S", {"target": 2})
            store.finish_action("1:S", "failed", {"out": "x\x00y"}, "executor said \x00")
            snap = store.record_snapshot(0, 60, "stale", ["reason \udcff"], None)
        rec = store.decision("1")
        assert created and len(rec.action_name) == 256 and rec.reason == "bad\\x00byte \\udcff"
        assert store.action("1:S").error == "executor said \\x00" and store.action("1:S").status == "failed"
        assert store.snapshot(snap).reasons == ["reason \\udcff"]
        assert "NUL" in caplog.text and "cut to" in caplog.text


# --- the store failing at start ------------------------------------------------------------------

def test_a_store_failing_at_the_lease_or_at_recovery_exits_restartable(tmp_path, monkeypatch):
    """Raised, the KnowledgeError reached the CLI as exit 2, which samm.service's
    RestartPreventExitStatus=2 never restarts."""
    for fail in ("acquire_lease", "in_flight_actions"):
        url = f"sqlite:///{tmp_path}/{fail}.db"
        runner = DaemonRunner(build_daemon(_config(url)), max_iterations=2)

        def broken(*a, **k):
            raise KnowledgeError("knowledge store: connection lost")

        monkeypatch.setattr(runner.daemon.store, fail, broken)
        assert runner.run(install_signals=False) == STORE_FAILED
        assert not runner.reports
        monkeypatch.undo()
        with KnowledgeStore(url) as store:
            lease = store.lease("daemon")
            assert lease is None or lease.expires_at < time.time()  # released when it was taken


def test_an_unreachable_store_is_raised_at_once_outside_systemd_and_for_sqlite(tmp_path, monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    with pytest.raises(KnowledgeError):
        build_daemon_waiting_for_store(_config("postgresql://postgres@127.0.0.1:1/postgres"),
                                       sleep=lambda s: pytest.fail("retried outside systemd"))
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "no-such-socket"))
    (tmp_path / "k.db").mkdir()  # a directory: SQLite cannot open it, and waiting will not help
    with pytest.raises(KnowledgeError):
        build_daemon_waiting_for_store(_config(f"sqlite:///{tmp_path}/k.db"),
                                       sleep=lambda s: pytest.fail("retried a SQLite error"))


@pytest.mark.postgres
def test_under_systemd_a_postgresql_not_up_yet_is_waited_for(tmp_path, monkeypatch):
    """A daemon started before its PostgreSQL (boot order, a failover) exited 2 for good."""
    from samm.knowledge.local_postgres import LocalPostgres, why_unavailable
    from samm.localproc import stable_port

    if why_unavailable():
        pytest.skip(why_unavailable())
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify"))
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify"))
    pg = LocalPostgres(port=stable_port())
    waits = []

    def sleep(s):
        waits.append(s)
        if len(waits) == 2:
            pg.start()  # the server comes up while the daemon waits

    try:
        daemon = build_daemon_waiting_for_store(_config(pg.url), sleep=sleep)
        daemon.close()
        assert waits == [1.0, 2.0]
        sock.settimeout(1)
        assert sock.recv(4096).startswith(b"STATUS=waiting for the knowledge store")
    finally:
        pg.close()
        sock.close()


def test_a_database_from_a_newer_samm_is_a_clear_error(tmp_path):
    """A rollback of the package left the store at a revision this SAMM does not know: alembic's
    CommandError escaped as a traceback (exit 1, restarted by systemd again and again)."""
    from sqlalchemy import create_engine, text

    url = f"sqlite:///{tmp_path}/k.db"
    KnowledgeStore(url).close()
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE samm_alembic_version SET version_num = '0099'"))
    engine.dispose()
    with pytest.raises(KnowledgeError, match="0099.*newer SAMM"):
        KnowledgeStore(url)


def test_an_in_memory_knowledge_store_is_warned_about(tmp_path, caplog):
    """`knowledge.url: sqlite://` ran silently in memory: cool-downs were forgotten on restart."""
    import logging

    with caplog.at_level(logging.WARNING, logger="samm.daemon.build"):
        build_daemon(_config("sqlite://")).close()
        build_daemon(_config(f"sqlite:///{tmp_path}/k.db")).close()
    warned = [r.getMessage() for r in caplog.records if "in-memory database" in r.getMessage()]
    assert len(warned) == 1 and "cool-down" in warned[0]
