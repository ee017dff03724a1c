"""A CloudSim Plus simulation as the managed system: the embedded default and the dry-run target.

`SimulatedSystem` owns one simulation of one workload. Each daemon iteration advances it by one
interval (`SimMonitor.read`), so the loop sees exactly what it would see from Graphite, one
snapshot per interval, while `SimExecutor` queues the guard's requests for the next interval.
Time is the simulation's clock, so cool-downs and warm-ups are in workload seconds.

The simulator applies its own scale-in victim choice (booting VMs first, then idle ones, then
the one with least lost work); `ScaleRequest.victim` is therefore advisory here.
"""
from __future__ import annotations

import numpy as np

from samm.analyze import RawSnapshot
from samm.analyze.snapshot import VM_BOOTING
from sim_bridge.batch import H_FINISHED, H_VM_COST, H_WAIT_JOB_S, MAX_STEP_DELTA, SimBatch, SimStep
from sim_bridge.config import SimConfig, VmType
from sim_bridge.workloads import Workload

from .base import ActionResult, Executor, GroupStatus, Instance, ScaleRequest, refused


def sim_config_for_groups(groups, base: SimConfig | None = None, initial: dict[str, int] | None = None) -> SimConfig:
    """The simulator's VM types from the daemon's groups. The daemon's guard owns cool-downs and
    the analyzer owns warm-up, so the simulator's own are switched off (no double counting)."""
    base = base or SimConfig()
    initial = initial or {}
    types = tuple(
        VmType(name=g.name, cores=g.cores, ram_gb=g.ram_gb, price_per_hour=g.price_per_hour, min=g.min, max=g.max,
               initial=int(initial.get(g.name, min(max(g.min, 1), g.max))))
        for g in groups
    )
    return base.model_copy(update={"vm_types": types, "cooldown_s": 0.0, "warmup_s": 0.0, "action_mode": "per-type"})


class SimulatedSystem:
    """One simulation advanced one interval per `advance()`."""

    def __init__(self, config: SimConfig, workload: Workload, seed: int = 1):
        self.config = config
        self.seed = int(seed)
        self.batch = SimBatch(config, workload, n_envs=1)
        self.names = tuple(t.name for t in config.vm_types)
        self.pending = np.zeros(config.n_types, dtype=np.int64)
        self.last: SimStep | None = None
        self.steps = 0
        self.vm_cost = 0.0  # the gateway reports per-interval amounts; these are the running sums
        self.wait_job_s = 0.0
        self.core_steps = 0.0  # Σ allocated cores over intervals, for the mean

    @property
    def clock(self) -> float:
        return float(self.last.clock_s[0]) if self.last is not None else 0.0

    @property
    def finished(self) -> bool:
        return self.last is not None and bool(self.last.terminated[0])

    def advance(self) -> SimStep:
        """Reset on the first call; afterwards apply the queued deltas and run one interval."""
        if self.last is None:
            self.last = self.batch.reset([0], [self.seed])
        else:
            deltas, self.pending = self.pending.copy(), np.zeros_like(self.pending)
            self.last = self.batch.step(deltas.reshape(1, -1))
            self.steps += 1
            h = self.last.header[0]
            self.vm_cost += float(h[H_VM_COST])
            self.wait_job_s += float(h[H_WAIT_JOB_S])
            self.core_steps += float(np.sum(self.last.counts[0] * [t.cores for t in self.config.vm_types]))
        return self.last

    def snapshot(self) -> RawSnapshot:
        """The last interval's raw snapshot, unbatched (batch shape ())."""
        return self.last.raw.select(0)

    def counts(self) -> np.ndarray:
        """Live VMs per type including the deltas queued for the next interval."""
        base = self.last.counts[0] if self.last is not None else np.array([t.initial for t in self.config.vm_types])
        return base + self.pending

    def totals(self) -> dict:
        """Cost so far, in the simulator's units (same as `samm evaluate`)."""
        h = self.last.header[0]
        penalty = self.wait_job_s * self.config.penalty_per_job_second
        return {"clock_s": float(h[0]), "steps": self.steps, "vm_cost": round(self.vm_cost, 6),
                "penalty": round(penalty, 6), "total_cost": round(self.vm_cost + penalty, 6),
                "mean_allocated_cores": round(self.core_steps / max(self.steps, 1), 3),
                "jobs_finished": int(h[H_FINISHED]), "jobs_total": int(self.batch.workload.n_jobs)}

    def close(self) -> None:
        self.batch.close()


class SimExecutor(Executor):
    kind = "sim"

    def __init__(self, system: SimulatedSystem):
        self.system = system

    def inventory(self) -> dict[str, GroupStatus]:
        cfg = self.system.config
        out: dict[str, GroupStatus] = {}
        if self.system.last is None:
            return {t.name: GroupStatus(t.name, t.initial, t.min, t.max, ()) for t in cfg.vm_types}
        raw = self.system.last.raw
        vm_type, vm_state = raw.vm_type[0], raw.vm_state[0]
        counts = self.system.counts()
        for ti, t in enumerate(cfg.vm_types):
            slots = np.nonzero(vm_type == ti)[0]
            inst = tuple(Instance(t.name, f"sim-{t.name}-{s}", "pending" if vm_state[s] == VM_BOOTING else "running")
                         for s in slots)
            out[t.name] = GroupStatus(t.name, int(counts[ti]), t.min, t.max, inst)
        return out

    def apply(self, request: ScaleRequest) -> ActionResult:
        names = self.system.names
        if request.group not in names:
            return refused({}, f"sim: unknown group {request.group!r}")
        ti = names.index(request.group)
        t = self.system.config.vm_types[ti]
        if not t.min <= request.target <= t.max:
            return refused({}, f"sim: target {request.target} outside [{t.min}, {t.max}] of {t.name}")
        current = int(self.system.counts()[ti])
        if current == request.target:
            return ActionResult("skipped", detail={"reason": "already at target", "desired": current})
        # the step protocol carries at most ±127 VMs per type and interval (int8) and clipped the rest
        # silently: "1 -> 500" was reported while 127 were added. The rest is for a later decision.
        pending = int(self.system.pending[ti])
        wanted = pending + request.target - current
        allowed = max(-MAX_STEP_DELTA, min(MAX_STEP_DELTA, wanted))
        self.system.pending[ti] = allowed
        reached = current + allowed - pending
        detail = {"from": current, "to": reached}
        if reached != request.target:
            detail["capped"] = (f"target {request.target} is {abs(request.target - current)} VMs away; the simulator "
                                f"takes at most {MAX_STEP_DELTA} per type and interval")
        return ActionResult("succeeded", detail=detail)
