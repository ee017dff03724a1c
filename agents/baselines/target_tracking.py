"""Target tracking, as AWS recommends and Kubernetes' HPA does: for every group
desired = ceil(current × metric / target), ignored while |metric / target − 1| <= tolerance;
scale-in only to the highest recommendation of the last `stabilization_steps` intervals (HPA's
scale-down stabilisation window). Each interval moves a group by at most one VM (the action
space's granularity). A group is never emptied by this rule (it would lose its own metric);
`floor` is the lowest count it recommends.
"""
from __future__ import annotations

import numpy as np

from ..base import register
from ..builtin import vm_count_features
from ..params import check_param_keys, number_param
from .stabilization import StabilizedScaler, check_window

DEFAULTS = {"target": 0.6, "tolerance": 0.1, "stabilization_steps": 5, "floor": 1}
GRID = {"target": [0.4, 0.5, 0.6, 0.7, 0.8, 0.9], "tolerance": [0.0, 0.1], "stabilization_steps": [1, 3, 5, 10]}


@register
class TargetTrackingAgent(StabilizedScaler):
    kind = "target-tracking"

    def __init__(self, feature_names=(), action_mode="per-type", type_names=("S", "M", "L"), params=None, **kw):
        check_param_keys(self.kind, params or {}, DEFAULTS)
        p = {**DEFAULTS, **(params or {})}
        number_param(self.kind, "target", p["target"], low=0, low_open=True, high=1)
        number_param(self.kind, "tolerance", p["tolerance"], low=0)
        check_window(self.kind, p)
        number_param(self.kind, "floor", p["floor"], low=0, whole=True)
        super().__init__(("cpu_mean",) + vm_count_features(type_names), action_mode, type_names, params=p, **kw)

    def act(self, features, state, deterministic=True):
        f = np.asarray(features, dtype=np.float64)
        cpu, current = f[:, :1], f[:, 1:]
        ratio = cpu / self.params["target"]
        desired = np.ceil(current * ratio - 1e-9)
        desired = np.where(np.abs(ratio - 1.0) <= self.params["tolerance"], current, desired)
        desired = np.maximum(desired, self.params["floor"])
        return self.decide(desired, current, state)
