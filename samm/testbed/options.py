"""The one check every testbed applies to its numeric run options before anything starts."""
from __future__ import annotations

import math


def number_problem(name: str, value, lo: float = 0.0, strict: bool = False) -> str | None:
    """Why `value` is not a finite number >= lo (> lo when `strict`), or None when it is. A bool
    is not a number here, and NaN or inf never are: a NaN timeout never fires, an infinite one
    never ends."""
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
          and (value > lo if strict else value >= lo))
    return None if ok else f"{name} must be a finite number {'>' if strict else '>='} {lo:g}, got {value!r}"
