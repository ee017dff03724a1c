"""Train the LSTM-PPO agent in the CloudSim Plus simulation and save it as a policy directory.

Two ways to train:

* on one workload (`workload`, the paper's set-up: `seed-1551`); the saved snapshot is the one
  with the lowest mean cost on `eval_seeds`;
* on a workload distribution (`sampler_factory`, e.g. `WorkloadMix.sampler`): every episode of
  every env replays a fresh sample. The saved snapshot is then the one with the lowest geometric
  mean, over a fixed `validation` set of training-split workloads, of its cost relative to a
  reference rule's cost on the same workload (an unfinished job makes a workload count as
  `UNFINISHED_RATIO`), the quantity the generalisation suite reports.

`init_policy` starts from a saved policy (fine-tuning on a user's own trace).
"""
from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from sim_bridge.config import SimConfig
from sim_bridge.envs import CloudSimVectorEnv, feature_names_of
from sim_bridge.runner import run_episodes
from sim_bridge.workloads import Workload

from .ppo.agent import LstmPpoAgent
from .ppo.config import PPOConfig
from .ppo.normalize import RunningMeanStd
from .ppo.train import train

POLICY_SUBDIR = "policy"
UNFINISHED_RATIO = 10.0
VALIDATION_MAX_STEPS = 5000
# Seeds of the streams that draw validation workloads: apart from training's (the PPO seed).
VALIDATION_SEED = 424242
# The reference rule of the validation score: the queue rule with its seed-1551-tuned
# parameters (docs/benchmarks.md). Only the ranking of snapshots depends on it.
REFERENCE_RULE = ("queue", {"jobs_per_core": 1.5, "stabilization_steps": 5})


@dataclass
class Validation:
    """Fixed training-split workloads, the reference rule's cost on each, and the seed."""

    workloads: list[Workload]
    reference_costs: list[float]
    seed: int = 101
    reference: str = "queue"

    def score(self, episodes: list[dict]) -> float:
        ratios = []
        for e, ref in zip(episodes, self.reference_costs):
            done = e["jobs_finished"] == e["jobs_total"]
            ratios.append(e["total_cost"] / max(ref, 1e-9) if done else UNFINISHED_RATIO)
        return float(np.exp(np.mean(np.log(ratios))))


def make_validation(sim: SimConfig, workloads: list[Workload], reference_agent, seed: int = 101,
                    reference: str = "queue") -> Validation:
    episodes = run_episodes(sim, workloads, reference_agent, [seed] * len(workloads), max_steps=VALIDATION_MAX_STEPS)
    return Validation(workloads, [float(e["total_cost"]) for e in episodes], seed, reference)


# Training on a mix: half the samples' earliest possible end is past 416 steps (docs/workloads.md),
# so episodes are cut at 600 (bootstrapped), not the paper set-up's 400.
MIX_PPO_DEFAULTS = {"max_episode_steps": 600}
# Fine-tuning on windows of one real trace (6-24 h at one-minute steps, as they are): whole
# windows fit, and a smaller step size keeps the shipped policy's behaviour as the start.
FINE_TUNE_PPO_DEFAULTS = {"max_episode_steps": 1800, "learning_rate": 3e-4}


@dataclass
class TrainingPlan:
    """What one `samm train` run trains on, with the defaults each case wants."""

    workload: Workload  # the one workload, or the first placeholder of a sampled run
    features: str | tuple
    reward: str
    reward_scale: str
    sampler_factory: Callable[[SimConfig, int], object] | None = None
    validation: Validation | None = None
    info: dict | None = None
    ppo_defaults: dict = field(default_factory=dict)  # PPOConfig fields this case sets unless given

    @classmethod
    def build(cls, sim: SimConfig, *, workload: str, workload_loader: Callable[[], Workload], mix_path=None,
              features=None, reward=None, reward_scale=None, init_policy=None, n_validation: int = 12,
              seed: int = 1) -> "TrainingPlan":
        """Three cases. A mix (`mix_path`: a YAML or `default`): every episode a fresh sample.
        Fine-tuning (`init_policy`) on an SWF trace: random windows of it as they are. Else the
        paper's set-up: one workload. Features default to the initial policy's, else `extended`
        for sampled runs and `paper` for the paper's set-up."""
        from sim_bridge.workloads import BUILTIN, seed_1551
        from sim_bridge.workloads.mix import WorkloadWindows, load_mix

        from .base import load_agent
        from .factory import make_agent
        from .ppo.agent import LstmPpoAgent

        if init_policy is not None and features is None:
            start = load_agent(init_policy)
            if isinstance(start, LstmPpoAgent):
                named = {feature_names_of(n, sim): n for n in ("paper", "extended")}
                features = named.get(tuple(start.feature_names), tuple(start.feature_names))
        reference = make_agent(REFERENCE_RULE[0], sim, REFERENCE_RULE[1])
        if mix_path is not None:
            mix = load_mix(None if mix_path == "default" else mix_path)
            validation = make_validation(sim, mix.sampler(sim, VALIDATION_SEED).sample_many(n_validation) + [seed_1551()],
                                         reference)
            return cls(seed_1551(), features or "extended", reward or "waste", reward_scale or "work",
                       sampler_factory=mix.sampler, validation=validation,
                       info={"workload_mix": mix.name, "workload_mix_yaml": mix.to_yaml()},
                       ppo_defaults=dict(MIX_PPO_DEFAULTS))
        wl = workload_loader()
        if init_policy is not None and str(workload) not in BUILTIN:
            windows = WorkloadWindows(wl, VALIDATION_SEED)
            validation = make_validation(sim, windows.sample_many(n_validation), reference)
            return cls(wl, features or "extended", reward or "waste", reward_scale or "work",
                       sampler_factory=lambda s, sd: WorkloadWindows(wl, sd), validation=validation,
                       info={"fine_tune_trace": wl.name, "fine_tune_digest": wl.digest(),
                             "fine_tune_last_arrival_s": float(wl.arrival_s[-1])},
                       ppo_defaults=dict(FINE_TUNE_PPO_DEFAULTS))
        return cls(wl, features or "paper", reward or "cost", reward_scale or "none")


def train_lstm_ppo(sim: SimConfig, workload: Workload, ppo: PPOConfig, out_dir: str | Path,
                   resume: bool = False, progress: bool = True, eval_seeds=(), command: str | None = None,
                   on_eval=None, features: str | tuple = "paper",
                   sampler_factory: Callable[[SimConfig, int], object] | None = None, reward_scale: str = "none",
                   reward: str = "cost",
                   validation: Validation | None = None, init_policy: str | Path | None = None,
                   training_info: dict | None = None, ray_address: str | None = None,
                   rollout_workers: int = 2) -> tuple[LstmPpoAgent, dict]:
    """Trains, saves `<out_dir>/policy` (the agent) and returns it with a summary. Training
    episodes are truncated at `ppo.max_episode_steps` (bootstrapped, not terminal).
    `ray_address` (`local`, `auto` or an address): the simulations run on `rollout_workers` Ray
    actors, each with its own JVM (`sim_bridge.ray_batch`); the learner stays here."""
    out = Path(out_dir)
    train_sim = sim.model_copy(update={"max_steps": ppo.max_episode_steps})
    type_names = tuple(t.name for t in sim.vm_types)
    names = feature_names_of(features, sim)
    init = None
    if init_policy is not None:
        from .base import load_agent

        start = load_agent(init_policy)
        if not isinstance(start, LstmPpoAgent):
            raise ValueError(f"{init_policy} holds a {start.kind!r} policy; only lstm-ppo policies can be fine-tuned")
        if tuple(start.feature_names) != names or start.action_mode != sim.action_mode:
            raise ValueError(f"{init_policy} reads {len(start.feature_names)} features in {start.action_mode!r} mode; "
                             f"this run trains on {len(names)} features in {sim.action_mode!r} mode (pass the same "
                             "--features and action mode as the policy was trained with)")
        if int(start.params.get("lstm_hidden", 128)) != ppo.lstm_hidden:
            raise ValueError(f"{init_policy} has an LSTM of {start.params.get('lstm_hidden')} cells, not {ppo.lstm_hidden}")
        init = (start.net.state_dict(), start.obs_rms)
    evals: list[dict] = []
    best: dict = {}

    batch_factory = None
    if ray_address is not None:
        from sim_bridge.ray_batch import connect, ray_batch_factory

        if not 1 <= rollout_workers <= ppo.num_envs:
            raise ValueError(f"--rollout-workers must be within [1, {ppo.num_envs}] (the envs), got {rollout_workers}")
        connect(ray_address)
        batch_factory = ray_batch_factory(rollout_workers)

    def make_envs(n: int, seed: int):
        sampler = sampler_factory(train_sim, seed) if sampler_factory else None
        return CloudSimVectorEnv(n, train_sim, workload, features=names, sampler=sampler, reward_scale=reward_scale,
                                 reward=reward, batch_factory=batch_factory)

    def snapshot_agent(net, obs_rms) -> LstmPpoAgent:
        return LstmPpoAgent(names, sim.action_mode, type_names, net=net, obs_rms=obs_rms,
                            params={"lstm_hidden": ppo.lstm_hidden})

    def on_update(update: int, net, obs_rms):
        if not ppo.eval_every or update % ppo.eval_every or not (eval_seeds or validation):
            return False
        from .evaluate import evaluate

        agent = snapshot_agent(net, obs_rms)
        if validation is not None:
            eps = run_episodes(sim, validation.workloads, agent, [validation.seed] * len(validation.workloads),
                               max_steps=VALIDATION_MAX_STEPS)
            row = {"update": update, "score": round(validation.score(eps), 5),
                   "score_kind": f"geomean cost ratio to {validation.reference}",
                   "jobs_finished_ratio": round(sum(e["jobs_finished"] for e in eps) / max(1, sum(e["jobs_total"] for e in eps)), 5)}
        else:
            res = evaluate(agent, sim, workload, eval_seeds)
            row = {"update": update, "total_cost": res["summary"]["total_cost"]["mean"],
                   # absent when no evaluation episode finished a job (an early policy that never adds a VM)
                   "makespan_s": res["summary"].get("makespan_s", {}).get("mean")}
            row["score"] = row["total_cost"]
        net.train()
        evals.append(row)
        if not best or row["score"] < best["score"]:
            # the normaliser keeps moving after this update: keep the statistics the snapshot
            # was evaluated with, or the saved policy is not the one that scored best
            best.update(row, state={k: v.detach().clone() for k, v in net.state_dict().items()},
                        obs_rms=None if obs_rms is None else RunningMeanStd.from_dict(obs_rms.to_dict()))
        return bool(on_eval and on_eval(row))

    # the evaluations and the best snapshot go with each checkpoint: a resumed run still picks
    # from all of them, and one resumed when already complete saves the same policy again
    result = train(ppo, make_envs, out, resume=resume, progress=progress, on_update=on_update, init=init,
                   carry={"evaluations": evals, "best": best})
    net, obs_rms = result.net, result.obs_rms
    if best:  # keep the best evaluated snapshot, not merely the last one
        net.load_state_dict(best["state"])
        obs_rms = best["obs_rms"]
    agent = LstmPpoAgent(
        names, sim.action_mode, type_names, net=net, obs_rms=obs_rms,
        params={"lstm_hidden": ppo.lstm_hidden},
        env_config_hash=sim.config_hash(),
        training={
            "command": command or " ".join(shlex.quote(a) for a in sys.argv),
            "workload": workload.name if sampler_factory is None else None,
            "workload_digest": workload.digest() if sampler_factory is None else None,
            "features": features if isinstance(features, str) else "custom",
            "reward_scale": reward_scale,
            "reward": reward,
            "init_policy": str(init_policy) if init_policy else None,
            "sim_config": sim.model_dump(mode="json"),
            "ppo": ppo.to_dict(),
            "global_step": result.global_step,
            "wall_seconds": round(result.wall_seconds, 1),
            "episodes": len(result.episodes),
            "evaluations": evals,
            "selected_update": best.get("update"),
            "rollout_workers": rollout_workers if ray_address is not None else 0,
            **(training_info or {}),
        },
    )
    agent.save(out / POLICY_SUBDIR)
    summary = {
        "global_step": result.global_step,
        "wall_seconds": round(result.wall_seconds, 1),
        "env_steps_per_second": round(result.global_step / max(result.wall_seconds, 1e-9), 1),
        "final_episode_return": float(np.mean([e["return"] for e in result.episodes[-20:]])) if result.episodes else None,
        "evaluations": evals,
        "selected_update": best.get("update"),
        "selected_score": best.get("score"),
        "rollout_workers": rollout_workers if ray_address is not None else 0,
        "rollouts_discarded": int(result.history[-1].get("rollouts_discarded", 0)) if result.history else 0,
        "policy_dir": str(out / POLICY_SUBDIR),
    }
    return agent, summary
