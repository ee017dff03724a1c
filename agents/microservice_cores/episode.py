"""Episodes of the paper's protocol (Algorithm 2, Table 2): a user count U, every service at its
cap for a W = 60 s warm-up, then e_time = 300 one-second control steps. The controller sees the
second just ended and sets the cores of the next one.

`run_episodes` drives one controller per simulated copy (a controller with an `observe(m)`
method also sees the warm-up seconds) (E copies step together), so a method is
evaluated over several seeds in one batch; `EpisodeResult` holds the per-second series and the
paper's figures: mean and max allocated cores, p99, and the QoS-violation rate (share of control
seconds whose end-to-end p99 exceeds the QoS target).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np

from .control import AppLimits, Controller, clip_cores
from .sim import MicroserviceSim, SimStep
from .topology import Topology

WARMUP_S = 60       # W (Table 2)
EPISODE_S = 300     # e_time (Table 2)


def app_limits(topo: Topology) -> AppLimits:
    return AppLimits(services=topo.service_names, caps=topo.caps, qos_ms=topo.qos_ms)


@dataclass
class EpisodeResult:
    method: str
    app: str
    users: float
    seed: int
    cores: np.ndarray            # (T, M) cores set per second
    used: np.ndarray             # (T, M) cores used
    p99_ms: np.ndarray           # (T,)
    requests: np.ndarray         # (T,)
    failures: np.ndarray         # (T,)
    qos_ms: float
    extra: dict = field(default_factory=dict)

    @property
    def total_cores(self) -> np.ndarray:
        return self.cores.sum(axis=1)

    @property
    def mean_cores(self) -> float:
        return float(self.total_cores.mean())

    @property
    def max_cores(self) -> float:
        return float(self.total_cores.max())

    @property
    def violations(self) -> np.ndarray:
        return np.nan_to_num(self.p99_ms, nan=0.0) > self.qos_ms

    @property
    def violation_rate(self) -> float:
        return float(self.violations.mean())

    def summary(self) -> dict:
        p = self.p99_ms[np.isfinite(self.p99_ms)]
        return {"method": self.method, "app": self.app, "users": self.users, "seed": self.seed,
                "mean_cores": self.mean_cores, "max_cores": self.max_cores,
                "mean_used": float(self.used.sum(axis=1).mean()),
                "p99_mean_ms": float(p.mean()) if p.size else None,
                "p99_max_ms": float(p.max()) if p.size else None,
                "violation_rate": self.violation_rate, "failures": float(self.failures.sum())}


def users_on_ramp(start, to, t0, ramp, t: int) -> np.ndarray:
    """Each copy's users before control second t of a load change from `start` to `to` spread evenly
    over `ramp` seconds from second `t0` (ramp 1: a jump at t0); the one rule of the load-step
    benchmark and of training with load changes (train.load_change_plan)."""
    start, to = np.asarray(start, dtype=np.float64), np.asarray(to, dtype=np.float64)
    ramp = np.maximum(np.asarray(ramp), 1)
    done = np.clip((t - np.asarray(t0) + 1) / ramp, 0.0, 1.0)
    return start + (to - start) * done


def run_episodes(topo: Topology, make_controller: Callable[[int], Controller] | None, users, seeds,
                 steps: int = EPISODE_S, warmup: int = WARMUP_S, method: str | None = None,
                 samples: int | None = None, batch: "BatchController | None" = None,
                 load_step: tuple[int, float] | tuple[int, float, int] | None = None) -> list[EpisodeResult]:
    """One episode per seed, all seeds stepping together in one simulator batch.

    `make_controller(i)` builds the controller of copy i (a controller keeps per-episode memory).
    Alternatively `batch` controls every copy at once from the simulator's whole second (it must
    act as its copies' controllers would: `ReclaimerPolicy.batch`). The simulator is seeded from
    the whole list of seeds (not the first alone): each copy's draws differ, the batch is
    reproducible for the same list, and seed s's episode depends on the list it ran in (seed 1 of
    seeds 1-5 is not seed 1 of seeds 1,2).
    `load_step` (t, users): every copy's users change to `users` before control second t (a jump of
    the load, benchmarks/reclaimer_load_steps.py; the experiment's episodes keep theirs); (t, users,
    ramp_s): the change spread evenly over ramp_s seconds from t."""
    seeds = list(seeds)
    _check_protocol(seeds, steps, warmup)
    E = len(seeds)
    kwargs = {"samples": samples} if samples else {}
    sim = MicroserviceSim(topo, n_envs=E, seed=int(np.random.SeedSequence(seeds).generate_state(1)[0]), **kwargs)
    sim.reset(users)                 # refuses a bad count by name
    users_arr = sim.users.copy()
    limits = app_limits(topo)
    ctls = [make_controller(i) for i in range(E)] if batch is None else []
    for c in ctls:
        c.reset(limits)
    if batch is not None:
        batch.reset(limits)
    cores = np.tile(topo.caps, (E, 1))
    st = None
    # controllers with a memory of use (the VPA recommender, the policy's frames) may watch the warm-up;
    # its last second is the first decision's, given to act alone: observed as well, it stood twice in
    # a frame stack, a VPA window and Sinan's history (training and the live loop see each second once)
    watchers = [(e, c) for e, c in enumerate(ctls) if hasattr(c, "observe")]
    for k in range(warmup):
        st = sim.step(cores)
        if k == warmup - 1:
            break
        for e, c in watchers:
            c.observe(st.measurement(e, topo.service_names))
        if batch is not None:
            batch.observe_block(st)
    M = topo.n_services
    set_c = np.zeros((steps, E, M))
    used = np.zeros((steps, E, M))
    p99 = np.zeros((steps, E))
    req = np.zeros((steps, E))
    fail = np.zeros((steps, E))
    throttled = np.zeros((steps, E, M))
    if load_step is not None:
        t0, to = int(load_step[0]), float(load_step[1])
        ramp = max(int(load_step[2]) if len(load_step) > 2 else 1, 1)
        start_users = users_arr.copy()
    for t in range(steps):
        if load_step is not None and t0 <= t < t0 + ramp:
            sim.set_users(users_on_ramp(start_users, to, t0, ramp, t))
        wanted = batch.act_block(st) if batch is not None else \
            [ctl.act(st.measurement(e, topo.service_names)) for e, ctl in enumerate(ctls)]
        cores = np.stack([clip_cores(c, limits) for c in wanted])
        st = sim.step(cores)
        set_c[t], used[t], p99[t], req[t], fail[t] = cores, st.cpu_used, st.p99_ms, st.requests, st.failures
        throttled[t] = st.throttled
    name = method or getattr(batch if batch is not None else ctls[0], "name", "controller")
    return [EpisodeResult(method=name, app=topo.name, users=float(users_arr[e]), seed=seeds[e],
                          cores=set_c[:, e], used=used[:, e], p99_ms=p99[:, e], requests=req[:, e],
                          failures=fail[:, e], qos_ms=topo.qos_ms,
                          extra={"throttled_mean": dict(zip(topo.service_names, throttled[:, e].mean(axis=0).tolist()))})
            for e in range(E)]


def _check_protocol(seeds: list, steps, warmup) -> None:
    """Refuse by name what would otherwise fail deep in the run: no copy to stack, no control
    second to score (the figures of an empty series), or no warm-up second for the first decision
    to see."""
    if not seeds:
        raise ValueError("seeds must name at least one episode")
    for name, value in (("steps", steps), ("warmup", warmup)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be a whole number of seconds >= 1, not {value!r}")


class BatchController(Protocol):
    """A controller of E simulated copies at once (`run_episodes(batch=...)`): it sees each whole
    simulated second, the warm-up's too, and returns the cores (E, M) it wants."""
    name: str

    def reset(self, limits: AppLimits) -> None: ...

    def observe_block(self, st: SimStep) -> None: ...

    def act_block(self, st: SimStep) -> np.ndarray: ...


class StaticController:
    """A fixed allocation (cores per service); `StaticController.maximum` is every service at its cap."""

    def __init__(self, cores, name: str = "static"):
        self.cores = np.asarray(cores, dtype=np.float64)
        self.name = name
        self.limits: AppLimits | None = None

    @classmethod
    def maximum(cls, topo: Topology) -> "StaticController":
        return cls(topo.caps, name="static-max")

    def reset(self, limits: AppLimits) -> None:
        self.limits = limits

    def act(self, m) -> np.ndarray:
        return clip_cores(self.cores, self.limits)
