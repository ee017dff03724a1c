"""Built-in reference agents: `noop`, `random` and `static:S,M,L` (hold a fixed fleet)."""
from __future__ import annotations

import numpy as np

from .base import Agent, Decisions, register


def vm_count_features(type_names) -> tuple[str, ...]:
    return tuple(f"vm_count:{t}" for t in type_names)


def keep_actions(mode: str, batch: int, n_types: int) -> np.ndarray:
    if mode == "paper":
        return np.zeros(batch, dtype=np.int64)
    return np.ones((batch, n_types), dtype=np.int64)


def deltas_to_actions(mode: str, deltas: np.ndarray) -> np.ndarray:
    """Per-type wishes (B, n) in {-1, 0, +1} -> env actions. `paper` mode can change one type
    per step: the first type that wants to grow, else the first that wants to shrink (growing
    first protects the queue)."""
    deltas = np.sign(np.asarray(deltas)).astype(np.int64)
    if mode == "per-type":
        return deltas + 1
    out = np.zeros(len(deltas), dtype=np.int64)
    for b, row in enumerate(deltas):
        grow = np.nonzero(row > 0)[0]
        shrink = np.nonzero(row < 0)[0]
        if len(grow):
            out[b] = 1 + 2 * grow[0]
        elif len(shrink):
            out[b] = 2 + 2 * shrink[0]
    return out


@register
class NoopAgent(Agent):
    kind = "noop"

    def __init__(self, feature_names=(), action_mode="paper", type_names=("S", "M", "L"), **kw):
        super().__init__((), action_mode, type_names, **kw)

    def act(self, features, state, deterministic=True):
        return Decisions(keep_actions(self.action_mode, len(features), self.n_types)), state


@register
class RandomAgent(Agent):
    kind = "random"
    stateful = True

    def __init__(self, feature_names=(), action_mode="paper", type_names=("S", "M", "L"), params=None, **kw):
        super().__init__((), action_mode, type_names, params={"seed": 0, **(params or {})}, **kw)

    _row_seeds = None

    def seed_rows(self, seeds) -> None:
        """Row i of the next `initial_state` draws from its own stream of (seed, seeds[i]): an episode's
        actions then depend on its seed alone, not on the other rows of its batch
        (sim_bridge.runner.run_episodes calls it); None: one stream for the whole batch again."""
        self._row_seeds = None if seeds is None else [int(s) % 2**64 for s in seeds]

    def initial_state(self, batch=1):
        rows = self._row_seeds
        if rows is not None and len(rows) == batch:
            return [np.random.default_rng([int(self.params["seed"]), s]) for s in rows]
        return np.random.default_rng(self.params["seed"])

    def act(self, features, state, deterministic=True):
        b = len(features)
        shape = () if self.action_mode == "paper" else (self.n_types,)
        high = 1 + 2 * self.n_types if self.action_mode == "paper" else 3
        if isinstance(state, list):      # one stream per row (seed_rows)
            a = np.stack([g.integers(0, high, size=shape) for g in state])
        else:
            a = state.integers(0, high, size=(b, *shape))
        return Decisions(a), state


@register
class StaticAgent(Agent):
    """Moves the fleet towards fixed per-type counts and holds it there."""

    kind = "static"

    def __init__(self, feature_names=(), action_mode="per-type", type_names=("S", "M", "L"), params=None, **kw):
        params = dict(params or {})
        targets = [int(x) for x in params.get("targets", [])]
        if len(targets) != len(type_names) or min(targets, default=0) < 0:
            raise ValueError(f"static agent needs {len(type_names)} non-negative counts, got {targets}")
        super().__init__(vm_count_features(type_names), action_mode, type_names, params={"targets": targets}, **kw)

    def act(self, features, state, deterministic=True):
        gap = np.asarray(self.params["targets"])[None, :] - np.asarray(features)
        return Decisions(deltas_to_actions(self.action_mode, gap)), state


BUILTIN_POLICIES = ("noop", "random", "static:S,M,L")


def make_builtin_policy(spec: str, action_mode: str, type_names: tuple[str, ...], seed: int = 0) -> Agent:
    if spec == "noop":
        return NoopAgent(action_mode=action_mode, type_names=type_names)
    if spec == "random":
        return RandomAgent(action_mode=action_mode, type_names=type_names, params={"seed": seed})
    if spec.startswith("static:"):
        try:
            targets = [int(x) for x in spec.split(":", 1)[1].split(",")]
        except ValueError:
            raise ValueError(f"static policy needs integer counts, e.g. static:2,1,1; got {spec!r}") from None
        return StaticAgent(action_mode=action_mode, type_names=type_names, params={"targets": targets})
    raise ValueError(f"unknown policy {spec!r}; built-in policies: {', '.join(BUILTIN_POLICIES)}")
