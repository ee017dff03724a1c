"""The networks of OSDEC (§4.2, Fig. 2-3) and of the ablations of Table 1.

* `AuxModule` (§4.2.2, Fig. 3): a GRU over the recent slot summaries, a shared layer (the
  "low-level" information, dimension 5, Table 3) and one task-specific layer per auxiliary task
  (dimension 5) with its prediction. The "high-level" information is the mean of the four
  task-specific layers (our reading: Table 3 gives one high-level dimension, 5, for four tasks).
  Trained by MSE on the next slot's capacity, mean cores, mean duration and violation, with its
  own optimiser (Table 3's multi-task learning rate); its features enter the policy detached.
* `AttentionNet` (OSDEC, PPO+Att, +Aux_H, +Aux_L): [job token || aux features x coefficient]
  -> linear encoding -> Transformer encoder layers (1 head, post-norm residual sub-layers as the
  paper's "residual connection followed by normalization") -> position-wise mean head (tanh) and
  std head (softplus) per job; value = mean over jobs of a linear output.
* `MlpNet` (the "PPO" row): the padded token matrix flattened into a fixed-length vector.
* `PointerNet` (the "PointerNet" row): an LSTM encoder over the job sequence and an additive
  attention "pointer" from a pooled query to every job, whose logit is the job's mean score (a
  one-step pointer: the prefix rule needs scores, not a decoded sequence; our reading), plus a
  fixed offset, 0 under the paper's mapping and osdec.SKIP_INIT_BIAS under "skip".
Every net returns (mu [B, M], sigma [B, M], value [B]) for the first M = max_eligible tokens.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

AUX_DIM = 5  # Table 3: high- / low-prior information dimension


class AuxModule(nn.Module):
    def __init__(self, n_summary: int, n_targets: int = 4, hidden: int = 32, dim: int = AUX_DIM):
        super().__init__()
        self.gru = nn.GRU(n_summary, hidden, batch_first=True)
        self.shared = nn.Linear(hidden, dim)
        self.task_layers = nn.ModuleList(nn.Linear(dim, dim) for _ in range(n_targets))
        self.task_out = nn.ModuleList(nn.Linear(dim, 1) for _ in range(n_targets))

    def forward(self, history: torch.Tensor):
        """history [B, H, S] -> (low [B, dim], high [B, dim], predictions [B, n_targets])."""
        _, h = self.gru(history)
        low = torch.tanh(self.shared(h[-1]))
        task = [torch.tanh(layer(low)) for layer in self.task_layers]
        pred = torch.cat([out(z) for out, z in zip(self.task_out, task)], dim=-1)
        high = torch.stack(task, 0).mean(0)
        return low, high, pred


def _std(x: torch.Tensor) -> torch.Tensor:
    return F.softplus(x) + 1e-3


class AttentionNet(nn.Module):
    def __init__(self, n_features: int, n_eligible: int, extra: int = 0, d_model: int = 64,
                 layers: int = 2, ff: int = 128):
        super().__init__()
        self.M = n_eligible
        self.encode = nn.Linear(n_features + extra, d_model)
        layer = nn.TransformerEncoderLayer(d_model, nhead=1, dim_feedforward=ff, dropout=0.0,
                                           batch_first=True, norm_first=False)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.mu = nn.Sequential(nn.Linear(d_model, d_model), nn.ReLU(), nn.Linear(d_model, 1))
        self.sigma = nn.Sequential(nn.Linear(d_model, d_model), nn.ReLU(), nn.Linear(d_model, 1))
        self.value = nn.Linear(d_model, 1)

    def forward(self, tokens, mask, extra=None):
        x = tokens if extra is None else torch.cat([tokens, extra.unsqueeze(1).expand(-1, tokens.shape[1], -1)], -1)
        empty = ~mask.any(-1)
        # an all-padding set would make attention NaN: let such rows attend to their first token
        key_pad = ~mask
        key_pad[empty, 0] = False
        h = self.encoder(self.encode(x), src_key_padding_mask=key_pad)
        mu = torch.tanh(self.mu(h[:, : self.M]).squeeze(-1))
        sigma = _std(self.sigma(h[:, : self.M]).squeeze(-1))
        m = mask.float().unsqueeze(-1)
        value = (self.value(h) * m).sum(1).squeeze(-1) / m.sum(1).squeeze(-1).clamp(min=1.0)
        return mu, sigma, value


class MlpNet(nn.Module):
    def __init__(self, n_features: int, n_tokens: int, n_eligible: int, extra: int = 0, hidden: int = 256):
        super().__init__()
        self.M = n_eligible
        self.body = nn.Sequential(nn.Linear(n_features * n_tokens + extra, hidden), nn.Tanh(),
                                  nn.Linear(hidden, hidden), nn.Tanh())
        self.mu = nn.Linear(hidden, n_eligible)
        self.sigma = nn.Linear(hidden, n_eligible)
        self.value = nn.Linear(hidden, 1)

    def forward(self, tokens, mask, extra=None):
        x = (tokens * mask.unsqueeze(-1)).flatten(1)
        if extra is not None:
            x = torch.cat([x, extra], -1)
        h = self.body(x)
        return torch.tanh(self.mu(h)), _std(self.sigma(h)), self.value(h).squeeze(-1)


class PointerNet(nn.Module):
    def __init__(self, n_features: int, n_eligible: int, extra: int = 0, hidden: int = 64):
        super().__init__()
        self.M = n_eligible
        self.encoder = nn.LSTM(n_features + extra, hidden, batch_first=True)
        self.w_ref = nn.Linear(hidden, hidden, bias=False)
        self.w_query = nn.Linear(hidden, hidden)
        self.v = nn.Linear(hidden, 1, bias=False)
        self.sigma = nn.Linear(hidden, 1)
        self.value = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 1))
        # the score's offset: `v` has no bias, so the "skip" mapping's start-what-fits offset
        # (osdec.SKIP_INIT_BIAS) goes here; 0 under "prefix". Not saved: `OsdecModel.build` sets
        # it from the mapping in the metadata, and policies saved without it still load
        self.register_buffer("mu_bias", torch.zeros(()), persistent=False)

    def forward(self, tokens, mask, extra=None):
        x = tokens if extra is None else torch.cat([tokens, extra.unsqueeze(1).expand(-1, tokens.shape[1], -1)], -1)
        h, _ = self.encoder(x * mask.unsqueeze(-1))
        m = mask.float().unsqueeze(-1)
        query = (h * m).sum(1) / m.sum(1).clamp(min=1.0)
        logits = self.v(torch.tanh(self.w_ref(h) + self.w_query(query).unsqueeze(1))).squeeze(-1)
        mu = torch.tanh(logits[:, : self.M] + self.mu_bias)
        sigma = _std(self.sigma(h[:, : self.M]).squeeze(-1))
        return mu, sigma, self.value(query).squeeze(-1)
