"""Regressions from an audit of the deferrable-jobs live path (agents/deferrable_jobs/live.py,
agents/deferrable_jobs/daemon_loop.py, samm/testbed/jobqueue.py, samm/testbed/deferrable/run.py,
samm/cli/deferrable.py), all on real components: SQLite queues and Knowledge stores, a real HTTP
server, a real Graphite, real worker processes and the real CLI."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from agents.deferrable_jobs.live import Answer, DeferrableLoop, HttpAgent, LoopParams
from samm.knowledge.store import KnowledgeStore
from samm.testbed.jobqueue import JobQueue

ROOT = Path(__file__).resolve().parents[1]


def rows(specs):
    """(id, cores, duration, earliest, latest, submit) -> submit_deferrable rows."""
    return [(i, c, d, e, lt, s, float(d), float(s)) for i, c, d, e, lt, s in specs]


class FixedAgent:
    name = "fixed"

    def __init__(self, start=(), before=None):
        self.start, self.before, self.calls = list(start), before, 0

    def ask(self, req):
        self.calls += 1
        if self.before is not None:
            self.before()
        return Answer([i for i in self.start if any(str(j.id) == str(i) for j in req.eligible)])


# ------------------------------------------------------------------------------ the queue's rows
def test_queue_refuses_deferrable_rows_the_scheduler_could_not_show(tmp_path):
    with JobQueue(tmp_path / "q.db") as q:
        for bad in [(1, 200_000, 1, 0, 2, 0, 1.0, 0.0),             # wider than any request allows
                    (1, 2, 200_000, 0, 2, 0, 1.0, 0.0),             # longer than any request allows
                    (1, 2, 1, 0, 2, 0, float("inf"), 0.0),          # infinite run time
                    (1, 2, 1, 0, 2, 0, 1.0, float("nan")),          # NaN submission time
                    (1, float("inf"), 1, 0, 2, 0, 1.0, 0.0),        # int(inf): OverflowError before
                    (1, None, 1, 0, 2, 0, 1.0, 0.0)]:               # int(None): TypeError before
            with pytest.raises(ValueError, match="deferrable job"):
                q.submit_deferrable([bad])
        assert q.deferrable_jobs() == []


def test_a_malformed_queue_row_is_left_out_instead_of_failing_every_slot(tmp_path):
    q = JobQueue(tmp_path / "q.db")
    q.submit_deferrable(rows([(1, 2, 1, 0, 3, 0)]))
    # rows written by another tool: too wide to show the agent, a window that cannot hold, a
    # released job the request cannot carry (its cores must still count)
    db = sqlite3.connect(tmp_path / "q.db")
    cols = ("(id, cores, runtime_s, submitted_at, enqueued_at, duration_slots, earliest, latest, submit_slot, "
            "defer_state")
    db.execute(f"INSERT INTO jobs {cols}) VALUES (2, 200000, 1, 0, 0, 1, 0, 3, 0, 'pending')")
    db.execute(f"INSERT INTO jobs {cols}) VALUES (3, 1, 1, 0, 0, 1, 5, 1, 0, 'pending')")
    db.execute(f"INSERT INTO jobs {cols}, released_slot) VALUES (5, 4, 1, 0, 0, 300000, 0, 0, 0, 'released', 0)")
    db.execute(f"INSERT INTO jobs {cols}) VALUES (6, 1, 1, 0, 0, 1, NULL, 3, 0, 'pending')")   # no window start
    db.commit()
    db.close()
    store = KnowledgeStore(f"sqlite:///{tmp_path / 'k.db'}")
    loop = DeferrableLoop(q, FixedAgent([1, 2, 3]), store, params=LoopParams(loop="bad-rows"))
    rec = loop.tick(1, 10.0)      # raised a ValidationError (every slot) before the fix
    assert rec.error is None and sorted(rec.malformed) == [2, 3, 5]
    # job 5's 4 cores still count: 10 - 4 = 6 free for the agent, which starts job 1
    assert rec.free == 6.0 and rec.released == [1]
    d = store.decision("slot1", loop="bad-rows")
    assert "malformed job row(s) left out: 2, 3, 5" in d.reason and d.action["start"] == [1]
    assert {j.id: j.released for j in q.deferrable_jobs()}[2] is None
    store.close()
    q.close()


def test_a_backlog_past_the_request_limit_is_cut_not_a_crash_every_slot(tmp_path):
    from agents.deferrable_jobs.service import MAX_JOBS

    with JobQueue(tmp_path / "q.db") as q:
        # job 0 is due now; the 5000 others could wait: the request cannot carry all 5001
        q.submit_deferrable(rows([(0, 1, 1, 0, 0, 0)] + [(i, 1, 1, 0, 10, 0) for i in range(1, MAX_JOBS + 1)]))
        store = KnowledgeStore(f"sqlite:///{tmp_path / 'k.db'}")
        rec = DeferrableLoop(q, FixedAgent([]), store, params=LoopParams(loop="backlog")).tick(0, 3.0)
        # before the fix: a ValidationError every slot, so nothing ever started (or was dropped)
        assert rec.error is None and rec.deadline == [0] and rec.released == [0]
        assert "past the request's limit" in store.decision("slot0", loop="backlog").reason
        store.close()


def test_capacity_that_is_not_a_finite_number_starts_nothing(tmp_path):
    with JobQueue(tmp_path / "q.db") as q:
        q.submit_deferrable(rows([(1, 2, 1, 0, 3, 0)]))
        loop = DeferrableLoop(q, FixedAgent([1]), None)
        for bad in (float("nan"), float("inf"), -3.0):
            rec = loop.tick(0, bad)
            assert rec.released == [] and rec.capacity == 0.0
        assert q.deferrable_jobs()[0].released is None


# ------------------------------------------------------------------------------ the agent's answers
class _Answers(BaseHTTPRequestHandler):
    body = b"{}"

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(_Answers.body)

    def log_message(self, *a):
        pass


@pytest.fixture
def answers():
    srv = HTTPServer(("127.0.0.1", 0), _Answers)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield f"http://127.0.0.1:{srv.server_port}"
    srv.shutdown()
    srv.server_close()


@pytest.mark.parametrize("body", [b'{"start": "12"}', b'{"start": {"1": 0.9, "2": 0.8}}',
                                  b'{"start": [1], "scores": [1, 2]}', b'{"start": [1], "policy_version": {"v": 1}}'
])
def test_a_malformed_http_answer_starts_nothing_and_is_recorded(tmp_path, answers, body):
    _Answers.body = body
    q = JobQueue(tmp_path / "q.db")
    q.submit_deferrable(rows([(1, 2, 1, 0, 2, 0), (2, 2, 1, 0, 2, 0)]))
    store = KnowledgeStore(f"sqlite:///{tmp_path / 'k.db'}")
    rec = DeferrableLoop(q, HttpAgent(answers, "fifo", 1.0), store, params=LoopParams(loop="garbage")).tick(0, 10)
    # "12" started jobs 1 and 2, a dict its keys; a dict version crashed the Knowledge write
    assert rec.released == [] and "malformed answer" in rec.error and rec.source == "fallback"
    d = store.decision("slot0", loop="garbage")
    assert d.source == "fallback" and d.action["start"] == [] and "malformed answer" in d.reason
    store.close()
    q.close()


def test_a_well_formed_http_answer_still_starts(tmp_path, answers):
    _Answers.body = b'{"start": ["1"], "scores": {"1": 0.5}, "policy_version": "v1"}'
    with JobQueue(tmp_path / "q.db") as q:
        q.submit_deferrable(rows([(1, 2, 1, 0, 2, 0)]))
        rec = DeferrableLoop(q, HttpAgent(answers, "fifo", 1.0), None).tick(0, 10)
        assert rec.released == [1] and rec.error is None


@pytest.mark.parametrize("timeout", [0.0, -1.0, float("nan"), float("inf")])
def test_http_agent_refuses_a_timeout_requests_cannot_use(timeout):
    with pytest.raises(ValueError, match="request timeout"):   # raised inside every tick before the fix
        HttpAgent("http://127.0.0.1:9", "fifo", timeout)


# ------------------------------------------------------------------------------ one decision, one act
def test_a_slot_recorded_meanwhile_by_another_loop_is_the_one_acted_on(tmp_path, knowledge_url):
    """Two schedulers on one queue and one Knowledge loop (a standby that also ran, a restart
    overlapping the old process): both read no decision for the slot, both ask their agent; the
    one that records second must act on the recorded decision, not its own (which overcommits)."""
    q = JobQueue(tmp_path / "q.db")
    q.submit_deferrable(rows([(1, 4, 2, 0, 3, 0), (2, 4, 2, 0, 3, 0)]))
    store_a, store_b = KnowledgeStore(knowledge_url), KnowledgeStore(knowledge_url)
    b = DeferrableLoop(JobQueue(tmp_path / "q.db"), FixedAgent([1]), store_b, params=LoopParams(loop="shared"))
    # A asks its agent; meanwhile B decides, records and releases job 1 for the same slot
    a = DeferrableLoop(q, FixedAgent([2], before=lambda: b.tick(0, 6.0)), store_a, params=LoopParams(loop="shared"))
    rec_a = a.tick(0, 6.0)
    assert b.records[0].released == [1] and b.records[0].decision_created
    assert not rec_a.decision_created and rec_a.released == [] and rec_a.chosen == [1]
    released = [j.id for j in q.deferrable_jobs() if j.released is not None]
    assert released == [1]            # before the fix: [1, 2], 8 cores on a capacity of 6
    assert len(store_a.decisions(loop="shared")) == 1
    b.q.close()
    store_a.close()
    store_b.close()
    q.close()


# ------------------------------------------------------------------------------ the daemon's loop
from test_deferrable_daemon import SLOT_S, config as daemon_config  # noqa: E402  (the daemon tests' config)


def test_a_dry_run_decision_is_not_acted_on_after_a_live_restart_in_the_same_slot(tmp_path):
    from samm.daemon.build import build_daemon

    with JobQueue(tmp_path / "q.sqlite") as q:
        q.submit_deferrable(rows([(1, 4, 2, 0, 1, 0), (3, 2, 1, 1, 3, 0)]))
    for dry in (True, False):   # the operator turns dry run off and restarts within slot 0
        d = build_daemon(daemon_config(tmp_path, executor={"kind": "jobqueue", "dry_run": dry}))
        try:
            loop = d.loops[0]
            loop.clock = lambda: 1.0
            rep = loop.run_once()
            assert rep.actions[0]["target"] == []        # before the fix: [1] on the live replay
        finally:
            d.close()
    with JobQueue(tmp_path / "q.sqlite") as q:
        assert all(j.released is None for j in q.deferrable_jobs())


def test_a_restart_in_the_same_slot_applies_the_recorded_but_unreleased_decision(tmp_path):
    """The daemon's first iteration after a restart is at the next slot boundary: a decision
    recorded just before a crash (release not done) was never applied, and its due job dropped."""
    from samm.daemon.build import build_daemon

    with JobQueue(tmp_path / "q.sqlite") as q:
        q.submit_deferrable(rows([(1, 4, 2, 0, 0, 0), (3, 2, 1, 1, 3, 0)]))   # job 1 must start in slot 0
    d = build_daemon(daemon_config(tmp_path))
    try:
        loop = d.loops[0]
        loop.clock = lambda: 1.0
        loop.inner.q.release = lambda ids, slot: (_ for _ in ()).throw(sqlite3.OperationalError("disk I/O error"))
        with pytest.raises(sqlite3.OperationalError):   # the decision is recorded, the release fails: a crash
            loop.run_once()
    finally:
        d.close()
    d = build_daemon(daemon_config(tmp_path))           # the restart, still in slot 0
    try:
        loop = d.loops[0]
        loop.clock = lambda: 2.0
        notes = loop.recover()
        assert len(notes) == 1 and "re-applied" in notes[0] and "[1]" in notes[0]
        assert loop.recover() == []                     # nothing left to apply: no second release
        assert len(d.store.decisions(loop="batch")) == 1
    finally:
        d.close()
    with JobQueue(tmp_path / "q.sqlite") as q:
        assert {j.id: j.released for j in q.deferrable_jobs()} == {1: 0, 3: None}


def test_a_clock_before_slot_zero_starts_nothing_and_says_why(tmp_path):
    from samm.daemon.build import build_daemon

    with JobQueue(tmp_path / "q.sqlite") as q:
        q.submit_deferrable(rows([(1, 2, 1, 0, 3, 0)]))
    d = build_daemon(daemon_config(tmp_path, timing={"interval_s": SLOT_S, "slot_zero_unix": 1000.0}))
    try:
        loop = d.loops[0]
        loop.clock = lambda: 500.0                 # slot -50: a ValidationError every iteration before the fix
        rep = loop.run_once()
        assert rep.status == "before-slot-0" and "slot_zero_unix" in rep.reasons[0] and rep.actions[0]["target"] == []
        assert d.store.decisions(loop="batch") == []
        loop.clock = lambda: 1000.0 + SLOT_S / 2   # slot 0
        assert loop.run_once().actions[0]["target"] == [1]
    finally:
        d.close()


@pytest.mark.parametrize("make", ["not_a_db", "directory"])
def test_an_unusable_queue_path_is_a_configuration_problem(tmp_path, make):
    from samm.daemon.build import ConfigurationProblem, build_daemon

    path = tmp_path / "q.sqlite"
    if make == "directory":
        path.mkdir()
    else:
        path.write_text("not a database " * 20)
    with pytest.raises(ConfigurationProblem, match="queue.path"):   # sqlite3.DatabaseError / ValueError before
        build_daemon(daemon_config(tmp_path))


def test_graphite_capacity_refuses_a_negative_or_per_node_reading(graphite, graphite_prefix):
    from fixtures_graphite import wait_for_points

    from agents.deferrable_jobs.daemon_loop import CapacityConfig, graphite_capacity
    from samm.monitor.graphite_client import GraphiteSender, RenderClient

    p = graphite_prefix
    now = int(time.time())
    s = GraphiteSender(graphite.carbon_host, graphite.carbon_port)
    s.send_many([(f"{p}.neg.cores", -30.0, now - 5), (f"{p}.a.cores", 10.0, now - 5), (f"{p}.b.cores", 60.0, now - 5)])
    s.flush()
    s.close()
    wait_for_points(graphite.render_url, [f"{p}.*.cores"], now - 60, now + 5, expect_series=3)
    client = RenderClient(graphite.render_url, 5.0)

    def read(target):
        return graphite_capacity(client, CapacityConfig(kind="graphite", target=target, fleet_cores=80), time.time)()

    cap, note = read(f"{p}.neg.cores")           # before: 110 cores on an 80-core fleet
    assert cap is None and "below 0" in note
    cap, note = read(f"{p}.{{a,b}}.cores")        # before: 80 - 60 = 20, though 70 are in use
    assert cap is None and "sumSeries" in note
    assert read(f"sumSeries({p}.{{a,b}}.cores)") == (10.0, None)


# ------------------------------------------------------------------------------ the testbed run
def test_a_second_run_with_the_same_name_is_refused_not_replayed(tmp_path):
    from samm.testbed.deferrable.run import DeferrableRunOptions, run_deferrable

    out = tmp_path / "run"
    first = run_deferrable(DeferrableRunOptions(slots=2, slot_seconds=0.2, agent="fifo", seed=1, out_dir=str(out),
                                                run_name="same", warmup_s=0.3, workers=2))
    assert first.summary["decisions_created"] == 2
    before = (out / "queue.db").stat().st_mtime_ns
    # before the fix: tetris on seed 2 silently re-applied fifo's seed-1 decisions (0 created)
    with pytest.raises(ValueError, match="already holds 2 decision"):
        run_deferrable(DeferrableRunOptions(slots=2, slot_seconds=0.2, agent="tetris", seed=2, out_dir=str(out),
                                            run_name="same", warmup_s=0.3, workers=2))
    assert (out / "queue.db").stat().st_mtime_ns == before   # the first run's queue is kept


def test_worker_cores_below_the_widest_job_is_refused(tmp_path):
    from samm.testbed.deferrable.run import DeferrableRunOptions, run_deferrable

    with pytest.raises(ValueError, match="widest job"):
        run_deferrable(DeferrableRunOptions(slots=4, worker_cores=1, out_dir=str(tmp_path / "run")))


@pytest.mark.parametrize("args, says", [
    (["--request-timeout", "-1"], "--request-timeout"),
    (["--request-timeout", "nan"], "--request-timeout"),
    (["--worker-cores", "0"], "--worker-cores"),
    (["--agent-param", "eps=nan"], "finite"),
    (["--knowledge-url", "bogus://x"], "unsupported database"),
    (["--out", "{tmp}/file/sub"], "cannot write there"),
])
def test_bad_cli_values_are_clear_errors_without_traceback(tmp_path, args, says):
    from click.testing import CliRunner

    from samm.cli.deferrable import testbed_deferrable

    (tmp_path / "file").write_text("x")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if "--out" not in args:
        args += ["--out", str(tmp_path / "run")]
    res = CliRunner().invoke(testbed_deferrable, ["--slots", "1", "--slot-seconds", "0.1", "--agent", "tetris", *args])
    assert res.exit_code == 2, res.output
    assert says in res.output and isinstance(res.exception, SystemExit)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_at_a_slot_boundary_and_still_writes_the_report(tmp_path, sig):
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen([sys.executable, "-m", "samm.cli.main", "testbed-deferrable", "--slots", "60",
                          "--slot-seconds", "0.25", "--out", str(out), "--run-name", uuid.uuid4().hex[:6], "--json"],
                         cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (out / "workers.log").exists():
            time.sleep(0.1)
        time.sleep(2.5)   # a few slots
        p.send_signal(sig)
        stdout, stderr = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    # before the fix: click's "Aborted!" (exit 1) or killed by SIGTERM, no slots.csv and no summary.json
    assert p.returncode == 128 + sig, stderr.decode()[-2000:]
    assert b"Traceback" not in stderr and b"interrupted" in stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["interrupted"] and s["signal"] == sig.name and 1 <= s["slots"] < 60 and s["decisions"] == s["slots"]
    assert (out / "slots.csv").read_text().count("\n") == s["slots"] + 1
    assert json.loads(stdout)["slots"] == s["slots"]
