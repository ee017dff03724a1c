"""The service's data plane, independent of HTTP (KServe's `dataplane.py`): look up a hosted
policy, turn a JSON observation into the policy's space, check it (shape, bounds, NaN, set
sizes, masks) naming the offending field, keep per-session state, decide.

`InvalidInput` carries the field's path; the REST layer turns it into a 422.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from agents.spaces import BoundedSet, NamedBox, space_to_json


class InvalidInput(ValueError):
    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


def to_space(space: spaces.Space, value: Any, field: str) -> Any:
    """JSON value -> an element of `space` (numpy arrays), or InvalidInput naming the field."""
    if isinstance(space, spaces.Dict):
        if not isinstance(value, dict):
            raise InvalidInput(field, "must be an object")
        missing = [k for k in space.spaces if k not in value]
        unknown = [k for k in value if k not in space.spaces]
        if missing or unknown:
            raise InvalidInput(field, f"missing {missing}, unknown {unknown}")
        return {k: to_space(s, value[k], f"{field}.{k}") for k, s in space.spaces.items()}
    if isinstance(space, BoundedSet):
        rows = np.asarray(value if len(value) else np.zeros((0, *space.row.shape)), dtype=space.row.dtype)
        if len(rows) > space.max_size:
            raise InvalidInput(field, f"{len(rows)} items, over the declared maximum of {space.max_size}")
        for i, r in enumerate(rows):
            _check_box(space.row, r, f"{field}[{i}]")
        return rows
    if isinstance(space, NamedBox):
        if isinstance(value, dict):
            # as for a Dict space: a missing name was a bare KeyError, a misspelt one went unread
            missing = [n for n in space.names if n not in value]
            unknown = [k for k in value if k not in space.names]
            if missing or unknown:
                raise InvalidInput(field, f"missing {missing}, unknown {unknown}")
            value = [value[n] for n in space.names]
        try:
            x = np.asarray(value, dtype=space.dtype)
        except (TypeError, ValueError):
            raise InvalidInput(field, f"must be numbers for {list(space.names)}") from None
        _check_box(space, x, field, names=space.names)
        return x
    if isinstance(space, spaces.Box):
        try:
            x = np.asarray(value, dtype=space.dtype)
        except (TypeError, ValueError):
            raise InvalidInput(field, f"must be numbers of shape {space.shape}") from None
        _check_box(space, x, field)
        return x
    if isinstance(space, spaces.Discrete):
        v = int(value)
        if not space.contains(np.int64(v)):
            raise InvalidInput(field, f"must be in [{space.start}, {space.start + space.n - 1}], got {v}")
        return v
    x = np.asarray(value, dtype=np.int64)
    if not space.contains(x.astype(space.dtype)):
        raise InvalidInput(field, f"not an element of {space}")
    return x


def _check_box(space: spaces.Box, x: np.ndarray, field: str, names=None) -> None:
    if x.shape != space.shape:
        raise InvalidInput(field, f"shape {list(x.shape)} != {list(space.shape)}")
    bad = ~np.isfinite(x) if np.issubdtype(x.dtype, np.floating) else np.zeros(x.shape, bool)
    low = np.broadcast_to(space.low, x.shape)
    high = np.broadcast_to(space.high, x.shape)
    out = (x < low) | (x > high)
    for what, m in (("must be a finite number", bad), ("out of bounds", out)):
        if m.any():
            idx = tuple(int(i) for i in np.argwhere(m)[0])
            where = f"{field}.{names[idx[0]]}" if names else f"{field}{list(idx)}"
            raise InvalidInput(where, f"{what}, got {x[idx]} (allowed [{low[idx]}, {high[idx]}])")


def check_mask(action_space: spaces.Space, mask: Any, field: str = "action_mask") -> np.ndarray | None:
    if mask is None:
        return None
    if not isinstance(action_space, spaces.Discrete):
        raise InvalidInput(field, f"masks are only defined for Discrete actions, not {type(action_space).__name__}")
    m = np.asarray(mask, dtype=np.int8)
    if m.shape != (action_space.n,):
        raise InvalidInput(field, f"length {m.size} != {action_space.n} actions")
    if not m.any():
        raise InvalidInput(field, "every action is masked out; nothing can be decided")
    return m


def describe(name: str, policy) -> dict:
    return {"name": name, "problem": policy.problem, "kind": policy.kind, "policy_version": policy.version,
            "stateful": bool(getattr(policy, "stateful", False)),
            "observation_space": space_to_json(policy.observation_space),
            "action_space": space_to_json(policy.action_space)}


def decide(policy, observation: Any, *, mask=None, deterministic: bool = True, state=None):
    """Validated decision for one caller: (Decision, new state)."""
    obs = to_space(policy.observation_space, observation, "observation")
    m = check_mask(policy.action_space, mask)
    return policy.decide(obs, state, mask=m, deterministic=deterministic)
