"""Workloads the simulator replays: the paper's `seed-1551` and SWF traces."""
from __future__ import annotations

import numbers
from pathlib import Path

from .model import Workload
from .paper import seed_1551, seed_1551_short
from .swf import SwfTransform, load_swf, read_swf_table

BUILTIN = {"seed-1551": seed_1551, "seed-1551-short": seed_1551_short}


def load_workload(spec: str | Path, transform: SwfTransform | None = None, core_cap: int | None = None) -> Workload:
    """`seed-1551` (built in) or a path to an SWF file (plain or .gz)."""
    if core_cap is not None and (not isinstance(core_cap, numbers.Integral) or core_cap < 1):
        # 0 used to mean "no cap" and a negative cap failed as "every job needs a positive length"
        raise ValueError(f"workload {spec!r}: core_cap must be an integer >= 1 (or None), got {core_cap!r}")
    if str(spec) in BUILTIN:
        if transform is not None:
            raise ValueError(f"SWF transforms do not apply to the built-in workload {spec!r}")
        workload = BUILTIN[str(spec)]()
        return workload.cap_cores(core_cap) if core_cap else workload
    path = Path(spec)
    if not path.exists():
        raise FileNotFoundError(f"workload {spec!r}: neither a built-in name ({', '.join(BUILTIN)}) nor an existing file")
    if not path.is_file():  # a trace is read whole: /dev/zero or a FIFO would be read without end
        raise ValueError(f"workload {spec!r}: not a regular file")
    return load_swf(path, transform, default_core_cap=core_cap)


__all__ = ["BUILTIN", "SwfTransform", "Workload", "load_swf", "load_workload", "read_swf_table", "seed_1551", "seed_1551_short"]

# Workload distributions for training (issue 11): see docs/workloads.md, "Workload mixes".
from .mix import (  # noqa: E402
    TEST_TRACES,
    TEST_WINDOWS,
    TRAIN_TRACES,
    WindowSpec,
    WorkloadMix,
    WorkloadSampler,
    build_window,
    load_mix,
    offered_load,
    pwa_dir,
)

__all__ += ["TEST_TRACES", "TEST_WINDOWS", "TRAIN_TRACES", "WindowSpec", "WorkloadMix", "WorkloadSampler",
            "build_window", "load_mix", "offered_load", "pwa_dir"]
