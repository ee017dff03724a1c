"""Action spaces and their translation to per-type VM deltas (what the simulator applies).

* ``paper``: ``Discrete(1 + 2n)`` with the PINNED mapping 0 = nothing, 1 + 2i = add one VM of
  type i, 2 + 2i = remove one VM of type i (for S/M/L: 1/2 add/remove S, 3/4 M, 5/6 L).
* ``per-type``: ``MultiDiscrete([3] * n)``: for every type at once 0 = remove one, 1 = keep,
  2 = add one, as a set of real Auto Scaling Groups acts.
"""
from __future__ import annotations

import numpy as np
from gymnasium import spaces

from .config import ActionMode


def action_space(mode: ActionMode, n_types: int) -> spaces.Space:
    if mode == "paper":
        return spaces.Discrete(1 + 2 * n_types)
    if mode == "per-type":
        return spaces.MultiDiscrete(np.full(n_types, 3, dtype=np.int64))
    raise ValueError(f"unknown action mode {mode!r}")


def action_names(mode: ActionMode, type_names: tuple[str, ...]) -> list[str]:
    if mode == "paper":
        names = ["nothing"]
        for t in type_names:
            names += [f"add {t}", f"remove {t}"]
        return names
    return [f"{t}: remove/keep/add" for t in type_names]


def integer_actions(actions) -> np.ndarray:
    """`actions` as int64. A fractional or non-finite value is an error: casting would truncate
    1.5 to 1 (another action than asked) and NaN to a huge negative number."""
    a = np.asarray(actions)
    if a.dtype.kind == "O":  # e.g. a list mixing Python and NumPy numbers
        try:
            a = a.astype(np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"actions must be whole numbers, got {str(a.tolist())[:80]}") from None
    if a.dtype.kind == "f":
        if not np.all(np.isfinite(a) & (a == np.round(a))):
            raise ValueError(f"actions must be whole numbers, got {a.tolist()}")
    elif a.dtype.kind not in "iub":
        raise ValueError(f"actions must be whole numbers, got {a.dtype} values {str(a.tolist())[:80]}")
    return a.astype(np.int64)


def to_deltas(mode: ActionMode, actions, n_types: int, n_envs: int | None = None) -> np.ndarray:
    """Actions of a batch (shape (E,) for `paper`, (E, n) for `per-type`) -> int8 (E, n).
    `n_envs`: the E the batch must have (its first axis)."""
    a = integer_actions(actions)
    deltas = _deltas(mode, a, n_types)
    if n_envs is not None and (a.shape[:1] != (n_envs,) or len(deltas) != n_envs):
        # else 3 actions for 4 envs met the liveness guard as NumPy's "operands could not be
        # broadcast", and a (2, 2) array of paper actions passed for 4 envs, flattened
        raise ValueError(f"expected one action per environment ({n_envs}), got actions of shape {list(a.shape)}")
    return deltas


def _deltas(mode: ActionMode, a: np.ndarray, n_types: int) -> np.ndarray:
    if mode == "paper":
        a = a.reshape(-1)
        if np.any((a < 0) | (a > 2 * n_types)):
            raise ValueError(f"paper actions must be within [0, {2 * n_types}], got {a.tolist()}")
        deltas = np.zeros((len(a), n_types), dtype=np.int8)
        idx = np.nonzero(a > 0)[0]
        kind = (a[idx] - 1) % 2  # 0 = add, 1 = remove
        deltas[idx, (a[idx] - 1) // 2] = np.where(kind == 0, 1, -1)
        return deltas
    if mode == "per-type":
        if a.ndim == 0 or a.shape[-1] != n_types:  # reshape would fail with numpy's own words
            raise ValueError(f"per-type action must hold one value per VM type ({n_types}), "
                             f"got {str(a.tolist())[:80]} of shape {list(a.shape)}")
        a = a.reshape(-1, n_types)
        if np.any((a < 0) | (a > 2)):
            raise ValueError(f"per-type actions must be 0, 1 or 2, got {a.tolist()}")
        return (a - 1).astype(np.int8)
    raise ValueError(f"unknown action mode {mode!r}")


def action_masks(mode: ActionMode, can_add: np.ndarray, can_remove: np.ndarray, in_cooldown: np.ndarray):
    """Which actions would be applied now. `paper`: bool (E, 1 + 2n); `per-type`: bool (E, n, 3)
    (remove, keep, add). Keeping or doing nothing is always allowed."""
    add = can_add & ~in_cooldown[:, None]
    rem = can_remove & ~in_cooldown[:, None]
    if mode == "paper":
        e, n = add.shape
        mask = np.ones((e, 1 + 2 * n), dtype=bool)
        mask[:, 1::2] = add
        mask[:, 2::2] = rem
        return mask
    return np.stack([rem, np.ones_like(add), add], axis=-1)
