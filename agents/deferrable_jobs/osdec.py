"""OSDEC's hyperparameters (Table 3) and the model of each Table 1 variant.

    cfg = OsdecConfig(variant="osdec")        # or "ppo-att", "ppo-att-auxh", "ppo-att-auxl",
    model = OsdecModel.build(cfg, setting)    #    "ppo", "pointer", "reinforce"
    mu, sigma, value = model(tokens, mask, history)
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch
from torch import nn

from .features import AUX_TARGETS, SUMMARY_FEATURES, TOKEN_FEATURES, n_tokens
from .network import AUX_DIM, AttentionNet, AuxModule, MlpNet, PointerNet
from .settings import GAMMA, Setting

SKIP_INIT_BIAS = 0.5  # tanh(0.5) = 0.46: most jobs start at first under "skip", despite the noise

#: Table 1's rows: network, auxiliary information used, algorithm
VARIANTS = {
    "osdec": ("attention", ("low", "high"), "ppo"),
    "ppo-att-auxl": ("attention", ("low",), "ppo"),
    "ppo-att-auxh": ("attention", ("high",), "ppo"),
    "ppo-att": ("attention", (), "ppo"),
    "pointer": ("pointer", (), "ppo"),
    "ppo": ("mlp", (), "ppo"),
    "reinforce": ("attention", ("low", "high"), "reinforce"),
}


@dataclass(frozen=True)
class OsdecConfig:
    variant: str = "osdec"
    seed: int = 0
    total_steps: int = 300_000         # slots of experience (ours: sized to the 30-minute budget on 2 cores)
    n_envs: int = 16                   # §5.3.1: 16 parallel workers
    batch_size: int = 2048             # Table 3
    minibatch: int = 64                # Table 3
    lr_policy: tuple[float, float] = (1e-4, 1e-5)   # Table 3, linear decay (§5.3.1)
    lr_value: tuple[float, float] = (2e-4, 2e-5)    # Table 3
    lr_aux: tuple[float, float] = (1e-2, 1e-3)      # Table 3: multi-task learning rate
    gamma: float = GAMMA               # Table 3: 0.99
    gae_lambda: float = 0.95           # not given by the paper; our choice (PPO's default)
    clip: float = 0.2                  # not given; PPO's default
    epochs: int = 4                    # not given; our choice
    value_coef: float = 0.5            # not given; our choice
    max_grad_norm: float = 0.5         # not given; our choice
    aux_coef_low: float = 10.0         # Table 3: low-prior information coefficient (our reading: a scale)
    aux_coef_high: float = 10.0        # Table 3: high-prior information coefficient
    aux_epochs: int = 1                # not given; passes over each batch for the auxiliary MSE
    d_model: int = 64                  # not given ("several" encoder layers, no width): our choice
    layers: int = 2
    ff: int = 128
    reward_scale: float | None = None  # learning reward = paper reward x scale; None = 1 / fleet cores (ours)
    mapping: str = "prefix"            # the action mapping: "prefix" (§4.1.2) or "skip" (ours, rules.py)
    eval_every: int = 10               # iterations between greedy evaluations (§5.3.1 evaluates every iteration)
    eval_episodes: int = 8

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ValueError(f"unknown variant {self.variant!r}; choose from {sorted(VARIANTS)}")
        if self.mapping not in ("prefix", "skip"):
            raise ValueError(f"unknown action mapping {self.mapping!r}; choose 'prefix' or 'skip'")
        # each a count the trainer divides or loops by: n_envs 0 failed "integer modulo by zero" (also
        # when a policy's metadata held it), minibatch 0 deep in range(), eval_episodes 0 at the first
        # evaluation, and total_steps 0 or less ran a whole iteration
        for name in ("total_steps", "n_envs", "batch_size", "minibatch", "epochs", "eval_episodes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, not {value!r}")
        if self.batch_size % self.n_envs:
            raise ValueError("batch_size must be a multiple of n_envs")

    @property
    def net_kind(self) -> str:
        return VARIANTS[self.variant][0]

    @property
    def aux(self) -> tuple[str, ...]:
        return VARIANTS[self.variant][1]

    @property
    def algo(self) -> str:
        return VARIANTS[self.variant][2]


class OsdecModel(nn.Module):
    def __init__(self, net: nn.Module, aux: AuxModule | None, use: tuple[str, ...],
                 coef_low: float, coef_high: float):
        super().__init__()
        self.net = net
        self.aux = aux
        self.use = use
        self.coef_low = coef_low
        self.coef_high = coef_high

    @classmethod
    def build(cls, cfg: OsdecConfig, setting: Setting) -> "OsdecModel":
        F, M, N = len(TOKEN_FEATURES), setting.max_eligible, n_tokens(setting)
        extra = AUX_DIM * len(cfg.aux)
        aux = AuxModule(len(SUMMARY_FEATURES), len(AUX_TARGETS)) if cfg.aux else None
        if cfg.net_kind == "attention":
            net = AttentionNet(F, M, extra, cfg.d_model, cfg.layers, cfg.ff)
        elif cfg.net_kind == "mlp":
            net = MlpNet(F, N, M, extra)
        else:
            net = PointerNet(F, M, extra)
        if cfg.mapping == "skip":
            # under "skip" a negative score waits: start from a policy that starts what fits (ours)
            # (PointerNet has no mu head: `--variant pointer --mapping skip` failed with an AttributeError)
            with torch.no_grad():
                if isinstance(net, PointerNet):
                    net.mu_bias.fill_(SKIP_INIT_BIAS)
                else:
                    (net.mu[-1] if isinstance(net.mu, nn.Sequential) else net.mu).bias.fill_(SKIP_INIT_BIAS)
        return cls(net, aux, cfg.aux, cfg.aux_coef_low, cfg.aux_coef_high)

    @torch.no_grad()
    def aux_features(self, history: torch.Tensor) -> torch.Tensor | None:
        """The auxiliary module's information, detached: it is part of the policy's input."""
        if self.aux is None:
            return None
        low, high, _ = self.aux(history)
        parts = []
        if "low" in self.use:
            parts.append(low * self.coef_low)
        if "high" in self.use:
            parts.append(high * self.coef_high)
        return torch.cat(parts, -1)

    def forward(self, tokens, mask, extra=None):
        if not isinstance(self.net, MlpNet):
            # tokens are packed (features.py): cut the batch's common padding, keep the M score slots
            n = max(self.net.M, int(mask.sum(1).max()) if mask.numel() else 0)
            tokens, mask = tokens[:, :n], mask[:, :n]
        return self.net(tokens, mask, extra)

    def policy_parameters(self):
        return [p for n, p in self.net.named_parameters() if not n.startswith("value")]

    def value_parameters(self):
        return [p for n, p in self.net.named_parameters() if n.startswith("value")]


def eligible_mask(tokens: torch.Tensor, M: int) -> torch.Tensor:
    """[B, M] True where score slot i belongs to an eligible job (token feature 0)."""
    return tokens[:, :M, 0] > 0.5


def gaussian_logp(mu, sigma, action, emask):
    """Log-probability and entropy of the scores of the eligible jobs only (the rest is padding)."""
    dist = torch.distributions.Normal(mu, sigma)
    m = emask.float()
    return (dist.log_prob(action) * m).sum(-1), (dist.entropy() * m).sum(-1)
