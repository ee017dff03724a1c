"""Simulations on Ray rollout workers: `RaySimBatch` is a drop-in for `SimBatch` whose envs are
spread over W Ray actors, each with its own gateway JVM and one batched `SimBatch`.

    samm train --ray local --rollout-workers 2 ...      # a Ray cluster in this process
    samm train --ray auto --rollout-workers 8 ...       # the cluster of `ray start --head`
    samm train --ray 10.0.0.5:6379 --rollout-workers 15 ...

Only the simulations move. Seeds, workloads, the analyzer (the seven metrics), the policy and
the PPO update stay in the learner's process (`CloudSimVectorEnv` and `agents.ppo.train`), and
each worker returns the simulator's packed records unchanged, so a run on W workers is the run
on one process with the same total envs, step for step (tested). A call on all workers is sent
to every worker before any answer is awaited: the JVMs step their shards at the same time.

A worker that dies (its process, its JVM or its node) is replaced by a fresh one holding the
same envs, and the call raises `RolloutWorkerLost`: the trainer then throws the rollout it was
collecting away and starts it again from reset envs (`agents.ppo.train`), so no transition from
before the loss is mixed with one after it.

`ray` is an optional dependency (`pip install samm[ray]`): nothing here imports it at module
import time.
"""
from __future__ import annotations

import logging
import os

import numpy as np

from samm.analyze import FleetSpec

from .batch import BatchShape, SimBatch, SimStep, check_core_cap, decode_records, record_width
from .config import SimConfig
from .errors import BridgeError, GatewayError, RolloutWorkerLost
from .workloads import Workload

log = logging.getLogger(__name__)

__all__ = ["RaySimBatch", "RolloutWorkerLost", "connect", "ray_batch_factory"]


def connect(address: str = "local", num_cpus: int | None = None) -> None:
    """Join (or start) the Ray cluster: `local` starts one inside this process, `auto` joins the
    one `ray start --head` runs on this machine (or $RAY_ADDRESS), anything else is an address."""
    import ray

    if ray.is_initialized():
        return
    if address == "local":
        # a small object store: replies are ~1 KB per env; the default takes 30 % of the RAM
        ray.init(num_cpus=num_cpus, include_dashboard=False, object_store_memory=200 * 2**20,
                 log_to_driver=False, configure_logging=False)
    else:
        ray.init(address=address, log_to_driver=False, configure_logging=False)


def _actor_class(num_cpus: float):
    import ray

    @ray.remote(num_cpus=num_cpus, max_restarts=0)
    class SimWorker:
        """One worker: a JVM and a `SimBatch` of this worker's envs."""

        def __init__(self, config_json: str, workload: Workload, n_envs: int):
            # an error raised here would reach the learner as Ray's multi-line ActorDiedError: it is
            # kept for `start_error` instead, and the learner raises it as it is
            self.batch, self.error = None, None
            try:
                self.batch = SimBatch(SimConfig.model_validate_json(config_json), workload, n_envs)
            except (BridgeError, ValueError) as exc:
                self.error = exc

        def start_error(self) -> Exception | None:
            return self.error

        def step(self, deltas: np.ndarray) -> bytes:
            return bytes(self.batch.step_records(deltas))

        def reset(self, envs: np.ndarray, seeds: np.ndarray) -> bytes:
            return bytes(self.batch.reset_records(envs, seeds))

        def set_workload(self, env: int, workload: Workload) -> None:
            self.batch.set_workload(env, workload)

        def job_stats(self, env: int) -> np.ndarray:
            return self.batch.job_stats(env)

        def pid(self) -> int:
            return os.getpid()

        def close(self) -> None:
            self.batch.close()

    return SimWorker


class RaySimBatch(BatchShape):
    """`n_envs` simulations on `workers` Ray actors (contiguous shards of envs, sizes as equal as
    `numpy.array_split` makes them). Same interface as `SimBatch`."""

    def __init__(self, config: SimConfig, workload: Workload, n_envs: int, workers: int = 2,
                 worker_cpus: float = 1.0, start_timeout_s: float = 300.0):
        """`start_timeout_s`: how long workers may take to start (an autoscaling cluster adds nodes
        meanwhile); past it the batch fails naming them, where Ray would wait for ever."""
        import ray

        if not ray.is_initialized():
            raise BridgeError("Ray is not initialised: call sim_bridge.ray_batch.connect() first")
        if not 1 <= workers <= n_envs:
            raise ValueError(f"need 1 <= rollout workers <= envs, got {workers} workers for {n_envs} envs")
        check_core_cap(workload, config)  # as SimBatch does, before any worker starts
        self.config, self.workload, self.n_envs = config, workload, int(n_envs)
        self.fleet = FleetSpec.from_vm_types(config.vm_types)
        self.workloads = [workload] * self.n_envs
        self._config_json = config.model_dump_json()
        self._cls = _actor_class(worker_cpus)
        self.worker_cpus, self.start_timeout_s = float(worker_cpus), float(start_timeout_s)
        sizes = [len(a) for a in np.array_split(np.arange(self.n_envs), workers)]
        self.bounds = np.cumsum([0] + sizes)  # worker k holds envs bounds[k]..bounds[k+1]-1
        self.actors = []
        self._closed = False
        try:
            for k in range(workers):
                self.actors.append(self._spawn(k))
            self._await_started(self.actors)  # every JVM up before the first step
        except BaseException:
            self.close()  # the workers that did start would hold their JVMs until Ray collects them
            raise
        self.replaced = 0  # workers replaced after a loss, over the batch's life
        self._width = record_width(self.n_types, self.n_slots)

    def _await_started(self, actors) -> None:
        """Raises the first worker's start error (a rejected config, a JVM that cannot start) as the
        one-line error a local `SimBatch` raises, or a BridgeError for workers that did not start."""
        import ray

        refs = [a.start_error.remote() for a in actors]
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=self.start_timeout_s)
        for error in ray.get(ready):
            if error is not None:
                raise error
        if pending:  # e.g. more workers x worker CPUs than the cluster has: Ray keeps them pending
            cpus = ray.cluster_resources().get("CPU", 0.0)
            raise BridgeError(f"{len(pending)} of {len(refs)} rollout workers did not start within "
                              f"{self.start_timeout_s:g} s (each needs {self.worker_cpus:g} CPU, the cluster has "
                              f"{cpus:g} CPUs): use fewer rollout workers or a larger cluster")

    @property
    def workers(self) -> int:
        return len(self.actors)

    def _spawn(self, k: int):
        lo, hi = int(self.bounds[k]), int(self.bounds[k + 1])
        actor = self._cls.remote(self._config_json, self.workload, hi - lo)
        for j in range(lo, hi):
            if self.workloads[j] is not self.workload:
                actor.set_workload.remote(j - lo, self.workloads[j])
        return actor

    def _gather(self, calls: dict[int, object]) -> dict[int, object]:
        """`ray.get` every worker's reply; replace every worker that died, then raise."""
        import ray
        from ray.exceptions import RayActorError, WorkerCrashedError

        out, lost = {}, []
        for k, ref in calls.items():
            try:
                out[k] = ray.get(ref)
            except (RayActorError, WorkerCrashedError, GatewayError) as exc:
                # GatewayError: the actor lives but its JVM died (Ray re-raises it as
                # RayTaskError(GatewayError)); that worker would fail every later call
                lost.append((k, exc))
        if lost:
            for k, _ in lost:
                try:
                    ray.kill(self.actors[k])
                except Exception:  # noqa: BLE001 - it is gone already
                    pass
                self.actors[k] = self._spawn(k)
                self.replaced += 1
            self._await_started([self.actors[k] for k, _ in lost])
            names = ", ".join(f"{k} (envs {self.bounds[k]}-{self.bounds[k + 1] - 1})" for k, _ in lost)
            log.warning("rollout worker(s) %s died (%s); replaced", names, lost[0][1])
            raise RolloutWorkerLost(f"rollout worker(s) {names} died and were replaced; their envs start afresh "
                                    f"({type(lost[0][1]).__name__})")
        return out

    def _rows(self, blob: bytes) -> np.ndarray:
        return np.frombuffer(blob, dtype="<f8").reshape(-1, self._width)

    def step(self, deltas: np.ndarray) -> SimStep:
        self._check_open()
        deltas = self._step_request(deltas)
        b = self.bounds
        replies = self._gather({k: a.step.remote(deltas[b[k]:b[k + 1]]) for k, a in enumerate(self.actors)})
        return decode_records(b"".join(replies[k] for k in range(self.workers)), self.n_types, self.n_slots)

    def reset(self, envs, seeds) -> SimStep:
        self._check_open()
        envs, seeds = self._reset_request(envs, seeds)
        owner = np.searchsorted(self.bounds, envs, side="right") - 1
        calls = {int(k): self.actors[k].reset.remote(envs[owner == k] - self.bounds[k], seeds[owner == k])
                 for k in np.unique(owner)}
        replies = self._gather(calls)
        rows = np.empty((len(envs), self._width), dtype="<f8")
        for k, blob in replies.items():
            rows[owner == k] = self._rows(blob)  # each worker answers in the order it was asked
        return decode_records(rows.tobytes(), self.n_types, self.n_slots)

    def _owner(self, env) -> tuple[int, int]:
        """(worker, index on that worker) of env `env`."""
        self._check_open()
        env = self._env_index(env)
        k = int(np.searchsorted(self.bounds, env, side="right") - 1)
        return k, env - int(self.bounds[k])

    def set_workload(self, env: int, workload: Workload) -> None:
        k, local = self._owner(env)
        # here, not on the worker: Ray would wrap the ValueError in a multi-line RayTaskError
        check_core_cap(workload, self.config)
        self._gather({k: self.actors[k].set_workload.remote(local, workload)})
        self.workloads[int(env)] = workload

    def job_stats(self, env: int) -> np.ndarray:
        k, local = self._owner(env)
        return self._gather({k: self.actors[k].job_stats.remote(local)})[k]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        import ray

        for a in self.actors:
            try:
                ray.kill(a)
            except Exception:  # noqa: BLE001 - best effort at shutdown
                pass


def ray_batch_factory(workers: int, worker_cpus: float = 1.0):
    """A `batch_factory` for `CloudSimVectorEnv`."""
    def make(config: SimConfig, workload: Workload, n_envs: int) -> RaySimBatch:
        return RaySimBatch(config, workload, n_envs, workers=workers, worker_cpus=worker_cpus)
    return make
