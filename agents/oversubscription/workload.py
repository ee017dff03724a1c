"""The VM table one episode replays: the contract between the data layer (`data.py`: the Azure
loader and the calibrated generator) and everything that consumes it (the simulator, the live
admission path, the baselines' tuning).

A row is one VM request: who asked (subscriber), when (arrive) and until when (depart), what
(requested cores, memory, network), and how much of its requested cores it uses in every step
of the episode (`usage`, a fraction in [0, 1]; zero outside its life). Steps are the setting's
steps (one hour); `start_hour` is the hour of day of step 0, so step t is hour
(start_hour + t) % 24.

Warm start: rows with arrive < 0 < depart are already running when the episode starts.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Workload:
    n_subscribers: int
    steps: int
    sub: np.ndarray          # int32 [V]
    arrive: np.ndarray       # int32 [V]; < 0: running before step 0 (warm start)
    depart: np.ndarray       # int32 [V]; first step the VM is gone (>= steps: outlives the episode)
    cores: np.ndarray        # float32 [V] requested cores
    mem: np.ndarray          # float32 [V] requested GB
    net: np.ndarray          # float32 [V] requested Gb/s
    usage: np.ndarray        # float32 [V, steps] used fraction of the requested cores
    start_hour: int = 0
    name: str = ""
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        self.sub = np.asarray(self.sub, dtype=np.int32)
        self.arrive = np.asarray(self.arrive, dtype=np.int32)
        self.depart = np.asarray(self.depart, dtype=np.int32)
        self.cores = np.asarray(self.cores, dtype=np.float32)
        self.mem = np.asarray(self.mem, dtype=np.float32)
        self.net = np.asarray(self.net, dtype=np.float32)
        self.usage = np.asarray(self.usage, dtype=np.float32)
        self.validate()

    @property
    def n_vms(self) -> int:
        return int(self.sub.shape[0])

    def validate(self) -> None:
        v = self.n_vms
        for name in ("arrive", "depart", "cores", "mem", "net"):
            if getattr(self, name).shape != (v,):
                raise ValueError(f"workload field {name!r} has shape {getattr(self, name).shape}, expected ({v},)")
        if self.usage.shape != (v, self.steps):
            raise ValueError(f"workload usage has shape {self.usage.shape}, expected ({v}, {self.steps})")
        if v and (self.sub.min() < 0 or self.sub.max() >= self.n_subscribers):
            raise ValueError("workload subscriber ids must lie in [0, n_subscribers)")
        if np.any(self.depart <= self.arrive):
            raise ValueError("every VM must depart after it arrives")
        if np.any(~np.isfinite(self.usage)) or np.any(self.usage < 0) or np.any(self.usage > 1):
            raise ValueError("usage must be finite fractions in [0, 1]")
        if np.any(~np.isfinite(self.cores)) or np.any(self.cores <= 0):
            raise ValueError("requested cores must be finite and positive")
        # a NaN request turns the observation NaN; a negative one would grow a PM's free memory or network
        for name in ("mem", "net"):
            values = getattr(self, name)
            if np.any(~np.isfinite(values)) or np.any(values < 0):
                raise ValueError(f"workload field {name!r} must be finite and non-negative")

    def order(self) -> np.ndarray:
        """Rows in the order requests reach the allocator: by arrival step, then row index."""
        return np.lexsort((np.arange(self.n_vms), self.arrive))

    def subset(self, rows: np.ndarray, **changes) -> "Workload":
        kw = dict(n_subscribers=self.n_subscribers, steps=self.steps, sub=self.sub[rows],
                  arrive=self.arrive[rows], depart=self.depart[rows], cores=self.cores[rows],
                  mem=self.mem[rows], net=self.net[rows], usage=self.usage[rows],
                  start_hour=self.start_hour, name=self.name, meta=dict(self.meta))
        kw.update(changes)
        return Workload(**kw)
