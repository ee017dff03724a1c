"""The derived metrics of the main paper, one implementation for the simulator and the daemon.

Definitions (each value is in [0, 1]; VMs are the non-empty slots of a `RawSnapshot`):

1. ``allocated_cores_ratio`` = Σ cores of booting + running VMs / Σ max_count × cores over
   types (the real maximum of the fleet; the prior implementation divided by 3000 hosts × 14
   cores).
2. ``cpu_mean`` = mean of the busy-core fraction of *measured* VMs, where measured = running
   and past the warm-up (``running_for_s >= warmup_s``). 0 when none is measured.
3. ``cpu_p90`` = 90th percentile of the same values, linear interpolation between closest
   ranks (``numpy.percentile``'s default). 0 when none.
4. ``ram_mean`` = mean of RAM used / RAM of the VM's type, over measured VMs.
5. ``ram_p90`` = 90th percentile of the same, linear interpolation.
6. ``waiting_ratio_total`` = jobs waiting now / jobs submitted so far (0 when none submitted).
   Jobs re-queued after their VM was removed count as waiting.
7. ``waiting_ratio_interval`` = of the jobs that arrived during the last interval, the share
   still waiting at its end (0 when none arrived). Numerator and denominator are the same
   cohort, so the ratio cannot leave [0, 1].

Everything is vectorised over VMs and any leading batch shape.
"""
from __future__ import annotations

import numpy as np

from .snapshot import VM_RUNNING, FleetSpec, RawSnapshot

OBSERVATION_NAMES: tuple[str, ...] = (
    "allocated_cores_ratio",
    "cpu_mean",
    "cpu_p90",
    "ram_mean",
    "ram_p90",
    "waiting_ratio_total",
    "waiting_ratio_interval",
)
N_METRICS = len(OBSERVATION_NAMES)


def masked_mean(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Mean over the last axis of the entries where `mask` holds; 0 where none does."""
    count = mask.sum(axis=-1)
    total = np.where(mask, values, 0.0).sum(axis=-1)
    return np.divide(total, count, out=np.zeros(total.shape, dtype=np.float64), where=count > 0)


def masked_percentile(values: np.ndarray, mask: np.ndarray, q: float) -> np.ndarray:
    """q-th percentile (0..100) over the last axis of the masked entries, linear interpolation
    between closest ranks (the same as ``np.percentile(v[mask], q)`` row by row); 0 where the
    mask is empty."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be within [0, 100], got {q}")
    values = np.asarray(values, dtype=np.float64)
    ordered = np.sort(np.where(mask, values, np.inf), axis=-1)
    count = mask.sum(axis=-1)
    pos = (q / 100.0) * np.maximum(count - 1, 0)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, np.maximum(count - 1, 0))
    lo_v = np.take_along_axis(ordered, lo[..., None], axis=-1)[..., 0]
    hi_v = np.take_along_axis(ordered, hi[..., None], axis=-1)[..., 0]
    # empty rows read the +inf padding: replace it before interpolating
    lo_v = np.where(count > 0, lo_v, 0.0)
    hi_v = np.where(count > 0, hi_v, 0.0)
    return lo_v + (hi_v - lo_v) * (pos - lo)


def safe_ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    return np.divide(num, den, out=np.zeros(np.broadcast(num, den).shape), where=den > 0)


def compute_metrics(snap: RawSnapshot, fleet: FleetSpec, warmup_s: float = 0.0) -> np.ndarray:
    """The seven metrics as a float32 array of shape ``batch_shape + (7,)``, in the order of
    `OBSERVATION_NAMES`, clipped to [0, 1]. (Written with few NumPy calls: it runs once per
    environment step for the whole batch.)"""
    vm_type = np.asarray(snap.vm_type)
    present = vm_type >= 0
    type_idx = np.maximum(vm_type, 0)
    cores = fleet.cores[type_idx] * present
    measured = present & (np.asarray(snap.vm_state) == VM_RUNNING) & (np.asarray(snap.vm_running_for_s) >= warmup_s)

    # CPU and RAM side by side on one axis: one mean and one sort for both. NaN or inf in a
    # measurement must never reach a policy: NaN counts as 0, and everything is clipped to
    # [0, 1] (the daemon's snapshot validation decides whether a snapshot is usable at all).
    util = np.stack([np.asarray(snap.vm_cpu_busy, dtype=np.float64),
                     np.asarray(snap.vm_ram_used_gb, dtype=np.float64) / fleet.ram_gb[type_idx]], axis=-2)
    util[np.isnan(util)] = 0.0
    np.clip(util, 0.0, 1.0, out=util)
    mask = np.broadcast_to(measured[..., None, :], util.shape)
    means = masked_mean(util, mask)
    p90 = masked_percentile(util, mask, 90.0)

    out = np.empty(vm_type.shape[:-1] + (N_METRICS,), dtype=np.float64)
    out[..., 0] = cores.sum(axis=-1) / fleet.max_fleet_cores
    out[..., 1], out[..., 2] = means[..., 0], p90[..., 0]
    out[..., 3], out[..., 4] = means[..., 1], p90[..., 1]
    out[..., 5] = safe_ratio(snap.jobs_waiting_now, snap.jobs_submitted_total)
    out[..., 6] = safe_ratio(snap.jobs_waiting_interval, snap.jobs_submitted_interval)
    out[np.isnan(out)] = 0.0
    return np.clip(out, 0.0, 1.0).astype(np.float32)


def allocated_cores(snap: RawSnapshot, fleet: FleetSpec) -> np.ndarray:
    """Absolute booting + running cores (for reports)."""
    vm_type = np.asarray(snap.vm_type)
    present = vm_type >= 0
    return np.where(present, fleet.cores[np.where(present, vm_type, 0)], 0).sum(axis=-1)
