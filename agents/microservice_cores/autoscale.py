"""AutoScale, the paper's first baseline (L250): one rule per service on ratio = CPU use / limit,
the same parameters for both applications:

    ratio in [0.30, 0.50)  -> limit × 1.10
    ratio in [0.50, 1.00]  -> limit × 1.30     (above 1.00, measurement noise: the same)
    ratio in [0.00, 0.10]  -> limit × 0.90
    otherwise              -> hold

Pure: `autoscale_step` maps (use, limit) to the next limit; `AutoScale` is its Controller.
"""
from __future__ import annotations

import numpy as np

from agents.params import number_param

from .control import AppLimits, clip_cores
from .observation import StepMeasurement

UP_SMALL, UP_LARGE, DOWN = 1.10, 1.30, 0.90


def autoscale_step(use, limit) -> np.ndarray:
    use = np.asarray(use, dtype=np.float64)
    limit = np.asarray(limit, dtype=np.float64)
    ratio = np.divide(use, limit, out=np.zeros_like(use), where=limit > 0)
    factor = np.ones_like(ratio)
    factor[(ratio >= 0.30) & (ratio < 0.50)] = UP_SMALL
    factor[ratio >= 0.50] = UP_LARGE
    # a negative ratio (a negative use: a broken counter) is in no band of the rule: it holds
    factor[(ratio >= 0.0) & (ratio <= 0.10)] = DOWN
    # unknown use (NaN) holds
    factor[~np.isfinite(ratio)] = 1.0
    return limit * factor


def _seed(seed):
    """None or a whole number >= 0 (a large int kept exact), else a ValueError naming it."""
    if seed is None or (isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0):
        return seed
    return int(number_param("autoscale", "seed", seed, low=0, whole=True))


class AutoScale:
    name = "autoscale"

    def __init__(self, noise: float = 0.0, seed: int | None = None):
        # noise: the paper's ±5 % uniform perturbation used while it fills the replay buffer;
        # checked here, or a NaN or negative noise fails only at the first act
        self.noise = number_param(self.name, "noise", noise, low=0.0, high=1.0)
        self.rng = np.random.default_rng(_seed(seed))
        self.limits: AppLimits | None = None

    def reset(self, limits: AppLimits) -> None:
        self.limits = limits

    def act(self, m: StepMeasurement) -> np.ndarray:
        nxt = autoscale_step(m.cpu_used, m.cpu_limit)
        if self.noise:
            nxt = nxt * (1.0 + self.rng.uniform(-self.noise, self.noise, size=nxt.shape))
        return clip_cores(nxt, self.limits)
