"""Gymnasium env `samm/DeferrableJobs-v0`: one step = one slot.

Observation: {"tokens": [N, F] job tokens, "mask": [N] present tokens, "history": [H, S] slot
summaries} (features.py). Action: one confidence score per eligible token (the first
`max_eligible` of the padded vector; the rest are ignored); `rules.prefix_select` turns them into
the jobs to start (§4.1.2), or our "skip" mapping (`rules.select_by_scores`) when asked. Reward: Eq. 6 in the paper's units; `info` splits it into
utilisation, delay and violation penalties. Each reset draws a new episode of the chosen split.
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from .data import _check_split, make_episode
from .episode import Episode
from .features import HISTORY, SUMMARY_FEATURES, TOKEN_FEATURES, SummaryHistory, job_tokens, n_tokens, slot_summary
from .rules import MAPPINGS, select_by_scores
from .settings import get_setting
from .sim import DeferrableSim

SCORE_BOUND = 5.0


class DeferrableJobsEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, setting="tiny", split: str = "train", episode: Episode | None = None,
                 mapping: str = "prefix", render_mode: str | None = None):
        if render_mode is not None:
            raise ValueError(f"render_mode {render_mode!r} is not supported: this environment does not render")
        if mapping not in MAPPINGS:
            # refused here, not at the first step of a run
            raise ValueError(f"unknown action mapping {mapping!r}; choose from {MAPPINGS}")
        _check_split(split)     # likewise: it was refused only by the first reset's episode draw
        self.setting = get_setting(setting)
        self.mapping = mapping
        self.split = split
        self.fixed_episode = _episode_or_none(episode, "episode")
        s = self.setting
        N = n_tokens(s)
        self.observation_space = spaces.Dict({
            "tokens": spaces.Box(-np.inf, np.inf, (N, len(TOKEN_FEATURES)), np.float32),
            "mask": spaces.MultiBinary(N),
            "history": spaces.Box(-np.inf, np.inf, (HISTORY, len(SUMMARY_FEATURES)), np.float32),
        })
        self.action_space = spaces.Box(-SCORE_BOUND, SCORE_BOUND, (s.max_eligible,), np.float32)
        self.sim: DeferrableSim | None = None
        self.history = SummaryHistory()
        self._eligible = np.zeros(0, dtype=np.int64)

    def _obs(self) -> dict:
        view = self.sim.view()
        tok, mask, self._eligible = job_tokens(view, self.setting)
        hist = self.history.push(slot_summary(view, self.setting))
        return {"tokens": tok, "mask": mask.astype(np.int8), "history": hist}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        ep = self.fixed_episode
        if options and "episode" in options:
            ep = _episode_or_none(options["episode"], "options['episode']")
        if ep is None:
            ep = make_episode(self.setting, int(self.np_random.integers(2**31 - 1)), self.split)
        self.sim = DeferrableSim(ep)
        self.history.reset()
        return self._obs(), {}

    def step(self, action):
        if self.sim is None:
            raise RuntimeError("call reset() first")
        if self.sim.done:
            raise RuntimeError("the episode is over: call reset() first")
        try:
            scores = np.asarray(action, dtype=np.float64).reshape(-1)
        except (TypeError, ValueError):
            raise ValueError(f"action must be {self.action_space.shape[0]} numbers, got {action!r:.80}") from None
        if scores.size != self.action_space.shape[0]:
            # refused in every slot: a short one failed only in a slot with more eligible jobs than
            # scores, mid-episode and naming neither the action nor its size; a long or 2-D one (a
            # batch of actions, a [M, 2] array) was flattened and its first scores used in silence
            raise ValueError(f"action must hold {self.action_space.shape[0]} scores (one per eligible token "
                             f"shown), got {scores.size}")
        scores = scores[: len(self._eligible)]
        view_free = self.sim.view().free
        rows = self._eligible[select_by_scores(scores, self.sim.ep.cores[self._eligible], view_free, self.mapping)]
        res = self.sim.step(rows)
        info = {"utilisation": res.utilisation, "delay_penalty": res.delay_penalty,
                "violation_penalty": res.violation_penalty, "started": len(rows), "missed": res.missed}
        done = self.sim.done
        obs = self._obs() if not done else self._terminal_obs()
        return obs, float(res.reward), done, False, info

    def _terminal_obs(self) -> dict:
        s = self.setting
        return {"tokens": np.zeros((n_tokens(s), len(TOKEN_FEATURES)), np.float32),
                "mask": np.zeros(n_tokens(s), np.int8), "history": self.history.buf.copy()}


def _episode_or_none(episode, what: str) -> Episode | None:
    """An episode given to the env, checked when given: anything else failed at reset or at the
    first step with an AttributeError naming neither the argument nor what it must be."""
    if episode is not None and not isinstance(episode, Episode):
        raise ValueError(f"{what} must be an Episode (or None: draw one), got {type(episode).__name__}")
    return episode
