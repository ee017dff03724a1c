"""Scale-out at once, scale-in only as far as the highest recommendation of the last
`stabilization_steps` intervals allows (Kubernetes HPA's scale-down stabilisation window).
Shared by the target-tracking and queue baselines."""
from __future__ import annotations

import numpy as np

from ..base import Agent, Decisions
from ..builtin import deltas_to_actions


class StabilizedScaler(Agent):
    stateful = True

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
