"""Scale-out at once, scale-in only as far as the highest recommendation of the last
`stabilization_steps` intervals allows (Kubernetes HPA's scale-down stabilisation window).
Shared by the target-tracking and queue baselines."""
from __future__ import annotations

import numpy as np

from ..base import Agent, Decisions
from ..builtin import LoadErrorsNameTheFile, check_action_mode, deltas_to_actions
from ..params import number_param


def check_window(kind: str, params: dict) -> None:
    """The window counts intervals: 1 is no stabilisation; 0, a fraction or NaN is no window."""
    number_param(kind, "stabilization_steps", params["stabilization_steps"], low=1, whole=True)


class StabilizedScaler(LoadErrorsNameTheFile, Agent):
    stateful = True

    def __init__(self, feature_names, action_mode, type_names, **kw):
        check_action_mode(self.kind, action_mode)
        super().__init__(feature_names, action_mode, type_names, **kw)

    def initial_state(self, batch=1):
        w = max(1, int(self.params["stabilization_steps"]))
        return np.full((batch, w, self.n_types), -1.0)  # recent recommendations; -1 = none yet

    def reset_state(self, state, mask):
        state = state.copy()
        state[np.asarray(mask, dtype=bool)] = -1.0
        return state

    def decide(self, desired: np.ndarray, current: np.ndarray, state: np.ndarray):
        """desired/current: (B, n_types) VM counts. Moves each group one VM towards its target."""
        state = np.concatenate([state[:, 1:], desired[:, None, :]], axis=1)
        stable = np.maximum(desired, state.max(axis=1))
        target = np.where(desired > current, desired, np.minimum(current, stable))
        return Decisions(deltas_to_actions(self.action_mode, target - current)), state
