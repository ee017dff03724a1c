"""Wiring: the daemon's configuration -> monitor, planner, executor, store, publisher.

The only place that knows which concrete adapter goes with which config value; everything
else receives its collaborators ready-made (tests and the testbed build their own).
"""
from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Callable

from agents.base import Agent
from samm.analyze import FleetSpec
from samm.config import LoopConfig, SammConfig
from samm.execute.base import Executor
from samm.knowledge.store import KnowledgeStore
from samm.plan.client import HttpPlanner, InProcessPlanner

from .loop import ControlLoop

log = logging.getLogger(__name__)


class ConfigurationProblem(ValueError):
    """The configuration is valid YAML and schema but cannot be put together (message says why)."""


def make_daemon_agent(lp: LoopConfig) -> Agent:
    from agents.factory import make_agent
    from samm.execute.sim_exec import sim_config_for_groups

    sim = sim_config_for_groups(lp.groups)
    try:
        agent = make_agent(lp.agent.name, sim, params=lp.agent.params or None, policy_dir=lp.agent.policy_dir)
    except (ValueError, OSError, KeyError, TypeError) as e:  # unknown agent, bad params, missing or corrupt policy
        # as the deferrable and microservice loops: one line and exit 2, not a traceback systemd restarts
        raise ConfigurationProblem(f"loop {lp.name}: agent {lp.agent.name!r}: {type(e).__name__}: {e}") from e
    names = tuple(g.name for g in lp.groups)
    if agent.type_names != names:
        raise ConfigurationProblem(
            f"loop {lp.name!r}: agent {lp.agent.name!r} (policy {agent.version}) decides for VM types "
            f"{list(agent.type_names)} but the configured groups are {list(names)}: name the groups like the "
            "policy's types, in that order")
    return agent


class GroupCheckedHttpPlanner(HttpPlanner):
    """An HttpPlanner that decides only while the remote agent's VM types are the configured
    groups, in that order (make_daemon_agent's check for an agent in this process). The service
    names its types only in its agent list, and a restarted one may host another policy: a list
    whose types differ is kept as no spec, so the loop reads its default features, decide falls
    back to doing nothing naming both lists, and the next call reads the list again."""

    def __init__(self, *args, groups: tuple[str, ...], **kwargs):
        super().__init__(*args, **kwargs)
        self.groups = tuple(groups)

    def _load_spec(self) -> None:
        super()._load_spec()
        if self.spec is None or tuple(self.spec["type_names"]) == self.groups:
            return
        self.spec_error = (f"agent {self.agent_name!r} at {self.url} decides for VM types "
                           f"{list(self.spec['type_names'])} but the configured groups are {list(self.groups)}: "
                           "name the groups like the policy's types, in that order")
        log.warning("plan: %s", self.spec_error)
        self.spec = None


def make_planner(lp: LoopConfig, timeout_s: float, agent: Agent | None = None):
    if lp.agent.mode == "http":
        session = f"samm-{socket.gethostname()}-{os.getpid()}-{lp.name}"
        return GroupCheckedHttpPlanner(lp.agent.service_url, lp.agent.name, session, timeout_s=timeout_s,
                                       groups=tuple(g.name for g in lp.groups))
    return InProcessPlanner(agent or make_daemon_agent(lp))


def make_executor(lp: LoopConfig) -> Executor:
    kind = lp.executor.kind
    if kind == "aws-asg":
        from samm.execute.aws_asg import AwsAsgExecutor

        try:
            return AwsAsgExecutor(lp.groups, region=lp.executor.region, endpoint_url=lp.executor.endpoint_url,
                                  max_attempts=lp.executor.max_attempts)
        except ValueError as exc:  # a malformed endpoint_url or region, a missing AWS profile
            raise ConfigurationProblem(str(exc)) from None
    if kind == "docker":
        from samm.execute.docker_exec import DockerExecutor

        return DockerExecutor(lp.groups, base_url=lp.executor.endpoint_url or os.environ.get("DOCKER_HOST"))
    raise ConfigurationProblem(f"executor kind {kind!r} is built with its managed system (see build_daemon)")


@dataclass
class Daemon:
    cfg: SammConfig
    loops: list[ControlLoop]
    store: KnowledgeStore
    executors: list[Executor]
    systems: list = field(default_factory=list)  # SimulatedSystems of loops with executor kind `sim`
    closers: list[Callable[[], None]] = field(default_factory=list)

    @property
    def loop(self) -> ControlLoop:
        """The first (often the only) loop."""
        return self.loops[0]

    @property
    def executor(self) -> Executor:
        return self.executors[0]

    @property
    def system(self):
        return self.systems[0] if self.systems else None

    def close(self) -> None:
        for c in reversed(self.closers):
            try:
                c()
            except Exception:  # noqa: BLE001 - best effort at shutdown
                log.exception("closing %s failed", c)


def build_daemon(cfg: SammConfig, *, executor: Executor | None = None, store: KnowledgeStore | None = None,
                 planner=None, clock: Callable[[], float] | None = None) -> Daemon:
    """One ControlLoop per configured loop, sharing the knowledge store. `executor`, `planner`
    and `clock` (for tests and the testbed) apply to the first loop."""
    closers: list[Callable[[], None]] = []
    if store is None:
        store = KnowledgeStore(cfg.knowledge.url)
        if store.in_memory:  # legal (tests, trials), but Execute's safety rests on what the store keeps
            log.warning("knowledge.url %s is an in-memory database: decisions, actions and cool-downs are lost "
                        "when the daemon stops, so a restart does not honour a cool-down under way; use a "
                        "file (sqlite:///PATH) or PostgreSQL", store.url)
    closers.append(store.close)
    loops, executors, systems = [], [], []
    try:
        for i, lp in enumerate(cfg.control_loops()):
            first = i == 0
            if getattr(lp, "problem", "autoscaling") != "autoscaling":
                # a problem's own loop (ProblemSpec.build_loop): it brings its monitor, plan and execute
                from agents.registry import entry, get_problem

                try:
                    build_loop = entry(get_problem(lp.problem), "build_loop")
                except ValueError as exc:  # a plug-in whose loop cannot be imported: name the loop, no traceback
                    raise ConfigurationProblem(f"loop {i} (problem {lp.problem}): {exc}") from exc
                loop = build_loop(cfg, lp, store, closers)
                loop.config = lp
                loops.append(loop)
                executors.append(getattr(loop, "executor", None))
                continue
            loop, ex, system = _build_loop(cfg, lp, store, closers, executor=executor if first else None,
                                           planner=planner if first else None, clock=clock if first else None)
            loops.append(loop)
            executors.append(ex)
            if system is not None:
                systems.append(system)
    except BaseException:
        for c in reversed(closers):
            try:
                c()
            except Exception:  # noqa: BLE001
                pass
        raise
    return Daemon(cfg, loops, store, executors, systems, closers)


def _build_loop(cfg: SammConfig, lp: LoopConfig, store: KnowledgeStore, closers: list, *, executor=None,
                planner=None, clock=None):
    from samm.monitor.graphite_client import GraphiteSender, RenderClient

    from .monitoring import GraphiteMonitor, SimMonitor
    from .publish import GraphitePublisher

    fleet = FleetSpec.from_vm_types(lp.groups)
    system = None
    if lp.executor.kind == "sim" and executor is None:
        from sim_bridge.workloads import load_workload
        from samm.execute.sim_exec import SimExecutor, SimulatedSystem, sim_config_for_groups
        from sim_bridge.config import SimConfig

        simcfg = sim_config_for_groups(lp.groups, SimConfig(host_mips=lp.simulation.host_mips), lp.simulation.initial)
        try:
            workload = load_workload(lp.simulation.workload)
        except (ValueError, OSError, KeyError) as e:  # an unknown name, a missing or malformed file
            raise ConfigurationProblem(f"loop {lp.name}: simulation.workload {lp.simulation.workload!r}: "
                                       f"{type(e).__name__}: {e}") from e
        system = SimulatedSystem(simcfg, workload, seed=lp.simulation.seed)
        closers.append(system.close)
        executor = SimExecutor(system)
        monitor = SimMonitor(system, fleet, executor)
        clock = clock or (lambda: system.clock)
        # a simulated interval is the simulator's step, whatever the wall time between iterations
        feature_interval_s = simcfg.step_seconds
    else:
        feature_interval_s = lp.timing.interval_s
        executor = executor or make_executor(lp)
        closers.append(executor.close)
        g = cfg.graphite
        from samm.monitor.graphite_source import GraphiteSource

        render = RenderClient(g.render_url, g.timeout_s)
        closers.append(render.close)  # its keep-alive pool outlived the daemon
        source = GraphiteSource(render, g.prefix, [x.name for x in lp.groups],
                                interval_s=lp.timing.interval_s, lateness_s=g.lateness_s,
                                # a restarted daemon must see a VM older than the warm-up as such
                                # (where the executor gives no launch time), not as at most 900 s old
                                first_seen_lookback_s=max(900.0, lp.timing.warmup_s + 3 * lp.timing.interval_s),
                                now=clock or time.time, ram_gb={x.name: x.ram_gb for x in lp.groups})
        monitor = GraphiteMonitor(source, executor, fleet, [x.name for x in lp.groups])
        closers.append(monitor.close)
    publisher = None
    if cfg.graphite.publish and lp.executor.kind != "sim":
        sender = GraphiteSender(cfg.graphite.carbon_host, cfg.graphite.carbon_port)
        prefix = cfg.graphite.prefix if lp.name == "default" else f"{cfg.graphite.prefix}.loops.{lp.name}"
        publisher = GraphitePublisher(sender, cfg.graphite.render_url, prefix)
        closers.append(sender.close)
    if planner is None:
        planner = make_planner(lp, cfg.graphite.timeout_s)
        if isinstance(planner, HttpPlanner):
            closers.append(planner.http.close)
    loop = ControlLoop(groups=lp.groups, fleet=fleet, monitor=monitor, planner=planner, executor=executor,
                       store=store, agent_name=lp.agent.name, warmup_s=lp.timing.warmup_s,
                       cooldown_s=lp.timing.cooldown_s, dry_run=lp.executor.dry_run,
                       clock=clock or time.time, publisher=publisher, name=lp.name,
                       interval_s=feature_interval_s)
    loop.config = lp
    return loop, executor, system
