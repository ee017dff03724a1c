"""Rollout storage for recurrent PPO: per step the observation, action, log-probability,
reward, value, episode-start flag and the LSTM state BEFORE the step, so training can replay
fixed-length chunks from their stored states (truncated BPTT).

Steps are written into preallocated NumPy arrays (one small copy each, no tensor creation per
step); `finish` computes GAE and hands the whole rollout to PyTorch once, already cut into
chunks, so each minibatch is one index per field."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


def _gae(rewards: np.ndarray, values: np.ndarray, episode_starts: np.ndarray, next_value: np.ndarray,
         next_episode_start: np.ndarray, gamma: float, lam: float) -> np.ndarray:
    steps = rewards.shape[0]
    nonterminal = 1.0 - np.concatenate([episode_starts[1:], next_episode_start[None]])
    next_values = np.concatenate([values[1:], next_value[None]])
    deltas = rewards + gamma * next_values * nonterminal - values
    decay = gamma * lam * nonterminal
    adv = np.zeros_like(rewards)
    last = np.zeros_like(next_value)
    for t in reversed(range(steps)):
        last = deltas[t] + decay[t] * last
        adv[t] = last
    return adv


def compute_gae(rewards, values, episode_starts, next_value, next_episode_start, gamma: float, lam: float):
    """Generalised advantage estimation over (T, E) arrays or tensors. `episode_starts[t]` says
    obs t is the first of an episode, i.e. the transition t-1 -> t crossed an episode end, so
    neither the value nor the advantage flows back across it. Returns (advantages, returns) of
    the input's kind."""
    as_np = lambda x: x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)  # noqa: E731
    v = as_np(values)
    adv = _gae(as_np(rewards), v, as_np(episode_starts), as_np(next_value), as_np(next_episode_start), gamma, lam)
    if isinstance(rewards, torch.Tensor):
        adv_t = torch.as_tensor(adv, device=rewards.device)
        return adv_t, adv_t + values
    return adv, adv + v


@dataclass
class Chunk:
    obs: torch.Tensor  # (L, B, F)
    actions: torch.Tensor  # (L, B, D)
    logprobs: torch.Tensor  # (L, B)
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    episode_starts: torch.Tensor
    state: tuple[torch.Tensor, torch.Tensor]  # (1, B, H) each, at the chunk's first step


class RolloutBuffer:
    def __init__(self, steps: int, envs: int, obs_dim: int, act_dims: int, hidden: int, device):
        z = lambda *s: np.zeros(s, dtype=np.float32)  # noqa: E731
        self.obs = z(steps, envs, obs_dim)
        self.actions = np.zeros((steps, envs, act_dims), dtype=np.int64)
        self.logprobs, self.rewards, self.values, self.episode_starts = (z(steps, envs) for _ in range(4))
        self.h, self.c = z(steps, envs, hidden), z(steps, envs, hidden)
        self.advantages = self.returns = None
        self.steps, self.envs, self.hidden, self.device = steps, envs, hidden, device
        self._chunked: dict[str, torch.Tensor] | None = None

    def add(self, t, obs, action, logprob, reward, value, episode_start, state) -> None:
        """One step for all envs; arrays or CPU tensors. `state` = (h, c) before the step,
        shaped (B, H) or (1, B, H)."""
        self.obs[t], self.actions[t], self.logprobs[t] = obs, action, logprob
        self.rewards[t], self.values[t], self.episode_starts[t] = reward, value, episode_start
        self.h[t] = np.asarray(state[0]).reshape(self.envs, self.hidden)
        self.c[t] = np.asarray(state[1]).reshape(self.envs, self.hidden)

    def finish(self, next_value, next_episode_start, gamma: float, lam: float) -> None:
        self.advantages, self.returns = compute_gae(self.rewards, self.values, self.episode_starts,
                                                    np.asarray(next_value, dtype=np.float32),
                                                    np.asarray(next_episode_start, dtype=np.float32), gamma, lam)
        self._chunked = None

    def _chunk_views(self, length: int) -> dict[str, torch.Tensor]:
        """Every field as (length, n_chunks, ...) with chunk id = k * envs + env for the chunk
        starting at step k * length of env `env`; states as (n_chunks, H) at chunk starts."""
        if self._chunked is not None and self._chunked["length"] == length:
            return self._chunked
        n = self.steps // length

        def cut(x: np.ndarray) -> torch.Tensor:
            y = x.reshape(n, length, self.envs, *x.shape[2:]).swapaxes(0, 1)
            return torch.as_tensor(np.ascontiguousarray(y.reshape(length, n * self.envs, *x.shape[2:])),
                                   device=self.device)

        def first(x: np.ndarray) -> torch.Tensor:
            return torch.as_tensor(np.ascontiguousarray(x[::length].reshape(n * self.envs, -1)), device=self.device)

        self._chunked = {"length": length, "obs": cut(self.obs), "actions": cut(self.actions),
                         "logprobs": cut(self.logprobs), "values": cut(self.values),
                         "advantages": cut(self.advantages), "returns": cut(self.returns),
                         "episode_starts": cut(self.episode_starts), "h": first(self.h), "c": first(self.c)}
        return self._chunked

    def chunks(self, length: int, num_minibatches: int, generator: torch.Generator):
        """Yield minibatches of whole chunks: the rollout is cut into (steps / length) × envs
        sequences of `length` steps, each starting from its stored LSTM state."""
        v = self._chunk_views(length)
        ids = torch.randperm((self.steps // length) * self.envs, generator=generator)
        for mb in ids.chunk(num_minibatches):
            mb = mb.to(self.device)
            pick = lambda name: v[name].index_select(1, mb)  # noqa: E731
            yield Chunk(
                obs=pick("obs"), actions=pick("actions"), logprobs=pick("logprobs"), values=pick("values"),
                advantages=pick("advantages"), returns=pick("returns"), episode_starts=pick("episode_starts"),
                state=(v["h"].index_select(0, mb).unsqueeze(0), v["c"].index_select(0, mb).unsqueeze(0)),
            )
