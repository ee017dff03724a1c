"""Running mean and variance (parallel algorithm of Chan et al.), for observation and reward
normalisation."""
from __future__ import annotations

import numpy as np


class RunningMeanStd:
    def __init__(self, shape: tuple[int, ...] = (), epsilon: float = 1e-4):
        self.mean = np.zeros(shape, dtype=np.float64)
        self.var = np.ones(shape, dtype=np.float64)
        self.count = epsilon

    def update(self, x: np.ndarray) -> None:
        x = np.asarray(x, dtype=np.float64)
        # x.mean(0) and x.var(0) spelled out (same operations, same bits): called twice per
        # environment step, their Python wrappers cost more than the arithmetic
        n = x.shape[0]
        batch_mean = x.sum(axis=0) / n
        centred = x - x.sum(axis=0, keepdims=True) / n
        batch_var = (centred * centred).sum(axis=0) / n
        delta = batch_mean - self.mean
        total = self.count + n
        self.mean = self.mean + delta * n / total
        m2 = self.var * self.count + batch_var * n + delta**2 * self.count * n / total
        self.var = m2 / total
        self.count = total

    def to_dict(self) -> dict:
        return {"mean": np.asarray(self.mean).tolist(), "var": np.asarray(self.var).tolist(), "count": self.count}

    @classmethod
    def from_dict(cls, d: dict) -> "RunningMeanStd":
        r = cls(np.asarray(d["mean"]).shape)
        r.mean, r.var, r.count = np.asarray(d["mean"], dtype=np.float64), np.asarray(d["var"], dtype=np.float64), d["count"]
        return r
