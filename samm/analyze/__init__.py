"""Analyze stage: raw snapshots in, the paper's seven derived metrics out (one implementation
for the simulator path and the live daemon)."""
from .metrics import N_METRICS, OBSERVATION_NAMES, allocated_cores, compute_metrics
from .snapshot import VM_BOOTING, VM_RUNNING, FleetSpec, RawSnapshot

__all__ = [
    "N_METRICS",
    "OBSERVATION_NAMES",
    "VM_BOOTING",
    "VM_RUNNING",
    "FleetSpec",
    "RawSnapshot",
    "allocated_cores",
    "compute_metrics",
]
