"""KEDA-style scaling on the job queue: desired cores = ceil((waiting + running jobs) /
`jobs_per_core`), split over the groups by `shares` (fractions of cores per group), with a
scale-in stabilisation window like HPA's. Each interval moves a group by at most one VM.
"""
from __future__ import annotations

import numpy as np

from ..base import register
from ..builtin import vm_count_features
from ..params import check_param_keys, number_list_param, number_param
from .stabilization import StabilizedScaler, check_window

DEFAULTS = {"jobs_per_core": 1.0, "shares": None, "stabilization_steps": 3, "cores": None}
GRID = {"jobs_per_core": [0.5, 1.0, 1.5, 2.0, 3.0, 4.0], "stabilization_steps": [1, 3, 5, 10]}


@register
class QueueAgent(StabilizedScaler):
    kind = "queue"

    def __init__(self, feature_names=(), action_mode="per-type", type_names=("S", "M", "L"), params=None, **kw):
        check_param_keys(self.kind, params or {}, DEFAULTS)
        p = {**DEFAULTS, **(params or {})}
        n = len(type_names)
        if p["cores"] is None:
            raise ValueError("queue agent: `cores` (cores per VM of each type) is required")
        if p["shares"] is None:
            p["shares"] = [1.0 / n] * n
        number_list_param(self.kind, "cores", p["cores"], n, low=0, low_open=True)  # divides: 0 is inf VMs
        if sum(number_list_param(self.kind, "shares", p["shares"], n)) <= 0:
            raise ValueError(f"queue: shares must not all be 0 (no group would grow), got {p['shares']!r}")
        number_param(self.kind, "jobs_per_core", p["jobs_per_core"], low=0, low_open=True)
        check_window(self.kind, p)
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
