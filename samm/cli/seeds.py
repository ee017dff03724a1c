"""The seed lists every verb and benchmark takes: `1,2,3` or a range `1-5` (both ends included)."""
from __future__ import annotations


def parse_seeds(text: str) -> list[int]:
    """`"1-5"` -> [1, 2, 3, 4, 5]; `"1,3"` -> [1, 3]. Raises ValueError on anything else."""
    if "-" in text and "," not in text:
        a, b = text.split("-")
        return list(range(int(a), int(b) + 1))
    return [int(x) for x in text.split(",") if x.strip()]
