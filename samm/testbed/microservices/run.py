"""`samm testbed-microservices`: one live run of a controller on the real-container application.

    Docker engine (a private dockerd, or --docker-host)
      │ one busybox container per service, host Python bind-mounted read-only (containers.py),
      │ app.py serving the topology's call graph on 127.0.0.1:(base port + i)
      ▼
    Locust, headless, own process (load.py + locustfile.py): closed-loop users ──► load.jsonl
      ▼                                                      (one line per second)
    every second (t0 + k): supervisor (restart exited containers) -> Measurer (cgroups, engine,
      load.jsonl) -> ControlLoop (controller.act -> guard -> DockerExecutor.set_cpu_limit), one
      decision per step in the Knowledge store

Faults (each once, at --fault-at seconds, default half the run):
  kill-service    SIGKILL one service's container (--fault-service, default `rate`); the
                  supervisor starts it again at the next step and the loop re-applies its limit;
  restart-engine  stop and start the private dockerd (its containers stop with it); the loop
                  records the engine errors, takes no action while the engine is unreachable and
                  the supervisor restarts the containers when it is back;
  stall-load      SIGSTOP Locust for --stall-seconds: stale latency -> no action, recorded.

Outputs under `out_dir`: steps.csv, summary.json, cores.png, p99.png, load.jsonl, locust.log,
conf/topology.json, state/<service>.json and knowledge.db (unless another Knowledge URL is given).
"""
from __future__ import annotations

import csv
import json
import logging
import math
import re
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from agents.microservice_cores.control import AppLimits
from agents.microservice_cores.hosting import make_controller
from agents.microservice_cores.topology import load_topology

from ..options import number_problem
from .loop import ControlLoop, StepRecord

log = logging.getLogger(__name__)

FAULTS = ("kill-service", "restart-engine", "stall-load")
#: the characters Docker allows in a container name, which the run's names are made of
#: (ms<run>-<service>-1): a service named otherwise was refused by the engine mid-start
CONTAINER_CHARS = "a-zA-Z0-9_.-"


@dataclass
class MicroservicesRunOptions:
    """Not in the paper: testbed choices."""
    agent: str = "autoscale"
    agent_params: dict = field(default_factory=dict)
    users: int = 8
    seconds: int = 60
    out_dir: str = "microservices-run"
    topology: str = "testbed"
    faults: tuple = ()                # any of FAULTS, each optionally "<fault>@<second>"
    fault_at: float | None = None     # when a fault without "@" fires (s after step 0); None: seconds / 2
    fault_service: str | None = None  # kill-service's victim (default: rate, else the 2nd service)
    stall_seconds: float = 5.0
    engine_down_seconds: float = 0.0  # extra time the engine stays down in restart-engine
    docker_host: str | None = None    # None: a private dockerd (root); else e.g. unix:///var/run/docker.sock
    base_port: int | None = None      # None: the first free block from 18100
    knowledge_url: str | None = None  # None: sqlite under out_dir
    run_name: str | None = None
    warmup_s: float = 2.0             # load runs this long before step 0
    initial: str = "cap"              # starting limits: cap | fraction=<f>
    seed: int | None = 0
    stale_s: float = 2.0
    plots: bool = True
    cpu_burst: float | None = None    # CFS burst as a share of each quota (ours; None: the topology's cfs_burst)


@dataclass
class MicroservicesRunResult:
    summary: dict
    records: list
    out_dir: Path
    loop: str
    knowledge_url: str
    files: dict = field(default_factory=dict)


def cpu_burst_of(o: MicroservicesRunOptions, topo) -> float | None:
    """The CFS burst the containers get: the run's, else the topology's (the twin's `cfs_burst`),
    else none (the kernel's default, no burst)."""
    from samm.execute.cfs_burst import chosen_burst

    return chosen_burst(o.cpu_burst, topo.cfs_burst)


def _sleep_until(t: float) -> None:
    while (left := t - time.time()) > 0:
        time.sleep(min(left, 0.05))


def _initial_cores(o: MicroservicesRunOptions, topo) -> dict:
    caps = {s: topo.services[s].cap for s in topo.service_names}
    if o.initial == "cap":
        return caps
    key, _, value = o.initial.partition("=")
    if key != "fraction" or not value:
        raise ValueError(f"initial must be 'cap' or 'fraction=<f>', not {o.initial!r}")
    try:
        f = float(value)
    except ValueError:
        raise ValueError(f"initial fraction {value!r} is not a number") from None
    if not 0 < f <= 1:
        raise ValueError("initial fraction must be in (0, 1]")
    return {s: max(0.05, c * f) for s, c in caps.items()}


def parse_faults(faults, default_at: int, seconds: int | None = None) -> dict[int, list[str]]:
    """("kill-service", "stall-load@8") -> {default_at: ["kill-service"], 8: ["stall-load"]}.
    With `seconds`, a fault at a step the run does not have (< 0 or >= seconds) is refused: it
    would never fire, and the run would look as if it had been tested under it."""
    out: dict[int, list[str]] = {}
    for spec in faults:
        name, sep, at = str(spec).partition("@")
        if name not in FAULTS:
            raise ValueError(f"unknown fault {name!r} (known: {', '.join(FAULTS)})")
        try:
            step = int(round(float(at))) if sep else default_at
        except (ValueError, OverflowError):
            raise ValueError(f"fault {spec!r}: the part after @ must be a second") from None
        if seconds is not None and not 0 <= step < seconds:
            raise ValueError(f"fault {spec!r} at second {step} never fires in a run of {seconds} s "
                             f"(steps 0..{seconds - 1})")
        out.setdefault(step, []).append(name)
    return out


def _finite(x, name: str, lo: float, strict: bool = False) -> None:
    problem = number_problem(name, x, lo, strict)
    if problem:
        raise ValueError(problem)


def check_options(o: MicroservicesRunOptions) -> None:
    """Refuses bad options before anything starts (an engine, containers, Locust), naming the option."""
    for name in ("seconds", "users"):
        v = getattr(o, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a whole number >= 1, not {v!r}")
    if o.fault_at is not None:
        _finite(o.fault_at, "fault_at", 0.0)
    _finite(o.stall_seconds, "stall_seconds", 0.0, strict=True)
    _finite(o.engine_down_seconds, "engine_down_seconds", 0.0)
    _finite(o.warmup_s, "warmup_s", 0.0)
    _finite(o.stale_s, "stale_s", 0.0, strict=True)
    if o.base_port is not None and (not isinstance(o.base_port, int) or not 1 <= o.base_port <= 65535):
        raise ValueError(f"base_port must be a port number in 1..65535, not {o.base_port!r}")
    if o.run_name is not None and not re.fullmatch(f"[a-zA-Z0-9][{CONTAINER_CHARS}]*", str(o.run_name)):
        raise ValueError(f"run_name {o.run_name!r} must match [a-zA-Z0-9][{CONTAINER_CHARS}]* (it names containers)")
    if o.cpu_burst is not None:
        from samm.execute.cfs_burst import burst_us
        burst_us(100_000, o.cpu_burst)   # ValueError naming it


def _refuse_a_used_loop(store, loop_name: str) -> None:
    """A loop that already has decisions (a second run with the same --run-name and --out or
    Knowledge URL) would replay them: each step k re-applies run one's step k and never asks the
    controller. Refused (the store closed) before anything starts."""
    try:
        used = bool(store.decisions(loop=loop_name, limit=1))
    except BaseException:
        store.close()
        raise
    if used:
        store.close()
        raise ValueError(f"loop {loop_name} already has decisions in {store.url}: a run there would replay them "
                         "instead of asking the controller (choose another --run-name, --out or --knowledge-url)")


def _default_fault_at(o: MicroservicesRunOptions) -> int:
    return int(round(o.fault_at if o.fault_at is not None else o.seconds / 2))


def run_microservices(o: MicroservicesRunOptions, controller=None) -> MicroservicesRunResult:
    """One run. `controller`: a Controller object to use instead of making `o.agent`."""
    import docker
    from samm.execute.local_dockerd import ensure_busybox_image
    from samm.knowledge.engine import sqlite_url
    from samm.knowledge.store import KnowledgeStore

    from .containers import AppContainers, PortBlock, PrivateDockerd
    from .load import LoadGenerator
    from .measure import Measurer

    check_options(o)
    fault_plan = parse_faults(o.faults, _default_fault_at(o), o.seconds)
    if any("restart-engine" in v for v in fault_plan.values()) and o.docker_host:
        raise ValueError("restart-engine needs the private engine (leave --docker-host out)")
    topo = load_topology(o.topology)
    for svc in topo.service_names:
        if not re.fullmatch(f"[{CONTAINER_CHARS}]+", svc):   # before the engine starts
            raise ValueError(f"{o.topology}: service name {svc!r} must match [{CONTAINER_CHARS}]+ (it names a container)")
    limits = AppLimits(services=topo.service_names, caps=topo.caps, qos_ms=topo.qos_ms)
    victim = o.fault_service or ("rate" if "rate" in topo.services else topo.service_names[min(1, topo.n_services - 1)])
    if victim not in topo.services:
        raise ValueError(f"--fault-service {victim!r} is not a service of {topo.name}")
    if o.base_port is not None and (problem := PortBlock.range_problem(o.base_port, topo.n_services)):
        raise ValueError(f"base_port: {problem}")   # before the engine starts
    if controller is None:
        controller = make_controller(o.agent, topo, **o.agent_params)  # first: a bad agent fails early
    controller.reset(limits)
    initial = _initial_cores(o, topo)
    out = Path(o.out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    run = o.run_name or uuid.uuid4().hex[:8]
    loop_name = f"microservices-{run}"
    # a URL made from parts, not pasted into one: a '?' or '%' in the out path would otherwise be
    # read as the URL's query or an escape, and the store would open a file outside the run
    knowledge_url = o.knowledge_url or sqlite_url(out / "knowledge.db")
    store = KnowledgeStore(knowledge_url)
    _refuse_a_used_loop(store, loop_name)

    engine = None
    app = load = None
    loop = ControlLoop(limits, controller, None, store, loop_name=loop_name,
                       agent_name=getattr(controller, "name", o.agent))
    events: list[dict] = []
    threads: list[threading.Thread] = []
    t_start = time.time()
    failure: BaseException | None = None
    try:
        if o.docker_host:
            base_url = o.docker_host
        else:
            engine = PrivateDockerd()
            engine.start()
            base_url = engine.base_url
        client = docker.DockerClient(base_url=base_url, timeout=30)
        ensure_busybox_image(client)
        client.close()
        app = AppContainers(topo, base_url, out, namespace=f"ms{run}", base_port=o.base_port,
                            cpu_burst=cpu_burst_of(o, topo))
        app.start(initial, seed=o.seed)
        loop.actuator = app
        load = LoadGenerator(app.conf_dir / "topology.json", app.base_port, o.users, out,
                             run_time_s=o.seconds + o.warmup_s + 120, seed=o.seed)
        load.start()
        measurer = Measurer(topo, app, load, stale_s=o.stale_s)
        t0 = math.ceil(time.time() + o.warmup_s) + 0.3   # just after Locust's line for the last second
        _sleep_until(t0 - 1.0)
        measurer.measure(claim=False)                      # primes the counters: step 0 has deltas
        stall_until = None
        load_gone = False
        for k in range(o.seconds):
            _sleep_until(t0 + k)
            # how late this step wakes (an earlier step's engine call blocked), not how long its
            # own measurement takes: a busy host must not turn ordinary steps into no-actions
            late_s = time.time() - (t0 + k)
            fault = ""
            if k in fault_plan:
                for f in fault_plan[k]:
                    if f == "kill-service":
                        try:
                            app.kill(victim)
                            fault += f"kill {victim}; "
                        except Exception as exc:  # noqa: BLE001
                            fault += f"kill {victim} failed: {exc}; "
                    elif f == "stall-load":
                        load.stall()
                        stall_until = k + o.stall_seconds
                        fault += f"stall load {o.stall_seconds:g} s; "
                    elif f == "restart-engine":
                        def restart():
                            try:
                                took = engine.restart(o.engine_down_seconds)
                            except Exception as exc:  # noqa: BLE001 - recorded; the steps go on without it
                                log.error("restarting the engine failed: %s", exc)
                                events.append({"event": "engine restart failed", "t": time.time(),
                                               "error": f"{type(exc).__name__}: {exc}"[:300]})
                                return
                            events.append({"event": "engine back", "t": time.time(), "down_s": round(took, 2)})
                        th = threading.Thread(target=restart, name="engine-restart", daemon=True)
                        th.start()
                        threads.append(th)
                        fault += "restart engine; "
                events.append({"event": fault.strip("; "), "step": k, "t": time.time()})
            if stall_until is not None and k >= stall_until:
                load.resume()
                stall_until = None
                fault += "load resumed; "
            if not load_gone and not load.alive():   # Locust died: stale latency from now on, said once
                load_gone = True
                rc = load.proc.returncode if load.proc is not None else None
                tail = load._log_tail(3)
                events.append({"event": (f"load generator exited (status {rc})" + (f": {tail}" if tail else ""))[:400],
                               "step": k, "t": time.time()})
                log.error("step %d: the load generator exited with status %s", k, rc)
            restarted = app.ensure_running()   # never raises: failures are in app.errors
            if app.errors:
                log.warning("step %d: supervisor: %s", k, " | ".join(app.errors)[:500])
            if restarted:
                events.append({"event": f"restarted {' '.join(restarted)}", "step": k, "t": time.time()})
            m = measurer.measure()
            m.extra["late_s"] = round(late_s, 3)   # >= 1 s: the loop fell behind, no action
            rec = loop.step(k, m, restarted=restarted, fault=fault.strip("; "),
                            errors=[f"supervisor {e}" for e in app.errors])
            if rec.errors:
                log.warning("step %d: %s", k, " | ".join(rec.errors)[:500])
    except BaseException as exc:  # noqa: BLE001 - Ctrl-C included: what was measured is still written
        failure = exc
        log.error("run stopped at step %d: %s: %s", len(loop.records), type(exc).__name__, exc)
    finally:
        close = getattr(controller, "close", None)   # a controller that learns saves what it learned
        if callable(close):
            try:
                close()
            except Exception:  # noqa: BLE001 - the run's records must still be written
                log.exception("closing controller %s failed", loop.agent_name)
        for th in threads:
            th.join(timeout=60)
        # each on its own: a load generator that would not stop left the containers and the
        # private engine running
        for what, part, stop in (("load generator", load, "stop"), ("application", app, "close"),
                                 ("Docker engine", engine, "stop")):
            if part is not None:
                try:
                    getattr(part, stop)()
                except Exception:  # noqa: BLE001 - the rest must still be torn down, the records written
                    log.exception("stopping the %s failed", what)
    try:
        decisions = store.decisions(loop=loop_name)
    except Exception as exc:  # noqa: BLE001 - the store may be what failed: the records still go out
        log.warning("reading the run's decisions back failed: %s", exc)
        decisions = []
    store.close()
    summary = summarize(loop.records, topo, o, run, loop_name, t_start, events)
    summary |= {"agent": loop.agent_name, "decisions": len(decisions), "knowledge_url": store.url,
                "base_port": app.base_port if app else None, "engine": o.docker_host or "private dockerd"}
    if failure is not None:   # the seconds run so far are written, then the failure goes on up
        summary["error"] = f"{type(failure).__name__}: {failure}"[:500] or type(failure).__name__
        summary["completed"] = False
        try:
            write_outputs(out, loop.records, topo, summary, plots=False)
        except Exception:  # noqa: BLE001 - the original failure is the one to report
            log.exception("writing the outputs of a failed run failed")
        raise failure
    if hasattr(loop.controller, "fired"):  # a throttle guard: the service-seconds it lifted
        summary["throttle_guard_lifts"] = int(loop.controller.fired)
    files = write_outputs(out, loop.records, topo, summary, plots=o.plots)
    return MicroservicesRunResult(summary, loop.records, out, loop_name, store.url, files)


def _stats(xs) -> dict:
    xs = np.asarray([x for x in xs if x is not None and math.isfinite(x)], dtype=np.float64)
    if xs.size == 0:
        return {"n": 0, "mean": None, "median": None, "p95": None, "max": None}
    return {"n": int(xs.size), "mean": float(xs.mean()), "median": float(np.median(xs)),
            "p95": float(np.percentile(xs, 95)), "max": float(xs.max())}


def _throttle_split(records: list[StepRecord], qos_ms: float) -> dict:
    """The largest service's share of throttled CFS periods, averaged over the seconds over QoS
    and over the others; each second is paired with its own counters and those of the second
    before (the load generator's newest second may trail the cgroup's by up to one)."""
    def worst(i: int) -> float | None:
        vals = [v for j in (i - 1, i) if 0 <= j < len(records) for v in records[j].throttled.values()
                if v is not None and math.isfinite(v)]
        return max(vals) if vals else None
    over = [worst(i) for i, r in enumerate(records) if math.isfinite(r.p99_ms) and r.p99_ms > qos_ms]
    rest = [worst(i) for i, r in enumerate(records) if math.isfinite(r.p99_ms) and r.p99_ms <= qos_ms]
    return {"violating_max_service": _stats(over)["mean"], "other_max_service": _stats(rest)["mean"],
            "violating_seconds": len(over)}


def summarize(records: list[StepRecord], topo, o: MicroservicesRunOptions, run: str, loop_name: str,
              t_start: float, events: list) -> dict:
    services = topo.service_names
    cores = [r.total_cores for r in records]
    p99 = [r.p99_ms for r in records]
    known = [x for x in p99 if math.isfinite(x)]
    violations = sum(x > topo.qos_ms for x in known)
    rps = [r.requests_per_s for r in records if math.isfinite(r.requests_per_s)]
    fails = [r.failures_per_s for r in records if math.isfinite(r.failures_per_s)]
    used = {s: float(np.mean([r.used[s] for r in records])) if records else None for s in services}
    mean_rps = float(np.mean(rps)) if rps else 0.0
    visits = dict(zip(services, topo.mean_visits()))
    per_call = {s: (used[s] * 1000.0 / (mean_rps * visits[s]) if mean_rps > 0 and visits[s] > 0 else None)
                for s in services}
    return {
        "run": run, "loop": loop_name, "agent": o.agent, "topology": topo.name, "users": o.users,
        "seconds": len(records), "qos_ms": topo.qos_ms, "faults": list(o.faults), "cpu_burst": cpu_burst_of(o, topo),
        "fault_steps": {str(k): v for k, v in sorted(parse_faults(o.faults, _default_fault_at(o)).items())},
        "total_cores": {"mean": float(np.mean(cores)) if cores else None, "max": float(np.max(cores)) if cores else None,
                        "min": float(np.min(cores)) if cores else None, "final": cores[-1] if cores else None,
                        "caps": float(topo.caps.sum())},
        "used_cores_mean": float(sum(used.values())) if records else None,
        "p99_ms": _stats(p99),
        "violation_rate": violations / len(known) if known else None,
        "violation_seconds": int(violations),
        "known_latency_seconds": len(known),
        "unknown_latency_seconds": len(records) - len(known),
        "stale_seconds": sum(r.latency_state == "stale" for r in records),
        "requests_per_s_mean": mean_rps,
        "failures_total": float(np.sum(fails)) if fails else 0.0,
        "actions": {"steps_with_resize": sum(bool(r.applied) for r in records),
                    "limit_changes": sum(len(r.applied) for r in records),
                    "reapplied": sum(len(r.reapplied) for r in records),
                    "no_action_steps": sum(r.action.startswith("no action") for r in records),
                    "steps_with_errors": sum(bool(r.errors) for r in records),
                    "clipped_steps": sum(bool(r.clipped) for r in records)},
        "no_action_reasons": {a: sum(r.action == a for r in records)
                              for a in sorted({r.action for r in records if r.action.startswith("no action")})},
        "restarts": [{"step": r.step, "services": r.restarted} for r in records if r.restarted],
        "per_service": {s: {"mean_cores": float(np.mean([r.limits[s] for r in records])) if records else None,
                            "mean_used": used[s], "cap": topo.services[s].cap,
                            "cpu_ms_per_call_measured": per_call[s], "cpu_ms_topology": topo.services[s].cpu_ms,
                            "throttled_mean": _stats([r.throttled.get(s) for r in records])["mean"]}
                        for s in services},
        # the seconds over QoS beside the rest: did they meet the CFS quota more often?
        "throttled_when_violating": _throttle_split(records, topo.qos_ms),
        "step_duration_ms": _stats([r.duration_ms for r in records]),
        "events": events, "wall_s": round(time.time() - t_start, 1),
    }


def write_outputs(out: Path, records: list[StepRecord], topo, summary: dict, plots: bool = True) -> dict:
    files = {"steps": out / "steps.csv", "summary": out / "summary.json"}
    services = topo.service_names
    with open(files["steps"], "w", newline="") as f:
        if records:
            w = csv.DictWriter(f, fieldnames=list(records[0].csv_row(services)))
            w.writeheader()
            for r in records:
                w.writerow(r.csv_row(services))
    if plots and records:
        try:
            files |= _plots(out, records, topo, summary)
        except ImportError as exc:  # matplotlib is in the train extra
            summary["plots"] = f"not drawn: {exc}"
    files["summary"].write_text(json.dumps(summary, indent=2, default=float))
    return files


def _plots(out: Path, records: list[StepRecord], topo, summary: dict) -> dict:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = np.array([r.step for r in records])
    services = topo.service_names
    fault_steps = [r.step for r in records if r.fault]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    stack = np.array([[r.limits[s] for r in records] for s in services])
    ax.stackplot(k, stack, labels=services, alpha=0.75, step="post")
    ax.plot(k, [sum(r.used.values()) for r in records], color="black", lw=1.2, label="used (all services)")
    ax.axhline(float(topo.caps.sum()), color="grey", ls=":", lw=1, label="sum of caps")
    for f in fault_steps:
        ax.axvline(f, color="red", ls="--", lw=0.8)
    ax.set_xlabel("second")
    ax.set_ylabel("CPU limit (cores)")
    ax.set_title(f"{summary['agent']}, {summary['users']} users: mean {summary['total_cores']['mean']:.3f} cores")
    ax.legend(fontsize=7, ncol=3, loc="upper right")
    fig.tight_layout()
    fig.savefig(out / "cores.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(9, 4))
    p99 = np.array([r.p99_ms for r in records])
    ax.plot(k, p99, marker=".", lw=1, label="p99 of the second")
    ax.axhline(topo.qos_ms, color="red", lw=1, label=f"QoS {topo.qos_ms:g} ms")
    unknown = [r.step for r in records if not math.isfinite(r.p99_ms)]
    if unknown:
        ax.scatter(unknown, [topo.qos_ms * 0.05] * len(unknown), marker="x", color="orange",
                   label="latency unknown (stale / none completed)")
    for f in fault_steps:
        ax.axvline(f, color="red", ls="--", lw=0.8)
    ax.set_yscale("log")
    ax.set_xlabel("second")
    ax.set_ylabel("end-to-end p99 (ms)")
    vr = summary["violation_rate"]
    ax.set_title(f"violation rate {vr * 100:.1f} %" if vr is not None else "no known latency")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "p99.png", dpi=110)
    plt.close(fig)
    return {"cores_png": out / "cores.png", "p99_png": out / "p99.png"}


def options_dict(o: MicroservicesRunOptions) -> dict:
    return asdict(o)
