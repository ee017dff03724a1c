"""Gymnasium environments over the CloudSim Plus gateway.

`CloudSimEnv` is one simulation; `CloudSimVectorEnv` steps N of them in ONE Py4J round trip.
Both turn the gateway's raw snapshots into the paper's seven metrics with the shared analyzer
(`samm.analyze`), so the daemon and the simulator observe the world the same way.

Reward per step = -(VM cost of the interval) - penalty × waiting job-seconds of the interval.
`terminated` when every job has finished; `truncated` at `config.max_steps`.
"""
from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from samm.analyze import N_METRICS, OBSERVATION_NAMES, compute_metrics
from samm.analyze.metrics import allocated_cores

from .actions import action_masks, action_names, action_space, to_deltas
from .batch import H_FINISHED, H_REQUEUED, H_RUNNING_JOBS, H_STEP, H_WAITING, SimBatch, SimStep
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


def observation_space() -> spaces.Box:
    return spaces.Box(0.0, 1.0, shape=(N_METRICS,), dtype=np.float32)


class StepDecoder:
    """Turns decoded snapshots into observations, rewards and infos (shared by both envs)."""

    def __init__(self, config: SimConfig, batch: SimBatch):
        self.config = config
        self.fleet = batch.fleet
        self.names = action_names(config.action_mode, self.fleet.names)

    def observations(self, s: SimStep) -> np.ndarray:
        return compute_metrics(s.raw, self.fleet, warmup_s=self.config.warmup_s)

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
                 swf: SwfTransform | dict | None = None, gateway: Gateway | None = None):
        self.config = _as_config(config)
        self.workload = _as_workload(workload, self.config, swf)
        self.observation_space = observation_space()
        self.action_space = action_space(self.config.action_mode, self.config.n_types)
        self._gateway = gateway
        self._batch: SimBatch | None = None
        self._decoder: StepDecoder | None = None
        self._needs_reset = True
        self.observation_names = OBSERVATION_NAMES

    @property
    def batch(self) -> SimBatch:
        if self._batch is None:
            self._batch = SimBatch(self.config, self.workload, 1, gateway=self._gateway)
            self._decoder = StepDecoder(self.config, self._batch)
        return self._batch

    @property
    def action_names(self) -> list[str]:
        return action_names(self.config.action_mode, tuple(t.name for t in self.config.vm_types))

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        sim_seed = int(self.np_random.integers(SEED_SPACE))
        s = self.batch.reset([0], [sim_seed])
        self._needs_reset = False
        return self._emit(s)[0], self._emit_info(s)

    def step(self, action):
        if self._needs_reset:
            raise RuntimeError("call reset() before step() (and after an episode ends)")
        deltas = to_deltas(self.config.action_mode, np.asarray(action)[None], self.config.n_types)
        s = self.batch.step(deltas)
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
        return self.batch.job_stats(0)

    def close(self) -> None:
        if self._batch is not None:
            self._batch.close()
            self._batch = None


class CloudSimVectorEnv(VectorEnv):
    """N simulations stepped together; autoreset in the SAME step.

    When an env terminates or truncates, its final observation and info are returned in
    ``info["final_obs"]`` / ``info["final_info"]`` (masked by ``info["_final_obs"]``) and the
    returned observation is already the first one of its next episode: no wasted transition to
    mask out, and truncation can be bootstrapped from the real final observation.
    """

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}

    def __init__(self, num_envs: int = 8, config: SimConfig | dict | None = None,
                 workload: str | Workload = "seed-1551", swf: SwfTransform | dict | None = None,
                 gateway: Gateway | None = None):
        self.config = _as_config(config)
        self.workload = _as_workload(workload, self.config, swf)
        self.num_envs = int(num_envs)
        self.single_observation_space = observation_space()
        self.single_action_space = action_space(self.config.action_mode, self.config.n_types)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.batch = SimBatch(self.config, self.workload, self.num_envs, gateway=gateway)
        self._decoder = StepDecoder(self.config, self.batch)
        self._rng = np.random.default_rng()
        self.observation_names = OBSERVATION_NAMES

    def _draw_seeds(self, n: int) -> np.ndarray:
        return self._rng.integers(SEED_SPACE, size=n, dtype=np.int64)

    def reset(self, *, seed: int | list[int] | None = None, options: dict | None = None):
        if isinstance(seed, (list, tuple, np.ndarray)):
            if len(seed) != self.num_envs:
                raise ValueError(f"expected {self.num_envs} seeds, got {len(seed)}")
            seeds = np.array([int(x) for x in seed], dtype=np.int64)
            # later autoresets draw from a stream fixed by the given seeds
            self._rng = np.random.default_rng([int(x) % SEED_SPACE for x in seeds])
        else:
            if seed is not None:
                self._rng = np.random.default_rng(int(seed))
            seeds = self._draw_seeds(self.num_envs)
        s = self.batch.reset(np.arange(self.num_envs), seeds)
        obs = self._decoder.observations(s)
        return obs, self._infos(s)

    def step(self, actions):
        deltas = to_deltas(self.config.action_mode, actions, self.config.n_types)
        s = self.batch.step(deltas)
        obs = self._decoder.observations(s)
        rewards = self._decoder.rewards(s)
        terminated = s.terminated.copy()
        truncated = (~terminated) & (s.header[:, H_STEP] >= self.config.max_steps)
        infos = self._infos(s)
        done = terminated | truncated
        if np.any(done):
            idx = np.nonzero(done)[0]
            final_obs = np.zeros_like(obs)
            final_obs[idx] = obs[idx]
            infos["final_obs"] = final_obs
            infos["_final_obs"] = done.copy()
            infos["final_info"] = {k: v for k, v in infos.items() if not k.startswith(("final", "_final"))}
            infos["_final_info"] = done.copy()
            r = self.batch.reset(idx, self._draw_seeds(len(idx)))
            obs[idx] = self._decoder.observations(r)
            mask = self._decoder.masks(r)
            infos["action_mask"] = infos["action_mask"].copy()
            infos["action_mask"][idx] = mask
        return obs, rewards, terminated, truncated, infos

    def _infos(self, s: SimStep) -> dict[str, Any]:
        mask = self._decoder.masks(s)
        return {
            "vm_cost": s.vm_cost.copy(),
            "wait_penalty": self.config.penalty_per_job_second * s.wait_job_seconds,
            "vm_running": s.running.copy(),
            "vm_booting": s.booting.copy(),
            "queue_length": s.header[:, H_WAITING].astype(np.int64),
            "jobs_finished": s.header[:, H_FINISHED].astype(np.int64),
            "action_applied": s.applied.copy(),
            "action_mask": mask,
            "step": s.header[:, H_STEP].astype(np.int64),
        }

    def close_extras(self, **kwargs) -> None:
        self.batch.close()
