"""The microservice-cores loop in the SAMM daemon (`samm run`): every second, the CPU limit of
every service of a running application, on a Docker engine, declared in the config as

    loops:
      - name: hotel
        problem: microservice-cores
        app: testbed                                   # a topology name, or a topology YAML file
        containers:                                    # how to find each service's container
          base_url: unix:///var/run/docker.sock        # the engine (default: DOCKER_HOST)
          name_prefix: hotel-                          # <prefix><service> or <prefix><service>-<n>
          # labels: {samm.namespace: hotel}            # and/or: these labels + service_label=<service>
          # counters_dir: /srv/hotel/state             # the testbed app's <service>.json counters
        load: {path: /srv/hotel/load.jsonl}            # the load generator's per-second JSON lines
        agent: {name: reclaimer}                       # any hosting.make_controller name, policy_dir, params
        timing: {interval_s: 1.0}
        executor: {kind: docker, dry_run: false}       # cpu_burst: 1.0 adds a CFS burst (ours)

The loop does not own the application: it starts, stops and restarts no container. Each
iteration (key `step<k>`, k = the wall-clock time // interval_s, so a restarted daemon finds the
decision of the current second and does not act twice) is the real-container testbed's step:

    find the containers (every iteration: one list call) -> measure.Measurer (cgroups, the engine's
    limits, the load file) -> testbed loop.ControlLoop (controller.act -> guard ->
    DockerExecutor.set_cpu_limit) -> one decision in the knowledge store

with the testbed's guard unchanged (samm/testbed/microservices/loop.py: no action on stale or
unknown latency or an unreachable engine, clipping to [floor, cap] of the topology, a stopped
service's limit held, one apply per step). Differences from a testbed run: a service whose
container was started again since the last iteration (a new container id or start time, e.g. a
restart policy or `docker compose up` re-creating it) is treated as the testbed's supervisor
treats a restart (the loop's last limit goes back on); a service whose container cannot be found
(or is ambiguous) counts as an engine error: the whole step takes no action ("no action: engine
unreachable", the lookup's message in the step's errors); the first iteration only primes the counters (no decision) unless
`recover()` (which the daemon calls before scheduling) already did.

`executor.dry_run` (or `samm run --dry-run`): every decision is recorded, each limit change the
loop would have made is an Action with status `dry_run`, no limit is changed. The agent
sinan-explore is refused in a dry run (its samples need its allocations applied), and
reclaimer-online when `timing.interval_s` is not below its `max_gap_s` (1.5 s by default): every
step would break its chain, and it would never learn.

At the daemon's shutdown the controller's `close()` runs (once a step ran), as a testbed run's end
calls it: reclaimer-online saves its policy, sinan-explore writes its samples (it also appends
each one as it comes, so a daemon killed before its shutdown keeps them).

The daemon finds this module through `ProblemSpec.loop_config` / `build_loop`; docs in
docs/microservice-testbed.md ("SAMM's daemon on a real application").
"""
from __future__ import annotations

import logging
import math
import os
import re
import time
from pathlib import Path
from typing import Callable, Literal

from pydantic import Field, field_validator, model_validator

from samm.config import LOOP_NAME, MAX_PERIOD_S, Strict
from samm.testbed.microservices.load import LoadGenerator
from samm.testbed.microservices.loop import QUOTA_STEP, ControlLoop, store_key_problem
from samm.testbed.microservices.measure import Measurer

log = logging.getLogger(__name__)

PROBLEM = "microservice-cores"
#: records of the testbed loop kept in memory by a daemon (one per second)
HISTORY = 300


class ContainersConfig(Strict):
    """How each service's container is found on the engine: by name (`<name_prefix><service>`,
    optionally followed by `-<n>` as DockerExecutor and Compose name them), by labels (all of
    `labels`, plus `service_label` = the service's name), or both."""

    base_url: str | None = Field(default=None, description="the engine's API, e.g. unix:///var/run/docker.sock "
                                                             "(default: DOCKER_HOST, else the local socket)")
    name_prefix: str | None = Field(default=None, min_length=1)
    labels: dict[str, str] = Field(default_factory=dict)
    service_label: str = Field(default="samm.group", min_length=1)
    counters_dir: str | None = Field(default=None, description="the testbed app's per-service counters "
                                                                "(<service>.json: network fields); none: zeros")
    timeout_s: float = Field(default=5.0, gt=0)

    @model_validator(mode="after")
    def _how(self) -> "ContainersConfig":
        if not self.name_prefix and not self.labels:
            raise ValueError("containers needs name_prefix or labels (how to find each service's container)")
        return self


class LoadFileConfig(Strict):
    path: str = Field(min_length=1, description="per-second JSON lines (load.py / locustfile.py's format)")
    stale_s: float = Field(default=2.0, gt=0, description="no new second for longer: stale latency, no action")


class ControllerConfig(Strict):
    """`agents.microservice_cores.hosting.make_controller(name, topology, policy_dir, **params)`."""

    name: str = "reclaimer"
    policy_dir: str | None = None
    params: dict = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        from .hosting import CONTROLLERS

        if v not in CONTROLLERS:
            raise ValueError(f"unknown controller {v!r} (known: {', '.join(CONTROLLERS)})")
        return v


class SecondTiming(Strict):
    interval_s: float = Field(default=1.0, gt=0, le=MAX_PERIOD_S, description="one control step (the paper: 1 s)")
    misfire_grace_s: float = Field(default=1.0, ge=0, le=MAX_PERIOD_S)


class DockerLimitsExecutor(Strict):
    kind: Literal["docker"] = "docker"
    dry_run: bool = False
    cpu_burst: float | None = Field(
        default=None, ge=0, le=1,
        description="give each container a CFS burst of this share of its quota with every limit "
                    "(ours; Linux >= 5.14, an engine on this host, root); none: the topology's "
                    "cfs_burst, and where that is 0 the burst is left alone")


class MicroserviceLoopConfig(Strict):
    name: str = Field(pattern=LOOP_NAME)
    problem: Literal["microservice-cores"] = PROBLEM
    app: str = Field(min_length=1, description="a shipped topology's name or a topology YAML file")
    containers: ContainersConfig
    load: LoadFileConfig
    agent: ControllerConfig = ControllerConfig()
    timing: SecondTiming = SecondTiming()
    executor: DockerLimitsExecutor = DockerLimitsExecutor()

    @field_validator("app")
    @classmethod
    def _topology(cls, v: str) -> str:
        from .topology import load_topology

        load_topology(v)  # ValueError naming the known applications or the unreadable file
        return v

    @model_validator(mode="after")
    def _keys_fit_the_store(self) -> "MicroserviceLoopConfig":
        from .topology import load_topology

        problem = store_key_problem(self.name, load_topology(self.app).service_names)
        if problem:   # at `samm config check`, not after PostgreSQL refused the first limit change
            raise ValueError(problem)
        return self


# ----------------------------------------------------------------------------- the engine side
class EngineContainers:
    """The application's containers found on an engine, with the attributes measure.Measurer
    reads (`client`, `names`, `state_dir`) and the actuator loop.ControlLoop calls (`set_limit`,
    through DockerExecutor.set_cpu_limit). The engine is reached lazily: a down engine fails
    calls (recorded), never construction."""

    def __init__(self, services, cfg: ContainersConfig, cpu_burst: float | None = None):
        from samm.execute.docker_exec import DockerExecutor

        self.services = tuple(services)
        self.cfg = cfg
        self.base_url = cfg.base_url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        self._client = None
        self.executor = DockerExecutor([], base_url=self.base_url, timeout_s=int(math.ceil(cfg.timeout_s)),
                                       cpu_burst=cpu_burst)
        self.state_dir = Path(cfg.counters_dir) if cfg.counters_dir else None
        self.names = {s: f"{cfg.name_prefix or ''}{s}" for s in self.services}  # until found

    @property
    def client(self):
        """The engine's client, made on first use (docker-py asks the engine for its API version
        then: a down engine raises here, inside the caller's error handling, and the next call
        tries again)."""
        if self._client is None:
            import docker

            self._client = docker.DockerClient(base_url=self.base_url, timeout=int(math.ceil(self.cfg.timeout_s)))
        return self._client

    def resolve(self) -> list[str]:
        """Find every service's container (one engine call); the problems, one per service or
        one for the engine. A service not found keeps its last name (the step then records
        the engine's error for it and takes no action)."""
        filters: dict = {}
        if self.cfg.labels:
            filters["label"] = [f"{k}={v}" for k, v in self.cfg.labels.items()]
        if self.cfg.name_prefix:
            filters["name"] = self.cfg.name_prefix
        try:
            listed = self.client.api.containers(all=True, filters=filters)
        except Exception as exc:  # noqa: BLE001 - engine down: the step records it
            return [f"engine: {type(exc).__name__}: {str(exc)[:200]}"]
        problems = []
        for s in self.services:
            cands = [c for c in listed if self._matches(c, s)]
            running = [c for c in cands if c.get("State") == "running"]
            pick = running if running else cands
            if len(pick) == 1:
                self.names[s] = pick[0]["Names"][0].lstrip("/")
            elif not pick:
                problems.append(f"{s}: no container found ({self._how()})")
            else:
                names = ", ".join(sorted(c["Names"][0].lstrip("/") for c in pick))
                problems.append(f"{s}: {len(pick)} containers match ({names}); this loop sets one per service")
        return problems

    def _how(self) -> str:
        parts = []
        if self.cfg.name_prefix:
            parts.append(f"name {self.cfg.name_prefix}<service>[-<n>]")
        if self.cfg.labels:
            parts.append("labels " + ", ".join(f"{k}={v}" for k, v in self.cfg.labels.items())
                         + f", {self.cfg.service_label}=<service>")
        return " and ".join(parts)

    def _matches(self, c: dict, s: str) -> bool:
        if self.cfg.labels and (c.get("Labels") or {}).get(self.cfg.service_label) != s:
            return False
        if self.cfg.name_prefix:
            pat = re.compile(re.escape(self.cfg.name_prefix + s) + r"(-\d+)?")
            return any(pat.fullmatch(n.lstrip("/")) for n in c.get("Names") or [])
        return True

    def set_limit(self, service: str, cores: float):
        return self.executor.set_cpu_limit(self.names[service], float(cores))

    def read_limit(self, service: str) -> float:
        """The limit the engine holds for `service` (cores; the engine's CPUs when unlimited)."""
        from samm.execute.docker_exec import limit_cores
        from samm.testbed.microservices.measure import unlimited_cores

        cores = limit_cores(self.client.api.inspect_container(self.names[service])["HostConfig"])
        return cores if cores is not None else unlimited_cores(self.executor)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        self.executor.close()


class EngineMeasurer(Measurer):
    """measure.Measurer, remembering each container's identity (id, start time) so that a
    container started again since the last measurement is seen, and with the application's
    network counters optional (zeros without `counters_dir`)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.identity: dict[str, tuple] = {}
        self._seen: dict[str, tuple] = {}

    def _inspect(self, s: str) -> dict:
        info = super()._inspect(s)
        self._seen[s] = (info.get("Id"), (info.get("State") or {}).get("StartedAt"))
        return info

    def _net(self, s: str):
        return None if self.c.state_dir is None else super()._net(s)

    def measure(self, now=None, *, claim: bool = True):
        self._seen = {}
        return super().measure(now, claim=claim)

    def restarted(self) -> list[str]:
        """Services whose container (id or start time) changed since the previous measurement
        that saw them; updates the memory."""
        out = [s for s, ident in self._seen.items() if s in self.identity and self.identity[s] != ident]
        self.identity.update(self._seen)
        return out


class LoadFile:
    """The newest second of a per-second JSON-lines load file, read with load.py's tailer
    (`LoadGenerator.poll` / `latest`, which reads and never starts anything) on a file another
    process writes. A file replaced or truncated (a new load run) is read again from its start;
    only the newest `keep` seconds stay in memory."""

    def __init__(self, path: str | os.PathLike, keep: int = 30):
        self.path = Path(path)
        self.keep = keep
        self._stat: tuple | None = None
        self._reader = self._new_reader()

    def _new_reader(self) -> LoadGenerator:
        reader = LoadGenerator(self.path, 0, 1, self.path.parent)   # only its reading half is used
        reader.path = self.path
        return reader

    def latest(self) -> dict | None:
        try:
            st = os.stat(self.path)
            ident = (st.st_dev, st.st_ino)
            if self._stat is not None and (self._stat[0] != ident or st.st_size < self._stat[1]):
                self._reader = self._new_reader()
            self._stat = (ident, st.st_size)
        except OSError:
            pass
        rec = self._reader.latest()
        records = self._reader.records
        if len(records) > self.keep:
            for k in sorted(records)[:-self.keep]:
                del records[k]
        return rec


# ----------------------------------------------------------------------------- the daemon's loop
class MicroserviceDaemonLoop:
    """The daemon-facing wrapper: `run_once()` = one control step at the clock's current step."""

    def __init__(self, name: str, config: MicroserviceLoopConfig, topology, containers: EngineContainers, load,
                 inner, store, clock: Callable[[], float], publisher=None):
        self.name = name
        self.config = config
        self.topology = topology
        self.containers = containers
        self.executor = containers.executor
        self.store = store
        self.inner = inner        # samm.testbed.microservices.loop.ControlLoop
        self.clock = clock
        self.publisher = publisher
        self.measurer = EngineMeasurer(topology, containers, load, stale_s=config.load.stale_s)
        self.primed = False
        self.last_step: int | None = None
        self.last_progress = time.monotonic()

    def current_step(self) -> int:
        return int(self.clock() // self.config.timing.interval_s)

    def _prime(self) -> list[str]:
        problems = self.containers.resolve()
        self.measurer.measure(claim=False)   # no step acts on it: its load second stays fresh
        self.measurer.restarted()
        self.primed = True
        return problems

    def recover(self) -> list[str]:
        """Before the first iteration: limit changes a previous run left in flight are resolved
        against the engine (succeeded when the container holds the requested limit), and the
        counters are primed so the first step has a whole interval of CPU use."""
        notes = []
        problems = self._prime()
        for a in self.store.in_flight_actions(loop=self.name):
            want = (a.request or {}).get("cores")
            try:
                have = f"{self.containers.read_limit(a.group_name):.3f}"
                # a limit above the engine's CPUs was set as those CPUs (DockerExecutor clamps it)
                done = want is not None and abs(float(have) - self.executor.within_host(float(want))) < 0.006
            except Exception as exc:  # noqa: BLE001 - the engine may be down: the outcome stays unknown
                have, done = f"unreadable: {type(exc).__name__}", False
            why = ("daemon restarted; the container holds the requested limit" if done else
                   f"daemon restarted before the outcome was known (limit now {have}); not retried")
            # fenced: an action in flight may be the new leader's if this daemon lost the lease
            self.store.finish_action(a.idempotency_key, "succeeded" if done else "failed", {"recovered": True},
                                     None if done else why, fenced=True)
            notes.append(f"{a.idempotency_key}: {'succeeded' if done else 'failed'} ({why})")
        return notes + [f"containers: {p}" for p in problems]

    def run_once(self):
        from samm.daemon.loop import IterationReport

        started = time.perf_counter()
        k = self.current_step()
        interval = self.config.timing.interval_s
        if not self.primed:
            problems = self._prime()
            rep = IterationReport(f"step{k}", k * interval, (k + 1) * interval, "warming-up",
                                  ["counters primed; the next step decides"] + problems, loop=self.name)
            return self._finish(rep, started)
        if k == self.last_step:  # a second run within one step (a catch-up): the step is done
            rep = IterationReport(f"step{k}", k * interval, (k + 1) * interval, "ok",
                                  ["this step already has a decision; not acting again"], loop=self.name)
            return self._finish(rep, started)
        problems = self.containers.resolve()
        m = self.measurer.measure()
        restarted = self.measurer.restarted()
        if problems:  # a container not found or ambiguous: like an engine that cannot be read, no action
            m.extra["engine_errors"] = list(m.extra.get("engine_errors") or []) + [f"containers: {p}" for p in problems]
        t_monitor = time.perf_counter()
        rec = self.inner.step(k, m, restarted=restarted)
        self.last_step = k
        status = "ok" if rec.targets is not None else ("stale" if rec.latency_state == "stale" else "no-action")
        reasons = ([] if rec.targets is not None else [rec.action]) + list(rec.errors)
        rep = IterationReport(f"step{k}", k * interval, (k + 1) * interval, status, reasons, loop=self.name)
        rep.decided = rec.decision_created
        rep.features = {x: float(v) for x, v in (
            ("p99_ms", rec.p99_ms), ("p50_ms", rec.p50_ms), ("requests_per_s", rec.requests_per_s),
            ("failures_per_s", rec.failures_per_s), ("total_cores", rec.total_cores),
            ("total_used", float(sum(rec.used.values())))) if math.isfinite(v)}
        rep.features |= {f"cores.{s}": float(c) for s, c in rec.limits.items() if math.isfinite(c)}
        rep.features |= {f"used.{s}": float(c) for s, c in rec.used.items() if math.isfinite(c)}
        rep.actions = self._actions(k, rec)
        rep.stage_ms = {"monitor": (t_monitor - started) * 1e3, "plan+execute": (time.perf_counter() - t_monitor) * 1e3}
        return self._finish(rep, started)

    def _actions(self, k: int, rec) -> list[dict]:
        key = f"{self.inner.loop_name}:step{k}"
        out = [{"group": s, "status": "succeeded", "key": f"{key}:{s}:reapply", "target": c,
                "from": rec.limits.get(s), "detail": "restarted: the loop's last limit re-applied", "error": None}
               for s, c in rec.reapplied.items()]
        errors = {e.split(": ", 1)[0]: e for e in rec.errors}
        for s, want in (rec.targets or {}).items():
            have = rec.limits.get(s, math.nan)
            if s in rec.applied:
                status = "succeeded"
            elif s in rec.dry_run:
                status = "dry_run"
            elif (math.isfinite(have) and abs(want - have) < QUOTA_STEP / 2) \
                    or self.inner.engine_holds_clamped(s, want, have):
                continue  # nothing to send (or the engine holds what it clamped this limit to)
            else:  # an engine error, or a replayed step whose action was already claimed
                status = "failed" if s in errors else "skipped"
            out.append({"group": s, "status": status, "key": f"{key}:{s}", "target": want, "from": have,
                        "detail": rec.action, "error": errors.get(s)})
        return out

    def _finish(self, rep, started: float):
        rep.iteration_ms = (time.perf_counter() - started) * 1e3
        self.last_progress = time.monotonic()
        if self.publisher is not None:
            try:
                self.publisher.publish(rep)
            except Exception:  # noqa: BLE001 - publishing is best effort
                log.exception("loop %s: publishing %s failed", self.name, rep.key)
        return rep


def _controller_closer(controller, inner: ControlLoop) -> Callable[[], None]:
    """At the daemon's shutdown, the controller's `close` (a learning controller saves what it
    learned, sinan-explore writes its samples), as the testbed run calls it; only once the loop
    ran a step, so a daemon whose build failed later writes no untrained policy over a saved one."""
    def close() -> None:
        done = getattr(controller, "close", None)
        if callable(done) and inner.records:
            done()
    return close


def _refuse_a_chain_the_steps_break(lp: MicroserviceLoopConfig, controller) -> None:
    """The online learner pairs two measurements at most its max_gap_s apart: steps further apart
    than that broke every pair, and it acted for good without learning anything, silently."""
    from samm.daemon.build import ConfigurationProblem

    from .online import OnlineReclaimer

    inner = controller
    while hasattr(inner, "inner"):          # under scale_down_window, headroom_floor, throttle_guard
        inner = inner.inner
    gap = inner.cfg.max_gap_s if isinstance(inner, OnlineReclaimer) else None
    if gap is not None and lp.timing.interval_s >= gap:
        raise ConfigurationProblem(
            f"loop {lp.name!r}: agent {lp.agent.name!r} learns from steps at most max_gap_s = {gap:g} s apart, but "
            f"timing.interval_s is {lp.timing.interval_s:g} s: it would never learn (raise max_gap_s above it)")


def build_loop(cfg, lp: MicroserviceLoopConfig, store, closers: list, clock: Callable[[], float] | None = None):
    from samm.daemon.build import ConfigurationProblem

    from .control import AppLimits
    from .hosting import make_controller
    from .topology import load_topology

    topo = load_topology(lp.app)
    a = lp.agent
    if a.name == "sinan-explore" and lp.executor.dry_run:
        # its samples pair each allocation with the latency under it: a dry run applies none
        raise ConfigurationProblem(f"loop {lp.name!r}: agent 'sinan-explore' cannot collect samples in a dry run "
                                   "(its allocations would never be applied)")
    limits = AppLimits(services=topo.service_names, caps=topo.caps, qos_ms=topo.qos_ms)
    try:
        controller = make_controller(a.name, topo, policy_dir=a.policy_dir, **dict(a.params))
        # in the try: a policy of another application (policy_dir, or what reclaimer-online saved
        # under `out`) is refused here, and was a traceback out of `samm run`
        controller.reset(limits)
    except (ValueError, FileNotFoundError, TypeError) as exc:
        raise ConfigurationProblem(f"loop {lp.name!r}: agent {a.name!r} for {topo.name}: {exc}") from None
    _refuse_a_chain_the_steps_break(lp, controller)
    from samm.execute.cfs_burst import chosen_burst

    containers = EngineContainers(topo.service_names, lp.containers,
                                  cpu_burst=chosen_burst(lp.executor.cpu_burst, topo.cfs_burst))
    closers.append(containers.close)
    inner = ControlLoop(limits, controller, containers, store, loop_name=lp.name,
                        agent_name=getattr(controller, "name", a.name), dry_run=lp.executor.dry_run, history=HISTORY)
    closers.append(_controller_closer(controller, inner))
    publisher = None
    if cfg.graphite.publish:
        from samm.daemon.publish import GraphitePublisher
        from samm.monitor.graphite_client import GraphiteSender

        sender = GraphiteSender(cfg.graphite.carbon_host, cfg.graphite.carbon_port)
        closers.append(sender.close)
        # no Graphite event per limit change: at one step per second they would flood the annotations
        publisher = GraphitePublisher(sender, None, f"{cfg.graphite.prefix}.loops.{lp.name}", events=False)
    return MicroserviceDaemonLoop(lp.name, lp, topo, containers, LoadFile(lp.load.path), inner, store,
                                  clock or time.time, publisher)
