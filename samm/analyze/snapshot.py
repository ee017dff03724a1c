"""The raw snapshot: what the Monitor stage knows about the managed fleet after one interval.

Both the simulator (decoded from the Java gateway's packed reply) and, later, the live daemon
(built from Graphite's one-minute roll-ups) produce this same structure, and the analyzer
turns it into observations. Arrays carry any leading batch shape `B` (e.g. `(n_envs,)`, or
`()` for one snapshot); `V` is the number of VM slots, padded with `vm_type == -1`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

VM_BOOTING = 0
VM_RUNNING = 1


@dataclass(frozen=True)
class FleetSpec:
    """Static facts about the managed VM types, aligned with `vm_type` indices."""

    names: tuple[str, ...]
    cores: np.ndarray  # (T,) int
    ram_gb: np.ndarray  # (T,) float
    max_count: np.ndarray  # (T,) int
    min_count: np.ndarray  # (T,) int
    price_per_hour: np.ndarray  # (T,) float

    @property
    def n_types(self) -> int:
        return len(self.names)

    @property
    def max_fleet_cores(self) -> float:
        return float(np.sum(self.cores * self.max_count))

    @classmethod
    def from_vm_types(cls, vm_types) -> "FleetSpec":
        return cls(
            names=tuple(t.name for t in vm_types),
            cores=np.array([t.cores for t in vm_types], dtype=np.int64),
            ram_gb=np.array([t.ram_gb for t in vm_types], dtype=np.float64),
            max_count=np.array([t.max for t in vm_types], dtype=np.int64),
            min_count=np.array([t.min for t in vm_types], dtype=np.int64),
            price_per_hour=np.array([t.price_per_hour for t in vm_types], dtype=np.float64),
        )


@dataclass(frozen=True)
class RawSnapshot:
    """Per-VM measurements and queue counters for one monitoring interval."""

    vm_type: np.ndarray  # (B..., V) int, -1 = empty slot
    vm_state: np.ndarray  # (B..., V) VM_BOOTING / VM_RUNNING
    vm_cpu_busy: np.ndarray  # (B..., V) busy-core fraction averaged over the interval, 0..1
    vm_ram_used_gb: np.ndarray  # (B..., V)
    vm_running_for_s: np.ndarray  # (B..., V) seconds since boot finished, -1 while booting
    jobs_submitted_total: np.ndarray  # (B...)
    jobs_submitted_interval: np.ndarray  # (B...) arrivals during the interval
    jobs_waiting_now: np.ndarray  # (B...) queued at the end of the interval
    jobs_waiting_interval: np.ndarray  # (B...) of the interval's arrivals, still queued at its end
    jobs_running: np.ndarray  # (B...) running at the end of the interval
    # What queue-based rules see (the `extended` feature set); None where the source cannot
    # tell (an older Graphite schema): features built on them are then NaN, and the daemon's
    # feature validation refuses to act on NaN.
    jobs_waiting_cores: np.ndarray | None = None  # (B...) Σ cores of the queued jobs
    jobs_running_cores: np.ndarray | None = None  # (B...) Σ cores of the running jobs
    head_job_cores: np.ndarray | None = None  # (B...) cores of the head-of-line job, 0 = empty queue
    since_action_s: np.ndarray | None = None  # (B...) seconds since the last applied action, -1 = none yet

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return self.jobs_waiting_now.shape

    def with_rows(self, index, other: "RawSnapshot") -> "RawSnapshot":
        """A copy whose batch rows `index` come from `other` (rows of a reset, say)."""
        out = {}
        for f in self.__dataclass_fields__:
            mine, theirs = getattr(self, f), getattr(other, f)
            if mine is None or theirs is None:
                out[f] = None
                continue
            arr = np.array(mine, copy=True)
            arr[index] = theirs
            out[f] = arr
        return RawSnapshot(**out)

    def select(self, index) -> "RawSnapshot":
        """The snapshot of some batch rows (`index` on the leading axis)."""
        return RawSnapshot(**{f: None if getattr(self, f) is None else np.asarray(getattr(self, f))[index]
                              for f in self.__dataclass_fields__})
