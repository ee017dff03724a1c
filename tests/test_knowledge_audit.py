"""Audit of the Knowledge store's schema, migrations and data integrity: the same inputs give the
same answers (or the same clear error) on SQLite and on a real PostgreSQL; migrations keep data
and name what they cannot do; a read-only or full file system is named; an in-memory store
survives use from several threads."""
from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from samm.knowledge import KnowledgeError, KnowledgeStore, normalize_url
from samm.knowledge.schema import current_revision, downgrade, head_revision, migrate, schema_diff
from samm.knowledge.store import Fence

NAN = float("nan")
REPO = Path(__file__).resolve().parents[1]


def _decision(store: KnowledgeStore, key: str = "1700000060", loop: str = "default") -> int:
    decision_id, _ = store.record_decision(key, agent="lstm-ppo", action=2, source="agent", loop=loop)
    return decision_id


# --- NaN times --------------------------------------------------------------------------------

def test_a_nan_time_is_refused_alike_on_both_databases(knowledge_url):
    # SQLite stored NaN as NULL (a constraint error; a NaN lease ttl read as "held by someone
    # else"), PostgreSQL as NaN, which compares false with every time: a cool-down that never
    # held and a lease that never expired
    with KnowledgeStore(knowledge_url) as s:
        with pytest.raises(ValueError, match="window_start is NaN"):
            s.record_snapshot(NAN, 60.0, "ok")
        with pytest.raises(ValueError, match="now is NaN"):
            s.record_snapshot(0.0, 60.0, "ok", now=NAN)
        with pytest.raises(ValueError, match="cooldown until is NaN"):
            s.set_cooldown("web", NAN)
        with pytest.raises(ValueError, match="ttl_s is NaN"):
            s.acquire_lease("daemon", "me", NAN)
        decision_id = _decision(s)
        s.begin_action(decision_id, "1700000060:web", "sim", "web", {"target": 3})
        with pytest.raises(ValueError, match="cooldown_until is NaN"):
            s.finish_action("1700000060:web", "succeeded", cooldown_until=NAN)
        assert s.counts()["snapshots"] == 0 and s.cooldowns() == {} and s.lease("daemon") is None
        assert s.action("1700000060:web").status == "in_flight"  # nothing half-written
        # infinity is a time both databases keep: "forever"
        s.set_cooldown("db", math.inf)
        assert s.cooldowns() == {"db": math.inf}


@pytest.mark.postgres
def test_a_fenced_write_under_a_lease_without_end_is_recorded(pg_url):
    # PostgreSQL bounds a fenced transaction by the lease's remaining time: int(inf ms) raised
    # OverflowError on every decision
    with KnowledgeStore(pg_url) as s:
        rec = s.acquire_lease("daemon", "me", math.inf)
        s.fence = Fence("daemon", "me", rec.token)
        decision_id, created = s.record_decision("k", agent="a", action=1, source="agent")
        assert created and s.decision("k").id == decision_id


# --- labels from outside ----------------------------------------------------------------------

def test_a_long_or_nul_policy_version_from_a_service_is_recorded_on_both_databases(knowledge_url, caplog):
    # a Policy Evaluation Service's reply names the policy version: PostgreSQL refused one over
    # 128 characters or with a NUL (SQLite kept it), so no decision could be recorded at all
    with KnowledgeStore(knowledge_url) as s:
        s.record_decision("k1", agent="lstm-ppo", action=1, source="agent", policy_version="v" * 300)
        s.record_decision("k2", agent="lstm\x00ppo", action=1, source="agent", policy_version="v1\x00")
        long, nul = s.decision("k1"), s.decision("k2")
    assert len(long.policy_version) == 128 and long.policy_version.endswith("…")
    assert nul.policy_version == "v1\\x00" and nul.agent == "lstm\\x00ppo"
    assert "decision.policy_version" in caplog.text


# --- policy versions ------------------------------------------------------------------------

@pytest.mark.postgres
def test_versions_registered_at_once_leave_one_active_on_postgres(pg_url):
    # each registration's UPDATE missed the other's uncommitted row: two active versions of one
    # agent in about half the rounds (SQLite's BEGIN IMMEDIATE serialises them)
    stores = [KnowledgeStore(pg_url) for _ in range(6)]
    try:
        for round_ in range(8):
            agent = f"agent{round_}"
            barrier = threading.Barrier(len(stores))

            def register(i: int) -> None:
                barrier.wait(timeout=30)
                stores[i].register_policy_version(agent, f"v{i}")

            threads = [threading.Thread(target=register, args=(i,)) for i in range(len(stores))]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
            with stores[0].engine.connect() as c:
                active = c.execute(text("SELECT version FROM policy_versions WHERE agent = :a AND active"),
                                   {"a": agent}).scalars().all()
            assert len(active) == 1, (agent, active)
            assert stores[0].active_policy(agent).version == active[0]
    finally:
        for s in stores:
            s.close()


# --- migrations -------------------------------------------------------------------------------

def test_a_database_of_a_newer_samm_opened_read_only_says_so(knowledge_url):
    KnowledgeStore(knowledge_url).close()
    engine = create_engine(normalize_url(knowledge_url))
    try:
        with engine.begin() as c:
            c.execute(text("UPDATE samm_alembic_version SET version_num = '0099'"))
    finally:
        engine.dispose()
    # it said "open it once with migrate=True", which then fails: only the newer SAMM can help
    with pytest.raises(KnowledgeError, match="revision 0099, unknown to this SAMM.*newer SAMM") as err:
        KnowledgeStore(knowledge_url, migrate=False)
    assert "migrate=True" not in str(err.value)
    with pytest.raises(KnowledgeError, match="newer SAMM"):
        KnowledgeStore(knowledge_url)


def test_downgrade_below_0002_with_several_loops_keeps_loop_default(knowledge_url):
    # loops decide on the same window ends: the downgrade's global unique key on iteration_key
    # failed on the other loops' decisions, so no database with two loops could go back
    with KnowledgeStore(knowledge_url) as s:
        for loop in ("default", "batch"):
            decision_id = _decision(s, "1700000060", loop)
            key = ("" if loop == "default" else f"{loop}/") + "1700000060:web"
            s.begin_action(decision_id, key, "sim", "web", {"target": 2}, loop=loop)
            s.finish_action(key, "succeeded", cooldown_until=500.0)
    assert downgrade(knowledge_url, "0001") == "0001"
    assert migrate(knowledge_url) == head_revision() and schema_diff(knowledge_url) == []
    with KnowledgeStore(knowledge_url) as s:
        assert [(d.loop, d.iteration_key) for d in s.decisions()] == [("default", "1700000060")]
        assert [a.idempotency_key for a in s.actions()] == ["1700000060:web"]
        assert s.cooldowns() == {"web": 500.0} and s.cooldowns("batch") == {}


def test_upgrade_from_0002_keeps_rows_of_every_loop(knowledge_url):
    migrate(knowledge_url, "0002")
    engine = create_engine(normalize_url(knowledge_url))
    try:
        with engine.begin() as c:
            c.execute(text("INSERT INTO group_state (loop, group_name, cooldown_until) VALUES ('batch', 'web', 99.5)"))
    finally:
        engine.dispose()
    with KnowledgeStore(knowledge_url) as s:
        assert current_revision(knowledge_url) == head_revision()
        assert s.cooldowns("batch") == {"web": 99.5} and s.lease("daemon") is None


# --- a read-only file system --------------------------------------------------------------------

@pytest.fixture
def read_only_mount(tmp_path):
    """A small tmpfs at tmp_path/fs, to remount read-only or fill (needs root and mount rights)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    fs = tmp_path / "fs"
    fs.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(fs)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield fs
    finally:
        subprocess.run(["umount", "-l", str(fs)], capture_output=True)


def _remount(fs: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(fs)], check=True, capture_output=True)


def test_a_store_on_a_read_only_file_system_names_the_cause(read_only_mount):
    # SQLite says only "unable to open database file", even when just reading (WAL mode)
    url = f"sqlite:///{read_only_mount}/samm.db"
    KnowledgeStore(url).close()
    with KnowledgeStore(url) as s:
        _remount(read_only_mount, "ro")
        try:
            with pytest.raises(KnowledgeError, match=r"set_cooldown failed: .*samm\.db is read-only"):
                s.set_cooldown("web", 10.0)
            with pytest.raises(KnowledgeError, match=r"cannot open: .*samm\.db is read-only"):
                KnowledgeStore(url, migrate=False)
            with pytest.raises(KnowledgeError, match=r"cannot open: .*directory .* is not writable"):
                KnowledgeStore(f"sqlite:///{read_only_mount}/new.db")
        finally:
            _remount(read_only_mount, "rw")


def test_a_store_created_on_a_full_file_system_says_it_is_full(read_only_mount):
    # SQLite says only "disk I/O error" when it cannot extend its -shm file
    fd = os.open(read_only_mount / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"x" * 65536)
    except OSError:
        pass
    finally:
        os.close(fd)
    url = f"sqlite:///{read_only_mount}/samm.db"
    with pytest.raises(KnowledgeError, match=r"cannot open: .*bytes free on the file system of .*is it full"):
        KnowledgeStore(url)
    os.remove(read_only_mount / "filler")
    with KnowledgeStore(url) as s:  # nothing half-made is left in the way
        assert s.counts()["decisions"] == 0


# --- an in-memory store used from several threads ---------------------------------------------

THREADED_MEMORY_SCRIPT = """
import threading
from samm.knowledge import KnowledgeStore
s = KnowledgeStore("sqlite://")
errors = []
def keep_lease():  # the daemon's lease keeper
    for _ in range(200):
        try:
            s.acquire_lease("daemon", "me", 10.0)
        except Exception as exc:
            errors.append(repr(exc))
def decide(loop):  # a control loop
    for i in range(200):
        try:
            s.record_decision(f"k{i}", agent="a", action=1, source="agent", loop=loop)
            s.set_cooldown("web", float(i), loop=loop)
        except Exception as exc:
            errors.append(repr(exc))
threads = [threading.Thread(target=keep_lease)] + [threading.Thread(target=decide, args=(n,)) for n in ("a", "b")]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(len(errors), errors[:3], s.counts()["decisions"])
"""


def test_an_in_memory_store_used_from_several_threads_takes_them_one_at_a_time(tmp_path):
    # `samm run` with knowledge.url sqlite:// renews its lease from a thread of its own while
    # the loops record: both in the one shared connection at once raised "cannot start a
    # transaction within a transaction", or killed the process (segmentation fault)
    script = tmp_path / "threads.py"
    script.write_text(THREADED_MEMORY_SCRIPT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[0] == "0" and out.stdout.split()[-1] == "400", out.stdout
