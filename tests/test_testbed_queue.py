"""The testbed's durable job queue (samm/testbed/jobqueue.py) and billing (billing.py)."""
from __future__ import annotations

import multiprocessing as mp
import random
import sqlite3
import time

import pytest

from samm.testbed.billing import GroupSpec, InstanceRecord, summarize
from samm.testbed.jobqueue import JobQueue, JobRecord, RunRecord


@pytest.fixture
def q(tmp_path):
    queue = JobQueue(tmp_path / "q.db")
    yield queue
    queue.close()


def test_submit_is_idempotent_and_counted(q):
    assert q.submit(0, 1, 360.0, 10.0)
    assert not q.submit(0, 4, 999.0, 99.0)  # same id: ignored, the first stays
    assert q.submit_many([(1, 2, 5.0, 20.0, 1.5), (2, 1, 5.0, 20.0), (1, 1, 1.0, 1.0)]) == 2
    recs = {r.id: r for r in q.stats()}
    assert (recs[0].cores, recs[0].runtime_s, recs[0].submitted_at) == (1, 360.0, 10.0)
    assert recs[1].ram_gb == 1.5
    c = q.counters(clock_now=30.0, interval_start=15.0)
    assert (c.submitted_total, c.waiting, c.running, c.completed_total, c.waiting_submitted_this_minute) == (3, 3, 0, 0, 2)


def test_bad_input_is_refused_with_a_clear_error(q, tmp_path):
    with pytest.raises(ValueError, match="cores >= 1"):
        q.submit(5, 0, 1.0, 0.0)
    with pytest.raises(ValueError, match="directory"):
        JobQueue(tmp_path)
    with pytest.raises(ValueError, match="lease_s"):
        q.submit(6, 1, 1.0, 0.0)
        q.lease("w", 1, 0.0, 0.0, 0.0)


def test_lease_is_fifo_head_of_line_like_the_simulator(q):
    q.submit_many([(0, 1, 5.0, 0.0), (1, 4, 5.0, 1.0), (2, 1, 5.0, 2.0)])
    # 2 free cores: job 0 fits, job 1 (4 cores) blocks the line, so job 2 is not taken
    got = q.lease("small", 2, now_wall=100.0, lease_s=10.0, clock_now=3.0)
    assert [j.id for j in got] == [0]
    assert q.lease("small", 1, 100.0, 10.0, 3.0) == []
    # a worker with room takes the head, then the rest in order
    assert [j.id for j in q.lease("big", 8, 100.0, 10.0, 4.0)] == [1, 2]
    q.submit_many([(3, 4, 5.0, 5.0), (4, 1, 5.0, 5.0)])
    assert [j.id for j in q.lease("bf", 2, 100.0, 10.0, 6.0, backfill=True)] == [4]
    c = q.counters(6.0, 0.0)
    assert (c.waiting, c.running) == (1, 4)
    recs = {r.id: r for r in q.stats()}
    assert recs[1].wait_s == pytest.approx(3.0)  # submitted at 1, started at 4


def test_late_completion_after_requeue_is_ignored(q):
    q.set_clock(t0=1000.0, compression=10.0)
    q.submit(7, 1, 50.0, submitted_at=0.0)
    (a,) = q.lease("A", 1, now_wall=1001.0, lease_s=2.0, clock_now=10.0)
    assert q.heartbeat("A", 1002.0, 2.0) == 1  # lease now ends at 1004
    assert q.requeue_expired(1003.0) == 0
    assert q.requeue_expired(1005.0) == 1  # A went silent: waiting again since its lease expired (wall 1004 = 40)
    assert q.counters(50.0, 0.0).waiting == 1
    (b,) = q.lease("B", 1, 1006.0, 2.0, clock_now=60.0)
    assert (a.attempt, b.attempt) == (1, 2)
    assert not q.complete(7, "A", 70.0, attempt=a.attempt)  # A's late finish: ignored
    assert q.complete(7, "B", 110.0, attempt=b.attempt)
    assert not q.complete(7, "B", 111.0)  # a second completion: ignored
    (r,) = q.stats()
    assert (r.state, r.completed_by, r.attempts, r.requeues, r.finished_at) == ("done", "B", 2, 1, 110.0)
    assert r.first_started_at == 10.0 and r.started_at == 60.0
    assert r.wait_s == pytest.approx(10.0 + 20.0)  # 0->10 before the first start, 40->60 after the lease was lost
    assert [(x.worker_id, x.outcome, x.started_at, x.ended_at) for x in q.runs()] == [
        ("A", "requeued", 10.0, 40.0), ("B", "done", 60.0, 110.0)]
    assert q.all_done(expected=1) and not q.all_done(expected=2)


def test_release_worker_requeues_at_once_and_stale_token_is_refused(q):
    q.submit_many([(0, 1, 5.0, 0.0), (1, 1, 5.0, 0.0), (2, 1, 5.0, 0.0)])
    first = q.lease("W", 2, 10.0, 60.0, 1.0)
    assert q.release_worker("W", now_wall=11.0, clock_now=2.0) == 2
    assert q.held("W") == {}
    # the same instance id leases again (a restarted worker): the old attempt's finish is stale
    again = q.lease("W", 1, 12.0, 60.0, 3.0)
    assert again[0].id == first[0].id and again[0].attempt == 2
    assert not q.complete(first[0].id, "W", 4.0, attempt=first[0].attempt)
    assert q.complete(first[0].id, "W", 4.0, attempt=again[0].attempt)


def _hammer(path: str, worker: str, seed: int, out, start) -> None:
    rng = random.Random(seed)
    q = JobQueue(path)
    mine = []
    idle = 0
    start.wait(30)  # all workers begin together, or the first one started could drain the queue alone
    while idle < 20:
        got = q.lease(worker, rng.randint(1, 4), now_wall=0.0, lease_s=1e9, clock_now=0.0)
        idle = 0 if got else idle + 1
        for j in got:
            mine.append(j.id)
            assert q.complete(j.id, worker, 1.0, attempt=j.attempt)
        if got:
            time.sleep(0.002)  # a job takes time: the others get their turns
    q.close()
    out.put((worker, mine))


def test_concurrent_processes_never_double_lease(tmp_path):
    path = str(tmp_path / "q.db")
    q = JobQueue(path)
    q.submit_many((i, 1, 1.0, 0.0) for i in range(400))
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    start = ctx.Barrier(6)
    procs = [ctx.Process(target=_hammer, args=(path, f"w{k}", k, out, start)) for k in range(6)]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(10)
        assert p.exitcode == 0
    taken = [i for _, ids in results for i in ids]
    assert sorted(taken) == list(range(400))  # each job leased exactly once across processes
    assert sum(1 for _, ids in results if ids) >= 2  # really concurrent
    recs = q.stats()
    assert all(r.state == "done" and r.attempts == 1 for r in recs)
    owner = {i: w for w, ids in results for i in ids}
    assert all(r.completed_by == owner[r.id] for r in recs)
    assert len(q.runs()) == 400
    q.close()


def test_queue_file_survives_reopen(tmp_path):
    path = tmp_path / "q.db"
    with JobQueue(path) as q:
        q.submit(1, 1, 1.0, 0.0)
        q.lease("A", 1, 0.0, 5.0, 0.0)
    with JobQueue(path) as q:
        assert q.held("A") == {1: 1}
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_billing_matches_a_hand_computation():
    # compression 10, t0 = 1000: wall 1000 + x is workload 10x
    groups = {"S": GroupSpec(cores=2, price_per_hour=0.2, max=10), "L": GroupSpec(cores=8, price_per_hour=0.8, max=10)}
    inst = [
        InstanceRecord("S", "s1", started_wall=990.0),  # initial fleet: billed from workload 0
        InstanceRecord("L", "l1", started_wall=1003.0, ready_wall=1006.0, stopped_wall=1015.0),  # 30..150, ready 60
    ]
    # job 2 ran on l1 from 70, lost its run when l1 went at 150, waited again until 160 on s1
    jobs = [JobRecord(0, 1, 100.0, 0.5, 0.0, "done", 1, 0, 0.0, 0.0, 0.0, 0.0, 100.0, "s1"),
            JobRecord(1, 1, 50.0, 0.5, 10.0, "done", 1, 0, 50.0, 10.0, 60.0, 60.0, 110.0, "l1"),
            JobRecord(2, 1, 10.0, 0.5, 20.0, "done", 2, 1, 50.0 + 10.0, 150.0, 70.0, 160.0, 170.0, "s1")]
    runs = [RunRecord(0, 1, "s1", 1, 0.0, 100.0, "done"), RunRecord(1, 1, "l1", 1, 60.0, 110.0, "done"),
            RunRecord(2, 1, "l1", 1, 70.0, 150.0, "requeued"), RunRecord(2, 2, "s1", 1, 160.0, 170.0, "done")]
    s = summarize(inst, jobs, runs, groups, compression=10.0, t0=1000.0, step_s=60.0)
    # horizon: makespan 170 -> 3 whole steps -> 180 s
    assert s["steps"] == 3 and s["horizon_s"] == 180.0 and s["makespan_s"] == 170.0 and s["terminated"]
    vm = 180 * 0.2 / 3600 + 120 * 0.8 / 3600
    assert s["vm_cost"] == pytest.approx(vm, abs=1e-6)
    assert s["vm_seconds"] == {"L": 120.0, "S": 180.0}
    assert s["wait_penalty"] == pytest.approx(1e-5 * 110.0, abs=1e-9)
    assert s["total_cost"] == pytest.approx(vm + 1e-5 * 110.0, abs=1e-6)
    assert s["mean_wait_s"] == pytest.approx(110 / 3, abs=1e-3) and s["jobs_requeued"] == 1
    # allocated at the step ends 60, 120, 180: S (2) always, L (8) at 60 and 120 (gone at 150)
    assert s["mean_allocated_cores"] == pytest.approx((10 + 10 + 2) / 3, abs=1e-3)
    assert s["mean_allocated_ratio"] == pytest.approx((10 + 10 + 2) / 3 / 100, abs=1e-4)
    assert s["mean_allocated_cores_tw"] == pytest.approx((180 * 2 + 120 * 8) / 180, abs=1e-3)
    # [0,60]: s1 1 of 2 cores, l1 ready exactly at 60 (no running part: 0) -> 0.25
    # [60,120]: s1 40 core-s of 120; l1 50 + 50 core-s of 480
    # [120,180]: s1 10 core-s of 120; l1 gone
    cpu = (0.25 + (40 / 120 + 100 / 480) / 2 + 10 / 120) / 3
    assert s["mean_cpu_util"] == pytest.approx(cpu, abs=1e-4)
    assert s["busy_core_ratio"] == pytest.approx((100 + 50 + 80 + 10) / (180 * 2 + 120 * 8), abs=1e-4)


def test_billing_refuses_unknown_groups_and_unfinished_runs_without_horizon():
    groups = {"S": GroupSpec(2, 0.2)}
    with pytest.raises(ValueError, match="M"):
        summarize([InstanceRecord("M", "m1", 0.0)], [], [], groups, 10.0, 0.0, end_s=60.0)
    waiting = [JobRecord(0, 1, 5.0, 0.0, 10.0, "waiting", 0, 0, 0.0, 10.0, None, None, None, None)]
    with pytest.raises(ValueError, match="end_s"):
        summarize([], waiting, [], groups, 10.0, 0.0)
    s = summarize([InstanceRecord("S", "s1", 0.0)], waiting, [], groups, 10.0, 0.0, end_s=60.0)
    assert s["wait_penalty"] == pytest.approx(50 * 1e-5) and not s["terminated"]


@pytest.mark.parametrize("lease_s", [float("nan"), float("inf")])
def test_a_lease_that_could_never_expire_is_refused(q, lease_s):
    """A NaN expiry is stored as NULL and an infinite one never comes: the jobs of a worker that
    then dies would never be re-queued (lost)."""
    q.submit(1, 1, 10.0, 0.0)
    with pytest.raises(ValueError, match="lease_s"):
        q.lease("w", 1, 100.0, lease_s, 0.0)
    (job,) = q.lease("w", 1, 100.0, 5.0, 0.0)
    with pytest.raises(ValueError, match="lease_s"):
        q.heartbeat("w", 101.0, lease_s)
    assert q.requeue_expired(200.0, clock_now=1.0) == 1     # the 5 s lease still expires
