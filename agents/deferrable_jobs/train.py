"""Training OSDEC and its Table 1 variants (Algorithm 1): PPO with truncated GAE (Eq. 7), the
clipped surrogate (Eq. 8) and the value MSE (Eq. 9), or REINFORCE for that row; 16 envs in one
process (§5.3.1's 16 workers), Adam with linearly decaying learning rates (Table 3).

The auxiliary module (if the variant has one) learns by MSE on the next slot's quantities from
the same roll-outs, with its own optimiser; the policy reads its features detached, as part of
the state (§4.2.2). Rewards are scaled by 1/fleet cores for learning only (ours: the paper's
per-slot rewards are tens of core-slots, too large for a value net at Table 3's learning rates);
every figure we report is in the paper's units.

    python -m agents.deferrable_jobs.train --setting default --variant osdec --mapping skip --out runs/osdec
"""
from __future__ import annotations

import argparse
import csv
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from agents.torch_threads import torch_threads
from agents.train_log import TrainingDiverged, first_non_finite, refuse_existing_run, tensorboard_writer

from .data import episodes as make_episodes
from .env import DeferrableJobsEnv
from .episode import Episode
from .features import AUX_TARGETS, SummaryHistory, job_tokens, slot_summary
from .osdec import OsdecConfig, OsdecModel, eligible_mask, gaussian_logp
from .rules import select_by_scores
from .settings import SETTINGS, Setting, get_setting
from .sim import DeferrableSim, EpisodeResult

VALIDATION_SEED = 7_777   # greedy evaluations during training use these train-split episodes


def _stack(obs: list[dict]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    tok = torch.as_tensor(np.stack([o["tokens"] for o in obs]))
    mask = torch.as_tensor(np.stack([o["mask"] for o in obs]).astype(bool))
    hist = torch.as_tensor(np.stack([o["history"] for o in obs]))
    return tok, mask, hist


def run_greedy(model: OsdecModel, setting: Setting, eps: list[Episode], mapping: str = "prefix") -> list[EpisodeResult]:
    """Roll `model` out without exploration noise (the mean score) on every episode, in lockstep."""
    sims = [DeferrableSim(ep) for ep in eps]
    hists = [SummaryHistory() for _ in eps]
    M = setting.max_eligible
    model.eval()
    while not all(s.done for s in sims):
        live = [i for i, s in enumerate(sims) if not s.done]
        views = [sims[i].view() for i in live]
        feats = [job_tokens(v, setting) for v in views]
        tok = torch.as_tensor(np.stack([f[0] for f in feats]))
        mask = torch.as_tensor(np.stack([f[1] for f in feats]))
        hist = torch.as_tensor(np.stack([hists[i].push(slot_summary(v, setting)) for i, v in zip(live, views)]))
        with torch.no_grad():
            mu, _, _ = model(tok, mask, model.aux_features(hist))
        for k, i in enumerate(live):
            rows = feats[k][2]
            pick = select_by_scores(mu[k, : len(rows)].numpy(), sims[i].ep.cores[rows], views[k].free, mapping)
            sims[i].step(rows[pick])
        assert mu.shape[1] == M
    model.train()
    return [s.result for s in sims]


def _set_lr(opt: torch.optim.Optimizer, groups: list[tuple[float, float]], frac: float) -> None:
    for g, (lo_hi) in zip(opt.param_groups, groups):
        start, end = lo_hi
        g["lr"] = start + (end - start) * frac


def train(setting="default", cfg: OsdecConfig | None = None, *, out=None, progress: bool = True,
          threads: int = 1, log_fn=None) -> tuple[OsdecModel, list[dict]]:
    """Train on `threads` torch threads, from `cfg.seed`; the caller's thread count and torch random
    state are back on return or error (a notebook or a service that trained, then served or sampled,
    ran on the trainer's count and drew from the trainer's seed instead of its own)."""
    with torch_threads(threads), torch.random.fork_rng(devices=[]):
        return _train(setting, cfg, out=out, progress=progress, log_fn=log_fn)


def _train(setting, cfg: OsdecConfig | None, *, out, progress: bool, log_fn) -> tuple[OsdecModel, list[dict]]:
    cfg = cfg or OsdecConfig()
    setting = get_setting(setting)
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    model = OsdecModel.build(cfg, setting)
    opt = torch.optim.Adam([{"params": model.policy_parameters(), "lr": cfg.lr_policy[0]},
                            {"params": model.value_parameters(), "lr": cfg.lr_value[0]}], eps=1e-5)
    aux_opt = torch.optim.Adam(model.aux.parameters(), lr=cfg.lr_aux[0]) if model.aux is not None else None
    scale = cfg.reward_scale if cfg.reward_scale is not None else 1.0 / setting.fleet_cores
    envs = [DeferrableJobsEnv(setting, "train", mapping=cfg.mapping) for _ in range(cfg.n_envs)]
    obs = [env.reset(seed=int(rng.integers(2**31 - 1)))[0] for env in envs]
    val_eps = make_episodes(setting, "train", cfg.eval_episodes, seed=VALIDATION_SEED)

    E, M = cfg.n_envs, setting.max_eligible
    S = setting.slots if cfg.algo == "reinforce" else cfg.batch_size // E
    iters = max(1, cfg.total_steps // (S * E))
    logs: list[dict] = []
    ep_returns: list[float] = []
    ep_ret = np.zeros(E)
    best = (-np.inf, None)
    writer = tensorboard_writer(out)
    bar = _progress(iters, progress)
    t0 = time.time()
    try:
        for it in range(iters):
            frac = it / max(1, iters - 1)
            _set_lr(opt, [cfg.lr_policy, cfg.lr_value], frac)
            if aux_opt is not None:
                _set_lr(aux_opt, [cfg.lr_aux], frac)
            buf = {k: [] for k in ("tok", "mask", "hist", "extra", "act", "logp", "val", "rew", "done", "aux_y",
                                   "aux_ok")}
            for _ in range(S):
                tok, mask, hist = _stack(obs)
                with torch.no_grad():
                    extra = model.aux_features(hist)
                    mu, sigma, value = model(tok, mask, extra)
                    act = mu + sigma * torch.randn(mu.shape, generator=gen)
                    logp, _ = gaussian_logp(mu, sigma, act, eligible_mask(tok, M))
                rew, done = np.zeros(E), np.zeros(E, bool)
                aux_y, aux_ok = np.zeros((E, len(AUX_TARGETS)), np.float32), np.zeros(E, bool)
                for e, env in enumerate(envs):
                    o2, r, term, trunc, _ = env.step(act[e].numpy())
                    rew[e] = r
                    ep_ret[e] += r
                    if term or trunc:
                        done[e] = True
                        ep_returns.append(ep_ret[e])
                        ep_ret[e] = 0.0
                        o2, _ = env.reset(seed=int(rng.integers(2**31 - 1)))
                    else:
                        aux_y[e] = o2["history"][-1, list(AUX_TARGETS)]
                        aux_ok[e] = True
                    obs[e] = o2
                for k, v in (("tok", tok), ("mask", mask), ("hist", hist), ("extra", extra), ("act", act),
                             ("logp", logp), ("val", value)):
                    buf[k].append(v)
                buf["rew"].append(torch.as_tensor(rew * scale, dtype=torch.float32))
                buf["done"].append(torch.as_tensor(done))
                buf["aux_y"].append(torch.as_tensor(aux_y))
                buf["aux_ok"].append(torch.as_tensor(aux_ok))
            with torch.no_grad():
                tok, mask, hist = _stack(obs)
                _, _, last_value = model(tok, mask, model.aux_features(hist))
            b = {k: (torch.stack(v) if v and v[0] is not None else None) for k, v in buf.items()}
            update = _reinforce_update if cfg.algo == "reinforce" else _ppo_update
            stats = update(model, opt, cfg, b, last_value, M, gen)
            if aux_opt is not None:
                stats["aux_mse"] = _aux_update(model, aux_opt, cfg, b, gen)
            bad = first_non_finite(model)
            if bad:  # a diverged update: stop before a NaN policy can be kept or saved
                raise TrainingDiverged(f"iteration {it + 1}: the network's {bad} is not finite (NaN or inf); "
                                       "training stopped without saving it")
            row = {"iteration": it + 1, "steps": (it + 1) * S * E, "seconds": round(time.time() - t0, 1),
                   "train_reward": float(np.mean(ep_returns[-E:])) if ep_returns else float("nan"), **stats}
            if cfg.eval_every and ((it + 1) % cfg.eval_every == 0 or it + 1 == iters):
                res = run_greedy(model, setting, val_eps, cfg.mapping)
                row["eval_reward"] = float(np.mean([r.total_reward for r in res]))
                if row["eval_reward"] > best[0]:
                    best = (row["eval_reward"], {k: v.clone() for k, v in model.state_dict().items()})
            logs.append(row)
            if writer is not None:
                for k, v in row.items():
                    if k != "iteration" and v == v:
                        writer.add_scalar(f"train/{k}", v, row["steps"])
            if log_fn is not None:
                log_fn(row)
            if bar is not None:
                bar.set_postfix(reward=f"{row['train_reward']:.0f}", eval=f"{row.get('eval_reward', float('nan')):.0f}")
                bar.update(1)
    finally:  # an interrupted or stopped run keeps its log so far
        if bar is not None:
            bar.close()
        if out is not None and logs:
            _write_csv(logs, Path(out) / "progress.csv")
        if writer is not None:
            writer.close()
    if best[1] is not None:  # keep the best greedy policy on the validation episodes (train split)
        model.load_state_dict(best[1])
    return model.eval(), logs


def _gae(rew, val, done, last_value, gamma, lam):
    S = rew.shape[0]
    adv = torch.zeros_like(rew)
    last = torch.zeros_like(rew[0])
    for t in reversed(range(S)):
        nxt = last_value if t == S - 1 else val[t + 1]
        nonterminal = (~done[t]).float()
        delta = rew[t] + gamma * nxt * nonterminal - val[t]
        last = delta + gamma * lam * nonterminal * last
        adv[t] = last
    return adv, adv + val


def _flat(x):
    return x.reshape(-1, *x.shape[2:]) if x is not None else None


def _ppo_update(model, opt, cfg, b, last_value, M, gen) -> dict:
    adv, ret = _gae(b["rew"], b["val"], b["done"], last_value, cfg.gamma, cfg.gae_lambda)
    f = {k: _flat(v) for k, v in b.items()}
    adv, ret = adv.reshape(-1), ret.reshape(-1)
    n = adv.shape[0]
    pl, vl, clipped = [], [], []
    for _ in range(cfg.epochs):
        perm = torch.randperm(n, generator=gen)
        for s in range(0, n, cfg.minibatch):
            i = perm[s:s + cfg.minibatch]
            mask = f["mask"][i]
            mu, sigma, value = model(f["tok"][i], mask, f["extra"][i] if f["extra"] is not None else None)
            logp, ent = gaussian_logp(mu, sigma, f["act"][i], eligible_mask(f["tok"][i], M))
            ratio = (logp - f["logp"][i]).exp()
            a = adv[i]
            a = (a - a.mean()) / (a.std() + 1e-8) if len(i) > 1 else a
            p_loss = -torch.min(ratio * a, ratio.clamp(1 - cfg.clip, 1 + cfg.clip) * a).mean()
            v_loss = ((value - ret[i]) ** 2).mean()
            loss = p_loss + cfg.value_coef * v_loss
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.net.parameters(), cfg.max_grad_norm)
            opt.step()
            pl.append(p_loss.item())
            vl.append(v_loss.item())
            clipped.append(((ratio - 1).abs() > cfg.clip).float().mean().item())
    return {"policy_loss": float(np.mean(pl)), "value_loss": float(np.mean(vl)), "clip_frac": float(np.mean(clipped))}


def _reinforce_update(model, opt, cfg, b, last_value, M, gen) -> dict:
    """Monte-Carlo returns of whole episodes (the roll-out is aligned to episodes), a per-slot
    mean baseline across the envs, one pass of minibatches."""
    rew = b["rew"]
    ret = torch.zeros_like(rew)
    run = torch.zeros_like(rew[0])
    for t in reversed(range(rew.shape[0])):
        run = rew[t] + cfg.gamma * run * (~b["done"][t]).float()
        ret[t] = run
    adv = ret - ret.mean(1, keepdim=True)
    adv = (adv / (adv.std() + 1e-8)).reshape(-1)
    f = {k: _flat(v) for k, v in b.items()}
    n = adv.shape[0]
    perm = torch.randperm(n, generator=gen)
    pl = []
    for s in range(0, n, cfg.minibatch):
        i = perm[s:s + cfg.minibatch]
        mask = f["mask"][i]
        mu, sigma, _ = model(f["tok"][i], mask, f["extra"][i] if f["extra"] is not None else None)
        logp, _ = gaussian_logp(mu, sigma, f["act"][i], eligible_mask(f["tok"][i], M))
        loss = -(logp * adv[i]).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.net.parameters(), cfg.max_grad_norm)
        opt.step()
        pl.append(loss.item())
    return {"policy_loss": float(np.mean(pl))}


def _aux_update(model, aux_opt, cfg, b, gen) -> float:
    ok = b["aux_ok"].reshape(-1)
    hist = _flat(b["hist"])[ok]
    y = _flat(b["aux_y"])[ok]
    losses = []
    for _ in range(cfg.aux_epochs):
        perm = torch.randperm(len(y), generator=gen)
        for s in range(0, len(y), 256):
            i = perm[s:s + 256]
            _, _, pred = model.aux(hist[i])
            loss = ((pred - y[i]) ** 2).mean()
            aux_opt.zero_grad()
            loss.backward()
            aux_opt.step()
            losses.append(loss.item())
    return float(np.mean(losses)) if losses else float("nan")


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="osdec", unit="iter")


def _write_csv(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = sorted({k for r in rows for k in r}, key=lambda k: list(rows[-1]).index(k) if k in rows[-1] else 99)
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


#: what a run writes into its --out: one there means an earlier run, whose policy and log a new one
#: would replace and whose TensorBoard events it would mix with its own
RUN_FILES = ("metadata.json", "weights.pt", "progress.csv", "tb")


def check_options(args) -> None:
    """Each number refused with its flag: a --steps of 0 ran the default 300,000 slots and a
    negative one a whole iteration; --threads 0 failed in torch."""
    for flag, value, ok, want in (("--steps", args.steps, args.steps is None or args.steps >= 1, ">= 1"),
                                  # torch's seed is 64 bits: a larger one failed after the setup,
                                  # "Overflow when unpacking long long" naming no flag
                                  ("--seed", args.seed, 0 <= args.seed < 2**64, ">= 0 and below 2**64"),
                                  ("--threads", args.threads, args.threads >= 1, ">= 1")):
        if not ok:
            raise ValueError(f"{flag} must be {want}, not {value}")


def check_out(out: Path) -> None:
    """--out made and proved writable before training: an --out that is a file (or under one) failed
    with a traceback from TensorBoard, or, without TensorBoard, only after the whole run, losing
    the trained policy and its log. Not report.prepare_out: it would rename an experiment's
    summary.json and report.md aside in a folder that a training run only adds to."""
    from agents.report import writable_folder

    try:
        writable_folder(out)
    except OSError as exc:
        raise ValueError(f"--out: {exc}") from None


def main(argv=None) -> int:
    from .osdec import VARIANTS

    p = argparse.ArgumentParser(description="Train OSDEC (or a Table 1 variant) on the deferrable-jobs simulator.")
    p.add_argument("--setting", default="default", choices=sorted(SETTINGS))
    p.add_argument("--variant", default="osdec", choices=sorted(VARIANTS))
    p.add_argument("--steps", type=int, default=None,
                   help="slots of experience (default: OsdecConfig.total_steps), rounded down to whole iterations "
                        f"of {OsdecConfig().batch_size} slots (REINFORCE: one day per env), at least one")
    p.add_argument("--mapping", choices=("prefix", "skip"), default="prefix",
                   help="action mapping: prefix (the paper's) or skip (ours; what the shipped policy uses)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads; a --seed repeats its run exactly only at the same --threads "
                        "(sums in another order round otherwise)")
    p.add_argument("--out", default=None, help="directory for the saved policy, progress.csv and TensorBoard")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    try:
        check_options(args)
        if args.out:
            refuse_existing_run(Path(args.out), RUN_FILES)
            check_out(Path(args.out))   # last: it makes --out
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    cfg = OsdecConfig(variant=args.variant, seed=args.seed, mapping=args.mapping)
    if args.steps is not None:
        cfg = replace(cfg, total_steps=args.steps)
    try:
        model, logs = train(args.setting, cfg, out=args.out, progress=not args.quiet, threads=args.threads)
    except ValueError as e:  # a diverged network: named, nothing saved
        print(f"error: {e}", file=sys.stderr)
        return 1 if isinstance(e, TrainingDiverged) else 2
    if args.out:
        from .policy import OsdecPolicy

        OsdecPolicy(model, cfg, get_setting(args.setting), training={"logs_tail": logs[-3:]}).save(args.out)
        print(f"saved policy to {args.out}")
    evals = [r["eval_reward"] for r in logs if "eval_reward" in r]
    print(f"{len(logs)} iterations, {logs[-1]['seconds']} s; best greedy validation reward "
          f"{max(evals) if evals else float('nan'):.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
