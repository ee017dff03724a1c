"""Every wall second: each PM's CPU from its cgroup, in EMULATED cores, to Graphite.

    samm.oversub.<run>.pm.<k>.cpu_cores   = cpu ns used in [i, i+1) / 1e9 / host_cores_per_pm_core

The point measured over the second [i, i+1) is stamped i (Graphite's slot for that second), so
a step [a, b) is exactly the slots a..b-1 (`render(from=a-1, until=b-1)`, the window
off-by-one of the platform notes). The sample is taken just after each whole second; the
measured span is the real time between two reads (not assumed to be 1 s), so a late wake-up
makes a point slightly wider, never wrong in scale. A wake-up more than a second late (a
stalled host) spans several seconds: each of them gets the span's mean, so no second of a
step is left without a point (`filled` counts those seconds).
"""
from __future__ import annotations

import logging
import math
import threading
import time
from typing import Callable

from samm.monitor.graphite_client import GraphiteSender, sanitize

log = logging.getLogger(__name__)


MAX_FILL_S = 60  # after a longer stall (a suspended host) the missed seconds stay empty


def slots_measured(prev_slot: int | None, slot: int) -> range:
    """The Graphite seconds one sample stands for: every second after the previous sample's up
    to its own (one second normally; several after a stall, at most MAX_FILL_S)."""
    if prev_slot is None or slot <= prev_slot:
        return range(slot, slot + 1)
    return range(max(prev_slot + 1, slot - MAX_FILL_S + 1), slot + 1)


def pm_metric(prefix: str, run: str, pm: int | str, name: str = "cpu_cores") -> str:
    return f"{prefix}.oversub.{sanitize(run)}.pm.{pm}.{name}"


class PmCollector:
    """A thread that reports every PM's CPU once per wall second (`offset_s` after it)."""

    def __init__(self, read_ns: Callable[[], list[int]], sender: GraphiteSender, run: str,
                 host_cores_per_pm_core: float, prefix: str = "samm", offset_s: float = 0.02,
                 clock: Callable[[], float] = time.time):
        self.read_ns = read_ns
        self.sender = sender
        self.run = run
        self.scale = float(host_cores_per_pm_core)
        self.prefix = prefix
        self.offset_s = float(offset_s)
        self.clock = clock
        self.reports = 0
        self.errors = 0
        self.filled = 0  # seconds given a stalled sample's mean (see the module docstring)
        self.last: list[float] = []  # the latest point of every PM (emulated cores)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "PmCollector":
        self._thread = threading.Thread(target=self._loop, name=f"oversub-collector-{self.run}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.sender.flush()

    def _loop(self) -> None:
        try:
            prev_ns, prev_t = self.read_ns(), self.clock()
        except Exception as exc:  # noqa: BLE001 - raised here, it ended the thread without a count
            self.errors += 1
            log.warning("oversub collector: cannot read PM CPU: %s", exc)
            prev_ns, prev_t = None, self.clock()
        prev_slot: int | None = None
        while not self._stop.is_set():
            now = self.clock()
            wake = math.floor(now) + 1 + self.offset_s
            if self._stop.wait(max(0.0, wake - now)):
                break
            try:
                ns, t = self.read_ns(), self.clock()
            except Exception as exc:  # noqa: BLE001 - a missed point, not a dead collector
                self.errors += 1
                log.warning("oversub collector: cannot read PM CPU: %s", exc)
                continue
            if prev_ns is None:  # the first reading failed: this one is the baseline
                prev_ns, prev_t = ns, t
                continue
            span = t - prev_t
            if span <= 0:
                continue
            slot = math.floor(t - self.offset_s) - 1  # the last second this sample measured
            self.last = [(a - b) / 1e9 / span / self.scale for a, b in zip(ns, prev_ns)]
            slots = slots_measured(prev_slot, slot)
            for s in slots:
                for k, cores in enumerate(self.last):
                    self.sender.send(pm_metric(self.prefix, self.run, k), cores, s)
            self.sender.flush()
            self.reports += 1
            self.filled += len(slots) - 1
            prev_ns, prev_t, prev_slot = ns, t, slot
