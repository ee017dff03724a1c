"""The paper's reference: an ASG simple-scaling rule on the fleet's average CPU.

When the average CPU of running VMs is above `upper`, every group adds one VM; below `lower`,
every group removes one; after an action nothing happens for `cooldown_steps` intervals. The
paper used one threshold (lower = upper) and found 75 % best for its workload.
"""
from __future__ import annotations

import numpy as np

from ..base import Agent, Decisions, register
from ..builtin import LoadErrorsNameTheFile, check_action_mode, deltas_to_actions
from ..params import check_param_keys, number_param

DEFAULTS = {"upper": 0.75, "lower": 0.75, "cooldown_steps": 5}
GRID = {"upper": [0.5, 0.6, 0.7, 0.75, 0.8, 0.9], "lower": [0.1, 0.25, 0.4, 0.5, 0.75], "cooldown_steps": [0, 2, 5]}


@register
class ThresholdAgent(LoadErrorsNameTheFile, Agent):
    kind = "threshold"
    stateful = True

    def __init__(self, feature_names=("cpu_mean",), action_mode="per-type", type_names=("S", "M", "L"),
                 params=None, **kw):
        check_action_mode(self.kind, action_mode)
        check_param_keys(self.kind, params or {}, DEFAULTS)
        p = {**DEFAULTS, **(params or {})}
        for key in ("upper", "lower"):
            number_param(self.kind, key, p[key], low=0, high=1)
        number_param(self.kind, "cooldown_steps", p["cooldown_steps"], low=0, whole=True)
        if not 0 <= p["lower"] <= p["upper"] <= 1:
            raise ValueError(f"threshold agent needs 0 <= lower <= upper <= 1, got {p}")
        super().__init__(("cpu_mean",), action_mode, type_names, params=p, **kw)

    def initial_state(self, batch=1):
        return np.zeros(batch, dtype=np.int64)  # intervals left in the cool-down

    def reset_state(self, state, mask):
        state = state.copy()
        state[np.asarray(mask, dtype=bool)] = 0
        return state

    def act(self, features, state, deterministic=True):
        cpu = np.asarray(features)[:, 0]
        ready = state <= 0
        want = np.where(cpu > self.params["upper"], 1, np.where(cpu < self.params["lower"], -1, 0))
        want = np.where(ready, want, 0)
        new_state = np.where(want != 0, int(self.params["cooldown_steps"]), np.maximum(state - 1, 0))
        deltas = np.repeat(want[:, None], self.n_types, axis=1)
        return Decisions(deltas_to_actions(self.action_mode, deltas)), new_state
