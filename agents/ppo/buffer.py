"""Rollout storage for recurrent PPO: per step the observation, action, log-probability,
reward, value, episode-start flag and the LSTM state BEFORE the step, so training can replay
fixed-length chunks from their stored states (truncated BPTT)."""
from __future__ import annotations

from dataclasses import dataclass

import torch


def compute_gae(rewards: torch.Tensor, values: torch.Tensor, episode_starts: torch.Tensor,
                next_value: torch.Tensor, next_episode_start: torch.Tensor, gamma: float, lam: float):
    """Generalised advantage estimation over (T, E) tensors. `episode_starts[t]` says obs t is
    the first of an episode, i.e. the transition t-1 -> t crossed an episode end, so neither
    the value nor the advantage flows back across it. Returns (advantages, returns)."""
    steps = rewards.shape[0]
    adv = torch.zeros_like(rewards)
    last = torch.zeros_like(next_value)
    for t in reversed(range(steps)):
        if t == steps - 1:
            nonterminal, nxt = 1.0 - next_episode_start, next_value
        else:
            nonterminal, nxt = 1.0 - episode_starts[t + 1], values[t + 1]
        delta = rewards[t] + gamma * nxt * nonterminal - values[t]
        last = delta + gamma * lam * nonterminal * last
        adv[t] = last
    return adv, adv + values


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
        z = lambda *s: torch.zeros(*s, device=device)  # noqa: E731
        self.obs = z(steps, envs, obs_dim)
        self.actions = torch.zeros(steps, envs, act_dims, dtype=torch.long, device=device)
        self.logprobs, self.rewards, self.values, self.episode_starts = (z(steps, envs) for _ in range(4))
        self.h, self.c = z(steps, envs, hidden), z(steps, envs, hidden)
        self.advantages = self.returns = None
        self.steps, self.envs = steps, envs

    def add(self, t, obs, action, logprob, reward, value, episode_start, state) -> None:
        self.obs[t], self.actions[t], self.logprobs[t] = obs, action, logprob
        self.rewards[t], self.values[t], self.episode_starts[t] = reward, value, episode_start
        self.h[t], self.c[t] = state[0][0], state[1][0]

    def finish(self, next_value, next_episode_start, gamma: float, lam: float) -> None:
        self.advantages, self.returns = compute_gae(self.rewards, self.values, self.episode_starts,
                                                    next_value, next_episode_start, gamma, lam)

    def chunks(self, length: int, num_minibatches: int, generator: torch.Generator):
        """Yield minibatches of whole chunks: the rollout is cut into (steps / length) × envs
        sequences of `length` steps, each starting from its stored LSTM state."""
        n_per_env = self.steps // length
        ids = torch.randperm(n_per_env * self.envs, generator=generator)
        for mb in ids.chunk(num_minibatches):
            starts = (mb // self.envs) * length
            envs = mb % self.envs
            t_idx = starts.unsqueeze(0) + torch.arange(length).unsqueeze(1)  # (L, B)
            e_idx = envs.unsqueeze(0).expand(length, -1)
            pick = lambda x: x[t_idx, e_idx]  # noqa: E731
            yield Chunk(
                obs=pick(self.obs), actions=pick(self.actions), logprobs=pick(self.logprobs),
                values=pick(self.values), advantages=pick(self.advantages), returns=pick(self.returns),
                episode_starts=pick(self.episode_starts),
                state=(self.h[starts, envs].unsqueeze(0), self.c[starts, envs].unsqueeze(0)),
            )
