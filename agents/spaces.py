"""Spaces are the contract between a problem, its policies and the service.

Gymnasium spaces describe every observation and action; this module adds what serving needs:

* a JSON round trip (`space_to_json` / `space_from_json`) so a saved policy records its spaces
  in `metadata.json` and loading compares them (`check_spaces`), as Stable-Baselines3 does;
* `NamedBox`: a 1-D Box whose components have names (the autoscaler's seven metrics stay a named
  object on the wire);
* `BoundedSet`: a variable-length set of rows with a declared maximum (OSDEC's jobs,
  Reclaimer's services). Gymnasium's `Sequence` has no maximum, and a service must refuse a set
  larger than the policy was built for.

One small function per space type (`functools.singledispatch`), as Gymnasium's `spaces/utils.py`.
"""
from __future__ import annotations

import functools
import json
from typing import Any, Sequence

import numpy as np
from gymnasium import spaces


class NamedBox(spaces.Box):
    """A 1-D Box whose components are named (`names[i]` is component i)."""

    def __init__(self, names: Sequence[str], low, high, dtype=np.float32, seed=None):
        names = tuple(str(n) for n in names)
        if len(set(names)) != len(names):
            raise ValueError(f"component names must be unique, got {names}")
        super().__init__(low=np.broadcast_to(np.asarray(low, dtype), (len(names),)).copy(),
                         high=np.broadcast_to(np.asarray(high, dtype), (len(names),)).copy(),
                         shape=(len(names),), dtype=dtype, seed=seed)
        self.names = names

    def __eq__(self, other) -> bool:
        return isinstance(other, NamedBox) and self.names == other.names and super().__eq__(other)

    def __repr__(self) -> str:
        return f"NamedBox({list(self.names)})"


class BoundedSet(spaces.Space):
    """A set of 0..max_size rows, each an element of `row` (a Box). Samples and values are
    (k, *row.shape) arrays with k <= max_size."""

    def __init__(self, row: spaces.Box, max_size: int, seed=None):
        if not isinstance(row, spaces.Box):
            raise TypeError("BoundedSet rows must be a Box")
        if max_size < 1:
            raise ValueError("max_size must be >= 1")
        self.row, self.max_size = row, int(max_size)
        super().__init__(None, None, seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask=None, probability=None):
        k = int(self.np_random.integers(0, self.max_size + 1))
        return np.stack([self.row.sample() for _ in range(k)]) if k else np.zeros((0, *self.row.shape), self.row.dtype)

    def contains(self, x) -> bool:
        x = np.asarray(x)
        if x.ndim != 1 + len(self.row.shape) or x.shape[0] > self.max_size:
            return False
        return all(self.row.contains(r.astype(self.row.dtype)) for r in x)

    def __eq__(self, other) -> bool:
        return isinstance(other, BoundedSet) and self.max_size == other.max_size and self.row == other.row

    def __repr__(self) -> str:
        return f"BoundedSet({self.row!r}, max_size={self.max_size})"


def _bound(a: np.ndarray) -> Any:
    """Box bounds as JSON: one number when uniform, else a nested list; inf as a string."""
    a = np.asarray(a, dtype=np.float64)
    conv = np.vectorize(lambda v: v if np.isfinite(v) else ("inf" if v > 0 else "-inf"), otypes=[object])
    if a.size and np.all(a == a.flat[0]):
        return conv(np.array(a.flat[0])).item()
    return conv(a).tolist()


def _unbound(v, shape, dtype) -> np.ndarray:
    def num(x):
        return float(x) if not isinstance(x, str) else float(x)

    arr = np.vectorize(num, otypes=[np.float64])(np.asarray(v, dtype=object)) if not np.isscalar(v) else np.float64(num(v))
    return np.broadcast_to(np.asarray(arr, dtype=np.float64), shape).astype(dtype)


@functools.singledispatch
def space_to_json(space: spaces.Space) -> dict:
    raise TypeError(f"no JSON form for {type(space).__name__}")


@space_to_json.register
def _(space: spaces.Box) -> dict:
    out = {"type": "Box", "shape": list(space.shape), "dtype": str(space.dtype),
           "low": _bound(space.low), "high": _bound(space.high)}
    if isinstance(space, NamedBox):
        out["type"], out["names"] = "NamedBox", list(space.names)
        del out["shape"]
    return out


@space_to_json.register
def _(space: spaces.Discrete) -> dict:
    return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}


@space_to_json.register
def _(space: spaces.MultiDiscrete) -> dict:
    return {"type": "MultiDiscrete", "nvec": np.asarray(space.nvec).tolist()}


@space_to_json.register
def _(space: spaces.MultiBinary) -> dict:
    return {"type": "MultiBinary", "n": np.asarray(space.n).tolist()}


@space_to_json.register
def _(space: spaces.Dict) -> dict:
    return {"type": "Dict", "spaces": {k: space_to_json(v) for k, v in space.spaces.items()}}


@space_to_json.register
def _(space: spaces.Tuple) -> dict:
    return {"type": "Tuple", "spaces": [space_to_json(s) for s in space.spaces]}


@space_to_json.register
def _(space: BoundedSet) -> dict:
    return {"type": "BoundedSet", "row": space_to_json(space.row), "max_size": space.max_size}


#: the most components a Box read from JSON may have (the shipped policies' largest has ~2,000): the
#: bounds are allocated whole, so an uploaded metadata.json declaring [100000, 100000] took 37 GB
MAX_BOX_ELEMENTS = 10_000_000


def _box_shape(shape) -> tuple[int, ...]:
    whole = isinstance(shape, (list, tuple)) and all(isinstance(n, int) and not isinstance(n, bool) for n in shape)
    if not whole or min(shape, default=0) < 0:
        raise ValueError(f"Box shape must be a list of whole numbers >= 0, got {shape!r:.80}")
    if int(np.prod(shape, dtype=object)) > MAX_BOX_ELEMENTS:
        raise ValueError(f"Box shape {shape} has more than {MAX_BOX_ELEMENTS:,} components")
    return tuple(shape)


def _members(d: dict, kind: type):
    """A Dict's or Tuple's member descriptions, of the JSON type they must have."""
    members = d.get("spaces")
    if not isinstance(members, kind):   # a list where a mapping goes was an AttributeError
        raise ValueError(f"{d['type']} spaces must be a JSON {'object' if kind is dict else 'list'}, "
                         f"got {members!r:.80}")
    return members


def space_from_json(d: dict) -> spaces.Space:
    if not isinstance(d, dict) or "type" not in d:
        raise ValueError(f"not a space description: {d!r}")
    t = d["type"]
    if t == "NamedBox":
        dtype = np.dtype(d.get("dtype", "float32"))
        n = _box_shape([len(d["names"])])
        return NamedBox(d["names"], _unbound(d["low"], n, dtype), _unbound(d["high"], n, dtype), dtype=dtype)
    if t == "Box":
        shape, dtype = _box_shape(d["shape"]), np.dtype(d["dtype"])
        return spaces.Box(_unbound(d["low"], shape, dtype), _unbound(d["high"], shape, dtype), shape=shape, dtype=dtype)
    if t == "Discrete":
        return spaces.Discrete(int(d["n"]), start=int(d.get("start", 0)))
    if t == "MultiDiscrete":
        return spaces.MultiDiscrete(d["nvec"])
    if t == "MultiBinary":
        return spaces.MultiBinary(d["n"])
    if t == "Dict":
        return spaces.Dict({k: space_from_json(v) for k, v in _members(d, dict).items()})
    if t == "Tuple":
        return spaces.Tuple([space_from_json(v) for v in _members(d, list)])
    if t == "BoundedSet":
        return BoundedSet(space_from_json(d["row"]), int(d["max_size"]))
    raise ValueError(f"unknown space type {t!r}")


def same_space(a: spaces.Space, b: spaces.Space) -> bool:
    """Equal as JSON (dtype, shape, bounds, names): what a saved policy must match."""
    return json.dumps(space_to_json(a), sort_keys=True) == json.dumps(space_to_json(b), sort_keys=True)


def check_spaces(saved_obs: spaces.Space, saved_act: spaces.Space, obs: spaces.Space, act: spaces.Space,
                 what: str = "policy") -> None:
    """Raise ValueError naming the space that differs (Stable-Baselines3's check_for_correct_spaces)."""
    if not same_space(saved_obs, obs):
        raise ValueError(f"{what}: observation space {saved_obs} does not match {obs}")
    if not same_space(saved_act, act):
        raise ValueError(f"{what}: action space {saved_act} does not match {act}")
