"""Third audit of the emulated-cloud testbed: billing, the job queue, workers, driver
(samm/testbed/billing.py, jobqueue.py, worker.py, driver.py)."""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from samm.testbed.billing import GroupSpec, InstanceRecord, summarize
from samm.testbed.driver import Driver, QueuePublisher
from samm.testbed.jobqueue import JobQueue, JobRecord, RunRecord
from sim_bridge.workloads import Workload
from test_testbed_worker import ROOT, InThreadWorker, wait_until


def test_a_worker_that_re_leases_its_own_expired_job_does_not_leak_its_cores(tmp_path):
    # a worker stalled past its lease (an overloaded host, a long SQLite lock): its next poll
    # re-queues its own expired lease and, with spare cores, leases the same job again. The old
    # entry was overwritten but its cores stayed counted busy, forever: the 8-core worker kept
    # reporting 25 % CPU with no job, and had 2 cores less to lease from
    path = tmp_path / "q.db"
    t0 = time.time()
    with JobQueue(path) as q:
        q.set_clock(t0, 1.0)
        q.submit(0, 2, 1.0, 0.0)
        w = InThreadWorker(path, "A", 8, 1.0, t0, lease_s=5.0, report_every=0.1)
        try:
            wait_until(lambda: q.held("A") == {0: 1}, 10, "the first lease")
            db = sqlite3.connect(str(path), timeout=10)
            db.execute("UPDATE jobs SET lease_expires = 0 WHERE id = 0")  # the stall: the lease ran out
            db.commit()
            db.close()
            wait_until(lambda: q.held("A") == {0: 2}, 10, "the same worker leasing it again")
            wait_until(lambda: q.all_done(1), 10, "the job done")
            n = len(w.reports)
            wait_until(lambda: len(w.reports) >= n + 3, 10, "reports after the job")
        finally:
            w.close()
        assert w.reports[-1][0] == 0.0, w.reports[-3:]  # idle: no phantom busy cores
        assert w.stats.completed == 1 and w.stats.lost == 1
        assert [r.outcome for r in q.runs()] == ["requeued", "done"]


GROUPS = {"S": GroupSpec(cores=2, price_per_hour=0.2, max=10)}


def _job(i, submitted, state="done", wait=0.0, enq=None, start=None, fin=None, requeues=0):
    return JobRecord(i, 1, 10.0, 0.0, submitted, state, 1 if start is not None else 0, requeues, wait,
                     submitted if enq is None else enq, start, start, fin, "s1" if fin is not None else None)


def test_a_job_arriving_exactly_at_the_horizon_is_not_counted_as_waited_zero():
    # a partial run billed to 120 s: job 0 waited 60 s and ran; job 1 arrived at exactly 120, in
    # the next step. run_episodes leaves it out (arrival < horizon); the testbed counted it with
    # a 0 s wait, halving the mean wait (30 s instead of 60 s)
    inst = [InstanceRecord("S", "s1", started_wall=0.0)]
    jobs = [_job(0, 0.0, wait=60.0, start=60.0, fin=70.0), _job(1, 120.0, state="waiting")]
    runs = [RunRecord(0, 1, "s1", 1, 60.0, 70.0, "done")]
    s = summarize(inst, jobs, runs, GROUPS, compression=1.0, t0=0.0, step_s=60.0, end_s=120.0)
    assert s["mean_wait_s"] == 60.0 and s["p95_wait_s"] == 60.0
    assert s["wait_job_seconds"] == 60.0 and s["jobs_total"] == 2


def test_a_queue_file_that_is_not_a_database_is_one_clear_error_and_no_leaked_connection(tmp_path):
    path = tmp_path / "q.db"
    path.write_text("not a database " * 20)
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        with pytest.raises(ValueError, match="not a usable SQLite file"):
            JobQueue(path)
    assert len(os.listdir("/proc/self/fd")) == fds  # each failed open used to keep its descriptor
    assert path.read_text().startswith("not a database")  # left as it was


@pytest.mark.parametrize("queue", ["notdb", "file/q.db"])
def test_the_worker_cli_on_an_unusable_queue_path_is_one_line_not_a_traceback(tmp_path, queue):
    (tmp_path / "notdb").write_text("not a database " * 20)
    (tmp_path / "file").write_text("a file, not a folder")
    r = subprocess.run([sys.executable, "-m", "samm.testbed.worker", "--queue", str(tmp_path / queue), "--group", "g",
                        "--instance", "i", "--cores", "1", "--compression", "1", "--t0", "0"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "job queue" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize("t0, compression, says", [(0.0, float("inf"), "compression"), (0.0, float("nan"), "compression"),
                                                   (float("nan"), 10.0, "t0"), (float("inf"), 10.0, "t0")])
def test_the_queue_driver_and_publisher_refuse_a_clock_they_cannot_keep(tmp_path, t0, compression, says):
    # an infinite compression passed `not > 0`: re-queues released without a clock were dated at
    # infinity and their waits lost; a NaN t0 was "NOT NULL constraint failed: meta.value"
    with JobQueue(tmp_path / "q.db") as q:
        with pytest.raises(ValueError, match=says):
            q.set_clock(t0, compression)
        assert q.clock() is None  # nothing recorded
        wl = Workload("w", np.array([0.0]), np.array([4400.0]), np.array([1]), np.array([0.0]))
        with pytest.raises(ValueError, match=says):
            Driver(q, wl, compression, t0)
        with pytest.raises(ValueError, match=says):
            QueuePublisher(q, None, "samm", compression, t0, interval_s=1.0, every_s=1.0)


@pytest.mark.parametrize("name", ["interval_s", "every_s"])
def test_the_publisher_refuses_an_infinite_interval(tmp_path, name):
    kw = {"interval_s": 1.0, "every_s": 1.0, name: float("inf")}
    with JobQueue(tmp_path / "q.db") as q:
        with pytest.raises(ValueError, match=name):
            QueuePublisher(q, None, "samm", 10.0, 0.0, **kw)


def test_a_describe_that_outlives_stop_starts_no_worker(tmp_path):
    # moto slow to answer the first describe (a loaded 2-core host) past stop()'s 10 s join: the
    # answer then arrived, the initial fleet got workers after stop(), and nothing ever stopped them
    from samm.execute.moto_server import MotoServer, create_paper_asgs
    from samm.testbed.reconciler import Reconciler

    names = ("tb-third-s",)
    procs: list[subprocess.Popen] = []
    entered, release = threading.Event(), threading.Event()

    def spawn(group, iid, cores):
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        procs.append(p)
        return p

    def slow_describe(**_):  # botocore's own hook on the real client: the request then goes to moto
        entered.set()
        release.wait(30)

    with MotoServer() as moto:
        moto.reset()
        create_paper_asgs(endpoint_url=moto.endpoint_url, names=names, instance_types=("m5a.large",),
                          min=(1,), max=3, desired=1)
        asg = moto.client("autoscaling")
        asg.meta.events.register("before-send.auto-scaling.DescribeAutoScalingGroups", slow_describe)
        rec = Reconciler(asg, {names[0]: ("S", 2)}, spawn, compression=1e4, poll_s=0.05)
        rec.start()
        try:
            assert entered.wait(20)
            rec.stop()
            release.set()
            rec._thread.join(20)
            assert not rec._thread.is_alive()
            assert procs == [] and all(v.stopped_wall is not None for v in rec.vms.values()), (procs, rec.vms)
        finally:
            release.set()
            for p in procs:
                p.kill()
                p.wait(10)


@pytest.mark.parametrize("length", ["abc", "-1"])
def test_the_aws_proxy_answers_400_to_a_bad_content_length(length, capfd):
    import http.client

    from samm.testbed.aws_proxy import AwsFaultProxy

    with AwsFaultProxy("http://127.0.0.1:9") as proxy:  # never forwarded: nothing listens there
        host, port = proxy.endpoint_url.rsplit("/", 1)[1].split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        conn.putrequest("POST", "/")
        conn.putheader("Content-Length", length)
        conn.endheaders()
        resp = conn.getresponse()
        assert resp.status == 400 and b"Content-Length" in resp.read()
        conn.close()
        assert proxy.snapshot() == {}  # not counted as an action
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), -1.0])
def test_the_queue_refuses_a_busy_timeout_it_cannot_use(tmp_path, timeout):
    with pytest.raises(ValueError, match="busy_timeout_s must be a finite number"):
        JobQueue(tmp_path / "q.db", busy_timeout_s=timeout)
    assert not (tmp_path / "q.db").exists()  # nothing created
