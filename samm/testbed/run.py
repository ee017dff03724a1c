"""The emulated cloud testbed, end to end on one machine.

    driver ──submit──► job queue (SQLite) ◄──lease/complete── workers (processes)
                             │ counters                          │ cpu/ram every second
                             ▼                                   ▼
                         Graphite (real carbon-cache + graphite-web, 1 s retention)
                                                 │ last complete interval
    moto server: 3 ASGs ◄── AwsAsgExecutor ◄── SAMM daemon (unchanged production code)
          │ instances
          ▼
    reconciler ── seeded boot delay ──► worker process per InService instance (SIGKILL on removal)

Time is compressed: one wall second is `compression` workload seconds. The daemon's interval
(60 workload s), cool-down and warm-up are divided accordingly; collectors report every wall
second (Graphite's finest resolution; at 30x that is every 30 workload seconds, not the
paper's 10). Billing and SLA figures come from the testbed's own records (`billing.py`) in the
simulator's units, so they compare with `samm evaluate` directly.
"""
from __future__ import annotations

import csv
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from samm.config import SammConfig
from samm.knowledge.engine import sqlite_url
from samm.localproc import popen_tied

log = logging.getLogger(__name__)

PAPER_GROUPS = (  # name, cores, RAM GB, $/h, min, max, ASG
    ("S", 2, 8, 0.2, 1, 10, "samm-m5a-large"),
    ("M", 4, 16, 0.4, 0, 10, "samm-m5a-xlarge"),
    ("L", 8, 32, 0.8, 0, 10, "samm-m5a-2xlarge"),
)
PREFIX = "samm"


_LIVE: set[int] = set()  # the testbed started (and not closed) in this process, if any
_LIVE_LOCK = threading.Lock()


@dataclass
class TestbedOptions:
    __test__ = False  # not a pytest test class
    agent: str = "lstm-ppo"
    params: dict | None = None
    policy_dir: str | None = None
    workload: str = "seed-1551-short"
    compression: float = 30.0
    seed: int = 1
    step_s: float = 60.0  # the daemon's interval, workload seconds
    cooldown_s: float = 0.0  # workload seconds (the paper's simulator had none)
    warmup_s: float = 0.0
    report_every_s: float = 1.0  # wall seconds between collector reports
    timeout_s: float = 1200.0  # wall seconds before giving up
    initial: tuple[int, int, int] = (1, 1, 1)
    out_dir: str | None = None
    daemon_process: bool = False  # run `samm run` as its own process (so it can be killed -9)
    workload_obj: object | None = None  # a Workload instead of a name (tests)
    agent_obj: object | None = None  # the agent `check_options` built (the CLI checks before it starts)
    aws_fault_proxy: bool = False  # the daemon reaches moto through `AwsFaultProxy` (tb.aws_proxy)
    knowledge_url: str | None = None  # default: an SQLite file in out_dir
    daemons: int = 1  # daemon processes started (more than one: a leader and standbys, needs ha)
    ha: bool = False  # the daemons' `ha.enabled` (a PostgreSQL knowledge_url)


@dataclass
class TestbedResult:
    summary: dict
    timeline: list[dict]
    out_dir: Path
    wall_s: float
    daemon_iterations: int
    knowledge_url: str
    faults: list[str] = field(default_factory=list)


class TestbedOptionsError(ValueError):
    """An option the testbed cannot run with; the message names it. Raised before anything starts."""

    __test__ = False

    def __init__(self, message: str, option: str | None = None):
        super().__init__(message)
        self.option = option  # the TestbedOptions field at fault, when there is one


def check_options(opts: TestbedOptions):
    """Refuse bad options before any server or process starts: numbers that must be finite and
    positive, the initial fleet against the groups' bounds, the daemon's configuration (schema)
    and its agent (parameters, policy directory). Returns the agent, built once here."""
    from pydantic import ValidationError

    from .options import number_problem

    def positive(name: str, v) -> None:
        if problem := number_problem(name, v, strict=True):
            raise TestbedOptionsError(problem, name)

    def non_negative(name: str, v) -> None:
        if problem := number_problem(name, v):
            raise TestbedOptionsError(problem, name)

    positive("compression", opts.compression)
    positive("step_s", opts.step_s)
    positive("report_every_s", opts.report_every_s)
    positive("timeout_s", opts.timeout_s)
    non_negative("cooldown_s", opts.cooldown_s)
    non_negative("warmup_s", opts.warmup_s)
    if not isinstance(opts.seed, int) or opts.seed < 0:
        raise TestbedOptionsError(f"seed must be an integer >= 0, got {opts.seed!r}", "seed")
    if len(opts.initial) != len(PAPER_GROUPS):
        raise TestbedOptionsError(f"initial must give {len(PAPER_GROUPS)} instance counts, got {opts.initial!r}")
    for (name, _, _, _, lo, hi, _), n in zip(PAPER_GROUPS, opts.initial):
        if not isinstance(n, int) or not lo <= n <= hi:
            raise TestbedOptionsError(f"initial instances of {name} must be an integer in [{lo}, {hi}], got {n!r}")
    if opts.daemons < 1:
        raise TestbedOptionsError(f"daemons must be >= 1, got {opts.daemons}")
    if opts.workload_obj is not None:
        check_workload(opts.workload_obj)
    if opts.daemons > 1 and not (opts.ha and opts.daemon_process):
        raise TestbedOptionsError("several daemons need daemon_process=True and ha=True")

    class _Placeholder:  # the real Graphite's addresses are known once it runs
        render_url, carbon_host, carbon_port = "http://127.0.0.1:1", "127.0.0.1", 1

    try:
        cfg = daemon_config(opts, _Placeholder(), "http://127.0.0.1:1", opts.knowledge_url or "sqlite:///:memory:")
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise TestbedOptionsError(f"the daemon's configuration is invalid: {problems}") from None
    if opts.agent_obj is not None:
        return opts.agent_obj
    from samm.daemon.build import make_daemon_agent

    try:
        return make_daemon_agent(cfg.control_loops()[0])
    except (ValueError, TypeError, KeyError, OSError) as exc:
        raise TestbedOptionsError(f"agent {opts.agent!r}: {exc}", "agent") from None


def check_workload(workload) -> None:
    """Refuse a workload with a job wider than the largest instance type: no worker can ever lease
    it, and the queue is head of line, so every later job waited behind it until the run's timeout
    (the simulator refuses such a workload too: `sim_bridge.batch.check_core_cap`)."""
    widest = int(workload.cores.max()) if workload.n_jobs else 0
    name, largest = max(((g[0], g[1]) for g in PAPER_GROUPS), key=lambda g: g[1])
    if widest > largest:
        raise TestbedOptionsError(
            f"workload {getattr(workload, 'name', '?')!r} has a {widest}-core job but the largest instance type "
            f"({name}) has {largest} cores: it could never run, and every later job would wait behind it "
            "(cap it when loading: `core_cap`)", "workload")


def daemon_config(opts: TestbedOptions, graphite, moto_url: str, knowledge_url: str) -> SammConfig:
    interval = opts.step_s / opts.compression
    groups = [{"name": n, "cores": c, "ram_gb": r, "price_per_hour": p, "min": lo, "max": hi, "asg_name": a}
              for n, c, r, p, lo, hi, a in PAPER_GROUPS]
    agent = {"name": opts.agent, "params": opts.params or {}, "policy_dir": opts.policy_dir}
    return SammConfig.model_validate({
        "groups": groups,
        "graphite": {"render_url": graphite.render_url, "carbon_host": graphite.carbon_host,
                     "carbon_port": graphite.carbon_port, "prefix": PREFIX, "timeout_s": 2.0,
                     "lateness_s": min(0.3, interval / 4)},
        "agent": agent,
        "executor": {"kind": "aws-asg", "endpoint_url": moto_url, "max_attempts": 4},
        "timing": {"interval_s": interval, "warmup_s": opts.warmup_s / opts.compression,
                   "cooldown_s": opts.cooldown_s / opts.compression, "misfire_grace_s": interval},
        "knowledge": {"url": knowledge_url},
        "ha": {"enabled": opts.ha},
    })


class Testbed:
    """Starts every part, runs one workload under one policy, stops everything. Parts are
    exposed for fault injection (`kill_worker`, `graphite.stop()`, the moto proxy, ...)."""

    def __init__(self, opts: TestbedOptions, progress: Callable[[dict], None] | None = None):
        self.opts = opts
        self.progress = progress
        self.out = Path(opts.out_dir).resolve() if opts.out_dir else Path(os.environ.get("TMPDIR", "/tmp")) / f"samm-testbed-{os.getpid()}"
        self.out.mkdir(parents=True, exist_ok=True)
        self.faults: list[str] = []
        self._stack: list[Callable[[], None]] = []
        self.daemon_procs: list[subprocess.Popen] = []
        self.timeline: list[dict] = []

    # --- set-up -------------------------------------------------------------------------------
    def start(self) -> "Testbed":
        from samm.daemon.build import build_daemon
        from samm.daemon.runner import DaemonRunner
        from samm.execute.moto_server import MotoServer, create_paper_asgs
        from samm.monitor.graphite_client import GraphiteSender
        from samm.monitor.local_graphite import LocalGraphite
        from sim_bridge.workloads import load_workload

        from .driver import Driver, QueuePublisher
        from .jobqueue import JobQueue
        from .reconciler import Reconciler

        o = self.opts
        agent = check_options(o)  # before anything starts
        self.workload = o.workload_obj if o.workload_obj is not None else load_workload(o.workload)
        check_workload(self.workload)  # one loaded by name here was not seen by check_options
        for k, v in {"AWS_ACCESS_KEY_ID": "testbed", "AWS_SECRET_ACCESS_KEY": "testbed",
                     "AWS_DEFAULT_REGION": "us-east-1"}.items():
            os.environ.setdefault(k, v)
        self._lock_out_dir()  # before the clean-up below deletes another live run's queue and Graphite
        self._claim_process()
        for stale in ("queue.db", "queue.db-wal", "queue.db-shm", "knowledge.db", "knowledge.db-wal",
                      "knowledge.db-shm", "summary.partial.json"):
            (self.out / stale).unlink(missing_ok=True)
        shutil.rmtree(self.out / "graphite", ignore_errors=True)
        self.graphite = LocalGraphite(self.out / "graphite", retentions="1s:6h,1m:7d")
        self.graphite.start()
        self._stack.append(self.graphite.close)
        self.moto = MotoServer()
        self.moto.__enter__()
        self.moto.reset()  # moto's state is per process: a second testbed must start empty
        self._stack.append(lambda: self.moto.__exit__(None, None, None))
        daemon_aws_url = self.moto.endpoint_url
        self.aws_proxy = None
        if o.aws_fault_proxy:
            from .aws_proxy import AwsFaultProxy

            self.aws_proxy = AwsFaultProxy(self.moto.endpoint_url).start()
            self._stack.append(self.aws_proxy.close)
            daemon_aws_url = self.aws_proxy.endpoint_url
        create_paper_asgs(endpoint_url=self.moto.endpoint_url, names=tuple(g[6] for g in PAPER_GROUPS),
                          min=tuple(g[4] for g in PAPER_GROUPS), max=10, desired=1)
        asg = self.moto.client("autoscaling")
        for g, n in zip(PAPER_GROUPS, o.initial):
            asg.set_desired_capacity(AutoScalingGroupName=g[6], DesiredCapacity=int(n), HonorCooldown=False)

        self.queue = JobQueue(self.out / "queue.db")
        self._stack.append(self.queue.close)
        self.sender = GraphiteSender(self.graphite.carbon_host, self.graphite.carbon_port)
        self.knowledge_url = o.knowledge_url or sqlite_url(self.out / "knowledge.db")
        self.config = daemon_config(o, self.graphite, daemon_aws_url, self.knowledge_url)
        self.interval_wall = self.config.timing.interval_s

        logs = self.out / "workers"
        logs.mkdir(exist_ok=True)
        carbon = f"{self.graphite.carbon_host}:{self.graphite.carbon_port}"

        def spawn(group: str, instance_id: str, cores: int) -> subprocess.Popen:
            err = open(logs / f"{instance_id}.log", "ab")
            try:
                # tied to this process: a `samm testbed` killed (SIGTERM, SIGKILL) must not leave
                # workers polling the queue forever in their own sessions
                return popen_tied(
                    [sys.executable, "-m", "samm.testbed.worker", "--queue", str(self.out / "queue.db"),
                     "--group", group, "--instance", instance_id, "--cores", str(cores),
                     "--compression", str(o.compression), "--t0", repr(self.t0), "--graphite", carbon,
                     "--prefix", PREFIX, "--report-every", str(o.report_every_s), "--log-level", "WARNING"],
                    signal.SIGTERM, stdout=subprocess.DEVNULL, stderr=err)
            finally:
                err.close()

        if not o.daemon_process:
            from samm.plan.client import InProcessPlanner

            self.daemon = build_daemon(self.config, planner=InProcessPlanner(agent))
            self.runner = DaemonRunner(self.daemon)
        # t0 on an interval boundary, so workload minutes and daemon windows line up, and far
        # enough ahead for the initial fleet's workers to be up when the run starts
        self.t0 = (time.time() // self.interval_wall + 2) * self.interval_wall
        self.queue.set_clock(self.t0, o.compression)
        groups = {g[6]: (g[0], g[1]) for g in PAPER_GROUPS}
        self.reconciler = Reconciler(asg, groups, spawn, on_terminated=lambda iid: self.queue.release_worker(iid),
                                     compression=o.compression, seed=o.seed)
        self.publisher = QueuePublisher(self.queue, self.sender, PREFIX, o.compression, self.t0, self.interval_wall,
                                        every_s=o.report_every_s)
        self.driver = Driver(self.queue, self.workload, o.compression, self.t0)
        self.reconciler.start()
        self._stack.append(self.reconciler.stop)
        while time.time() < self.t0 - 0.05:
            time.sleep(0.02)
        self.publisher.start()
        self._stack.append(self.publisher.stop)
        self.driver.start()
        self._stack.append(self.driver.stop)
        if o.daemon_process:
            import yaml

            # the daemons read this file: a database password must reach them whole, not masked
            config = self.config.model_dump(mode="json", context={"secrets": "keep"})
            (self.out / "samm.yaml").write_text(yaml.safe_dump(config))
            for _ in range(o.daemons):
                self.start_daemon_process()
        else:
            self._daemon_thread = threading.Thread(target=self.runner.run, kwargs={"install_signals": False},
                                                   name="samm-daemon", daemon=True)
            self._daemon_thread.start()
        self._stack.append(self._stop_daemon)
        return self

    def _lock_out_dir(self) -> None:
        """Hold `testbed.lock` in the run directory for the testbed's life: a second testbed
        started there (e.g. two `samm testbed` with the default --out) would delete the first's
        live queue and Graphite files. The lock dies with the process, so a killed run's stays
        no obstacle."""
        import fcntl

        f = open(self.out / "testbed.lock", "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            holder = f.read().strip() or "?"
            f.close()
            raise TestbedOptionsError(f"out_dir {self.out}: another testbed (pid {holder}) is running there; "
                                      "give each run its own directory", "out_dir") from None
        f.truncate(0)
        f.write(str(os.getpid()))
        f.flush()
        self._stack.append(f.close)

    def _claim_process(self) -> None:
        """One live testbed per process: moto's AWS state is process-global, so a second one's
        `reset()` would delete the first's groups and both would then share the same ASGs."""
        with _LIVE_LOCK:
            if _LIVE:
                raise TestbedOptionsError("another testbed is running in this process, and moto's AWS state is "
                                          "per process; run each testbed in its own process")
            _LIVE.add(id(self))
        self._stack.append(lambda: _LIVE.discard(id(self)))

    def start_daemon_process(self) -> subprocess.Popen:
        """Start one more `samm run` (the latest is `daemon_proc`; all are in `daemon_procs`)."""
        log_file = open(self.out / "daemon.log", "ab")
        try:
            self.daemon_proc = popen_tied([sys.executable, "-m", "samm.cli.main", "run", "--config",
                                           str(self.out / "samm.yaml"), "--log-level", "WARNING"],
                                          signal.SIGTERM, stdout=subprocess.DEVNULL, stderr=log_file,
                                          env=dict(os.environ))
        finally:
            log_file.close()
        self.daemon_procs.append(self.daemon_proc)
        self.daemon_proc_started = time.time()
        return self.daemon_proc

    def _stop_daemon(self) -> None:
        if self.opts.daemon_process:
            live = [p for p in self.daemon_procs if p.poll() is None]
            for p in live:
                p.terminate()
            for p in live:
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
            return
        self.runner.stop_event.set()
        self._daemon_thread.join(30)

    def iterations(self) -> int:
        if self.opts.daemon_process:
            from samm.knowledge.store import KnowledgeStore

            store = KnowledgeStore(self.knowledge_url)
            try:
                return store.counts()["decisions"]
            finally:
                store.close()
        return sum(self.runner.iterations.values())

    # --- running ------------------------------------------------------------------------------
    def clock(self) -> float:
        return (time.time() - self.t0) * self.opts.compression

    def sample(self) -> dict:
        counts = self.reconciler.counts()
        c = self.queue.counters(self.clock(), self.clock())
        row = {"t_s": round(self.clock(), 1), "waiting": c.waiting, "running_jobs": c.running,
               "completed": c.completed_total, "submitted": c.submitted_total}
        for g, v in counts.items():
            row[f"{g}_booting"], row[f"{g}_running"] = v["booting"], v["running"]
            row[f"{g}_vms"] = v["booting"] + v["running"]
        return row

    def run_until_done(self) -> list[dict]:
        timeline = self.timeline  # kept on the testbed: a timeout or an interrupt still has it
        deadline = time.time() + self.opts.timeout_s
        next_sample = time.time()
        n = self.workload.n_jobs
        while True:
            if time.time() >= next_sample:
                row = self.sample()
                timeline.append(row)
                if self.progress:
                    self.progress(row)
                next_sample += self.interval_wall
            if self.driver.done and self.queue.all_done(n):
                break
            if time.time() > deadline:
                raise TimeoutError(f"{n - timeline[-1]['completed']} of {n} jobs unfinished after "
                                   f"{self.opts.timeout_s:g} s")
            time.sleep(0.05)
        timeline.append(self.sample())
        return timeline

    def close(self) -> None:
        while self._stack:
            fn = self._stack.pop()
            try:
                fn()
            except Exception:  # noqa: BLE001 - keep stopping the rest
                log.exception("testbed: stopping %s failed", fn)

    def partial_summary(self, reason: str) -> Path | None:
        """After a timeout or an interrupt: stop the fleet and write what the run did so far to
        `summary.partial.json` (billed up to the current step). Best effort; returns the path."""
        import json
        import math

        if not hasattr(self, "reconciler"):  # stopped before anything ran
            return None
        try:
            self._stop_daemon()
        except Exception:  # noqa: BLE001 - e.g. interrupted before the daemon started
            log.warning("testbed: stopping the daemon before the partial summary failed", exc_info=True)
        try:
            # the queue as the interrupt found it: stopping the fleet hands the running jobs back,
            # which is no re-queue (counted as one, those jobs also waited until the horizon)
            jobs, runs = self.queue.stats(), self.queue.runs()
            self.reconciler.stop()
            stopped = self.clock()
            runs = [r if r.ended_at is not None else replace(r, ended_at=max(r.started_at, stopped)) for r in runs]
            step = self.opts.step_s
            end = max(1, math.ceil(max(stopped, 0.0) / step)) * step
            summary = self.summary(end_s=end, jobs=jobs, runs=runs)
            path = self.out / "summary.partial.json"
            path.write_text(json.dumps({"interrupted": reason, "summary": summary}, indent=2, allow_nan=False))
            return path
        except Exception:  # noqa: BLE001 - the run's own error is the one to report
            log.exception("testbed: could not write the partial summary")
            return None

    def summary(self, end_s: float | None = None, jobs=None, runs=None) -> dict:
        """Billing of the run; `jobs`/`runs`: a snapshot of the queue's records (default: now)."""
        from .billing import InstanceRecord, policy_stop, summarize

        # an instance whose worker never started was billed but never ran: it is not "at once"
        # ready (None), it is never ready, so no step counts it as an idle running instance
        shutdown = self.reconciler.stopped_at
        records = [InstanceRecord(vm.group, vm.instance_id, vm.seen_wall, policy_stop(vm.stopped_wall, shutdown),
                                  vm.ready_wall if vm.spawns else float("inf"))
                   for vm in self.reconciler.vms.values()]
        specs = {g[0]: _Spec(g[1], g[3], g[5]) for g in PAPER_GROUPS}
        jobs = self.queue.stats() if jobs is None else jobs
        runs = self.queue.runs() if runs is None else runs
        return summarize(records, jobs, runs, specs, self.opts.compression, self.t0,
                         step_s=self.opts.step_s, workload=self.workload.name, end_s=end_s)


@dataclass(frozen=True)
class _Spec:
    cores: int
    price_per_hour: float
    max: int


def run_testbed(opts: TestbedOptions, progress: Callable[[dict], None] | None = None,
                during: Callable[[Testbed], None] | None = None,
                before_close: Callable[[Testbed], None] | None = None) -> TestbedResult:
    """Run one workload under one policy on the testbed. `during(testbed)` runs in a thread
    alongside (fault injection in tests); `before_close(testbed)` runs once every job is done,
    while Graphite and moto still run (checks in tests)."""
    started = time.time()
    tb = Testbed(opts, progress)
    try:
        tb.start()
        if during is not None:
            def guarded():
                try:
                    during(tb)
                except Exception as exc:  # noqa: BLE001 - reported in the result
                    log.exception("testbed: fault injection failed")
                    tb.faults.append(f"error: {type(exc).__name__}: {exc}")
            threading.Thread(target=guarded, name="testbed-faults", daemon=True).start()
        timeline = tb.run_until_done()
        tb._stop_daemon()
        if before_close is not None:
            before_close(tb)
        tb.reconciler.stop()
        summary = tb.summary()
        iterations = tb.iterations()
    except BaseException as exc:  # a timeout, Ctrl-C: keep what the run did
        reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        tb.partial_summary(reason)
        raise
    finally:
        tb.close()
        write_timeline(tb.out / "timeline.csv", tb.timeline)
    return TestbedResult(summary, timeline, tb.out, time.time() - started, iterations, tb.knowledge_url, tb.faults)


def write_timeline(path: Path, rows: list[dict]) -> None:
    if not rows:
        return
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
