"""Gymnasium environments over the CloudSim Plus gateway.

`CloudSimEnv` is one simulation; `CloudSimVectorEnv` steps N of them in ONE Py4J round trip.
Both turn the gateway's raw snapshots into the paper's seven metrics with the shared analyzer
(`samm.analyze`), so the daemon and the simulator observe the world the same way.

Reward per step (`reward="cost"`, the paper's) = -(VM cost of the interval) - penalty × waiting
job-seconds of the interval. `reward="waste"` charges only what a policy can avoid: the VM cost
of the interval minus its busy core-seconds at the cheapest price per core-second, plus the work
thrown away by removals at that price, plus the waiting penalty. Over a whole episode the two
returns differ by a constant of the workload (its work at that price), so they rank policies
alike; but with discounting, `cost` pays a policy for postponing work (a job run later is
cheaper in discounted terms), which on long real-trace jobs taught the agent to leave work
queued, and `waste` does not.

Either may be divided by the episode's workload's reference cost (`reward_scale="work"`: the
work's core-hours at the cheapest price per core-hour, the cost of a perfectly packed fleet that
never idles), so that workloads whose costs differ by orders of magnitude weigh alike.
`terminated` when every job has finished; `truncated` at `config.max_steps`.

Observations are a named feature set (`samm.analyze.features`): `paper` (the seven metrics) or
`extended`. `CloudSimVectorEnv(..., sampler=...)` draws a new workload for every episode of every
env from a workload distribution (`sim_bridge.workloads.mix`).
"""
from __future__ import annotations

import copy
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from samm.analyze import OBSERVATION_NAMES, compute_metrics
from samm.analyze.features import compute_features, feature_bounds, feature_set, validate_feature_names
from samm.analyze.metrics import allocated_cores
from samm.plan.liveness import guard_head_of_line

from .actions import action_masks, action_names, action_space, to_deltas
from .batch import (H_BUSY_CORE_S, H_FINISHED, H_LOST_CORE_S, H_REQUEUED, H_RUNNING_JOBS, H_STEP, H_WAITING,
                    SimBatch, SimStep)
from .config import SimConfig
from .gateway import Gateway
from .workloads import SwfTransform, Workload, load_workload

SEED_SPACE = 2**62


def _as_config(config: SimConfig | dict | None) -> SimConfig:
    if config is None:
        return SimConfig()
    if isinstance(config, SimConfig):
        return config
    return SimConfig.model_validate(config)


def _as_workload(workload: str | Workload, config: SimConfig, swf: SwfTransform | dict | None) -> Workload:
    if isinstance(workload, Workload):
        return workload
    transform = SwfTransform.model_validate(swf) if isinstance(swf, dict) else swf
    return load_workload(workload, transform, core_cap=config.job_core_cap)


def check_render_mode(render_mode) -> None:
    """`gym.make(id, render_mode=None)` passes the argument on to the env (Gymnasium's API);
    these envs draw nothing, so only None is accepted."""
    if render_mode is not None:
        raise ValueError(f"render_mode {render_mode!r} is not supported: this environment does not render")


def _seed_value(seed, per_env: bool = False) -> int:
    """A seed as a Python int >= 0 (< 2**63 for a per-env seed, which the simulator takes as a
    Java long): a float was truncated silently, a negative seed or a per-env one of 2**63 and
    more failed deep in NumPy with a message naming no seed."""
    if isinstance(seed, np.ndarray) and seed.ndim == 0:
        seed = seed.item()
    top = 2**63 if per_env else float("inf")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) < top:
        where = "in [0, 2**63)" if per_env else ">= 0"
        raise ValueError(f"a seed must be a whole number {where}, got {seed!r}")
    return int(seed)


def _sampler_state(sampler) -> tuple[str, Any] | None:
    """What rewinds a workload sampler: the state of its NumPy generator (`rng`, as the mix's and
    the windows' samplers keep theirs), else a copy of the whole sampler."""
    if sampler is None:
        return None
    rng = getattr(sampler, "rng", None)
    if isinstance(rng, np.random.Generator):
        return "rng", copy.deepcopy(rng.bit_generator.state)
    return "copy", copy.deepcopy(sampler)


REWARD_SCALES = ("none", "work")
REWARD_KINDS = ("cost", "waste")


def observation_space(names=OBSERVATION_NAMES) -> spaces.Box:
    bounds = np.array([feature_bounds(n) for n in names], dtype=np.float32)
    return spaces.Box(bounds[:, 0], bounds[:, 1], shape=(len(names),), dtype=np.float32)


def feature_names_of(features: str | tuple | list, config: SimConfig) -> tuple[str, ...]:
    """A feature set's name (`paper`, `extended`) or explicit feature names."""
    from samm.analyze import FleetSpec

    fleet = FleetSpec.from_vm_types(config.vm_types)
    if isinstance(features, str):
        return feature_set(features, fleet)
    names = tuple(features)
    # checked here, before a batch exists: a typo failed only at the first reset (a batch already
    # built in the JVM) and an empty tuple was an IndexError of the observation space
    if not names:
        raise ValueError("features must name at least one feature (or a set: paper, extended)")
    validate_feature_names(names, fleet)
    return names


def cheapest_core_second(config: SimConfig) -> float:
    return min(t.price_per_hour / t.cores for t in config.vm_types) / 3600.0


def reference_cost(workload: Workload, config: SimConfig) -> float:
    """The work's core-hours at the cheapest price per core-hour: what a fleet that is always
    fully busy would cost (a lower bound on any policy's VM cost, ignoring boot time)."""
    return max(workload.core_seconds(config.host_mips) * cheapest_core_second(config), 1e-6)


class StepDecoder:
    """Turns decoded snapshots into observations, rewards and infos (shared by both envs)."""

    def __init__(self, config: SimConfig, batch: SimBatch, features=OBSERVATION_NAMES):
        self.config = config
        self.fleet = batch.fleet
        self.names = action_names(config.action_mode, self.fleet.names)
        self.features = tuple(features)

    def observations(self, s: SimStep) -> np.ndarray:
        metrics = compute_metrics(s.raw, self.fleet, warmup_s=self.config.warmup_s)
        if self.features == OBSERVATION_NAMES:
            return metrics
        obs = compute_features(s.raw, self.fleet, self.features, self.config.warmup_s, metrics=metrics,
                               step_seconds=self.config.step_seconds)
        # the simulator always knows every counter; NaN here would be a bridge bug
        return np.nan_to_num(obs, nan=0.0)

    def rewards(self, s: SimStep) -> np.ndarray:
        return -(s.vm_cost + self.config.penalty_per_job_second * s.wait_job_seconds)

    def masks(self, s: SimStep) -> np.ndarray:
        return action_masks(self.config.action_mode, s.can_add, s.can_remove, s.in_cooldown)

    def info(self, s: SimStep, i: int, mask: np.ndarray) -> dict[str, Any]:
        h = s.header[i]
        return {
            "vm_cost": float(s.vm_cost[i]),
            "wait_penalty": float(self.config.penalty_per_job_second * s.wait_job_seconds[i]),
            "wait_job_seconds": float(s.wait_job_seconds[i]),
            "vm_running": s.running[i].copy(),
            "vm_booting": s.booting[i].copy(),
            "allocated_cores": int(allocated_cores(s.raw, self.fleet)[i]),
            "queue_length": int(h[H_WAITING]),
            "jobs_running": int(h[H_RUNNING_JOBS]),
            "jobs_finished": int(h[H_FINISHED]),
            "jobs_requeued": int(h[H_REQUEUED]),
            "action_applied": bool(s.applied[i]),
            "in_cooldown": bool(s.in_cooldown[i]),
            "action_mask": mask[i],
            "clock_s": float(s.clock_s[i]),
            "step": int(h[H_STEP]),
        }


class CloudSimEnv(gym.Env):
    """The paper's heterogeneous autoscaling problem as one Gymnasium environment."""

    metadata = {"render_modes": []}

    def __init__(self, config: SimConfig | dict | None = None, workload: str | Workload = "seed-1551",
                 swf: SwfTransform | dict | None = None, gateway: Gateway | None = None,
                 features: str | tuple = "paper", render_mode: str | None = None):
        check_render_mode(render_mode)
        self.config = _as_config(config)
        self.workload = _as_workload(workload, self.config, swf)
        self.observation_names = feature_names_of(features, self.config)
        self.observation_space = observation_space(self.observation_names)
        self.action_space = action_space(self.config.action_mode, self.config.n_types)
        self._gateway = gateway
        self._batch: SimBatch | None = None
        self._decoder: StepDecoder | None = None
        self._needs_reset = True
        self._last: SimStep | None = None

    @property
    def batch(self) -> SimBatch:
        if self._batch is None:
            self._batch = SimBatch(self.config, self.workload, 1, gateway=self._gateway)
            self._decoder = StepDecoder(self.config, self._batch, self.observation_names)
        return self._batch

    @property
    def action_names(self) -> list[str]:
        return action_names(self.config.action_mode, tuple(t.name for t in self.config.vm_types))

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        sim_seed = int(self.np_random.integers(SEED_SPACE))
        s = self.batch.reset([0], [sim_seed])
        self._last = s
        self._needs_reset = False
        return self._emit(s)[0], self._emit_info(s)

    def step(self, action):
        if self._needs_reset:
            raise RuntimeError("call reset() before step() (and after an episode ends)")
        deltas = to_deltas(self.config.action_mode, np.asarray(action)[None], self.config.n_types)
        if self.config.liveness_guard and self._last is not None:
            deltas, _ = guard_head_of_line(deltas, self._last.raw, self._decoder.fleet)
        s = self.batch.step(deltas)
        self._last = s
        obs = self._emit(s)[0]
        reward = float(self._decoder.rewards(s)[0])
        terminated = bool(s.terminated[0])
        truncated = (not terminated) and int(s.header[0, H_STEP]) >= self.config.max_steps
        if terminated or truncated:
            self._needs_reset = True
        return obs, reward, terminated, truncated, self._emit_info(s)

    def _emit(self, s: SimStep) -> np.ndarray:
        return self._decoder.observations(s)

    def _emit_info(self, s: SimStep) -> dict[str, Any]:
        return self._decoder.info(s, 0, self._decoder.masks(s))

    def job_stats(self) -> np.ndarray:
        # `self.batch` would build a fresh batch in the JVM for a closed env (left there until GC)
        # only for the JVM to answer "env 0 was never reset"
        if self._batch is None:
            raise RuntimeError("call reset() before job_stats(): this environment has no episode "
                               "(never reset, or closed)")
        return self._batch.job_stats(0)

    def close(self) -> None:
        # a step after close would otherwise build a fresh, never-reset batch behind the caller's back
        self._needs_reset = True
        if self._batch is not None:
            self._batch.close()
            self._batch = None


class CloudSimVectorEnv(VectorEnv):
    """N simulations stepped together; autoreset in the SAME step.

    When an env terminates or truncates, its final observation and info are returned in
    ``info["final_obs"]`` / ``info["final_info"]`` (masked by ``info["_final_obs"]``; the final
    info's keys by ``_<key>``) and the returned observation and the rest of the info are already
    the first ones of its next episode (its reset's), as Gymnasium's SAME_STEP mode has it: no
    wasted transition to mask out, and truncation can be bootstrapped from the real final
    observation. A seeded `reset` replays a fresh env's episodes for that seed, workloads drawn
    by a sampler included.
    """

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}

    def __init__(self, num_envs: int = 8, config: SimConfig | dict | None = None,
                 workload: str | Workload = "seed-1551", swf: SwfTransform | dict | None = None,
                 gateway: Gateway | None = None, features: str | tuple = "paper", sampler=None,
                 reward_scale: str = "none", reward: str = "cost", batch_factory=None,
                 render_mode: str | None = None):
        """`sampler`: anything with `sample() -> Workload` (a workload distribution's sampler);
        each env then replays a fresh sample every episode, drawn in reset order (so a seeded
        sampler makes the whole run reproducible). `workload` is only the first placeholder.
        `batch_factory(config, workload, n_envs)`: where the simulations run (default: a
        `SimBatch` on `gateway`; `sim_bridge.ray_batch.RaySimBatch` spreads them over Ray
        rollout workers). Seeds, workloads and the analyzer stay here, so the same seeds give
        the same episodes wherever the simulations run."""
        check_render_mode(render_mode)
        if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
            raise ValueError(f"num_envs must be a whole number >= 1, got {num_envs!r}")
        if reward_scale not in REWARD_SCALES:
            raise ValueError(f"reward_scale must be one of {REWARD_SCALES}, got {reward_scale!r}")
        if reward not in REWARD_KINDS:
            raise ValueError(f"reward must be one of {REWARD_KINDS}, got {reward!r}")
        self.reward = reward
        self.config = _as_config(config)
        self.sampler = sampler
        self._sampler_start = _sampler_state(sampler)  # before its first draw: a seeded reset rewinds to it
        self.workload = sampler.sample() if sampler is not None else _as_workload(workload, self.config, swf)
        self.num_envs = int(num_envs)
        self.observation_names = feature_names_of(features, self.config)
        self.single_observation_space = observation_space(self.observation_names)
        self.single_action_space = action_space(self.config.action_mode, self.config.n_types)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.batch = (batch_factory(self.config, self.workload, self.num_envs) if batch_factory is not None
                      else SimBatch(self.config, self.workload, self.num_envs, gateway=gateway))
        self._decoder = StepDecoder(self.config, self.batch, self.observation_names)
        self._rng = np.random.default_rng()
        self.reward_scale = reward_scale
        self._scale = np.full(self.num_envs, self._scale_of(self.workload))
        self._lost = np.zeros(self.num_envs)  # lost core-seconds so far, per env (the header's is a total)
        self._last_raw = None  # the snapshot the next decisions are taken on (for the liveness guard)
        self._first_reset = True

    def _rewards(self, s: SimStep) -> np.ndarray:
        r = self._decoder.rewards(s)
        if self.reward == "waste":
            price = cheapest_core_second(self.config)
            lost = s.header[:, H_LOST_CORE_S]
            r = r + price * (s.header[:, H_BUSY_CORE_S] - (lost - self._lost))
            self._lost = lost.copy()
        return r * self._scale

    def _scale_of(self, workload: Workload) -> float:
        return 1.0 / reference_cost(workload, self.config) if self.reward_scale == "work" else 1.0

    def _new_workloads(self, envs) -> None:
        """Before a reset: the sampler's next workloads for these envs (the first reset of env 0
        keeps the workload drawn at construction)."""
        if self.sampler is None:
            return
        for i in envs:
            if self._first_reset and i == 0:
                continue
            w = self.sampler.sample()
            self.batch.set_workload(int(i), w)
            self._scale[i] = self._scale_of(w)
        self._first_reset = False

    def _rewind_sampler(self) -> None:
        """A seeded reset replays the episodes of a fresh env reset with that seed, workloads too:
        the sampler went on from where the last episodes left it, so the same seed gave other
        workloads. Its stream goes back to where it stood at construction, and every env draws
        again (env 0 the construction's workload, as a fresh env's first reset keeps it)."""
        if self.sampler is None or self._first_reset:  # nothing drawn since construction's sample
            return
        kind, state = self._sampler_start
        if kind == "rng":
            self.sampler.rng.bit_generator.state = state
        else:
            self.sampler = copy.deepcopy(state)

    def sampler_position(self):
        """Where the workload sampler stands now (None without one): a training checkpoint keeps it,
        so that a resumed run draws the workloads the interrupted one had not reached."""
        return _sampler_state(self.sampler)

    def seek_sampler(self, position) -> None:
        """Go on from a `sampler_position`: it becomes what a seeded reset rewinds to, and at the
        next reset every env draws from it, env 0 too (a resumed run replayed the run's first
        workloads: a fresh env's seeded reset rewinds to construction)."""
        if self.sampler is None or position is None:
            return
        kind, state = position
        if kind == "rng" and not isinstance(getattr(self.sampler, "rng", None), np.random.Generator):
            raise ValueError("the checkpoint's workload sampler is not this run's (it kept a generator's state)")
        self._sampler_start = (kind, copy.deepcopy(state))
        self._first_reset = False
        self._rewind_sampler()

    @property
    def workload_names(self) -> list[str]:
        return [w.name for w in self.batch.workloads]

    def _draw_seeds(self, n: int) -> np.ndarray:
        return self._rng.integers(SEED_SPACE, size=n, dtype=np.int64)

    def reset(self, *, seed: int | list[int] | None = None, options: dict | None = None):
        if isinstance(seed, (list, tuple)) or (isinstance(seed, np.ndarray) and seed.ndim > 0):
            if len(seed) != self.num_envs:
                raise ValueError(f"expected {self.num_envs} seeds, got {len(seed)}")
            seeds = np.array([_seed_value(x, per_env=True) for x in seed], dtype=np.int64)
            # later autoresets draw from a stream fixed by the given seeds
            self._rng = np.random.default_rng([int(x) % SEED_SPACE for x in seeds])
        else:
            if seed is not None:
                self._rng = np.random.default_rng(_seed_value(seed))
            seeds = self._draw_seeds(self.num_envs)
        if seed is not None:
            self._rewind_sampler()
        self._new_workloads(range(self.num_envs))
        s = self.batch.reset(np.arange(self.num_envs), seeds)
        self._lost[:] = 0.0
        self._last_raw = s.raw
        obs = self._decoder.observations(s)
        return obs, self._infos(s)

    def step(self, actions):
        deltas = to_deltas(self.config.action_mode, actions, self.config.n_types, n_envs=self.num_envs)
        if self.config.liveness_guard and self._last_raw is not None:
            deltas, _ = guard_head_of_line(deltas, self._last_raw, self._decoder.fleet)
        s = self.batch.step(deltas)
        self._last_raw = s.raw
        obs = self._decoder.observations(s)
        rewards = self._rewards(s)
        terminated = s.terminated.copy()
        truncated = (~terminated) & (s.header[:, H_STEP] >= self.config.max_steps)
        infos = self._infos(s)
        done = terminated | truncated
        if np.any(done):
            idx = np.nonzero(done)[0]
            final_obs = np.zeros_like(obs)
            final_obs[idx] = obs[idx]
            # the ended episodes' last info, with Gymnasium's per-key masks (only those rows are theirs)
            final_info = {**infos, **{f"_{k}": done.copy() for k in infos}}
            self._new_workloads(idx)
            r = self.batch.reset(idx, self._draw_seeds(len(idx)))
            self._lost[idx] = 0.0
            self._last_raw = self._last_raw.with_rows(idx, r.raw)
            obs[idx] = self._decoder.observations(r)
            # as Gymnasium's SAME_STEP mode: the info beside the new episode's first observation is
            # its reset info (it was the ended step's, but for the mask: a step count of max_steps,
            # the last VMs and queue, beside an observation of a fresh fleet)
            for k, v in self._infos(r).items():
                infos[k] = infos[k].copy()
                infos[k][idx] = v
            infos.update(final_obs=final_obs, _final_obs=done.copy(), final_info=final_info,
                         _final_info=done.copy())
        return obs, rewards, terminated, truncated, infos

    def _infos(self, s: SimStep) -> dict[str, Any]:
        mask = self._decoder.masks(s)
        return {
            # the single env's keys, one row per env
            "vm_cost": s.vm_cost.copy(),
            "wait_penalty": self.config.penalty_per_job_second * s.wait_job_seconds,
            "wait_job_seconds": s.wait_job_seconds.astype(np.float64),
            "vm_running": s.running.copy(),
            "vm_booting": s.booting.copy(),
            "allocated_cores": allocated_cores(s.raw, self._decoder.fleet).astype(np.int64),
            "queue_length": s.header[:, H_WAITING].astype(np.int64),
            "jobs_running": s.header[:, H_RUNNING_JOBS].astype(np.int64),
            "jobs_finished": s.header[:, H_FINISHED].astype(np.int64),
            "jobs_requeued": s.header[:, H_REQUEUED].astype(np.int64),
            "action_applied": s.applied.copy(),
            "in_cooldown": s.in_cooldown.astype(bool),
            "action_mask": mask,
            "clock_s": s.clock_s.astype(np.float64),
            "step": s.header[:, H_STEP].astype(np.int64),
        }

    def close_extras(self, **kwargs) -> None:
        self.batch.close()
