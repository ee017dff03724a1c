"""The deferrable-jobs loop inside the SAMM daemon: a `loops:` entry with `problem:
deferrable-jobs` is validated by the problem's own model and built through its ProblemSpec; each
iteration schedules one slot over a real SQLite job queue, records one decision per slot, never
releases a job twice, honours dry-run, and starts nothing (with the reason recorded) when the
capacity cannot be read."""
from __future__ import annotations

import pytest

from agents.deferrable_jobs.daemon_loop import DeferrableLoopConfig
from samm.config import SammConfig
from samm.daemon.build import build_daemon
from samm.localproc import free_port
from samm.testbed.jobqueue import JobQueue

SLOT_S = 10.0


def config(tmp_path, **loop):
    entry = {"name": "batch", "problem": "deferrable-jobs", "queue": {"path": str(tmp_path / "q.sqlite")},
             "capacity": {"kind": "fixed", "cores": 6}, "agent": {"name": "fifo"},
             "timing": {"interval_s": SLOT_S}}
    entry.update(loop)
    return SammConfig.model_validate({"loops": [entry], "knowledge": {"url": f"sqlite:///{tmp_path}/k.db"},
                                      "graphite": {"publish": False, "render_url": f"http://127.0.0.1:{free_port()}",
                                                   "timeout_s": 0.5}})


def submit(path):
    with JobQueue(path) as q:
        # (id, cores, duration slots, earliest, latest, submit slot, runtime_s, submitted_at)
        q.submit_deferrable([(1, 4, 2, 0, 1, 0, 1.0, 0.0),
                             (2, 4, 1, 0, 0, 0, 1.0, 0.0),     # must start at slot 0; FIFO picks job 1 first
                             (3, 2, 1, 1, 3, 0, 1.0, 0.0)])


def daemon_at(cfg, tmp_path):
    d = build_daemon(cfg)
    loop = d.loops[0]
    now = {"t": 0.0}
    loop.clock = lambda: now["t"]
    return d, loop, now


def test_loop_entries_are_validated_by_the_problems_model(tmp_path):
    cfg = config(tmp_path)
    (lp,) = cfg.control_loops()
    assert isinstance(lp, DeferrableLoopConfig) and lp.capacity.cores == 6
    with pytest.raises(ValueError, match="bogus"):
        config(tmp_path, bogus=1)
    with pytest.raises(ValueError, match="capacity.cores"):
        config(tmp_path, capacity={"kind": "fixed"})
    with pytest.raises(ValueError, match="did you mean 'deferrable-jobs'"):
        config(tmp_path, problem="deferrable-job")


def test_one_decision_per_slot_no_job_released_twice(tmp_path):
    cfg = config(tmp_path)
    submit(tmp_path / "q.sqlite")
    d, loop, now = daemon_at(cfg, tmp_path)
    try:
        rep = loop.run_once()                               # slot 0: free 6; FIFO: job 1 (4), then job 2 misfits
        assert rep.key == "slot0" and rep.decided
        # the deadline guard cannot save job 2 (4 cores, 2 left): it is dropped at the end of slot 0
        assert rep.actions[0]["target"] == [1]
        again = loop.run_once()                             # a replay of slot 0 (e.g. after a restart)
        assert not again.decided and again.actions[0]["target"] == []
        now["t"] = SLOT_S * 1.5                             # slot 1: job 1 still runs (4 of 6 cores)
        rep1 = loop.run_once()
        assert rep1.key == "slot1" and rep1.actions[0]["target"] == [3]
        decisions = d.store.decisions(loop="batch")
        assert [x.iteration_key for x in decisions] == ["slot0", "slot1"]
        assert decisions[0].problem == "deferrable-jobs" and decisions[0].action["start"] == [1]
        with JobQueue(tmp_path / "q.sqlite") as q:
            jobs = {j.id: j for j in q.deferrable_jobs()}
        assert (jobs[1].released, jobs[3].released) == (0, 1)
        assert jobs[2].released is None and jobs[2].state == "done"     # dropped, never started
    finally:
        d.close()


def test_dry_run_records_but_releases_nothing(tmp_path):
    cfg = config(tmp_path, executor={"kind": "jobqueue", "dry_run": True})
    submit(tmp_path / "q.sqlite")
    d, loop, _ = daemon_at(cfg, tmp_path)
    try:
        rep = loop.run_once()
        assert rep.actions[0]["target"] == []
        dec = d.store.decision("slot0", loop="batch")
        assert dec.action["start"] == [1] and "dry run" in dec.reason
        with JobQueue(tmp_path / "q.sqlite") as q:
            assert [j.id for j in q.deferrable_at(0).eligible] == [1, 2]
    finally:
        d.close()


def test_unreadable_capacity_starts_nothing_and_says_why(tmp_path):
    cfg = config(tmp_path, capacity={"kind": "graphite", "target": "ondemand.cores", "fleet_cores": 80})
    submit(tmp_path / "q.sqlite")
    d, loop, _ = daemon_at(cfg, tmp_path)
    try:
        rep = loop.run_once()                               # graphite-web is not listening on that port
        assert rep.status == "no-capacity" and rep.actions[0]["target"] == []
        dec = d.store.decision("slot0", loop="batch")
        assert dec.action["start"] == [] and "capacity unknown" in dec.reason
    finally:
        d.close()


def test_the_shipped_example_config_loads():
    from pathlib import Path

    from samm.config import load_config

    cfg = load_config(Path(__file__).resolve().parents[1] / "deploy" / "configs" / "deferrable-jobs.yaml")
    (lp,) = cfg.control_loops()
    assert lp.problem == "deferrable-jobs" and lp.capacity.kind == "graphite" and lp.timing.interval_s == 900
