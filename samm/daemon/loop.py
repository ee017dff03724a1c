"""One MAPE-K iteration: monitor -> analyze -> plan -> execute -> record.

`ControlLoop.run_once` is the whole control law of the daemon. The decision is pure
(`samm.analyze`, the agent, `samm.execute.guard`); this module only sequences it between the
edges (monitor, planner, executor, knowledge store, publisher) and makes every outcome a
record. Safety rules, in order:

* a stale or partial snapshot takes no scaling action, and the reason is recorded;
* one decision per interval (`iteration_key` = the window's end): a restarted or repeated
  iteration finds its decision recorded and does not act again;
* every request is claimed in the knowledge store under its idempotency key before the
  executor is called, and the group's cool-down is written in the same transaction as the
  outcome; actions left in flight (by a crash, or by an outcome the store failed to take)
  are resolved on start and before the next action (`recover`) and their groups put in
  cool-down, since the back-end may have acted;
* wishes the guard refuses (cool-down, bounds, group in flux) are recorded as `blocked`.
"""
from __future__ import annotations

import dataclasses

import logging
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from samm.analyze import FleetSpec
from samm.analyze.features import compute_features
from samm.plan.liveness import guard_head_of_line
from samm.analyze.metrics import OBSERVATION_NAMES
from samm.execute.base import ActionResult, Executor
from samm.execute.guard import idempotency_key, plan_scaling, whole_delta
from samm.knowledge.models import DEFAULT_LOOP
from samm.knowledge.store import KnowledgeStore
from samm.plan.client import PlanOutcome

from .monitoring import Monitor, MonitorOutcome

log = logging.getLogger(__name__)


@dataclass
class IterationReport:
    key: str
    window_start: float
    window_end: float
    status: str
    reasons: list[str]
    features: dict[str, float] = field(default_factory=dict)
    plan: PlanOutcome | None = None
    decision_id: int | None = None
    decided: bool = False  # False when this interval already had a decision
    actions: list[dict] = field(default_factory=list)  # {group, status, key, detail, error}
    blocked: dict[str, str] = field(default_factory=dict)
    inventory: dict[str, dict] = field(default_factory=dict)  # group -> {desired, live}
    finished: bool = False
    iteration_ms: float = 0.0
    loop: str = "default"
    stage_ms: dict[str, float] = field(default_factory=dict)  # monitor, analyze, plan, execute

    @property
    def acted(self) -> bool:
        return any(a["status"] == "succeeded" for a in self.actions)


class ControlLoop:
    def __init__(self, *, groups, fleet: FleetSpec, monitor: Monitor, planner, executor: Executor,
                 store: KnowledgeStore, agent_name: str, warmup_s: float, cooldown_s: float, dry_run: bool = False,
                 clock: Callable[[], float] = time.time, publisher=None, name: str = DEFAULT_LOOP,
                 interval_s: float = 60.0, liveness_guard: bool = True):
        self.name = name  # the loop's name: its decisions, actions and cool-downs are its own
        # idempotency keys are global: loops other than `default` prefix theirs with their name
        self.action_prefix = "" if name == DEFAULT_LOOP else f"{name}/"
        self.groups = list(groups)
        self.group_names = [g.name for g in self.groups]
        self.fleet = fleet
        self.monitor = monitor
        self.planner = planner
        self.executor = executor
        self.store = store
        self.agent_name = agent_name
        self.warmup_s = float(warmup_s)
        self.cooldown_s = float(cooldown_s)
        self.interval_s = float(interval_s)
        self.liveness_guard = liveness_guard
        self.dry_run = dry_run
        self.clock = clock
        self.publisher = publisher
        self.iterations = 0
        self.last_progress = time.monotonic()

    # --- start-up -------------------------------------------------------------------------
    def recover(self, inventory=None) -> list[str]:
        """Resolve actions left in flight: by a previous run, or by this one when the store
        failed to take an outcome. The back-end may or may not have acted, so the group's
        cool-down restarts now either way; the inventory (`inventory`, else the executor's)
        tells which."""
        notes = []
        open_actions = self.store.in_flight_actions(loop=self.name)
        if not open_actions:
            return notes
        if inventory is None:
            try:
                inventory = self.executor.inventory()
            except Exception as exc:  # noqa: BLE001
                inventory = {}
                log.warning("recover: inventory unavailable (%s); assuming in-flight actions may have acted", exc)
        now = self.clock()
        for a in open_actions:
            target = (a.request or {}).get("target")
            g = inventory.get(a.group_name)
            done = g is not None and target is not None and g.desired == target
            status = "succeeded" if done else "failed"
            why = ("outcome not recorded (a restart or a failed write); the group is at the requested target"
                   if done else "outcome not recorded (a restart or a failed write) nor known; not retried")
            # fenced: a deposed leader that does not know it yet must not resolve the actions
            # the new leader has in flight (LeaseLost instead)
            self.store.finish_action(a.idempotency_key, status, {"recovered": True}, None if done else why,
                                     cooldown_until=now + self.cooldown_s, fenced=True)
            notes.append(f"{a.idempotency_key}: {status} ({why})")
            log.warning("recover: action %s -> %s (%s)", a.idempotency_key, status, why)
        return notes

    # --- one iteration ------------------------------------------------------------------------
    def run_once(self) -> IterationReport:
        started = time.perf_counter()
        outcome = self._monitor()
        t_monitor = time.perf_counter()
        now = self.clock()
        end = outcome.window_end if math.isfinite(outcome.window_end) else math.floor(now)
        key = f"{int(end)}"
        rep = IterationReport(key, outcome.window_start, outcome.window_end, outcome.status, list(outcome.reasons),
                              finished=outcome.finished, loop=self.name)
        rep.stage_ms["monitor"] = (t_monitor - started) * 1e3
        if outcome.inventory:
            rep.inventory = {g: {"desired": s.desired, "live": s.live} for g, s in outcome.inventory.items()}
        snapshot_id = self.store.record_snapshot(
            outcome.window_start if math.isfinite(outcome.window_start) else end, end, outcome.status,
            outcome.reasons, outcome.summary or None)

        if not outcome.actionable:
            rep.decision_id, rep.decided = self.store.record_decision(
                key, agent=self.agent_name, action=None, source="none", action_name="nothing (snapshot not usable)",
                reason=f"snapshot {outcome.status}: " + "; ".join(outcome.reasons), loop=self.name)
            log.warning("iteration %s: snapshot %s, no scaling action: %s", key, outcome.status,
                        "; ".join(outcome.reasons))
            return self._finish(rep, started)

        names = self._feature_names()
        t0 = time.perf_counter()
        raw = self._with_action_age(outcome.raw, end)
        try:
            feats = compute_features(raw, self.fleet, names, warmup_s=self.warmup_s, step_seconds=self.interval_s)
        except ValueError as exc:  # e.g. a service's policy reads a feature this daemon does not compute
            rep.decision_id, rep.decided = self.store.record_decision(
                key, agent=self.agent_name, action=None, source="none", action_name="nothing (features unknown)",
                reason=f"the agent's features cannot be computed here: {exc}"[:500], loop=self.name)
            log.warning("iteration %s: features cannot be computed, no scaling action: %s", key, exc)
            return self._finish(rep, started)
        rep.stage_ms["analyze"] = (time.perf_counter() - t0) * 1e3
        rep.features = {n: float(v) for n, v in zip(names, np.asarray(feats).reshape(-1))}
        # JSON has no NaN (PostgreSQL refuses it): an unknown feature is stored as null
        obs_id = self.store.record_observation(snapshot_id, {n: (v if math.isfinite(v) else None)
                                                             for n, v in rep.features.items()})

        unknown = [n for n, v in rep.features.items() if not math.isfinite(v)]
        if unknown:  # e.g. an exporter without the queue's core counts under an `extended` policy
            rep.decision_id, rep.decided = self.store.record_decision(
                key, agent=self.agent_name, action=None, source="none", action_name="nothing (features unknown)",
                reason=f"feature(s) {', '.join(unknown)} unknown in this snapshot (see docs/metric-naming.md)",
                observation_id=obs_id, loop=self.name)
            log.warning("iteration %s: feature(s) %s unknown, no scaling action", key, ", ".join(unknown))
            return self._finish(rep, started)

        existing = self.store.decision(key, loop=self.name)
        if existing is not None:  # a restart inside the interval: never decide (or act) twice
            rep.decision_id, rep.decided = existing.id, False
            rep.reasons.append("this interval already has a decision; not acting again")
            return self._finish(rep, started)

        t0 = time.perf_counter()
        plan = self._guarded(self.planner.decide(feats), raw)
        rep.stage_ms["plan"] = (time.perf_counter() - t0) * 1e3
        rep.plan = plan
        rep.decision_id, rep.decided = self.store.record_decision(
            key, agent=self.agent_name, action=plan.action, source=plan.source, policy_version=plan.policy_version,
            observation_id=obs_id, action_name=plan.action_name, probabilities=plan.probabilities, value=plan.value,
            reason=plan.reason, loop=self.name)
        if not rep.decided:
            return self._finish(rep, started)
        if any(plan.deltas.values()):
            t0 = time.perf_counter()
            self._execute(rep, plan, key, now, outcome.inventory)
            rep.stage_ms["execute"] = (time.perf_counter() - t0) * 1e3
        return self._finish(rep, started)

    # --- stages -------------------------------------------------------------------------------
    def _monitor(self) -> MonitorOutcome:
        try:
            return self.monitor.read()
        except Exception as exc:  # noqa: BLE001 - a broken source is a stale snapshot, not a crash
            log.exception("monitor failed")
            now = self.clock()
            return MonitorOutcome(math.nan, math.floor(now), "stale", [f"monitor failed: {type(exc).__name__}: {exc}"])

    def _with_action_age(self, raw, window_end: float):
        """The snapshot plus the seconds since this loop last acted (the knowledge store knows,
        across restarts); the simulator reports the same counter."""
        if raw.since_action_s is not None:
            return raw
        try:
            last = [g.last_action_at for g in self.store.group_states(self.name).values() if g.last_action_at is not None]
        except Exception:  # noqa: BLE001 - a feature that reads it is then NaN, and nothing is done
            return raw
        if not last:
            return dataclasses.replace(raw, since_action_s=np.asarray(-1.0))
        return dataclasses.replace(raw, since_action_s=np.asarray(self._intervals_begun_since(window_end, max(last))))

    def _intervals_begun_since(self, window_end: float, acted_at: float) -> float:
        """Seconds since the last action, counted as the simulator counts them: it applies an
        action at the start of an interval and observes whole intervals later, while this loop acts
        a few seconds after the window it read ends; the raw difference (one interval less a
        few seconds) would floor to one step fewer than the simulator reports for the same past."""
        elapsed = window_end - acted_at
        if elapsed <= 0:
            return 0.0
        return math.ceil(elapsed / self.interval_s - 1e-9) * self.interval_s

    def _guarded(self, plan: PlanOutcome, raw) -> PlanOutcome:
        """The head-of-line liveness guard (samm/plan/liveness.py), as in the simulator."""
        if not self.liveness_guard or raw.head_job_cores is None:
            return plan
        order = list(self.fleet.names)
        # a NaN cast to int64 is -2**63 (which the guard would read as "remove every VM") and
        # 10**30 does not fit: the guard sees them as 0 / clipped, and a group it leaves as it
        # found keeps the planner's own value, for the Execute guard to refuse or clamp by name
        seen = [min(max(whole_delta(plan.deltas.get(g, 0))[0], -2**62), 2**62) for g in order]
        guarded, changed = guard_head_of_line(np.array([seen], dtype=np.int64), raw, self.fleet)
        if not changed[0]:
            return plan
        new = {g: plan.deltas.get(g, 0) if int(d) == was else int(d) for g, d, was in zip(order, guarded[0], seen)}
        # the guard either adds a host where none is, or cancels removing the last ones: the
        # reason names which (operators read "no VM can host it" as a fleet unable to run the job)
        did = ("no VM of the fleet can host it" if any(int(d) > max(was, 0) for d, was in zip(guarded[0], seen))
               else "the guard keeps the last VM(s) able to host it")
        why = (f"liveness guard: a {int(raw.head_job_cores)}-core job heads the queue and {did}; "
               f"deltas {plan.deltas} -> {new}")
        log.warning(why)
        return dataclasses.replace(plan, deltas=new, reason="; ".join(r for r in (plan.reason, why) if r))

    def _feature_names(self) -> tuple[str, ...]:
        names = getattr(self.planner, "feature_names", None)
        return tuple(names) if names else OBSERVATION_NAMES

    def _execute(self, rep: IterationReport, plan: PlanOutcome, key: str, now: float, inventory=None) -> None:
        try:
            # the monitor's inventory is seconds old; executors re-check bounds on apply
            inventory = inventory or self.executor.inventory()
        except Exception as exc:  # noqa: BLE001
            rep.reasons.append(f"inventory unavailable, no action: {exc}")
            for g, d in plan.deltas.items():
                if d:
                    self._blocked(rep, key, g, d, f"inventory unavailable: {type(exc).__name__}: {exc}")
            return
        rep.inventory = {g: {"desired": s.desired, "live": s.live} for g, s in inventory.items()}
        # an earlier action whose outcome the store failed to take (the process lived on) has
        # no cool-down yet, though it may have acted: without this its group could act again
        for note in self.recover(inventory):
            rep.reasons.append(f"resolved {note}")
        guard = plan_scaling(plan.deltas, inventory, self.groups, self._cooldowns(now), now,
                             self.action_prefix + key,
                             dry_run=self.dry_run, warmup_s=self.warmup_s)
        for s in guard.skipped:
            if s.reason != "no_change":
                self._blocked(rep, key, s.group, s.requested_delta, f"{s.reason}: {s.detail}")
        for pa in guard.actions:
            req = pa.request
            request = asdict(req) | {"from": pa.current, "delta": pa.delta, "notes": list(pa.notes)}
            if not pa.execute:
                self.store.begin_action(rep.decision_id, req.idempotency_key, self.executor.kind, req.group, request,
                                        status="dry_run", loop=self.name)
                rep.actions.append({"group": req.group, "status": "dry_run", "key": req.idempotency_key,
                                    "detail": request})
                continue
            _, claimed = self.store.begin_action(rep.decision_id, req.idempotency_key, self.executor.kind, req.group,
                                                 request, loop=self.name)
            if not claimed:
                rep.reasons.append(f"{req.idempotency_key} already claimed; not acting twice")
                continue
            try:
                result = self.executor.apply(req)
            except Exception as exc:  # noqa: BLE001 - executors should not raise; be safe anyway
                result = ActionResult("failed", error=f"{type(exc).__name__}: {exc}")
            # a failed call may still have acted on the back-end: cool down either way; a request
            # refused before any call (out of bounds, no such group) applied nothing and must not
            # block the next, legitimate one
            cools = result.status != "skipped" and result.may_have_acted
            self.store.finish_action(req.idempotency_key, result.status, result.detail, result.error,
                                     cooldown_until=now + self.cooldown_s if cools else None)
            rep.actions.append({"group": req.group, "status": result.status, "key": req.idempotency_key,
                                "detail": result.detail, "error": result.error, "target": req.target,
                                "from": pa.current})
            log.info("iteration %s: %s %s -> %d: %s%s", key, req.group, pa.current, req.target, result.status,
                     f" ({result.error})" if result.error else "")

    def _cooldowns(self, now: float) -> dict[str, float]:
        """The groups' cool-downs, none ending later than now + cooldown_s. One set while the clock
        ran ahead (then stepped back: NTP, a VM restored from a snapshot) would otherwise block its
        group for as long as the clock was wrong; it is shortened in the store, once, with a warning."""
        out = {}
        for group, state in self.store.group_states(self.name).items():
            until, latest = state.cooldown_until, now + self.cooldown_s
            if until > latest:
                log.warning("group %s: cool-down until %.0f lies %.0f s beyond now + cooldown_s (the clock went "
                            "back?); shortened to %.0f", group, until, until - latest, latest)
                acted = state.last_action_at if state.last_action_at is not None else now
                self.store.set_cooldown(group, latest, action_key=state.last_action_key, now=min(acted, now),
                                        loop=self.name)
                until = latest
            out[group] = until
        return out

    def _blocked(self, rep: IterationReport, key: str, group: str, delta: int, why: str) -> None:
        ik = idempotency_key(self.action_prefix + key, group)
        self.store.begin_action(rep.decision_id, ik, self.executor.kind, group, {"group": group, "delta": delta,
                                                                               "reason": why}, status="blocked",
                                loop=self.name)
        rep.blocked[group] = why
        rep.actions.append({"group": group, "status": "blocked", "key": ik, "detail": {"reason": why}})

    def _finish(self, rep: IterationReport, started: float) -> IterationReport:
        rep.iteration_ms = (time.perf_counter() - started) * 1e3
        self.iterations += 1
        self.last_progress = time.monotonic()
        if self.publisher is not None:
            try:
                self.publisher.publish(rep)
            except Exception:  # noqa: BLE001 - publishing is best effort
                log.exception("publishing iteration %s failed", rep.key)
        return rep
