"""The deferrable-jobs problem's loop in the SAMM daemon (`samm run`), declared in the config as

    loops:
      - name: batch
        problem: deferrable-jobs
        queue: {path: /var/lib/samm/jobs.sqlite}       # the durable job queue (samm/testbed/jobqueue.py)
        capacity: {kind: graphite, target: "sumSeries(ondemand.*.cores)", fleet_cores: 80}
        agent: {name: osdec}                           # or {name: tetris, params: {eps: 16}}, or mode: http
        timing: {interval_s: 900}                      # one slot
        executor: {kind: jobqueue, dry_run: false}

Each iteration is one slot: Monitor reads C_t (fixed cores, or the fleet minus the on-demand
cores Graphite reports), then `live.DeferrableLoop.tick` plans (the hosted agent, the deadline
guard) and executes (releases the chosen jobs in the queue), recording one decision per slot in
the knowledge store, idempotently. No capacity reading (Graphite down, no data, NaN) is the safe
default: C_t = 0 for that slot, so nothing starts, and the decision says why.

The daemon finds this module through `ProblemSpec.loop_config` / `build_loop`; it holds no
deferrable-jobs code of its own.
"""
from __future__ import annotations

import logging
import math
import time
from typing import Callable, Literal

from pydantic import Field, model_validator

from samm.config import LOOP_NAME, MAX_PERIOD_S, AgentConfig, Strict

log = logging.getLogger(__name__)

#: tries of a release that failed after its decision was recorded, the failed one included: the
#: next iterations retry it (each outcome an action of that decision) until it succeeds, a newer
#: decision is applied, or these run out
RELEASE_ATTEMPTS = 3


class QueueConfig(Strict):
    path: str = Field(min_length=1, description="SQLite file of the durable job queue")


class CapacityConfig(Strict):
    kind: Literal["fixed", "graphite"] = "fixed"
    cores: float | None = Field(default=None, ge=0, description="fixed: C_t every slot")
    target: str | None = Field(default=None, description="graphite: a series of the on-demand cores in use")
    fleet_cores: float | None = Field(default=None, gt=0, description="graphite: C_t = fleet_cores - on-demand")
    lookback_s: float = Field(default=600.0, gt=0, description="graphite: the newest point within this window")

    @model_validator(mode="after")
    def _complete(self) -> "CapacityConfig":
        if self.kind == "fixed" and self.cores is None:
            raise ValueError("capacity kind 'fixed' needs capacity.cores")
        if self.kind == "graphite" and (not self.target or self.fleet_cores is None):
            raise ValueError("capacity kind 'graphite' needs capacity.target and capacity.fleet_cores")
        return self


class SchedulingAgentConfig(AgentConfig):
    """The daemon's agent section (name, policy_dir, params, mode, service_url), with the
    deferrable-jobs agent as default and the HTTP call's timeout."""
    name: str = "osdec"
    timeout_s: float = Field(default=2.0, gt=0)


class SlotTiming(Strict):
    interval_s: float = Field(default=900.0, gt=0, le=MAX_PERIOD_S, description="one slot (the policy's slot length)")
    misfire_grace_s: float = Field(default=30.0, ge=0, le=MAX_PERIOD_S)
    slot_zero_unix: float = Field(default=0.0, description="wall time of slot 0 (the queue's slot numbers)")


class JobQueueExecutor(Strict):
    kind: Literal["jobqueue"] = "jobqueue"
    dry_run: bool = False


class DeferrableLoopConfig(Strict):
    name: str = Field(pattern=LOOP_NAME)
    problem: Literal["deferrable-jobs"] = "deferrable-jobs"
    queue: QueueConfig
    capacity: CapacityConfig
    agent: SchedulingAgentConfig = SchedulingAgentConfig()
    timing: SlotTiming = SlotTiming()
    executor: JobQueueExecutor = JobQueueExecutor()
    guard: bool = Field(default=True, description="start jobs at their latest start that still fit")

    @model_validator(mode="after")
    def _call_fits_a_slot(self) -> "DeferrableLoopConfig":
        # an HTTP call that may outlast the slot overruns the iteration: the scheduler then skips
        # the next slot(s) (one instance at a time), whose due jobs are dropped unguarded
        if self.agent.mode == "http" and self.agent.timeout_s >= self.timing.interval_s:
            raise ValueError(f"agent.timeout_s ({self.agent.timeout_s:g} s) must be below timing.interval_s "
                             f"({self.timing.interval_s:g} s, one slot)")
        return self


def graphite_capacity(client, cap: CapacityConfig, now: Callable[[], float]) -> Callable[[], tuple[float | None, str | None]]:
    def read() -> tuple[float | None, str | None]:
        from samm.monitor.graphite_client import GraphiteError

        t = int(now())
        try:
            series = client.render(cap.target, t - int(cap.lookback_s), t)
        except GraphiteError as e:
            return None, f"capacity unknown ({e}); starting nothing"
        with_data = [s for s in series if any(math.isfinite(v) for v, _ in s.values())]
        if len(with_data) > 1:  # one node's reading is not the fleet's on-demand use
            return None, (f"capacity unknown ({cap.target!r} returned {len(with_data)} series, expected one: wrap "
                          f"it in sumSeries(...)); starting nothing")
        values = [(ts, v) for s in with_data for v, ts in s.values() if math.isfinite(v)]
        if not values:
            return None, f"capacity unknown (no finite point of {cap.target!r} in {cap.lookback_s:g} s); starting nothing"
        used = max(values)[1]  # the newest point
        if used < 0:
            return None, f"capacity unknown ({cap.target!r} reads {used:g} on-demand cores, below 0); starting nothing"
        return min(cap.fleet_cores, max(0.0, cap.fleet_cores - used)), None
    return read


class DeferrableControlLoop:
    """The daemon-facing wrapper: `run_once()` = one slot at the clock's current slot."""

    def __init__(self, name: str, config: DeferrableLoopConfig, inner, capacity: Callable, clock: Callable[[], float]):
        self.name = name
        self.config = config
        self.inner = inner
        self.capacity = capacity
        self.clock = clock
        self.executor = None
        self.last_progress = time.monotonic()
        # a recorded decision whose release failed: {"slot", "start", "attempts", "decision_id"}
        self.unreleased: dict | None = None

    def current_slot(self) -> int:
        t = self.config.timing
        return int((self.clock() - t.slot_zero_unix) // t.interval_s)

    def recover(self) -> list[str]:
        """At start-up: a decision recorded for the CURRENT slot whose jobs were not all released
        (the process died between the record and the release) is applied now, as recorded (the
        scheduler's first iteration is only at the next slot boundary, too late for it); the
        queue releases each job at most once. A current slot with no decision yet (a start or
        restart within it, a standby taking over) is decided now: left to the next boundary, it
        was never decided and its due jobs were dropped unseen. The previous slot's unreleased
        starts are only reported: that slot is over, its jobs wait for the next decision. First,
        an in-process agent gets its window of recent slots back (`rebuild_history`)."""
        try:
            notes = self._recover()
        except Exception as e:  # noqa: BLE001 - a store or queue error: apply nothing, say so, start anyway
            try:  # a re-applied decision whose release failed: the next iterations retry it
                failure = self._release_failed(self.current_slot(), e)
            except Exception:  # noqa: BLE001 - the store failing too: said below, nothing retried
                failure = None
            notes = [failure or f"recovery skipped, nothing re-applied: {type(e).__name__}: {e}"]
        for n in notes:
            log.warning("loop %s recover: %s", self.name, n)
        return notes

    def _recover(self) -> list[str]:
        inner, notes = self.inner, []
        slot = self.current_slot()
        if inner.store is None or slot < 0:
            return notes
        try:  # the in-process agent's window of recent slots, as an uninterrupted run has it
            inner.rebuild_history(slot)
        except Exception as e:  # noqa: BLE001 - decide on an empty window rather than not start
            notes.append(f"the agent's window of recent slots not rebuilt, starting empty: {type(e).__name__}: {e}")
        for k in (slot - 1, slot):
            prev = inner.store.decision(f"slot{k}", loop=inner.p.loop)
            act = (prev.action or {}) if prev is not None else {}
            start = {int(i) for i in (act.get("start") or [])}
            if not start or inner.p.dry_run or act.get("dry_run"):  # a dry run's decision is never applied
                continue
            pending = sorted(j.id for j in inner.q.deferrable_at(k).eligible if j.id in start)
            if not pending:
                continue
            if k < slot:
                notes.append(f"slot {k}: its recorded decision started {pending} but they were never released (a "
                             "restart); that slot is over, they wait for the next decision")
                continue
            cap, note = self.capacity()
            rec = inner.tick(slot, 0.0 if cap is None else cap, note)
            notes.append(f"slot {slot}: re-applied its recorded decision after a restart: released {rec.released}"
                         + (f" ({rec.error})" if rec.error else ""))
        if inner.store.decision(f"slot{slot}", loop=inner.p.loop) is None:
            cap, note = self.capacity()
            rec = inner.tick(slot, 0.0 if cap is None else cap, note)
            notes.append(f"slot {slot}: not decided yet at start-up, decided now: released {rec.released}"
                         + (f" ({rec.error})" if rec.error else ""))
        return notes

    def run_once(self):
        from samm.daemon.loop import IterationReport

        started = time.perf_counter()
        slot = self.current_slot()
        t = self.config.timing
        if slot < 0:  # the clock is before timing.slot_zero_unix: no slot to schedule yet
            why = (f"the clock is {t.slot_zero_unix - self.clock():.0f} s before timing.slot_zero_unix; no slot to "
                   "schedule, nothing started")
            log.warning("loop %s: %s", self.name, why)
            rep = IterationReport(f"slot{slot}", t.slot_zero_unix + slot * t.interval_s,
                                  t.slot_zero_unix + (slot + 1) * t.interval_s, "before-slot-0", [why], loop=self.name)
            rep.actions = [{"group": "jobqueue", "status": "skipped", "key": f"{self.name}:slot{slot}", "target": [],
                            "detail": why, "error": None}]
            rep.iteration_ms = (time.perf_counter() - started) * 1e3
            self.last_progress = time.monotonic()
            return rep
        cap, note = self.capacity()
        t_monitor = time.perf_counter()
        retried = self._retry_release(slot, cap)
        try:
            rec = self.inner.tick(slot, 0.0 if cap is None else cap, note)
        except Exception as e:
            # a release failed after its decision was recorded: kept for the next iterations to
            # retry, and recorded; the iteration still fails (the runner logs it) as before
            self._release_failed(slot, e)
            raise
        retried += self._applied(slot, rec)
        rep = IterationReport(f"slot{slot}", t.slot_zero_unix + slot * t.interval_s,
                              t.slot_zero_unix + (slot + 1) * t.interval_s, "ok" if note is None else "no-capacity",
                              [x for x in (note, *retried, rec.error) if x], loop=self.name)
        rep.decided = rec.decision_created
        rep.features = {"capacity": rec.capacity, "free": rec.free, "eligible": float(rec.eligible),
                        "running_cores": float(rec.running_cores), "violation": rec.violation}
        rep.actions = [{"group": "jobqueue", "status": "succeeded" if rec.released else "skipped",
                        "key": f"{self.name}:slot{slot}", "target": rec.released,
                        "detail": f"released {rec.released} (deadline {rec.deadline}), dropped {rec.dropped}",
                        "error": rec.error}]
        rep.stage_ms = {"monitor": (t_monitor - started) * 1e3, "plan+execute": (time.perf_counter() - t_monitor) * 1e3}
        rep.iteration_ms = (time.perf_counter() - started) * 1e3
        self.last_progress = time.monotonic()
        return rep


    # ------------------------------------------------------------- a release that failed after its record
    def _release_failed(self, slot: int, exc: Exception) -> str | None:
        """After tick() raised: None unless it raised in the release of the slot's recorded
        decision; then the decision is kept for the next iterations to retry, the failure is
        recorded as an action of it, and the line saying so returned."""
        failed, self.inner.releasing = self.inner.releasing, None
        if failed is None or failed[0] != slot:
            return None
        store, loop = self.inner.store, self.inner.p.loop
        known = self.unreleased if self.unreleased is not None and self.unreleased["slot"] == slot else None
        dec = store.decision(f"slot{slot}", loop=loop) if store is not None else None
        self.unreleased = known or {"slot": slot, "start": failed[1], "attempts": 0,
                                    "decision_id": dec.id if dec is not None else None}
        return self._attempt_failed(slot, exc)

    def _attempt_failed(self, slot: int, exc: Exception) -> str:
        p = self.unreleased
        p["attempts"] += 1
        error = f"{type(exc).__name__}: {exc}"
        last = p["attempts"] >= RELEASE_ATTEMPTS
        why = (f"slot {p['slot']}: releasing its recorded decision {p['start']} failed at slot {slot} (attempt "
               f"{p['attempts']} of {RELEASE_ATTEMPTS}): {error}; "
               + ("given up: its jobs wait for the next decision" if last else "retried at the next iteration"))
        log.error("loop %s: %s", self.name, why)
        if last:
            self.unreleased = None
        self._record_attempt(p, slot, "failed", [], error)
        return why

    def _retry_release(self, slot: int, cap: float | None) -> list[str]:
        """Before deciding `slot`: release what a previous slot's decision started but could not
        release, at this slot (the queue refuses a job whose window has closed), in the decision's
        order while it fits this slot's free cores; the rest waits for this slot's decision, where
        it is eligible. The same slot again is tick()'s own replay of its recorded decision."""
        p = self.unreleased
        if p is None or p["slot"] >= slot:
            return []
        q = self.inner.q
        snap = q.deferrable_at(slot)
        cores = {j.id: j.cores for j in snap.eligible}
        left = (cap if cap is not None and math.isfinite(cap) and cap >= 0 else 0.0) - snap.running_cores
        fit = []
        for i in p["start"]:
            if i in cores and cores[i] <= left:
                fit.append(i)
                left -= cores[i]
        try:
            released = q.release(fit, slot)
        except Exception as e:  # noqa: BLE001 - the queue is still failing: counted, retried or given up
            return [self._attempt_failed(slot, e)]
        p["attempts"] += 1
        self.unreleased = None
        self._record_attempt(p, slot, "succeeded", released, None)
        why = (f"slot {p['slot']}: its recorded decision {p['start']}, whose release had failed, released at slot "
               f"{slot}: {released}" + (f"; {sorted(set(p['start']) - set(released))} no longer start (window "
                                        "closed, or no room left: this slot decides them)" if len(released)
                                        < len(p["start"]) else ""))
        log.warning("loop %s: %s", self.name, why)
        return [why]

    def _applied(self, slot: int, rec) -> list[str]:
        """After a tick that released: a failed release of this slot was re-applied by tick()'s
        replay, or one of an earlier slot is superseded by this slot's decision (its jobs were
        eligible in it)."""
        p = self.unreleased
        if p is None or self.inner.p.dry_run:
            return []
        self.unreleased = None
        if p["slot"] == slot:
            p["attempts"] += 1
            self._record_attempt(p, slot, "succeeded", rec.released, None)
            return [f"slot {slot}: its recorded decision {p['start']}, whose release had failed, re-applied: "
                    f"released {rec.released}"]
        return [f"slot {p['slot']}: its unreleased decision {p['start']} is superseded by slot {slot}'s, "
                "which saw its jobs still eligible"]

    def _record_attempt(self, p: dict, slot: int, status: str, released: list, error: str | None) -> None:
        """One action of the decision per release attempt after the first failure, finished at
        once (the release is one queue transaction): the error is in its request."""
        store = self.inner.store
        if store is None or p["decision_id"] is None:
            return
        store.begin_action(p["decision_id"], f"{self.name}/slot{p['slot']}/release-{p['attempts']}", "jobqueue",
                           "jobqueue", {"start": p["start"], "slot": slot, "attempt": p["attempts"],
                                        "released": released, "error": error},
                           status=status, loop=self.inner.p.loop)


def _warn_on_slot_length(lp: DeferrableLoopConfig, setting) -> None:
    """A policy trained on slots of one length reads its day-phase and window features in slots:
    run every other interval_s, it decides on a day that is not the one it sees. Said, not refused
    (a test or a demo runs short slots on purpose)."""
    minutes = getattr(setting, "slot_minutes", None)
    if minutes and abs(lp.timing.interval_s - 60.0 * minutes) > 1e-6:
        log.warning("loop %s: timing.interval_s is %g s but agent %s was trained on %g-minute slots (%g s): "
                    "its day-phase features will not match the wall clock", lp.name, lp.timing.interval_s,
                    lp.agent.name, minutes, 60.0 * minutes)


def build_loop(cfg, lp: DeferrableLoopConfig, store, closers: list, clock: Callable[[], float] | None = None):
    from samm.monitor.graphite_client import GraphiteSender, RenderClient
    from samm.testbed.jobqueue import JobQueue

    from .hosting import make_policy
    from .live import DeferrableLoop, HttpAgent, InProcessAgent, LoopParams

    import sqlite3

    from samm.daemon.build import ConfigurationProblem

    clock = clock or time.time
    try:
        queue = JobQueue(lp.queue.path)
    except (ValueError, RuntimeError, OSError, sqlite3.Error) as e:  # a directory, not a database, unwritable
        raise ConfigurationProblem(f"loop {lp.name}: queue.path {lp.queue.path}: cannot open the job queue: "
                                   f"{type(e).__name__}: {e}") from e
    closers.append(queue.close)
    a = lp.agent
    if a.mode == "http":
        agent = HttpAgent(a.service_url, a.name, a.timeout_s)
        closers.append(agent.http.close)   # its pooled connections to the service, closed with the daemon
    else:
        try:
            agent = InProcessAgent(make_policy(a.name, a.policy_dir, **a.params), a.name)
        except (ValueError, OSError, KeyError, TypeError) as e:  # unknown agent, missing or corrupt policy
            raise ConfigurationProblem(f"loop {lp.name}: agent {a.name!r}: {type(e).__name__}: {e}") from e
        if getattr(agent.policy, "training", None):   # a learned policy; a rule reads no day phase
            _warn_on_slot_length(lp, getattr(agent.policy, "setting", None))
    sender = None
    if cfg.graphite.publish:
        sender = GraphiteSender(cfg.graphite.carbon_host, cfg.graphite.carbon_port)
        closers.append(sender.close)
    if lp.capacity.kind == "fixed":
        fixed = float(lp.capacity.cores)
        capacity = lambda: (fixed, None)  # noqa: E731
    else:
        capacity = graphite_capacity(RenderClient(cfg.graphite.render_url, cfg.graphite.timeout_s), lp.capacity, clock)
    params = LoopParams(loop=lp.name, session=lp.name, guard=lp.guard, dry_run=lp.executor.dry_run,
                        prefix=cfg.graphite.prefix)
    inner = DeferrableLoop(queue, agent, store=store, sender=sender, params=params)
    return DeferrableControlLoop(lp.name, lp, inner, capacity, clock)
