"""Run whole simulated episodes of an agent (one per seed, all stepped in one batch) and
summarise them in the paper's units. Used by `samm sim run`, the evaluator and the tuners.

`agent` is anything with the `agents.base.Agent` interface (`feature_names`, `action_mode`,
`initial_state`, `act`); episodes that end early are frozen (no-op actions, outputs ignored)
until the last one ends, so their job records stay intact.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from samm.analyze import compute_metrics
from samm.analyze.features import compute_features
from samm.analyze.metrics import allocated_cores
from samm.plan.liveness import guard_head_of_line

from .actions import to_deltas
from .batch import H_REQUEUED, H_STEP, SimBatch, _episode_seed, _whole
from .config import SimConfig
from .gateway import Gateway
from .workloads import Workload


@dataclass
class EpisodeTrace:
    """Per-step series of one episode, for reports and plots."""

    clock_s: list[float] = field(default_factory=list)
    vm_running: list[list[int]] = field(default_factory=list)
    vm_booting: list[list[int]] = field(default_factory=list)
    queue_length: list[int] = field(default_factory=list)
    allocated_cores: list[int] = field(default_factory=list)
    observation: list[list[float]] = field(default_factory=list)
    action: list = field(default_factory=list)
    reward: list[float] = field(default_factory=list)


def _step_cap(max_steps, config: SimConfig) -> int:
    """The episodes' step limit: `max_steps`, or the config's when None. `max_steps or ...` took 0
    for "the config's" (5000 steps) and a negative cap ended every episode after one step,
    reported as an ordinary truncated run."""
    if max_steps is None:
        return config.max_steps
    value = _whole(max_steps)
    if value is None or value < 1:
        raise ValueError(f"max_steps must be a whole number >= 1 (or None for the config's "
                         f"{config.max_steps}), got {max_steps!r}")
    return value


def run_episodes(config: SimConfig, workload: Workload | list[Workload], agent, seeds, deterministic: bool = True,
                 traces: bool = False, gateway: Gateway | None = None, max_steps: int | None = None) -> list[dict]:
    """One episode per seed, all in one batch. `workload` may be a list with one workload per
    seed (episode i replays workload i), so many workloads run in one batched pass."""
    seeds = [_episode_seed(s) for s in seeds]
    n = len(seeds)
    if n == 0:  # else the batch's "n_envs must be at least 1", which names no seed
        raise ValueError("run_episodes needs at least one seed (one episode per seed), got none")
    workloads = list(workload) if isinstance(workload, (list, tuple)) else [workload] * n
    if len(workloads) != n:
        raise ValueError(f"{len(workloads)} workloads for {n} seeds: give one per seed")
    cap = _step_cap(max_steps, config)
    started = time.perf_counter()
    batch = SimBatch(config, workloads[0], n, gateway=gateway)
    # an agent that samples (stochastic policies, the random agent) draws row i's numbers from a stream
    # of seeds[i]: an episode then replays alone as in any batch (else its draws depend on the others)
    seed_rows = getattr(agent, "seed_rows", None)
    try:
        for i, w in enumerate(workloads):
            if w is not workloads[0]:
                batch.set_workload(i, w)
        s = batch.reset(np.arange(n), seeds)
        if callable(seed_rows):
            seed_rows(seeds)
        state = agent.initial_state(n)
        alive = np.ones(n, dtype=bool)
        steps = np.zeros(n, dtype=np.int64)
        terminated = np.zeros(n, dtype=bool)
        vm_cost, wait_pen, cores_sum, cpu_sum = (np.zeros(n) for _ in range(4))
        trace = [EpisodeTrace() for _ in range(n)] if traces else None
        jobs: list[np.ndarray | None] = [None] * n
        requeued = np.zeros(n, dtype=np.int64)
        names = tuple(agent.feature_names)
        obs = compute_metrics(s.raw, batch.fleet, config.warmup_s)
        while alive.any():
            feats = (compute_features(s.raw, batch.fleet, names, config.warmup_s, metrics=obs,
                                      step_seconds=config.step_seconds) if names
                     else np.zeros((n, 0), dtype=np.float32))
            decisions, state = agent.act(feats, state, deterministic)
            deltas = to_deltas(agent.action_mode, decisions.actions, config.n_types, n_envs=n)
            if config.liveness_guard:
                deltas, _ = guard_head_of_line(deltas, s.raw, batch.fleet)
            deltas[~alive] = 0
            s = batch.step(deltas)
            obs = compute_metrics(s.raw, batch.fleet, config.warmup_s)
            cores = allocated_cores(s.raw, batch.fleet)
            live = np.nonzero(alive)[0]
            steps[live] += 1
            vm_cost[live] += s.vm_cost[live]
            wait_pen[live] += config.penalty_per_job_second * s.wait_job_seconds[live]
            cores_sum[live] += cores[live]
            cpu_sum[live] += obs[live, 1]
            if trace is not None:
                for i in live:
                    t = trace[i]
                    t.clock_s.append(float(s.clock_s[i]))
                    t.vm_running.append(s.running[i].tolist())
                    t.vm_booting.append(s.booting[i].tolist())
                    t.queue_length.append(int(s.raw.jobs_waiting_now[i]))
                    t.allocated_cores.append(int(cores[i]))
                    t.observation.append([round(float(x), 6) for x in obs[i]])
                    t.action.append(np.asarray(decisions.actions[i]).tolist())
                    t.reward.append(-float(s.vm_cost[i] + config.penalty_per_job_second * s.wait_job_seconds[i]))
            ended = alive & (s.terminated | (s.header[:, H_STEP] >= cap))
            for i in np.nonzero(ended)[0]:
                terminated[i] = bool(s.terminated[i])
                jobs[i] = batch.job_stats(int(i))
                requeued[i] = int(s.header[i, H_REQUEUED])
            alive &= ~ended
    finally:
        if callable(seed_rows):
            seed_rows(None)
        batch.close()
    wall = time.perf_counter() - started
    results = []
    for i in range(n):
        j = jobs[i]
        finished = j[:, 2] >= 0
        # an arrival at exactly the last step's end belongs to the next step: that job never arrived
        # (wait 0), and `<=` counted it, halving the mean wait of a run cut at a batch's arrival
        arrived = j[:, 0] < steps[i] * config.step_seconds
        waits = j[arrived, 3]
        r = {
            "workload": workloads[i].name,
            "seed": seeds[i],
            "steps": int(steps[i]),
            "terminated": bool(terminated[i]),
            "truncated": not bool(terminated[i]),
            "total_reward": round(-(vm_cost[i] + wait_pen[i]), 6),
            "total_cost": round(vm_cost[i] + wait_pen[i], 6),
            "vm_cost": round(vm_cost[i], 6),
            "wait_penalty": round(wait_pen[i], 6),
            "jobs_total": int(len(j)),
            "jobs_finished": int(finished.sum()),
            "jobs_requeued": int(requeued[i]),
            "mean_wait_s": round(float(waits.mean()), 3) if len(waits) else 0.0,
            "p95_wait_s": round(float(np.percentile(waits, 95)), 3) if len(waits) else 0.0,
            "makespan_s": round(float(j[finished, 2].max()), 3) if finished.any() else None,
            "mean_allocated_cores": round(cores_sum[i] / max(steps[i], 1), 3),
            "mean_allocated_ratio": round(cores_sum[i] / max(steps[i], 1) / batch.fleet.max_fleet_cores, 4),
            "mean_cpu_util": round(cpu_sum[i] / max(steps[i], 1), 4),
            "wall_seconds": round(wall, 3),
        }
        if trace is not None:
            r["trace"] = trace[i].__dict__
        results.append(r)
    return results
