"""Run one simulated episode with a policy and summarise it in the units of the paper."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from .envs import CloudSimEnv


@dataclass
class EpisodeTrace:
    """Per-step series, for reports and plots."""

    clock_s: list[float] = field(default_factory=list)
    vm_running: list[list[int]] = field(default_factory=list)
    vm_booting: list[list[int]] = field(default_factory=list)
    queue_length: list[int] = field(default_factory=list)
    allocated_cores: list[int] = field(default_factory=list)
    observation: list[list[float]] = field(default_factory=list)
    action: list = field(default_factory=list)
    reward: list[float] = field(default_factory=list)


def run_episode(env: CloudSimEnv, policy, seed: int, trace: EpisodeTrace | None = None) -> dict:
    started = time.perf_counter()
    obs, info = env.reset(seed=seed)
    policy.reset()
    total_reward = vm_cost = wait_penalty = 0.0
    cores, cpu = [], []
    steps = 0
    terminated = truncated = False
    while not (terminated or truncated):
        action = policy.act(obs, info)
        obs, reward, terminated, truncated, info = env.step(action)
        steps += 1
        total_reward += reward
        vm_cost += info["vm_cost"]
        wait_penalty += info["wait_penalty"]
        cores.append(info["allocated_cores"])
        cpu.append(float(obs[1]))
        if trace is not None:
            trace.clock_s.append(info["clock_s"])
            trace.vm_running.append(info["vm_running"].tolist())
            trace.vm_booting.append(info["vm_booting"].tolist())
            trace.queue_length.append(info["queue_length"])
            trace.allocated_cores.append(info["allocated_cores"])
            trace.observation.append([float(x) for x in obs])
            trace.action.append(np.asarray(action).tolist())
            trace.reward.append(float(reward))
    jobs = env.job_stats()
    finished = jobs[:, 2] >= 0
    arrived = jobs[:, 0] <= info["clock_s"]
    waits = jobs[arrived, 3]
    return {
        "workload": env.workload.name,
        "seed": seed,
        "steps": steps,
        "terminated": bool(terminated),
        "truncated": bool(truncated),
        "total_reward": round(total_reward, 6),
        "total_cost": round(vm_cost + wait_penalty, 6),
        "vm_cost": round(vm_cost, 6),
        "wait_penalty": round(wait_penalty, 6),
        "jobs_total": int(len(jobs)),
        "jobs_finished": int(finished.sum()),
        "jobs_requeued": int(info["jobs_requeued"]),
        "mean_wait_s": round(float(waits.mean()) if len(waits) else 0.0, 3),
        "p95_wait_s": round(float(np.percentile(waits, 95)) if len(waits) else 0.0, 3),
        "makespan_s": round(float(jobs[finished, 2].max()), 3) if finished.any() else None,
        "mean_allocated_cores": round(float(np.mean(cores)) if cores else 0.0, 3),
        "mean_cpu_util": round(float(np.mean(cpu)) if cpu else 0.0, 4),
        "wall_seconds": round(time.perf_counter() - started, 3),
    }
