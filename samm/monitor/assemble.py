"""From a Graphite reading and the executor's inventory to the analyzer's `RawSnapshot`.

Pure functions (no I/O, no clock): the same inputs always give the same snapshot, which is
what makes the live path testable against the simulator's.

Mapping (one snapshot, batch shape ``()``):

* VM slots: one per inventory instance in state ``pending`` or ``running`` (``terminating``
  ones no longer count), groups in `group_order` (index = `vm_type`), instances by launch time
  then id. At least one slot: an empty fleet is one padding slot with ``vm_type = -1``.
* ``vm_state`` = VM_RUNNING when the instance reported complete CPU and RAM in the window,
  else VM_BOOTING (launched but its collector is not up yet, whatever the executor says).
* ``vm_cpu_busy`` = mean ``cpu_percent`` / 100; ``vm_ram_used_gb`` = mean ``ram_used_gb``
  (0 while booting).
* ``vm_running_for_s`` = window end − first heartbeat seen, or − launch time when the
  inventory knows a later one, up to the window's end (−1 while booting). Reports that end
  before an instance's launch time are an earlier instance's of the same name (Docker reuses
  names): the new one counts as booting.
* ``jobs_submitted_total`` / ``jobs_waiting_now`` / ``jobs_running`` = the queue series'
  last value in the window; ``jobs_submitted_interval`` = the `submitted_total` delta over
  the window; ``jobs_waiting_interval`` = `waiting_submitted_this_minute` at the window's end.
  Missing values are NaN, and the analyzer keeps them unknown: a ratio or feature over a missing
  queue counter is NaN, and a missing per-VM CPU or RAM sample is left out of the metrics.
* ``jobs_waiting_cores`` / ``jobs_running_cores`` / ``head_job_cores`` = the optional queue
  series of the same names at the window's end; None when the exporter sends none.

Status: the reading's, made ``partial`` when an inventory instance that reported before went
silent (it is counted as booting: its load is unknown), when the inventory lacks a group, when
an instance reports under another group than the inventory's, or when two instances of a group
have names that sanitise to the same series (their reports cannot be told apart). Reports from instances
not in the inventory (terminated VMs whose collector still ran) are ignored and only noted.
An instance launched more than `boot_grace_s` ago that the reading does not know at all (its
collector never started, or went silent before the source's history) is noted too, and still
counted as booting without making the snapshot partial: one dead collector must not stop the
loop for good, but it must not pass without a word either. When no instance of the fleet
reported in the window and some of them are past `boot_grace_s`, the snapshot is ``partial``:
the fleet's load is unknown, and its metrics would read as an idle fleet.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from samm.analyze.snapshot import VM_BOOTING, VM_RUNNING, FleetSpec, RawSnapshot
from samm.execute.base import GroupStatus

from .graphite_client import sanitize
from .graphite_source import InstanceReading, MonitorReading, Status, worst


@dataclass(frozen=True)
class Slot:
    group: str
    instance_id: str
    vm_type: int
    state: int  # VM_BOOTING / VM_RUNNING


@dataclass(frozen=True)
class AssembledSnapshot:
    snapshot: RawSnapshot
    slots: tuple[Slot, ...]
    status: Status
    reasons: tuple[str, ...]


def _nan(x: float | None) -> np.ndarray:
    return np.asarray(math.nan if x is None else float(x), dtype=np.float64)


def _opt(x: float | None) -> np.ndarray | None:
    """An optional counter: None (unknown to this exporter) stays None."""
    return None if x is None else np.asarray(float(x), dtype=np.float64)


def _short(items: list[str], n: int = 5) -> str:
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


def _launched_in_time(launched_at: float | None, window_end: float) -> float | None:
    """The launch time when it can be compared with the window: one after the window's end (the
    inventory is read later, on another clock than the collectors') says nothing about it."""
    return launched_at if launched_at is not None and launched_at <= window_end else None


def _predecessor(r: InstanceReading, launched_at: float | None) -> bool:
    """The reading ends before the inventory's instance was launched: it was another instance
    under the same name."""
    return launched_at is not None and r.last_seen is not None and r.last_seen < launched_at


def _same_series(gname: str, live: list) -> list[str]:
    """The group's instances whose sanitised names collide (`web.1` and `web_1`, as Docker allows):
    both would read the one series, so one's load would be counted twice and the other's never."""
    by_name: dict[str, list[str]] = {}
    for inst in live:
        by_name.setdefault(sanitize(inst.instance_id), []).append(inst.instance_id)
    return [f"{gname}/{' and '.join(ids)} as {name}" for name, ids in by_name.items() if len(ids) > 1]


# Longer than any boot seen here (the emulated testbed: seconds; EC2: 1-3 minutes).
BOOT_GRACE_S = 600.0


def assemble_snapshot(reading: MonitorReading, inventory: Mapping[str, GroupStatus], fleet: FleetSpec,
                      group_order: Sequence[str], boot_grace_s: float = BOOT_GRACE_S) -> AssembledSnapshot:
    """The snapshot plus its slots (which instance each VM slot is), status and reasons."""
    if len(group_order) != fleet.n_types:
        raise ValueError(f"group_order has {len(group_order)} groups but the fleet has {fleet.n_types} types "
                         f"{list(fleet.names)}")
    status: Status = reading.status
    reasons = list(reading.reasons)

    by_id: dict[str, list[InstanceReading]] = {}
    for r in reading.instances.values():
        by_id.setdefault(r.instance, []).append(r)

    slots: list[Slot] = []
    cpu, ram, age = [], [], []
    matched: set[tuple[str, str]] = set()
    silent, misgrouped, unheard, clashes = [], [], [], []
    for t, gname in enumerate(group_order):
        gs = inventory.get(gname)
        if gs is None:
            status = worst(status, "partial")
            reasons.append(f"the inventory has no group {gname!r}: none of its instances are counted")
            continue
        live = [i for i in gs.instances if i.state in ("pending", "running")]
        live.sort(key=lambda i: (i.launched_at if i.launched_at is not None else math.inf, i.instance_id))
        clashes.extend(_same_series(gname, live))
        for inst in live:
            iid = sanitize(inst.instance_id)
            candidates = by_id.get(iid, [])
            r = next((c for c in candidates if c.group == sanitize(gname)), candidates[0] if candidates else None)
            launched = _launched_in_time(inst.launched_at, reading.window_end)
            if r is not None:
                matched.add((r.group, r.instance))
                if _predecessor(r, launched):
                    r = None  # the reports of an earlier instance of the same name: this one is new
                elif r.group != sanitize(gname):
                    misgrouped.append(f"{iid} (reports as {r.group}, inventory says {gname})")
            if r is not None and r.reported:
                first = r.first_seen if r.first_seen is not None else reading.window_end
                if launched is not None:
                    # heartbeats from before the launch were a predecessor's (Docker reuses the
                    # name of the newest container removed): its age would skip the warm-up
                    first = max(first, launched)
                slots.append(Slot(gname, inst.instance_id, t, VM_RUNNING))
                cpu.append(r.cpu_percent / 100.0)
                ram.append(r.ram_used_gb)
                age.append(max(0.0, reading.window_end - first))
            else:
                if r is not None and (r.last_seen is None or r.last_seen < reading.window_start):
                    silent.append(f"{gname}/{iid}")
                elif (r is None and inst.launched_at is not None
                      and reading.window_end - inst.launched_at > boot_grace_s):
                    unheard.append(f"{gname}/{iid} ({reading.window_end - inst.launched_at:.0f} s)")
                slots.append(Slot(gname, inst.instance_id, t, VM_BOOTING))
                cpu.append(0.0)
                ram.append(0.0)
                age.append(-1.0)

    if unheard and not any(sl.state == VM_RUNNING for sl in slots):
        # no VM of the fleet measured: every load metric would be an invented 0, which reads
        # as an idle fleet to a policy (and removes capacity)
        status = worst(status, "partial")
        reasons.append(f"no instance of the fleet reported CPU and RAM in the window, {len(unheard)} of them "
                       f"launched over {boot_grace_s:g} s ago: the fleet's load is unknown")
    if silent:
        status = worst(status, "partial")
        reasons.append(f"instance(s) {_short(silent)} reported before but not in the window: counted as booting")
    if unheard:
        reasons.append(f"instance(s) {_short(unheard)} launched over {boot_grace_s:g} s ago but not heard from "
                       f"recently: counted as booting (a collector that never started or stopped?)")
    if clashes:
        status = worst(status, "partial")
        reasons.append(f"instances whose names share one Graphite series (names are sanitised): {_short(clashes)}; "
                       "each would be counted with the other's load")
    if misgrouped:
        status = worst(status, "partial")
        reasons.append(f"instance(s) reporting under another group: {_short(misgrouped)}")
    ignored = sorted(f"{g}/{i}" for (g, i), r in reading.instances.items()
                     if (g, i) not in matched and r.last_seen is not None and r.last_seen >= reading.window_start)
    if ignored:
        reasons.append(f"ignored reports from {len(ignored)} instance(s) not in the inventory (terminated?): {_short(ignored)}")

    n = len(slots)
    v = max(1, n)
    vm_type = np.full(v, -1, dtype=np.int64)
    vm_state = np.full(v, VM_BOOTING, dtype=np.int64)
    vm_cpu = np.zeros(v, dtype=np.float64)
    vm_ram = np.zeros(v, dtype=np.float64)
    vm_age = np.full(v, -1.0, dtype=np.float64)
    if n:
        vm_type[:n] = [s.vm_type for s in slots]
        vm_state[:n] = [s.state for s in slots]
        vm_cpu[:n], vm_ram[:n], vm_age[:n] = cpu, ram, age
    q = reading.queue
    snap = RawSnapshot(vm_type=vm_type, vm_state=vm_state, vm_cpu_busy=vm_cpu, vm_ram_used_gb=vm_ram,
                       vm_running_for_s=vm_age, jobs_submitted_total=_nan(q.submitted_total),
                       jobs_submitted_interval=_nan(q.submitted_interval), jobs_waiting_now=_nan(q.waiting),
                       jobs_waiting_interval=_nan(q.waiting_interval), jobs_running=_nan(q.running),
                       jobs_waiting_cores=_opt(q.waiting_cores), jobs_running_cores=_opt(q.running_cores),
                       head_job_cores=_opt(q.head_job_cores))
    return AssembledSnapshot(snap, tuple(slots), status, tuple(reasons))


def build_raw_snapshot(reading: MonitorReading, inventory: Mapping[str, GroupStatus], fleet: FleetSpec,
                       group_order: Sequence[str]) -> RawSnapshot:
    """The `RawSnapshot` alone (see `assemble_snapshot` for status and slots)."""
    return assemble_snapshot(reading, inventory, fleet, group_order).snapshot
