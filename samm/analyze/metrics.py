"""The derived metrics of the main paper, one implementation for the simulator and the daemon.

Definitions (each value is in [0, 1]; VMs are the non-empty slots of a `RawSnapshot`):

1. ``allocated_cores_ratio`` = Σ cores of booting + running VMs / Σ max_count × cores over
   types (the real maximum of the fleet; the prior implementation divided by 3000 hosts × 14
   cores).
2. ``cpu_mean`` = mean of the busy-core fraction of *measured* VMs, where measured = running
   and past the warm-up (``running_for_s >= warmup_s``). 0 when none is measured. A NaN sample
   is missing: that VM is left out (neither idle nor busy), and when every measured VM's sample
   is missing the metric is NaN (unknown), which the daemon refuses to act on.
3. ``cpu_p90`` = 90th percentile of the same values, linear interpolation between closest
   ranks (``numpy.percentile``'s default). 0 when none, NaN when every sample is missing.
4. ``ram_mean`` = mean of RAM used / RAM of the VM's type, over measured VMs (NaN samples
   missing, as for CPU).
5. ``ram_p90`` = 90th percentile of the same, linear interpolation.
6. ``waiting_ratio_total`` = jobs waiting now / jobs submitted so far (0 when none submitted).
   Jobs re-queued after their VM was removed count as waiting.
7. ``waiting_ratio_interval`` = of the jobs that arrived during the last interval, the share
   still waiting at its end (0 when none arrived). Numerator and denominator are the same
   cohort, so the ratio cannot leave [0, 1].
   Either ratio is NaN (unknown) when one of its counts is missing (NaN): a missing queue is not
   an empty one, and the daemon decides nothing on an unknown feature.

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


try:  # setup.cfg requires numba; without it the same kernel runs as plain Python (slowly)
    from numba import njit
except ImportError:  # pragma: no cover - exercised only without numba
    def njit(*_args, **_kwargs):
        return lambda f: f


@njit(cache=True, nogil=True)
def _percentile_sorted(ordered, count, q):
    """q-th percentile (0..100) of the first `count` entries of an ascending array, linear
    interpolation between closest ranks (``numpy.percentile``'s default); 0 when `count` is 0."""
    if count == 0:
        return 0.0
    pos = (q / 100.0) * (count - 1)
    lo = int(np.floor(pos))
    hi = min(lo + 1, count - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@njit(cache=True, nogil=True)
def _clip01(x):
    if np.isnan(x) or x <= 0.0:  # NaN counts as 0
        return 0.0
    return 1.0 if x > 1.0 else x


@njit(cache=True, nogil=True)
def _sample_stats(values, count, measured):
    """(mean, p90) of the first `count` of `values` (each already in [0, 1]): 0 when no VM is
    measured, NaN when VMs are measured but none has a sample (their load is unknown: a 0 there
    read as an idle fleet and could remove capacity on missing data)."""
    if count == 0:
        return (np.nan, np.nan) if measured else (0.0, 0.0)
    ordered = np.sort(values[:count])
    return _clip01(ordered.sum() / count), _clip01(_percentile_sorted(ordered, count, 90.0))


@njit(cache=True, nogil=True)
def _unit(x):
    """`_clip01` that keeps NaN (unknown) as NaN."""
    return x if np.isnan(x) else _clip01(x)


@njit(cache=True, nogil=True)
def _ratio(num, den):
    if np.isnan(num) or np.isnan(den):  # a missing count: the ratio is unknown, not an empty queue
        return np.nan
    return num / den if den > 0.0 else 0.0


_BAD_CAPACITY, _BAD_TYPE, _BAD_RAM = 1, 2, 3


@njit(cache=True, nogil=True)
def _metrics_kernel(vm_type, vm_state, cpu, ram, running_for, warmup_s, type_cores, type_ram, type_max,
                    waiting_now, submitted_total, waiting_int, submitted_int, out):
    """One pass per snapshot row over its VM slots: the seven metrics of the module docstring.
    Returns 0, or a `_BAD_*` code for `compute_metrics` to name (compiled code neither checks
    indices nor names values in its errors)."""
    n_rows, n_slots = vm_type.shape
    n_types = type_cores.shape[0]
    max_fleet_cores = 0.0
    for t in range(n_types):
        max_fleet_cores += type_cores[t] * type_max[t]
    if not max_fleet_cores > 0.0:
        return _BAD_CAPACITY
    cpu_m = np.empty(n_slots)
    ram_m = np.empty(n_slots)
    for r in range(n_rows):
        cores = 0.0
        measured, kc, kr = 0, 0, 0
        for v in range(n_slots):
            t = vm_type[r, v]
            if t < 0:
                continue
            if t >= n_types:  # an unchecked index would read whatever memory lies past the fleet's arrays
                return _BAD_TYPE
            cores += type_cores[t]
            if vm_state[r, v] == VM_RUNNING and running_for[r, v] >= warmup_s:
                if not type_ram[t] > 0.0:
                    return _BAD_RAM
                measured += 1
                if not np.isnan(cpu[r, v]):  # a missing sample is left out, not counted as idle
                    cpu_m[kc] = _clip01(cpu[r, v])
                    kc += 1
                if not np.isnan(ram[r, v]):
                    ram_m[kr] = _clip01(ram[r, v] / type_ram[t])
                    kr += 1
        out[r, 0] = _clip01(cores / max_fleet_cores)
        out[r, 1], out[r, 2] = _sample_stats(cpu_m, kc, measured)
        out[r, 3], out[r, 4] = _sample_stats(ram_m, kr, measured)
        out[r, 5] = _unit(_ratio(waiting_now[r], submitted_total[r]))
        out[r, 6] = _unit(_ratio(waiting_int[r], submitted_int[r]))
    return 0


def safe_ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    return np.divide(num, den, out=np.zeros(np.broadcast(num, den).shape), where=den > 0)


def _rows(x, batch_shape, n_rows: int) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    return (a if a.shape == batch_shape else np.broadcast_to(a, batch_shape)).reshape(n_rows)


def compute_metrics(snap: RawSnapshot, fleet: FleetSpec, warmup_s: float = 0.0) -> np.ndarray:
    """The seven metrics as a float32 array of shape ``batch_shape + (7,)``, in the order of
    `OBSERVATION_NAMES`, clipped to [0, 1]. A NaN CPU or RAM sample is missing (left out of the
    CPU and RAM metrics; all of them missing: those metrics are NaN, and the daemon's feature
    check records "nothing (features unknown)" instead of acting); an inf is clipped; a NaN queue
    counter makes its ratio NaN (unknown, never a 0 that reads as an empty queue). Compiled
    (numba): it runs once per environment step for the whole batch, where two dozen NumPy calls
    on 8 x 30 slots cost a third of the simulator's step."""
    vm_type = np.asarray(snap.vm_type)
    batch_shape, n_slots = vm_type.shape[:-1], vm_type.shape[-1]
    n_rows = 1
    for d in batch_shape:
        n_rows *= d

    def slots(x, dtype):  # a view where the layout allows (numba takes strided arrays)
        return np.asarray(x, dtype=dtype).reshape(n_rows, n_slots)

    out = np.empty((n_rows, N_METRICS), dtype=np.float64)
    bad = _metrics_kernel(slots(vm_type, np.int64), slots(snap.vm_state, np.int64), slots(snap.vm_cpu_busy, np.float64),
                    slots(snap.vm_ram_used_gb, np.float64), slots(snap.vm_running_for_s, np.float64),
                    float(warmup_s), fleet.cores, fleet.ram_gb, fleet.max_count,
                    _rows(snap.jobs_waiting_now, batch_shape, n_rows), _rows(snap.jobs_submitted_total, batch_shape, n_rows),
                    _rows(snap.jobs_waiting_interval, batch_shape, n_rows),
                    _rows(snap.jobs_submitted_interval, batch_shape, n_rows), out)
    if bad:
        raise ValueError(_problem(bad, vm_type, fleet))
    return out.astype(np.float32).reshape(batch_shape + (N_METRICS,))


def _problem(code: int, vm_type: np.ndarray, fleet: FleetSpec) -> str:
    """The one-line error for a kernel's `_BAD_*` code: a snapshot and a fleet that do not fit."""
    if code == _BAD_CAPACITY:
        return (f"the fleet {list(fleet.names)} has no capacity (cores x max_count sum to "
                f"{fleet.max_fleet_cores:g}): allocated_cores_ratio has no denominator")
    if code == _BAD_TYPE:
        return (f"the snapshot has vm_type {int(vm_type.max())} but the fleet has {fleet.n_types} type(s) "
                f"{list(fleet.names)}: a snapshot of another fleet?")
    return f"the fleet {list(fleet.names)} has a type with no RAM ({fleet.ram_gb.tolist()} GB): ram_mean has no denominator"


def allocated_cores(snap: RawSnapshot, fleet: FleetSpec) -> np.ndarray:
    """Absolute booting + running cores (for reports)."""
    vm_type = np.asarray(snap.vm_type)
    present = vm_type >= 0
    return np.where(present, fleet.cores[np.where(present, vm_type, 0)], 0).sum(axis=-1)
