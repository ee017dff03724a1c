"""Oversub Gym (§6.2) as a plain NumPy simulator, shared by the Gymnasium env, the baselines'
tuning, the experiment and the tests.

One step = one hour (settings.py). At step t:
  1. VMs whose life ends at t leave and free their reservations;
  2. the decision sees `View` (hour, each subscriber's live allocation and its request at t, and
     the past usage rates the rules use) and returns one rate per subscriber;
  3. every VM a subscriber requests at t reserves rate x its cores (and its whole memory and
     network) on the PM best fit picks (`cluster.py`); a VM no PM can take is rejected;
  4. every live VM uses usage[v, t] x its requested cores; a PM is hot when the sum exceeds
     beta x B; the cluster is hot when any PM is (C_c(s) = max_k C_k(s), §5.1).
The step reports the cores the rates saved (the paper's reward before its constant Z), the hot
PMs and whether the cluster was hot; the episode keeps each PM's hot-step count for PM-Hot-R.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .cluster import NO_PM, Cluster, hot, place_vm, pm_usage
from .settings import Setting
from .workload import Workload


@dataclass
class View:
    """What a decision may see before step t's requests are placed."""
    t: int
    hour: int
    request: np.ndarray          # [N, 3] cores, mem, net requested at t
    has_request: np.ndarray      # [N] bool
    allocated: np.ndarray        # [N, 3] live reservations (cores, mem, net)
    requested_live: np.ndarray   # [N] live requested cores
    usage_history: np.ndarray    # [t, N] each past step's usage rate (used / requested), NaN when none live
    vm_rows: np.ndarray          # workload rows requested at t (arrival order)


@dataclass
class StepResult:
    saved_cores: float
    requested_cores: float
    assigned_cores: float
    rejected: int
    hot_pms: int
    cluster_hot: bool
    reserved_cores: float
    used_cores: float
    placements: np.ndarray       # [len(view.vm_rows)] PM per VM (NO_PM = rejected)
    pm_breaks: int = 0           # PMs whose hot-step count reached delta at this step


@dataclass
class EpisodeRecord:
    hot_counts: np.ndarray                 # [K] steps each PM was hot
    cluster_hot_steps: int = 0
    requested_cores: float = 0.0
    assigned_cores: float = 0.0
    rejected: int = 0
    placed: int = 0
    steps: int = 0
    # warm start: VMs running before step 0 that no PM could take (they are in no other count; the
    # shipped settings place them all, a smaller cluster may not)
    warm_rejected: int = 0
    saved_by_step: list = field(default_factory=list)
    hot_by_step: list = field(default_factory=list)

    @property
    def s_cores(self) -> float:
        return 1.0 - self.assigned_cores / self.requested_cores if self.requested_cores > 0 else 0.0


class OversubSim:
    def __init__(self, setting: Setting, workload: Workload, warm_start: bool = False,
                 warm_rate: float = 1.0):
        if workload.n_subscribers != setting.n_subscribers:
            raise ValueError(f"workload has {workload.n_subscribers} subscribers, setting "
                             f"{setting.name!r} has {setting.n_subscribers}")
        if not 0.0 < warm_rate <= 1.0:  # also refuses NaN
            raise ValueError(f"warm_rate must lie in (0, 1], not {warm_rate!r}")
        if workload.steps < 1:
            # else reset() hands out a view and the first step() says "episode is over"
            raise ValueError(f"workload {workload.name!r} has no steps: an episode needs at least one")
        self.setting = setting
        self.w = workload
        self.warm_start = warm_start
        self.warm_rate = warm_rate  # pre-existing VMs were placed without oversubscription (our choice)
        self.cluster = Cluster.for_setting(setting)
        self.T = min(setting.episode_steps, workload.steps)
        n = workload.n_subscribers
        order = workload.order()
        in_episode = order[(workload.arrive[order] >= 0) & (workload.arrive[order] < self.T)]
        starts = np.searchsorted(workload.arrive[in_episode], np.arange(self.T + 1))
        self._arrivals = [in_episode[starts[t]:starts[t + 1]] for t in range(self.T)]
        self._pre = order[(workload.arrive[order] < 0) & (workload.depart[order] > 0)]
        self._used = workload.usage * workload.cores[:, None]  # [V, steps] cores used
        self._res = np.stack([workload.cores, workload.mem, workload.net], axis=1).astype(np.float64)
        self.n = n
        self.reset()

    # ------------------------------------------------------------------ episode
    def reset(self) -> View:
        w = self.w
        self.cluster.reset()
        self.t = 0
        self.pm_of = np.full(w.n_vms, NO_PM, dtype=np.int64)
        self.assigned = np.zeros(w.n_vms, dtype=np.float64)
        self.record = EpisodeRecord(hot_counts=np.zeros(self.setting.n_pms, dtype=np.int64))
        self.usage_history = np.full((self.T, self.n), np.nan)
        # hot PM-steps blamed on each VM: a hot PM's step is shared by its VMs in proportion to the
        # cores they were NOT reserved (requested - assigned); a VM at rate 1 takes no blame
        self.blame = np.zeros(self.w.n_vms)
        if self.warm_start:
            for v in self._pre:
                if self._place(v, self.warm_rate) == NO_PM:
                    self.record.warm_rejected += 1
        return self.view()

    @property
    def done(self) -> bool:
        return self.t >= self.T

    def _place(self, v: int, rate: float) -> int:
        return place_vm(self.cluster, self.w, v, rate, self.pm_of, self.assigned)

    def _depart(self, t: int) -> None:
        w = self.w
        gone = np.flatnonzero((w.depart == t) & (self.pm_of != NO_PM))
        if len(gone):
            res = self._res[gone].copy()
            res[:, 0] = self.assigned[gone]
            self.cluster.release_many(self.pm_of[gone], res)
            self.pm_of[gone] = NO_PM

    def live_mask(self) -> np.ndarray:
        return self.pm_of != NO_PM

    def view(self) -> View:
        t = min(self.t, self.T - 1)
        w = self.w
        if not self.done:
            self._depart(t)
        rows = self._arrivals[t] if not self.done else np.empty(0, dtype=np.int64)
        n = self.n
        req = np.zeros((n, 3))
        if len(rows):
            np.add.at(req, w.sub[rows], self._res[rows])
        live = self.live_mask()
        alloc = np.zeros((n, 3))
        rl = np.zeros(n)
        if live.any():
            idx = np.flatnonzero(live)
            res = self._res[idx].copy()
            res[:, 0] = self.assigned[idx]
            np.add.at(alloc, w.sub[idx], res)
            rl = np.bincount(w.sub[idx], weights=w.cores[idx], minlength=n)
        return View(t=self.t, hour=int((w.start_hour + self.t) % 24), request=req,
                    has_request=req[:, 0] > 0, allocated=alloc, requested_live=rl,
                    usage_history=self.usage_history[: self.t], vm_rows=rows)

    def step(self, rates) -> tuple[View | None, StepResult]:
        if self.done:
            raise RuntimeError("episode is over: call reset()")
        rates = np.asarray(rates, dtype=np.float64).reshape(-1)
        if rates.shape != (self.n,):
            raise ValueError(f"need one rate per subscriber ({self.n}), got {rates.shape}")
        if np.any(~np.isfinite(rates)) or np.any(rates <= 0) or np.any(rates > 1):
            raise ValueError("rates must be finite and in (0, 1]")
        t, w, s = self.t, self.w, self.setting
        rows = self._arrivals[t]
        reserve = w.cores[rows].astype(np.float64) * rates[w.sub[rows]]
        placements = self.cluster.allocate_many(reserve, w.mem[rows], w.net[rows])
        ok = placements != NO_PM
        self.pm_of[rows[ok]] = placements[ok]
        self.assigned[rows[ok]] = reserve[ok]
        rejected = int((~ok).sum())
        requested = float(w.cores[rows][ok].sum())
        assigned = float(reserve[ok].sum())
        live = np.flatnonzero(self.pm_of != NO_PM)
        used_v = self._used[live, t]
        per_pm = pm_usage(self.pm_of[live], used_v, s.n_pms)
        hot_mask = hot(per_pm, s.pm_cores, s.beta)
        n_hot = int(hot_mask.sum())
        if n_hot:
            pms = self.pm_of[live]
            over = w.cores[live] - self.assigned[live]
            total = np.bincount(pms, weights=over, minlength=s.n_pms)
            on_hot = hot_mask[pms] & (total[pms] > 1e-9)
            self.blame[live[on_hot]] += over[on_hot] / total[pms[on_hot]]
        subs = w.sub[live]
        req_by_sub = np.bincount(subs, weights=w.cores[live], minlength=self.n)
        use_by_sub = np.bincount(subs, weights=used_v, minlength=self.n)
        with np.errstate(invalid="ignore", divide="ignore"):
            self.usage_history[t] = np.where(req_by_sub > 0, use_by_sub / req_by_sub, np.nan)
        rec = self.record
        rec.hot_counts += hot_mask
        breaks = int(np.count_nonzero(hot_mask & (rec.hot_counts == s.delta_steps)))
        rec.cluster_hot_steps += int(n_hot > 0)
        rec.requested_cores += requested
        rec.assigned_cores += assigned
        rec.rejected += rejected
        rec.placed += len(rows) - rejected
        rec.steps += 1
        rec.saved_by_step.append(requested - assigned)
        rec.hot_by_step.append(n_hot)
        result = StepResult(saved_cores=requested - assigned, requested_cores=requested,
                            assigned_cores=assigned, rejected=rejected, hot_pms=n_hot,
                            cluster_hot=n_hot > 0, reserved_cores=self.cluster.reserved_cores(),
                            used_cores=float(per_pm.sum()), placements=placements,
                            pm_breaks=breaks)
        self.t += 1
        return (None if self.done else self.view()), result


def run_episode(sim: OversubSim, decide) -> EpisodeRecord:
    """Roll one episode with `decide(view) -> rates [N]`."""
    view = sim.reset()
    while view is not None:
        view, _ = sim.step(decide(view))
    return sim.record
