"""Named features for agents, computed from the same raw snapshot on both paths (simulator and
daemon). An agent declares the names it reads, in order.

Two named *feature sets* (`feature_set(name, fleet)`):

* ``paper``: the seven metrics of the main paper (`OBSERVATION_NAMES`), for reproduction.
* ``extended``: the seven metrics plus what the queue-based rules see, each scaled to about
  [0, 1] so one policy serves fleets and workloads of any size:

  - ``waiting_cores_ratio`` = Σ cores of queued jobs / the fleet's maximum cores (capped at
    `WAITING_CAP`: beyond ten fleets' worth of backlog the policy's answer is the same);
  - ``running_cores_ratio`` = Σ cores of running jobs / the fleet's maximum cores;
  - ``head_job_cores_ratio`` = cores of the head-of-line job / cores of the largest VM type
    (0 when the queue is empty): the scheduler is strict FIFO, so a wide head job blocks the
    queue until some VM has that many free cores;
  - ``largest_free_slot_ratio`` = most idle cores on one running VM / cores of the largest type,
    idle cores = the VM's cores × (1 − its busy-core fraction over the interval): derived from
    the per-VM CPU both paths measure, so the live daemon needs no extra series. A VM with a
    missing (NaN) CPU sample is left out, as in the CPU metrics; none with a sample: NaN;
  - ``vm_running_frac:<type>`` and ``vm_booting_frac:<type>`` = VMs of that type running
    (booting) / the type's maximum;
  - ``steps_since_action`` = min(intervals since the last applied action, `SINCE_CAP`) /
    `SINCE_CAP`; 1 when no action was applied yet.

Other extras, by name: ``vm_count:<type>`` (booting + running VMs of that type),
``vm_running:<type>``, ``jobs_waiting``, ``jobs_running``, ``jobs_submitted_interval``.

A snapshot whose source cannot tell a counter an extended feature needs (`None` in the
snapshot) yields NaN for that feature, never a guess.
"""
from __future__ import annotations

import functools

import numpy as np

from .metrics import OBSERVATION_NAMES, compute_metrics, safe_ratio
from .snapshot import VM_BOOTING, VM_RUNNING, FleetSpec, RawSnapshot

SCALAR_EXTRAS = ("jobs_waiting", "jobs_running", "jobs_submitted_interval")
QUEUE_FEATURES = ("waiting_cores_ratio", "running_cores_ratio", "head_job_cores_ratio", "largest_free_slot_ratio")
WAITING_CAP = 10.0
SINCE_CAP = 30
FEATURE_SETS = ("paper", "extended")


def _per_type(kinds, fleet: FleetSpec) -> tuple[str, ...]:
    return tuple(f"{kind}:{t}" for kind in kinds for t in fleet.names)


def feature_set(name: str, fleet: FleetSpec) -> tuple[str, ...]:
    """The feature names of a named set for this fleet."""
    if name == "paper":
        return OBSERVATION_NAMES
    if name == "extended":
        return (OBSERVATION_NAMES + QUEUE_FEATURES + _per_type(("vm_running_frac", "vm_booting_frac"), fleet)
                + ("steps_since_action",))
    raise ValueError(f"unknown feature set {name!r}; choose one of {', '.join(FEATURE_SETS)}")


def known_features(fleet: FleetSpec) -> tuple[str, ...]:
    per_type = _per_type(("vm_count", "vm_running", "vm_running_frac", "vm_booting_frac"), fleet)
    return OBSERVATION_NAMES + QUEUE_FEATURES + per_type + SCALAR_EXTRAS + ("steps_since_action",)


def validate_feature_names(names, fleet: FleetSpec) -> None:
    unknown = [n for n in names if n not in known_features(fleet)]
    if unknown:
        raise ValueError(f"unknown feature(s) {unknown}; known: {list(known_features(fleet))}")


def feature_bounds(name: str) -> tuple[float, float]:
    """The range a feature's values lie in (for the policy's observation space)."""
    if name in OBSERVATION_NAMES or name in QUEUE_FEATURES[1:] or name == "steps_since_action" or "_frac:" in name:
        return 0.0, 1.0
    if name == "waiting_cores_ratio":
        return 0.0, WAITING_CAP
    return 0.0, float("inf")


@functools.lru_cache(maxsize=64)
def _bounds(names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    low, high = np.array([feature_bounds(n) for n in names], dtype=np.float64).T
    return low, high


def _counter(snap: RawSnapshot, field: str) -> np.ndarray:
    value = getattr(snap, field)
    if value is None:
        return np.full(snap.batch_shape, np.nan)
    return np.asarray(value, dtype=np.float64)


def _queue_feature(name: str, snap: RawSnapshot, fleet: FleetSpec) -> np.ndarray:
    largest = float(fleet.cores.max())
    if name == "waiting_cores_ratio":
        return np.minimum(_counter(snap, "jobs_waiting_cores") / fleet.max_fleet_cores, WAITING_CAP)
    if name == "running_cores_ratio":
        return _counter(snap, "jobs_running_cores") / fleet.max_fleet_cores
    if name == "head_job_cores_ratio":
        return _counter(snap, "head_job_cores") / largest
    return _largest_free_slot(snap, fleet) / largest


def _largest_free_slot(snap: RawSnapshot, fleet: FleetSpec) -> np.ndarray:
    """Most idle cores on one running VM. A VM whose CPU sample is missing (NaN) is left out, as
    the CPU metrics leave it out (neither idle nor busy); running VMs none of which has a sample:
    NaN (unknown), which the daemon refuses to act on. No running VM: 0."""
    vm_type = np.asarray(snap.vm_type)
    running = (vm_type >= 0) & (np.asarray(snap.vm_state) == VM_RUNNING)
    cores = fleet.cores[np.maximum(vm_type, 0)]
    cpu = np.asarray(snap.vm_cpu_busy, dtype=np.float64)
    sampled = running & ~np.isnan(cpu)
    busy = np.clip(np.nan_to_num(cpu, nan=0.0), 0.0, 1.0)
    # initial: a snapshot with no VM slot at all (an empty fleet, unpadded) has no free slot, not an error
    idle = np.where(sampled, cores * (1.0 - busy), 0.0).max(axis=-1, initial=0.0)
    unknown = running.any(axis=-1) & ~sampled.any(axis=-1)
    return np.where(unknown, np.nan, idle)


def _since_action(snap: RawSnapshot, step_seconds: float) -> np.ndarray:
    since = _counter(snap, "since_action_s")
    steps = np.where(since < 0, SINCE_CAP, np.floor(since / step_seconds + 1e-9))
    return np.minimum(steps, SINCE_CAP) / SINCE_CAP


def compute_features(snap: RawSnapshot, fleet: FleetSpec, names, warmup_s: float = 0.0,
                     metrics: np.ndarray | None = None, step_seconds: float = 60.0) -> np.ndarray:
    """float32 array of shape ``batch_shape + (len(names),)``. Pass `metrics` when the caller
    already computed `compute_metrics` for this snapshot."""
    validate_feature_names(names, fleet)
    if not 0 < step_seconds < np.inf:  # 0 made steps_since_action NaN (or inf) and numpy only warned
        raise ValueError(f"step_seconds must be positive and finite, got {step_seconds}")
    if metrics is None:
        metrics = compute_metrics(snap, fleet, warmup_s)
    vm_type = np.asarray(snap.vm_type)
    vm_state = np.asarray(snap.vm_state)
    cols = []
    for name in names:
        if name in OBSERVATION_NAMES:
            cols.append(metrics[..., OBSERVATION_NAMES.index(name)].astype(np.float64))
        elif name in QUEUE_FEATURES:
            cols.append(_queue_feature(name, snap, fleet))
        elif name == "steps_since_action":
            cols.append(_since_action(snap, step_seconds))
        elif ":" in name:
            kind, tname = name.split(":", 1)
            ti = fleet.names.index(tname)
            sel = vm_type == ti
            if kind in ("vm_running", "vm_running_frac"):
                sel = sel & (vm_state == VM_RUNNING)
            elif kind == "vm_booting_frac":
                sel = sel & (vm_state == VM_BOOTING)
            count = sel.sum(axis=-1).astype(np.float64)
            cols.append(safe_ratio(count, fleet.max_count[ti]) if kind.endswith("_frac") else count)
        else:
            src = {"jobs_waiting": snap.jobs_waiting_now, "jobs_running": snap.jobs_running,
                   "jobs_submitted_interval": snap.jobs_submitted_interval}[name]
            cols.append(np.asarray(src, dtype=np.float64))  # NaN stays NaN: a missing count is unknown, not 0
    # a live fleet can leave the ranges the simulator keeps to (a group above a lowered max, a head
    # job wider than the largest type): held at the bounds the policy's observation space declares,
    # so the service (which refuses values outside them) and an in-process agent see one vector
    low, high = _bounds(tuple(names))
    return np.clip(np.stack(cols, axis=-1), low, high).astype(np.float32)
