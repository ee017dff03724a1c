"""The controller contract: every method of this problem (the SAC policy, AutoScale, the
Sinan-style model, the VPA recommender, static allocations) is a `Controller`, driven the same way
by the simulator's episode runner, the experiment, the REST service and the real-container loop.

    ctl.reset(app)                 # an AppLimits: service names, per-service core caps and floor
    cores = ctl.act(measurement)   # StepMeasurement of the second just ended -> cores per service

`act` returns cores in [floor, cap] per service; `clip_cores` is the one place that enforces it.
A controller keeps its own memory (stacked frames, moving windows) between calls.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .observation import StepMeasurement

#: the smallest limit any controller may set (cores); the kernel refuses CFS quotas under 1 ms of a 100 ms period
MIN_CORES = 0.01


@dataclass(frozen=True)
class AppLimits:
    services: tuple[str, ...]
    caps: np.ndarray          # u^(i) of the paper: the most cores service i may get
    qos_ms: float
    floor: float = MIN_CORES

    @property
    def total_caps(self) -> float:  # Z of the reward
        return float(np.sum(self.caps))


def clip_cores(cores, limits: AppLimits) -> np.ndarray:
    """Cores per service within [floor, cap]; NaN (a controller that could not decide) holds the
    cap, the safe side for latency."""
    c = np.asarray(cores, dtype=np.float64).reshape(len(limits.services))
    c = np.where(np.isfinite(c), c, limits.caps)
    return np.clip(c, limits.floor, limits.caps)


class Controller(Protocol):
    name: str

    def reset(self, limits: AppLimits) -> None: ...

    def act(self, m: StepMeasurement) -> np.ndarray: ...
