"""Reclaimer's agent: SAC over per-service rows (Fettes et al., §4 and Table 2), read top to bottom.

* One actor shared by every service: a row (the service's k stacked feature rows + its one-hot
  id) -> a Gaussian over an unbounded u; the action a = sigmoid(u) in [0, 1], cores = a · cap.
  Training samples a; evaluation uses sigmoid(mean) (L93, L107–109).
* Twin critics: each row passes 2 FC layers, the service's own action is appended, 5 more FC
  layers give one scalar per service, and Q is their mean over the (masked) services.
* A learned entropy coefficient (initial η = 1) with the paper's target entropy −1/(|M|·|A|),
  compared with the per-service mean log-density of the action (our reading: the paper pools Q
  by the mean over services, and we pool the entropy the same way). On an action in [0, 1] that
  target is within 7 % of a uniform draw, so the simulator's training names its own
  (`target_entropy`, docs/microservice-cores.md), and may measure the density on log a or on the
  Gaussian u instead (`entropy_space`, ours: the Jacobian of a holds small limits up), and may
  learn one coefficient per service instead (`entropy_scope`, ours).
* Inputs are standardised by one global mean/variance vector, fitted on the AutoScale phase's
  data and refitted every RSC steps (L87–89).
* A `mask` over services lets one network serve applications with fewer services than its id
  width (the transfer experiment: Hotel's 15 services inside Social's 28-wide id).

The QoS classifier of the paper's second training phase (Fig. 4b) lives here too: per-service
logits from a row and a candidate action, mean-pooled, -> P(QoS met in each of the next 5 s).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from .action_map import ACTION_SPACES, check_memoryless
from .env import COSTS, LOG_SHARE_FLOOR


PRECISIONS = ("fp32", "bf16", "bf16-state")
ENTROPY_SPACES = ("action", "latent", "log-action")
USERS_DRAWS = ("uniform", "log-uniform")
CRITIC_ACTIONS = ("linear", "log", "both")
ACTOR_GRADS = ("linear", "relative")
FILLS = ("autoscale", "mixed")
ENTROPY_SCOPES = ("app", "service")
REWARD_SPLITS = ("app", "service")
#: the headroom range (x mean use) of the "mixed" fill's held copies
FILL_HEADROOM = (1.1, 8.0)
#: the smallest a whose actor gradient "relative" amplifies in full (1/a at most 50x)
RELATIVE_GRAD_FLOOR = 0.02


@dataclass
class SacConfig:
    # -- Table 2 of the paper (L152–177) --------------------------------------------------
    hidden: int = 256                # FC hidden units
    actor_layers: int = 7            # FC layers of the policy
    critic_pre_layers: int = 2       # the action is appended after the 2nd FC layer (§4)
    critic_post_layers: int = 5      # ... followed by 5 FC layers
    lr: float = 3e-5
    max_grad_norm: float = 40.0
    gamma: float = 0.9
    replay: int = 200_000
    batch: int = 100
    polyak: float = 0.995
    init_alpha: float = 1.0          # entropy coefficient η, learned
    alpha_lr: float | None = None    # ours: the entropy coefficient's own rate (None = lr, the paper)
    #: per-service target entropy of the action in [0, 1]; None = the paper's −1/(|M|·|A|)
    target_entropy: float | None = None
    #: ours: where the entropy is measured. "action" (the paper, standard SAC): the density of
    #: a = sigmoid(u), whose Jacobian term −log a(1 − a) rewards moving a away from 0, so a
    #: service that needs a few hundredths of its cap is held near a tenth; "latent": the
    #: Gaussian density of u, whose entropy depends on σ alone (multiplicative noise on a small
    #: a, no pull on the mean), but a saturated a = 1 then costs no entropy and a policy stuck at
    #: the caps has no gradient back (measured on the testbed); "log-action": the density of
    #: log a, whose Jacobian −log(1 − a) keeps the barrier at the cap and none at 0 (the
    #: entropy of log-cores: noise in proportion to the limit). target_entropy is then the
    #: entropy of u or of log a (0.0: σ ≈ 0.24 on a small a)
    entropy_space: str = "action"
    k: int = 5                       # stacked frames
    log_std_min: float = -20.0       # log σ clipped to [−20, 2] (L93)
    log_std_max: float = 2.0
    # -- the training schedule (Alg. 2): the paper's step counts are ASA 130,000 AutoScale
    # steps, CA 50,000 classifier-guided steps, 260,000 in all, RSC 100,000. Ours are scaled
    # to the simulator and 2 CPU cores (docs/microservice-cores.md says how and why).
    autoscale_steps: int = 130_000
    classifier_steps: int = 50_000
    total_steps: int = 260_000
    restandardise_every: int = 100_000
    autoscale_noise: float = 0.05    # ±5 % uniform on AutoScale's actions
    classifier_threshold: float = 0.8
    candidates: tuple[float, ...] = (-0.10, -0.05, -0.01, 0.0, 0.01, 0.05, 0.10)
    classifier_horizon: int = 5
    classifier_noise: float = 0.01   # ±1 %
    classifier_updates: int = 10_000  # at most, each e_time
    classifier_lr: float = 1e-3      # ours (the paper gives none)
    classifier_hidden: int = 128     # ours
    # -- ours: how the simulator is stepped --------------------------------------------------
    n_envs: int = 8                  # copies stepped together (a transition per copy)
    updates_per_step: int = 1        # gradient updates per batch step of n_envs transitions
    id_width: int | None = None      # one-hot width (None = the app's service count)
    device: str = "cpu"
    #: ours: "bf16" runs the update's hidden layers in bfloat16 under torch's autocast (weights,
    #: optimiser state, the output layers and the losses stay float32); "bf16-state" runs only
    #: the layers that read the state alone (the actor's body, the critics' pre-action layers:
    #: most of the update's multiply-adds) in bfloat16, and every layer that sees the action or
    #: produces Q or the action's distribution in float32. Acting and saved policies are float32
    #: either way (docs/microservice-cores.md, "Training speed")
    precision: str = "fp32"
    #: ours, for a policy headed to real containers: the reward (and the explorer's QoS labels)
    #: count a violation above qos_margin x the target, so the simulator's optimism is absorbed
    #: by a margin; observations keep the real target. 1.0 = the paper.
    qos_margin: float = 1.0
    #: ours: how each training episode draws its users within the app's range. "uniform" is the
    #: paper's U ~ U[Umin, Umax]; "log-uniform" spends as many episodes on each doubling of the
    #: load, so the low end (where the reward's cores term is smallest) is trained on more often
    users_draw: str = "uniform"
    #: ours: the chance that a training copy's users change once inside an episode (train.py,
    #: `load_change_plan`): at a second drawn in LOAD_CHANGE_WINDOW, to a fresh draw of the range
    #: above, spread over a ramp of 1..LOAD_CHANGE_RAMP_MAX seconds (1 = a jump). 0.0 is the paper's
    #: constant load per episode (L244, which notes that practice changes load smoothly); validation
    #: episodes keep constant loads either way
    load_changes: float = 0.0
    #: ours: what the critics read of each service's action. "linear" is a in [0, 1] (the paper);
    #: "log" is log a rescaled to [0, 1] over [LOG_SHARE_FLOOR, 1], so halving a small limit
    #: moves the critic's input as much as halving a large one (a low load's limits all sit in
    #: the first tenth of a's range); "both" reads a and its log (the log alone resolves a
    #: large limit 7x more coarsely than a, and a policy at the caps leaves them slowly: measured)
    critic_action: str = "linear"
    #: ours: the reward's cost of the cores (env.reward_of): "linear" is the paper's Σ cores / Σ
    #: caps; "log" weighs each service's log share of its cap, so a low load's small limits earn
    #: as much per halving as a high load's large ones
    cost: str = "linear"
    #: ours: how the critics' verdict reaches the actor. "linear" is SAC's gradient of Q through
    #: a = sigmoid(u), dQ/da · a(1 − a): a service at a tenth of its cap moves a tenth as fast as
    #: one at half, whatever Q says; "relative" divides the Q term's gradient by a (floored at
    #: RELATIVE_GRAD_FLOOR), dQ/da · (1 − a), so a small limit moves by the same share of itself as
    #: a large one for the same dQ/da. The critics, their input and the entropy term are unchanged
    actor_grad: str = "linear"
    #: ours: what the action means (action_map.py). "cap" is the paper's share of each service's
    #: cap; "usage" is the headroom over the service's mean use in the k stacked seconds, on a
    #: log scale from 0.5x to 8x, so the same action fits every load
    action_space: str = "cap"
    #: ours: what drives the copies while the replay fills (no updates). "autoscale" is the
    #: paper's AutoScale with ±5 % noise on every copy; "mixed" leaves the even copies to it and
    #: holds each odd copy, for an episode, at a headroom over its mean use drawn log-uniformly in
    #: FILL_HEADROOM, so the critics and the QoS classifier also see tight limits and their
    #: violations (AutoScale keeps use / limit in [0.1, 0.3): a headroom of 3.3-10 only)
    fill: str = "autoscale"
    #: ours: what one entropy coefficient constrains. "app" (the paper's one η) holds the mean
    #: entropy over services at the target, so the actor may keep its noise on the services whose
    #: cores the cost barely sees (caches, databases) and still meet it; "service" learns one
    #: coefficient per service row, holding each service's own entropy at the target
    entropy_scope: str = "app"
    #: ours: None keeps lr throughout (the paper). A value makes the actor's and critics' rate fall
    #: geometrically from lr to lr_final over the plain-SAC phase (after the explorer), from
    #: lr_decay_start of the way through it, so late updates stop throwing a policy near its
    #: cheapest safe limits back and forth (the entropy coefficient keeps its own rate)
    lr_final: float | None = None
    lr_decay_start: float = 0.0
    #: ours, the ablation the issue invites: the paper keeps queue depth from the agent on purpose;
    #: True adds each service's queued work (seconds of its limit) to its observation
    #: (features.queue_feature). The simulator knows it, the real containers do not, so such a
    #: policy runs in simulation only
    observe_queue: bool = False
    #: ours: what the critics are trained to predict. "app" is the paper's: the mean of the
    #: per-service scalars is fitted to the application's return. "service" fits each service's
    #: scalar to its own return, with the reward split by env.service_rewards (its own cores
    #: charged M times, a violation's −1 shared), so the rows still average to the paper's Q but
    #: a service's cost is no longer buried under the exploration noise of the other services'
    reward_split: str = "app"
    #: ours: PyTorch's fused CPU Adam (one kernel per parameter tensor instead of a dozen small
    #: operations): the same update rule, not the same bits, so a seed trains other weights than
    #: with the per-tensor loop (the default, which every policy trained before it used); ~5 % of
    #: an update on 2 cores (docs/microservice-cores.md, "Training speed, a third look")
    fused_adam: bool = False
    #: ours: train under a headroom ceiling (action_map.cores_of): every limit at most this many
    #: times the service's mean use over the k stacked seconds, on either action space, so the
    #: replay and the critics only see limits the deployed policy can set; the saved policy
    #: carries it as its ceiling (ceiling.py may choose another after training). None: no ceiling.
    #: Measured on Hotel at 1.9: the deterministic policy stayed at the ceiling on every service
    #: for 88,000 transitions, so the shipped ceilings are chosen after training instead
    headroom_ceiling: float | None = None

    def __post_init__(self) -> None:
        for field, choices in (("precision", PRECISIONS), ("entropy_space", ENTROPY_SPACES),
                               ("users_draw", USERS_DRAWS), ("cost", COSTS), ("actor_grad", ACTOR_GRADS),
                               ("critic_action", CRITIC_ACTIONS), ("action_space", ACTION_SPACES),
                               ("fill", FILLS), ("entropy_scope", ENTROPY_SCOPES),
                               ("reward_split", REWARD_SPLITS)):
            value = getattr(self, field)
            if value not in choices:
                raise ValueError(f"{field} must be one of {', '.join(choices)}, not {value!r}")
        if not 0.0 <= self.load_changes <= 1.0:
            raise ValueError(f"load_changes is a chance in [0, 1], not {self.load_changes!r}")
        # a NaN target trained on and only failed at the end ("lam value too large", no option named)
        if self.target_entropy is not None and not np.isfinite(self.target_entropy):
            raise ValueError(f"target_entropy must be a finite number, not {self.target_entropy!r}")
        if self.lr_final is not None and not 0.0 < self.lr_final <= self.lr:
            raise ValueError(f"lr_final must be in (0, lr = {self.lr}], not {self.lr_final!r}")
        if not 0.0 <= self.lr_decay_start < 1.0:
            raise ValueError(f"lr_decay_start must be in [0, 1), not {self.lr_decay_start!r}")
        if self.lr_decay_start and self.lr_final is None:
            raise ValueError("lr_decay_start needs lr_final (the rate it decays to)")
        check_memoryless(self.headroom_ceiling, "SacConfig.headroom_ceiling")
        self._check_network_shape()

    #: the fields that size the networks and the frame stack, with their ranges: a policy's
    #: metadata.json (an upload, too) with `observe_queue: 1e9` or a string `k` allocated gigabytes
    #: or escaped the loader as a bare TypeError. At least one layer each: the output layers (and the
    #: critics' post-action ones) read `hidden` numbers, so 0 failed with torch's bare shape error at
    #: the first act or update, after the whole AutoScale fill
    _SHAPE_FIELDS = {"k": (1, 64), "id_width": (1, 4096), "hidden": (1, 4096), "actor_layers": (1, 64),
                     "critic_pre_layers": (1, 64), "critic_post_layers": (1, 64), "classifier_hidden": (1, 4096)}

    def _check_network_shape(self) -> None:
        for field, (lo, hi) in self._SHAPE_FIELDS.items():
            value = getattr(self, field)
            if field == "id_width" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= value <= hi:
                raise ValueError(f"{field} must be a whole number in [{lo}, {hi}], not {value!r:.40}")
        if not isinstance(self.observe_queue, (bool, np.bool_)):
            raise ValueError(f"observe_queue must be true or false, not {self.observe_queue!r:.40}")

    def lr_at(self, seen: int) -> float:
        """The actor's and critics' learning rate after `seen` transitions (`lr_final`)."""
        sac = self.autoscale_steps + self.classifier_steps
        start = sac + self.lr_decay_start * (self.total_steps - sac)
        if self.lr_final is None or seen <= start:
            return self.lr
        done = min(1.0, (seen - start) / max(self.total_steps - start, 1))
        return self.lr * (self.lr_final / self.lr) ** done

    @property
    def learning_steps(self) -> int:
        return self.total_steps - self.autoscale_steps

    def to_json(self) -> dict:
        d = asdict(self)
        d["candidates"] = list(self.candidates)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "SacConfig":
        d = dict(d)
        if "candidates" in d:
            d["candidates"] = tuple(d["candidates"])
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def mlp(inp: int, hidden: int, layers: int) -> nn.Sequential:
    mods: list[nn.Module] = []
    d = inp
    for _ in range(layers):
        # in place: the Linear's backward keeps its input, not its output, and ReLU's backward reads
        # its own result, so the same bits with one tensor fewer per layer (~2 % of an update, measured)
        mods += [nn.Linear(d, hidden), nn.ReLU(inplace=True)]
        d = hidden
    return nn.Sequential(*mods)


def state_layers(layers: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """Layers that read the state alone (the actor's body, the critics' pre-action layers). Rows in
    bfloat16 (the updates of `precision="bf16-state"`) run them in bfloat16 and hand float32 on;
    float32 rows run them as they are, to the bit."""
    if x.dtype != torch.bfloat16:
        return layers(x)
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        return layers(x).float()


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean over the service axis (last) of (B, M), counting only services with mask 1."""
    if mask is None:
        return x.mean(dim=-1)
    return (x * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1.0)


def _float32_output(layer: nn.Linear, h: torch.Tensor) -> torch.Tensor:
    """An output layer in float32 even inside a bfloat16 autocast: Q and the action's mean are
    compared to within a few hundredths, below bfloat16's resolution at their scale."""
    if not torch.is_autocast_enabled("cpu"):
        return layer(h)
    with torch.autocast("cpu", enabled=False):
        return layer(h.float())


STD_FLOOR = 0.1   # features.py puts every column on a scale of about 0-10
CLIP = 10.0


class Standardiser(nn.Module):
    """One global mean/std per feature column (the id columns are left as they are)."""

    def __init__(self, width: int, n_scaled: int):
        super().__init__()
        self.n_scaled = n_scaled
        self.register_buffer("mean", torch.zeros(width))
        self.register_buffer("std", torch.ones(width))

    def fit(self, rows: np.ndarray) -> None:
        flat = rows.reshape(-1, rows.shape[-1])[:, :self.n_scaled]
        self.mean[:self.n_scaled] = torch.as_tensor(flat.mean(axis=0), dtype=torch.float32)
        # a floor on the spread: a column that never moved in the data it was fitted on
        # (failures, latency during AutoScale) must not turn its first move into thousands
        self.std[:self.n_scaled] = torch.as_tensor(np.maximum(flat.std(axis=0), STD_FLOOR), dtype=torch.float32)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs - self.mean          # a new tensor: the rest works in place on it
        return x.div_(self.std).clamp_(-CLIP, CLIP)


class Actor(nn.Module):
    def __init__(self, width: int, cfg: SacConfig):
        super().__init__()
        self.body = mlp(width, cfg.hidden, cfg.actor_layers)
        self.head = nn.Linear(cfg.hidden, 2)
        self.log_std_min, self.log_std_max = cfg.log_std_min, cfg.log_std_max
        self.entropy_space = cfg.entropy_space

    def forward(self, x: torch.Tensor):
        out = _float32_output(self.head, state_layers(self.body, x))
        # log σ within [−20, 2] (L93) through a tanh, not a hard clamp: a clamped log σ has no
        # gradient, and one that reaches the bound early stays there
        lo, hi = self.log_std_min, self.log_std_max
        log_std = lo + 0.5 * (hi - lo) * (torch.tanh(out[..., 1]) + 1.0)
        return out[..., 0], log_std

    def sample(self, x: torch.Tensor):
        """(action in [0, 1], its per-service log-density)."""
        mean, log_std = self(x)
        std = log_std.exp()
        u = mean + std * torch.randn_like(mean)
        a = torch.sigmoid(u)
        # log-density of a = sigmoid(u): the Gaussian's, minus log |da/du| = log a(1 − a). Without
        # the Jacobian a saturated action (a wide σ pushing a to 0 or 1) looks like high entropy,
        # and the policy collapses to bang-bang (measured)
        logp = -0.5 * ((u - mean) / std) ** 2 - log_std - 0.5 * math.log(2 * math.pi)
        if self.entropy_space == "action":        # |da/du| = a(1 − a)
            logp = logp - (F.logsigmoid(u) + F.logsigmoid(-u))
        elif self.entropy_space == "log-action":  # |d log a / du| = 1 − a
            logp = logp - F.logsigmoid(-u)
        return a, logp

    def deterministic(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self(x)[0])


def relative_grad(a: torch.Tensor) -> torch.Tensor:
    """a with its value kept and the gradient through it divided by a (SacConfig.actor_grad)."""
    value = a.detach()
    return value + (a - value) / value.clamp_min(RELATIVE_GRAD_FLOOR)


def critic_log_action(a: torch.Tensor) -> torch.Tensor:
    """a in [0, 1] → log a rescaled to [0, 1] over [LOG_SHARE_FLOOR, 1] (SacConfig.critic_action)."""
    return 1.0 + torch.log(a.clamp_min(LOG_SHARE_FLOOR)) / -math.log(LOG_SHARE_FLOOR)


class Critic(nn.Module):
    def __init__(self, width: int, cfg: SacConfig):
        super().__init__()
        self.pre = mlp(width, cfg.hidden, cfg.critic_pre_layers)
        self.action_in = cfg.critic_action
        n_in = 2 if self.action_in == "both" else 1
        self.post = nn.Sequential(mlp(cfg.hidden + n_in, cfg.hidden, cfg.critic_post_layers),
                                  nn.Linear(cfg.hidden, 1))

    def forward(self, x: torch.Tensor, a: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.head(state_layers(self.pre, x), a, mask)

    def head(self, h: torch.Tensor, a: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Q from the pre-action features h = pre(x): the actor's loss needs no gradient through
        pre(x), which does not depend on the action."""
        return masked_mean(self.rows(h, a), mask)

    def rows(self, h: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """The per-service scalars (…, M) whose mean is Q."""
        if self.action_in == "log":
            a_in = critic_log_action(a).unsqueeze(-1)
        elif self.action_in == "both":
            a_in = torch.stack([a, critic_log_action(a)], dim=-1)
        else:
            a_in = a.unsqueeze(-1)
        hidden = self.post[0](torch.cat([h, a_in], dim=-1))
        return _float32_output(self.post[1], hidden).squeeze(-1)


class QosClassifier(nn.Module):
    """P(QoS met at each of the next `horizon` seconds | state, candidate action)."""

    def __init__(self, width: int, cfg: SacConfig):
        super().__init__()
        self.net = nn.Sequential(mlp(width + 1, cfg.classifier_hidden, 2), nn.Linear(cfg.classifier_hidden, 1))

    def logit(self, x: torch.Tensor, a: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return masked_mean(self.net(torch.cat([x, a.unsqueeze(-1)], dim=-1)).squeeze(-1), mask)


@dataclass
class UpdateStats:
    critic_loss: float = 0.0
    actor_loss: float = 0.0
    alpha: float = 0.0
    entropy: float = 0.0
    q: float = 0.0


class Sac(nn.Module):
    """Networks, optimisers and one update step. `width` = a row's length, `n_scaled` = the
    leading columns the standardiser scales."""

    def __init__(self, width: int, n_scaled: int, n_services: int, cfg: SacConfig):
        super().__init__()
        self.cfg = cfg
        self.width = width
        self.norm = Standardiser(width, n_scaled)
        self.actor = Actor(width, cfg)
        self.q1, self.q2 = Critic(width, cfg), Critic(width, cfg)
        self.q1_targ, self.q2_targ = Critic(width, cfg), Critic(width, cfg)
        self.q1_targ.load_state_dict(self.q1.state_dict())
        self.q2_targ.load_state_dict(self.q2.state_dict())
        for p in (*self.q1_targ.parameters(), *self.q2_targ.parameters()):
            p.requires_grad_(False)
        # one coefficient, or one per service row (entropy_scope "service", ours)
        shape = (n_services,) if cfg.entropy_scope == "service" else ()
        self.log_alpha = nn.Parameter(torch.full(shape, math.log(cfg.init_alpha)))
        # −1/(|M|·|A|) with |A| = 1 per service, unless the config names another
        self.target_entropy = cfg.target_entropy if cfg.target_entropy is not None else -1.0 / n_services
        self.classifier = QosClassifier(width, cfg)
        # the parameter lists an update walks, gathered once (module.parameters() walks the module
        # tree at every call: 2 % of an update, measured); the modules are never replaced
        self._actor_params = list(self.actor.parameters())
        self._critic_params = [*self.q1.parameters(), *self.q2.parameters()]
        self._target_params = [*self.q1_targ.parameters(), *self.q2_targ.parameters()]
        self.opt_actor = self._adam(self._actor_params, cfg.lr)
        self.opt_critic = self._adam(self._critic_params, cfg.lr)
        self.opt_alpha = self._adam([self.log_alpha], cfg.alpha_lr or cfg.lr)
        self.opt_cls = self._adam(self.classifier.parameters(), cfg.classifier_lr)

    def _adam(self, params, lr: float) -> torch.optim.Adam:
        # fused=None is torch's default (the per-tensor loop on CPU), what older policies trained with
        return torch.optim.Adam(params, lr=lr, fused=True if self.cfg.fused_adam else None)

    def match_services(self, n_services: int) -> None:
        """Per-service coefficients for another application's rows (a transfer): each starts at
        the source's mean coefficient, with its optimiser's state fresh. The paper's target
        −1/(|M|·|A|) becomes the new application's (it kept the source's |M|)."""
        if self.cfg.target_entropy is None:
            self.target_entropy = -1.0 / n_services
        if self.log_alpha.dim() == 0 or self.log_alpha.numel() == n_services:
            return
        with torch.no_grad():
            start = self.log_alpha.exp().mean().log()
        self.log_alpha = nn.Parameter(torch.full((n_services,), float(start)))
        self.opt_alpha = self._adam([self.log_alpha], self.cfg.alpha_lr or self.cfg.lr)

    def set_lr(self, lr: float) -> None:
        """The actor's and critics' learning rate from now on (the entropy coefficient keeps its own)."""
        for opt in (self.opt_actor, self.opt_critic):
            for group in opt.param_groups:
                group["lr"] = lr

    def optimisers(self) -> dict[str, torch.optim.Adam]:
        return {"actor": self.opt_actor, "critic": self.opt_critic, "alpha": self.opt_alpha,
                "classifier": self.opt_cls}

    def use_config(self, cfg: SacConfig) -> None:
        """Train on with `cfg` (a run continuing or transferring this agent): its update settings
        and its learning rates. The agent kept the ones it was built with (a continued run trained
        at the initial policy's rate, not the run's)."""
        self.cfg = cfg
        self._apply_rates()

    def _apply_rates(self) -> None:
        rates = {"actor": self.cfg.lr, "critic": self.cfg.lr, "alpha": self.cfg.alpha_lr or self.cfg.lr,
                 "classifier": self.cfg.classifier_lr}
        for name, opt in self.optimisers().items():
            for group in opt.param_groups:
                group["lr"] = rates[name]

    def optimiser_state(self) -> dict:
        return {name: opt.state_dict() for name, opt in self.optimisers().items()}

    def load_optimiser_state(self, state: dict) -> None:
        """Resume Adam's moments and step counts; the rates stay this agent's config's (a saved
        state carries the rates it was saved at)."""
        fresh = self.optimiser_state()
        try:
            for name, opt in self.optimisers().items():
                opt.load_state_dict(state[name])
        except Exception:
            for name, opt in self.optimisers().items():   # all fresh, not some resumed
                opt.load_state_dict(fresh[name])
            raise
        finally:
            self._apply_rates()

    @torch.no_grad()
    def refit_norm(self, rows: np.ndarray) -> None:
        """Re-standardise on new data (Algorithm 2's RSC) without changing what the networks
        compute: every first layer takes the old scaling into its weights and bias, so
        W·(x − m₁)/s₁ + b = W'·(x − m₂)/s₂ + b' (up to the ±10 clip). Refitting the statistics
        alone shifted every input at once, and the policy collapsed (Social: 0.5 % → 55 %
        violating seconds in the next episode, measured)."""
        n = self.norm.n_scaled
        m1, s1 = self.norm.mean[:n].clone(), self.norm.std[:n].clone()
        self.norm.fit(rows)
        m2, s2 = self.norm.mean[:n], self.norm.std[:n]
        for layer in (self.actor.body[0], self.q1.pre[0], self.q2.pre[0], self.q1_targ.pre[0], self.q2_targ.pre[0],
                      self.classifier.net[0][0]):
            w = layer.weight[:, :n]
            layer.bias += w @ ((m2 - m1) / s1)
            w *= s2 / s1

    @torch.no_grad()
    def act(self, obs: np.ndarray, deterministic: bool) -> np.ndarray:
        x = self.norm(torch.as_tensor(obs, dtype=torch.float32))
        if deterministic:
            return self.actor.deterministic(x).numpy()
        return self.actor.sample(x)[0].numpy()

    def update(self, obs, act, rew, nxt, done, mask=None) -> UpdateStats:
        # no cast cache: the critics change in place between their loss and the actor's, and a cast
        # cached under no_grad would carry no gradient
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.cfg.precision == "bf16", cache_enabled=False):
            return self._update(obs, act, rew, nxt, done, mask)

    def _update(self, obs, act, rew, nxt, done, mask) -> UpdateStats:
        cfg = self.cfg
        x, x2 = self.norm(obs), self.norm(nxt)
        if cfg.precision == "bf16-state":
            # rows in bfloat16 run the layers that read the state alone in bfloat16 (state_layers);
            # every layer that sees the action, and every output, stays float32
            x, x2 = x.bfloat16(), x2.bfloat16()
        alpha = self.log_alpha.exp().detach()
        if cfg.reward_split == "service":
            critic_loss, q1 = self._service_critic_loss(x, act, rew, x2, done, mask, alpha)
        else:
            with torch.no_grad():
                a2, logp2 = self.actor.sample(x2)
                q_next = torch.min(self.q1_targ(x2, a2, mask), self.q2_targ(x2, a2, mask))
                y = rew + cfg.gamma * (1.0 - done) * (q_next - masked_mean(alpha * logp2, mask))
            q1, q2 = self.q1(x, act, mask), self.q2(x, act, mask)
            critic_loss = F.mse_loss(q1, y) + F.mse_loss(q2, y)
        self.opt_critic.zero_grad(set_to_none=True)
        critic_loss.backward()
        nn.utils.clip_grad_norm_(self._critic_params, cfg.max_grad_norm)
        self.opt_critic.step()

        # the actor's loss through the critics just updated. Its gradient reaches the actor only
        # through the action, so the critics' pre-action layers run without a graph and the
        # backward pass computes the actor's gradients alone (the same numbers as a full backward
        # pass, a third fewer multiply-adds: docs/microservice-cores.md, "Training speed")
        with torch.no_grad():
            h1, h2 = state_layers(self.q1.pre, x), state_layers(self.q2.pre, x)
        a, logp = self.actor.sample(x)
        logp_m = masked_mean(logp, mask)
        a_q = relative_grad(a) if cfg.actor_grad == "relative" else a
        q_pi = torch.min(self.q1.head(h1, a_q, mask), self.q2.head(h2, a_q, mask))
        actor_loss = (masked_mean(alpha * logp, mask) - q_pi).mean()
        self.opt_actor.zero_grad(set_to_none=True)
        actor_loss.backward(inputs=self._actor_params)
        nn.utils.clip_grad_norm_(self._actor_params, cfg.max_grad_norm)
        self.opt_actor.step()

        # each coefficient moves with the entropy it weighs: the services' mean, or its own service's
        alpha_loss = -masked_mean(self.log_alpha * (logp.detach() + self.target_entropy), mask).mean()
        self.opt_alpha.zero_grad(set_to_none=True)
        alpha_loss.backward()
        self.opt_alpha.step()

        with torch.no_grad():
            torch._foreach_mul_(self._target_params, cfg.polyak)
            torch._foreach_add_(self._target_params, self._critic_params, alpha=1.0 - cfg.polyak)
        return UpdateStats(critic_loss.item(), actor_loss.item(), alpha.mean().item(), -logp_m.mean().item(),
                           q1.mean().item())

    @torch.no_grad()
    def service_targets(self, rew, x2, done, mask, alpha) -> torch.Tensor:
        """Each service's TD target (B, M) for reward_split "service" (rew is (B, M)). The next
        state's values are the rows of the target critic whose mean Q is the smaller, so the rows'
        mean is exactly the "app" target for the rewards' mean."""
        a2, logp2 = self.actor.sample(x2)
        r1 = self.q1_targ.rows(state_layers(self.q1_targ.pre, x2), a2)
        r2 = self.q2_targ.rows(state_layers(self.q2_targ.pre, x2), a2)
        first = (masked_mean(r1, mask) <= masked_mean(r2, mask)).unsqueeze(-1)
        return rew + self.cfg.gamma * (1.0 - done).unsqueeze(-1) * (torch.where(first, r1, r2) - alpha * logp2)

    def _service_critic_loss(self, x, act, rew, x2, done, mask, alpha):
        """Each service's scalar fitted to its own target; returns (loss, the first critic's Q)."""
        y = self.service_targets(rew, x2, done, mask, alpha)
        q1 = self.q1.rows(state_layers(self.q1.pre, x), act)
        q2 = self.q2.rows(state_layers(self.q2.pre, x), act)
        loss = masked_mean((q1 - y) ** 2, mask).mean() + masked_mean((q2 - y) ** 2, mask).mean()
        return loss, masked_mean(q1, mask)

    def classifier_update(self, obs, act, label, mask=None) -> float:
        logit = self.classifier.logit(self.norm(obs), act, mask)
        loss = F.binary_cross_entropy_with_logits(logit, label)
        self.opt_cls.zero_grad(set_to_none=True)
        loss.backward()
        self.opt_cls.step()
        return loss.item()

    @torch.no_grad()
    def qos_probability(self, obs: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """obs (E, M, W), actions (E, C, M) -> P(QoS met) (E, C)."""
        E, C, M = actions.shape
        x = self.norm(torch.as_tensor(obs, dtype=torch.float32))
        x = x.unsqueeze(1).expand(E, C, M, x.shape[-1])
        return torch.sigmoid(self.classifier.logit(x, torch.as_tensor(actions, dtype=torch.float32))).numpy()


class ReplayBuffer:
    """Transitions of whole applications, in the order they happened: index i's next second of
    the same copy is i + n_envs (used for the classifier's 5-second labels)."""

    def __init__(self, capacity: int, n_services: int, width: int, n_envs: int, seed: int,
                 service_rewards: bool = False):
        if not 0 < n_envs <= capacity:    # rounded to 0, the first add failed with a bare IndexError
            raise ValueError(f"a replay of {capacity} transitions cannot hold one second of {n_envs} copies")
        self.cap = capacity - capacity % n_envs
        self.E = n_envs
        # half precision: the rows are log-scaled counters and shares (0-30), 3 digits are plenty,
        # and a full buffer of Social's 28 rows of 163 values is 1.8 GB instead of 3.6 GB
        self.obs = np.zeros((self.cap, n_services, width), dtype=np.float16)
        self.nxt = np.zeros(self.obs.shape, dtype=np.float16)   # not zeros_like: its pages are written at once (1.5 s)
        self.act = np.zeros((self.cap, n_services), dtype=np.float32)
        # one reward per transition, or one per service (SacConfig.reward_split "service")
        self.rew = np.zeros((self.cap, n_services) if service_rewards else self.cap, dtype=np.float32)
        self.done = np.zeros(self.cap, dtype=np.float32)
        self.violated = np.zeros(self.cap, dtype=bool)
        self.episode = np.full(self.cap, -1, dtype=np.int64)
        self.ptr = 0
        self.size = 0
        self.rng = np.random.default_rng(seed)
        # torch views of the same memory: torch gathers and widens a batch ~10x faster than
        # NumPy's fancy indexing + astype (1.2 ms per batch of Social's rows)
        self._t = {k: torch.from_numpy(getattr(self, k)) for k in ("obs", "nxt", "act", "rew", "done")}

    def add_batch(self, obs, act, rew, nxt, done, violated, episode_ids) -> None:
        n = len(rew)
        idx = (self.ptr + np.arange(n)) % self.cap
        self.obs[idx], self.act[idx], self.rew[idx], self.nxt[idx] = obs, act, rew, nxt
        self.done[idx], self.violated[idx], self.episode[idx] = done, violated, episode_ids
        self.ptr = (self.ptr + n) % self.cap
        self.size = min(self.size + n, self.cap)

    def sample(self, batch: int):
        i = torch.from_numpy(self.rng.integers(0, self.size, batch))
        obs, act, rew, nxt, done = (self._t[k].index_select(0, i) for k in ("obs", "act", "rew", "nxt", "done"))
        return obs.float(), act, rew, nxt.float(), done

    def rows(self, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """(observations as float32, actions) of the transitions `idx`: the classifier's batches."""
        i = torch.from_numpy(idx)
        return self._t["obs"].index_select(0, i).float(), self._t["act"].index_select(0, i)

    def qos_labels(self, idx: np.ndarray, horizon: int) -> np.ndarray:
        """1 when none of the next `horizon` seconds of the same episode (this one included)
        broke QoS. Seconds past the buffer's newest are not counted."""
        ok = np.ones(len(idx), dtype=bool)
        age = (self.ptr - 1 - idx) % self.cap          # 0 = the newest transition
        for h in range(horizon):
            j = (idx + h * self.E) % self.cap
            same = (h * self.E <= age) & (self.episode[j] == self.episode[idx])
            ok &= ~(same & self.violated[j])
        return ok.astype(np.float32)
