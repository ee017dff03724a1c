"""Regressions from a second audit of the deferrable-jobs testbed and live path
(samm/testbed/deferrable/run.py, agents/deferrable_jobs/{live,daemon_loop}.py), on real
components: worker processes, SQLite job queues held by another connection, a real Graphite."""
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
from pathlib import Path

import pytest

from agents.deferrable_jobs.live import Answer, DeferrableLoop, LoopParams
from samm.testbed.jobqueue import JobQueue

ROOT = Path(__file__).resolve().parents[1]


def rows(specs):
    """(id, cores, duration, earliest, latest, submit) -> submit_deferrable rows."""
    return [(i, c, d, e, lt, s, float(d), float(s)) for i, c, d, e, lt, s in specs]


class FixedAgent:
    name = "fixed"

    def __init__(self, start=()):
        self.start = list(start)

    def ask(self, req):
        return Answer([i for i in self.start if any(str(j.id) == str(i) for j in req.eligible)])


def workers_alive(run: str) -> list[str]:
    """Command lines of live worker processes of run `run` (their --instance is <run>-w<i>)."""
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True).stdout
    return [line for line in ps.splitlines() if "samm.testbed.worker" in line and f"{run}-w" in line]


# ------------------------------------------------------------------------------ the testbed run
# In the child: once run_deferrable's handler is installed (the workers are being spawned), SIGTERM
# itself. No race with the handler's installation, and a test process never signals itself.
_SIGNAL_WHILE_SPAWNING = """
import json, os, signal, sys, threading, time
from samm.testbed.deferrable.run import DeferrableRunOptions, run_deferrable

def kill_once_handled():
    while signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        time.sleep(0.001)
    os.kill(os.getpid(), signal.SIGTERM)

threading.Thread(target=kill_once_handled, daemon=True).start()
res = run_deferrable(DeferrableRunOptions(slots=3, slot_seconds=0.2, agent="fifo", workers=int(sys.argv[2]),
                                          out_dir=sys.argv[1], run_name=sys.argv[3], warmup_s=30.0))
print(json.dumps(res.summary))
"""


def test_a_signal_while_the_workers_spawn_starts_no_more_of_them(tmp_path):
    run, workers = "sp" + uuid.uuid4().hex[:6], 60
    p = subprocess.run([sys.executable, "-c", _SIGNAL_WHILE_SPAWNING, str(tmp_path / "run"), str(workers), run],
                       cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    s = json.loads(p.stdout)
    assert s["interrupted"] and s["signal"] == "SIGTERM" and s["slots"] == 0
    # before the fix: all 60 workers were started (and only then stopped) after the signal
    assert s["physical"]["workers_started"] < workers
    assert workers_alive(run) == []


# In the child: SIGTERM arrives while the finished run compares itself with the simulator (the
# report phase, which takes seconds with osdec on a long episode); the simulator itself is real.
_SIGNAL_WHILE_REPORTING = """
import json, os, signal, sys
import samm.testbed.deferrable.run as run_mod
from samm.testbed.deferrable.run import DeferrableRunOptions, run_deferrable

real_simulate, signalled = run_mod.simulate, []

def simulate_after_a_signal(*args, **kw):
    if not signalled:
        signalled.append(os.kill(os.getpid(), signal.SIGTERM))
    return real_simulate(*args, **kw)

run_mod.simulate = simulate_after_a_signal
res = run_deferrable(DeferrableRunOptions(slots=3, slot_seconds=0.2, agent="fifo", workers=1, out_dir=sys.argv[1],
                                          run_name=sys.argv[2], warmup_s=0.3))
print(json.dumps(res.summary))
"""


def test_a_signal_while_the_report_is_written_still_writes_it(tmp_path):
    out, run = tmp_path / "run", "rp" + uuid.uuid4().hex[:6]
    p = subprocess.run([sys.executable, "-c", _SIGNAL_WHILE_REPORTING, str(out), run], cwd=ROOT,
                       env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, timeout=120)
    # before the fix: killed by the SIGTERM (the handler was gone), no slots.csv, no summary.json
    assert p.returncode == 0, (p.returncode, p.stderr.decode()[-2000:])
    s = json.loads((out / "summary.json").read_text())
    assert s["slots"] == 3 and not s["interrupted"] and s["decisions"] == 3
    assert (out / "slots.csv").read_text().count("\n") == 4
    assert workers_alive(run) == []


def _hold_the_queue(qpath: Path, ready: Path, hold_s: float, held: threading.Event) -> None:
    """Another connection's write transaction on the queue, from when the run has created it."""
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    db = sqlite3.connect(str(qpath), timeout=30, isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")
        held.set()
        time.sleep(hold_s)
        db.execute("ROLLBACK")
    finally:
        db.close()


def test_a_queue_locked_past_its_busy_timeout_is_retried_not_the_end_of_the_run(tmp_path, caplog):
    from samm.testbed.deferrable.run import DeferrableRunOptions, run_deferrable

    out = tmp_path / "run"
    out.mkdir()
    held = threading.Event()
    # workers.log is opened right after the queue is created: lock it from then, over the first slots
    locker = threading.Thread(target=_hold_the_queue, args=(out / "queue.db", out / "workers.log", 2.5, held),
                              daemon=True)
    locker.start()
    res = run_deferrable(DeferrableRunOptions(slots=4, slot_seconds=0.3, agent="fifo", seed=1, out_dir=str(out),
                                              run_name=uuid.uuid4().hex[:6], warmup_s=0.5, workers=1,
                                              queue_busy_timeout_s=0.2))
    locker.join(timeout=30)
    assert held.is_set()
    # before the fix: sqlite3.OperationalError "database is locked" out of the run, no report at all
    s = json.loads((out / "summary.json").read_text())
    assert not s["interrupted"] and s["slots"] == 4 and s["decisions"] == 4
    assert [r.slot for r in res.records] == [0, 1, 2, 3]
    assert "job queue unavailable" in caplog.text


# ------------------------------------------------------------------------------ the loop's counters
@pytest.mark.graphite
def test_the_loop_name_is_one_graphite_path_component(tmp_path, graphite, graphite_prefix):
    from fixtures_graphite import wait_for_points

    from samm.monitor.graphite_client import GraphiteSender

    sender = GraphiteSender(graphite.carbon_host, graphite.carbon_port)
    try:
        with JobQueue(tmp_path / "q.db") as q:
            q.submit_deferrable(rows([(1, 2, 1, 0, 3, 0)]))
            loop = DeferrableLoop(q, FixedAgent([1]), None, sender, LoopParams(loop="run.a b", prefix=graphite_prefix))
            rec = loop.tick(0, 4.0)
        assert rec.released == [1]
    finally:
        sender.close()
    now = int(time.time())
    # before the fix: "<prefix>.deferrable.run.a b.released": a level too many, and carbon refused the line
    series = wait_for_points(graphite.render_url, [f"{graphite_prefix}.deferrable.run_a_b.released"], now - 120,
                             now + 60)
    assert [v for v, _ in series[0].values() if v is not None] == [1.0]


# ------------------------------------------------------------------------------ the daemon's loop
def test_an_http_call_that_may_outlast_the_slot_is_a_config_error(tmp_path):
    sys.path.insert(0, str(ROOT / "tests"))
    from test_deferrable_daemon import config

    http = {"name": "fifo", "mode": "http", "service_url": "http://127.0.0.1:9"}
    # before the fix: accepted; a slow service (2.5 s answers, 1 s slots) had the scheduler skip two
    # slots of every three ("maximum number of running instances reached"), their due jobs unguarded
    with pytest.raises(ValueError, match=r"agent.timeout_s \(5 s\) must be below timing.interval_s \(1 s"):
        config(tmp_path, agent={**http, "timeout_s": 5}, timing={"interval_s": 1})
    (lp,) = config(tmp_path, agent={**http, "timeout_s": 0.5}, timing={"interval_s": 1}).control_loops()
    assert lp.agent.timeout_s == 0.5
    # in process there is no call timeout to compare
    config(tmp_path, agent={"name": "fifo", "timeout_s": 5}, timing={"interval_s": 1})
