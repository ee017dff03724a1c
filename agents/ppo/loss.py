"""The PPO objective on the LSTM's outputs: policy and value heads, clipped surrogate, clipped
value loss and entropy bonus, in two implementations of the same maths.

`ppo_loss` is the readable autograd version (CleanRL's formulas), used on GPUs and for action
dimensions of unequal size. `FusedHeadsLoss` computes the same loss and its gradient by hand,
in NumPy, as one autograd node: at a 16 × 16 minibatch each small torch operation costs ~8 µs
of dispatch here and the readable version's ~40 operations and their backward nodes cost about
as much as the LSTM's own forward; NumPy does the same arithmetic at ~2 µs an operation. A test
checks that both give the same loss, statistics and gradients (ties of `max` split the gradient
half/half, as torch.maximum does).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .network import ActionDist, LstmActorCritic
from .np_ops import matmul


@dataclass
class LossTargets:
    """Per-sample rollout data, flattened to N rows in (t, b) order."""

    actions: torch.Tensor  # (N, D) long
    logprobs: torch.Tensor  # (N,)
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor


@dataclass(frozen=True)
class LossCoefs:
    clip_coef: float
    ent_coef: float
    vf_coef: float
    clip_vloss: bool = True
    norm_adv: bool = True


def _normalised(adv: torch.Tensor, norm: bool) -> torch.Tensor:
    return (adv - adv.mean()) / (adv.std() + 1e-8) if norm else adv


def ppo_loss(logits: torch.Tensor, values: torch.Tensor, nvec: tuple[int, ...], t: LossTargets, k: LossCoefs):
    """Readable reference. logits (N, A), values (N,). Returns (loss, stats) where stats is the
    detached tensor [pg_loss, v_loss, entropy, approx_kl, clipfrac]."""
    dist = ActionDist(logits, nvec)
    newlogprob = dist.log_prob(t.actions)
    entropy = dist.entropy().mean()
    logratio = newlogprob - t.logprobs
    ratio = logratio.exp()
    with torch.no_grad():
        approx_kl = ((ratio - 1) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > k.clip_coef).float().mean()
    adv = _normalised(t.advantages, k.norm_adv)
    pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - k.clip_coef, 1 + k.clip_coef)).mean()
    if k.clip_vloss:
        v_clipped = t.values + (values - t.values).clamp(-k.clip_coef, k.clip_coef)
        v_loss = 0.5 * torch.max((values - t.returns) ** 2, (v_clipped - t.returns) ** 2).mean()
    else:
        v_loss = 0.5 * ((values - t.returns) ** 2).mean()
    loss = pg_loss - k.ent_coef * entropy + k.vf_coef * v_loss
    return loss, torch.stack([pg_loss, v_loss, entropy, approx_kl, clipfrac]).detach()


def _max_share(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Share of d max(a, b) that goes to a: 1, 0, or 1/2 on ties (as torch.maximum)."""
    return (a > b) + np.float32(0.5) * (a == b)


def _over_last(op, x: np.ndarray) -> np.ndarray:
    """op-reduction over a short last axis, kept as size 1: NumPy's own reductions over a last
    axis of 3 are ~20 times slower than these few whole-array operations."""
    out = x[..., 0]
    for j in range(1, x.shape[-1]):
        out = op(out, x[..., j])
    return out[..., None]


class FusedHeadsLoss(torch.autograd.Function):
    """hidden rows (R, H) -> gather `rows` -> heads -> `ppo_loss`, in NumPy with a hand-written
    gradient, as ONE autograd node. CPU tensors and action dimensions of equal size only."""

    @staticmethod
    def forward(ctx, hidden, w_pi, b_pi, w_v, b_v, rows, nvec, t: LossTargets, k: LossCoefs):
        x = hidden.detach().numpy()
        if rows is not None:
            x = x[rows.numpy()]
        n, dims, cats = x.shape[0], len(nvec), nvec[0]
        w = np.concatenate([w_pi.detach().numpy(), w_v.detach().numpy()])
        y = matmul(x, w.T)
        y += np.concatenate([b_pi.detach().numpy(), b_v.detach().numpy()])
        z = np.ascontiguousarray(y[:, :-1]).reshape(n, dims, cats)  # strided views are slow here
        z = z - _over_last(np.maximum, z)
        e = np.exp(z)
        total = _over_last(np.add, e)
        logp = z - np.log(total)
        p = e / total
        picked = np.arange(n * dims) * cats + t.actions.numpy().reshape(-1)  # flat index of each action
        logratio = logp.reshape(-1)[picked].reshape(n, dims).sum(axis=1) - t.logprobs.numpy()
        ratio = np.exp(logratio)
        plogp = p * logp
        entropy = -plogp.sum() / n
        adv = t.advantages.numpy()
        if k.norm_adv:
            centred = adv - adv.sum() / n
            adv = centred / (np.sqrt((centred * centred).sum() / (n - 1)) + np.float32(1e-8))
        lo, hi = np.float32(1 - k.clip_coef), np.float32(1 + k.clip_coef)
        pg1, pg2 = -adv * ratio, -adv * np.clip(ratio, lo, hi)
        pg_loss = np.maximum(pg1, pg2).sum() / n
        value, old_v, ret = y[:, -1], t.values.numpy(), t.returns.numpy()
        err = value - ret
        clip = np.float32(k.clip_coef)
        if k.clip_vloss:
            dv = value - old_v
            err_c = old_v + np.clip(dv, -clip, clip) - ret
            l1, l2 = err * err, err_c * err_c
            v_loss = 0.5 * np.maximum(l1, l2).sum() / n
        else:
            v_loss = 0.5 * (err * err).sum() / n
        loss = pg_loss - k.ent_coef * entropy + k.vf_coef * v_loss
        approx_kl = ((ratio - 1) - logratio).sum() / n
        clipfrac = np.count_nonzero(np.abs(ratio - 1) > clip) / n

        # gradient w.r.t. the head outputs now, while the intermediates are at hand
        g1 = _max_share(pg1, pg2)
        inside = (ratio >= lo) & (ratio <= hi)
        d_newlp = (-adv / n) * (g1 + (1 - g1) * inside) * ratio
        d_logp = (k.ent_coef / n) * (plogp + p)  # of -ent_coef * mean entropy
        d_logp.reshape(-1)[picked] += np.repeat(d_newlp, dims)
        dy = np.empty_like(y)
        dy[:, :-1] = (d_logp - p * _over_last(np.add, d_logp)).reshape(n, -1)  # log-softmax backward
        if k.clip_vloss:
            s1 = _max_share(l1, l2)
            in_v = (dv >= -clip) & (dv <= clip)
            dy[:, -1] = (k.vf_coef / n) * (s1 * err + (1 - s1) * in_v * err_c)
        else:
            dy[:, -1] = (k.vf_coef / n) * err
        ctx.saved = (x, w, dy, None if rows is None else rows.numpy(), hidden.shape, w_pi.shape[0])
        stats = torch.tensor([pg_loss, v_loss, entropy, approx_kl, clipfrac], dtype=torch.float32)
        ctx.mark_non_differentiable(stats)
        return torch.tensor(loss, dtype=hidden.dtype), stats

    @staticmethod
    def backward(ctx, grad_loss, _grad_stats):
        x, w, dy, rows, hidden_shape, n_pi = ctx.saved
        dy = dy * np.float32(grad_loss.item())
        dx = matmul(dy, w)
        if rows is not None:
            full = np.zeros(hidden_shape, dtype=dx.dtype)
            full[rows] = dx
            dx = full
        dw, db = matmul(dy.T, x), dy.sum(axis=0)
        t = torch.from_numpy
        return t(dx), t(dw[:n_pi]), t(db[:n_pi]), t(dw[n_pi:]), t(db[n_pi:]), None, None, None, None


def fused_ppo_loss(net: LstmActorCritic, hidden: torch.Tensor, rows: torch.Tensor | None, t: LossTargets,
                   k: LossCoefs):
    """`ppo_loss` of the heads applied to `hidden` rows (see LstmActorCritic.hidden_rows)."""
    return FusedHeadsLoss.apply(hidden, net.policy.weight, net.policy.bias, net.value.weight, net.value.bias,
                                rows, net.nvec, t, k)
