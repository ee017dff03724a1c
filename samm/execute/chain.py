"""The guard as a chain of small pure steps (the VPA's recommendation post-processors, the
HPA's normalisation pipeline): each step takes one wish and the decision's context and returns
the wish (possibly amended) or a `Skip` saying why it will not be performed. No I/O, no clock
reads (`now` is in the context), so every step is tested with hand-made inputs and a decision
can be recomputed from what the knowledge store recorded.

Shared steps live here (one request per target, cool-down, idempotency key, dry-run); each
problem adds its own (autoscaling: known group, in flux, bounds in `samm.execute.guard`;
placement: node capacity and operation constraints in `agents.lra_placement.guard`).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Sequence


@dataclass(frozen=True)
class Wish:
    """One thing a policy wants done to one target (a group, a node, a service)."""

    target: str
    change: Any                      # problem-specific: a VM delta, a container to place, a CPU limit
    key: str | None = None           # idempotency key, set by `idempotency`
    execute: bool = True             # False in dry-run: recorded, never sent
    notes: tuple[str, ...] = ()
    data: Mapping[str, Any] = field(default_factory=dict)  # what later steps and the executor need

    def note(self, text: str) -> "Wish":
        return replace(self, notes=self.notes + (text,))

    def with_data(self, **kw) -> "Wish":
        return replace(self, data={**self.data, **kw})


@dataclass(frozen=True)
class Skip:
    target: str
    change: Any
    reason: str                      # a short code: cooldown, at_max, node_full, anti_affinity, ...
    detail: str                      # for people
    until: float | None = None       # when a time-based block ends


@dataclass(frozen=True)
class GuardContext:
    now: float
    decision_key: str
    dry_run: bool = False
    cooldown_until: Mapping[str, float] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)  # problem-specific state (inventory, cluster)


Step = Callable[[Wish, GuardContext], "Wish | Skip"]


@dataclass(frozen=True)
class ChainResult:
    kept: tuple[Wish, ...] = ()
    skipped: tuple[Skip, ...] = ()

    def reasons(self) -> dict[str, str]:
        return {s.target: f"{s.reason}: {s.detail}" for s in self.skipped}


def run_chain(wishes: Iterable[Wish], steps: Sequence[Step], ctx: GuardContext) -> ChainResult:
    """Pass every wish through `steps` in order; the first Skip ends its way."""
    kept, skipped = [], []
    for wish in wishes:
        out: Wish | Skip = wish
        for step in steps:
            out = step(out, ctx)
            if isinstance(out, Skip):
                break
        (skipped if isinstance(out, Skip) else kept).append(out)
    return ChainResult(tuple(kept), tuple(skipped))


# --- shared steps -------------------------------------------------------------------------------

def one_per_target() -> Step:
    """At most one request per target per decision: later wishes for a target are skipped."""
    seen: set[str] = set()

    def step(w: Wish, ctx: GuardContext) -> Wish | Skip:
        if w.target in seen:
            return Skip(w.target, w.change, "duplicate_target", "one request per target per decision")
        seen.add(w.target)
        return w

    return step


def cooldown(w: Wish, ctx: GuardContext) -> Wish | Skip:
    """A target that acted at t is blocked until t + cool-down (from exactly then on, allowed)."""
    until = ctx.cooldown_until.get(w.target)
    if until is not None and ctx.now < until:
        return Skip(w.target, w.change, "cooldown", f"cool-down until {until:.0f} ({until - ctx.now:.0f} s left)", until)
    return w


def idempotency_key(decision_key: str, target: str) -> str:
    return f"{decision_key}:{target}"


def idempotency(w: Wish, ctx: GuardContext) -> Wish:
    """Key = decision key + target: a replayed decision claims the same key and cannot act twice."""
    return replace(w, key=idempotency_key(ctx.decision_key, w.target))


def dry_run(w: Wish, ctx: GuardContext) -> Wish:
    return replace(w, execute=False).note("dry_run: not executed") if ctx.dry_run else w
