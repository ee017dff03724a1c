"""`samm testbed-deferrable`: one live replay of a deferrable-jobs episode, end to end.

    Episode (data.make_episode, cut to `slots`)
      │ driver: at slot k, submit the jobs with submission slot k ('pending' in the queue)
      ▼
    SQLite JobQueue ◄── scheduling loop (live.DeferrableLoop), one tick per slot:
      │                   C_t = episode.capacity[t] (on-demand use = fleet - C_t, accounting only),
      │                   asks the hosted agent (in process or a `samm serve` URL), deadline guard,
      │                   one decision per slot in the KnowledgeStore, releases the jobs
      ▼
    N worker processes (samm/testbed/worker.py, unchanged): lease RELEASED jobs only, burn CPU
    for duration x slot_seconds wall seconds, complete them

Time: slot k is the wall interval [t0 + k*S, t0 + (k+1)*S) with S = `slot_seconds`; the queue's
workload clock is compressed so that one slot is the setting's slot length (15 min = 900 s of
workload time). The loop's accounting is the simulator's (a released job holds its cores for its
duration in slots); the workers' real start is measured beside it (start lag, attempts).

The summary compares the live run with the simulator on the same (cut) episode and agent:
`sim` is the agent alone (sim.run_episode semantics), `sim_guarded` the agent plus the same
deadline guard, which is what the live loop does: live and `sim_guarded` should agree job for
job; `sim` differs only where the guard fired (and where a call failed).

Outputs under `out_dir`: slots.csv (one row per slot), summary.json, queue.db, workers.log and
knowledge.db (unless another Knowledge URL is given).
"""
from __future__ import annotations

import csv
import json
import logging
import math
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from agents.deferrable_jobs.data import make_episode
from agents.deferrable_jobs.live import (DeferrableLoop, HttpAgent, InProcessAgent, LoopParams, cut_episode,
                                         live_result, simulate)
from agents.deferrable_jobs.settings import get_setting
from agents.deferrable_jobs.sim import EpisodeResult

log = logging.getLogger(__name__)


@dataclass
class DeferrableRunOptions:
    """Not in the paper: testbed choices."""
    setting: str = "tiny"
    seed: int = 0
    split: str = "test"
    slots: int | None = None          # None: the whole episode
    slot_seconds: float = 0.5         # wall seconds per slot
    agent: str = "fifo"               # fifo | tetris | osdec | any heuristic of baselines.RULES
    policy_dir: str | None = None     # a saved OSDEC policy (default: the shipped one)
    agent_params: dict = field(default_factory=dict)
    service_url: str | None = None    # a `samm serve`; None: the agent runs in this process
    request_timeout_s: float = 2.0
    workers: int = 3
    worker_cores: int | None = None   # None: max(ceil(fleet / workers), widest job)
    knowledge_url: str | None = None  # None: sqlite under out_dir
    graphite: str | None = None       # carbon HOST:PORT for the per-slot counters
    out_dir: str = "deferrable-run"
    run_name: str | None = None       # the Knowledge loop is deferrable-<run>
    warmup_s: float = 1.0             # workers start this long before slot 0
    drain: bool = True                # after the last slot, wait for the released jobs to finish
    duty: float = 0.005               # host-core share a worker burns per held core
    guard: bool = True
    queue_busy_timeout_s: float = 30.0  # how long a queue call waits for another connection's write


@dataclass
class DeferrableRunResult:
    summary: dict
    records: list
    jobs: list                        # the queue's DeferrableJob records at the end
    runs: list                        # the queue's RunRecords (one per lease)
    out_dir: Path
    loop: str
    knowledge_url: str
    files: dict = field(default_factory=dict)


def _make_agent(o: DeferrableRunOptions, session_tag: str):
    if o.service_url:
        return HttpAgent(o.service_url, o.agent, timeout_s=o.request_timeout_s)
    from agents.deferrable_jobs.hosting import make_policy
    from agents.deferrable_jobs.policy import KIND

    params = dict(o.agent_params)
    if o.agent != KIND:
        params.setdefault("setting", o.setting)
    return InProcessAgent(make_policy(o.agent, o.policy_dir, **params), name=o.agent)


def _sleep_until(t: float, stop=lambda: False) -> None:
    while (left := t - time.time()) > 0 and not stop():
        time.sleep(min(left, 0.05))


def _play_slot(queue, loop: DeferrableLoop, k: int, rows: list, capacity: float, stop) -> bool:
    """Submit slot k's jobs and tick the slot. A queue locked past its busy timeout (another
    connection's long transaction) is retried, not the end of the run: both steps are idempotent
    (existing ids are left alone; a retried tick finds the slot's recorded decision and the queue
    releases a job at most once). Any other queue error (a broken file) still ends the run. False
    when a signal stopped the retries."""
    while True:
        try:
            queue.submit_deferrable(rows)
            loop.tick(k, capacity)
            return True
        except sqlite3.OperationalError as e:
            if getattr(e, "sqlite_errorcode", sqlite3.SQLITE_BUSY) & 0xFF not in (sqlite3.SQLITE_BUSY,
                                                                               sqlite3.SQLITE_LOCKED):
                raise
            log.warning("slot %d: job queue unavailable (%s); retrying the slot", k, e)
            if stop():
                return False
            time.sleep(0.05)


class _Interrupt:
    """SIGINT (Ctrl-C) or SIGTERM stops the run at the next slot boundary, never inside a slot
    (between a decision's record and its release), and the run still writes its report; a second
    signal stops at once. Outside the main thread no handler can be installed: neither is caught."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.requested = False
        self.signal: str | None = None
        self.old: dict = {}

    def __enter__(self):
        import threading

        if threading.current_thread() is threading.main_thread():
            self.old = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self.signal = signal.Signals(signum).name
        log.warning("%s: stopping after this slot and writing the report (again to stop at once)", self.signal)

    def __exit__(self, *exc):
        for s, old in self.old.items():
            signal.signal(s, old)
        self.old = {}


def _check_worker_numbers(o: DeferrableRunOptions) -> None:
    """The numbers every worker process is started with, checked before anything starts: a duty
    outside [0, 1] made each worker exit at start-up (said only in workers.log) and the run replayed
    every slot with no job ever running; a NaN warm-up failed on the queue's clock, naming t0."""
    from samm.testbed.options import number_problem

    problem = number_problem("warmup_s", o.warmup_s) or number_problem("duty", o.duty)
    if problem is None and o.duty > 1:
        problem = f"duty must be a share of a host core in [0, 1], got {o.duty!r}"
    if problem:
        raise ValueError(problem)


def run_deferrable(o: DeferrableRunOptions) -> DeferrableRunResult:
    from samm.knowledge.engine import sqlite_url
    from samm.knowledge.store import KnowledgeStore
    from samm.localproc import popen_tied
    from samm.testbed.jobqueue import JobQueue

    if not 0 < o.slot_seconds < float("inf") or o.workers < 1:
        raise ValueError(f"slot_seconds must be a finite number > 0 and workers >= 1 (got {o.slot_seconds!r}, "
                         f"{o.workers!r})")
    if o.worker_cores is not None and o.worker_cores < 1:
        raise ValueError(f"worker_cores must be >= 1 (got {o.worker_cores})")
    _check_worker_numbers(o)
    setting = get_setting(o.setting)
    ep = make_episode(setting, o.seed, o.split)
    if o.slots is not None:
        if o.slots < 1:
            raise ValueError("slots must be >= 1")
        ep = cut_episode(ep, o.slots)
    slots = ep.slots
    out = Path(o.out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    run = o.run_name or uuid.uuid4().hex[:8]
    loop_name = f"deferrable-{run}"
    slot_workload_s = setting.slot_minutes * 60.0
    compression = slot_workload_s / o.slot_seconds
    widest = int(ep.cores.max()) if ep.n_jobs else 1
    worker_cores = o.worker_cores or max(math.ceil(setting.fleet_cores / o.workers), widest)
    if worker_cores < widest:  # the queue is head of line: a job no worker can hold would block every later one
        raise ValueError(f"worker_cores {worker_cores} is below the widest job of the episode ({widest} cores)")

    agent = _make_agent(o, run)  # first: a missing policy fails before anything starts
    knowledge_url = o.knowledge_url or sqlite_url(out / "knowledge.db")
    store = KnowledgeStore(knowledge_url)
    # the queue is fresh per run, so the Knowledge loop must be too: decisions already recorded
    # under this loop name would be replayed (slot k's job ids) onto this run's episode
    try:
        earlier = store.decisions(loop=loop_name)
    except BaseException:
        store.close()
        raise
    if earlier:
        store.close()
        raise ValueError(f"the Knowledge store {knowledge_url} already holds {len(earlier)} decision(s) of loop "
                         f"{loop_name} (an earlier run named {run!r}); choose another run name or Knowledge URL")
    qpath = out / "queue.db"
    for suffix in ("", "-wal", "-shm"):  # a fresh queue per run: the episode is replayed from slot 0
        Path(str(qpath) + suffix).unlink(missing_ok=True)
    queue = sender = None
    try:
        queue = JobQueue(qpath, busy_timeout_s=o.queue_busy_timeout_s)
        if o.graphite:
            from samm.monitor.collector import parse_host_port
            from samm.monitor.graphite_client import GraphiteSender

            sender = GraphiteSender(*parse_host_port(o.graphite))
        loop = DeferrableLoop(queue, agent, store, sender,
                              LoopParams(loop=loop_name, session=f"{run}-live", guard=o.guard),
                              clock_of_slot=lambda t: t * slot_workload_s)
        t0 = time.time() + o.warmup_s
        queue.set_clock(t0, compression)
    except BaseException:
        # nothing started yet: a bad --graphite or queue option left the Knowledge store's and the
        # queue's connections open for the rest of the caller's process
        for part in (sender, queue, store):
            if part is not None:
                part.close()
        raise
    wlog = open(out / "workers.log", "ab")
    procs: list[subprocess.Popen] = []
    late: list[float] = []
    interrupt = _Interrupt()
    interrupted = False
    try:
        interrupt.__enter__()
        for i in range(o.workers):
            if interrupt.requested:  # a signal while spawning: start no more, stop the ones up
                break
            procs.append(popen_tied([sys.executable, "-m", "samm.testbed.worker", "--queue", str(qpath),
                                     "--group", loop_name, "--instance", f"{run}-w{i}", "--cores", str(worker_cores),
                                     "--compression", repr(compression), "--t0", repr(t0), "--duty", str(o.duty),
                                     "--poll-s", str(min(0.05, o.slot_seconds / 10)),
                                     "--lease-s", str(max(5.0, 4 * o.slot_seconds)), "--log-level", "WARNING"],
                                    stdout=wlog, stderr=wlog))
        for k in range(slots):
            _sleep_until(t0 + k * o.slot_seconds, lambda: interrupt.requested)
            if interrupt.requested:
                break
            rows = [(int(r), int(ep.cores[r]), int(ep.duration[r]), int(ep.earliest[r]), int(ep.latest[r]),
                     int(ep.submit[r]), float(ep.duration[r]) * slot_workload_s, k * slot_workload_s)
                    for r in np.flatnonzero(ep.submit == k)]
            if not _play_slot(queue, loop, k, rows, float(ep.capacity[k]), lambda: interrupt.requested):
                break
            late.append(time.time() - (t0 + k * o.slot_seconds))
        if o.drain and not interrupt.requested:
            released = [j for j in queue.deferrable_jobs() if j.released is not None]
            end = max((j.released + j.duration for j in released), default=slots)
            deadline = t0 + end * o.slot_seconds + 5.0 + 2 * o.slot_seconds
            while time.time() < deadline and not interrupt.requested:
                if all(j.state == "done" for j in queue.deferrable_jobs() if j.released is not None):
                    break
                time.sleep(0.05)
    except KeyboardInterrupt:  # the second signal: stop now, still write what was done
        interrupt.requested = True
        interrupt.signal = interrupt.signal or "SIGINT"
    except BaseException:  # no report to write: the caller gets its handlers back with the error
        interrupt.__exit__()
        raise
    finally:
        interrupted = interrupt.requested
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        wlog.close()
        if sender is not None:
            sender.close()

    # the handler stays until the report is written: a signal now lets it finish (before, the
    # default action killed the process during the simulator's comparison, and the report with it)
    try:
        jobs = queue.deferrable_jobs()
        runs = queue.runs()
        stats = {r.id: r for r in queue.stats()}
        queue.close()
        decisions = store.decisions(loop=loop_name)
        store.close()

        # the live slots first: the simulator's comparison below may take a while
        files = {"slots": out / "slots.csv", "summary": out / "summary.json"}
        with open(files["slots"], "w", newline="") as f:
            if loop.records:
                w = csv.DictWriter(f, fieldnames=list(loop.records[0].csv_row()))
                w.writeheader()
                for r in loop.records:
                    w.writerow(r.csv_row())
        if interrupted:  # compare with the simulator over the slots the live run decided
            done = len(loop.records)
            log.warning("run %s interrupted after %d of %d slot(s)", run, done, slots)
            rows_kept = np.flatnonzero(ep.submit < done)
            ep = cut_episode(ep, done) if done else None
            slots = done
        else:
            rows_kept = np.arange(ep.n_jobs)
        n_jobs = len(rows_kept)
        live = live_result(loop.records, n_jobs)
        if ep is not None:
            sim_plain, start_plain = simulate(ep, _make_agent(o, run), guard=False, session=f"{run}-sim")
            sim_guard, start_guard = simulate(ep, _make_agent(o, run), guard=o.guard, session=f"{run}-simg")
        else:
            sim_plain = sim_guard = EpisodeResult(jobs=0)
            start_plain = start_guard = np.zeros(0, dtype=np.int64)
        # job id = row of the episode; the i-th simulated job is row rows_kept[i]
        released_at = {j.id: j.released for j in jobs}
        live_start = np.asarray([-1 if released_at.get(int(r)) is None else released_at[int(r)] for r in rows_kept],
                                dtype=np.int64)
        # physical starts: when a worker leased the job, relative to its release slot's start (wall s)
        lags = [stats[j.id].first_started_at / compression - j.released * o.slot_seconds
                for j in jobs if j.released is not None and stats[j.id].first_started_at is not None]
        released_ids = {j.id for j in jobs if j.released is not None}
        attempts = [stats[i].attempts for i in released_ids]
        keys = ("utilisation", "started", "missed", "violation_slots", "total_reward", "delay_penalty")
        summary = {
            "run": run, "loop": loop_name, "setting": setting.name, "seed": o.seed, "split": o.split, "slots": slots,
            "slot_seconds": o.slot_seconds, "agent": o.agent, "via": o.service_url or "in-process",
            "workers": o.workers, "worker_cores": worker_cores, "fleet_cores": setting.fleet_cores, "jobs": n_jobs,
            "interrupted": interrupted, "signal": interrupt.signal,
            "live": live, "sim": sim_plain.as_dict(), "sim_guarded": sim_guard.as_dict(),
            "live_minus_sim": {k: live[k] - sim_plain.as_dict()[k] for k in keys},
            "live_minus_sim_guarded": {k: live[k] - sim_guard.as_dict()[k] for k in keys},
            "same_start_slots_as_sim": int((live_start == start_plain).sum()),
            "same_start_slots_as_sim_guarded": int((live_start == start_guard).sum()),
            "physical": {"released": len(released_ids),
                         "completed": sum(stats[i].state == "done" and stats[i].completed_by is not None
                                          for i in released_ids),
                         "max_attempts": max(attempts, default=0), "leases": len(runs), "workers_started": len(procs),
                         "start_lag_s_mean": float(np.mean(lags)) if lags else None,
                         "start_lag_s_max": float(np.max(lags)) if lags else None,
                         "started_outside_release_slot": int(sum(lag < 0 or lag >= o.slot_seconds for lag in lags)),
                         "tick_late_s_max": max(late, default=0.0)},
            "decisions": len(decisions), "decisions_created": sum(r.decision_created for r in loop.records),
            "knowledge_url": store.url,
        }
        files["summary"].write_text(json.dumps(summary, indent=2, default=float))
        return DeferrableRunResult(summary, loop.records, jobs, runs, out, loop_name, store.url, files)
    finally:
        interrupt.__exit__()


def options_dict(o: DeferrableRunOptions) -> dict:
    return asdict(o)
