"""C2MARL's value networks (Eq. 9): a cluster term Q^c(s^c) plus one Q^i(o^i, .) per subscriber.

The N per-agent networks are separate parameter sets (theta^i of §5.3), evaluated together as one
batched matmul over a leading agent axis, so nine agents cost one forward pass. Activations stay
agent-major ([N, B, .]) between layers, so torch.bmm needs no permuted copy at each layer; on our
machine it gives the einsum over [B, N, .] of earlier versions bit for bit (the same trained weights),
and a test checks it against that definition.
Sizes are not given by the paper (Table 4 gives only ReLU and Adam): two hidden layers of 64, ours.

`C2MarlEnsemble` (ours, opt-in: train.py `--ensemble K`) lets the last K snapshots of one run act
together, each agent taking a vote over the members' greedy actions (`vote`): docs/oversubscription.md,
"Snapshot ensembles of the last checkpoints".
"""
from __future__ import annotations

import math

import torch
from torch import nn


class AgentLinear(nn.Module):
    """N independent linear layers applied to [N, B, in] -> [N, B, out]."""

    def __init__(self, n_agents: int, d_in: int, d_out: int):
        super().__init__()
        bound = 1.0 / math.sqrt(d_in)
        self.weight = nn.Parameter(torch.empty(n_agents, d_in, d_out).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(n_agents, d_out).uniform_(-bound, bound))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.bmm(x, self.weight) + self.bias.unsqueeze(1)


class AgentQ(nn.Module):
    """Q^i(o^i, a) for every agent i at once: [B, N, obs] -> [B, N, n_actions]."""

    def __init__(self, n_agents: int, obs_dim: int, n_actions: int, hidden: int = 64):
        super().__init__()
        self.l1 = AgentLinear(n_agents, obs_dim, hidden)
        self.l2 = AgentLinear(n_agents, hidden, hidden)
        self.out = AgentLinear(n_agents, hidden, n_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """obs [N, B, obs] -> [N, B, n_actions]."""
        h = torch.relu(self.l1(obs))
        h = torch.relu(self.l2(h))
        return self.out(h)


class ClusterV(nn.Module):
    """Q^c(s^c): the value of the cluster's state, whatever the agents do now."""

    def __init__(self, state_dim: int, hidden: int = 64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(state_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, 1))

    def forward(self, s: torch.Tensor) -> torch.Tensor:
        return self.net(s).squeeze(-1)


class C2MarlNet(nn.Module):
    def __init__(self, n_agents: int, obs_dim: int, n_actions: int, hidden: int = 64):
        super().__init__()
        self.n_agents, self.obs_dim, self.n_actions, self.hidden = n_agents, obs_dim, n_actions, hidden
        self.agents = AgentQ(n_agents, obs_dim, n_actions, hidden)
        self.cluster = ClusterV(obs_dim, hidden)

    def agent_q(self, obs: torch.Tensor) -> torch.Tensor:
        """obs [B, obs] (every agent sees the whole state, §6.2) -> [B, N, A]."""
        return self.agents(obs.unsqueeze(0).expand(self.n_agents, -1, -1)).transpose(0, 1)

    def q_total(self, obs: torch.Tensor, actions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Eq. 9: Q(s, a) = Q^c(s^c) + sum_i m^i Q^i(o^i, a^i)."""
        q = self.agent_q(obs).gather(-1, actions.unsqueeze(-1)).squeeze(-1)  # [B, N]
        return self.cluster(obs) + (q * mask).sum(-1)

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        """obs [B, obs] -> [B, N]: each agent's action on its own Q^i (decentralised execution, §5.3)."""
        return self.agent_q(obs).argmax(-1)


# A quantile vote takes the members' rate at that quantile, at the higher rank (sorted ascending,
# index ceil(q (K - 1))): upper-quartile is the 4th of 5 and the 7th of 9, p60 the 4th of 5 and the
# 6th of 9, so p60 differs from the upper quartile only with more than five members.
QUANTILE_VOTES = {"upper-quartile": 0.75, "p60": 0.6}
VOTES = ("median", "p60", "upper-quartile", "mean-q", "max")


def vote(q: torch.Tensor, how: str) -> torch.Tensor:
    """q [K, ..., A] of K members -> the action index each agent takes [...] (ours). Rates ascend, so
    an index's order is its rate's: median is the members' median rate (the lower one for even K),
    p60 and upper-quartile a higher quantile of their rates (QUANTILE_VOTES), between the median and
    max, the safest, mean-q the argmax of the members' mean Q^i (a snapshot ensemble)."""
    if how == "mean-q":
        return q.mean(0).argmax(-1)
    greedy = q.argmax(-1)
    if how == "median":
        return greedy.median(0).values
    if how in QUANTILE_VOTES:
        return greedy.sort(0).values[math.ceil(QUANTILE_VOTES[how] * (greedy.shape[0] - 1))]
    if how == "max":
        return greedy.max(0).values
    raise ValueError(f"vote must be one of {VOTES}, not {how!r}")


class C2MarlEnsemble(nn.Module):
    """Snapshots of one run's C2MarlNet acting together by `vote`; greedy() as one net's."""

    def __init__(self, members: list[C2MarlNet], how: str = "median"):
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one member")
        if how not in VOTES:
            raise ValueError(f"vote must be one of {VOTES}, not {how!r}")
        self.members = nn.ModuleList(members)
        self.how = how
        self.hidden, self.n_actions = members[0].hidden, members[0].n_actions

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        return vote(torch.stack([m.agent_q(obs) for m in self.members]), self.how)
