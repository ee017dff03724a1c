"""Named features for agents: the seven metrics plus per-agent extras, computed from the same
raw snapshot on both paths. An agent declares the names it reads, in order.

Extras: ``vm_count:<type>`` (booting + running VMs of that type), ``vm_running:<type>``,
``jobs_waiting``, ``jobs_running``, ``jobs_submitted_interval``.
"""
from __future__ import annotations

import numpy as np

from .metrics import OBSERVATION_NAMES, compute_metrics
from .snapshot import VM_RUNNING, FleetSpec, RawSnapshot

SCALAR_EXTRAS = ("jobs_waiting", "jobs_running", "jobs_submitted_interval")


def known_features(fleet: FleetSpec) -> tuple[str, ...]:
    per_type = tuple(f"{kind}:{t}" for kind in ("vm_count", "vm_running") for t in fleet.names)
    return OBSERVATION_NAMES + per_type + SCALAR_EXTRAS


def validate_feature_names(names, fleet: FleetSpec) -> None:
    unknown = [n for n in names if n not in known_features(fleet)]
    if unknown:
        raise ValueError(f"unknown feature(s) {unknown}; known: {list(known_features(fleet))}")


def compute_features(snap: RawSnapshot, fleet: FleetSpec, names, warmup_s: float = 0.0,
                     metrics: np.ndarray | None = None) -> np.ndarray:
    """float32 array of shape ``batch_shape + (len(names),)``. Pass `metrics` when the caller
    already computed `compute_metrics` for this snapshot."""
    validate_feature_names(names, fleet)
    if metrics is None:
        metrics = compute_metrics(snap, fleet, warmup_s)
    vm_type = np.asarray(snap.vm_type)
    cols = []
    for name in names:
        if name in OBSERVATION_NAMES:
            cols.append(metrics[..., OBSERVATION_NAMES.index(name)].astype(np.float64))
        elif ":" in name:
            kind, tname = name.split(":", 1)
            ti = fleet.names.index(tname)
            sel = vm_type == ti
            if kind == "vm_running":
                sel = sel & (np.asarray(snap.vm_state) == VM_RUNNING)
            cols.append(sel.sum(axis=-1).astype(np.float64))
        else:
            src = {"jobs_waiting": snap.jobs_waiting_now, "jobs_running": snap.jobs_running,
                   "jobs_submitted_interval": snap.jobs_submitted_interval}[name]
            cols.append(np.nan_to_num(np.asarray(src, dtype=np.float64), nan=0.0))
    return np.stack(cols, axis=-1).astype(np.float32)
