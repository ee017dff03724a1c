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


class ScaleDownWindow:
    """Kubernetes HPA's scale-down stabilisation, per service, around any controller (ours; the
    paper sets each second's limits as its agent chose them): a limit rises as soon as the inner
    controller asks, but falls only to the highest of its decisions over the last `window_s`
    seconds, so one quiet second cannot cut a service that the next burst needs.

    The inner controller still reads the limits in force from each measurement (as it does behind
    the real-container guard), so it sees what the window held, not what it asked for. A window of
    1 s is the inner controller unchanged."""

    def __init__(self, inner: Controller, window_s: int):
        if isinstance(window_s, bool) or not isinstance(window_s, (int, float)) or not np.isfinite(window_s) \
                or int(window_s) != window_s or window_s < 1:
            raise ValueError(f"scale_down_window must be a whole number of seconds >= 1, not {window_s!r}")
        self.inner = inner
        self.window_s = int(window_s)
        self.name = f"{inner.name}+window{self.window_s}"
        self._asked: list[np.ndarray] = []
        self._limits: AppLimits | None = None

    def reset(self, limits: AppLimits) -> None:
        self.inner.reset(limits)
        self._limits = limits
        self._asked = []

    def act(self, m: StepMeasurement) -> np.ndarray:
        asked = clip_cores(self.inner.act(m), self._limits)
        self._asked = [*self._asked[1 - self.window_s:], asked] if self.window_s > 1 else [asked]
        return np.max(np.stack(self._asked), axis=0)

    @property
    def forks(self) -> bool:
        """Whether `fork` can share the inner controller (a learned policy forks; a rule does not)."""
        return callable(getattr(self.inner, "fork", None))

    def fork(self) -> "ScaleDownWindow":
        """An empty window of the same length around a fork of the inner controller: one per
        controlled application, sharing the inner policy's network instead of loading it again."""
        if not self.forks:
            raise TypeError(f"{self.inner.name} does not fork; build another controller instead")
        return ScaleDownWindow(self.inner.fork(), self.window_s)

    def close(self):
        close = getattr(self.inner, "close", None)   # a learning controller saves what it learned
        return close() if close else None
