"""Regressions for gaps of the deferrable-jobs live path and trainer left by earlier audits
(agents/deferrable_jobs/daemon_loop.py, live.py, service.py, train.py), on real components: the
daemon's loop over a real SQLite job queue and Knowledge store, the shipped OSDEC policy, the
real trainer."""
from __future__ import annotations

import sqlite3
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from agents.deferrable_jobs.daemon_loop import RELEASE_ATTEMPTS
from samm.daemon.build import build_daemon
from samm.testbed.jobqueue import JobQueue
from test_deferrable_daemon import SLOT_S, config as daemon_config


def rows(specs):
    """(id, cores, duration, earliest, latest, submit) -> submit_deferrable rows."""
    return [(i, c, d, e, lt, s, float(d), float(s)) for i, c, d, e, lt, s in specs]


def failing_release(loop, fails: dict):
    """The queue's own release, failing (as a locked or broken file does) while fails["n"] > 0."""
    real = loop.inner.q.release

    def release(ids, slot):
        if fails["n"] > 0:
            fails["n"] -= 1
            raise sqlite3.OperationalError("disk I/O error")
        return real(ids, slot)
    loop.inner.q.release = release


def at_slot(loop, k):
    loop.clock = lambda: k * SLOT_S + 1.0


def release_actions(store, slot):
    dec = store.decision(f"slot{slot}", loop="batch")
    return [(a.status, a.request["attempt"], a.request["released"]) for a in store.actions(dec.id)]


# ------------------------------------------------------------------ 1. a release failing after its record
def test_a_release_failing_after_its_record_is_retried_at_the_next_iteration(tmp_path):
    with JobQueue(tmp_path / "q.sqlite") as q:
        q.submit_deferrable(rows([(1, 4, 2, 0, 1, 0), (3, 2, 1, 1, 3, 0)]))
    d = build_daemon(daemon_config(tmp_path))
    try:
        loop = d.loops[0]
        failing_release(loop, {"n": 1})
        at_slot(loop, 0)
        with pytest.raises(sqlite3.OperationalError):   # the iteration fails (the runner logs it), as before
            loop.run_once()
        assert d.store.decision("slot0", loop="batch").action["start"] == [1]
        at_slot(loop, 1)
        rep1 = loop.run_once()      # the retry releases job 1 at slot 1 (before the fix: never), then slot 1
        assert any("released at slot 1: [1]" in r for r in rep1.reasons)
        assert rep1.actions[0]["target"] == [3]          # 4 (job 1, running) + 2 = the 6 cores
        assert release_actions(d.store, 0) == [("failed", 1, []), ("succeeded", 2, [1])]
        at_slot(loop, 2)
        loop.run_once()                        # nothing left to retry: no second release, no new action
        assert release_actions(d.store, 0) == [("failed", 1, []), ("succeeded", 2, [1])]
    finally:
        d.close()
    with JobQueue(tmp_path / "q.sqlite") as q:
        assert {j.id: j.released for j in q.deferrable_jobs()} == {1: 1, 3: 1}


def test_a_failing_release_is_retried_a_bounded_number_of_times_each_recorded(tmp_path, caplog):
    with JobQueue(tmp_path / "q.sqlite") as q:
        q.submit_deferrable(rows([(1, 4, 2, 0, 1, 0)]))
    d = build_daemon(daemon_config(tmp_path))
    try:
        loop = d.loops[0]
        fails = {"n": 99}
        failing_release(loop, fails)
        at_slot(loop, 0)
        for n in range(RELEASE_ATTEMPTS):   # replays of slot 0 (e.g. a misfire catch-up)
            with pytest.raises(sqlite3.OperationalError):
                loop.run_once()
            assert (loop.unreleased is None) == (n + 1 == RELEASE_ATTEMPTS)   # given up after the last
        assert release_actions(d.store, 0) == [("failed", n, []) for n in range(1, RELEASE_ATTEMPTS + 1)]
        assert "retried at the next iteration" in caplog.text and "given up" in caplog.text
        at_slot(loop, 1)
        fails["n"] = 0                                               # the queue works again
        rep = loop.run_once()
        # given up: slot 0's decision is not released late; job 1 is still eligible and slot 1 decides it
        assert not any("released at slot" in r for r in rep.reasons) and rep.actions[0]["target"] == [1]
        assert len(release_actions(d.store, 0)) == RELEASE_ATTEMPTS
    finally:
        d.close()


def test_a_retried_release_starts_only_what_still_fits_and_is_still_in_its_window(tmp_path):
    """Slot 0 decided jobs 1 (due at slot 0) and 2; at slot 1 job 1's window is closed (the queue
    refuses it) and the capacity fell to 4: job 2 (4 cores) is released, nothing beyond the cores."""
    with JobQueue(tmp_path / "q.sqlite") as q:
        q.submit_deferrable(rows([(1, 2, 1, 0, 0, 0), (2, 4, 2, 0, 2, 0), (4, 2, 1, 1, 2, 1)]))
    d = build_daemon(daemon_config(tmp_path))
    try:
        loop = d.loops[0]
        failing_release(loop, {"n": 1})
        at_slot(loop, 0)
        with pytest.raises(sqlite3.OperationalError):
            loop.run_once()
        assert d.store.decision("slot0", loop="batch").action["start"] == [1, 2]
        loop.capacity = lambda: (4.0, None)
        at_slot(loop, 1)
        rep = loop.run_once()
        assert any("released at slot 1: [2]" in r and "[1] no longer start" in r for r in rep.reasons)
        assert rep.actions[0]["target"] == [] and rep.features["running_cores"] == 4.0
        assert rep.features["violation"] == 0.0
    finally:
        d.close()
    with JobQueue(tmp_path / "q.sqlite") as q:
        jobs = {j.id: j for j in q.deferrable_jobs()}
    assert jobs[2].released == 1 and jobs[1].released is None and jobs[4].released is None


def test_a_release_failing_during_restart_recovery_is_retried_by_the_first_iteration(tmp_path):
    with JobQueue(tmp_path / "q.sqlite") as q:
        q.submit_deferrable(rows([(1, 4, 2, 0, 1, 0)]))
    d = build_daemon(daemon_config(tmp_path))
    try:
        loop = d.loops[0]
        failing_release(loop, {"n": 2})
        at_slot(loop, 0)
        with pytest.raises(sqlite3.OperationalError):
            loop.run_once()
    finally:
        d.close()
    d = build_daemon(daemon_config(tmp_path))        # a restart in slot 0; the queue still fails once
    try:
        loop = d.loops[0]
        failing_release(loop, {"n": 1})
        at_slot(loop, 0)
        notes = loop.recover()
        assert len(notes) == 1 and "retried at the next iteration" in notes[0]   # before: "recovery skipped"
        at_slot(loop, 1)
        rep = loop.run_once()
        assert any("released at slot 1: [1]" in r for r in rep.reasons)
    finally:
        d.close()
    with JobQueue(tmp_path / "q.sqlite") as q:
        assert [j.released for j in q.deferrable_jobs()] == [1]


# ------------------------------------------------------------------ 2. a restarted in-process agent's window
def _episode_rows(slots: int):
    from agents.deferrable_jobs.data import episodes

    ep = episodes("default", "test", 1, seed=1)[0]
    keep = [i for i in range(len(ep.cores)) if ep.submit[i] < slots]
    return [(i + 1, int(ep.cores[i]), int(ep.duration[i]), int(ep.earliest[i]), int(ep.latest[i]), int(ep.submit[i]),
             float(ep.duration[i]), float(ep.submit[i])) for i in keep]


def _osdec_run(path, jobs, slots: int, restart_at: int | None):
    """Slots 0..slots-1 of the daemon's loop with the shipped OSDEC policy in process; with
    `restart_at`, the daemon is stopped after slot restart_at - 1 and started again inside that
    slot (recover decides it). Returns each slot's recorded scores and starts."""
    path.mkdir()
    with JobQueue(path / "q.sqlite") as q:
        q.submit_deferrable(jobs)
    cfg = daemon_config(path, agent={"name": "osdec"}, capacity={"kind": "fixed", "cores": 40})
    d = build_daemon(cfg)
    try:
        for k in range(slots):
            at_slot(d.loops[0], k)
            if k == restart_at:
                d.close()
                d = build_daemon(cfg)
                at_slot(d.loops[0], k)
                d.loops[0].recover()
            else:
                d.loops[0].run_once()
        return [(x.probabilities, x.action["start"]) for x in d.store.decisions(loop="batch")]
    finally:
        d.close()


def test_a_restarted_in_process_agent_decides_as_an_uninterrupted_run(tmp_path):
    jobs = _episode_rows(14)
    straight = _osdec_run(tmp_path / "a", jobs, 14, None)
    restarted = _osdec_run(tmp_path / "b", jobs, 14, 9)
    assert len(straight) == len(restarted) == 14
    assert any(p for p, _ in straight[9:])                      # the policy scored jobs after the restart
    assert restarted == straight                                 # before the fix: other scores from slot 9 on


def test_a_restart_with_nothing_decided_yet_starts_an_empty_window(tmp_path):
    with JobQueue(tmp_path / "q.sqlite") as q:
        q.submit_deferrable(rows([(1, 4, 2, 0, 1, 0)]))
    d = build_daemon(daemon_config(tmp_path, agent={"name": "osdec"}))
    try:
        loop = d.loops[0]
        at_slot(loop, 3)
        assert loop.inner.rebuild_history(3) == 0
        assert not loop.inner.agent.history.buf.any()
    finally:
        d.close()


# ------------------------------------------------------------------ 3. the trainer's torch threads
TINY = dict(total_steps=32, n_envs=2, batch_size=32, minibatch=16, epochs=1, eval_every=1, eval_episodes=1)


def test_training_restores_the_callers_torch_thread_count():
    from agents.deferrable_jobs.osdec import OsdecConfig
    from agents.deferrable_jobs.train import train

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        train("tiny", OsdecConfig(**TINY), progress=False, threads=1)
        assert torch.get_num_threads() == 3          # before the fix: 1

        def stop(row):
            raise RuntimeError("stopped by the caller")
        with pytest.raises(RuntimeError, match="stopped by the caller"):
            train("tiny", OsdecConfig(**TINY), progress=False, threads=2, log_fn=stop)
        assert torch.get_num_threads() == 3          # before the fix: 2
    finally:
        torch.set_num_threads(before)


def test_training_leaves_the_callers_torch_random_stream_alone():
    from agents.deferrable_jobs.osdec import OsdecConfig
    from agents.deferrable_jobs.train import train

    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    model, _ = train("tiny", OsdecConfig(**TINY, seed=5), progress=False)
    assert torch.equal(torch.rand(3), expected)      # before the fix: the trainer's seed-5 stream
    again, _ = train("tiny", OsdecConfig(**TINY, seed=5), progress=False)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))


def test_train_cli_refuses_a_seed_torch_cannot_take_naming_the_flag(tmp_path, capsys):
    from agents.deferrable_jobs.train import main

    assert main(["--setting", "tiny", "--steps", "1", "--quiet", "--seed", str(2**64), "--out",
                 str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "--seed must be >= 0 and below 2**64" in err         # before: "Overflow when unpacking long long"
    assert not (tmp_path / "run").exists()                       # refused before anything is made


# ------------------------------------------------------------------ the daemon's HTTP agent
class _Fifo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"     # keep-alive, as `samm serve` (uvicorn) answers

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        body = b'{"start": [], "scores": {}, "policy_version": null}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def test_closing_the_daemon_closes_the_http_agents_connections(tmp_path):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Fifo)   # daemon threads: a kept-alive connection
    srv.daemon_threads = True                                # does not block shutdown
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with JobQueue(tmp_path / "q.sqlite") as q:
            q.submit_deferrable(rows([(1, 4, 2, 0, 1, 0)]))
        d = build_daemon(daemon_config(tmp_path, agent={"name": "fifo", "mode": "http",
                                                        "service_url": f"http://127.0.0.1:{srv.server_port}"}))
        loop = d.loops[0]
        at_slot(loop, 0)
        assert loop.run_once().actions[0]["error"] is None
        pools = loop.inner.agent.http.get_adapter("http://").poolmanager.pools
        assert len(pools) == 1
        d.close()
        assert len(pools) == 0                     # before the fix: the session's socket stayed open
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_policy_trained_on_other_slots_than_the_loops_interval_is_named(tmp_path, caplog):
    """The shipped OSDEC policy reads its day phase in 15-minute slots: a loop ticking every
    SLOT_S seconds decides on another day than the one it sees. Said once at start, not refused."""
    import logging

    with caplog.at_level(logging.WARNING, logger="agents.deferrable_jobs.daemon_loop"):
        build_daemon(daemon_config(tmp_path / "short", agent={"name": "osdec"})).close()
    said = [r.getMessage() for r in caplog.records if "slot" in r.getMessage()]
    assert len(said) == 1 and f"timing.interval_s is {SLOT_S:g} s" in said[0] and "15-minute slots" in said[0], said
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="agents.deferrable_jobs.daemon_loop"):
        build_daemon(daemon_config(tmp_path / "day", agent={"name": "osdec"}, timing={"interval_s": 900})).close()
        build_daemon(daemon_config(tmp_path / "fifo")).close()   # a rule has no slot length of its own
    assert not [r.getMessage() for r in caplog.records if "slot" in r.getMessage()]
