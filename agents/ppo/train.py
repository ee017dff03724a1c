"""Recurrent PPO in plain PyTorch, readable top to bottom (in the spirit of CleanRL's
ppo_atari_lstm.py, with sb3-contrib's chunked truncated BPTT).

Works with any Gymnasium VectorEnv that autoresets in the SAME step and reports the final
observation of ended episodes in `info["final_obs"]` (as `CloudSimVectorEnv` does), so no
transition is wasted and truncated episodes are bootstrapped from their real last state.

Speed (docs/benchmarks.md, "Training throughput"): at 8 environments and a 128-cell LSTM every
tensor is tiny, so per-call overhead, not arithmetic, is the cost. Rollouts therefore step a
NumPy copy of the network (`rollout_policy`) into NumPy buffers; each minibatch runs ONE LSTM
call whatever its episode resets (`LstmActorCritic.hidden_rows`), the heads and loss with a
hand-written gradient in one autograd node (`loss.FusedHeadsLoss`, checked against the
readable `loss.ppo_loss`), and clipping and Adam on one flat parameter buffer (`flat_params`).
"""
from __future__ import annotations

import csv
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from gymnasium import spaces
from torch import nn, optim

from agents.train_log import TrainingDiverged
from agents.train_log import refuse_existing_run as refuse_run_over
from sim_bridge.errors import RolloutWorkerLost

from .buffer import RolloutBuffer
from .config import PPOConfig
from .flat_params import FlatParams
from .loss import LossCoefs, LossTargets, fused_ppo_loss, ppo_loss
from .network import LstmActorCritic
from .normalize import RunningMeanStd
from .rollout_policy import RolloutPolicy

# A rollout that loses a remote worker (`sim_bridge.ray_batch`) is collected again from reset
# envs; this many losses in a row end the run.
MAX_ROLLOUT_ATTEMPTS = 3

CHECKPOINT_FILE = "checkpoint.pt"
# the logs a run appends to, with the column that orders their rows
LOG_FILES = {"progress.csv": "update", "episodes.csv": "global_step"}


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def action_nvec(space: spaces.Space) -> tuple[int, ...]:
    if isinstance(space, spaces.Discrete):
        return (int(space.n),)
    if isinstance(space, spaces.MultiDiscrete):
        return tuple(int(n) for n in space.nvec)
    raise TypeError(f"unsupported action space {space}")


def refuse_existing_run(out: Path) -> None:
    """A fresh run into the folder of an earlier one: the caller must resume it or choose another."""
    refuse_run_over(out, (CHECKPOINT_FILE, *LOG_FILES), hint="pass --resume to continue it or choose another --out")


def _one_line(exc: BaseException, limit: int = 200) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def read_checkpoint(path: Path, device: torch.device) -> dict:
    """The checkpoint's contents, or a ValueError naming the file when it is truncated or not one."""
    try:
        ck = torch.load(path, map_location=device, weights_only=False)
    except Exception as exc:  # truncated zip, garbage, a file of another program: all unreadable here
        raise ValueError(f"{path}: not a readable training checkpoint "
                         f"({type(exc).__name__}: {_one_line(exc)})") from None
    missing = [k for k in ("model", "optimizer", "update", "global_step", "torch_rng", "sample_rng")
               if not isinstance(ck, dict) or k not in ck]
    if missing:
        raise ValueError(f"{path}: not a training checkpoint (no {missing[0]!r})")
    return ck


def save_checkpoint(path: Path, state: dict) -> None:
    """Written beside and renamed over the last one, so an interrupted save leaves that one whole."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def trim_logs(out: Path, update: int, global_step: int) -> None:
    """Drop the log rows written after the checkpoint a run resumes from (all of them without one):
    the resumed run logs those updates and episodes again."""
    for name, column in LOG_FILES.items():
        path = out / name
        if not path.exists():
            continue
        last = update if column == "update" else global_step
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            fields, rows = reader.fieldnames, list(reader)
        kept = [r for r in rows if _logged_by(r, column, last)]
        if len(kept) == len(rows):
            continue
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows(kept)
        os.replace(tmp, path)


def _logged_by(row: dict, column: str, last: float) -> bool:
    """Whether a log row is whole and was written by the run up to `last`: a row torn by a kill
    mid-write (missing fields, or a number cut short) is dropped."""
    if None in row or None in row.values():
        return False
    try:
        return float(row[column]) <= last
    except ValueError:
        return False


def restore_carry(carry: dict, saved: dict) -> None:
    """Refill the caller's objects in place from a checkpoint (lists and dicts keep their identity)."""
    for key, value in saved.items():
        target = carry.get(key)
        if isinstance(target, list):
            target[:] = value
        elif isinstance(target, dict):
            target.clear()
            target.update(value)


def check_finite(update: int, stats: dict[str, list[float]], net: nn.Module) -> None:
    """Stop before a NaN or inf reaches a checkpoint or the saved policy."""
    bad = [k for k, v in stats.items() if not np.all(np.isfinite(v))]
    bad += [name for name, p in net.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        raise TrainingDiverged(f"update {update}: {bad[0]} is not finite (NaN or inf); training stopped without "
                               "saving it (lower the learning_rate, or check the observations and the initial policy)")


class TrainLogger:
    """CSV (always) and TensorBoard (when installed) scalars, one row per update."""

    def __init__(self, out_dir: Path | None):
        self.rows: list[dict] = []
        self.csv_path = out_dir / "progress.csv" if out_dir else None
        self.episodes_path = out_dir / "episodes.csv" if out_dir else None
        self.tb = None
        if out_dir:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(out_dir / "tensorboard"))
            except ImportError:  # pragma: no cover - tensorboard is an install requirement
                self.tb = None

    @staticmethod
    def _append(path: Path | None, row: dict) -> None:
        if path is None:
            return
        new = not path.exists()
        with path.open("a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(row))
            if new:
                w.writeheader()
            w.writerow(row)

    def log(self, step: int, row: dict) -> None:
        row = {"global_step": step, **row}
        self.rows.append(row)
        self._append(self.csv_path, row)
        if self.tb:
            for k, v in row.items():
                if k != "global_step" and isinstance(v, (int, float)) and np.isfinite(v):
                    self.tb.add_scalar(k, v, step)

    def episode(self, row: dict) -> None:
        self._append(self.episodes_path, row)

    def close(self) -> None:
        if self.tb:
            self.tb.close()


@dataclass
class TrainResult:
    net: LstmActorCritic
    obs_rms: RunningMeanStd | None
    global_step: int
    episodes: list[dict] = field(default_factory=list)
    history: list[dict] = field(default_factory=list)
    wall_seconds: float = 0.0


def ppo_update(net: LstmActorCritic, opt: optim.Optimizer, buf: RolloutBuffer, cfg: PPOConfig,
               sample_gen: torch.Generator, flat: FlatParams | None = None) -> dict[str, list[float]]:
    """Epochs over minibatches of BPTT chunks, clipped surrogate and value losses, early stop
    past `target_kl`. Returns the per-minibatch statistics. `flat`: the network's parameters
    as one buffer, which `opt` then steps."""
    net.train()
    coefs = LossCoefs(cfg.clip_coef, cfg.ent_coef, cfg.vf_coef, cfg.clip_vloss, cfg.norm_adv)
    fused = len(set(net.nvec)) == 1 and next(net.parameters()).device.type == "cpu"
    stats: dict[str, list[float]] = {"pg_loss": [], "v_loss": [], "entropy": [], "approx_kl": [], "clipfrac": []}
    for _ in range(cfg.update_epochs):
        for mb in buf.chunks(cfg.bptt_chunk, cfg.num_minibatches, sample_gen):
            n = mb.logprobs.numel()
            targets = LossTargets(mb.actions.reshape(n, -1), mb.logprobs.reshape(n), mb.values.reshape(n),
                                  mb.advantages.reshape(n), mb.returns.reshape(n))
            if fused:
                hidden, rows, _ = net.hidden_rows(mb.obs, mb.state, mb.episode_starts)
                loss, mb_stats = fused_ppo_loss(net, hidden, rows, targets, coefs)
            else:
                logits, values, _ = net.unroll(mb.obs, mb.state, mb.episode_starts, final_state=False)
                loss, mb_stats = ppo_loss(logits.reshape(n, -1), values.reshape(n), net.nvec, targets, coefs)
            if flat is not None:
                flat.zero_grad()
                loss.backward()
                flat.clip_grad_norm_(cfg.max_grad_norm)
            else:
                opt.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(net.parameters(), cfg.max_grad_norm, foreach=True)
            opt.step()
            values_of = mb_stats.tolist()
            for k, v in zip(stats, values_of):
                stats[k].append(v)
            if cfg.target_kl is not None and values_of[3] > cfg.target_kl:
                return stats
    return stats


def step_values(info: dict, done: np.ndarray, key: str) -> np.ndarray:
    """`info[key]` of the step just taken. An env that ended and reset in it reports that step's in
    `final_info` and its reset's in `info` (Gymnasium's SAME_STEP autoreset)."""
    now = np.asarray(info.get(key, 0.0), dtype=np.float64)
    final = info.get("final_info")
    if not done.any() or not isinstance(final, dict) or key not in final:
        return now
    return np.where(done, np.asarray(final[key], dtype=np.float64), now)


def start_normaliser(cfg: PPOConfig, obs_dim: int,
                     init: tuple[dict, RunningMeanStd | None] | None) -> tuple[RunningMeanStd | None, bool]:
    """(observation normaliser, whether training goes on fitting it). A starting policy's weights
    only make sense on the inputs it learned on, so its normaliser, or its lack of one, wins over
    `norm_obs`: with `norm_obs` false its statistics are kept frozen (they were dropped, and the
    fine-tuned policy saw raw observations it never learned on); a policy trained without one keeps
    reading raw observations (a fresh normaliser fitted under it changed every input at once)."""
    if init is None:
        return (RunningMeanStd((obs_dim,)) if cfg.norm_obs else None), cfg.norm_obs
    if init[1] is None:
        return None, False
    return RunningMeanStd.from_dict(init[1].to_dict()), cfg.norm_obs


def train(cfg: PPOConfig, make_envs: Callable[[int, int], object], out_dir: str | Path | None = None,
          resume: bool = False, progress: bool = True,
          on_update: Callable[[int, LstmActorCritic, RunningMeanStd | None], bool | None] | None = None,
          init: tuple[dict, RunningMeanStd | None] | None = None, carry: dict | None = None) -> TrainResult:
    """Train an LSTM actor-critic. `make_envs(num_envs, seed)` builds the vector env.
    `on_update(update, net, obs_rms)` may return True to stop early. `init`: (network state
    dict, observation normaliser) of a policy to start from (fine-tuning) instead of scratch.
    `carry`: the caller's lists and dicts (e.g. its evaluations) saved with every checkpoint and
    refilled in place on `resume`. Without `resume`, `out_dir` must not hold an earlier run."""
    cfg.validate()
    out = Path(out_dir) if out_dir else None
    if out:
        if not resume:
            refuse_existing_run(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "train_config.json").write_text(json.dumps(cfg.to_dict(), indent=2))

    # ---- seeding and devices -------------------------------------------------------------
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.set_num_threads(max(1, cfg.torch_threads))
    device = pick_device(cfg.device)
    sample_gen = torch.Generator().manual_seed(cfg.seed + 1)  # minibatch order
    sample_rng = np.random.default_rng(cfg.seed + 2)  # actions during rollouts

    ckpt_path = out / CHECKPOINT_FILE if out else None
    # read before the envs start: a bad file is a clear error, not a JVM started for nothing
    ck = read_checkpoint(ckpt_path, device) if resume and ckpt_path and ckpt_path.exists() else None
    envs = make_envs(cfg.num_envs, cfg.seed)
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    nvec = action_nvec(envs.single_action_space)
    discrete = isinstance(envs.single_action_space, spaces.Discrete)

    net = LstmActorCritic(obs_dim, nvec, cfg.lstm_hidden).to(device)
    if init is not None:
        net.load_state_dict(init[0])
    elif cfg.initial_noop_prob > 0:
        # no-op: action 0 of a Discrete space (the paper's "nothing"), 1 (keep) of each per-type dim
        net.bias_towards((0,) if discrete else (1,) * len(nvec), cfg.initial_noop_prob)
    # on CPU the parameters live in one buffer (see flat_params); on GPUs cuDNN wants its own layout
    flat = FlatParams(net) if device.type == "cpu" else None
    opt = optim.Adam([flat.param] if flat else net.parameters(), lr=cfg.learning_rate, eps=1e-5, fused=True)
    obs_rms, fit_obs = start_normaliser(cfg, obs_dim, init)
    ret_rms = RunningMeanStd(()) if cfg.norm_reward else None
    start_update, global_step = 0, 0

    if ck is not None:
        try:
            net.load_state_dict(ck["model"])
            opt.load_state_dict(flat.optimizer_state_from_per_parameter(ck["optimizer"]) if flat else ck["optimizer"])
        except (RuntimeError, ValueError, KeyError, IndexError) as exc:
            if hasattr(envs, "close"):
                envs.close()
            raise ValueError(f"{ckpt_path}: written by a run with another network, observation or action space, "
                             f"or on CPU and resumed on a GPU ({_one_line(exc)})") from None
        start_update, global_step = ck["update"], ck["global_step"]
        obs_rms = RunningMeanStd.from_dict(ck["obs_rms"]) if ck.get("obs_rms") else obs_rms
        ret_rms = RunningMeanStd.from_dict(ck["ret_rms"]) if ck.get("ret_rms") else ret_rms
        torch.set_rng_state(ck["torch_rng"])
        sample_gen.set_state(ck["sample_rng"])
        if ck.get("action_rng"):
            sample_rng.bit_generator.state = ck["action_rng"]
        if carry is not None:
            restore_carry(carry, ck.get("carry") or {})
        if ck.get("workload_sampler") is not None and hasattr(envs, "seek_sampler"):
            try:
                envs.seek_sampler(ck["workload_sampler"])
            except ValueError as exc:
                if hasattr(envs, "close"):
                    envs.close()
                raise ValueError(f"{ckpt_path}: {exc}") from None
    if resume and out:
        trim_logs(out, start_update, global_step)

    logger = TrainLogger(out)
    buf = RolloutBuffer(cfg.num_steps, cfg.num_envs, obs_dim, len(nvec), cfg.lstm_hidden, device)
    policy = RolloutPolicy(net, sample_rng)

    def norm_obs(o: np.ndarray) -> np.ndarray:
        o = np.asarray(o, dtype=np.float32)
        if obs_rms is not None:
            o = np.clip((o - obs_rms.mean) / np.sqrt(obs_rms.var + 1e-8), -10, 10).astype(np.float32)
        return o

    def fresh_start(seed: int | None):
        """Reset envs, zero LSTM states, every env at an episode start."""
        obs, _ = envs.reset(seed=seed)
        zeros = np.zeros((cfg.num_envs, cfg.lstm_hidden), dtype=np.float32)
        return obs, zeros, zeros.copy(), np.ones(cfg.num_envs, dtype=np.float32)

    # ---- the loop ------------------------------------------------------------------------
    bar, interrupted = None, False
    try:
        raw_obs, h, c, episode_start = fresh_start(cfg.seed + 1000 * start_update)
        disc_return = np.zeros(cfg.num_envs)  # for reward scaling
        ep_return = np.zeros(cfg.num_envs)
        ep_len = np.zeros(cfg.num_envs, dtype=np.int64)
        ep_vm_cost = np.zeros(cfg.num_envs)
        ep_wait = np.zeros(cfg.num_envs)
        episodes: list[dict] = []
        discarded = 0  # rollouts thrown away because a rollout worker died
        started = time.perf_counter()
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=cfg.num_updates * cfg.batch_size, initial=start_update * cfg.batch_size,
                       unit="step", desc="training", dynamic_ncols=True)

        for update in range(start_update, cfg.num_updates):
            t_update = time.perf_counter()
            if cfg.anneal_lr:
                opt.param_groups[0]["lr"] = cfg.learning_rate * (1.0 - update / cfg.num_updates)

            # -- collect a rollout (NumPy forward with the current weights) -----------------------
            policy.sync(net)
            for attempt in range(MAX_ROLLOUT_ATTEMPTS + 1):
                at_start = (global_step, obs_rms.to_dict() if obs_rms else None, ret_rms.to_dict() if ret_rms else None)
                ended: list[dict] = []  # logged once the rollout is kept: a discarded one's steps are run again
                try:
                    for t in range(cfg.num_steps):
                        if fit_obs:
                            obs_rms.update(np.asarray(raw_obs, dtype=np.float64))
                        obs = norm_obs(raw_obs)
                        action, logprob, value, new_h, new_c = policy.step(obs, h, c, episode_start)
                        raw_obs, reward, term, trunc, info = envs.step(action[:, 0] if discrete else action)
                        global_step += cfg.num_envs
                        reward = np.asarray(reward, dtype=np.float64)
                        done = np.logical_or(term, trunc)

                        # episode statistics in the environment's own units (before any scaling)
                        ep_return += reward
                        ep_len += 1
                        ep_vm_cost += step_values(info, done, "vm_cost")
                        ep_wait += step_values(info, done, "wait_penalty")
                        if done.any():
                            for i in np.nonzero(done)[0]:
                                row = {"global_step": global_step, "return": ep_return[i], "length": int(ep_len[i]),
                                       "vm_cost": ep_vm_cost[i], "wait_penalty": ep_wait[i], "terminated": bool(term[i])}
                                ended.append(row)
                                ep_return[i] = ep_len[i] = ep_vm_cost[i] = ep_wait[i] = 0

                        # reward scaling by the running std of the discounted return (as VecNormalize)
                        if ret_rms is not None:
                            disc_return = disc_return * cfg.gamma + reward
                            ret_rms.update(disc_return)
                            reward = np.clip(reward / np.sqrt(ret_rms.var + 1e-8), -cfg.reward_clip, cfg.reward_clip)
                            disc_return[done] = 0.0
                        reward = reward.astype(np.float32)

                        # truncation is not termination: bootstrap from the real final observation
                        # (not where the episode also terminated, which Gymnasium allows in one step)
                        cut = np.logical_and(trunc, np.logical_not(term))
                        if cut.any():
                            idx = np.nonzero(cut)[0]
                            final = norm_obs(np.asarray(info["final_obs"])[idx])
                            v_final = policy.value(final, new_h[idx], new_c[idx], np.zeros(len(idx), dtype=np.float32))
                            reward[idx] += cfg.gamma * v_final

                        buf.add(t, obs, action, logprob, reward, value, episode_start, (h, c))
                        h, c = new_h, new_c
                        episode_start = done.astype(np.float32)

                    episodes.extend(ended)
                    for row in ended:
                        logger.episode(row)
                    break
                except RolloutWorkerLost as exc:
                    # a rollout worker died: nothing of this rollout is kept, not even what the
                    # normalisers saw; it is collected again from reset envs
                    if attempt == MAX_ROLLOUT_ATTEMPTS:
                        raise RuntimeError(f"update {update + 1}: {attempt + 1} rollouts in a row lost a worker") from exc
                    discarded += 1
                    global_step = at_start[0]
                    obs_rms = RunningMeanStd.from_dict(at_start[1]) if at_start[1] else None
                    ret_rms = RunningMeanStd.from_dict(at_start[2]) if at_start[2] else None
                    # unseeded: a seeded reset rewinds a workload sampler to the run's start
                    # (CloudSimVectorEnv), so the retry replayed the first workloads, already
                    # trained on; unseeded, the envs go on with their own seed and workload streams
                    raw_obs, h, c, episode_start = fresh_start(None)
                    for acc in (disc_return, ep_return, ep_len, ep_vm_cost, ep_wait):
                        acc[:] = 0

            next_value = policy.value(norm_obs(raw_obs), h, c, episode_start)
            buf.finish(next_value, episode_start, cfg.gamma, cfg.gae_lambda)

            # -- learn from it: epochs over minibatches of BPTT chunks ---------------------------
            stats = ppo_update(net, opt, buf, cfg, sample_gen, flat)
            check_finite(update + 1, stats, net)

            # -- log, checkpoint, callbacks ------------------------------------------------------
            y_pred, y_true = buf.values.ravel(), buf.returns.ravel()
            var_y = np.var(y_true)
            recent = episodes[-20:]
            elapsed = time.perf_counter() - started
            row = {
                "update": update + 1,
                "episodes": len(episodes),
                "episode_return": float(np.mean([e["return"] for e in recent])) if recent else float("nan"),
                "episode_length": float(np.mean([e["length"] for e in recent])) if recent else float("nan"),
                "episode_vm_cost": float(np.mean([e["vm_cost"] for e in recent])) if recent else float("nan"),
                "episode_wait_penalty": float(np.mean([e["wait_penalty"] for e in recent])) if recent else float("nan"),
                **{k: float(np.mean(v)) for k, v in stats.items()},
                "explained_variance": float(1 - np.var(y_true - y_pred) / var_y) if var_y > 0 else float("nan"),
                "learning_rate": opt.param_groups[0]["lr"],
                "steps_per_second": cfg.batch_size / (time.perf_counter() - t_update),
                "rollouts_discarded": discarded,
                "wall_seconds": elapsed,
            }
            logger.log(global_step, row)
            if bar:
                bar.update(cfg.batch_size)
                bar.set_postfix(ret=f"{row['episode_return']:.2f}", len=f"{row['episode_length']:.0f}")
            # the callback first, so that the checkpoint holds what it recorded for this update
            stop = on_update is not None and on_update(update + 1, net, obs_rms)
            if ckpt_path and ((update + 1) % cfg.checkpoint_every == 0 or update + 1 == cfg.num_updates):
                save_checkpoint(ckpt_path, {
                    "model": net.state_dict(), "optimizer": opt.state_dict(), "update": update + 1,
                    "global_step": global_step, "obs_rms": obs_rms.to_dict() if obs_rms else None,
                    "ret_rms": ret_rms.to_dict() if ret_rms else None, "torch_rng": torch.get_rng_state(),
                    "sample_rng": sample_gen.get_state(),
                    "action_rng": sample_rng.bit_generator.state, "config": cfg.to_dict(), "carry": carry,
                    "workload_sampler": envs.sampler_position() if hasattr(envs, "sampler_position") else None})
            if stop:
                break
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:  # whatever ends the run (a lost worker too often, a NaN): its JVMs and logs are closed
        if bar:
            bar.close()
        logger.close()
        # not after Ctrl-C: it may have cut a call to the JVM half-way, and closing over that
        # connection can wait for an answer that never comes; the JVMs exit with this process
        if hasattr(envs, "close") and not interrupted:
            envs.close()
    return TrainResult(net=net, obs_rms=obs_rms, global_step=global_step, episodes=episodes,
                       history=logger.rows, wall_seconds=time.perf_counter() - started)
