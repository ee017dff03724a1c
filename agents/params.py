"""Checks of an agent's or a hosted policy's parameters, shared by every problem: a misspelt key or
a value out of range is an error naming it, never a silent default."""
from __future__ import annotations

import math


def check_param_keys(kind: str, params: dict, known) -> None:
    """A misspelt parameter would otherwise be kept and ignored: the agent runs on its default."""
    if not isinstance(params, dict):
        raise ValueError(f"{kind}: parameters must be a mapping of names to values, got {params!r}")
    unknown = sorted(set(params) - set(known), key=str)
    if unknown:
        raise ValueError(f"{kind}: unknown parameter {unknown[0]!r} (known: {', '.join(sorted(known)) or 'none'})")


def number_param(kind: str, key: str, value, low: float | None = None, high: float | None = None,
                 low_open: bool = False, whole: bool = False) -> float:
    """`value` as a finite number within [low, high] ((low, high] with `low_open`), a whole number
    with `whole`; else a ValueError naming the parameter."""
    try:
        x = float(value)
    except OverflowError:   # an integer past any float (400 digits of JSON or YAML): not finite
        x = math.inf
    except (TypeError, ValueError):
        x = None
    kind_of = "a whole number" if whole else "a number"
    if isinstance(value, bool) or x is None:
        raise ValueError(f"{kind}: {key} must be {kind_of}, got {value!r}")
    if not math.isfinite(x):
        raise ValueError(f"{kind}: {key} must be a finite number, got {value!r}")
    if whole and x != int(x):
        raise ValueError(f"{kind}: {key} must be {kind_of}, got {value!r}")
    too_low = low is not None and (x <= low if low_open else x < low)
    if too_low or (high is not None and x > high):
        lo = "" if low is None else f"{'>' if low_open else '>='} {low:g}"
        hi = "" if high is None else f"<= {high:g}"
        raise ValueError(f"{kind}: {key} must be {kind_of} {' and '.join(b for b in (lo, hi) if b)}, got {value!r}")
    return x


def number_list_param(kind: str, key: str, value, n: int, low: float = 0.0, low_open: bool = False) -> list[float]:
    """One number per VM type, each checked as by `number_param`."""
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__len__") or len(value) != n:
        raise ValueError(f"{kind}: {key} needs one number per VM type ({n}), got {value!r}")
    return [number_param(kind, f"{key}[{i}]", v, low=low, low_open=low_open) for i, v in enumerate(value)]
