"""The paper's policy network: one LSTM layer (128 cells) over the inputs, then a linear policy
head and a linear value head sharing that trunk (Fig. 8 of the paper)."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical

State = tuple[torch.Tensor, torch.Tensor]  # (h, c), each (1, batch, hidden)


def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias: float = 0.0) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


class ActionDist:
    """Independent categoricals, one per action dimension (1 for Discrete(n), k for
    MultiDiscrete of k dimensions). Dimensions of equal size share one batched Categorical,
    and argument validation is off: both matter at one call per environment step."""

    def __init__(self, logits: torch.Tensor, nvec: tuple[int, ...]):
        self.nvec = nvec
        self.same = len(set(nvec)) == 1
        if self.same:
            shaped = logits.reshape(*logits.shape[:-1], len(nvec), nvec[0])
            self.joint = Categorical(logits=shaped, validate_args=False)
        else:
            self.parts = [Categorical(logits=x, validate_args=False) for x in torch.split(logits, list(nvec), dim=-1)]

    def sample(self) -> torch.Tensor:
        if self.same:
            return self.joint.sample()
        return torch.stack([d.sample() for d in self.parts], dim=-1)

    def mode(self) -> torch.Tensor:
        if self.same:
            return self.joint.probs.argmax(dim=-1)
        return torch.stack([d.probs.argmax(dim=-1) for d in self.parts], dim=-1)

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        if self.same:
            return self.joint.log_prob(actions).sum(dim=-1)
        return sum(d.log_prob(actions[..., i]) for i, d in enumerate(self.parts))

    def entropy(self) -> torch.Tensor:
        if self.same:
            return self.joint.entropy().sum(dim=-1)
        return sum(d.entropy() for d in self.parts)

    def probs(self) -> list[torch.Tensor]:
        if self.same:
            return list(self.joint.probs.unbind(dim=-2))
        return [d.probs for d in self.parts]


class LstmActorCritic(nn.Module):
    def __init__(self, obs_dim: int, nvec: tuple[int, ...], hidden: int = 128):
        super().__init__()
        self.obs_dim, self.nvec, self.hidden = obs_dim, tuple(int(n) for n in nvec), hidden
        self.lstm = nn.LSTM(obs_dim, hidden)
        for name, param in self.lstm.named_parameters():
            if "bias" in name:
                nn.init.constant_(param, 0)
            elif "weight" in name:
                nn.init.orthogonal_(param, 1.0)
        self.policy = layer_init(nn.Linear(hidden, sum(self.nvec)), std=0.01)
        self.value = layer_init(nn.Linear(hidden, 1), std=1.0)

    def bias_towards(self, noop_index: tuple[int, ...], prob: float) -> None:
        """Start with probability `prob` on each dimension's no-op action (the rest uniform)."""
        if not 0.0 < prob < 1.0:
            return
        with torch.no_grad():
            offset = 0
            for n, idx in zip(self.nvec, noop_index):
                rest = (1.0 - prob) / (n - 1)
                self.policy.bias[offset:offset + n] = float(np.log(rest))
                self.policy.bias[offset + idx] = float(np.log(prob))
                offset += n

    def initial_state(self, batch: int, device: torch.device | str = "cpu") -> State:
        z = torch.zeros(1, batch, self.hidden, device=device)
        return z, z.clone()

    @staticmethod
    def _mask(state: State, starts: torch.Tensor) -> State:
        keep = (1.0 - starts).view(1, -1, 1)
        return state[0] * keep, state[1] * keep

    def step(self, obs: torch.Tensor, state: State, episode_start: torch.Tensor):
        """One time step for a batch: (B, F) -> logits (B, A), value (B,), new state. The state
        is zeroed where an episode starts."""
        out, state = self.lstm(obs.unsqueeze(0), self._mask(state, episode_start))
        h = out[0]
        return self.policy(h), self.value(h).squeeze(-1), state

    def unroll(self, obs: torch.Tensor, state: State, episode_starts: torch.Tensor):
        """A sequence (L, B, F) from `state`, resetting where episodes start: logits (L, B, A),
        values (L, B), final state. Runs one fused LSTM call per stretch without resets."""
        length = obs.shape[0]
        reset_at = torch.nonzero(episode_starts[1:].any(dim=1)).flatten().add(1).tolist()
        bounds = [0, *reset_at, length]
        outs = []
        for a, b in zip(bounds[:-1], bounds[1:]):
            out, state = self.lstm(obs[a:b], self._mask(state, episode_starts[a]))
            outs.append(out)
        h = torch.cat(outs, dim=0)
        return self.policy(h), self.value(h).squeeze(-1), state

    def dist(self, logits: torch.Tensor) -> ActionDist:
        return ActionDist(logits, self.nvec)
