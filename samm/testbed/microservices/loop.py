"""The control loop of the real-container testbed: every second

    measurement (measure.Measurer) -> controller.act -> guard -> apply (DockerExecutor.set_cpu_limit)

for any `agents.microservice_cores.control.Controller`.

The guard, in order:
  * one apply per step: a step index already handled returns its record and touches nothing, and a
    step whose decision is already in the Knowledge store (a replay after a crash) re-applies that
    decision instead of asking the controller again;
  * services restarted since the last step (the kill and engine-restart faults) get the limit the
    loop last set for them re-applied, whatever else this step decides;
  * no action when the load data is stale (no new second for > 2 s, or none since the previous
    step: one load second is acted on once, "no action: stale latency"),
    when the step starts a whole second after its time (`extra["late_s"]`: a blocked engine call
    made the loop fall behind; it catches up without a burst of decisions),
    when no request completed in the second ("no action: unknown latency"), or when the engine
    could not be read ("no action: engine unreachable") or a running container's cgroup could not
    ("no action: CPU use unreadable", not a use of 0); the controller is then not asked, so
    its memory (stacked frames, the previous action) only ever holds applied actions;
  * `clip_cores`: never outside [floor, cap] (NaN -> cap, the safe side for latency); clipped
    services are named in the record;
  * a limit is only sent when it differs from the engine's by at least one quota step (0.01
    core), and not again while the engine holds what it clamped the same request to (a limit
    above its CPUs); a failed set is recorded for that service and the others still go out.

Every step's decision goes to the Knowledge store (loop `microservices-<run>`, iteration key
`step<k>`, problem `microservice-cores`): source "agent" with the cores per service, "none" with
the reason for no action, "fallback" when the controller raised. Each limit change is an Action
(idempotency key `<loop>:step<k>:<service>`) begun before and finished after the engine call.

`dry_run`: every decision is recorded as above, but no limit is sent: each change the loop would
have made is an Action with status `dry_run` (and in `StepRecord.dry_run`). `history`: keep only
the newest records in memory (a long-running daemon); None keeps them all (a testbed run).
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from agents.microservice_cores.control import AppLimits, clip_cores
from agents.microservice_cores.observation import PERCENTILES, StepMeasurement
from samm.knowledge.models import Action
from samm.knowledge.store import LeaseLost

log = logging.getLogger(__name__)

PROBLEM = "microservice-cores"
QUOTA_STEP = 0.01  # cores: 1 ms of CFS quota per 100 ms period
P50 = PERCENTILES.index(50)


class Actuator(Protocol):
    def set_limit(self, service: str, cores: float) -> Any: ...  # an ActionResult


def store_key_problem(loop_name: str, services) -> str | None:
    """Why this loop's action records would not fit the knowledge store's columns (None: they
    fit). PostgreSQL refuses a longer value where SQLite keeps it, so a long service name worked on
    one store and, on the other, left every limit change of that service unrecorded."""
    key_len = Action.__table__.c.idempotency_key.type.length
    group_len = Action.__table__.c.group_name.type.length
    for s in services:
        longest = f"{loop_name}:step{10 ** 12}:{s}:reapply"   # k = wall-clock seconds // interval
        if len(s) > group_len or len(longest) > key_len:
            room = min(group_len, key_len - len(longest) + len(s))
            shown = repr(s) if len(s) <= 40 else repr(s[:40]) + "..."
            return (f"service name {shown} is {len(s)} characters: with loop name {loop_name!r} the knowledge "
                    f"store takes at most {room}")
    return None


# ------------------------------------------------------------------------------ the loop
@dataclass
class StepRecord:
    step: int
    t: float
    latency_state: str                 # ok | stale | none completed
    p99_ms: float
    p50_ms: float
    requests_per_s: float
    failures_per_s: float
    limits: dict                       # cores in force during the measured second (from the engine)
    used: dict                         # cores used in that second (cgroup)
    targets: dict | None               # what the loop decided (after the guard), None: no decision
    applied: dict = field(default_factory=dict)    # service -> cores actually sent this step
    action: str = ""                   # "resize N", "hold", or "no action: <why>"
    clipped: list = field(default_factory=list)
    held: list = field(default_factory=list)       # services not running: their limit was held
    kernel_limits: dict = field(default_factory=dict)  # the cgroup's CFS quota / period (cores), for checks
    throttled: dict = field(default_factory=dict)  # share of the second's CFS periods out of quota (cgroup)
    dry_run: dict = field(default_factory=dict)    # service -> cores a dry run would have sent
    errors: list = field(default_factory=list)
    restarted: list = field(default_factory=list)
    reapplied: dict = field(default_factory=dict)
    fault: str = ""
    decision_created: bool = True
    duration_ms: float = 0.0

    @property
    def total_cores(self) -> float:
        return float(sum(self.limits.values()))

    def csv_row(self, services) -> dict:
        row = {"step": self.step, "t": round(self.t, 3), "total_cores": round(self.total_cores, 4),
               "total_used": round(float(sum(self.used.values())), 4),
               "p99_ms": _r(self.p99_ms), "p50_ms": _r(self.p50_ms), "rps": _r(self.requests_per_s),
               "failures": _r(self.failures_per_s), "latency_state": self.latency_state}
        for s in services:
            row[f"cores_{s}"] = round(self.limits.get(s, math.nan), 4)
        for s in services:
            row[f"used_{s}"] = round(self.used.get(s, math.nan), 4)
        for s in services:
            row[f"target_{s}"] = "" if not self.targets else round(self.targets[s], 4)
        for s in services:
            row[f"throttled_{s}"] = _r(self.throttled.get(s))
        row |= {"action": self.action, "clipped": " ".join(self.clipped),
                "held": " ".join(self.held), "errors": " | ".join(self.errors),
                "restarted": " ".join(self.restarted),
                "reapplied": " ".join(f"{k}={v:.3f}" for k, v in self.reapplied.items()), "fault": self.fault, "duration_ms": round(self.duration_ms, 1)}
        return row


def _r(x: float, nd: int = 3):
    return "" if x is None or not math.isfinite(x) else round(float(x), nd)


class ControlLoop:
    def __init__(self, limits: AppLimits, controller, actuator: Actuator, store=None, *,
                 loop_name: str = "microservices", agent_name: str | None = None, dry_run: bool = False,
                 history: int | None = None):
        self.limits = limits
        self.services = tuple(limits.services)
        self.controller = controller
        self.actuator = actuator
        self.store = store
        self.loop_name = loop_name
        self.agent_name = agent_name or getattr(controller, "name", type(controller).__name__)
        self.records: list[StepRecord] = []
        self._by_step: dict[int, StepRecord] = {}
        self.last_target: dict[str, float] = {}
        self.dry_run = bool(dry_run)
        self.history = history
        if store is not None and (problem := store_key_problem(loop_name, self.services)):
            raise ValueError(problem)
        self._unrecorded: dict[str, tuple] = {}   # action key -> outcome the store did not take yet
        # service -> (cores asked, cores the engine set): a limit above the engine's CPUs is
        # clamped there, and asking again every second would change nothing
        self._clamped: dict[str, tuple[float, float]] = {}

    def step(self, k: int, m: StepMeasurement, restarted=(), fault: str = "", errors=()) -> StepRecord:
        """Step k on the measurement of the second just ended. `restarted`: services the
        supervisor started again since the last step; `errors`: the supervisor's failures
        (recorded with the step)."""
        if k in self._by_step:  # one apply per step
            return self._by_step[k]
        t0 = time.perf_counter()
        state = m.extra.get("latency_state", "ok" if m.latency_known else "none completed")
        if state == "ok" and not m.latency_known:
            state = "none completed"
        limits_now = {s: float(x) for s, x in zip(self.services, m.cpu_limit)}
        rec = StepRecord(step=k, t=m.t, latency_state=state, p99_ms=m.p99_ms, p50_ms=float(m.latency_ms[P50]),
                         requests_per_s=m.requests_per_s, failures_per_s=m.failures_per_s, limits=limits_now,
                         used={s: float(x) for s, x in zip(self.services, m.cpu_used)}, targets=None,
                         restarted=list(restarted), fault=fault, errors=list(errors),
                         kernel_limits=dict(m.extra.get("kernel_limit") or {}),
                         throttled=dict(m.extra.get("throttled") or {}))
        running = m.extra.get("running") or {}
        down = [s for s in self.services if running.get(s) is False]
        key = f"step{k}"
        self._finish_unrecorded()
        previous = store_error = None
        if self.store is not None:
            try:
                previous = self.store.decision(key, loop=self.loop_name)
            except LeaseLost:
                raise
            except Exception as exc:  # noqa: BLE001 - unknown whether this step acted: it does not
                store_error = f"knowledge store: {type(exc).__name__}: {exc}"[:300]
        engine_errors = m.extra.get("engine_errors") or []
        if previous is not None:  # a replayed step: apply what was decided, ask nothing
            rec.decision_created = False
            cores = (previous.action or {}).get("cores")
            if cores:
                self._replay(cores, rec)
            else:
                rec.action = previous.reason or "no action (replayed)"
        elif store_error is not None:
            rec.action = "no action: knowledge store unreadable"
            rec.errors.append(store_error)
            rec.decision_created = False
        elif state == "stale":
            rec.action = "no action: stale latency"
        elif (m.extra.get("late_s") or 0) >= 1.0:
            # the step starts a whole period after its time (an engine call blocked): its latency is
            # the second an earlier step already saw, and acting on each late step would make a
            # burst of decisions in one second
            rec.action = "no action: step late (the loop fell behind)"
        elif engine_errors:
            rec.action = "no action: engine unreachable"
            rec.errors.extend(engine_errors)
        elif m.extra.get("cpu_unknown"):
            rec.action = "no action: CPU use unreadable"
            rec.errors.extend(m.extra["cpu_unknown"])
        elif len(down) == len(self.services):
            rec.action = "no action: application down"
        elif state != "ok":
            rec.action = "no action: unknown latency (no request completed)"
        else:
            try:
                raw = np.asarray(self.controller.act(m), dtype=np.float64).reshape(len(self.services))
            except Exception as exc:  # noqa: BLE001 - a failing controller must not stop the loop
                log.exception("step %d: controller %s failed", k, self.agent_name)
                rec.action = f"no action: controller error: {type(exc).__name__}: {exc}"[:300]
                rec.errors.append(rec.action)
            else:
                clipped = clip_cores(raw, self.limits)
                rec.clipped = [s for s, a, b in zip(self.services, raw, clipped)
                               if not (np.isfinite(a) and abs(a - b) <= 1e-9)]
                rec.targets = {s: float(c) for s, c in zip(self.services, clipped)}
                # a service that is not running used no CPU because it was down, not idle: it keeps
                # the limit the loop last gave it (or the one it has), whatever the controller says
                for s in down:
                    rec.targets[s] = self.last_target.get(s, limits_now[s])
                    rec.held.append(s)
        if rec.decision_created:
            self._record(key, m, rec)
        else:
            self._decision_id = previous.id if previous is not None else None
        # services restarted since the last step: the loop's last limit goes back on
        for s in restarted:
            want = self.last_target.get(s)
            if want is not None:
                self._apply(k, s, want, rec, reapply=True)
        if rec.targets is not None:
            n = 0
            for s in self.services:
                want = rec.targets[s]
                self.last_target[s] = want
                if (abs(want - limits_now[s]) >= QUOTA_STEP / 2 or not math.isfinite(limits_now[s])) \
                        and not self.engine_holds_clamped(s, want, limits_now[s]):
                    n += self._apply(k, s, want, rec)
            if not rec.action and self.dry_run:
                rec.action = f"dry run: would resize {len(rec.dry_run)}" if rec.dry_run else "hold"
            elif not rec.action:
                rec.action = f"resize {n}" if n else "hold"
        rec.duration_ms = (time.perf_counter() - t0) * 1000
        self.records.append(rec)
        self._by_step[k] = rec
        if self.history is not None and len(self.records) > self.history:
            for old in self.records[:-self.history]:
                self._by_step.pop(old.step, None)
            del self.records[:-self.history]
        return rec

    def engine_holds_clamped(self, s: str, want: float, have: float) -> bool:
        """Whether the engine holds `have`, what it clamped the same request `want` to last time."""
        asked, got = self._clamped.get(s, (math.nan, math.nan))
        return abs(asked - want) < QUOTA_STEP / 2 and abs(got - have) < QUOTA_STEP / 2

    def _replay(self, cores, rec: StepRecord) -> None:
        """The targets of a recorded decision, held to today's bounds: the record may be of another
        topology (a reused loop or run name) or edited; one that names not every service of this
        application is not applied at all."""
        try:
            raw = np.array([float(cores[s]) for s in self.services], dtype=np.float64)
        except (KeyError, TypeError, ValueError) as exc:
            rec.action = "no action: recorded decision unreadable"
            rec.errors.append(f"replayed decision: {type(exc).__name__}: {exc}"[:300])
            return
        clipped = clip_cores(raw, self.limits)
        rec.clipped = [s for s, a, b in zip(self.services, raw, clipped) if not (np.isfinite(a) and abs(a - b) <= 1e-9)]
        rec.targets = {s: float(c) for s, c in zip(self.services, clipped)}
        rec.action = "replayed decision"

    def _finish_unrecorded(self) -> None:
        """Outcomes whose write to the store failed (the action then stays in_flight there, and a
        restarted daemon would judge it against a limit set long after): written again each step
        until they go through."""
        if not self._unrecorded or self.store is None:
            return
        for key, (status, result, error) in list(self._unrecorded.items()):
            try:
                self.store.finish_action(key, status, result=result, error=error)
            except LeaseLost:
                raise
            except Exception as exc:  # noqa: BLE001 - still down: try again next step
                log.warning("finishing action %s still fails: %s", key, exc)
                return
            del self._unrecorded[key]

    def _apply(self, k: int, s: str, cores: float, rec: StepRecord, reapply: bool = False) -> int:
        key = f"{self.loop_name}:step{k}:{s}" + (":reapply" if reapply else "")
        if self.dry_run:  # recorded (once per key), never sent
            claimed = True
            if self.store is not None and self._decision_id is not None:
                try:
                    _, claimed = self.store.begin_action(self._decision_id, key, executor="docker", group=s,
                                                         request={"cores": cores, "reapply": reapply},
                                                         status="dry_run", loop=self.loop_name)
                except Exception as exc:  # noqa: BLE001
                    log.warning("step %d: recording dry-run action %s failed: %s", k, key, exc)
            if claimed:
                rec.dry_run[s] = cores
            return 0
        claimed = True
        begun = self.store is not None and self._decision_id is not None
        if begun:
            try:
                _, claimed = self.store.begin_action(self._decision_id, key, executor="docker", group=s,
                                                     request={"cores": cores, "reapply": reapply}, loop=self.loop_name)
            except LeaseLost:
                raise  # another daemon leads: this one must not act
            except Exception as exc:  # noqa: BLE001 - the record is not worth stopping the loop
                log.warning("step %d: recording action %s failed: %s", k, key, exc)
                rec.errors.append(f"knowledge store: action {key} not recorded: {exc}"[:300])
                begun = False   # no row to finish: retrying its outcome each step would fail for ever
        if not claimed:
            return 0
        burst_error = None
        try:
            res = self.actuator.set_limit(s, cores)
            status, error = res.status, res.error
            burst_error = (res.detail or {}).get("cpu_burst_error")
            if status == "succeeded" and "clamped" in (res.detail or {}):
                self._clamped[s] = (cores, float(res.detail["cores"]))
            else:
                self._clamped.pop(s, None)
        except Exception as exc:  # noqa: BLE001
            status, error = "failed", f"{type(exc).__name__}: {exc}"
        if status == "succeeded":
            (rec.reapplied if reapply else rec.applied)[s] = cores
        else:
            rec.errors.append(f"{s}: {error}"[:300])
        if burst_error:   # the limit is set; the burst the run asked for is not
            rec.errors.append(f"{s}: cpu burst: {burst_error}"[:300])
        if begun:
            outcome = ("succeeded" if status == "succeeded" else "failed",
                       {"cores": cores} | ({"cpu_burst_error": burst_error} if burst_error else {}), error)
            try:
                self.store.finish_action(key, outcome[0], result=outcome[1], error=outcome[2])
            except LeaseLost:
                raise
            except Exception as exc:  # noqa: BLE001
                log.warning("step %d: finishing action %s failed (written again next step): %s", k, key, exc)
                rec.errors.append(f"knowledge store: outcome of {key} not written: {exc}"[:300])
                self._unrecorded[key] = outcome
        return int(status == "succeeded")

    _decision_id: int | None = None

    def _record(self, key: str, m: StepMeasurement, rec: StepRecord) -> None:
        self._decision_id = None
        if self.store is None:
            return
        if rec.targets is not None:
            source, action, name = "agent", {"cores": rec.targets}, "resize"
            reason = f"clipped to [floor, cap]: {', '.join(rec.clipped)}" if rec.clipped else None
            if self.dry_run:
                reason = "; ".join(x for x in ("dry run: limits not changed", reason) if x)
        else:
            source = "fallback" if "controller error" in rec.action else "none"
            action, name, reason = None, "none", rec.action
        obs = {"p99_ms": _r(m.p99_ms), "requests_per_s": _r(m.requests_per_s), "failures_per_s": _r(m.failures_per_s),
               "latency_state": rec.latency_state, "cpu_used": [round(float(x), 4) for x in m.cpu_used],
               "cpu_limit": [round(float(x), 4) for x in m.cpu_limit], "restarted": rec.restarted}
        try:
            self._decision_id, created = self.store.record_decision(
                key, agent=self.agent_name, loop=self.loop_name, problem=PROBLEM, source=source, action=action,
                action_name=name, reason=reason, observation=obs, now=m.t)
            rec.decision_created = created
        except LeaseLost:
            raise
        except Exception as exc:  # noqa: BLE001 - the loop goes on without its record
            log.warning("step %s: recording the decision failed: %s", key, exc)
            rec.errors.append(f"knowledge store: {exc}"[:300])
