"""The seed lists every verb and benchmark takes: `1,2,3` or a range `1-5` (both ends included)."""
from __future__ import annotations


def parse_seeds(text: str) -> list[int]:
    """`"1-5"` -> [1, 2, 3, 4, 5]; `"1,3"` -> [1, 3]. Raises ValueError on anything else."""
    if "-" in text and "," not in text:
        a, b = text.split("-")
        seeds = list(range(int(a), int(b) + 1))
    else:
        seeds = [int(x) for x in text.split(",")]  # an empty item ("1,,2", "") is a typo, not a skip
    if not seeds:  # "5-1": a run over no episodes would report statistics of nothing
        raise ValueError(f"no seeds in {text!r}")
    return seeds
