"""Billing and SLA accounting from the testbed's own records, in the simulator's units.

Inputs: the reconciler's instance records (`InstanceRecord`, wall times) and the queue's job
and run records (`JobQueue.stats()`, `JobQueue.runs()`, workload seconds). Everything is
converted to workload seconds, (wall - t0) x compression, and reported under the keys of
`sim_bridge.runner.run_episodes` so a testbed run and `samm evaluate` compare directly:

* horizon: from 0 to `steps x step_s`, `steps = ceil(makespan / step_s)`, as the simulator
  bills whole steps until the one in which the last job finished (or `end_s` when given);
  instances launched before t0 (the initial fleet) count from 0, instances still alive or
  stopped later count until the horizon, and so do those the testbed's own shutdown stopped
  (`policy_stop`: the run's end is no scale-in);
* `vm_cost` = sum over instances of lifetime x price / 3600, booting time included (a cloud
  bills from the request, and so does the simulator);
* `wait_penalty` = penalty_per_job_second x sum of job waits, where a job's wait is the time
  it spent queued: from submission to its first start, plus every stretch queued again after
  a re-queue (the simulator's integral of the waiting count);
* `mean_allocated_cores` = booting + running cores sampled at the end of every step, averaged
  (the simulator's definition); `mean_allocated_cores_tw` is the exact time-weighted mean;
* `mean_cpu_util` = per step, the mean over running (booted) instances of the share of their
  cores held by jobs during the part of the step they were running, averaged over steps (the
  simulator's `cpu_mean` observation averaged, as `run_episodes` reports it);
  `busy_core_ratio` = busy core-seconds / allocated core-seconds over the horizon;
* `mean_wait_s`, `p95_wait_s` over jobs submitted before the horizon (as `run_episodes`); `makespan_s` = last
  finish. Busy time counts every attempt, including work lost to a killed instance.

Runs are matched to instances by id: the worker's `--instance` must be the instance id.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from .jobqueue import DONE, JobRecord, RunRecord

DEFAULT_PENALTY_PER_JOB_SECOND = 1e-5  # sim_bridge.config.SimConfig.penalty_per_job_second
DEFAULT_STEP_S = 60.0  # sim_bridge.config.SimConfig.step_seconds


@dataclass(frozen=True)
class InstanceRecord:
    """One instance's life, wall epoch seconds: billed from `started_wall` (first seen in its
    group), running (its worker started) from `ready_wall` (None: at once), until
    `stopped_wall` (None: still alive)."""

    group: str
    instance_id: str
    started_wall: float
    stopped_wall: float | None = None
    ready_wall: float | None = None


def policy_stop(stopped_wall: float | None, shutdown_wall: float | None) -> float | None:
    """An instance's stop as the policy made it: one the testbed's own shutdown stopped (at
    `shutdown_wall`) was still running when the run ended, so it counts until the horizon as in
    the simulator. Billed to the shutdown, a few seconds after the last job, the cost lacked up to
    one step of the whole fleet and the last step's sample found no instance."""
    if stopped_wall is not None and shutdown_wall is not None and stopped_wall >= shutdown_wall:
        return None
    return stopped_wall


@dataclass(frozen=True)
class GroupSpec:
    """What billing needs of a group; any object with `cores` and `price_per_hour` (and
    optionally `max`) will do, e.g. `sim_bridge.config.VmType`."""

    cores: int
    price_per_hour: float
    max: int | None = None


def _overlap(a: np.ndarray, b: np.ndarray, lo: float, hi: float) -> np.ndarray:
    return np.clip(np.minimum(b, hi) - np.maximum(a, lo), 0.0, None)


def _check_group(name: str, spec: Any) -> None:
    """A group's spec as billing needs it: cores >= 1 (a 0 divides the CPU share by zero and reads
    as 100 % busy), a finite price >= 0 (a NaN bills NaN dollars)."""
    for field, value, low in (("cores", getattr(spec, "cores", None), 1),
                              ("price_per_hour", getattr(spec, "price_per_hour", None), 0)):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) \
                or not (math.isfinite(value) and value >= low):
            raise ValueError(f"group {name!r}: {field} must be a finite number >= {low}, got {value!r}")


def summarize(instances: Sequence[InstanceRecord], jobs: Sequence[JobRecord], runs: Sequence[RunRecord],
              groups: Mapping[str, Any], compression: float, t0: float,
              penalty_per_job_second: float = DEFAULT_PENALTY_PER_JOB_SECOND, step_s: float = DEFAULT_STEP_S,
              end_s: float | None = None, workload: str = "testbed", warmup_s: float = 0.0) -> dict:
    """The run's summary under `run_episodes`' keys (plus `mean_allocated_cores_tw`,
    `busy_core_ratio`, `vm_seconds` and `vm_cost_by_group`). `groups`: group name -> spec with
    `cores` and `price_per_hour`. Times in the result are workload seconds."""
    # an infinite compression or step, or a NaN t0, passed the old `> 0` checks and billed garbage
    # (every instance at workload 0) or failed later as "cannot convert float NaN to integer"
    if not (math.isfinite(compression) and compression > 0):
        raise ValueError(f"compression must be a finite number > 0, got {compression}")
    if not (math.isfinite(step_s) and step_s > 0):
        raise ValueError(f"step_s must be a finite number > 0, got {step_s}")
    if not math.isfinite(t0):
        raise ValueError(f"t0 must be a finite wall time, got {t0}")
    unknown = sorted({i.group for i in instances} - set(groups))
    if unknown:
        raise ValueError(f"instance records name groups without a price/cores spec: {', '.join(unknown)} "
                         f"(known: {', '.join(sorted(groups)) or 'none'})")
    for name in sorted({i.group for i in instances}):
        _check_group(name, groups[name])

    def clock(wall: float) -> float:
        return (wall - t0) * compression

    finished = [j.finished_at for j in jobs if j.state == DONE and j.finished_at is not None]
    all_done = bool(jobs) and len(finished) == len(jobs)
    makespan = max(finished) if finished else None
    if makespan is not None and not math.isfinite(makespan):
        raise ValueError(f"a finished job has a non-finite finish time: {makespan}")
    if end_s is not None:
        end = float(end_s)
        if not (math.isfinite(end) and end > 0):  # the time-weighted means divide by it
            raise ValueError(f"end_s must be a finite number > 0, got {end_s}")
    elif makespan is not None:
        end = max(1, math.ceil(makespan / step_s - 1e-9)) * step_s
    else:
        raise ValueError("no job has finished: pass end_s to bill an unfinished run")
    steps = max(1, math.ceil(end / step_s - 1e-9))

    # ---- instances (workload seconds, clipped to [0, end])
    n = len(instances)
    start = np.array([max(0.0, clock(i.started_wall)) for i in instances], dtype=float)
    ready = np.array([max(0.0, clock(i.ready_wall if i.ready_wall is not None else i.started_wall)) for i in instances],
                     dtype=float)
    stop = np.array([min(end, clock(i.stopped_wall)) if i.stopped_wall is not None else end for i in instances],
                    dtype=float)
    cores = np.array([int(groups[i.group].cores) for i in instances], dtype=float)
    price = np.array([float(groups[i.group].price_per_hour) for i in instances], dtype=float)
    life = _overlap(start, stop, 0.0, end) if n else np.zeros(0)
    vm_cost = float(np.sum(life * price) / 3600.0)
    by_group_s: dict[str, float] = {}
    by_group_cost: dict[str, float] = {}
    for k, inst in enumerate(instances):
        by_group_s[inst.group] = by_group_s.get(inst.group, 0.0) + float(life[k])
        by_group_cost[inst.group] = by_group_cost.get(inst.group, 0.0) + float(life[k] * price[k] / 3600.0)
    allocated_core_s = float(np.sum(life * cores))

    # ---- job waits
    # an arrival at exactly the horizon belongs to the next step, as in `run_episodes`: counted,
    # it waited 0 s and pulled the mean wait of a run cut at a batch's arrival down
    arrived = [j for j in jobs if j.submitted_at < end]
    waits = np.array([j.total_wait(end) for j in arrived], dtype=float)
    wait_job_s = float(waits.sum()) if len(waits) else 0.0
    wait_penalty = penalty_per_job_second * wait_job_s

    # ---- busy time per instance, from every attempt
    run_by_worker: dict[str, list[RunRecord]] = {}
    for r in runs:
        run_by_worker.setdefault(r.worker_id, []).append(r)
    busy_core_s = 0.0
    step_ends = np.arange(1, steps + 1, dtype=float) * step_s
    # an end_s inside a step: that last, partial step is sampled at end_s, where the instances still
    # alive stop; sampled at the whole step's end it found none (0 cores, no CPU for that step)
    ends = np.minimum(step_ends, end)
    cpu_sum = np.zeros(steps)
    cpu_n = np.zeros(steps)
    alloc_at_end = np.zeros(steps)
    for k, inst in enumerate(instances):
        mine = run_by_worker.get(inst.instance_id, [])
        ra = np.array([r.started_at for r in mine], dtype=float)
        rb = np.array([r.ended_at if r.ended_at is not None else end for r in mine], dtype=float)
        rc = np.array([r.cores for r in mine], dtype=float)
        busy_core_s += float(np.sum(_overlap(ra, rb, 0.0, end) * rc)) if mine else 0.0
        # present at the end of step s: launched before it, not yet gone (a removal at exactly
        # a step end happens at the start of the next step in the simulator)
        present = (start[k] < ends) & (ends <= stop[k])
        alloc_at_end += np.where(present, cores[k], 0.0)
        measured = present & (ready[k] + warmup_s <= ends)
        for s in np.nonzero(measured)[0]:
            lo, hi = max(step_ends[s] - step_s, ready[k]), ends[s]
            share = 0.0
            if hi > lo and mine:
                share = float(np.sum(_overlap(ra, rb, lo, hi) * rc)) / (cores[k] * (hi - lo))
            cpu_sum[s] += min(1.0, share)
            cpu_n[s] += 1
    cpu_per_step = np.where(cpu_n > 0, cpu_sum / np.maximum(cpu_n, 1), 0.0)
    max_fleet = sum(int(getattr(g, "cores")) * int(getattr(g, "max", 0) or 0) for g in groups.values())

    total_cost = vm_cost + wait_penalty
    return {
        "workload": workload,
        "steps": steps,
        "terminated": all_done,
        "truncated": not all_done,
        "total_reward": round(-total_cost, 6),
        "total_cost": round(total_cost, 6),
        "vm_cost": round(vm_cost, 6),
        "wait_penalty": round(wait_penalty, 6),
        "jobs_total": len(jobs),
        "jobs_finished": len(finished),
        "jobs_requeued": int(sum(j.requeues for j in jobs)),
        "mean_wait_s": round(float(waits.mean()), 3) if len(waits) else 0.0,
        "p95_wait_s": round(float(np.percentile(waits, 95)), 3) if len(waits) else 0.0,
        "makespan_s": round(makespan, 3) if makespan is not None else None,
        "mean_allocated_cores": round(float(alloc_at_end.mean()), 3),
        "mean_allocated_ratio": round(float(alloc_at_end.mean()) / max_fleet, 4) if max_fleet else None,
        "mean_cpu_util": round(float(cpu_per_step.mean()), 4),
        "mean_allocated_cores_tw": round(allocated_core_s / end, 3),
        "busy_core_ratio": round(busy_core_s / allocated_core_s, 4) if allocated_core_s > 0 else 0.0,
        "wait_job_seconds": round(wait_job_s, 3),
        "vm_seconds": {g: round(v, 3) for g, v in sorted(by_group_s.items())},
        "vm_cost_by_group": {g: round(v, 6) for g, v in sorted(by_group_cost.items())},
        "horizon_s": end,
    }
