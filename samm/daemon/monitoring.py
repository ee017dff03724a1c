"""The Monitor stage as the loop sees it: one `MonitorOutcome` per interval, from Graphite
(live fleets) or from a simulation (the embedded default). Both end in the same `RawSnapshot`
that `samm.analyze` turns into observations.
"""
from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from samm.analyze import FleetSpec, RawSnapshot
from samm.execute.base import Executor
from samm.execute.sim_exec import SimulatedSystem
from samm.monitor.assemble import assemble_snapshot
from samm.monitor.graphite_source import GraphiteSource


@dataclass
class MonitorOutcome:
    window_start: float
    window_end: float
    status: str  # ok | partial | stale
    reasons: list[str] = field(default_factory=list)
    raw: RawSnapshot | None = None
    summary: dict = field(default_factory=dict)  # compact, JSON-able, for the knowledge store
    finished: bool = False  # the managed system has nothing left to do (simulations end)
    inventory: dict | None = None  # the executor's view at read time, when the monitor needed it

    @property
    def actionable(self) -> bool:
        return self.status == "ok" and self.raw is not None


class Monitor(Protocol):
    def read(self) -> MonitorOutcome: ...


def summarize(raw: RawSnapshot, fleet: FleetSpec) -> dict:
    """What the knowledge store keeps of a snapshot: counts per group and the queue."""
    vm_type = np.asarray(raw.vm_type)
    state = np.asarray(raw.vm_state)
    groups = {name: {"booting": int(np.sum((vm_type == i) & (state == 0))),
                     "running": int(np.sum((vm_type == i) & (state == 1)))} for i, name in enumerate(fleet.names)}

    def num(x):
        v = float(np.asarray(x))
        return None if math.isnan(v) else v

    return {"groups": groups, "queue": {"submitted_total": num(raw.jobs_submitted_total),
                                        "submitted_interval": num(raw.jobs_submitted_interval),
                                        "waiting": num(raw.jobs_waiting_now),
                                        "waiting_interval": num(raw.jobs_waiting_interval),
                                        "running": num(raw.jobs_running)}}


class SimMonitor:
    """Advances the simulation one interval per read (the interval passes while we look)."""

    def __init__(self, system: SimulatedSystem, fleet: FleetSpec, executor: Executor):
        self.system = system
        self.fleet = fleet
        self.executor = executor

    def read(self) -> MonitorOutcome:
        step = self.system.advance()
        end = float(step.clock_s[0])
        raw = self.system.snapshot()
        return MonitorOutcome(end - self.system.config.step_seconds, end, "ok", [], raw, summarize(raw, self.fleet),
                              finished=self.system.finished, inventory=self.executor.inventory())


class GraphiteMonitor:
    """Graphite's last complete interval joined with the executor's inventory."""

    def __init__(self, source: GraphiteSource, executor: Executor, fleet: FleetSpec, group_order):
        self.source = source
        self.executor = executor
        self.fleet = fleet
        self.group_order = tuple(group_order)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="samm-inventory")

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def read(self) -> MonitorOutcome:
        # the inventory (the cloud's API) and the Graphite read wait on different servers: ask
        # both at once (at 5,000 instances this saves the inventory's ~0.5 s, docs/benchmarks.md)
        pending = self._pool.submit(self.executor.inventory)
        reading = self.source.read()
        if reading.status == "stale":
            pending.cancel()
            return MonitorOutcome(reading.window_start, reading.window_end, "stale", list(reading.reasons))
        try:
            inventory = pending.result()
        except Exception as exc:  # noqa: BLE001 - without an inventory there is no snapshot
            return MonitorOutcome(reading.window_start, reading.window_end, "stale",
                                  list(reading.reasons) + [f"inventory unavailable: {type(exc).__name__}: {exc}"])
        assembled = assemble_snapshot(reading, inventory, self.fleet, self.group_order)
        raw = assembled.snapshot
        return MonitorOutcome(reading.window_start, reading.window_end, assembled.status, list(assembled.reasons), raw,
                              summarize(raw, self.fleet), inventory=inventory)
