"""`samm testbed-oversub`: one live replay of an oversubscription workload, end to end.

    hosted agent (REST /admit/batch) ◄── admission executor ──► Knowledge store (decisions, hot events)
                                              │ best fit (the simulator's Cluster)
                                              ▼
          PM cgroups (cpu quota = PM cores x host_cores_per_pm_core) ◄── VM worker processes
                                              │ cpuacct every second
                                              ▼
                          Graphite (samm.oversub.<run>.pm.<k>.cpu_cores) ──► hotness per step

The emulated cluster is scaled to a host budget: `host_cores` host cores for all PMs together
(1.2 by default, so a run fits beside the rest on a 2-core machine); an emulated core is
host_cores / (PMs x PM cores) of a host core. The workload is the setting's training episode
(`agents.oversubscription.data.generate_trace(...).train_workload()` when that module is
present, else a small seeded synthetic one), cut to the run: cold start, the first `steps`
steps, each request kept with probability PMs / the setting's PMs (the load per PM stays the
setting's), at most `max_vms` VMs.

Outputs under `out`: steps.csv (per step: requests, reservations, each PM's reserved cores, the
usage measured through Graphite, the simulator's usage for the same placements, hot flags),
usage.png (measured vs simulated per PM), summary.json (S-Cores, hot steps per PM, the
sim-vs-live usage gap, whether the simulator replays the same placements), vms.log (workers'
stderr) and knowledge.db (unless another Knowledge URL is given). Decisions the Knowledge store
refused until the end of the run go to unrecorded_decisions.jsonl (one JSON decision a line,
with the store's error), counted in the summary's `decisions_unrecorded`.
"""
from __future__ import annotations

import csv
import json
import logging
import math
import re
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from agents.oversubscription.cluster import hot
from agents.oversubscription.settings import Setting, get_setting
from agents.oversubscription.sim import OversubSim
from agents.oversubscription.workload import Workload
from samm.localproc import AppInThread

from ..options import number_problem
from .admission import AdmissionExecutor, LiveParams, StepRecord

log = logging.getLogger(__name__)

STORE_BUSY_TIMEOUT_S = 1.0


@dataclass
class OversubRunOptions:
    agent: str = "c2marl"            # hosted agent name (what --agent NAME[=DIR] names)
    policy_dir: str | None = None
    setting: str | None = "tiny"     # None: a learned agent's own setting (the shipped C2MARL's: azure), else tiny
    pms: int = 4                     # emulated PMs (the setting's PM size, fewer of them)
    steps: int = 8
    seconds_per_step: int = 1
    seed: int = 0
    max_vms: int = 40                # a VM is a process: keep the count modest on a small host
    host_cores: float = 1.2          # host cores the whole emulated cluster may use
    out_dir: str | None = None
    run_name: str | None = None      # Graphite path component and Knowledge loop `oversub-<run>`
    service_url: str | None = None   # an external `samm serve`; None: the agent is served in process
    knowledge_url: str | None = None
    admit_mode: str = "batch"
    start_delay_s: float = 2.0       # the collector runs this long before step 0 (metrics exist by then)


def check_options(opts: OversubRunOptions) -> None:
    """A clear ValueError naming the option, before anything is started (steps=0 ran a whole
    run and failed in its summary, pms=0 divided by zero)."""
    for name in ("pms", "steps", "max_vms"):  # seconds_per_step: LiveParams checks it
        v = getattr(opts, name)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {v!r}")
    if isinstance(opts.seed, bool) or not isinstance(opts.seed, (int, np.integer)) or opts.seed < 0:
        raise ValueError(f"seed must be a whole number >= 0, got {opts.seed!r}")
    for name in ("host_cores", "start_delay_s"):
        if problem := number_problem(name, getattr(opts, name), strict=name == "host_cores"):
            raise ValueError(problem)


@dataclass
class OversubRunResult:
    summary: dict
    records: list[StepRecord]
    out_dir: Path
    run_name: str
    loop: str
    knowledge_url: str
    cgroup_name: str
    files: dict[str, Path] = field(default_factory=dict)


# --------------------------------------------------------------------------- workload
def synthetic_workload(setting: Setting, steps: int, seed: int) -> Workload:
    """A small seeded stand-in for the calibrated generator (used only when `data.py` is not
    there): Poisson arrivals per subscriber, Azure-like sizes, lives of 2-10 steps, a daily
    usage profile per subscriber with its own peak hour plus per-VM noise. Not calibrated."""
    rng = np.random.default_rng(seed)
    n = setting.n_subscribers
    per_step = setting.n_pms * setting.pm_cores * 0.5 / 6.0 / 4.0  # ~50 % of cores live at lives ~6, ~4 cores
    subs, arrive, depart, cores, mem, usage = [], [], [], [], [], []
    level = rng.uniform(0.25, 0.6, n)
    peak = rng.integers(0, 24, n)
    for t in range(steps):
        for s in range(n):
            for _ in range(rng.poisson(per_step / n)):
                c = float(rng.choice([1, 2, 4, 8, 16], p=[0.3, 0.3, 0.2, 0.15, 0.05]))
                life = int(rng.integers(2, 11))
                hours = (np.arange(steps) - peak[s]) % 24
                profile = level[s] * (0.75 + 0.25 * np.cos(2 * np.pi * hours / 24))
                u = np.clip(profile + rng.normal(0, 0.08, steps), 0.02, 1.0)
                u[:t] = 0
                u[t + life:] = 0
                subs.append(s), arrive.append(t), depart.append(t + life), cores.append(c)
                mem.append(c * 4.0), usage.append(u)
    v = len(subs)
    return Workload(n_subscribers=n, steps=steps, sub=np.array(subs, dtype=np.int32), arrive=np.array(arrive),
                    depart=np.array(depart), cores=np.array(cores), mem=np.array(mem),
                    net=np.array(cores) * 0.25, usage=np.array(usage).reshape(v, steps),
                    name=f"synthetic-{setting.name}-{seed}")


def base_workload(setting: Setting, seed: int, steps: int) -> Workload:
    try:
        from agents.oversubscription.data import generate_trace
    except ImportError:
        log.warning("agents.oversubscription.data is not available: using a synthetic workload")
        return synthetic_workload(setting, max(steps, 1), seed)
    return generate_trace(setting, seed).train_workload()


def live_workload(base: Workload, steps: int, keep_fraction: float, max_vms: int, seed: int) -> Workload:
    """The run's cut of `base`: cold start, arrivals in the first `steps` steps, each kept with
    probability `keep_fraction`, at most `max_vms` (earliest first)."""
    rng = np.random.default_rng(seed)
    order = base.order()
    order = order[(base.arrive[order] >= 0) & (base.arrive[order] < steps)]
    order = order[rng.random(len(order)) < keep_fraction][:max_vms]
    steps = min(steps, base.steps)
    return base.subset(np.sort(order), steps=steps, usage=base.usage[np.sort(order), :steps],
                       name=f"{base.name}-live")


# --------------------------------------------------------------------------- policy and service
class RuleAdapter:
    """A rate rule (`baselines`: `rates(view)`, no setting) as a hostable policy."""

    def __init__(self, rule, setting: Setting):
        self.rule, self.setting = rule, setting
        self.version = getattr(rule, "name", type(rule).__name__)

    def rates(self, view) -> np.ndarray:
        return self.rule.rates(view)

    def metadata(self) -> dict:
        return {"kind": "rule", "version": self.version, "setting": self.setting.name}


def resolve_policy(agent: str, policy_dir: str | None, setting: Setting):
    """The agent's hosted policy (`agents.registry.make_policy`), or `grid-<rho>` (one static
    rate, the paper's Grid-rho baseline) for runs without a trained policy."""
    m = re.fullmatch(r"grid-([0-9]*\.?[0-9]+)", agent)
    if m:
        from agents.oversubscription.baselines import GridRule

        return RuleAdapter(GridRule(float(m.group(1)), setting.n_subscribers), setting)
    from agents.oversubscription.policy import HOSTED_RULES
    from agents.registry import make_policy

    # a rule is built for the testbed's setting (its prior: that setting's calibrated training days)
    policy = make_policy(agent, policy_dir, **({"setting": setting.name} if agent in HOSTED_RULES else {}))
    if not hasattr(policy, "rates") or not hasattr(policy, "setting"):
        raise ValueError(f"agent {agent!r} is not an oversubscription policy (no rates(view) / setting)")
    return policy


def check_service(url: str, agent: str, setting: Setting, timeout_s: float = 5.0) -> None:
    """A ValueError when the service at `url` answers that it can never decide for this run: it
    hosts no admit routes for `agent` (404) or refuses the run's cluster (422: its agent decides
    for another number of subscribers). Before, each such run replayed every step admitting at
    rate 1 after a failed call and ended 0. One empty-cluster batch call, no state kept by the
    service; a service not reachable yet is left to the run (its steps fall back, as recorded)."""
    import requests

    n = setting.n_subscribers
    body = {"hour": 0, "allocated": [[0.0, 0.0, 0.0]] * n, "requested_live": [0.0] * n,
            "requests": [{"subscriber": 0, "cores": 1.0}]}
    where = f"{url.rstrip('/')}/v1/agents/{agent}/admit/batch"
    try:
        r = requests.post(where, json=body, timeout=timeout_s)
    except requests.RequestException as exc:
        log.warning("oversub testbed: cannot reach %s before the run (%s); its steps will fall back", where, exc)
        return
    if r.status_code == 404:
        raise ValueError(f"--service-url {url} hosts no oversubscription agent {agent!r} (POST {where}: 404)")
    if r.status_code == 422:
        try:
            answer = r.json()
        except ValueError:
            answer = r.text[:300]
        detail = answer.get("detail", answer) if isinstance(answer, dict) else answer
        raise ValueError(f"agent {agent!r} at {url} refuses setting {setting.name!r}'s cluster of {n} "
                         f"subscribers ({detail}): name the setting it was made for (--setting)")


class InProcessService(AppInThread):
    """The admit routes (`agents.oversubscription.service.create_app`) on uvicorn in a thread,
    on a free loopback port."""

    def __init__(self, agent: str, policy):
        from agents.oversubscription.service import create_app

        super().__init__(create_app(agent, policy), name="oversub-service", what="the admission service")

    def start(self, timeout_s: float = 20.0) -> "InProcessService":
        return super().start(timeout_s)


# --------------------------------------------------------------------------- the run
def run_oversub(opts: OversubRunOptions, *, policy=None, workload: Workload | None = None, graphite=None,
                progress: Callable[[StepRecord], None] | None = None) -> OversubRunResult:
    """One live run. `policy` (an object with `setting`, `rates(view)`, `metadata()`) overrides
    `opts.agent`'s; `workload` is used as given (not cut); `graphite` is a running
    `LocalGraphite` (else one is started under `out/graphite` and stopped at the end)."""
    from samm.knowledge.engine import sqlite_url
    from samm.knowledge.store import KnowledgeStore
    from samm.monitor.graphite_client import GraphiteSender, RenderClient

    from .cgroups import PmCgroups
    from .collector import PmCollector

    check_options(opts)
    if opts.setting is None and policy is None and opts.service_url is None and opts.agent == "c2marl":
        # a learned policy decides for the subscribers it was trained on: left out, the setting is
        # its own (`samm testbed-oversub --agent c2marl` failed on tiny's 3 subscribers against 9)
        policy = resolve_policy(opts.agent, opts.policy_dir, None)
    if opts.setting is None and isinstance(getattr(policy, "setting", None), Setting):
        base_setting = policy.setting
    else:
        base_setting = get_setting(opts.setting or "tiny")
    setting = base_setting.scaled(n_pms=int(opts.pms))
    out = Path(opts.out_dir or f"oversub-run-{int(time.time())}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    run = opts.run_name or uuid.uuid4().hex[:10]
    if len(run) > 48:
        raise ValueError("run_name must be at most 48 characters (it names the Knowledge loop)")
    if workload is None:
        base = base_workload(base_setting, opts.seed, opts.steps)
        if opts.steps > base.steps:  # before, cut to the workload's length without a word
            raise ValueError(f"steps must be at most {base.steps} (setting {base_setting.name!r}'s workload has "
                             f"{base.steps} steps), got {opts.steps}")
        workload = live_workload(base, opts.steps, keep_fraction=min(1.0, opts.pms / base_setting.n_pms),
                                 max_vms=opts.max_vms, seed=opts.seed)
    if workload.n_subscribers != setting.n_subscribers:
        raise ValueError(f"the workload has {workload.n_subscribers} subscribers, setting {setting.name!r} has "
                         f"{setting.n_subscribers}")
    scale = opts.host_cores / (setting.n_pms * setting.pm_cores)
    from .cgroups import MIN_QUOTA_US, PERIOD_US

    if setting.pm_cores * scale * PERIOD_US < MIN_QUOTA_US:  # before anything is started
        raise ValueError(f"{setting.n_pms} PMs in {opts.host_cores:g} host cores give each PM "
                         f"{setting.pm_cores * scale:.4g} host cores, below the kernel's smallest CPU quota "
                         f"({MIN_QUOTA_US / PERIOD_US:g}): use fewer PMs (--pms) or more host cores (--host-cores)")
    params = LiveParams(seconds_per_step=opts.seconds_per_step, host_cores_per_pm_core=scale,
                        admit_mode=opts.admit_mode)
    if opts.service_url is not None:
        check_service(opts.service_url, opts.agent, setting)
    knowledge_url = opts.knowledge_url or sqlite_url(out / "knowledge.db")

    cleanup: list[Callable[[], None]] = []
    try:
        if graphite is None:
            from samm.monitor.local_graphite import LocalGraphite

            graphite = LocalGraphite(out / "graphite")
            graphite.start()
            cleanup.append(graphite.close)
        # a short busy timeout: a locked SQLite store costs a step at most this, not 30 s a write
        # (a refused write is kept and written later: AdmissionExecutor.flush_unrecorded)
        store = KnowledgeStore(knowledge_url, busy_timeout_s=STORE_BUSY_TIMEOUT_S)
        cleanup.append(store.close)
        service_url = opts.service_url
        if service_url is None:
            if policy is None:
                policy = resolve_policy(opts.agent, opts.policy_dir, setting)
            if policy.setting.n_subscribers != setting.n_subscribers:
                raise ValueError(f"agent {opts.agent!r} decides for {policy.setting.n_subscribers} subscribers, "
                                 f"setting {setting.name!r} has {setting.n_subscribers}")
            service = InProcessService(opts.agent, policy).start()
            cleanup.append(service.stop)
            service_url = service.url
        cg = PmCgroups(setting.n_pms, quota_host_cores=setting.pm_cores * scale).create()
        cleanup.append(cg.close)
        sender = GraphiteSender(graphite.carbon_host, graphite.carbon_port)
        collector = PmCollector(cg.usage_ns, sender, run, scale).start()
        cleanup.append(collector.stop)
        render = RenderClient(graphite.render_url, timeout_s=2.0)
        executor = AdmissionExecutor(setting, workload, agent=opts.agent, service_url=service_url, store=store,
                                     run=run, cgroups=cg, sender=sender, render=render,
                                     render_url=graphite.render_url, params=params, worker_log=out / "vms.log")
        t0 = float(math.ceil(time.time() + opts.start_delay_s))
        started = time.time()
        interrupted: BaseException | None = None
        try:
            records = executor.run(opts.steps, t0)
        except (KeyboardInterrupt, SystemExit) as exc:
            # Ctrl-C, or SIGTERM (the CLI makes it SystemExit): the steps run so far are written
            # below, then the interruption goes on (before, all of them were lost)
            interrupted, records = exc, executor.records
            log.warning("oversub testbed: interrupted after %d step(s); writing what was measured", len(records))
            executor.flush_unrecorded(force=True)
        wall = time.time() - started
        throttled = cg.throttled()
        cgroup_name = cg.name
        collector.stop()  # idempotent; its counts below are final
        delivery = {"collector_seconds_filled": collector.filled, "collector_errors": collector.errors,
                    "points_dropped": sender.dropped, "late_reads": executor.late_reads}
    finally:
        for fn in reversed(cleanup):
            try:
                fn()
            except Exception:  # noqa: BLE001 - every part gets its chance to stop
                log.exception("oversub testbed: clean-up step failed")
    if progress:
        for rec in records:
            progress(rec)
    summary = summarise(setting, workload, records, executor)
    summary |= {"run": run, "agent": opts.agent, "setting": setting.name, "pms": setting.n_pms,
                "seconds_per_step": params.seconds_per_step, "host_cores_per_pm_core": scale,
                "host_cores": opts.host_cores, "admit_mode": params.admit_mode, "wall_s": round(wall, 2),
                "throttled_periods_per_pm": throttled, "workload": workload.name, "vms": workload.n_vms,
                "graphite_delivery": delivery, "interrupted": interrupted is not None}
    files = write_outputs(out, setting, records, summary)
    if executor.unrecorded:
        files["unrecorded"] = write_unrecorded(out / "unrecorded_decisions.jsonl", executor.unrecorded)
    if interrupted is not None:
        raise interrupted
    return OversubRunResult(summary, records, out, run, executor.loop, knowledge_url, cgroup_name, files)


# --------------------------------------------------------------------------- results
def sim_replay(setting: Setting, workload: Workload, records: list[StepRecord]) -> bool | None:
    """Does the simulator, given each step's rates, place every VM where the live run did?
    None when the live run's rates are not one per subscriber per step (per-vm mode with
    differing answers, a partial failure)."""
    sim = OversubSim(setting, workload)
    sim.reset()
    for rec in records:
        if sim.done:
            return None
        rates = np.ones(setting.n_subscribers)
        seen: dict[int, float] = {}
        for sub, r in zip(rec.subscribers, rec.rates):
            if seen.setdefault(sub, r) != r:
                return None
            rates[sub] = r
        _, res = sim.step(rates)
        if list(res.placements) != list(rec.placements):
            return False
    return True


def summarise(setting: Setting, workload: Workload, records: list[StepRecord], executor: AdmissionExecutor) -> dict:
    k = setting.n_pms
    # [T, K] even for T = 0: a run interrupted before its first step broadcast (0,) against (0, K)
    # here, and the CLI printed that ValueError instead of "interrupted" (exit 2, not 143)
    used = np.array([r.pm_used if r.pm_used else [math.nan] * k for r in records], dtype=float).reshape(-1, k)
    sim = np.array([r.pm_sim for r in records], dtype=float).reshape(len(records), k)
    capped = np.minimum(sim, setting.pm_cores)
    have = np.isfinite(used)
    gap = (used - sim)[have]
    gap_capped = (used - capped)[have]
    reserved = np.array([r.pm_reserved for r in records], dtype=float).reshape(len(records), k)
    busy = have & (reserved > 0)
    requested = sum(r.requested_cores for r in records)
    assigned = sum(r.assigned_cores for r in records)
    hot_live = np.array([r.pm_hot if r.pm_hot else [False] * k for r in records], dtype=bool).reshape(-1, k)
    hot_sim = hot(sim, setting.pm_cores, setting.beta) if len(records) else np.zeros((0, k), bool)
    admit_ms = [r.admit_ms for r in records if r.requests]
    return {
        "steps": len(records),
        "requests": int(sum(r.requests for r in records)),
        "placed": int(sum(r.placed for r in records)),
        "rejected": int(sum(r.rejected for r in records)),
        "fallbacks": int(sum(r.fallbacks for r in records)),
        "worker_failures": executor.worker_failures,
        "worker_exits": executor.worker_exits,
        "s_cores": 1.0 - assigned / requested if requested > 0 else 0.0,
        "hot_steps_per_pm": hot_live.sum(axis=0).tolist(),
        "hot_steps_per_pm_sim": hot_sim.sum(axis=0).tolist(),
        # over the PM-steps Graphite measured (gap.pm_steps_missing counts the others): one without a
        # point is not known cold (a run whose Graphite was down agreed with every cold simulated step)
        "hot_agreement": float((hot_live == hot_sim)[have].mean()) if have.any() else None,
        "gap": {
            "pm_steps_measured": int(have.sum()),
            "pm_steps_missing": int((~have).sum()),
            "mean_abs_cores": float(np.abs(gap).mean()) if gap.size else None,
            "max_abs_cores": float(np.abs(gap).max()) if gap.size else None,
            "mean_cores": float(gap.mean()) if gap.size else None,
            "relative_total": float(np.abs(gap).sum() / sim[have].sum()) if gap.size and sim[have].sum() > 0 else None,
            "mean_abs_pct_of_pm": float(100 * np.abs(gap).mean() / setting.pm_cores) if gap.size else None,
            "mean_abs_cores_vs_capped_sim": float(np.abs(gap_capped).mean()) if gap.size else None,
            # PM-steps with something placed on the PM (idle PMs measure ~0 and dilute the mean)
            "mean_abs_cores_busy": float(np.abs(used - sim)[busy].mean()) if busy.any() else None,
            "pm_steps_busy": int(busy.sum()),
        },
        "graphite_status": {s: sum(r.graphite_status == s for r in records)
                            for s in ("ok", "partial", "stale", "pending")},  # pending: an interrupted run
        "sim_placements_match": sim_replay(setting, workload, records),
        "decisions_created": executor.decisions_created,
        "decisions_existing": executor.decisions_existing,
        "decisions_conflicting": executor.decisions_conflicting,
        "decisions_unrecorded": len(executor.unrecorded),
        "store_errors": executor.store_errors,
        "hot_events": executor.hot_events,
        "hot_events_created": executor.hot_events_created,
        "admit_ms_median": float(np.median(admit_ms)) if admit_ms else None,
        "admit_ms_max": float(np.max(admit_ms)) if admit_ms else None,
        "late_admissions": int(sum(r.late_s > 0 for r in records)),
    }


def write_unrecorded(path: Path, unrecorded: list[dict]) -> Path:
    """The decisions the store never took, one JSON object a line (nothing is lost)."""
    from samm.knowledge.store import to_json

    with path.open("w") as f:
        for item in unrecorded:
            f.write(json.dumps(to_json({"kind": item["kind"], "error": item["error"], **item["decision"]},
                                       "unrecorded decision")) + "\n")
    return path


def write_outputs(out: Path, setting: Setting, records: list[StepRecord], summary: dict) -> dict[str, Path]:
    k = setting.n_pms
    csv_path = out / "steps.csv"
    head = ["step", "hour", "start", "requests", "placed", "rejected", "fallbacks", "requested_cores",
            "assigned_cores", "live_vms", "graphite_status", "admit_ms", "late_s"]
    for j in range(k):
        head += [f"pm{j}_reserved", f"pm{j}_used", f"pm{j}_sim", f"pm{j}_hot", f"pm{j}_points"]
    with csv_path.open("w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(head)
        for r in records:
            row = [r.step, r.hour, f"{r.start:.0f}", r.requests, r.placed, r.rejected, r.fallbacks,
                   f"{r.requested_cores:.3f}", f"{r.assigned_cores:.3f}", r.live_vms, r.graphite_status,
                   f"{r.admit_ms:.2f}", f"{r.late_s:.3f}"]
            for j in range(k):
                used = r.pm_used[j] if r.pm_used else math.nan
                row += [f"{r.pm_reserved[j]:.3f}", "" if math.isnan(used) else f"{used:.3f}", f"{r.pm_sim[j]:.3f}",
                        int(r.pm_hot[j]) if r.pm_points and r.pm_points[j] else "",  # no point: hotness unknown
                        r.pm_points[j] if r.pm_points else 0]
            wr.writerow(row)
    summary_path = out / "summary.json"
    summary_path.write_text(json.dumps(summary, indent=2, default=str))
    (out / "steps.json").write_text(json.dumps([asdict(r) for r in records], default=str))
    files = {"csv": csv_path, "summary": summary_path}
    try:
        files["png"] = figure(out / "usage.png", setting, records, summary)
    except Exception as exc:  # noqa: BLE001 - a figure is never a reason to lose the run's data
        log.warning("oversub testbed: no figure: %s", exc)
    return files


def figure(path: Path, setting: Setting, records: list[StepRecord], summary: dict) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = setting.n_pms
    steps = [r.step for r in records]
    cols = min(k, 4)
    rows = int(math.ceil(k / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.6 * rows), squeeze=False, sharey=True)
    for j in range(k):
        ax = axes[j // cols][j % cols]
        ax.plot(steps, [r.pm_used[j] if r.pm_used else math.nan for r in records], "o-", label="live (Graphite)")
        ax.plot(steps, [r.pm_sim[j] for r in records], "x--", label="simulator")
        ax.step(steps, [r.pm_reserved[j] for r in records], where="post", color="0.6", label="reserved")
        ax.axhline(setting.beta * setting.pm_cores, color="red", lw=0.8, label="hot (beta B)")
        ax.set_title(f"PM {j}", fontsize=9)
        ax.set_xlabel("step (hour)", fontsize=8)
        if j % cols == 0:
            ax.set_ylabel("cores", fontsize=8)
    for j in range(k, rows * cols):
        axes[j // cols][j % cols].axis("off")
    axes[0][0].legend(fontsize=7)
    g = summary.get("gap", {})
    fig.suptitle(f"oversub testbed {summary.get('run', '')}: S-Cores {summary.get('s_cores', 0):.3f}, "
                 f"mean |live - sim| {g.get('mean_abs_cores') or float('nan'):.2f} cores", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

