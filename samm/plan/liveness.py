"""The head-of-line liveness guard: a scaling decision may never leave the queue blocked for
good. Pure NumPy over a batch of decisions, shared by the simulator (training and evaluation)
and the daemon.

The scheduler is strict FIFO: a job needing c cores waits until one VM has c free cores. If no
VM of the fleet (running or booting) has c cores at all, nothing will ever start, whatever the
other VMs do; CPU-driven rules read an idle fleet and never scale out (the starvation the
threshold rules showed on real traces), and a deterministic learned policy can sit in the same
state. Like the cluster autoscaler's answer to a pending pod that fits no node, the guard then
(1) turns the decision for the smallest VM type that can host the head job into "add one" when
the fleet has none of them, and (2) cancels a removal that would take away the last VM able to
host it. It never exceeds a type's maximum and does nothing when the queue is empty, when a
fitting VM exists or is booting, or when the snapshot does not know the head job's cores.
Applied to every policy alike (rules and learned), so comparisons stay fair.
"""
from __future__ import annotations

import numpy as np

from samm.analyze.snapshot import FleetSpec, RawSnapshot


def guard_head_of_line(deltas: np.ndarray, snap: RawSnapshot, fleet: FleetSpec) -> tuple[np.ndarray, np.ndarray]:
    """`deltas` (B, T) VM changes per type. Returns (guarded deltas, changed (B,) bool)."""
    deltas = np.array(deltas, dtype=np.int64, copy=True)
    if snap.head_job_cores is None:
        return deltas, np.zeros(deltas.shape[0], dtype=bool)
    head = np.asarray(snap.head_job_cores, dtype=np.float64).reshape(-1)
    changed = np.zeros(len(head), dtype=bool)
    blocked = (head > 0) & np.isfinite(head)
    if not blocked.any():  # an empty queue everywhere: nothing to guard (the common case, kept cheap)
        return deltas, changed
    vm_type = np.asarray(snap.vm_type).reshape(len(head), -1)
    counts = np.stack([(vm_type == t).sum(axis=1) for t in range(fleet.n_types)], axis=1)  # (B, T)
    fits = fleet.cores[None, :] >= head[:, None]  # (B, T) types able to host the head job
    hosts = (counts * fits).sum(axis=1)
    # (1) no VM able to host the head job: add the smallest type that can, unless one is added anyway
    need = blocked & (hosts == 0) & ~((deltas > 0) & fits).any(axis=1)
    for b in np.nonzero(need)[0]:
        order = [t for t in np.argsort(fleet.cores, kind="stable") if fits[b, t] and counts[b, t] < fleet.max_count[t]]
        if order:
            deltas[b, order[0]] = 1
            changed[b] = True
    # (2) never remove the last hosts of a blocked head job
    removing = np.minimum(deltas, 0)
    left = (np.maximum(counts + removing, 0) * fits).sum(axis=1)
    cancel = blocked & (hosts > 0) & (left <= 0)
    for b in np.nonzero(cancel)[0]:
        deltas[b, fits[b] & (deltas[b] < 0)] = 0
        changed[b] = True
    return deltas, changed
