"""Oversub Gym (§6.2) as a Gymnasium environment: one step = one hour, all subscribers act at once.

* Observation: `features.observation` (the paper's per-subscriber state, requests and hour).
* Action: MultiDiscrete([6] * N), an index into RATES per subscriber (`rates="tenths"`, ours:
  MultiDiscrete([9] * N) over settings.RATE_GRIDS["tenths"]); a subscriber without a
  request this step is ignored (`info["request_mask"]`, Eq. 9's m_t).
* Reward: the cores the rates saved this step divided by Z (`reward_scale`, §6.2); the constraint
  is NOT folded in: `info["cost"]` = C_c(s) (1 when any PM is hot) lets a constrained learner add
  lambda (c - cost) itself (Eq. 8), and `info["hot_pms"]` says how many.
* Episodes: `split="train"` replays the training weekdays (usage as logged, or redrawn from the
  training days' Gaussians with `train_usage="redrawn"`); `split="test"` a held-apart block with
  usage redrawn (L369). `workload_fn(rng) -> Workload` replaces the data layer (tests).
"""
from __future__ import annotations

from typing import Callable

import gymnasium as gym
import numpy as np

from .features import observation, request_mask
from .policy import oversub_spaces
from .settings import get_setting, rate_grid
from .sim import OversubSim


class OversubscriptionEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, setting="azure", split: str = "train", warm: bool = False, trace_seed: int = 0,
                 train_usage: str = "logged", reward_scale: float | None = None,
                 workload_fn: Callable | None = None, rates: str = "paper", render_mode: str | None = None):
        if render_mode is not None:
            raise ValueError(f"render_mode {render_mode!r} is not supported: this environment does not render")
        self.setting = get_setting(setting)
        self.rates = np.asarray(rate_grid(rates))
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', not {split!r}")
        if train_usage not in ("logged", "redrawn"):
            raise ValueError(f"train_usage must be 'logged' or 'redrawn', not {train_usage!r}")
        if workload_fn is None:     # refused now, not at the first reset() (NumPy's seeding error)
            from .data import check_trace_seed

            trace_seed = check_trace_seed(trace_seed)
        self.split, self.warm, self.trace_seed, self.train_usage = split, warm, trace_seed, train_usage
        self.reward_scale = reward_scale if reward_scale is not None else 1.0 / self.setting.pm_cores
        if isinstance(self.reward_scale, bool) or not isinstance(self.reward_scale, (int, float, np.number)) \
                or not np.isfinite(self.reward_scale):
            # NaN or inf made every reward of every episode NaN or inf, silently
            raise ValueError(f"reward_scale must be a finite number, not {reward_scale!r}")
        self.workload_fn = workload_fn
        self.observation_space, self.action_space = oversub_spaces(self.setting, n_rates=self.rates.size)
        self._sim: OversubSim | None = None
        self._view = None
        self._episode = 0

    def _workload(self):
        rng = self.np_random
        if self.workload_fn is not None:
            return self.workload_fn(rng)
        from .data import generate_trace

        trace = generate_trace(self.setting, self.trace_seed)
        seed = int(rng.integers(0, 2**31 - 1))
        if self.split == "test":
            return trace.test_workload(int(rng.integers(0, trace.n_test_blocks)), seed, warm=self.warm)
        if self.train_usage == "redrawn":
            return trace.train_redrawn(seed, warm=self.warm)
        return trace.train_workload(warm=self.warm)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._sim = OversubSim(self.setting, self._workload(), warm_start=self.warm)
        self._view = self._sim.reset()
        self._episode += 1
        return observation(self._view, self.setting), {"request_mask": request_mask(self._view).astype(np.int8),
                                                       "hour": self._view.hour}

    def _indices(self, action) -> np.ndarray:
        """The action as N whole indices into the rates; refused, not truncated (2.7 is not index 2),
        when it is anything else."""
        problem = f"action must be {self.setting.n_subscribers} indices into {self.rates.tolist()}, not {action!r}"
        try:
            raw = np.asarray(action, dtype=np.float64).reshape(-1)
        except (TypeError, ValueError):
            raise ValueError(problem) from None
        if (raw.shape != (self.setting.n_subscribers,) or not np.all(np.isfinite(raw))
                or np.any(raw != np.floor(raw)) or raw.min() < 0 or raw.max() >= self.rates.size):
            raise ValueError(problem)
        return raw.astype(np.int64)

    def step(self, action):
        if self._sim is None:
            raise RuntimeError("call reset() first")
        view, res = self._sim.step(self.rates[self._indices(action)])
        terminated = view is None
        if terminated:
            obs = observation(self._view, self.setting)
            mask = np.zeros(self.setting.n_subscribers, np.int8)
        else:
            self._view = view
            obs = observation(view, self.setting)
            mask = request_mask(view).astype(np.int8)
        info = {"cost": float(res.cluster_hot), "hot_pms": res.hot_pms, "saved_cores": res.saved_cores,
                "rejected": res.rejected, "request_mask": mask}
        if terminated:
            info["episode_record"] = self._sim.record
        return obs, float(res.saved_cores * self.reward_scale), terminated, False, info
