"""The Knowledge store on SQLite (a temp file) and on a real PostgreSQL 15 server.

PostgreSQL: a throwaway server from Debian's binaries (samm.knowledge.local_postgres) for the
whole session, or the server at SAMM_TEST_POSTGRES_URL. Every test gets its own schema, so
tests never see each other's rows.
"""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import create_engine, inspect, text

from samm.execute.base import ActionResult, ScaleRequest
from samm.knowledge import KnowledgeError, KnowledgeStore, normalize_url
from samm.knowledge.local_postgres import LocalPostgres, why_unavailable
from samm.knowledge.models import TABLES
from samm.knowledge.schema import current_revision, downgrade, head_revision, migrate, schema_diff

REPO = Path(__file__).resolve().parents[1]


# --- fixtures -------------------------------------------------------------------------------

@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/state/samm.db"  # the directory does not exist yet
    return request.getfixturevalue("pg_url")


@pytest.fixture
def store(url):
    s = KnowledgeStore(url)
    yield s
    s.close()


def _decision(store: KnowledgeStore, key: str = "2024-01-01T00:01:00Z") -> int:
    decision_id, _ = store.record_decision(key, agent="lstm-ppo", action=2, source="agent")
    return decision_id


# --- schema -----------------------------------------------------------------------------------

def test_migrate_twice_is_a_noop_and_the_schema_equals_the_models(url):
    head = head_revision()
    assert current_revision(url) is None
    assert migrate(url) == head
    assert migrate(url) == head
    assert schema_diff(url) == []
    engine = create_engine(normalize_url(url))
    try:
        assert set(TABLES) <= set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_downgrade_to_base_and_back(url):
    migrate(url)
    with KnowledgeStore(url) as s:
        _decision(s)
    assert downgrade(url, "base") is None
    engine = create_engine(normalize_url(url))
    try:
        assert not set(TABLES) & set(inspect(engine).get_table_names())
    finally:
        engine.dispose()
    assert migrate(url) == head_revision()
    assert schema_diff(url) == []


MIGRATE_SCRIPT = """
import sys, time
from pathlib import Path
from samm.knowledge.schema import migrate
ready, go = Path(sys.argv[2]), Path(sys.argv[3])
ready.touch()
deadline = time.monotonic() + 60
while not go.exists() and time.monotonic() < deadline:
    time.sleep(0.005)
print(migrate(sys.argv[1]))
"""


def test_concurrent_migrations_from_several_processes_all_succeed(url, tmp_path):
    # a daemon and a report starting together on a fresh database: the migration lock (not
    # luck) must keep them from creating the tables twice
    go = tmp_path / "go"
    ready = [tmp_path / f"ready{i}" for i in range(3)]
    procs = [subprocess.Popen([sys.executable, "-c", MIGRATE_SCRIPT, url, str(r), str(go)], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in ready]
    try:
        deadline = time.monotonic() + 60
        while not all(r.exists() for r in ready) and time.monotonic() < deadline:
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs if p.poll() is not None]
            time.sleep(0.01)
        go.touch()
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0, 0], [err[-1500:] for _, err in outs]
    assert [out.strip() for out, _ in outs] == [head_revision()] * 3
    assert schema_diff(url) == []


def test_migrate_from_several_threads(url):
    results, errors = [], []
    barrier = threading.Barrier(3)

    def run():
        barrier.wait()
        try:
            results.append(migrate(url))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert results == [head_revision()] * 3


def test_read_only_open_refuses_an_unmigrated_database(url):
    with pytest.raises(KnowledgeError, match="schema revision None"):
        KnowledgeStore(url, migrate=False)
    KnowledgeStore(url).close()
    with KnowledgeStore(url, migrate=False) as s:
        assert s.counts()["decisions"] == 0


# --- decisions --------------------------------------------------------------------------------

def test_one_decision_per_iteration_key(store):
    first, created = store.record_decision("k-60", agent="lstm-ppo", action=[1, 0, 2], source="agent",
                                           policy_version="v3", action_name="up:small", value=0.25,
                                           probabilities=[0.1, 0.9], now=60.0)
    assert created
    again, created = store.record_decision("k-60", agent="other", action=0, source="fallback",
                                           reason="replayed", now=61.0)
    assert (again, created) == (first, False)
    rows = store.decisions()
    assert len(rows) == 1
    d = rows[0]
    assert (d.agent, d.action, d.source, d.policy_version, d.value, d.probabilities) == \
        ("lstm-ppo", [1, 0, 2], "agent", "v3", 0.25, [0.1, 0.9])
    second, created = store.record_decision("k-120", agent="lstm-ppo", action=0, source="none", now=120.0)
    assert created and second != first
    assert [r.iteration_key for r in store.decisions(since=100.0)] == ["k-120"]
    assert store.decision("k-120").source == "none"


def test_decision_rejects_unknown_source_and_missing_observation(store):
    with pytest.raises(ValueError, match="decision source"):
        store.record_decision("k", agent="a", action=0, source="oracle")
    with pytest.raises(KnowledgeError, match="record_decision"):
        store.record_decision("k", agent="a", action=0, source="agent", observation_id=424242)
    assert store.counts()["decisions"] == 0


# --- actions ------------------------------------------------------------------------------------

def test_begin_action_is_idempotent(store):
    decision_id = _decision(store)
    req = ScaleRequest(group="small", target=3, idempotency_key="d1:small")
    row, created = store.begin_action(decision_id, req.idempotency_key, "sim", req.group, req, now=10.0)
    assert created and row.status == "in_flight" and row.open
    assert row.request == {"group": "small", "target": 3, "idempotency_key": "d1:small", "victim": None,
                           "basis": None}

    again, created = store.begin_action(decision_id, req.idempotency_key, "sim", req.group, {"target": 99}, now=11.0)
    assert not created
    assert again == row  # same row, status and request unchanged

    done = store.finish_action(req.idempotency_key, "succeeded", ActionResult("succeeded", {"desired": 3}),
                               now=12.0)
    assert (done.status, done.finished_at, done.result["detail"]) == ("succeeded", 12.0, {"desired": 3})
    after, created = store.begin_action(decision_id, req.idempotency_key, "sim", req.group, req, now=13.0)
    assert not created and after.status == "succeeded"
    assert len(store.actions(decision_id=decision_id)) == 1


def test_planned_action_is_claimed_by_exactly_one_caller(store):
    decision_id = _decision(store)
    row, created = store.begin_action(decision_id, "k", "sim", "small", {"target": 2}, status="planned")
    assert created and row.status == "planned"
    claim, owned = store.begin_action(decision_id, "k", "sim", "small", {"target": 2})
    assert owned and claim.status == "in_flight" and claim.id == row.id
    claim2, owned2 = store.begin_action(decision_id, "k", "sim", "small", {"target": 2})
    assert not owned2 and claim2.status == "in_flight"


def test_blocked_action_is_recorded_finished(store):
    decision_id = _decision(store)
    row, created = store.begin_action(decision_id, "k", "sim", "small", {"target": 9}, status="blocked", now=5.0)
    assert created and row.status == "blocked" and row.finished_at == 5.0
    assert store.in_flight_actions(include_planned=True) == []


def test_finish_action_keeps_the_first_outcome_and_names_unknown_keys(store):
    decision_id = _decision(store)
    store.begin_action(decision_id, "k", "sim", "small", {"target": 2})
    first = store.finish_action("k", "failed", error="ValidationError: above max")
    second = store.finish_action("k", "succeeded", {"desired": 2})
    assert second == first and second.status == "failed" and second.error == "ValidationError: above max"
    with pytest.raises(KnowledgeError, match="'nope'"):
        store.finish_action("nope", "succeeded")
    with pytest.raises(ValueError, match="final action status"):
        store.finish_action("k", "in_flight")


def test_action_for_a_missing_decision_is_a_clear_error(store):
    with pytest.raises(KnowledgeError, match="decision 31337 does not exist"):
        store.begin_action(31337, "k", "sim", "small", {})
    assert store.actions() == []


def test_concurrent_begin_action_has_exactly_one_owner(url):
    # two stores = two engines and connection pools, as two daemon processes would have
    stores = [KnowledgeStore(url), KnowledgeStore(url)]
    try:
        decision_id = _decision(stores[0])
        n_threads, n_keys = 4, 5
        for k in range(n_keys):
            key = f"race-{k}"
            barrier = threading.Barrier(n_threads)
            outcomes, errors = [], []

            def claim(i):
                barrier.wait()
                try:
                    outcomes.append(stores[i % 2].begin_action(decision_id, key, "sim", "small", {"thread": i}))
                except Exception as exc:  # noqa: BLE001 - reported below
                    errors.append(exc)

            threads = [threading.Thread(target=claim, args=(i,)) for i in range(n_threads)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
            assert not errors, errors
            assert sum(created for _, created in outcomes) == 1, outcomes
            assert len({row.id for row, _ in outcomes}) == 1
            assert len({str(row.request) for row, _ in outcomes}) == 1  # all see the winner's row
        assert len(stores[1].actions()) == n_keys
    finally:
        for s in stores:
            s.close()


CRASH_SCRIPT = """
import os, sys
from samm.knowledge import KnowledgeStore
s = KnowledgeStore(sys.argv[1])
d, _ = s.record_decision("crash-iteration", agent="lstm-ppo", action=1, source="agent")
s.begin_action(d, "crash-key", "aws-asg", "small", {"target": 4}, now=100.0)
os._exit(9)  # dies between the claim and the executor's answer
"""


def test_in_flight_actions_after_a_crash(url):
    proc = subprocess.run([sys.executable, "-c", CRASH_SCRIPT, url], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 9, proc.stderr
    with KnowledgeStore(url) as s:
        pending = s.in_flight_actions()
        assert [(a.idempotency_key, a.status, a.group_name, a.request) for a in pending] == \
            [("crash-key", "in_flight", "small", {"target": 4})]
        # recovery: the restarted daemon must not act again for that key
        _, created = s.begin_action(pending[0].decision_id, "crash-key", "aws-asg", "small", {"target": 4})
        assert not created
        s.finish_action("crash-key", "succeeded", {"reconciled": True}, cooldown_until=400.0, now=200.0)
        assert s.in_flight_actions() == []
        assert s.cooldowns() == {"small": 400.0}


# --- cool-downs ---------------------------------------------------------------------------------

def test_cooldowns_survive_closing_and_reopening(url):
    with KnowledgeStore(url) as s:
        assert s.cooldowns() == {}
        s.set_cooldown("small", 1000.5, action_key="a1", now=700.0)
        s.set_cooldown("large", 2000.0, now=700.0)
        s.set_cooldown("small", 1300.0, action_key="a2", now=1000.0)  # a later action
    with KnowledgeStore(url) as s:
        assert s.cooldowns() == {"small": 1300.0, "large": 2000.0}
        state = s.group_states()["small"]
        assert (state.last_action_key, state.last_action_at) == ("a2", 1000.0)


def test_finish_action_sets_the_cooldown_of_its_group(store):
    decision_id = _decision(store)
    store.begin_action(decision_id, "k", "sim", "large", {"target": 1})
    store.finish_action("k", "succeeded", cooldown_until=900.0, now=600.0)
    assert store.cooldowns() == {"large": 900.0}
    assert store.group_states()["large"].last_action_key == "k"
    # a late duplicate finish changes nothing, the cool-down included
    store.finish_action("k", "failed", cooldown_until=5000.0)
    assert store.cooldowns() == {"large": 900.0}


# --- JSON -----------------------------------------------------------------------------------

def test_json_round_trips_and_non_finite_numbers_become_null(store, caplog):
    raw = {"instances": [{"id": "i-1", "cpu": np.float32(0.5), "ram": 0.25, "state": "running"},
                         {"id": "i-2", "cpu": float("nan"), "ram": None}],
           "queue": {"waiting": np.int64(3), "arrived": (1, 2, 3)}, "ratios": np.array([0.5, np.inf])}
    snap = store.record_snapshot(0.0, 60.0, "partial", reasons=["i-2: no cpu"], raw=raw, now=61.0)
    got = store.snapshot(snap)
    assert got.status == "partial" and got.reasons == ["i-2: no cpu"] and got.window_end == 60.0
    assert got.raw == {"instances": [{"id": "i-1", "cpu": 0.5, "ram": 0.25, "state": "running"},
                                     {"id": "i-2", "cpu": None, "ram": None}],
                       "queue": {"waiting": 3, "arrived": [1, 2, 3]}, "ratios": [0.5, None]}
    assert "snapshot.raw.instances[1].cpu=nan" in caplog.text

    feats = {"cpu_mean": 0.4, "cpu_p90": float("nan"), "vm_count:small": 3}
    obs = store.record_observation(snap, feats)
    assert store.observation(obs).features == {"cpu_mean": 0.4, "cpu_p90": None, "vm_count:small": 3}

    decision_id, _ = store.record_decision("k", agent="a", action=np.int64(4), source="agent", observation_id=obs,
                                           probabilities=np.array([0.25, float("nan")]), value=float("-inf"))
    d = store.decisions()[0]
    assert (d.action, d.probabilities, d.value, d.observation_id) == (4, [0.25, None], None, obs)

    store.begin_action(decision_id, "k", "sim", "small", {"target": 1})
    store.record_snapshot(60.0, 120.0, "stale", reasons="graphite down", raw=None)
    assert store.snapshot(snap + 1).reasons == ["graphite down"]

    engine = create_engine(normalize_url(store._url))
    try:
        with engine.connect() as conn:
            # what is on disk is standard JSON: no NaN / Infinity tokens anywhere
            stored = " ".join(conn.execute(text(
                "SELECT CAST(raw AS TEXT) FROM snapshots WHERE raw IS NOT NULL UNION ALL "
                "SELECT CAST(features AS TEXT) FROM observations UNION ALL "
                "SELECT CAST(probabilities AS TEXT) FROM decisions")).scalars())
            # an absent value is SQL NULL, not the JSON text 'null'
            nulls = conn.execute(text("SELECT (SELECT count(*) FROM actions WHERE result IS NULL), "
                                      "(SELECT count(*) FROM snapshots WHERE raw IS NULL)")).one()
    finally:
        engine.dispose()
    assert "NaN" not in stored and "Infinity" not in stored and "null" in stored
    assert tuple(nulls) == (1, 1)


def test_snapshot_rejects_unknown_status(store):
    with pytest.raises(ValueError, match="snapshot status"):
        store.record_snapshot(0, 60, "fine")


# --- policies -----------------------------------------------------------------------------------

def test_policy_versions(store):
    assert store.active_policy("lstm-ppo") is None
    v1 = store.register_policy_version("lstm-ppo", "v1", path="/p/v1.pt", sha256="a" * 64, source="train run 7")
    assert v1.active and store.active_policy("lstm-ppo") == v1
    v2 = store.register_policy_version("lstm-ppo", "v2", path="/p/v2.pt", sha256="b" * 64)
    assert store.active_policy("lstm-ppo").version == "v2"
    assert store.register_policy_version("other", "v1").active  # another agent is independent
    assert store.active_policy("lstm-ppo").version == "v2"
    # registering v1 again (a rollback) reactivates it without a new row
    again = store.register_policy_version("lstm-ppo", "v1", sha256="a" * 64)
    assert again.id == v1.id and again.active
    assert store.active_policy("lstm-ppo").id == v1.id
    assert store.counts()["policy_versions"] == 3
    with pytest.raises(KnowledgeError, match="new version"):
        store.register_policy_version("lstm-ppo", "v2", sha256="c" * 64)
    inactive = store.register_policy_version("lstm-ppo", "v3", activate=False)
    assert not inactive.active and store.active_policy("lstm-ppo").id == v1.id and v2.id != v1.id


def test_counts(store):
    snap = store.record_snapshot(0, 60, "ok")
    store.record_observation(snap, {"cpu_mean": 0.1})
    _decision(store)
    assert store.counts() == {"snapshots": 1, "observations": 1, "decisions": 1, "actions": 0,
                              "group_state": 0, "policy_versions": 0, "leases": 0}


# --- URLs and SQLite specifics ---------------------------------------------------------------

def test_urls_are_normalised_and_bad_ones_named_without_passwords():
    assert normalize_url("postgresql://u:secret@h/db").drivername == "postgresql+psycopg"
    assert normalize_url("postgres://u@h/db").drivername == "postgresql+psycopg"
    with pytest.raises(KnowledgeError, match="unsupported database 'mysql'"):
        normalize_url("mysql://u:secret@h/db")
    with pytest.raises(KnowledgeError, match="not a database URL") as exc:
        normalize_url("not a url with secret")
    assert "secret" not in str(exc.value)
    with pytest.raises(KnowledgeError, match="empty"):
        KnowledgeStore("  ")


def test_unreachable_postgres_is_a_clear_error():
    with pytest.raises(KnowledgeError, match=r"cannot open") as exc:
        KnowledgeStore("postgresql://samm:hunter2@127.0.0.1:1/samm")
    assert "hunter2" not in str(exc.value) and "127.0.0.1:1" in str(exc.value)


def test_in_memory_sqlite_works_for_single_threaded_use():
    with KnowledgeStore("sqlite://") as s:
        decision_id = _decision(s)
        assert s.begin_action(decision_id, "k", "sim", "small", {})[1]
        assert s.counts()["actions"] == 1


def test_sqlite_uses_wal_and_a_writer_waits_for_the_lock(tmp_path):
    path = tmp_path / "deep" / "er" / "samm.db"
    with KnowledgeStore(f"sqlite:///{path}", busy_timeout_s=20) as s:
        assert path.exists()
        other = sqlite3.connect(path, timeout=20, isolation_level=None, check_same_thread=False)
        try:
            assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            s.record_snapshot(0, 60, "ok")

            # an open read transaction (a report running) does not block the daemon's writes
            other.execute("BEGIN")
            assert other.execute("SELECT count(*) FROM snapshots").fetchone()[0] == 1
            s.record_snapshot(60, 120, "ok")
            assert other.execute("SELECT count(*) FROM snapshots").fetchone()[0] == 1  # its own snapshot
            other.execute("COMMIT")

            # another writer holding the lock: the store waits for it instead of failing
            other.execute("BEGIN IMMEDIATE")
            done, errors = [], []

            def write():
                try:
                    done.append(s.record_snapshot(120, 180, "stale", reasons=["graphite down"]))
                except Exception as exc:  # noqa: BLE001 - reported below
                    errors.append(exc)

            writer = threading.Thread(target=write)
            writer.start()
            writer.join(timeout=0.3)
            assert writer.is_alive() and not done  # still waiting for the lock
            other.execute("COMMIT")
            writer.join(timeout=20)
            assert not errors and len(done) == 1
        finally:
            other.close()
        assert s.counts()["snapshots"] == 3


@pytest.mark.postgres
def test_local_postgres_starts_and_leaves_nothing_behind():
    reason = why_unavailable()
    if reason:
        pytest.skip(reason)
    pg = LocalPostgres()
    with pg:
        pid = pg._proc.pid
        with KnowledgeStore(pg.url) as s:
            assert s.record_decision("k", agent="a", action=0, source="none")[1]
        # stopping with a pooled connection still open must not hang (fast shutdown)
        lingering = KnowledgeStore(pg.url)
        lingering.counts()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists(), "postgres survived close()"
    assert not pg.root.exists()
    lingering.engine.dispose()


# --- loops and problems (revision 0002) -------------------------------------------------------

def test_upgrade_from_0001_keeps_every_row_in_loop_default(url):
    migrate(url, "0001")
    engine = create_engine(normalize_url(url))
    try:
        with engine.begin() as c:
            c.execute(text("INSERT INTO decisions (id, iteration_key, agent, action, source, created_at) "
                           "VALUES (1, 'k1', 'lstm-ppo', '3', 'agent', 1.0)"))
            c.execute(text("INSERT INTO actions (id, decision_id, idempotency_key, executor, group_name, request, "
                           "status, created_at) VALUES (1, 1, 'k1:S', 'sim', 'S', '{}', 'succeeded', 1.0)"))
            c.execute(text("INSERT INTO group_state (group_name, cooldown_until) VALUES ('S', 99.0)"))
    finally:
        engine.dispose()
    s = KnowledgeStore(url)  # migrates to head
    try:
        d = s.decision("k1")
        assert d is not None and d.loop == "default" and d.problem == "autoscaling" and d.action == 3
        assert s.actions()[0].loop == "default" and s.cooldowns() == {"S": 99.0}
        assert schema_diff(url) == []
    finally:
        s.close()


def test_two_loops_deciding_in_the_same_minute_both_record_and_keep_their_own_cooldowns(store):
    a, created_a = store.record_decision("1700000060", agent="lstm-ppo", action=[1, 2, 1], source="agent")
    b, created_b = store.record_decision("1700000060", agent="lra-reinforce", action=4, source="agent",
                                         loop="placement", problem="lra-placement",
                                         observation={"app": 2, "counts": [[0, 1], [1, 0]]})
    assert created_a and created_b and a != b
    again, created = store.record_decision("1700000060", agent="lra-reinforce", action=5, source="agent",
                                           loop="placement")
    assert again == b and not created
    rec = store.decision("1700000060", loop="placement")
    assert rec.problem == "lra-placement" and rec.observation == {"app": 2, "counts": [[0, 1], [1, 0]]}
    store.begin_action(a, "1700000060:S", "sim", "S", {"target": 2})
    store.begin_action(b, "placement/1700000060:node-1", "docker", "S", {"node": 1}, loop="placement")
    store.finish_action("1700000060:S", "succeeded", cooldown_until=100.0)
    store.finish_action("placement/1700000060:node-1", "succeeded", cooldown_until=200.0)
    assert store.cooldowns() == {"S": 100.0} and store.cooldowns("placement") == {"S": 200.0}
    assert [d.loop for d in store.decisions(loop="placement")] == ["placement"]
