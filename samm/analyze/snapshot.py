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

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return self.jobs_waiting_now.shape
