"""The Execute stage's contract: what every executor (AWS ASG, Docker, simulator) offers.

Executors are thin I/O adapters. Every safety rule (bounds, cool-down, warm-up, idempotency,
dry-run) lives in `samm.execute.guard`, in front of them, as pure decisions; executors still
validate bounds themselves as a last line of defence because some back-ends (moto) do not. A
request refused there, before any call that changes the back-end, is `refused`: it failed, and no
cool-down is due for it (`ActionResult.starts_cooldown`, which `guard.after_action` reads).
"""
from __future__ import annotations

import math
import numbers
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Literal

InstanceState = Literal["pending", "running", "terminating"]


@dataclass(frozen=True)
class Instance:
    group: str
    instance_id: str
    state: InstanceState
    launched_at: float | None = None  # epoch seconds when known
    # protected from scale-in (an ASG's ProtectedFromScaleIn, e.g. set by ECS managed
    # termination protection on hosts with tasks): never chosen as a victim
    protected: bool = False


@dataclass(frozen=True)
class GroupStatus:
    name: str
    desired: int
    min: int
    max: int
    instances: tuple[Instance, ...] = ()

    @property
    def live(self) -> int:
        """Instances that count against capacity (pending or running)."""
        return sum(1 for i in self.instances if i.state != "terminating")


@dataclass(frozen=True)
class ScaleRequest:
    """One change to one group. `target` is the absolute desired capacity computed at decision
    time, so replaying the same request is harmless; `victim` names the instance to remove on
    scale-in (None lets the executor choose); `basis` is the desired capacity the decision saw
    (None: unknown), which gives the request its direction (see `moved_past`)."""

    group: str
    target: int
    idempotency_key: str
    victim: str | None = None
    basis: int | None = None


def moved_past(request: ScaleRequest, desired: int) -> str | None:
    """Why `request` must not act on a group now at `desired`, or None.

    An absolute target reverses its meaning when someone else (an operator, another tool)
    moves the group past it between the decision and the call: a scale-out decision would
    terminate instances, a scale-in one would launch them. Moved the other way, beyond the
    basis, the target would undo that move and take a larger step than was decided (-1 from 4
    with the group raised to 5 terminates two). Progress towards the target (a replay after a
    partial scale-in) still proceeds."""
    if request.basis is None or request.basis == request.target:
        return None
    outward = request.target > request.basis
    direction = "out" if outward else "in"
    if (outward and desired > request.target) or (not outward and desired < request.target):
        return (f"desired capacity moved from {request.basis} to {desired}, past the target {request.target}, "
                f"since the decision to scale {direction}; not reversing it")
    if (outward and desired < request.basis) or (not outward and desired > request.basis):
        return (f"desired capacity moved from {request.basis} to {desired}, away from the target {request.target}, "
                f"since the decision to scale {direction}; not undoing that move")
    return None


@dataclass
class ActionResult:
    status: Literal["succeeded", "failed", "skipped", "dry_run"]
    detail: dict = field(default_factory=dict)
    error: str | None = None
    # False: refused before any call that could change the back-end (a target out of bounds, an
    # unknown group, no image): nothing was applied. True for everything else, a failure included,
    # since a call that failed after its retries may still have acted.
    may_have_acted: bool = True

    @property
    def starts_cooldown(self) -> bool:
        """Whether the group's cool-down starts with this outcome: only when something was (or may
        have been) applied. A refused request must not block the next, legitimate one."""
        return self.status in ("succeeded", "failed") and self.may_have_acted


def refused(detail: dict, error: str) -> ActionResult:
    """A request the executor refuses before any call that changes the back-end (no cool-down)."""
    return ActionResult("failed", detail, error, may_have_acted=False)


def finite_float(value) -> float | None:
    """`value` as a float when it is a finite real number, else None. numpy scalars count (an
    agent's np.float32 is a number of cores), a bool does not, and neither does an int too large
    for a float (float() of it raises OverflowError, which callers refusing ValueError missed)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        number = float(value)
    except (OverflowError, TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


class ExecutorError(RuntimeError):
    """A back-end refused or failed a call after its retries; the message names the call."""


class Executor(ABC):
    kind: str = "abstract"

    @abstractmethod
    def inventory(self) -> dict[str, GroupStatus]:
        """Current desired capacity, bounds and instances of every managed group."""

    @abstractmethod
    def apply(self, request: ScaleRequest) -> ActionResult:
        """Bring `request.group` to `request.target`. Must be safe to call twice with the same
        request (the second call finds the target already met and changes nothing)."""

    def close(self) -> None:  # pragma: no cover - default no-op
        pass
