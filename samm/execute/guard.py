"""The Execute stage's guard: turns an agent's per-group wishes into the scale requests that are
safe to perform now, and says why every other wish is not performed.

Pure decision code in the style of the Kubernetes HPA's controller: no I/O and no clock reads
(`now` is an argument), so every rule is tested with hand-made inventories and a fake clock, and
a decision can be recomputed from what the knowledge base recorded.

The rules are steps of the guard chain (`samm.execute.chain`: shared cool-down and idempotency
steps, the autoscaling steps below; `scaling_steps` lists them). In the order they are checked
for each group:
1. the group must be known to both the configuration and the inventory;
2. cool-down: a group that acted at t is blocked in BOTH directions until t + cooldown_s
   (blocked while now < t + cooldown_s, allowed from exactly t + cooldown_s on). One window
   for both directions, like an ASG's DefaultCooldown: right after a launch the new
   instance's load is not visible yet, so an immediate scale-in would undo a decision that
   has not been judged. An optional, longer scale-in stabilisation window
   (`scale_in_stabilisation_s`) makes shrinking more reluctant than growing, as the HPA does;
3. inventory in flux: while the group's live instances (pending + running) differ from its
   desired capacity, the back-end is still converging (a launch not yet visible, a
   termination not yet reflected) and a new target would be computed from a stale picture.
   Optionally (`hold_scale_out_while_pending`) scale-out also waits while instances boot;
   off by default because the simulator the policies were trained in allows it;
4. bounds: the target never leaves [min, max], the tighter of the configured bounds and the
   group's own; a larger step is clamped (+3 at max-1 becomes +1, with a note); a step at
   the bound is not performed. A group already outside the configured range (the operator
   lowered max) may still move towards it, never away;
5. at most one request per group per decision, with `target` = desired at decision time +
   the clamped delta: absolute, so replaying it changes nothing once it has been applied.
   Replays of a recorded decision (`recorded`) return the recorded requests verbatim.

Scale-in removes only instances not protected from scale-in (a larger step is clamped to
them) and names a victim among them: pending instances first (newest first), then the newest
running instance. A pending instance has done no work yet and its boot is the cheapest thing to
throw away; among running ones, the newest has the least sunk work (warm caches, in-flight
jobs) in this model, and under per-second billing no instance is closer to a paid-for hour
than another. The executor may override the choice if it knows the load per instance.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Iterable, Literal, Mapping, Protocol, Sequence

from dataclasses import replace

from samm.execute.base import ActionResult, GroupStatus, Instance, ScaleRequest
from samm.execute.chain import (GuardContext, Skip, Step, Wish, cooldown, idempotency, idempotency_key,
                                run_chain)

SkipReason = Literal["unknown_group", "no_change", "cooldown", "in_flux", "at_min", "at_max",
                     "bounds_conflict", "bad_delta", "protected"]


class Bounds(Protocol):
    """What the guard needs of a group's configuration (`samm.config.GroupConfig` fits)."""

    name: str
    min: int
    max: int


@dataclass(frozen=True)
class PlannedAction:
    """A request the guard lets through. `execute` is False in dry-run: the action is recorded
    as what would have been done, and nothing is sent to the back-end."""

    request: ScaleRequest
    current: int  # desired capacity at decision time
    requested_delta: int
    delta: int  # after clamping to the bounds
    execute: bool = True
    notes: tuple[str, ...] = ()

    @property
    def group(self) -> str:
        return self.request.group


@dataclass(frozen=True)
class Skipped:
    """A wish the guard did not turn into a request, and why (`detail` is for people)."""

    group: str
    requested_delta: int
    reason: SkipReason
    detail: str
    until: float | None = None  # end of the cool-down, for reason "cooldown"


@dataclass(frozen=True)
class GuardPlan:
    decision_key: str
    now: float
    dry_run: bool
    actions: tuple[PlannedAction, ...] = ()
    skipped: tuple[Skipped, ...] = ()

    @property
    def requests(self) -> list[ScaleRequest]:
        """The requests to send to the executor now (none in dry-run)."""
        return [a.request for a in self.actions if a.execute]

    def reasons(self) -> dict[str, str]:
        """group -> why its wish was not (or not fully) performed, for logs and the record."""
        out = {s.group: f"{s.reason}: {s.detail}" for s in self.skipped}
        for a in self.actions:
            why = list(a.notes) + ([] if a.execute else ["dry_run: not executed"])
            if why:
                out[a.group] = "; ".join(why)
        return out


def deltas_from_actions(mode: str, actions, group_names: Sequence[str]) -> dict[str, int]:
    """One agent decision (batch of one) -> {group: delta}, through the simulator's own mapping
    (`sim_bridge.actions.to_deltas`) so the daemon acts exactly as the policy was trained.
    `group_names` are the groups in the order of the agent's `type_names`."""
    from sim_bridge.actions import to_deltas

    deltas = to_deltas(mode, actions, len(group_names))
    if deltas.shape[0] != 1:
        raise ValueError(f"expected the decision of one caller, got a batch of {deltas.shape[0]}")
    return {g: int(d) for g, d in zip(group_names, deltas[0])}


def after_action(cooldown_until: Mapping[str, float], group: str, now: float,
                 cooldown_s: float, result: ActionResult | None = None) -> dict[str, float]:
    """The cool-down map after `group` acted at `now` (a new dict; the input is not changed).
    Call it for every attempted, non-dry-run request with its `result`: a call that failed after
    its retries may still have acted on the back-end and cools down, while a request the executor
    refused before any call (`ActionResult.starts_cooldown` false: out of bounds, unknown group)
    or skipped applied nothing and leaves the map as it was."""
    out = dict(cooldown_until)
    if result is not None and not result.starts_cooldown:
        return out
    out[group] = max(out.get(group, -math.inf), now + cooldown_s)
    return out


def warming_instances(inventory: Mapping[str, GroupStatus], now: float,
                      warmup_s: float) -> dict[str, tuple[Instance, ...]]:
    """Per group, the instances still warming up: pending ones, and running ones launched less
    than `warmup_s` ago. Running instances with no known launch time are not counted (they
    cannot be told apart from old ones). Analyze leaves these instances' metrics out; this is
    the same rule exposed for the decision record."""
    out: dict[str, tuple[Instance, ...]] = {}
    for name, status in inventory.items():
        warm = tuple(i for i in status.instances
                     if i.state == "pending"
                     or (i.state == "running" and i.launched_at is not None and now - i.launched_at < warmup_s))
        if warm:
            out[name] = warm
    return out


def choose_victims(status: GroupStatus, count: int = 1, exclude: Iterable[str] = ()) -> list[str]:
    """The instances to remove on scale-in, best first (see the module doc for why)."""
    skip = set(exclude)
    live = [i for i in status.instances
            if i.state != "terminating" and not i.protected and i.instance_id not in skip]

    def key(i: Instance):
        # Unknown launch times: a pending one was most likely just requested (newest); a running
        # one cannot be placed, so it goes after those whose age is known.
        if i.state == "pending":
            age_rank = -(i.launched_at if i.launched_at is not None else math.inf)
        else:
            age_rank = -i.launched_at if i.launched_at is not None else math.inf
        return (0 if i.state == "pending" else 1, age_rank, i.instance_id)

    return [i.instance_id for i in sorted(live, key=key)[:max(count, 0)]]


def effective_bounds(config: Bounds, status: GroupStatus) -> tuple[int, int]:
    """The tighter of the configured bounds and the group's own."""
    return max(config.min, status.min), min(config.max, status.max)


# --- the autoscaling steps of the guard chain (`samm.execute.chain`) --------------------------

def known_group(configs: Mapping[str, Bounds], inventory: Mapping[str, GroupStatus]) -> Step:
    def step(w: Wish, ctx: GuardContext) -> Wish | Skip:
        cfg, status = configs.get(w.target), inventory.get(w.target)
        if cfg is None or status is None:
            where = "configuration" if cfg is None else "inventory"
            return Skip(w.target, w.change, "unknown_group", f"group {w.target!r} is not in the {where}")
        return w.with_data(config=cfg, status=status)

    return step


def wants_change(w: Wish, ctx: GuardContext) -> Wish | Skip:
    return Skip(w.target, w.change, "no_change", "the agent asked for no change") if w.change == 0 else w


def scale_in_stabilisation(window_s: float, last_action_at: Mapping[str, float] | None) -> Step:
    """Scale-in also waits until the group's last action + the stabilisation window."""

    def step(w: Wish, ctx: GuardContext) -> Wish | Skip:
        if w.change < 0 and window_s > 0 and last_action_at:
            acted = last_action_at.get(w.target)
            if acted is not None and ctx.now < acted + window_s:
                t = acted + window_s
                return Skip(w.target, w.change, "cooldown", f"scale-in stabilisation until {t:.0f} ({t - ctx.now:.0f} s left)", t)
        return w

    return step


def settled(hold_scale_out_while_pending: bool) -> Step:
    """The back-end must have converged on its desired capacity before a new target."""

    def step(w: Wish, ctx: GuardContext) -> Wish | Skip:
        status: GroupStatus = w.data["status"]
        if status.live != status.desired:
            return Skip(w.target, w.change, "in_flux",
                        f"desired {status.desired} but {status.live} live instances: the group is still converging")
        pending = sum(1 for i in status.instances if i.state == "pending")
        if w.change > 0 and hold_scale_out_while_pending and pending:
            return Skip(w.target, w.change, "in_flux", f"{pending} instance(s) still pending")
        return w

    return step


def within_bounds(w: Wish, ctx: GuardContext) -> Wish | Skip:
    """Clamp the target into [min, max] (the tighter of config and group); a group outside the
    range (the operator narrowed it) may move towards it, never away."""
    cfg, status = w.data["config"], w.data["status"]
    asked = int(w.change)
    lo, hi = effective_bounds(cfg, status)
    if lo > hi:
        return Skip(w.target, asked, "bounds_conflict",
                    f"configured [{cfg.min}, {cfg.max}] and group [{status.min}, {status.max}] do not overlap")
    current = status.desired
    if asked > 0:
        target = min(current + asked, hi) if current < hi else current
    else:
        target = max(current + asked, lo) if current > lo else current
    delta = target - current
    if delta == 0:
        if asked > 0:
            return Skip(w.target, asked, "at_max", f"desired {current} is {'at' if current == hi else 'above'} max {hi}")
        return Skip(w.target, asked, "at_min", f"desired {current} is {'at' if current == lo else 'below'} min {lo}")
    if delta != asked:
        w = w.note(f"clamped {asked:+d} to {delta:+d} by {f'max {hi}' if asked > 0 else f'min {lo}'}")
    return w.with_data(current=current, target=target, delta=delta)


def removable(w: Wish, ctx: GuardContext) -> Wish | Skip:
    """Scale-in removes only instances not protected from scale-in; a larger step is clamped
    to those, and none left is a skip (not a request the executor must refuse)."""
    if w.data["delta"] >= 0:
        return w
    status: GroupStatus = w.data["status"]
    free = sum(1 for i in status.instances if i.state != "terminating" and not i.protected)
    if free == 0:
        return Skip(w.target, int(w.change), "protected",
                    f"all {status.live} live instance(s) are protected from scale-in")
    if -w.data["delta"] <= free:
        return w
    w = w.note(f"clamped {w.data['delta']:+d} to {-free:+d}: the other instances are protected from scale-in")
    return w.with_data(target=w.data["current"] - free, delta=-free)


def warming_note(warming: Mapping[str, tuple[Instance, ...]]) -> Step:
    def step(w: Wish, ctx: GuardContext) -> Wish:
        return w.note(f"{len(warming[w.target])} instance(s) still warming up") if w.target in warming else w

    return step


def scale_request(w: Wish, ctx: GuardContext) -> Wish:
    """The absolute request, with a scale-in victim (see `choose_victims`)."""
    victim = None
    if w.data["delta"] < 0:
        victims = choose_victims(w.data["status"], 1)
        victim = victims[0] if victims else None
    return w.with_data(request=ScaleRequest(w.target, w.data["target"], w.key, victim, basis=w.data["current"]))


def scaling_steps(configs, inventory, warming, *, scale_in_stabilisation_s: float = 0.0,
                  last_action_at=None, hold_scale_out_while_pending: bool = False) -> list[Step]:
    """The autoscaling guard: problem steps around the shared cool-down and idempotency steps."""
    # no change first: a zero delta for a group missing from the inventory asks nothing, so it
    # is not recorded as a refused (blocked) wish
    return [wants_change, known_group(configs, inventory), cooldown,
            scale_in_stabilisation(scale_in_stabilisation_s, last_action_at),
            settled(hold_scale_out_while_pending), within_bounds, removable, warming_note(warming), idempotency,
            dry_run_flag, scale_request]


def dry_run_flag(w: Wish, ctx: GuardContext) -> Wish:
    # GuardPlan.reasons() adds the dry-run note itself
    return replace(w, execute=not ctx.dry_run)


def whole_delta(value) -> tuple[int, str | None]:
    """(delta, None) for a whole number of instances, else (0, why). A planner's NaN, infinity,
    None or 1.5 is refused for its group alone rather than truncated (1.5 -> +1, -0.4 -> no
    change) or raised (which dropped every group's action of the decision)."""
    if isinstance(value, numbers.Integral):
        return int(value), None
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not (math.isfinite(number) and number.is_integer()):
        return 0, f"delta {value!r} is not a whole number of instances; nothing done"
    return int(number), None


def plan_scaling(deltas: Mapping[str, int], inventory: Mapping[str, GroupStatus],
                 groups: Sequence[Bounds] | Mapping[str, Bounds], cooldown_until: Mapping[str, float],
                 now: float, decision_key: str, dry_run: bool = False, warmup_s: float = 0.0,
                 *, scale_in_stabilisation_s: float = 0.0, last_action_at: Mapping[str, float] | None = None,
                 hold_scale_out_while_pending: bool = False,
                 recorded: Mapping[str, ScaleRequest] | None = None) -> GuardPlan:
    """Decide which of `deltas` ({group: +n / -n / 0}) to perform now, through the guard chain
    (`scaling_steps`).

    `cooldown_until`: group -> time before which it may not act (see `after_action`).
    `scale_in_stabilisation_s` with `last_action_at` (group -> time of its last action):
    scale-in additionally waits until that time + the stabilisation window.
    `recorded`: requests already recorded for this decision, by idempotency key; a replay of
    the decision returns them unchanged instead of recomputing from a newer inventory.
    `warmup_s` is not a gate here (warm-up is about metrics, handled in analyze); it only
    feeds the notes, which say how many instances are still warming.
    A delta that is not a whole number (NaN, infinity, None, 1.5) skips its group as
    `bad_delta`; the other groups are planned as usual.
    """
    configs = dict(groups) if isinstance(groups, Mapping) else {g.name: g for g in groups}
    recorded = recorded or {}
    actions: list[PlannedAction] = []
    # One entry per group: the mapping's keys are unique, so "one request per group" holds by
    # construction; sorted for a stable order in records and logs.
    fresh = []
    bad: list[Skipped] = []
    for group in sorted(deltas):
        asked, problem = whole_delta(deltas[group])
        key = idempotency_key(decision_key, group)
        if key in recorded:
            req = recorded[key]
            status = inventory.get(group)
            current = status.desired if status is not None else req.target
            actions.append(PlannedAction(req, current, asked, req.target - current, execute=not dry_run,
                                         notes=("replay of a recorded request",)))
        elif problem:
            bad.append(Skipped(group, 0, "bad_delta", problem))
        else:
            fresh.append(Wish(group, asked))
    ctx = GuardContext(now, decision_key, dry_run, cooldown_until)
    steps = scaling_steps(configs, inventory, warming_instances(inventory, now, warmup_s),
                          scale_in_stabilisation_s=scale_in_stabilisation_s, last_action_at=last_action_at,
                          hold_scale_out_while_pending=hold_scale_out_while_pending)
    result = run_chain(fresh, steps, ctx)
    for w in result.kept:
        actions.append(PlannedAction(w.data["request"], w.data["current"], int(w.change), w.data["delta"],
                                     execute=w.execute, notes=w.notes))
    actions.sort(key=lambda a: a.group)
    skipped = tuple(bad) + tuple(Skipped(s.target, int(s.change), s.reason, s.detail, s.until) for s in result.skipped)
    return GuardPlan(decision_key, now, dry_run, tuple(actions), skipped)
