"""The main paper's synthetic workload `seed-1551`, exactly as its authors generated it: it
resembles one run of pytorch-dnn-evolution (batches of independent 1-core evaluations)."""
from __future__ import annotations

import numpy as np

from .model import Workload

PAPER_MIPS = 4400.0
FIRST_BATCH_S = 1800.0
BATCH_EVERY_S = 480.0
BATCH_SIZES = (100,) * 10 + (50,) * 11  # 1000 + 550 = 1550 jobs
JOB_SECONDS = 360.0
SENTINEL_AT_S = 13680.0  # 38 min after the last batch (t = 11,400 s)
SENTINEL_SECONDS = 1.0
DEFAULT_RAM_GB_PER_CORE = 0.5


def seed_1551(ram_gb_per_job: float = DEFAULT_RAM_GB_PER_CORE) -> Workload:
    arrivals = [FIRST_BATCH_S + i * BATCH_EVERY_S for i, n in enumerate(BATCH_SIZES) for _ in range(n)]
    lengths = [JOB_SECONDS * PAPER_MIPS] * len(arrivals)
    arrivals.append(SENTINEL_AT_S)
    lengths.append(SENTINEL_SECONDS * PAPER_MIPS)
    n = len(arrivals)
    return Workload(
        name="seed-1551",
        arrival_s=np.asarray(arrivals, dtype=np.float64),
        length_mi=np.asarray(lengths, dtype=np.float64),
        cores=np.ones(n, dtype=np.int32),
        ram_gb=np.full(n, ram_gb_per_job, dtype=np.float64),
    )


SHORT_BATCHES = 6


def seed_1551_short(batches: int = SHORT_BATCHES, ram_gb_per_job: float = DEFAULT_RAM_GB_PER_CORE) -> Workload:
    """The first `batches` batches of `seed-1551` (default 6 x 100 jobs, the last arriving at
    t = 4,200 s), same idle start, no sentinel: the paper's workload cut to fit the emulated
    testbed's ten-minute demo. Used by `samm demo`; named `seed-1551-short`."""
    if not 1 <= batches <= len(BATCH_SIZES):
        raise ValueError(f"batches must be within [1, {len(BATCH_SIZES)}], got {batches}")
    full = seed_1551(ram_gb_per_job)
    n = sum(BATCH_SIZES[:batches])
    return Workload(name="seed-1551-short" if batches == SHORT_BATCHES else f"seed-1551-first{batches}",
                    arrival_s=full.arrival_s[:n].copy(), length_mi=full.length_mi[:n].copy(),
                    cores=full.cores[:n].copy(), ram_gb=full.ram_gb[:n].copy())
