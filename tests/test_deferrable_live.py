"""The deferrable-jobs live path: the deadline guard, the queue's deferrable jobs (release once,
never leased unreleased), the scheduling loop's idempotency and failure handling, and a short
end-to-end run with real worker processes and a real SQLite queue
(agents/deferrable_jobs/live.py, samm/testbed/jobqueue.py, samm/testbed/deferrable/run.py)."""
from __future__ import annotations

import sqlite3
import time

import pytest

from agents.deferrable_jobs.data import make_episode
from agents.deferrable_jobs.live import (Answer, DeferrableLoop, HttpAgent, InProcessAgent, LoopParams, cut_episode,
                                         deadline_guard, simulate, slot_decision)
from agents.deferrable_jobs.policy import RulePolicy
from agents.deferrable_jobs.service import ScheduleRequest, WaitingJob
from samm.knowledge.store import KnowledgeStore
from samm.localproc import AppInThread, free_port
from samm.testbed import jobqueue
from samm.testbed.jobqueue import JobQueue


def job(i, cores, latest, earliest=0, submitted=0, duration=1):
    return WaitingJob(id=i, cores=cores, duration=duration, earliest=earliest, latest=latest, submitted=submitted)


class FixedAgent:
    """Answers the same ids every slot (or fails)."""
    name = "fixed"

    def __init__(self, start=(), error=None):
        self.start, self.error, self.calls = list(start), error, 0

    def ask(self, req):
        self.calls += 1
        if self.error:
            return Answer([], error=self.error)
        return Answer([i for i in self.start if any(str(j.id) == str(i) for j in req.eligible)])


# ------------------------------------------------------------------------------ the guard
def test_deadline_guard_starts_due_jobs_edf_skipping_misfits():
    eligible = [job(1, 4, latest=5, submitted=2), job(2, 2, latest=5, submitted=1), job(3, 8, latest=5),
                job(4, 1, latest=9), job(5, 1, latest=4), job(6, 2, latest=5, submitted=3)]
    # slot 5, 7 cores left: due = 5 (l=4), then l=5 by submission: 3 (sub 0, 8 cores: misfit), 2, 1, 6
    assert deadline_guard(eligible, chosen=[], slot=5, free=7) == [5, 2, 1]
    # a chosen job is not started twice; a job not yet at its latest start is left to the agent
    assert deadline_guard(eligible, chosen=[2], slot=5, free=7) == [5, 1, 6]
    assert deadline_guard(eligible, chosen=[], slot=5, free=0.5) == []
    assert 4 not in deadline_guard(eligible, chosen=[], slot=5, free=100)


def test_slot_decision_adds_guard_after_the_agent_and_refuses_bad_answers():
    req = ScheduleRequest(slot=3, capacity=6, eligible=[job(1, 2, latest=9), job(2, 3, latest=3), job(3, 2, latest=3)])
    d = slot_decision(req, FixedAgent([1]))
    assert d.chosen == [1] and d.deadline == [2] and d.free == 6  # 3 (2 cores) no longer fits 6 - 2 - 3
    assert slot_decision(req, FixedAgent([1]), guard=False).deadline == []
    bad = slot_decision(req, FixedAgent([1, 1]))  # twice: refused, nothing starts (not even the guard)
    assert bad.start == [] and bad.answer.error
    failed = slot_decision(req, FixedAgent(error="boom"))
    assert failed.start == [] and failed.answer.error == "boom"


# ------------------------------------------------------------------------------ the queue
def deferrable_rows(spec):
    """(id, cores, duration, earliest, latest, submit) -> submit_deferrable rows."""
    return [(i, c, d, e, l, s, d * 900.0, s * 900.0) for i, c, d, e, l, s in spec]


def test_queue_leases_a_deferrable_job_only_after_release_and_releases_once(tmp_path):
    q = JobQueue(tmp_path / "q.db")
    q.submit_many([(0, 1, 10.0, 0.0)])  # an ordinary job: today's FIFO leasing
    assert q.submit_deferrable(deferrable_rows([(1, 2, 2, 1, 3, 0), (2, 1, 1, 2, 2, 0), (3, 1, 1, 5, 6, 1)])) == 3
    got = q.lease("w", 16, time.time(), 5.0, 0.0, backfill=True)
    assert [j.id for j in got] == [0]  # pending deferrable jobs are invisible to workers
    snap = q.deferrable_at(1)
    assert [j.id for j in snap.eligible] == [1] and [j.id for j in snap.future] == [2, 3] and snap.running == []
    assert q.release([2], 1) == []  # outside its window
    assert q.release([1, 3], 1) == [1]
    assert q.release([1], 1) == [] and q.release([1], 2) == []  # never released twice
    snap = q.deferrable_at(2)
    assert [j.id for j in snap.running] == [1] and snap.running[0].remaining(2) == 1 and snap.running_cores == 2
    assert [j.id for j in q.lease("w2", 16, time.time(), 5.0, 900.0, backfill=True)] == [1]
    assert q.drop_expired(2) == [2]
    assert q.release([2], 2) == [] and q.drop_expired(2) == []
    assert q.deferrable_at(3).running == []  # 1 ran slots 1..2
    q.close()


def test_old_queue_file_gets_the_deferrable_columns(tmp_path):
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript(jobqueue._SCHEMA)  # the schema before deferrable jobs (unchanged text)
    db.execute("INSERT INTO jobs (id, cores, runtime_s, submitted_at, enqueued_at) VALUES (7, 1, 5, 0, 0)")
    db.commit()
    db.close()
    q = JobQueue(path)
    assert [j.id for j in q.lease("w", 4, time.time(), 5.0, 0.0)] == [7]
    assert q.submit_deferrable(deferrable_rows([(8, 1, 1, 0, 0, 0)])) == 1
    assert [j.id for j in q.deferrable_jobs()] == [8]
    q.close()
    JobQueue(path).close()  # opening again adds nothing twice


# ------------------------------------------------------------------------------ the loop
def test_replayed_slot_releases_nothing_new_and_keeps_one_decision(tmp_path):
    q = JobQueue(tmp_path / "q.db")
    q.submit_deferrable(deferrable_rows([(1, 2, 3, 0, 4, 0), (2, 2, 1, 0, 0, 0), (3, 1, 1, 0, 5, 0)]))
    store = KnowledgeStore(f"sqlite:///{tmp_path / 'k.db'}")
    agent = FixedAgent([1])
    loop = DeferrableLoop(q, agent, store, params=LoopParams(loop="deferrable-t"))
    first = loop.tick(0, 10)
    assert first.chosen == [1] and first.deadline == [2] and sorted(first.released) == [1, 2]
    assert first.decision_created
    # a crash after the decision: a new loop replays slot 0 from the store, asking nobody
    agent2 = FixedAgent([3])
    again = DeferrableLoop(q, agent2, store, params=LoopParams(loop="deferrable-t")).tick(0, 10)
    assert again.released == [] and not again.decision_created and agent2.calls == 0
    assert sorted(again.chosen + again.deadline) == [1, 2]
    assert len(store.decisions(loop="deferrable-t")) == 1
    d = store.decision("slot0", loop="deferrable-t")
    assert d.problem == "deferrable-jobs" and d.action["start"] == [1, 2] and "deadline" in d.reason
    assert [j.id for j in q.deferrable_at(1).running] == [1]  # 2 lasted one slot
    # a crash between the decision and the release: the replay releases what was decided
    real_release = q.release
    q.release = lambda ids, slot: (_ for _ in ()).throw(RuntimeError("crash"))
    with pytest.raises(RuntimeError):
        DeferrableLoop(q, FixedAgent([3]), store, params=LoopParams(loop="deferrable-t")).tick(1, 10)
    q.release = real_release
    replay = DeferrableLoop(q, FixedAgent([]), store, params=LoopParams(loop="deferrable-t")).tick(1, 10)
    assert replay.released == [3] and not replay.decision_created
    store.close()
    q.close()


def test_unreachable_service_releases_nothing_records_the_error_and_continues(tmp_path):
    q = JobQueue(tmp_path / "q.db")
    q.submit_deferrable(deferrable_rows([(1, 1, 1, 0, 3, 0), (2, 1, 1, 1, 1, 0)]))
    store = KnowledgeStore(f"sqlite:///{tmp_path / 'k.db'}")
    agent = HttpAgent(f"http://127.0.0.1:{free_port()}", "fifo", timeout_s=0.5)
    loop = DeferrableLoop(q, agent, store, params=LoopParams(loop="deferrable-down"))
    recs = [loop.tick(t, 10) for t in range(3)]
    assert all(r.released == [] and r.error and r.source == "fallback" for r in recs)
    assert recs[1].dropped == [2]  # no guard without an answer: the brief's "start nothing"
    ds = store.decisions(loop="deferrable-down")
    assert len(ds) == 3 and all(d.source == "fallback" and "failed" in d.reason for d in ds)
    assert all(j.released is None for j in q.deferrable_jobs())
    store.close()
    q.close()


def test_http_agent_answers_like_the_in_process_one():
    from agents.deferrable_jobs.service import create_app

    with AppInThread(create_app("fifo", RulePolicy("fifo", "tiny"))) as server:
        ep = cut_episode(make_episode("tiny", 1, "test"), 12)
        via_http, starts_http = simulate(ep, HttpAgent(server.url, "fifo"), guard=True)
        local, starts_local = simulate(ep, InProcessAgent(RulePolicy("fifo", "tiny")), guard=True)
        assert (starts_http == starts_local).all() and via_http.utilisation == local.utilisation


# ------------------------------------------------------------------------------ end to end
def test_live_run_end_to_end_on_tiny(tmp_path):
    from samm.testbed.deferrable.run import DeferrableRunOptions, run_deferrable

    opts = DeferrableRunOptions(setting="tiny", seed=0, slots=12, slot_seconds=0.5, agent="fifo", workers=3,
                                out_dir=str(tmp_path / "run"), run_name="e2e", warmup_s=0.8)
    res = run_deferrable(opts)
    s = res.summary
    ep = cut_episode(make_episode("tiny", 0, "test"), 12)
    jobs = {j.id: j for j in res.jobs}
    assert sorted(jobs) == list(range(ep.n_jobs))
    started = [j for j in jobs.values() if j.released is not None]
    assert started
    # every started job started (was released) inside its window, and ran exactly once
    assert all(j.earliest <= j.released <= j.latest for j in started)
    leases = [r.job_id for r in res.runs]
    assert sorted(leases) == sorted(j.id for j in started) and len(set(leases)) == len(leases)
    assert all(r.outcome == "done" for r in res.runs)
    # no job dropped while it could have fit at its latest start
    by_slot = {r.slot: r for r in res.records}
    for r in res.records:
        for jid, cores in zip(r.dropped, r.dropped_cores):
            assert jobs[jid].latest == r.slot and cores > r.free_after, (jid, r)
    # one decision per slot in the Knowledge store
    store = KnowledgeStore(res.knowledge_url)
    keys = [d.iteration_key for d in store.decisions(loop=res.loop)]
    store.close()
    assert sorted(keys) == sorted(f"slot{t}" for t in range(12)) and len(by_slot) == 12
    # the live run is the simulator's with the same agent and guard, job for job
    assert s["same_start_slots_as_sim_guarded"] == ep.n_jobs
    assert s["live"]["utilisation"] == s["sim_guarded"]["utilisation"]
    assert s["live_minus_sim_guarded"]["missed"] == 0 and s["live_minus_sim_guarded"]["violation_slots"] == 0
    # the agent alone differs only by what the guard rescued
    sim_plain, _ = simulate(ep, InProcessAgent(RulePolicy("fifo", "tiny")), guard=False)
    assert s["sim"]["utilisation"] == sim_plain.utilisation
    if s["live"]["deadline_rescued"] == 0:
        assert s["live"]["utilisation"] == s["sim"]["utilisation"]
    assert s["physical"]["completed"] == len(started) and s["physical"]["max_attempts"] == 1
    assert (res.out_dir / "summary.json").exists() and (res.out_dir / "slots.csv").read_text().count("\n") == 13
