"""KEDA-style scaling on the job queue: desired cores = ceil((waiting + running jobs) /
`jobs_per_core`), split over the groups by `shares` (fractions of cores per group), with a
scale-in stabilisation window like HPA's. Each interval moves a group by at most one VM.
"""
from __future__ import annotations

import numpy as np

from ..base import register
from ..builtin import vm_count_features
from .stabilization import StabilizedScaler

DEFAULTS = {"jobs_per_core": 1.0, "shares": None, "stabilization_steps": 3, "cores": None}
GRID = {"jobs_per_core": [0.5, 1.0, 1.5, 2.0, 3.0, 4.0], "stabilization_steps": [1, 3, 5, 10]}


@register
class QueueAgent(StabilizedScaler):
    kind = "queue"

    def __init__(self, feature_names=(), action_mode="per-type", type_names=("S", "M", "L"), params=None, **kw):
        p = {**DEFAULTS, **(params or {})}
        n = len(type_names)
        if p["cores"] is None:
            raise ValueError("queue agent: `cores` (cores per VM of each type) is required")
        if p["shares"] is None:
            p["shares"] = [1.0 / n] * n
        if len(p["cores"]) != n or len(p["shares"]) != n:
            raise ValueError("queue agent: `cores` and `shares` need one entry per VM type")
        if p["jobs_per_core"] <= 0:
            raise ValueError("jobs_per_core must be positive")
        super().__init__(("jobs_waiting", "jobs_running") + vm_count_features(type_names), action_mode, type_names,
                         params=p, **kw)

    def act(self, features, state, deterministic=True):
        f = np.asarray(features, dtype=np.float64)
        jobs = f[:, 0] + f[:, 1]
        current = f[:, 2:]
        cores_needed = np.ceil(jobs / self.params["jobs_per_core"])
        shares = np.asarray(self.params["shares"], dtype=np.float64)
        desired = np.ceil(cores_needed[:, None] * shares[None, :] / np.asarray(self.params["cores"])[None, :])
        return self.decide(desired, current, state)
