"""Reclaimer's training schedule (Algorithm 2) on the simulator.

Episodes: every copy draws U ~ U[users] (or log-uniformly: `users_draw`, ours), gives every
service its cap for the W = 60 s warm-up, then runs e_time = 300 one-second steps (d = 1 at the
last); with `load_changes` (ours, off by default) a copy's users may change once inside the episode,
a jump or a ramp (`load_change_plan`). Three phases by transitions seen:
1. AutoScale with ±5 % uniform noise drives the copies and fills the replay buffer; no updates.
   The standardiser is fitted on these rows. (Ours, off by default: `fill` "mixed" holds every
   other copy at a headroom over its use drawn per episode, `fill_actions`.)
2. The agent acts (sampled), and the QoS classifier modifies each action: among the action scaled
   by −10/−5/−1/0/+1/+5/+10 %, the cheapest with ≥ 80 % predicted chance of meeting QoS over the
   next 5 s (the most likely one when none reaches 80 %); the agent's own action is kept with a
   probability annealed linearly from 0 to 1 over the phase; ±1 % noise. The classifier is
   retrained on the buffer after every episode (e_time).
3. Plain SAC.
One update (or `updates_per_step`) per batch step of n_envs transitions from phase 2 on.

`train(app, cfg, seed, out)` returns the policy; a CSV and TensorBoard log per episode and the
training curve PNG land in `out`. Deterministic for a seed (torch and NumPy seeded, 1 thread
order-independent ops only).

With `eval_every` (ours, off by default) the policy is evaluated on the experiment's protocol with
validation seeds every so many transitions, and the checkpoint with the fewest mean cores at a
violation rate within `best_max_violation` is kept (`policy.best`, and `out/best-policy`;
validation.py). Evaluating does not change the training: its episodes run on their own
simulator, and deterministic actions draw no random numbers.
"""
from __future__ import annotations

import contextlib
import copy
import csv
import logging
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from agents.parallel import write_progress
from agents.train_log import TrainingDiverged, first_non_finite, refuse_existing_run
from samm.cli.seeds import parse_seeds, require_apart_from_reported

from .action_map import ACTION_SPACES, action_of, check_ceiling, cores_of, scaled_actions
from .autoscale import autoscale_step
from .control import MIN_CORES
from .env import COSTS, reward_of, service_rewards
from .episode import EPISODE_S, WARMUP_S, users_on_ramp
from .features import FrameStack, feature_row_block, mean_used, observation_layout
from .sac import (ACTOR_GRADS, CRITIC_ACTIONS, ENTROPY_SCOPES, ENTROPY_SPACES, FILL_HEADROOM, FILLS, PRECISIONS,
                  REWARD_SPLITS, USERS_DRAWS, ReplayBuffer, Sac, SacConfig)
from .sim import MicroserviceSim
from .topology import Topology, load_topology
from .validation import VALIDATION_SEEDS, BestCheckpoint, evaluate

#: what the simulator trains with on 2 CPU cores, ours (docs/microservice-cores.md): the paper's
#: 7×256 network costs 160 ms per update here (260,000 updates = 11.5 h), 3 layers × 64 costs 13;
#: the step counts are the paper's scaled by 1/10 (ASA 13,000, CA 5,000, total 26,000 ... × the
#: copies' transitions), and the learning rate is 10× the paper's to fit the fewer updates.
SIM_TRAINING = dict(hidden=64, actor_layers=3, critic_pre_layers=1, critic_post_layers=2, lr=3e-4, alpha_lr=3e-3, target_entropy=-2.5,
                    autoscale_steps=24_000, classifier_steps=24_000, total_steps=240_000,
                    restandardise_every=100_000, classifier_updates=200, n_envs=4, updates_per_step=2,
                    replay=100_000)


#: the fields that shape the networks: a run started from a saved policy takes them from it
NETWORK_FIELDS = ("hidden", "actor_layers", "critic_pre_layers", "critic_post_layers", "k", "id_width",
                  "classifier_hidden", "observe_queue")
#: the options a built Sac keeps (its critics' input, its actor's entropy, its coefficient's shape, its
#: optimisers) or reads from its own config at every update: a run from a saved policy trains with the
#: policy's whatever it asks, so it must record them (a continued `--critic-action both` policy was
#: saved under the recipe's "linear", and its own weights no longer loaded into it)
AGENT_FIELDS = ("critic_action", "entropy_space", "entropy_scope", "target_entropy", "actor_grad", "reward_split",
                "fused_adam")


def sim_config(**overrides) -> SacConfig:
    return replace(SacConfig(), **{**SIM_TRAINING, **overrides})


def train(app: str | Topology, cfg: SacConfig | None = None, seed: int = 0, out: str | Path | None = None,
          progress: bool = True, init: "Sac | None" = None, threads: int = 1, init_from: str | None = None,
          keep_norm: bool = False, eval_every: int = 0, eval_seeds=VALIDATION_SEEDS,
          best_max_violation: float = 0.0, actor_ema: float = 0.0, stop_after: int | None = None):
    """`keep_norm` (continuing a policy of this same application): keep `init`'s input statistics
    instead of refitting them to a new AutoScale fill, and let SAC update only once the replay
    holds one episode of every copy (a fresh replay, filled by the policy itself). `stop_after`
    (ours) ends the run at the first episode boundary at or past that many transitions, with every
    phase, refit and rate of `cfg.total_steps`' schedule: the full run's start, to the bit."""
    from .policy import ReclaimerPolicy

    if eval_every:      # a checkpoint picked on the experiment's own seeds would be reported on them
        require_apart_from_reported(eval_seeds, "eval_seeds")
    # one thread: the networks are small, and under load two threads were 12× slower (measured)
    torch.set_num_threads(max(1, threads))
    cfg = cfg or sim_config()
    if init is not None:
        differ = [f for f in NETWORK_FIELDS if getattr(init.cfg, f) != getattr(cfg, f)]
        if differ:
            raise ValueError(f"the initial policy's networks differ from this run's in {differ}: start it with "
                             "the initial policy's (`samm train --init-policy` does)")
        if init.cfg.action_space != cfg.action_space:
            raise ValueError(f"the initial policy's actions are on the {init.cfg.action_space!r} space, this run's on "
                             f"{cfg.action_space!r}: start it with the initial policy's (`samm train --init-policy` does)")
        kept = {f: getattr(init.cfg, f) for f in AGENT_FIELDS if getattr(init.cfg, f) != getattr(cfg, f)}
        if kept:
            raise ValueError(f"the initial policy trains with its own {kept}, not this run's "
                             f"{ {f: getattr(cfg, f) for f in kept} }: start it with the initial policy's "
                             "(`samm train --init-policy` does)")
        # the networks' settings are the same (checked above); the update's (precision, rates,
        # gamma ...) are the run's, as its saved policy records: the agent trained at its own
        init.use_config(cfg)
    topo = app if isinstance(app, Topology) else load_topology(app)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    E, M = cfg.n_envs, topo.n_services
    stack = FrameStack(E, M, k=cfg.k, id_width=cfg.id_width, queue=cfg.observe_queue)
    width, n_scaled = observation_layout(cfg.k, M, cfg.id_width, cfg.observe_queue)
    if init is not None and init.actor.body[0].in_features != width:
        raise ValueError(f"the initial policy reads rows of {init.actor.body[0].in_features} numbers, {topo.name} "
                         f"gives {width}: its one-hot service ids are {init.cfg.id_width or 'as wide as its app'}; "
                         f"train the source policy with --id-width {M} or more to transfer it here")
    agent = init if init is not None else Sac(width, n_scaled, M, cfg)
    agent.match_services(M)
    if keep_norm and init is not None and init_from is not None:
        resume_optimisers(agent, Path(init_from))
    buf = ReplayBuffer(cfg.replay, M, width, E, seed, service_rewards=cfg.reward_split == "service")
    sim = MicroserviceSim(topo, n_envs=E, seed=seed)
    caps = topo.caps
    usage_actions = cfg.action_space != "cap"
    ceiling = check_ceiling(cfg.headroom_ceiling)
    out_dir = Path(out) if out else None
    writer = None
    rows_csv = []
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
        from agents.train_log import tensorboard_writer
        writer = tensorboard_writer(out_dir)

    end = cfg.total_steps if not stop_after else min(cfg.total_steps, int(stop_after))
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=end, unit="step", desc=f"reclaimer {topo.name}", leave=False)

    seen = 0
    episode = 0
    t0 = time.perf_counter()
    # a transferred policy keeps its weights, not its input statistics: those are refitted to
    # this application's data after the AutoScale fill, as a fresh run's are (a continued one,
    # `keep_norm`, keeps both)
    fitted = keep_norm and init is not None
    last_fit = 0
    # or once the replay is full: one episode of more copies than it holds never began learning
    learning_starts = min(EPISODE_S * E, buf.cap - E) if fitted else 0
    stats = None
    best = BestCheckpoint(max_violation=best_max_violation)
    best_agent = None
    ema_actor = copy.deepcopy(agent.actor).requires_grad_(False) if actor_ema else None
    ema_pairs = (list(ema_actor.parameters()), list(agent.actor.parameters())) if ema_actor is not None else None
    last_eval = 0
    while seen < end:
        users = draw_users(rng, topo.users, E, cfg.users_draw)
        sim.reset(users)
        # drawn only when asked for: a run without load changes keeps the paper's draws to the bit
        change = load_change_plan(rng, users, topo.users, cfg.load_changes, cfg.users_draw) \
            if cfg.load_changes else None
        full = np.tile(caps, (E, 1))
        for _ in range(WARMUP_S):
            st = sim.step(full)
        prev = np.ones((E, M))
        obs = stack.reset(feature_row_block(st.per_service, st.latency_ms, st.requests, st.failures,
                                            topo.qos_ms, prev, caps), st.queue if cfg.observe_queue else None)
        ep_reward = np.zeros(E)
        ep_cores = np.zeros(E)
        ep_viol = np.zeros(E)
        ep_ids = episode * E + np.arange(E)
        phase = "autoscale" if seen < cfg.autoscale_steps else (
            "classifier" if seen < cfg.autoscale_steps + cfg.classifier_steps else "sac")
        lr = cfg.lr_at(seen)
        if cfg.lr_final is not None:
            agent.set_lr(lr)
        fill_h = None
        if phase == "autoscale" and cfg.fill == "mixed":    # drawn only then: the paper's fill keeps its draws
            fill_h = np.exp(rng.uniform(*np.log(FILL_HEADROOM), size=E))
        for t in range(EPISODE_S):
            base = mean_used(obs, cfg.k, caps) if usage_actions or ceiling is not None or fill_h is not None else None
            if phase == "autoscale":
                noise = 1.0 + rng.uniform(-cfg.autoscale_noise, cfg.autoscale_noise, size=(E, M))
                a = fill_actions(st.cpu_used, prev * caps, base, caps, noise, cfg, fill_h)
            else:
                a = agent.act(obs, deterministic=False)
                if phase == "classifier":
                    a = _classifier_guided(agent, obs, a, base, caps, cfg, rng,
                                           keep=(seen - cfg.autoscale_steps) / max(cfg.classifier_steps, 1),
                                           ceiling=ceiling)
            if usage_actions:
                a = np.clip(a, 0.0, 1.0).astype(np.float32)
                cores = cores_of(a, base, caps, cfg.action_space, ceiling)
            else:
                a = np.clip(a, MIN_CORES / caps, 1.0).astype(np.float32)
                cores = a * caps if ceiling is None else cores_of(a, base, caps, "cap", ceiling)
            if ceiling is not None:
                # the action in force is stored, as the online learner does: every action above the
                # ceiling sets the ceiling's cores. Either way, stored as drawn or in force, Hotel's
                # policy stayed at the ceiling (docs/microservice-cores.md, "A headroom ceiling")
                a = action_of(cores, base, caps, cfg.action_space).astype(np.float32)
            if change is not None:
                sim.set_users(users_on_ramp(users, *change, t))
            st = sim.step(cores)
            r = reward_of(st.p99_ms, topo.qos_ms * cfg.qos_margin, cores, caps, cost=cfg.cost)
            # the features' previous action is the limit in force as a share of the cap (what
            # the policy reads back from the engine), on either action space
            prev = cores / caps if usage_actions or ceiling is not None else a.astype(np.float64)
            nxt = stack.push(feature_row_block(st.per_service, st.latency_ms, st.requests, st.failures,
                                               topo.qos_ms, prev, caps), st.queue if cfg.observe_queue else None)
            done = np.full(E, float(t == EPISODE_S - 1))
            stored = r if cfg.reward_split == "app" else \
                service_rewards(st.p99_ms, topo.qos_ms * cfg.qos_margin, cores, caps, cost=cfg.cost)
            buf.add_batch(obs, a, stored, nxt, done, r == -1.0, ep_ids)
            obs = nxt
            ep_reward += r
            ep_cores += cores.sum(axis=1)
            ep_viol += r == -1.0
            seen += E
            if phase != "autoscale":
                if not fitted:
                    agent.norm.fit(_fit_sample(buf))
                    fitted, last_fit = True, seen
                elif seen - last_fit >= cfg.restandardise_every:
                    agent.refit_norm(_fit_sample(buf))
                    last_fit = seen
                    if ema_actor is not None:   # the refit rewrote the first layer for the new scaling
                        ema_actor.load_state_dict(agent.actor.state_dict())
                if buf.size > learning_starts:
                    for _ in range(cfg.updates_per_step):
                        stats = agent.update(*buf.sample(cfg.batch))
                        if ema_pairs is not None:
                            with torch.no_grad():
                                torch._foreach_lerp_(*ema_pairs, 1.0 - actor_ema)
            if bar:
                bar.update(E)
        if phase == "autoscale" and seen >= cfg.autoscale_steps and not fitted:
            agent.norm.fit(_fit_sample(buf))
            fitted, last_fit = True, seen
        bad = first_non_finite(agent)
        if bad:     # a diverged update: stop before a NaN network is evaluated, kept or saved
            raise TrainingDiverged(f"episode {episode + 1} ({seen:,} transitions): the network's {bad} is not finite "
                                   "(NaN or inf); training stopped without saving it")
        cls_loss = None
        if cfg.classifier_steps and cfg.autoscale_steps <= seen < cfg.autoscale_steps + cfg.classifier_steps + EPISODE_S * E:
            cls_loss = _train_classifier(agent, buf, cfg)
        row = {"episode": episode, "steps": seen, "phase": phase, "seconds": round(time.perf_counter() - t0, 1),
               "reward": float(ep_reward.mean() / EPISODE_S), "mean_cores": float(ep_cores.mean() / EPISODE_S),
               "violation_rate": float(ep_viol.mean() / EPISODE_S),
               "alpha": stats.alpha if stats else None, "entropy": stats.entropy if stats else None,
               "critic_loss": stats.critic_loss if stats else None, "q": stats.q if stats else None,
               "classifier_loss": cls_loss, "lr": lr, "eval_mean_cores": None, "eval_violation_rate": None,
               "ema_eval_mean_cores": None, "ema_eval_violation_rate": None}
        if eval_every and phase != "autoscale" and (seen - last_eval >= eval_every or seen >= end):
            last_eval = seen
            candidates = [("live", agent)] + ([("ema", _snapshot(agent, ema_actor, width, n_scaled, M, cfg))]
                                              if ema_actor is not None else [])
            for which, net in candidates:
                res = evaluate(ReclaimerPolicy(net, topo, cfg, ceiling=cfg.headroom_ceiling), topo, eval_seeds)
                net.train()   # the wrapper put it in eval mode (the networks have no mode-dependent layers)
                prefix = "eval" if which == "live" else "ema_eval"
                row[f"{prefix}_mean_cores"], row[f"{prefix}_violation_rate"] = res["mean_cores"], res["violation_rate"]
                if best.offer(seen, res, actor=which):
                    # the moving average's copy is already a snapshot; the live agent goes on training
                    best_agent = net if net is not agent else _snapshot(agent, agent.actor, width, n_scaled, M, cfg)
                    if out_dir:
                        save_whole(ReclaimerPolicy(best_agent, topo, cfg, training=_best_training(
                            seed, seen, init_from, keep_norm, best, eval_seeds),
                            ceiling=cfg.headroom_ceiling), out_dir / "best-policy", optimisers_of=agent)
        rows_csv.append(row)
        if out_dir:
            # row by row, so that an interrupted run keeps its log (rewritten whole, with the plot, at the end)
            _append_log_row(out_dir / "training.csv", row)
            write_progress(out_dir, seen, end, episode=episode + 1, phase=phase)
        if writer:
            for key in ("reward", "mean_cores", "violation_rate", "alpha", "entropy", "critic_loss", "q", "classifier_loss", "lr"):
                if row[key] is not None:
                    writer.add_scalar(f"train/{key}", row[key], seen)
            for prefix in ("eval", "ema_eval"):
                if row[f"{prefix}_mean_cores"] is not None:
                    writer.add_scalar(f"{prefix}/mean_cores", row[f"{prefix}_mean_cores"], seen)
                    writer.add_scalar(f"{prefix}/violation_rate", row[f"{prefix}_violation_rate"], seen)
        if bar:
            bar.set_postfix(phase=phase, cores=f"{row['mean_cores']:.2f}", viol=f"{row['violation_rate']:.3f}")
        episode += 1
    if bar:
        bar.close()
    if writer:
        writer.close()
    policy = ReclaimerPolicy(agent, topo, cfg, training={"seed": seed, "steps": seen, "episodes": episode,
                                                          "seconds": round(time.perf_counter() - t0, 1),
                                                          "init_policy": init_from,
                                                          **({"continued": True} if keep_norm else {}),
                                                          **({"stopped_after": end} if end < cfg.total_steps else {})},
                             ceiling=cfg.headroom_ceiling)
    if out_dir:
        _write_log(out_dir, rows_csv)
        policy.save(out_dir / "policy")
        save_optimisers(agent, out_dir / "policy")
    policy.log = rows_csv
    policy.best = None
    if best_agent is not None:
        policy.best = ReclaimerPolicy(best_agent, topo, cfg, training=_best_training(seed, best.steps, init_from,
                                                                                     keep_norm, best, eval_seeds),
                                      ceiling=cfg.headroom_ceiling)
    policy.evaluations = best.history
    return policy


def save_whole(policy, folder: Path, optimisers_of: Sac | None = None) -> None:
    """Replace a saved policy folder so that an interrupt leaves the old one whole or the new one:
    `best-policy` is rewritten at every better checkpoint, and written in place a Ctrl-C in the
    middle left new weights under the old metadata, or a truncated weights.pt (the best lost).
    `optimisers_of`: the training agent whose optimisers' state goes beside (save_optimisers)."""
    import shutil

    tmp, old = folder.with_name(folder.name + ".tmp"), folder.with_name(folder.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    policy.save(tmp)
    if optimisers_of is not None:
        save_optimisers(optimisers_of, tmp)
    if folder.exists():
        shutil.rmtree(old, ignore_errors=True)
        folder.rename(old)
    tmp.rename(folder)
    shutil.rmtree(old, ignore_errors=True)


#: beside a saved policy's weights: the training's Adam state, which `--continue` resumes
OPTIMISER_FILE = "optimizer.pt"


def save_optimisers(agent: Sac, folder: Path) -> None:
    """The optimisers' state beside the policy saved in `folder`, tied to its weights by their
    digest (a continued run restarted Adam's moments and step counts from zero). Written beside
    and renamed over, so an interrupt leaves the last one whole."""
    import json
    import os

    from agents.policy import WEIGHTS_DIGEST_KEY

    from .policy import METADATA_FILE

    digest = json.loads((folder / METADATA_FILE).read_text()).get(WEIGHTS_DIGEST_KEY)
    tmp = folder / f".{OPTIMISER_FILE}.tmp"
    torch.save({"weights_sha256": digest, "optimizers": agent.optimiser_state()}, tmp)
    os.replace(tmp, folder / OPTIMISER_FILE)


def resume_optimisers(agent: Sac, folder: Path) -> bool:
    """Load the optimisers' state saved beside the policy in `folder` into `agent`. Without one
    (a policy saved before it was kept, or copied without it), one written for other weights or
    one that does not fit, Adam starts fresh and the log says why; returns whether it resumed."""
    import json

    from agents.policy import WEIGHTS_DIGEST_KEY

    from .policy import METADATA_FILE

    path = folder / OPTIMISER_FILE
    why = None
    if not path.is_file():
        why = "no optimiser state saved with it (a policy saved before it was kept)"
    else:
        try:
            saved = torch.load(path, map_location="cpu", weights_only=True)   # no pickled code
            digest = json.loads((folder / METADATA_FILE).read_text()).get(WEIGHTS_DIGEST_KEY)
            if not isinstance(saved, dict) or saved.get("weights_sha256") != digest or digest is None:
                why = f"{path.name} was saved with other weights"
            else:
                agent.load_optimiser_state(saved["optimizers"])
        except Exception as exc:    # truncated, foreign, or for other networks: the weights still continue
            detail = " ".join(str(exc).split())[:160]
            why = f"{path.name} is unreadable or does not fit ({type(exc).__name__}: {detail})"
    if why:
        logging.getLogger(__name__).warning("%s: %s; Adam starts fresh", folder, why)
    return why is None


def fill_actions(cpu_used, limits, base, caps, noise, cfg: SacConfig, fill_h=None) -> np.ndarray:
    """The replay fill's actions (E, M) on the config's action space: AutoScale's limits times the
    noise (the paper), and with `fill_h` (the "mixed" fill, ours) each odd copy at fill_h[e] times
    its base use (`features.mean_used` of its observation), times the same noise. `base` is read
    on the "usage" space and by the mixed fill only."""
    space = cfg.action_space
    if space == "cap":
        a = autoscale_step(cpu_used, limits) / caps * noise     # the paper's arithmetic, to the bit
    else:
        a = action_of(autoscale_step(cpu_used, limits) * noise, base, caps, space)
    if fill_h is not None:
        held = np.arange(len(a)) % 2 == 1
        a[held] = action_of(base[held] * fill_h[held, None] * noise[held], base[held], caps, space)
    return a


def draw_users(rng: np.random.Generator, bounds, n: int, how: str = "uniform") -> np.ndarray:
    """Each training copy's users for one episode (SacConfig.users_draw)."""
    lo, hi = bounds
    if how == "uniform":
        return rng.uniform(lo, hi, size=n)
    if how == "log-uniform":
        return np.exp(rng.uniform(np.log(lo), np.log(hi), size=n))
    raise ValueError(f"users_draw must be one of {', '.join(USERS_DRAWS)}, not {how!r}")


#: ours (SacConfig.load_changes): the seconds of an episode where a load change may start, and the
#: longest ramp; a ramp begun late runs on past the episode's last second, as a real load keeps moving
LOAD_CHANGE_WINDOW = (30, 240)
LOAD_CHANGE_RAMP_MAX = 90


def load_change_plan(rng: np.random.Generator, users: np.ndarray, bounds, chance: float,
                     how: str = "uniform") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(to, t0, ramp) per copy for users_on_ramp: with `chance` a copy's users move to a fresh draw
    of `bounds`, from a second drawn in LOAD_CHANGE_WINDOW, over 1..LOAD_CHANGE_RAMP_MAX seconds;
    the others keep theirs (to = their users). Every copy draws alike, so the draws' order does not
    depend on which copies change."""
    n = len(users)
    changes = rng.random(n) < chance
    to = np.where(changes, draw_users(rng, bounds, n, how), users)
    t0 = rng.integers(*LOAD_CHANGE_WINDOW, size=n)
    ramp = rng.integers(1, LOAD_CHANGE_RAMP_MAX + 1, size=n)
    return to, t0, ramp


def _snapshot(agent: Sac, actor: torch.nn.Module, width: int, n_scaled: int, M: int, cfg: SacConfig) -> Sac:
    """A copy of the agent (its standardiser, critics, classifier) acting with `actor`'s weights."""
    with torch.random.fork_rng():   # a fresh network's initialisation must not move the run's draws
        net = Sac(width, n_scaled, M, cfg)
    net.load_state_dict(agent.state_dict())
    net.actor.load_state_dict(actor.state_dict())
    return net


def _best_training(seed, steps, init_from, keep_norm, best: BestCheckpoint, eval_seeds) -> dict:
    """The best checkpoint's training metadata: where it stood, and how it was picked."""
    return {"seed": seed, "steps": steps, "init_policy": init_from, **({"continued": True} if keep_norm else {}),
            "selected": {"rule": f"fewest mean cores at a violation rate <= {best.max_violation}", "actor": best.actor,
                         "validation_seeds": list(eval_seeds), "mean_cores": round(best.result["mean_cores"], 4),
                         "violation_rate": round(best.result["violation_rate"], 6)}}


def _classifier_guided(agent: Sac, obs, a, used, caps, cfg: SacConfig, rng, keep: float,
                       ceiling=None) -> np.ndarray:
    """The paper's QoS-classifier explorer for E copies: candidates scale each action's cores (under
    the run's headroom `ceiling`, an action_map.Ceiling, checked once by the caller)."""
    E, M = a.shape
    scales = 1.0 + np.asarray(cfg.candidates)
    cands = scaled_actions(a, scales, caps, cfg.action_space)                           # (E, C, M)
    p = agent.qos_probability(obs, cands.astype(np.float32))                            # (E, C)
    base = used[:, None, :] if used is not None else None
    cost = cores_of(cands, base, caps, cfg.action_space, ceiling).sum(axis=2)
    ok = p >= cfg.classifier_threshold
    cost_ok = np.where(ok, cost, np.inf)
    pick = np.where(ok.any(axis=1), cost_ok.argmin(axis=1), p.argmax(axis=1))
    chosen = cands[np.arange(E), pick]
    own = rng.random(E) < keep
    chosen = np.where(own[:, None], a, chosen)
    return chosen * (1.0 + rng.uniform(-cfg.classifier_noise, cfg.classifier_noise, size=chosen.shape))


def _train_classifier(agent: Sac, buf: ReplayBuffer, cfg: SacConfig, batch: int = 256) -> float | None:
    if buf.size < batch:
        return None
    loss = None
    for _ in range(cfg.classifier_updates):
        idx = buf.rng.integers(0, buf.size, batch)
        label = buf.qos_labels(idx, cfg.classifier_horizon)
        loss = agent.classifier_update(*buf.rows(idx), torch.as_tensor(label))
    return loss


def _fit_sample(buf: ReplayBuffer, n: int = 20_000) -> np.ndarray:
    """The rows the standardiser is fitted on: all of the buffer, or a random n transitions of it."""
    if buf.size <= n:
        return buf.obs[:buf.size].astype(np.float32)
    return buf.obs[np.sort(buf.rng.choice(buf.size, n, replace=False))].astype(np.float32)


def _append_log_row(path: Path, row: dict) -> None:
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        if f.tell() == 0:
            w.writeheader()
        w.writerow(row)


def _write_log(out_dir: Path, rows: list[dict]) -> None:
    if not rows:
        return
    with open(out_dir / "training.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        steps = [r["steps"] for r in rows]
        fig, axes = plt.subplots(3, 1, figsize=(7, 7), sharex=True)
        axes[0].plot(steps, [r["reward"] for r in rows])
        axes[0].set_ylabel("reward / step")
        axes[1].plot(steps, [r["mean_cores"] for r in rows])
        axes[1].set_ylabel("mean cores")
        axes[2].plot(steps, [r["violation_rate"] for r in rows])
        axes[2].set_ylabel("QoS violations")
        axes[2].set_xlabel("transitions")
        fig.tight_layout()
        fig.savefig(out_dir / "training.png", dpi=100)
        plt.close(fig)
    except Exception:  # the CSV is the record; a plot failure must not lose the run
        pass


def main(argv=None) -> int:
    """`samm train --problem microservice-cores --app hotel --out DIR [--steps N] ...`."""
    import argparse

    p = argparse.ArgumentParser(description="Train Reclaimer's SAC agent on the microservice simulator "
                                            "(Algorithm 2: AutoScale fill, QoS-classifier exploration, SAC).")
    p.add_argument("--app", default="hotel", help="hotel, social, chain3, testbed, or a topology YAML file")
    p.add_argument("--steps", type=int, default=None,
                   help=f"transitions in all (default {SIM_TRAINING['total_steps']:,}; phases scale with it)")
    p.add_argument("--episodes", type=int, default=None, help="alternatively: episodes of 300 s per copy")
    p.add_argument("--envs", type=int, default=None, help=f"simulated copies (default {SIM_TRAINING['n_envs']})")
    p.add_argument("--updates-per-step", type=int, default=None,
                   help=f"updates per batch step (default {SIM_TRAINING['updates_per_step']})")
    p.add_argument("--paper-network", action="store_true", help="Table 2's 7×256 networks and lr 3e-5 (slow here)")
    p.add_argument("--id-width", type=int, default=None,
                   help="width of the one-hot service id (default: the app's service count); a policy to be "
                        "transferred to a larger app needs at least that app's count (Social: 28)")
    p.add_argument("--init-policy", default=None, help="start from this saved policy (the transfer experiment)")
    p.add_argument("--continue", dest="cont", action="store_true",
                   help="with --init-policy of this same app: continue its training (its input statistics kept, "
                        "no AutoScale fill or classifier explorer: plain SAC on a fresh replay)")
    p.add_argument("--qos-margin", type=float, default=None,
                   help="ours: train against this fraction of the QoS target (default 1.0, the paper); "
                        "a policy headed to real containers keeps a margin for the simulator's optimism")
    p.add_argument("--entropy-space", choices=ENTROPY_SPACES, default=None,
                   help="ours: measure SAC's entropy on the action a (default, the paper), on log a (log-action: "
                        "noise in proportion to the limit, no pull away from small limits) or on the Gaussian u "
                        "before the sigmoid (latent; can stick at the caps); docs/microservice-cores.md")
    p.add_argument("--target-entropy", type=float, default=None,
                   help=f"per-service target entropy (default {SIM_TRAINING['target_entropy']} on the action; "
                        "with --entropy-space latent or log-action the entropy of u or log a, e.g. 0.0 for sigma ~0.24)")
    # the recipe's optional choices, all ours and off by default (SacConfig says what each does)
    for flag, choices, text in (
            ("--users-draw", USERS_DRAWS, "how each training episode draws its users in the app's range (default "
             "uniform, the paper); log-uniform trains as often on each doubling of the load, the low end more"),
            ("--critic-action", CRITIC_ACTIONS, "what the critics read of each service's action: linear a (default, "
             "the paper) or log, log a over [0.001, 1] rescaled to [0, 1] (relative changes of small limits "
             "resolved), or both"),
            ("--actor-grad", ACTOR_GRADS, "linear (default, SAC: dQ/da through the sigmoid) or relative (the Q "
             "term's gradient divided by a, so small limits move by the same share of themselves as large ones)"),
            ("--action-space", ACTION_SPACES, "what the action means: cap (default, the paper: cores = a x cap) or "
             "usage (the headroom over the mean use of the 5 stacked seconds, 0.5x to 8x on a log scale)"),
            ("--fill", FILLS, "what fills the replay before learning: autoscale (default, the paper: AutoScale with "
             "5%% noise) or mixed (half the copies AutoScale, half held at a headroom over use drawn per episode "
             "in 1.1x-8x, so tight limits and their violations are in the data)"),
            ("--entropy-scope", ENTROPY_SCOPES, "what the learned entropy coefficient holds at the target: app "
             "(default, the paper: one coefficient, the mean entropy over services) or service (one coefficient "
             "per service, so no service's noise can pay for another's)"),
            ("--cost", COSTS, "the reward's cost of the cores: linear (default, the paper: 1 - sum cores / sum "
             "caps) or log (each service's log share of its cap, weighted by its cap)"),
            ("--reward-split", REWARD_SPLITS, "what each critic scalar is fitted to: app (default, the paper: their "
             "mean to the app's return) or service (each service's to its own, its cores charged M times and a "
             "violation shared)")):
        p.add_argument(flag, choices=choices, default=None, help="ours: " + text)
    p.add_argument("--lr-final", type=float, default=None, metavar="LR",
                   help="ours: the actor's and critics' learning rate falls geometrically from the recipe's "
                        f"{SIM_TRAINING['lr']:g} to LR over the plain-SAC phase (e.g. 3e-5, Table 2's rate; "
                        "default: constant, the paper)")
    p.add_argument("--lr-decay-start", type=float, default=None, metavar="F",
                   help="ours, with --lr-final: the decay begins F of the way through the plain-SAC phase (default 0)")
    p.add_argument("--headroom-ceiling", type=float, default=None, metavar="H",
                   help="ours: train under a headroom ceiling, every limit at most H times the service's mean use "
                        "over the stacked seconds; the saved policies carry it (`samm reclaimer-ceiling` may choose "
                        "another after training; default: none, the paper). Measured on Hotel at 1.9: the policy "
                        "stayed at the ceiling; choose one after training instead (docs/microservice-cores.md)")
    p.add_argument("--load-changes", type=float, default=None, metavar="P",
                   help="ours: each training copy's users change once inside an episode with chance P, to a fresh "
                        "draw of the app's range over a ramp of 1-90 s (1: a jump) from a second in [30, 240); "
                        "validation keeps constant loads (default 0: one load per episode, the paper)")
    p.add_argument("--observe-queue", action="store_true",
                   help="ours, the ablation: add each service's queued work (seconds of its limit) to its "
                        "observation, which the paper keeps from the agent; such a policy runs in simulation only "
                        "(the real containers' queues are not measured)")
    p.add_argument("--precision", choices=PRECISIONS, default=None,
                   help="ours: bf16 runs the updates' hidden layers in bfloat16 (autocast; 2x faster on CPUs "
                        "with AVX-512 BF16), bf16-state only the layers that read the state alone (every layer that "
                        "sees the action stays float32); acting and the saved policy stay float32 (default fp32)")
    p.add_argument("--fused-adam", action="store_true",
                   help="ours: PyTorch's fused CPU Adam kernel (the same update rule, ~5%% faster updates on 2 cores; "
                        "not the same bits, so a seed trains other weights than without it; default: off)")
    p.add_argument("--eval-every", type=int, default=0, metavar="N",
                   help="ours: every N transitions (from the explorer's phase on, and at the end) evaluate the "
                        "policy on the experiment's protocol with validation seeds and keep the checkpoint with "
                        "the fewest mean cores within --best-max-violations in OUT/best-policy (default 0: off)")
    p.add_argument("--eval-seeds", default=",".join(map(str, VALIDATION_SEEDS)),
                   help="the validation episodes' seeds, e.g. 101-120 or 101,102 (keep them apart from the "
                        "experiment's 1-5 and 6-10)")
    p.add_argument("--best-max-violations", type=float, default=0.0,
                   help="the best checkpoint's largest share of violating validation seconds (default 0)")
    p.add_argument("--actor-ema", type=float, default=0.0, metavar="D",
                   help="ours, with --eval-every: keep an exponential moving average of the actor's weights (decay D "
                        "per update, e.g. 0.9995) and offer it to the best-checkpoint rule beside the live actor "
                        "(default 0: off; the training itself is unchanged)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", default=None, metavar="LIST",
                   help="ours: train these seeds side by side (e.g. 1,2), one process each with --threads threads, "
                        "each in OUT/seed-S, and copy to OUT/best-policy the seeds' best-policy with the fewest "
                        "validation mean cores (all are within --best-max-violations); needs --eval-every; --seed "
                        "is then ignored")
    p.add_argument("--stop-after", type=int, default=None, metavar="N",
                   help="ours: stop after N transitions (rounded up to whole episodes of every copy), keeping the "
                        "phases, refits and learning rate of the --steps schedule: the full run's first N to the "
                        "bit (default: run the whole schedule)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: under other load two threads were 12x slower; on a quiet "
                        "machine 2 make an fp32 update 1.4x faster)")
    p.add_argument("--out", default=None, help="directory: policy/, training.csv, training.png, tb/")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    if args.stop_after is not None and args.stop_after < 1:
        print(f"error: --stop-after must be >= 1, not {args.stop_after}", file=sys.stderr)
        return 2
    try:
        check_options(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return _train_seeds(args) if args.seeds is not None else _train_one(args)


#: what a run (or a --seeds run) writes into its --out: one there means an earlier run, whose policy
#: and logs a new one would replace, and whose best-policy it would leave beside its own policy
RUN_FILES = ("policy", "best-policy", "training.csv", "progress.json", "seeds.json", "tb")


def check_options(args) -> None:
    """Each count refused with its flag: --steps or --episodes of 0 ran the whole default schedule
    (240,000 transitions) and negative ones failed on an empty log; a negative --envs or --seed
    failed in NumPy without naming the option. (0 for --envs and the like keeps the recipe's value.)"""
    for flag, value, ok, want in (("--steps", args.steps, args.steps is None or args.steps >= 1, ">= 1"),
                                  ("--episodes", args.episodes, args.episodes is None or args.episodes >= 1, ">= 1"),
                                  ("--seed", args.seed, args.seed >= 0, ">= 0"),
                                  ("--threads", args.threads, args.threads >= 1, ">= 1"),
                                  ("--envs", args.envs, args.envs is None or args.envs >= 0, ">= 1"),
                                  ("--updates-per-step", args.updates_per_step,
                                   args.updates_per_step is None or args.updates_per_step >= 0, ">= 1"),
                                  ("--id-width", args.id_width, args.id_width is None or args.id_width >= 0, ">= 1")):
        if not ok:
            raise ValueError(f"{flag} must be {want}, not {value}")
    try:
        eval_seeds = parse_seeds(args.eval_seeds)
    except ValueError:
        eval_seeds = []     # malformed: _train_one names it
    # before the runs: --seeds started one process per seed, each to fail on it after its start
    require_apart_from_reported(eval_seeds, "--eval-seeds")


def _train_one(args) -> int:
    """One run of `main`'s parsed options."""
    overrides = {}
    if args.paper_network:
        overrides.update(hidden=256, actor_layers=7, critic_pre_layers=2, critic_post_layers=5, lr=3e-5)
    for field, value in (("n_envs", args.envs), ("updates_per_step", args.updates_per_step),
                         ("id_width", args.id_width), ("precision", args.precision),
                         ("entropy_space", args.entropy_space), ("users_draw", args.users_draw),
                         ("critic_action", args.critic_action), ("cost", args.cost),
                         ("actor_grad", args.actor_grad), ("action_space", args.action_space),
                         ("fill", args.fill), ("entropy_scope", args.entropy_scope),
                         ("reward_split", args.reward_split)):
        if value:       # unset (None) or 0: the recipe's value stands
            overrides[field] = value
    if args.target_entropy is not None:
        overrides["target_entropy"] = args.target_entropy
    if args.observe_queue:
        overrides["observe_queue"] = True
    if args.fused_adam:
        overrides["fused_adam"] = True
    for field, value in (("lr_final", args.lr_final), ("lr_decay_start", args.lr_decay_start),
                         ("headroom_ceiling", args.headroom_ceiling), ("load_changes", args.load_changes)):
        if value is not None:   # SacConfig checks their ranges and that a decay start has its final rate
            overrides[field] = value
    if args.qos_margin is not None:
        if not 0.0 < args.qos_margin <= 1.0:
            print(f"error: --qos-margin must be in (0, 1], got {args.qos_margin}", file=sys.stderr)
            return 2
        overrides["qos_margin"] = args.qos_margin
    if args.eval_every < 0 or not 0.0 <= args.best_max_violations <= 1.0:
        print("error: --eval-every must be >= 0 and --best-max-violations in [0, 1]", file=sys.stderr)
        return 2
    if not 0.0 <= args.actor_ema < 1.0 or (args.actor_ema and not args.eval_every):
        print("error: --actor-ema must be in [0, 1) and needs --eval-every (it is offered at evaluations)",
              file=sys.stderr)
        return 2
    try:
        eval_seeds = tuple(parse_seeds(args.eval_seeds))
    except ValueError:
        eval_seeds = ()
    if not eval_seeds:
        print(f"error: --eval-seeds must be integers separated by commas, not {args.eval_seeds!r}", file=sys.stderr)
        return 2
    try:
        cfg = sim_config(**overrides)
    except ValueError as e:     # an option out of its range: say which
        print(f"error: {e}", file=sys.stderr)
        return 2
    total = args.steps or (args.episodes * EPISODE_S * cfg.n_envs if args.episodes else None)
    if total:
        cfg = scaled_schedule(cfg, total)
    if args.cont and not args.init_policy:
        print("error: --continue needs --init-policy (the policy to continue)", file=sys.stderr)
        return 2
    init = None
    try:
        if args.init_policy:
            from .policy import ReclaimerPolicy
            init = ReclaimerPolicy.load(args.init_policy)
            if args.action_space and args.action_space != init.cfg.action_space:
                print(f"error: --action-space {args.action_space}: the initial policy acts on the "
                      f"{init.cfg.action_space!r} space (a policy's actions keep their meaning)", file=sys.stderr)
                return 2
            asked = [f for f in AGENT_FIELDS if getattr(args, f) is not None and getattr(args, f) is not False
                     and getattr(args, f) != getattr(init.cfg, f)]
            if asked:
                f = asked[0]
                print(f"error: --{f.replace('_', '-')} {getattr(args, f)}: the initial policy was built to train with "
                      f"{f} {getattr(init.cfg, f)!r} (a policy's networks keep it)", file=sys.stderr)
                return 2
            cfg = replace(cfg, **{f: getattr(init.cfg, f) for f in (*NETWORK_FIELDS, *AGENT_FIELDS)},
                          action_space=init.cfg.action_space, precision=args.precision or init.cfg.precision)
            if args.cont:
                if init.topo.name != load_topology(args.app).name:
                    print(f"error: --continue: the policy is for {init.topo.name!r}, not {args.app!r} "
                          "(transfer between apps: --init-policy without --continue)", file=sys.stderr)
                    return 2
                if args.qos_margin is not None and args.qos_margin != init.cfg.qos_margin:
                    print(f"error: --continue --qos-margin {args.qos_margin}: a continued policy keeps its own reward "
                          f"(--qos-margin {init.cfg.qos_margin})", file=sys.stderr)
                    return 2
                # its own reward, and no AutoScale fill or classifier explorer: plain SAC
                cfg = replace(cfg, qos_margin=init.cfg.qos_margin, autoscale_steps=0, classifier_steps=0)
        if args.out:    # last, so that a bad option is named first
            refuse_existing_run(Path(args.out), RUN_FILES, also=sorted(Path(args.out).glob("seed-*")))
        policy = train(args.app, cfg, seed=args.seed, out=args.out, progress=not args.quiet,
                       init=init.agent if init else None, threads=args.threads, init_from=args.init_policy,
                       keep_norm=args.cont, eval_every=args.eval_every, eval_seeds=eval_seeds,
                       best_max_violation=args.best_max_violations, actor_ema=args.actor_ema,
                       stop_after=args.stop_after)
    except ValueError as e:  # a bad app, policy or option: say which, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 1 if isinstance(e, TrainingDiverged) else 2     # 1: the work failed, not its usage
    last = policy.log[-1]
    print(f"{last['episode'] + 1} episodes, {last['steps']:,} transitions, {last['seconds']} s; last episode: "
          f"mean cores {last['mean_cores']:.2f}, QoS violations {last['violation_rate']:.3%}")
    if args.out:
        print(f"saved policy to {Path(args.out) / 'policy'}")
    if args.eval_every:
        if policy.best is None:
            print(f"no evaluated checkpoint had a violation rate within {args.best_max_violations}: no best-policy")
        else:
            sel = policy.best.training["selected"]
            print(f"best checkpoint ({sel['actor']} actor) at {policy.best.training['steps']:,} transitions: validation mean cores "
                  f"{sel['mean_cores']:.2f}, QoS violations {sel['violation_rate']:.3%}"
                  + (f"; saved to {Path(args.out) / 'best-policy'}" if args.out else ""))
    return 0


def _train_seeds(args) -> int:
    """--seeds: one run per seed, side by side in processes, then OUT/best-policy is the best-policy
    of the seed that validation ranks first (the checkpoint rule's own: every candidate is within the
    violation bound, the fewest mean cores wins; the same validation seeds for all). What it buys:
    the recipe's seeds differ more than its checkpoints (docs/microservice-cores.md)."""
    import copy
    import json
    import shutil

    from agents.parallel import map_runs, watch_progress

    from .policy import METADATA_FILE

    try:
        seeds = parse_seeds(args.seeds)
    except ValueError:
        seeds = []
    if len(seeds) < 2 or len(set(seeds)) != len(seeds):
        print(f"error: --seeds needs two or more distinct integers (e.g. 1,2 or 1-3), not {args.seeds!r}",
              file=sys.stderr)
        return 2
    if not args.out or not args.eval_every:
        print("error: --seeds needs --out and --eval-every (the seeds' checkpoints are ranked on validation)",
              file=sys.stderr)
        return 2
    out = Path(args.out)
    try:
        refuse_existing_run(out, RUN_FILES, also=sorted(out.glob("seed-*")))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    jobs = []
    for seed in seeds:
        job = copy.copy(args)
        job.seeds, job.seed, job.out, job.quiet = None, seed, str(out / f"seed-{seed}"), True
        jobs.append(job)
    t0 = time.perf_counter()
    # one bar over every seed's transitions, read from the progress.json each run keeps
    bar = contextlib.nullcontext() if args.quiet else \
        watch_progress([j.out for j in jobs], desc=f"seeds {','.join(map(str, seeds))}")
    with bar:
        codes = map_runs(_train_one, jobs, workers=len(jobs), progress=False)
    seconds = round(time.perf_counter() - t0, 1)
    if any(codes):
        print(f"error: seed(s) {[s for s, c in zip(seeds, codes) if c]} failed", file=sys.stderr)
        return max(codes)
    runs = []
    for seed in seeds:
        meta = out / f"seed-{seed}" / "best-policy" / METADATA_FILE
        if meta.is_file():     # absent: no checkpoint within the violation bound
            t = json.loads(meta.read_text())["training"]
            runs.append({"seed": seed, "steps": t["steps"], "mean_cores": t["selected"]["mean_cores"],
                         "violation_rate": t["selected"]["violation_rate"]})
        else:
            runs.append({"seed": seed, "steps": None, "mean_cores": None, "violation_rate": None})
    ranked = sorted((r for r in runs if r["mean_cores"] is not None), key=lambda r: (r["mean_cores"], r["seed"]))
    chosen = ranked[0]["seed"] if ranked else None
    record = {"seeds": runs, "chosen": chosen, "rule": "fewest validation mean cores among the seeds' best-policies",
              "validation_seeds": [int(x) for x in parse_seeds(args.eval_seeds)], "seconds": seconds}
    (out / "seeds.json").write_text(json.dumps(record, indent=2))
    best = out / "best-policy"
    if best.exists():
        shutil.rmtree(best)
    for r in runs:
        print(f"seed {r['seed']}: " + ("no checkpoint within the violation bound" if r["mean_cores"] is None else
                                       f"best at {r['steps']:,} transitions, validation mean cores {r['mean_cores']:.3f}, "
                                       f"QoS violations {r['violation_rate']:.3%}"))
    if chosen is None:
        print(f"no seed kept a checkpoint: no best-policy ({seconds} s)")
        return 0
    shutil.copytree(out / f"seed-{chosen}" / "best-policy", best)
    meta = json.loads((best / METADATA_FILE).read_text())
    meta["training"]["chosen_among_seeds"] = {str(r["seed"]): r["mean_cores"] for r in runs}
    (best / METADATA_FILE).write_text(json.dumps(meta, indent=2))
    print(f"chose seed {chosen}; saved to {best} ({seconds} s for {len(seeds)} seeds side by side)")
    return 0


def scaled_schedule(cfg: SacConfig, total: int) -> SacConfig:
    """The schedule's phases in the same proportions as SIM_TRAINING, for `total` transitions."""
    base = SIM_TRAINING["total_steps"]
    f = total / base
    return replace(cfg, total_steps=int(total), autoscale_steps=int(SIM_TRAINING["autoscale_steps"] * f),
                   classifier_steps=int(SIM_TRAINING["classifier_steps"] * f),
                   restandardise_every=max(int(SIM_TRAINING["restandardise_every"] * f), 1))


if __name__ == "__main__":     # `python -m agents.microservice_cores.train` ran nothing and exited 0
    raise SystemExit(main())
