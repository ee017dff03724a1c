"""Train C2MARL on Oversub Gym (Alg. 1), log every episode (CSV + TensorBoard when available), and
save the greedy policy.

    samm train --problem oversubscription --setting azure --alpha 0.95 --episodes 1800 --out DIR
    python -m agents.oversubscription.train --setting tiny --episodes 50 --out /tmp/c2

Training episodes replay the training weekdays (`train_usage="logged"`, the paper), the same
requests with usage redrawn from the training days' Gaussians (`"redrawn"`: what the test protocol
of L369 does to the held-apart days), or, the default, those redrawn days with their VMs resampled
with replacement (`"bootstrap"`, ours: `bootstrap_vms`). Only training days are ever used, except by
`"generated"`. Also ours, each measured in docs/oversubscription.md ("Where the held-apart gap comes
from"): `"resampled"` (deployments resampled and moved by whole days, usage redrawn afterwards, so
copies are not perfectly correlated: `Trace.train_resampled`), `"resampled-mix"` (plus per-subscriber
volume factors) and `"generated"` (other weeks from the same generator: more data than the paper's).
"""
from __future__ import annotations

import argparse
import copy
import csv
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch

from agents.train_log import TrainingDiverged, refuse_existing_run, tensorboard_writer

from .c2marl import (DUAL_ESTIMATES, C2Marl, C2MarlConfig, EpisodeLog, anchor_level, check_budget_margin,
                     run_training_episode)
from .features import observation, observation_size, request_mask
from .metrics import satisfied, summarise
from .network import VOTES, C2MarlEnsemble
from .policy import OversubPolicy
from .settings import ACTIONS, RATE_GRIDS, SETTINGS, Setting, get_setting
from .sim import OversubSim, run_episode


ENSEMBLE_EVERY = 100           # ours: the checkpoints of session 53's study, 100 episodes apart
VALIDATION_EPISODES = 40       # ours: 2.5 % steps of PM-Hot-R, 11-15 s per checkpoint (internal-like, measured);
                               # 160 ranked the checkpoints no better (docs/oversubscription.md, session 52)
VALIDATION_SEED0 = 90_000      # ours: usage seeds of the validation episodes (the test's start at 50,000)


def validation_episodes(trace, n: int, warm: bool):
    """The validation week's blocks in turn, usage redrawn with seeds VALIDATION_SEED0 + i; drawn one
    at a time (an internal-like episode is ~20 MB)."""
    return (trace.validation_workload(i, VALIDATION_SEED0 + i, warm=warm) for i in range(n))


def train(setting: str | Setting = "azure", cfg: C2MarlConfig | None = None, *, trace_seed: int = 0,
          warm: bool = False, train_usage: str = "bootstrap", out: str | Path | None = None,
          progress: bool = True, workload_fn=None, trace=None, validate_every: int = 0,
          validate_episodes: int = VALIDATION_EPISODES, validate_from: int | None = None,
          shield_prior: np.ndarray | None = None, ensemble: int = 0, ensemble_every: int = ENSEMBLE_EVERY,
          ensemble_vote: str = "median", tuned_anchor: dict | None = None,
          ) -> tuple[OversubPolicy, list[EpisodeLog]]:
    """`shield_prior`: the shield's usage history when `workload_fn` replaces the trace (else the
    trace's training days replayed, as the baselines' prior).

    `validate_every` > 0 (ours; the paper keeps the last weights): from episode `validate_from`
    (default: where epsilon reaches its floor) and every `validate_every` episodes after, and at the
    end, the greedy policy is rolled out on `validate_episodes` episodes of the validation week
    (`Trace.validation_workload`: the week before training, never a test week) and the checkpoint
    `choose_checkpoint` prefers is returned and saved to `out`; the last weights go to
    `out/last-policy`, every validated checkpoint to `out/checkpoints/episode-E`. The roll-outs draw
    nothing from the training's random streams, so the last weights are those of the same run
    without validation.

    `ensemble` = K > 0 (ours, exclusive with validation): the weights of the last episode and of every
    `ensemble_every` episodes before it, K in all, act together as a C2MarlEnsemble voting per agent by
    `ensemble_vote`; that policy is returned and saved to `out`, the last weights to `out/last-policy`.
    Snapshots are copies of the net, so training is the same as without.

    `tuned_anchor`: the headroom action's anchor already tuned at `cfg.alpha` (`anchor_spec`'s record),
    so that runs of one level share one tuning (the experiment's seeds); only with `action="headroom"`
    and a tuned `anchor`, and only the rule that anchor names."""
    setting = get_setting(setting)
    cfg = cfg or C2MarlConfig()
    torch.set_num_threads(max(1, cfg.torch_threads))
    if validate_every < 0 or validate_episodes < 1:
        raise ValueError("validate_every must be >= 0 and validate_episodes >= 1")
    snapshot_at = ensemble_episodes(cfg.episodes, ensemble, ensemble_every, ensemble_vote)
    if snapshot_at and validate_every:
        raise ValueError("ensemble and validate_every are exclusive: an ensemble keeps the last snapshots")
    snapshots: list[tuple[int, torch.nn.Module]] = []
    if validate_from is None:
        validate_from = max(1, int(np.ceil(cfg.eps_decay_frac * cfg.episodes)))
    if validate_every and validate_from > cfg.episodes:   # else no checkpoint is validated, in silence
        raise ValueError(f"validate_from ({validate_from}) is after the last episode ({cfg.episodes}): "
                         "nothing would be validated")
    needs_prior = (cfg.shield != "none" or cfg.action == "headroom") and shield_prior is None
    tunes_anchor = cfg.action == "headroom" and parse_anchor(cfg.anchor) is None
    if tuned_anchor is not None and not tunes_anchor:
        raise ValueError("tuned_anchor is for action='headroom' with a tuned anchor")
    if tuned_anchor is not None and anchor_rule(cfg.anchor) not in ("best", tuned_anchor.get("rule")):
        raise ValueError(f"tuned_anchor is a {tuned_anchor.get('rule')} anchor; anchor {cfg.anchor!r} tunes another rule")
    if trace is None and (workload_fn is None or validate_every or needs_prior or tunes_anchor):
        from .data import generate_trace
        trace = generate_trace(setting, trace_seed)
    if workload_fn is None:
        if train_usage == "logged":
            fixed = trace.train_workload(warm=warm)
            workload_fn = lambda ep: fixed  # noqa: E731
        elif train_usage == "redrawn":
            workload_fn = lambda ep: trace.train_redrawn(cfg.seed * 100_003 + ep, warm=warm)  # noqa: E731
        elif train_usage in ("bootstrap", "bootstrap-volume"):
            volume = VOLUME_RANGE if train_usage == "bootstrap-volume" else (1.0, 1.0)

            def workload_fn(ep):
                w = trace.train_redrawn(cfg.seed * 100_003 + ep, warm=warm)
                return bootstrap_vms(w, np.random.default_rng([cfg.seed, ep]), volume)
        elif train_usage in ("resampled", "resampled-volume", "resampled-mix"):
            volume = VOLUME_RANGE if train_usage == "resampled-volume" else (1.0, 1.0)
            mix = MIX_RANGE if train_usage == "resampled-mix" else None
            workload_fn = lambda ep: trace.train_resampled(cfg.seed * 100_003 + ep, warm=warm, volume=volume,  # noqa: E731
                                                           mix=mix)
        elif train_usage == "generated":
            workload_fn = generated_weeks(setting, trace_seed, cfg.seed, warm)
        else:
            raise ValueError(f"train_usage must be one of {TRAIN_USAGES}, not {train_usage!r}")
    shield, values, anchor = make_shield(setting, cfg, trace, warm, shield_prior, tuned_anchor)
    agent = C2Marl(setting.n_subscribers, observation_size(setting, cfg.features, shield is not None), cfg,
                   constraint_bound(setting, cfg), values)
    obs_fn = lambda v, floor: observation(v, setting, cfg.features, floor)  # noqa: E731
    logs: list[EpisodeLog] = []
    writer = tensorboard_writer(out)
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=cfg.episodes, unit="ep", file=sys.stderr, mininterval=1.0, desc=f"c2marl {setting.name} a={cfg.alpha}")
    sim_cache: dict[int, OversubSim] = {}
    training = {"config": cfg.to_json(), "trace_seed": trace_seed, "warm": warm, "train_usage": train_usage,
                "episodes": cfg.episodes, **({"anchor": anchor} if anchor else {})}
    validation: list[dict] = []
    chosen: OversubPolicy | None = None
    start = time.perf_counter()
    for ep in range(cfg.episodes):
        w = workload_fn(ep)
        sim = sim_cache.get(id(w))
        if sim is None:
            sim = OversubSim(setting, w, warm_start=warm)
            if train_usage == "logged":
                sim_cache[id(w)] = sim
        log = run_training_episode(agent, sim, setting, ep, obs_fn, request_mask, shield)
        check_finite(agent, log)
        logs.append(log)
        if out is not None:     # row by row, so that an interrupted run keeps its log (rewritten at the end)
            _append_row(asdict(log), Path(out) / "train-log.csv")
        if writer is not None:
            for k in ("reward", "s_cores", "hot_cluster_steps", "max_pm_hot_steps", "lam", "loss", "epsilon"):
                writer.add_scalar(f"train/{k}", getattr(log, k), ep)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(s_cores=f"{log.s_cores:.3f}", hot=log.hot_cluster_steps, lam=f"{agent.lam:.2f}")
        done = ep + 1
        if done in snapshot_at:
            snapshots.append((done, copy.deepcopy(agent.net).eval()))
        if validate_every and done >= validate_from and (
                (done - validate_from) % validate_every == 0 or done == cfg.episodes):
            candidate = OversubPolicy(copy.deepcopy(agent.net), setting, features=cfg.features,
                                      shield=copy.deepcopy(shield), rates=agent.action_values)
            t0 = time.perf_counter()
            m = evaluate_policy(candidate.rates, setting, validation_episodes(trace, validate_episodes, warm),
                                warm=warm)
            row = {"episode": done, "pm_hot_r": m["pm_hot_r"], "c_hot_r": m["c_hot_r"], "s_cores": m["s_cores"],
                   "satisfied": satisfied(m["pm_hot_r"], cfg.alpha), "lam": agent.lam,
                   "seconds": round(time.perf_counter() - t0, 2)}
            validation.append(row)
            if choose_checkpoint(validation, cfg.alpha) == len(validation) - 1:
                chosen = candidate
            if out is not None:     # every validated checkpoint, to test or re-choose afterwards
                candidate.training = {**training, "seconds": time.perf_counter() - start, "checkpoint": "episode",
                                      "checkpoint_episode": done}
                candidate.save(checkpoint_dir(out, done))
            if writer is not None:
                for k in ("pm_hot_r", "s_cores"):
                    writer.add_scalar(f"validation/{k}", row[k], ep)
    if bar is not None:
        bar.close()
    elapsed = time.perf_counter() - start
    training.update(seconds=elapsed, final_lambda=agent.lam, constraint_bound=agent.c)
    last = OversubPolicy(copy.deepcopy(agent.net), setting, features=cfg.features, shield=shield,
                         rates=agent.action_values,
                         training={**training, "checkpoint": "last", "checkpoint_episode": cfg.episodes})
    policy = last
    if chosen is not None:
        best = validation[choose_checkpoint(validation, cfg.alpha)]
        chosen.training = {**training, "checkpoint": "validation", "checkpoint_episode": best["episode"],
                           "validation": {"every": validate_every, "episodes": validate_episodes,
                                          "from": validate_from, "seed0": VALIDATION_SEED0, "history": validation}}
        policy = chosen
    if snapshots:
        policy = OversubPolicy(C2MarlEnsemble([net for _, net in snapshots], ensemble_vote), setting,
                               features=cfg.features, shield=shield, rates=agent.action_values,
                               training={**training, "checkpoint": "ensemble", "checkpoint_episode": cfg.episodes,
                                         "ensemble": {"episodes": [e for e, _ in snapshots], "vote": ensemble_vote}})
    if out is not None:
        out = Path(out)
        policy.save(out)
        if policy is not last:
            last.save(out / "last-policy")
        if validation:
            _write_rows(validation, out / "validation.csv")
        write_log(logs, out / "train-log.csv")
    if writer is not None:
        writer.close()
    return policy, logs


def check_finite(agent: C2Marl, log: EpisodeLog) -> None:
    """Stop before a NaN or inf reaches a checkpoint or the saved policy (whose argmax of NaN Q
    values would pick one rate for every VM): a learning rate far too large diverges this way."""
    bad = [k for k in ("loss", "lam") if not np.isfinite(getattr(log, k))]
    bad += [name for name, p in agent.net.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        raise TrainingDiverged(f"episode {log.episode + 1}: {bad[0]} is not finite (NaN or inf); training stopped "
                               "without saving it (lower --lr or --dual-lr)")


#: what a run writes into its --out: one there means an earlier run, whose policy and logs a new
#: one would replace, and whose checkpoints and last-policy it would leave beside its own
RUN_FILES = ("metadata.json", "weights.pt", "train-log.csv", "validation.csv", "last-policy", "checkpoints", "tb")


def check_options(args) -> None:
    """The numbers a run needs to mean anything, each refused with its flag (an --episodes of 0 or
    fewer trained nothing and failed on the empty log; an --alpha outside (0, 1) trained to an
    impossible or negative budget)."""
    finite = lambda v: v is None or 0.0 < v < float("inf")  # noqa: E731
    for flag, value, ok, want in (("--episodes", args.episodes, args.episodes is None or args.episodes >= 1, ">= 1"),
                                  ("--alpha", args.alpha, 0.0 < args.alpha < 1.0, "a safety level in (0, 1)"),
                                  ("--seed", args.seed, args.seed >= 0, ">= 0"),
                                  ("--trace-seed", args.trace_seed, args.trace_seed >= 0, ">= 0"),
                                  ("--lr", args.lr, finite(args.lr), "a positive number"),
                                  ("--dual-lr", args.dual_lr, args.dual_lr is None or 0.0 <= args.dual_lr < float("inf"),
                                   "a number >= 0")):
        if not ok:
            raise ValueError(f"{flag} must be {want}, not {value}")


def check_out(out: Path) -> None:
    """--out made and proved writable before training: a file there (or above it) or a folder that
    cannot be made failed with a traceback, at the TensorBoard writer or the first log row."""
    from agents.report import writable_folder   # not prepare_out: it renames an experiment's files aside

    try:
        writable_folder(out)
    except OSError as exc:
        raise ValueError(f"--out: {exc}") from None


def checkpoint_dir(out: str | Path, episode: int) -> Path:
    """Where a `--validate-every` run saves the weights of `episode`."""
    return Path(out) / "checkpoints" / f"episode-{episode}"


def saved_checkpoints(out: str | Path) -> list[tuple[int, Path]]:
    """(episode, folder) of every checkpoint a run saved under `out`, in training order."""
    found = [(int(d.name.removeprefix("episode-")), d) for d in (Path(out) / "checkpoints").glob("episode-*")
             if d.name.removeprefix("episode-").isdigit()]
    return sorted(found)


def ensemble_episodes(episodes: int, k: int, every: int, how: str = "median") -> set[int]:
    """The episodes whose weights a K-member ensemble keeps: the last and every `every` before it."""
    if k < 0 or every < 1 or how not in VOTES:
        raise ValueError(f"ensemble must be >= 0, ensemble_every >= 1 and the vote one of {VOTES}")
    if k and (k - 1) * every >= episodes:
        raise ValueError(f"an ensemble of {k} snapshots {every} episodes apart needs more than "
                         f"{(k - 1) * every} episodes, not {episodes}")
    return {episodes - i * every for i in range(k)}


def choose_checkpoint(history: list[dict], alpha: float) -> int:
    """Index of the checkpoint to keep (ours): of those whose validation PM-Hot-R meets alpha's level,
    the one that saves most cores; when none does, the one that breaks PMs in fewest episodes, then
    the one that saves most. Ties go to the earlier checkpoint."""
    if not history:
        raise ValueError("no checkpoint was validated")
    def key(i):
        h = history[i]
        return (1, 0.0, h["s_cores"]) if satisfied(h["pm_hot_r"], alpha) else (0, -h["pm_hot_r"], h["s_cores"])
    return max(range(len(history)), key=lambda i: (key(i), -i))


def _append_row(row: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(row))
        if fh.tell() == 0:
            w.writeheader()
        w.writerow(row)


def _write_rows(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        if rows:        # an empty log leaves an empty file
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


def make_shield(setting: Setting, cfg: C2MarlConfig, trace, warm: bool, prior: np.ndarray | None = None,
                tuned_anchor: dict | None = None):
    """(shield or None, the agents' action values or None for the rates of `cfg.rates`, the anchor's
    record for the metadata or None): the configured shield (shield.py), or for `action="headroom"`
    the anchor's forecast and its headrooms. The prior is the training days replayed at rate 1, the same
    history the baselines start from. `tuned_anchor`: anchor_spec's result, when already known."""
    from .settings import HEADROOM_SCALES, check_action

    if check_action(cfg.action) == "headroom" and cfg.shield != "none":
        raise ValueError("the headroom action scales the N-sigma forecast; it takes no shield (shield='none')")
    if cfg.shield == "none" and cfg.action == "rate":
        return None, None, None
    if cfg.shield not in ("none", "nsigma"):
        raise ValueError(f"shield must be 'none' or 'nsigma', not {cfg.shield!r}")
    from .baselines import replay_usage_history
    from .shield import Shield, ShieldSpec

    if cfg.action == "rate":
        spec, values, record = ShieldSpec(headroom=cfg.shield_headroom), None, None
    else:
        record = dict(tuned_anchor or anchor_spec(setting, cfg, trace, warm))
        spec = ShieldSpec.from_record(record)
        values = tuple(round(record["headroom"] * k, 6) for k in HEADROOM_SCALES)
    if prior is None:
        prior = replay_usage_history(setting, trace.train_workload(warm=warm), warm=warm)
    return Shield(spec, setting.n_subscribers, prior), values, record


ANCHOR_TUNE_EPISODES = 20    # the experiment's tuning budget (experiment.Budget.tune_episodes), seed 0 as there


#: `C2MarlConfig.anchor` values that tune the anchor on the training days: "tuned" is N-sigma's (the
#: first anchor, kept as the default); "tuned:best" tunes all three and keeps the one that is safe
#: there and saves most (ours: the agent then scales the best production predictor of its own days)
TUNED_ANCHORS = {"tuned": "NSigma", "tuned:NSigma": "NSigma", "tuned:Percentile": "Percentile",
                 "tuned:Max": "Max", "tuned:best": "best"}
ANCHOR_FORMS = "tuned[:NSigma|:Percentile|:Max|:best] or N,WINDOW,HEADROOM"


def anchor_rule(text: str) -> str:
    """The rule `C2MarlConfig.anchor` anchors on: NSigma, Percentile, Max, or best (of the three)."""
    return TUNED_ANCHORS.get(str(text)) or ("NSigma" if parse_anchor(text) is not None else "")


def parse_anchor(text: str) -> tuple[float, int, float] | None:
    """`C2MarlConfig.anchor`: None for a tuned anchor (TUNED_ANCHORS), else (n, window, headroom) of a
    given N-sigma anchor from "N,WINDOW,HEADROOM"."""
    if text in TUNED_ANCHORS:
        return None
    try:
        n, window, headroom = (p.strip() for p in str(text).split(","))
        out = float(n), int(window), float(headroom)
    except ValueError:
        raise ValueError(f"anchor must be {ANCHOR_FORMS}, not {text!r}") from None
    if out[0] < 0 or out[1] < 1 or not out[2] > 0:
        raise ValueError(f"anchor needs n >= 0, window >= 1 and headroom > 0, not {text!r}")
    return out


def anchor_spec(setting: Setting, cfg: C2MarlConfig, trace, warm: bool, tuned: dict | None = None) -> dict:
    """The headroom action's anchor as a record {"rule", its parameters, "headroom", "source"}: given
    (N-sigma), or tuned on the training days at the run's alpha exactly as the experiment tunes that
    baseline (tuning.tune, same grid, episodes and seed), so the tuned rule is the agent's middle
    action. "tuned:best" tunes N-sigma, Percentile and Max and keeps the safe one with the most
    S-Cores on those days (the first of equals; if none is safe, N-sigma's); "candidates" records each.
    `tuned`: rule name -> tuning.TuneResult already found at cfg.alpha on the same training episodes
    (the experiment's baselines at 0.95, `ANCHOR_TUNE_EPISODES` of them, seed 0), used instead of
    tuning those rules again; the record is the same either way. With cfg.anchor_margin F > 1 the
    rules are tuned at the stricter level 1 - (1 - alpha) / F, with cfg.anchor_tuned_at at that level
    (`tuned` must then be of that level), recorded as "tuned_at" when it is not alpha."""
    given = parse_anchor(cfg.anchor)
    if given is not None and (anchor_level(cfg) != cfg.alpha or cfg.anchor_tuned_at is not None):
        raise ValueError("anchor_margin and anchor_tuned_at tune the anchor; a given anchor ('N,WINDOW,HEADROOM') "
                         "takes neither")
    if given is not None:
        n, window, headroom = given
        return {"rule": "NSigma", "n": n, "window": window, "headroom": headroom, "source": "given"}
    if trace is None:
        raise ValueError("a tuned anchor needs the trace's training days (pass trace, or anchor='N,WINDOW,HEADROOM')")
    from .shield import ANCHOR_RULES
    from .tuning import tune

    wanted = anchor_rule(cfg.anchor)
    names = tuple(ANCHOR_RULES) if wanted == "best" else (wanted,)
    level = anchor_level(cfg)
    tuned = tuned or {}
    results = {name: tuned[name] if name in tuned else
               tune(name, setting, trace, level, episodes=ANCHOR_TUNE_EPISODES, seed=0, warm=warm)
               for name in names}
    safe = [name for name in names if results[name].safe]
    name = max(safe, key=lambda k: results[k].metrics["s_cores"]) if safe else names[0]
    res = results[name]
    record = {"rule": name, **_typed(res.params), "source": "tuned" if res.safe else "tuned (none safe)"}
    if level != cfg.alpha:   # only then, so the records of runs tuned at alpha stay as they were
        record["tuned_at"] = level
    if wanted == "best":
        record["candidates"] = {k: {"safe": bool(r.safe), "s_cores": round(float(r.metrics["s_cores"]), 4)}
                                for k, r in results.items()}
    return record


def _typed(params: dict) -> dict:
    return {k: int(v) if k == "window" else float(v) for k, v in params.items()}


def bootstrap_vms(workload, rng: np.random.Generator, volume: tuple[float, float] = (1.0, 1.0)):
    """The training days' VMs resampled with replacement (ours): every episode keeps each
    subscriber's hours, sizes and usage statistics but packs a different mix, so the agents cannot
    memorise one request sequence (measured: trained on the one sequence, PM-Hot-R was 0.1 on
    training days and 0.6-1.0 on held-apart days). `volume`: the episode draws U(volume) times
    as many VMs as the days held (`train_usage="bootstrap-volume"`): other weeks bring other
    volumes (azure, trace seed 0: the held-apart blocks peak at 0.62 and 0.76 of the cluster,
    the training block at 0.63)."""
    # no draw for the plain bootstrap, so its episodes stay those of earlier runs with the same seed
    n = int(round(workload.n_vms * rng.uniform(*volume))) if volume != (1.0, 1.0) else workload.n_vms
    rows = np.sort(rng.integers(0, workload.n_vms, size=n))
    return workload.subset(rows, name=workload.name + "+bootstrap")


GENERATED_SEED0, GENERATED_POOL = 1000, 50   # ours: the generator traces `generated` trains on


def generated_weeks(setting: Setting, trace_seed: int, seed: int, warm: bool, pool: int = GENERATED_POOL):
    """`train_usage="generated"` (ours, NOT the paper's data budget): episode e replays the training
    weekdays of another trace from the same generator (seeds GENERATED_SEED0 + e mod `pool`, never
    the evaluation trace's), usage redrawn. It asks whether the held-apart gap is one of data: the
    paper trains on one week; this gives the agents `pool` weeks."""
    from .data import generate_trace

    traces: dict[int, object] = {}
    seeds = [GENERATED_SEED0 + k for k in range(pool) if GENERATED_SEED0 + k != trace_seed]

    def workload_fn(ep):
        k = seeds[ep % len(seeds)]
        if k not in traces:
            traces[k] = generate_trace(setting, k, weeks=1)
        return traces[k].train_redrawn(seed * 100_003 + ep, warm=warm)
    return workload_fn


TRAIN_USAGES = ("logged", "redrawn", "bootstrap", "bootstrap-volume", "resampled", "resampled-volume", "resampled-mix",
                "generated")
MIX_RANGE = (0.5, 2.0)      # ours: per-subscriber volume factors, log-uniform (Trace.train_resampled)
VOLUME_RANGE = (0.85, 1.3)  # ours: spans the held-apart blocks' peaks relative to the training block's


def constraint_bound(setting: Setting, cfg: C2MarlConfig) -> float:
    """c of Eq. 8 and 11, the budget divided by `budget_margin` (1: the paper's)."""
    margin = check_budget_margin(cfg.budget_margin)
    if cfg.constraint in ("pm", "attributed"):
        return (1.0 - cfg.alpha) / setting.episode_steps / margin
    if cfg.constraint == "cluster":
        return setting.constraint_bound(cfg.alpha) / margin
    raise ValueError(f"constraint must be 'cluster', 'pm' or 'attributed', not {cfg.constraint!r}")


def write_log(logs: list[EpisodeLog], path: Path) -> None:
    _write_rows([asdict(log) for log in logs], path)


def roll_out(rates_fn, setting: Setting, workloads, warm: bool = False):
    """Greedy roll-outs of `rates_fn(view) -> [N]`, one EpisodeRecord per workload, as they run."""
    for w in workloads:
        yield run_episode(OversubSim(setting, w, warm_start=warm), rates_fn)


def evaluate_policy(rates_fn, setting: Setting, workloads, warm: bool = False) -> dict:
    """Greedy roll-outs of `rates_fn(view) -> [N]` over `workloads`; the paper's metrics."""
    return summarise(list(roll_out(rates_fn, setting, workloads, warm)), setting.delta_steps)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Train C2MARL (oversubscription) on Oversub Gym.")
    p.add_argument("--setting", default="azure", choices=sorted(SETTINGS))
    p.add_argument("--alpha", type=float, default=0.95)
    p.add_argument("--episodes", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--trace-seed", type=int, default=0)
    p.add_argument("--warm", action="store_true")
    p.add_argument("--train-usage", choices=TRAIN_USAGES, default="bootstrap",
                   help="how training episodes are drawn (module docstring); bootstrap-volume: 0.85-1.3x the "
                        "training days' VMs; resampled: deployments resampled and day-shifted, usage redrawn "
                        "after; resampled-mix: plus per-subscriber volumes; generated: other generator weeks")
    p.add_argument("--features", choices=("paper", "usage"), default="usage",
                   help="paper: the paper's state; usage: plus each subscriber's recent usage (ours)")
    p.add_argument("--constraint", choices=("cluster", "pm", "attributed"), default="attributed",
                   help="cluster: the paper's per-step cluster bound; pm: ours, PMs breaking their own bound")
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--dual-lr", type=float, default=None)
    p.add_argument("--dual-estimate", choices=DUAL_ESTIMATES, default=None,
                   help="U of the dual update: broken PMs per episode, or the largest per-PM break share "
                        "over the last --dual-window episodes (ours)")
    p.add_argument("--dual-window", type=int, default=None)
    p.add_argument("--budget-margin", type=float, default=None, metavar="F",
                   help="ours: train to (1 - alpha) / F of the budget; the level alpha, and every verdict on it, "
                        "stays (default 1, the paper's)")
    p.add_argument("--shield", choices=("none", "nsigma"), default="none",
                   help="nsigma (ours): floor every rate at the N-sigma rule's with --shield-headroom; the agent "
                        "sees the floor and may only reserve more")
    p.add_argument("--shield-headroom", type=float, default=None)
    p.add_argument("--rates", choices=sorted(RATE_GRIDS), default=None,
                   help="the agents' action set: paper (default, §6.2's 0.2-0.6 and 1) or tenths (ours: adds 0.7, "
                        "0.8 and 0.9)")
    p.add_argument("--action", choices=ACTIONS, default="rate",
                   help="rate: each agent picks a rate from --rates (the paper); headroom (ours): a multiple "
                        "(5/6 ... 4/3) of the anchor's headroom over the anchor's forecast of its subscriber's usage")
    p.add_argument("--anchor", default="tuned", metavar=ANCHOR_FORMS.replace(" or ", "|"),
                   help="the headroom action's anchor: N-sigma tuned on the training days at --alpha as the "
                        "baseline is (tuned, the default), the percentile or max predictor tuned so "
                        "(tuned:Percentile, tuned:Max), the one of the three that saves most there while safe "
                        "(tuned:best), or N-sigma given")
    p.add_argument("--anchor-margin", type=float, default=None, metavar="F",
                   help="ours: tune the anchor to (1 - alpha) / F of the budget on the training days, the level "
                        "alpha and every verdict on it unchanged (default 1: tuned at alpha, as the baselines)")
    p.add_argument("--anchor-tuned-at", type=float, default=None, metavar="LEVEL",
                   help="ours: tune the anchor at this safety level on the training days instead of --alpha (e.g. "
                        "0.85 under 0.95 agents: a looser rule, the agents held to --alpha); excludes --anchor-margin")
    p.add_argument("--updates-per-episode", type=int, default=None,
                   help=f"gradient updates after each episode (K of Alg. 1; default {C2MarlConfig.updates_per_episode})")
    p.add_argument("--hidden", type=int, default=None,
                   help=f"hidden units of the Q networks (default {C2MarlConfig.hidden})")
    p.add_argument("--eps-decay-frac", type=float, default=None,
                   help=f"share of the episodes over which epsilon decays (default {C2MarlConfig.eps_decay_frac})")
    p.add_argument("--threads", type=int, default=None,
                   help=f"torch threads (default {C2MarlConfig.torch_threads}); 1 and 2 gave the same weights on our "
                        "machine (docs/oversubscription.md), only the time changed")
    p.add_argument("--validate-every", type=int, default=0, metavar="N",
                   help="ours: from --validate-from on, every N episodes and at the end, roll the greedy policy "
                        "out on the validation week (the week before training, never a test week) and keep the "
                        "checkpoint that meets alpha's level there and saves most (else breaks fewest PMs); "
                        "--out gets it, --out/last-policy the last weights; 0 = keep the last (the paper). Measured on "
                        "the internal-like setting: that week ranks checkpoints no better than chance "
                        "(docs/oversubscription.md)")
    p.add_argument("--validate-episodes", type=int, default=VALIDATION_EPISODES, metavar="K")
    p.add_argument("--validate-from", type=int, default=None, metavar="E",
                   help="first episode validated (default: where epsilon reaches its floor)")
    p.add_argument("--ensemble", type=int, default=0, metavar="K",
                   help="ours: the last weights and those of every --ensemble-every episodes before them, K in "
                        "all, act together, each agent voting by --ensemble-vote; --out gets that policy, "
                        "--out/last-policy the last weights; 0 = the last weights alone (the paper). Measured on "
                        "six internal-like 0.95 runs in docs/oversubscription.md (snapshot ensembles)")
    p.add_argument("--ensemble-every", type=int, default=ENSEMBLE_EVERY, metavar="N")
    p.add_argument("--ensemble-vote", choices=VOTES, default="median",
                   help="median: the members' median rate; upper-quartile: their 75th-percentile rate (the 4th of 5); "
                        "mean-q: argmax of their mean Q; max: the safest rate")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    try:
        check_options(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.validate_every < 0 or args.validate_episodes < 1 or (args.validate_from is not None
                                                                  and args.validate_from < 1):
        print("error: --validate-every must be >= 0, --validate-episodes and --validate-from >= 1", file=sys.stderr)
        return 2
    if args.ensemble and args.validate_every:
        print("error: --ensemble and --validate-every are exclusive", file=sys.stderr)
        return 2
    for flag, value, ok in (("--ensemble", args.ensemble, lambda v: v >= 0),
                            ("--ensemble-every", args.ensemble_every, lambda v: v >= 1),
                            ("--updates-per-episode", args.updates_per_episode, lambda v: v >= 1),
                            # 0 kept every episode (a [-0:] slice), -k dropped the first k: NaN lambda
                            ("--dual-window", args.dual_window, lambda v: v >= 1),
                            ("--hidden", args.hidden, lambda v: v >= 1),
                            ("--eps-decay-frac", args.eps_decay_frac, lambda v: 0.0 < v <= 1.0),
                            ("--threads", args.threads, lambda v: v >= 1),
                            ("--budget-margin", args.budget_margin, lambda v: v >= 1.0),
                            ("--anchor-margin", args.anchor_margin, lambda v: v >= 1.0),
                            ("--anchor-tuned-at", args.anchor_tuned_at, lambda v: 0.0 < v < 1.0),
                            ("--shield-headroom", args.shield_headroom, lambda v: 0.0 < v < float("inf"))):
        if value is not None and not ok(value):
            print(f"error: {flag} out of range: {value}", file=sys.stderr)
            return 2
    if args.shield_headroom is not None and args.shield != "nsigma":   # else dropped in silence
        print("error: --shield-headroom is the nsigma shield's headroom: it needs --shield nsigma", file=sys.stderr)
        return 2
    try:
        parse_anchor(args.anchor)
    except ValueError as e:
        print(f"error: --anchor: {e}", file=sys.stderr)
        return 2
    try:   # the one rule for the anchor's level: refuses a margin and a level given together
        anchor_level(C2MarlConfig(anchor_margin=args.anchor_margin or 1.0, anchor_tuned_at=args.anchor_tuned_at))
    except ValueError as e:
        print(f"error: --anchor-margin / --anchor-tuned-at: {e}", file=sys.stderr)
        return 2
    if (args.anchor_margin not in (None, 1.0) or args.anchor_tuned_at is not None) and (
            args.action != "headroom" or parse_anchor(args.anchor)):
        print("error: --anchor-margin and --anchor-tuned-at tune the headroom action's anchor: they need "
              "--action headroom and a tuned --anchor", file=sys.stderr)
        return 2
    if args.action == "headroom" and args.shield != "none":
        print("error: --action headroom takes no --shield (it scales the N-sigma forecast itself)", file=sys.stderr)
        return 2
    cfg = C2MarlConfig(alpha=args.alpha, seed=args.seed, constraint=args.constraint, features=args.features,
                       shield=args.shield, action=args.action, anchor=args.anchor)
    changes = {k: v for k, v in (("episodes", args.episodes), ("lr", args.lr), ("dual_lr", args.dual_lr),
                                 ("dual_estimate", args.dual_estimate), ("dual_window", args.dual_window),
                                 ("budget_margin", args.budget_margin), ("anchor_margin", args.anchor_margin),
                                 ("anchor_tuned_at", args.anchor_tuned_at),
                                 ("shield_headroom", args.shield_headroom),
                                 ("updates_per_episode", args.updates_per_episode), ("hidden", args.hidden),
                                 ("eps_decay_frac", args.eps_decay_frac), ("torch_threads", args.threads),
                                 ("rates", args.rates))
               if v is not None}
    cfg = replace(cfg, **changes)
    try:
        ensemble_episodes(cfg.episodes, args.ensemble, args.ensemble_every, args.ensemble_vote)
    except ValueError as e:
        print(f"error: --ensemble: {e}", file=sys.stderr)
        return 2
    try:
        if args.out is not None:    # last, so that a bad option is named first
            refuse_existing_run(Path(args.out), RUN_FILES)
            check_out(Path(args.out))
        policy, logs = train(args.setting, cfg, trace_seed=args.trace_seed, warm=args.warm,
                             train_usage=args.train_usage, out=args.out, progress=not args.quiet,
                             validate_every=args.validate_every, validate_episodes=args.validate_episodes,
                             validate_from=args.validate_from, ensemble=args.ensemble,
                             ensemble_every=args.ensemble_every, ensemble_vote=args.ensemble_vote)
    except ValueError as e:     # the networks diverged, or a setting the trainer refuses: nothing was saved
        print(f"error: {e}", file=sys.stderr)
        return 1 if isinstance(e, TrainingDiverged) else 2
    if policy.training.get("checkpoint") == "validation":
        h = {r["episode"]: r for r in policy.training["validation"]["history"]}[policy.training["checkpoint_episode"]]
        print(f"kept the checkpoint of episode {h['episode']}: validation PM-Hot-R {h['pm_hot_r']:.3f}, "
              f"S-Cores {h['s_cores']:.3f}")
    if policy.training.get("anchor"):
        from .shield import anchor_words

        print(f"headroom action over {anchor_words(policy.training['anchor'])}; headrooms "
              f"{', '.join(f'{h:.3g}' for h in policy.action_values)}")
    if policy.training.get("checkpoint") == "ensemble":
        e = policy.training["ensemble"]
        print(f"kept an ensemble ({e['vote']} vote) of the weights of episodes {', '.join(map(str, e['episodes']))}")
    last = logs[-20:]
    print(f"last 20 episodes: S-Cores {np.mean([l.s_cores for l in last]):.3f}, hot-cluster steps "
          f"{np.mean([l.hot_cluster_steps for l in last]):.2f}, lambda {logs[-1].lam:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
