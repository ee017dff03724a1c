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
from samm.config import SammConfig
from samm.execute.base import Executor
from samm.knowledge.store import KnowledgeStore
from samm.plan.client import HttpPlanner, InProcessPlanner

from .loop import ControlLoop

log = logging.getLogger(__name__)


class ConfigurationProblem(ValueError):
    """The configuration is valid YAML and schema but cannot be put together (message says why)."""


def make_daemon_agent(cfg: SammConfig) -> Agent:
    from agents.factory import make_agent
    from samm.execute.sim_exec import sim_config_for_groups

    sim = sim_config_for_groups(cfg.groups)
    agent = make_agent(cfg.agent.name, sim, params=cfg.agent.params or None, policy_dir=cfg.agent.policy_dir)
    names = tuple(g.name for g in cfg.groups)
    if agent.type_names != names:
        raise ConfigurationProblem(
            f"agent {cfg.agent.name!r} (policy {agent.version}) decides for VM types {list(agent.type_names)} "
            f"but the configured groups are {list(names)}: name the groups like the policy's types, in that order")
    return agent


def make_planner(cfg: SammConfig, agent: Agent | None = None):
    if cfg.agent.mode == "http":
        session = f"samm-{socket.gethostname()}-{os.getpid()}"
        return HttpPlanner(cfg.agent.service_url, cfg.agent.name, session, timeout_s=cfg.graphite.timeout_s)
    return InProcessPlanner(agent or make_daemon_agent(cfg))


def make_executor(cfg: SammConfig) -> Executor:
    kind = cfg.executor.kind
    if kind == "aws-asg":
        from samm.execute.aws_asg import AwsAsgExecutor

        return AwsAsgExecutor(cfg.groups, region=cfg.executor.region, endpoint_url=cfg.executor.endpoint_url,
                              max_attempts=cfg.executor.max_attempts)
    if kind == "docker":
        from samm.execute.docker_exec import DockerExecutor

        return DockerExecutor(cfg.groups, base_url=cfg.executor.endpoint_url or os.environ.get("DOCKER_HOST"))
    raise ConfigurationProblem(f"executor kind {kind!r} is built with its managed system (see build_daemon)")


@dataclass
class Daemon:
    cfg: SammConfig
    loop: ControlLoop
    store: KnowledgeStore
    executor: Executor
    system: object | None = None  # the SimulatedSystem for executor kind `sim`
    closers: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        for c in reversed(self.closers):
            try:
                c()
            except Exception:  # noqa: BLE001 - best effort at shutdown
                log.exception("closing %s failed", c)


def build_daemon(cfg: SammConfig, *, executor: Executor | None = None, store: KnowledgeStore | None = None,
                 planner=None, clock: Callable[[], float] | None = None) -> Daemon:
    from samm.monitor.graphite_client import GraphiteSender, RenderClient

    from .monitoring import GraphiteMonitor, SimMonitor
    from .publish import GraphitePublisher

    fleet = FleetSpec.from_vm_types(cfg.groups)
    closers: list[Callable[[], None]] = []
    store = store or KnowledgeStore(cfg.knowledge.url)
    closers.append(store.close)
    system = None
    try:
        if cfg.executor.kind == "sim" and executor is None:
            from sim_bridge.workloads import load_workload
            from samm.execute.sim_exec import SimExecutor, SimulatedSystem, sim_config_for_groups
            from sim_bridge.config import SimConfig

            simcfg = sim_config_for_groups(cfg.groups, SimConfig(host_mips=cfg.simulation.host_mips),
                                           cfg.simulation.initial)
            system = SimulatedSystem(simcfg, load_workload(cfg.simulation.workload), seed=cfg.simulation.seed)
            closers.append(system.close)
            executor = SimExecutor(system)
            monitor = SimMonitor(system, fleet, executor)
            clock = clock or (lambda: system.clock)
        else:
            executor = executor or make_executor(cfg)
            closers.append(executor.close)
            g = cfg.graphite
            from samm.monitor.graphite_source import GraphiteSource

            source = GraphiteSource(RenderClient(g.render_url, g.timeout_s), g.prefix, [x.name for x in cfg.groups],
                                    interval_s=cfg.timing.interval_s, lateness_s=g.lateness_s,
                                    now=clock or time.time, ram_gb={x.name: x.ram_gb for x in cfg.groups})
            monitor = GraphiteMonitor(source, executor, fleet, [x.name for x in cfg.groups])
        publisher = None
        if cfg.graphite.publish and cfg.executor.kind != "sim":
            sender = GraphiteSender(cfg.graphite.carbon_host, cfg.graphite.carbon_port)
            publisher = GraphitePublisher(sender, cfg.graphite.render_url, cfg.graphite.prefix)
            closers.append(sender.close)
        planner = planner or make_planner(cfg)
        loop = ControlLoop(groups=cfg.groups, fleet=fleet, monitor=monitor, planner=planner, executor=executor,
                           store=store, agent_name=cfg.agent.name, warmup_s=cfg.timing.warmup_s,
                           cooldown_s=cfg.timing.cooldown_s, dry_run=cfg.executor.dry_run,
                           clock=clock or time.time, publisher=publisher)
    except BaseException:
        for c in reversed(closers):
            try:
                c()
            except Exception:  # noqa: BLE001
                pass
        raise
    return Daemon(cfg, loop, store, executor, system, closers)
