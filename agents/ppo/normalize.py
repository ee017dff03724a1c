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
        batch_mean, batch_var, n = x.mean(axis=0), x.var(axis=0), x.shape[0]
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
