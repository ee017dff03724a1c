"""Built-in reference agents: `noop`, `random` and `static:S,M,L` (hold a fixed fleet)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .base import METADATA_FILE, Agent, Decisions, register
from .params import check_param_keys, number_param

ACTION_MODES = ("paper", "per-type")


def check_action_mode(kind: str, mode) -> None:
    """Any other mode would act in `paper` mode while declaring a per-type action space."""
    if mode not in ACTION_MODES:
        raise ValueError(f"{kind}: action_mode must be one of {ACTION_MODES}, got {mode!r}")


class LoadErrorsNameTheFile:
    """Mixed into agents so a saved policy whose metadata.json holds a bad value (an unknown
    action_mode, a parameter out of range, a field of the wrong type) fails in one line naming
    the file, not in a bare constructor error or a traceback."""

    @classmethod
    def _from_metadata(cls, meta, directory):
        try:
            return super()._from_metadata(meta, directory)
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"{Path(directory) / METADATA_FILE}: {exc}") from None


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
class NoopAgent(LoadErrorsNameTheFile, Agent):
    kind = "noop"

    def __init__(self, feature_names=(), action_mode="paper", type_names=("S", "M", "L"), params=None, **kw):
        check_action_mode(self.kind, action_mode)
        check_param_keys(self.kind, params or {}, ())
        super().__init__((), action_mode, type_names, **kw)

    def act(self, features, state, deterministic=True):
        return Decisions(keep_actions(self.action_mode, len(features), self.n_types)), state


@register
class RandomAgent(LoadErrorsNameTheFile, Agent):
    kind = "random"
    stateful = True

    def __init__(self, feature_names=(), action_mode="paper", type_names=("S", "M", "L"), params=None, **kw):
        check_action_mode(self.kind, action_mode)
        p = {"seed": 0, **(params or {})}
        check_param_keys(self.kind, p, ("seed",))
        number_param(self.kind, "seed", p["seed"], whole=True)
        super().__init__((), action_mode, type_names, params=p, **kw)

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
class StaticAgent(LoadErrorsNameTheFile, Agent):
    """Moves the fleet towards fixed per-type counts and holds it there."""

    kind = "static"

    def __init__(self, feature_names=(), action_mode="per-type", type_names=("S", "M", "L"), params=None, **kw):
        check_action_mode(self.kind, action_mode)
        params = dict(params or {})
        check_param_keys(self.kind, params, ("targets",))
        raw = params.get("targets", [])
        if isinstance(raw, (str, bytes, dict)) or not hasattr(raw, "__len__"):
            raise ValueError(f"static agent needs {len(type_names)} non-negative counts, got {raw!r}")
        # int(1.5) would hold 1 VM where 1.5 was asked: a count must be a whole number
        targets = [int(number_param(self.kind, "targets", x, low=0, whole=True)) for x in raw]
        if len(targets) != len(type_names):
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
