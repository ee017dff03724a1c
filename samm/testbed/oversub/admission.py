"""The admission executor: replays a `Workload` on emulated PMs that share real CPU.

Step k is the wall interval [t0 + k*S, t0 + (k+1)*S). Its admission runs `lead_s` BEFORE the
step starts, so that the VMs it admits are up and burning from the step's first instant:

  1. VMs whose life ends at k leave: their reservations are freed (the processes keep running
     until the step starts, with nothing left to burn, then get SIGTERM);
  2. the step's requests go to the hosted agent over REST (`/admit/batch`: one call per step,
     one rate per subscriber, the View the simulator builds; or `/admit` per request). A
     failed call admits without oversubscription (rate 1.0) and records the error. A call
     may wait only until the step starts (at most `request_timeout_s`): a slow or hung agent
     costs the step its oversubscription, never the run its timing (without that bound a
     hung agent made every step later than the one before); a request left with no time is
     admitted the same way, without a call;
  3. each VM reserves rate x cores (and its memory and network) on the PM best fit picks,
     with `agents.oversubscription.cluster.Cluster`, the simulator's own allocator; a VM no
     PM can take is rejected;
  4. each admitted VM becomes a worker process (`vm.py`) in its PM's cgroup, burning
     usage[v, t] x cores x host_cores_per_pm_core host cores in every step t of its life;
  5. one decision per request is recorded in the Knowledge store (loop `oversub-<run>`,
     iteration key `step<k>:vm<row>`: a re-run with the same run name records nothing twice).
     A write the store refuses (locked, unreachable, full) does not stop the run: the decision
     is kept (`unrecorded`), written at a later step or at the end of the run, and what is
     still unwritten then is reported (`run.py` saves it beside the run's outputs).

At the step's start every live VM's CPU time is sampled (/proc/<pid>/task/*/schedstat, ns): the
per-subscriber usage rates of the step before, which the REST call sends as `usage_history`
(the rule baselines need it). The step in flight when the next admission runs is sent as
measured so far (demand is constant within a step).

Each PM's usage in a step is read back FROM GRAPHITE (the collector's per-second points, the
window's slots a..b-1). A PM using more than beta x its cores is hot: a hot event is recorded
as a decision with source "none" and action_name "hot-event" (key `step<k>:hot:pm<j>`; no
schema change) and posted as a Graphite event (tags oversub, hot, <run>). The simulator's
prediction for the same placements (sum of usage x cores of the PM's live VMs, `pm_usage`) sits
beside it in every row.

Warm start (rows with arrive < 0) is not replayed: a live run starts with an empty cluster.
"""
from __future__ import annotations

import logging
import math
import select
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import requests

from agents.oversubscription.cluster import NO_PM, Cluster, hot, place_vm, pm_usage
from agents.oversubscription.features import observation
from agents.oversubscription.service import MAX_USAGE_RATE
from agents.oversubscription.settings import Setting
from agents.oversubscription.sim import View
from agents.oversubscription.workload import Workload
from samm.localproc import popen_tied
from samm.monitor.graphite_client import GraphiteError, GraphiteSender, RenderClient, post_event

from ..options import number_problem
from .cgroups import PmCgroups
from .collector import pm_metric

log = logging.getLogger(__name__)

PROBLEM = "oversubscription"
MIN_READ_S = 0.1  # a Graphite read with less time than this before the next admission waits for later


@dataclass
class LiveParams:
    """Timing and scale of a live run. None of these are in the paper: testbed choices."""
    seconds_per_step: int = 1          # wall seconds per emulated hour; whole seconds (Graphite's finest slot)
    host_cores_per_pm_core: float = 0.005  # host CPU per emulated core (the run sizes it to its budget)
    lead_s: float | None = None        # admission starts this long before its step; None: 0.6 x step
    read_deadline_s: float = 8.0       # give up waiting for a step's Graphite points this long after it ends
    reread_s: float = 10.0             # at the end, read incomplete steps again for up to this long
    request_timeout_s: float = 2.0     # REST call timeout (and never past the step's start)
    min_call_s: float = 0.05           # a call with less time than this before its step is not made
    admit_mode: str = "batch"          # "batch": one call per step; "per-vm": one call per request
    slice_s: float = 0.05              # the VM workers' burn slice
    worker_start_timeout_s: float = 10.0
    prefix: str = "samm"               # Graphite prefix
    post_events: bool = True           # hot events as Graphite events too

    def __post_init__(self):
        if self.seconds_per_step < 1 or int(self.seconds_per_step) != self.seconds_per_step:
            raise ValueError(f"seconds_per_step must be a whole number >= 1 (Graphite's finest resolution is "
                             f"1 s), got {self.seconds_per_step}")
        self.seconds_per_step = int(self.seconds_per_step)
        if self.admit_mode not in ("batch", "per-vm"):
            raise ValueError(f"admit_mode must be 'batch' or 'per-vm', got {self.admit_mode!r}")
        if self.lead_s is None:
            self.lead_s = 0.6 * self.seconds_per_step
        if not 0 < self.lead_s < self.seconds_per_step:
            raise ValueError(f"lead_s must be in (0, seconds_per_step), got {self.lead_s}")
        if not self.host_cores_per_pm_core > 0:
            raise ValueError("host_cores_per_pm_core must be positive")
        if not self.request_timeout_s > 0:
            raise ValueError(f"request_timeout_s must be positive, got {self.request_timeout_s}")
        # a NaN deadline never passed: the end-of-run read of a step Graphite never had waited forever;
        # a zero or NaN slice made every worker exit at its first step
        for name, strict in (("read_deadline_s", False), ("reread_s", False), ("min_call_s", False),
                             ("slice_s", True), ("worker_start_timeout_s", True)):
            if problem := number_problem(name, getattr(self, name), strict=strict):
                raise ValueError(problem)


@dataclass
class VmProcess:
    row: int
    pm: int
    proc: subprocess.Popen
    cpu_ns_at_step: int = 0      # its CPU time when the current step began (or when it started)
    t_at_step: float = 0.0       # when that was: a VM started after its step began is measured from its start


@dataclass
class StepRecord:
    step: int
    hour: int
    start: float                 # epoch of the step's start
    requests: int = 0
    placed: int = 0
    rejected: int = 0
    fallbacks: int = 0
    requested_cores: float = 0.0  # of the VMs placed at this step
    assigned_cores: float = 0.0
    live_vms: int = 0
    rates: list = field(default_factory=list)      # per request, arrival order
    subscribers: list = field(default_factory=list)
    placements: list = field(default_factory=list)  # per request (NO_PM: rejected)
    admit_ms: float = 0.0        # the REST round trip(s)
    late_s: float = 0.0          # how late the admission finished (after the step began)
    pm_reserved: list = field(default_factory=list)
    pm_sim: list = field(default_factory=list)      # the simulator's usage for the same placements
    pm_used: list = field(default_factory=list)     # measured, from Graphite (NaN: no point)
    pm_points: list = field(default_factory=list)
    pm_hot: list = field(default_factory=list)
    graphite_status: str = "pending"
    sub_usage_rate: list = field(default_factory=list)  # measured per subscriber (NaN: none live)


def proc_cpu_ns(pid: int) -> int | None:
    """CPU time of every thread of `pid` (ns; /proc/<pid>/task/*/schedstat), None when gone.
    /proc/<pid>/stat counts clock ticks (10 ms): too coarse for a VM burning ~10 ms a second."""
    total = 0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
    except OSError:
        return None
    return total


def subscriber_usage_rates(sub: np.ndarray, cores: np.ndarray, used_ns: np.ndarray, since: np.ndarray,
                           begin: float, now: float, n_subscribers: int, scale: float) -> np.ndarray:
    """Each subscriber's usage rate (cores used / cores requested) over a step begun at `begin`,
    from its VMs' CPU time used since `since` (NaN: none live). A worker let go after the step
    began (step 0's, whose interpreters start in it) burns only from then, so its rate is taken
    over the time it ran, not the whole step."""
    span = np.maximum(now - np.maximum(begin, since), 1e-6)
    used = np.bincount(sub, weights=used_ns / 1e9 / span / scale, minlength=n_subscribers)
    req = np.bincount(sub, weights=np.asarray(cores, dtype=float), minlength=n_subscribers)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(req > 0, used / req, np.nan)


class AdmissionExecutor:
    """One live replay of `workload` on `setting`'s PMs (their cgroups: `cgroups`)."""

    def __init__(self, setting: Setting, workload: Workload, *, agent: str, service_url: str, store, run: str,
                 cgroups: PmCgroups, sender: GraphiteSender, render: RenderClient, render_url: str | None = None,
                 params: LiveParams | None = None, worker_log: Path | None = None,
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep):
        if workload.n_subscribers != setting.n_subscribers:
            raise ValueError(f"workload has {workload.n_subscribers} subscribers, setting {setting.name!r} "
                             f"has {setting.n_subscribers}")
        if cgroups.n_pms != setting.n_pms:
            raise ValueError(f"{cgroups.n_pms} PM cgroups for {setting.n_pms} PMs")
        self.setting, self.w = setting, workload
        self.agent, self.url, self.store, self.run_name = agent, service_url.rstrip("/"), store, run
        self.loop = f"oversub-{run}"
        self.cg, self.sender, self.render, self.render_url = cgroups, sender, render, render_url
        self.p = params or LiveParams()
        self.scale = self.p.host_cores_per_pm_core
        self.worker_log = worker_log
        self.clock, self.sleep = clock, sleep
        self.http = requests.Session()
        self.cluster = Cluster.for_setting(setting)
        self.pm_of = np.full(workload.n_vms, NO_PM, dtype=np.int64)
        self.assigned = np.zeros(workload.n_vms)
        self.procs: dict[int, VmProcess] = {}
        self.leaving: list[VmProcess] = []  # departed at the coming step: stopped once it starts
        self.records: list[StepRecord] = []
        self.history: list[np.ndarray] = []  # measured usage rate per subscriber, one row per finished step
        self.decisions_created = 0   # admission decisions (one per request)
        self.decisions_existing = 0  # ... already recorded by an earlier run with the same keys
        self.decisions_conflicting = 0  # ... of those, recorded with another action, source or agent
        self.hot_events = 0          # hot PM-steps detected
        self.late_reads = 0          # steps whose points were whole only on the end-of-run read
        self.hot_events_created = 0  # ... recorded now (not by an earlier run)
        self.worker_failures = 0
        self.worker_exits = 0        # VMs whose worker died while they were live (found at a step's start)
        self.failed_rows: set[int] = set()  # admitted, but the worker never started
        self.exited_rows: set[int] = set()  # started, then found exited while live
        self.unrecorded: list[dict] = []   # decisions the store refused, oldest first (retried)
        self.store_errors = 0              # writes the store refused
        self._store_retry_at = -math.inf   # after a refusal, no write is tried before this
        self.t0: float | None = None

    # ------------------------------------------------------------------ the run
    def step_start(self, k: int) -> float:
        return self.t0 + k * self.p.seconds_per_step

    def _sleep_until(self, t: float) -> None:
        while True:
            left = t - self.clock()
            if left <= 0:
                return
            self.sleep(min(left, 0.2))

    def run(self, steps: int, t0: float) -> list[StepRecord]:
        """Replay steps 0..steps-1 with step 0 starting at epoch `t0` (a whole second)."""
        w = self.w
        steps = min(int(steps), w.steps)
        self.t0 = float(t0)
        order = w.order()
        self._arrivals = [order[w.arrive[order] == k] for k in range(steps)]
        try:
            for k in range(steps):
                self._sleep_until(self.step_start(k) - self.p.lead_s)
                self.admit_step(k)
                self._sleep_until(self.step_start(k))
                self.begin_step(k)
                # idle until the next admission: read the finished steps back from Graphite
                self.read_pending(until=self.step_start(k + 1) - self.p.lead_s - 0.05)
            self._sleep_until(self.step_start(steps))
            self.begin_step(steps)
        finally:
            self.stop_all()
        self.read_pending(until=None)
        self.reread_incomplete(self.p.reread_s)
        self.flush_unrecorded(force=True)
        if self.unrecorded:
            log.error("%d decision(s) could not be written to the knowledge store: %s", len(self.unrecorded),
                      self.unrecorded[-1]["error"])
        return self.records

    def reread_incomplete(self, for_s: float) -> int:
        """Read again the steps given up on before all their points were in Graphite: after a
        host or carbon stall the points land late, and the run's summary should have them.
        Polls for up to `for_s` seconds; returns how many steps became whole."""
        deadline = self.clock() + max(0.0, for_s)
        todo = [r for r in self.records if r.graphite_status in ("partial", "stale")]
        before = len(todo)
        while todo:
            last = self.clock() >= deadline
            # the last pass keeps whatever arrived, whole or not
            todo = [r for r in todo if not self._read_step(r, give_up=last) or r.graphite_status != "ok"]
            if last:
                break
            self.sleep(0.5)
        for rec in self.records:
            if rec.graphite_status != "ok":
                log.warning("step %d: Graphite has %s of %d points per PM", rec.step, rec.pm_points,
                            self.p.seconds_per_step)
        recovered = before - sum(r.graphite_status in ("partial", "stale") for r in self.records)
        self.late_reads += recovered
        return recovered

    # ------------------------------------------------------------------ admission
    def _state(self, hour: int) -> dict:
        n = self.setting.n_subscribers
        live = np.flatnonzero(self.pm_of != NO_PM)
        alloc = np.zeros((n, 3))
        res = np.stack([self.assigned[live], self.w.mem[live], self.w.net[live]], axis=1)
        np.add.at(alloc, self.w.sub[live], res)
        rl = np.bincount(self.w.sub[live], weights=self.w.cores[live], minlength=n)
        # NaN (no live VM) and a rate past what the service takes (a worker measured over a
        # sliver of time) go as null, unknown: one such value would make the agent refuse the step
        hist = [[float(v) if 0 <= v <= MAX_USAGE_RATE else None for v in row] for row in self._history_for_request()]
        return {"hour": int(hour), "allocated": alloc.tolist(), "requested_live": rl.tolist(), "usage_history": hist}

    def _history_for_request(self) -> list[np.ndarray]:
        """Finished steps' measured usage rates, plus the step in flight as measured so far."""
        rows = list(self.history)
        k = len(self.records)  # records exist for every admitted step
        if k and len(rows) < k:
            rows.append(self._measure_rates(k - 1, now=self.clock(), final=False))
        return rows

    def _request(self, v: int) -> dict:
        return {"subscriber": int(self.w.sub[v]), "cores": float(self.w.cores[v]), "mem_gb": float(self.w.mem[v]),
                "net_gbps": float(self.w.net[v])}

    def _post(self, path: str, body: dict, deadline: float | None = None) -> tuple[dict | None, str | None]:
        """POST to the agent, waiting at most until `deadline` (epoch; the step's start)."""
        url = f"{self.url}/v1/agents/{self.agent}/{path}"
        timeout = self.p.request_timeout_s
        if deadline is not None:
            left = deadline - self.clock()
            if left < self.p.min_call_s:
                return None, (f"POST {url} not made: no time left before the step began "
                              f"({left:.3f} s; a slow or hung agent)")
            timeout = min(timeout, left)
        try:
            r = self.http.post(url, json=body, timeout=timeout)
        except requests.RequestException as exc:
            return None, f"POST {url} failed: {type(exc).__name__}: {exc}"
        if r.status_code != 200:
            return None, f"POST {url} answered HTTP {r.status_code}: {r.text[:300]}"
        try:
            return r.json(), None
        except ValueError as exc:
            return None, f"POST {url} returned invalid JSON: {exc}"

    def _decide(self, rows: np.ndarray, hour: int, state: dict, deadline: float | None = None):
        """Rate, error and policy version per request (rate 1.0 where the call failed), and in
        per-vm mode the placements and the state each request was sent too (each request sees
        the state the ones before it left; batch: None, every request saw `state`).
        No call waits past `deadline` (the step's start)."""
        n = len(rows)
        if self.p.admit_mode == "batch":
            body = state | {"requests": [self._request(v) for v in rows]}
            reply, err = self._post("admit/batch", body, deadline)
            if reply is not None:
                try:
                    rates = [float(d["rate"]) for d in reply["decisions"]]
                    if len(rates) != n or not all(0 < r <= 1 for r in rates):
                        raise ValueError(f"{len(rates)} rates for {n} requests: {rates}")
                    return rates, [None] * n, [_version_of(reply)] * n, None, None
                except (KeyError, TypeError, ValueError) as exc:
                    err = f"admit/batch reply not understood: {exc}"
            return [1.0] * n, [err] * n, [None] * n, None, None
        rates, errs, versions, placements, states = [], [], [], [], []
        for i, v in enumerate(rows):
            states.append(state if i == 0 else self._state(hour))
            reply, err = self._post("admit", states[-1] | self._request(v), deadline)
            rate, version = 1.0, None
            if reply is not None:
                try:
                    rate, version = float(reply["rate"]), _version_of(reply)
                    if not 0 < rate <= 1:
                        raise ValueError(f"rate {rate} outside (0, 1]")
                except (KeyError, TypeError, ValueError) as exc:
                    rate, err = 1.0, f"admit reply not understood: {exc}"
            rates.append(rate)
            errs.append(err)
            versions.append(version)
            placements.append(self._place(v, rate))
        return rates, errs, versions, placements, states

    def _place(self, v: int, rate: float) -> int:
        """Best fit through the simulator's own `place_vm`."""
        return place_vm(self.cluster, self.w, v, rate, self.pm_of, self.assigned)

    def _depart(self, k: int) -> None:
        w = self.w
        gone = np.flatnonzero((w.depart == k) & (self.pm_of != NO_PM))
        for v in gone:
            pm = int(self.pm_of[v])
            self.cluster.release(pm, float(self.assigned[v]), float(w.mem[v]), float(w.net[v]))
            self.pm_of[v] = NO_PM
            if v in self.procs:
                self.leaving.append(self.procs.pop(v))

    def admit_step(self, k: int) -> StepRecord:
        w, s = self.w, self.setting
        hour = int((w.start_hour + k) % 24)
        self._depart(k)
        rows = self._arrivals[k]
        rec = StepRecord(step=k, hour=hour, start=self.step_start(k), requests=len(rows))
        pre_state = self._state(hour)  # what a batch decision saw (and per-vm's first request)
        started = time.perf_counter()
        rates, errors, versions, placements, states = (self._decide(rows, hour, pre_state, deadline=rec.start)
                                                       if len(rows) else ([], [], [], [], None))
        rec.admit_ms = (time.perf_counter() - started) * 1e3
        if placements is None:  # batch: place in arrival order once the step's rates are known
            placements = [self._place(v, r) for v, r in zip(rows, rates)]
        self._start_workers(k, [v for v, pm in zip(rows, placements) if pm != NO_PM])
        placements = [int(self.pm_of[v]) if pm != NO_PM else NO_PM for v, pm in zip(rows, placements)]
        rec.rates, rec.subscribers, rec.placements = list(rates), [int(w.sub[v]) for v in rows], placements
        rec.rejected = sum(pm == NO_PM for pm in placements)
        rec.placed = len(rows) - rec.rejected
        rec.fallbacks = sum(e is not None for e in errors)
        rec.requested_cores = float(sum(w.cores[v] for v, pm in zip(rows, placements) if pm != NO_PM))
        rec.assigned_cores = float(sum(self.assigned[v] for v, pm in zip(rows, placements) if pm != NO_PM))
        live = np.flatnonzero(self.pm_of != NO_PM)
        rec.live_vms = len(live)
        rec.pm_reserved = (self.cluster.capacity[0] - self.cluster.free[:, 0]).tolist()
        rec.pm_sim = pm_usage(self.pm_of[live], w.usage[live, k] * w.cores[live], s.n_pms).tolist()
        self.records.append(rec)
        self._record_decisions(rec, rows, rates, errors, versions, pre_state, states)
        for j, reserved in enumerate(rec.pm_reserved):
            self.sender.send(pm_metric(self.p.prefix, self.run_name, j, "reserved_cores"), reserved, rec.start)
        self.sender.flush()
        rec.late_s = max(0.0, self.clock() - rec.start)
        if rec.late_s > 0:
            log.warning("step %d: admission finished %.3f s after the step began (lead %.2f s too short?)",
                        k, rec.late_s, self.p.lead_s)
        return rec

    def _features(self, rec: StepRecord, state: dict, rows) -> list[float]:
        """The paper's observation of `state` with the requests of `rows`: what a call decided on."""
        n = self.setting.n_subscribers
        req = np.zeros((n, 3))
        for v in rows:
            req[self.w.sub[v]] += (self.w.cores[v], self.w.mem[v], self.w.net[v])
        view = View(t=rec.step, hour=rec.hour, request=req, has_request=req[:, 0] > 0,
                    allocated=np.asarray(state["allocated"]), requested_live=np.asarray(state["requested_live"]),
                    usage_history=np.zeros((0, n)), vm_rows=np.asarray(rows))
        return observation(view, self.setting).tolist()

    def _record_decisions(self, rec: StepRecord, rows, rates, errors, versions, state: dict,
                          states: list[dict] | None = None) -> None:
        """One decision per request, with the observation its call was sent: the step's (batch)
        or, per-vm (`states`), its own request on the state the requests before it left (before,
        every per-vm request was recorded with the batch's view, which no call had seen)."""
        batch = self._features(rec, state, rows) if states is None else None
        for i, (v, rate, err, version, pm) in enumerate(zip(rows, rates, errors, versions, rec.placements)):
            v = int(v)
            features = batch if states is None else self._features(rec, states[i], [v])
            placed = pm != NO_PM
            reason = err
            if not placed:
                why = ("its worker process did not start" if v in self.failed_rows
                       else "rejected: no PM can take its reservation")
                reason = (reason + "; " if reason else "") + why
            self._record(dict(
                iteration_key=f"step{rec.step}:vm{v}", agent=self.agent, loop=self.loop, problem=PROBLEM,
                source="fallback" if err else "agent", policy_version=version,
                action={"rate": rate, "reserved_cores": rate * float(self.w.cores[v]), "pm": pm if placed else None},
                action_name="admit" if placed else "reject", reason=reason,
                observation={"step": rec.step, "request": self._request(v), "features": features}), kind="admission")

    # ------------------------------------------------------------------ the Knowledge store
    def _record(self, decision: dict, kind: str, event: dict | None = None) -> None:
        """Write one decision (kind "admission", "hot" or "exit"); one the store refuses is kept in
        `unrecorded`, in order, and written again at a later step (`flush_unrecorded`)."""
        self.unrecorded.append({"kind": kind, "decision": decision, "event": event, "error": None})
        self.flush_unrecorded()

    def flush_unrecorded(self, force: bool = False) -> int:
        """Write the kept decisions, oldest first, stopping at the first refusal; after a
        refusal no write is tried for a step's time (a locked store would make each write wait
        its busy timeout) unless `force`. Returns how many were written."""
        if not self.unrecorded or (not force and self.clock() < self._store_retry_at):
            return 0
        done = 0
        while self.unrecorded:
            item = self.unrecorded[0]
            try:
                _, created = self.store.record_decision(**item["decision"])
            except Exception as exc:  # noqa: BLE001 - kept, retried; the run goes on
                self.store_errors += 1
                item["error"] = f"{type(exc).__name__}: {exc}"
                self._store_retry_at = self.clock() + self.p.seconds_per_step
                log.error("knowledge store refused %s (%d decision(s) kept to write later): %s",
                          item["decision"]["iteration_key"], len(self.unrecorded), item["error"])
                break
            self.unrecorded.pop(0)
            done += 1
            if item["kind"] == "hot":
                self.hot_events_created += int(created)
                if created and item["event"] and self.p.post_events and self.render_url:
                    post_event(self.render_url, **item["event"])
            elif item["kind"] == "admission":
                if created:
                    self.decisions_created += 1
                else:
                    self.decisions_existing += 1
                    self._compare_existing(item["decision"])
        return done

    def _compare_existing(self, decision: dict) -> None:
        """A re-run under the same run name keeps the first run's record of an iteration; where
        this run decided otherwise (another agent, a fallback), that is counted and logged, so the
        store's record is not taken for this run's (the run's own are in steps.csv / steps.json)."""
        from samm.knowledge.store import to_json

        try:
            old = self.store.decision(decision["iteration_key"], loop=decision["loop"])
        except Exception as exc:  # noqa: BLE001 - a comparison only
            log.warning("cannot read the recorded decision %s: %s", decision["iteration_key"], exc)
            return
        if old is None:
            return
        if (old.action != to_json(decision["action"]) or old.source != decision["source"]
                or old.agent != decision["agent"]):
            self.decisions_conflicting += 1
            log.warning("%s of loop %s was recorded by an earlier run as %s %s by %s; this run: %s %s by %s "
                        "(the earlier record stands)", decision["iteration_key"], decision["loop"], old.source,
                        old.action, old.agent, decision["source"], decision["action"], decision["agent"])

    # ------------------------------------------------------------------ workers
    def _worker_args(self, v: int, k: int) -> list[str]:
        w = self.w
        last = min(int(w.depart[v]), w.steps)
        demand = w.usage[v, k:last].astype(np.float64) * float(w.cores[v]) * self.scale
        return [sys.executable, "-m", "samm.testbed.oversub.vm", "--t0", repr(self.t0),
                "--seconds-per-step", str(self.p.seconds_per_step), "--first-step", str(k),
                "--demand", ",".join(f"{d:.9g}" for d in demand), "--slice", str(self.p.slice_s)]

    def _start_workers(self, k: int, rows: list[int]) -> None:
        """Start every worker first (their interpreters come up in parallel), then move each
        into its PM's cgroup and let it go. A worker that cannot be started (no process or file
        descriptor left: EAGAIN, EMFILE) fails its VM alone; before, the OSError ended the run.
        Each worker is in `procs` from its spawn on, so `stop_all` stops it even when an
        interrupt (Ctrl-C) lands in here; before, the workers spawned so far were left running."""
        try:
            err = open(self.worker_log, "ab") if self.worker_log else subprocess.DEVNULL
        except OSError as exc:
            log.warning("workers' stderr not kept: cannot open %s: %s", self.worker_log, exc)
            err = subprocess.DEVNULL
        started = []
        try:
            for v in rows:
                try:
                    p = popen_tied(self._worker_args(v, k), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=err, text=True, bufsize=1)
                except OSError as exc:
                    self._worker_failed(int(v), None, exc)
                    continue
                self.procs[v] = VmProcess(v, int(self.pm_of[v]), p)
                started.append(self.procs[v])
        finally:
            if err is not subprocess.DEVNULL:
                err.close()
        deadline = time.monotonic() + self.p.worker_start_timeout_s
        for vp in started:
            p = vp.proc
            try:
                self._handshake(p, deadline)
                self.cg.add(p.pid, vp.pm)
                p.stdin.write("go\n")
                p.stdin.flush()
            except Exception as exc:  # noqa: BLE001 - the VM fails, the run goes on
                self._worker_failed(int(vp.row), p, exc)
                continue
            vp.cpu_ns_at_step, vp.t_at_step = proc_cpu_ns(p.pid) or 0, self.clock()

    def _worker_failed(self, v: int, p: subprocess.Popen | None, exc: BaseException) -> None:
        """VM `v`'s worker did not start: it is stopped, its reservation released, and its
        decision recorded as not placed (`failed_rows`)."""
        pm = int(self.pm_of[v])
        self.worker_failures += 1
        self.failed_rows.add(v)
        log.error("VM %d: worker did not start (%s); its reservation is released", v, exc)
        self.procs.pop(v, None)
        if p is not None:
            _stop(p)
        self.cluster.release(pm, float(self.assigned[v]), float(self.w.mem[v]), float(self.w.net[v]))
        self.pm_of[v] = NO_PM

    def _check_workers(self, k: int) -> None:
        """A live VM's worker never exits on its own: one found exited (killed, crashed) is
        logged, counted and recorded (key `step<k>:exit:vm<row>`, action "vm-exit"), once. Its
        reservation stays until the VM departs, as a crashed VM's would (and the simulator's)."""
        for vp in list(self.procs.values()):
            code = vp.proc.poll()
            if code is None or vp.row in self.exited_rows:
                continue
            self.exited_rows.add(vp.row)
            self.worker_exits += 1
            why = f"VM {vp.row}'s worker (pid {vp.proc.pid}) on PM {vp.pm} exited with code {code} before step {k}"
            log.error("%s: it burns nothing until it departs at step %d", why, int(self.w.depart[vp.row]))
            self._record(dict(
                iteration_key=f"step{k}:exit:vm{vp.row}", agent=self.agent, loop=self.loop, problem=PROBLEM,
                source="none", action={"vm": vp.row, "pm": vp.pm, "exit_code": code, "step": k},
                action_name="vm-exit", reason=why, observation={"step": k}), kind="exit")

    @staticmethod
    def _handshake(p: subprocess.Popen, deadline: float) -> None:
        left = deadline - time.monotonic()
        ready, _, _ = select.select([p.stdout], [], [], max(0.0, left))
        line = p.stdout.readline() if ready else ""
        if line.strip() != "ready":
            raise RuntimeError(f"no 'ready' from pid {p.pid} (exit code {p.poll()}, said {line.strip()!r})")

    def stop_all(self) -> None:
        for vp in list(self.procs.values()) + self.leaving:
            _release(self.cg, vp.proc)
            _stop(vp.proc)
        self.procs.clear()
        self.leaving.clear()

    # ------------------------------------------------------------------ measurement
    def _measure_rates(self, step: int, now: float, final: bool) -> np.ndarray:
        """Per-subscriber usage rate (used / requested cores) of the VMs live in `step`, from its
        start (or each VM's, if later) to `now`; `final` (the step is over) makes `now` the next
        step's base."""
        rows, used_ns, since = [], [], []
        for vp in list(self.procs.values()) + self.leaving:
            ns = None if _reaped(vp.proc) else proc_cpu_ns(vp.proc.pid)
            if ns is None:
                continue
            if self.w.arrive[vp.row] <= step:  # VMs admitted for the next step are not in it yet
                rows.append(vp.row)
                used_ns.append(ns - vp.cpu_ns_at_step)
                since.append(vp.t_at_step)
            if final:
                vp.cpu_ns_at_step, vp.t_at_step = ns, now
        rows = np.asarray(rows, dtype=int)
        return subscriber_usage_rates(self.w.sub[rows], self.w.cores[rows], np.asarray(used_ns, dtype=float),
                                      np.asarray(since, dtype=float), self.step_start(step), now,
                                      self.setting.n_subscribers, self.scale)

    def begin_step(self, k: int) -> None:
        """Step k has just begun: close step k-1's per-VM measurement, stop the VMs that left."""
        now = self.clock()
        if k > 0:
            rates = self._measure_rates(k - 1, now=now, final=True)
            self.history.append(rates)
            self.records[k - 1].sub_usage_rate = rates.tolist()
        else:
            for vp in self.procs.values():
                vp.cpu_ns_at_step, vp.t_at_step = proc_cpu_ns(vp.proc.pid) or 0, now
        self._check_workers(k)
        for vp in self.leaving:
            _release(self.cg, vp.proc)  # it has left its PM: its exit is not the PM's CPU
            _stop(vp.proc)
        self.leaving.clear()

    def read_pending(self, until: float | None) -> None:
        """Read finished steps' PM usage from Graphite, oldest first, until the wall time
        `until` (None: until all are read, waiting up to each one's deadline). No read runs past
        `until`: a slow Graphite made each read take its whole timeout (2 s), past the next
        admission, and every step began later than the one before."""
        for rec in self.records:
            if rec.graphite_status != "pending":
                continue
            end = rec.start + self.p.seconds_per_step
            while True:
                now = self.clock()
                if now < end + 0.05:  # its last second is not reported yet
                    if until is None:
                        self._sleep_until(end + 0.05)
                        continue
                    return
                timeout = None
                if until is not None:
                    timeout = until - now
                    if timeout < MIN_READ_S:
                        return
                done = self._read_step(rec, give_up=now > end + self.p.read_deadline_s, timeout_s=timeout)
                if done:
                    break
                if until is not None and self.clock() > until:
                    return
                self.sleep(0.1)

    def _read_step(self, rec: StepRecord, give_up: bool, timeout_s: float | None = None) -> bool:
        """One render of the step's window; True when the record is final."""
        s, S = self.setting, self.p.seconds_per_step
        a, b = int(round(rec.start)), int(round(rec.start)) + S
        target = pm_metric(self.p.prefix, self.run_name, "*")
        try:
            series = self._render(target, a - 1, b - 1, timeout_s)
        except GraphiteError as exc:
            log.warning("step %d: Graphite read failed: %s", rec.step, exc)
            series = []
        points: dict[int, list[float]] = {}
        for sr in series:
            # the PM is the second-to-last component (`pm_metric`): a search for "pm" from the
            # left found the run name instead when the run was named "pm", and every step read stale
            try:
                pm = int(sr.target.split(".")[-2])
            except (ValueError, IndexError):
                continue
            # a non-finite or negative point is no measurement (Graphite keeps and renders an inf
            # it was sent, which read as a hot PM): that second counts as missing
            points[pm] = [v for v, ts in sr.values() if a <= ts < b and math.isfinite(v) and v >= 0]
        complete = all(len(points.get(j, [])) >= S for j in range(s.n_pms))
        if not complete and not give_up:
            return False
        rec.pm_points = [len(points.get(j, [])) for j in range(s.n_pms)]
        rec.pm_used = [float(np.mean(points[j])) if points.get(j) else math.nan for j in range(s.n_pms)]
        rec.graphite_status = "ok" if complete else ("partial" if any(rec.pm_points) else "stale")
        used = np.array(rec.pm_used)
        was_hot = rec.pm_hot or [False] * s.n_pms
        now_hot = hot(np.nan_to_num(used, nan=0.0), s.pm_cores, s.beta)
        # a hot event, once recorded on the points then in Graphite, stands after a later read
        rec.pm_hot = [bool(h) or w for h, w in zip(now_hot, was_hot)]
        for j in np.flatnonzero(now_hot):
            if not was_hot[j]:
                self._record_hot(rec, int(j))
        return True

    def _render(self, target: str, a: int, b: int, timeout_s: float | None):
        """The render client's read, its timeout cut to `timeout_s` for this call."""
        base = getattr(self.render, "timeout_s", None)
        if timeout_s is None or base is None or timeout_s >= base:
            return self.render.render(target, a, b)
        self.render.timeout_s = timeout_s
        try:
            return self.render.render(target, a, b)
        finally:
            self.render.timeout_s = base

    def _record_hot(self, rec: StepRecord, pm: int) -> None:
        s = self.setting
        used = rec.pm_used[pm]
        why = f"PM {pm} used {used:.2f} cores > beta x B = {s.beta * s.pm_cores:.2f} in step {rec.step}"
        self.hot_events += 1
        self._record(dict(
            iteration_key=f"step{rec.step}:hot:pm{pm}", agent=self.agent, loop=self.loop, problem=PROBLEM,
            source="none", action={"pm": pm, "used_cores": used, "threshold": s.beta * s.pm_cores, "step": rec.step,
                                   "reserved_cores": rec.pm_reserved[pm], "sim_cores": rec.pm_sim[pm]},
            action_name="hot-event", reason=why, observation={"step": rec.step, "hour": rec.hour}), kind="hot",
            event=dict(what=f"hot PM {pm}", tags=["oversub", "hot", self.run_name], data=why, when=rec.start,
                       timeout_s=1.0))


def _version_of(reply: dict) -> str | None:
    """The reply's policy version as the store keeps it (a string): another type from a
    misbehaving agent is stored as its text, never handed to the database as is (a JSON
    object there failed the write and, before, the whole run)."""
    v = reply.get("policy_version")
    return None if v is None else v if isinstance(v, str) else str(v)


def _reaped(p: subprocess.Popen) -> bool:
    """The worker has been waited for (`poll` found it exited): its pid is free for any new
    process (pid_max is 32768 on many hosts), so nothing may be read from or done to it."""
    return p.returncode is not None


def _release(cg: PmCgroups, p: subprocess.Popen) -> None:
    """Move a worker out of its PM, unless it was reaped: before, a dead worker's pid, taken by
    an unrelated process, had that process moved into the emulated cluster's cgroup."""
    if not _reaped(p):
        cg.release(p.pid)


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)
    for f in (p.stdin, p.stdout):
        try:
            if f:
                f.close()
        except OSError:
            pass
