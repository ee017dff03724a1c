"""Gaps of the Execute stage and the live paths left by the earlier audits (session 100), each with
real components: moto's HTTP server, a private Docker engine, the testbed's real containers, real
VM worker processes in real cgroups, and real files.

* a request an executor refused before any call (bounds, no image) started the group's cool-down;
* the Docker executor took CPU limits above the engine's CPUs (a quota that limits nothing);
* Sinan's live samples file was replaced by a daemon restarted on the same `out`;
* a young restarted container's network counters were taken as the difference from the old ones;
* oversubscription workers spawned but not yet registered leaked when an interrupt landed.
Each test failed before its fix."""
from __future__ import annotations

import json
import math
import os
import time
import urllib.request
from contextlib import contextmanager
from types import SimpleNamespace

import numpy as np
import pytest

from agents.microservice_cores.control import AppLimits
from agents.microservice_cores.observation import FIELD, PERCENTILES, SERVICE_FIELDS, StepMeasurement
from agents.microservice_cores.topology import load_topology
from fixtures_docker import real_engine
from samm.config import GroupConfig
from samm.execute.base import GroupStatus, ScaleRequest
from samm.execute.docker_exec import DockerExecutor, limit_cores, parse_docker_time
from samm.execute.guard import after_action, plan_scaling
from samm.execute.local_dockerd import BUSYBOX_TAG

from test_execute_aws import GROUPS, make_executor, moto, moto_server  # noqa: F401
from test_execute_asg_audit import FailAfter

T0 = 2_000_000_000.0
TOPO = load_topology("testbed")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    yield from real_engine(tmp_path_factory, "gaps")


def docker_group(name: str, **kw) -> GroupConfig:
    base = dict(name=name, cores=1, ram_gb=0.0625, price_per_hour=0.1, min=0, max=3, docker_image=BUSYBOX_TAG)
    return GroupConfig(**(base | kw))


@pytest.fixture
def docker_executor(engine, request):
    ex = DockerExecutor([docker_group("web"), docker_group("noimage", docker_image=None),
                         docker_group("huge", cores=64, max=1)],
                        base_url=engine.base_url, namespace=f"g{abs(hash(request.node.name)) % 10**8}",
                        stop_timeout_s=1)
    yield ex
    for c in ex._docker().containers.list(all=True, filters={"label": f"samm.namespace={ex.namespace}"}):
        c.remove(force=True)
    ex.close()


# --------------------------------------------------------------------- 1. refusals and cool-downs
def _next_plan(inventory: dict[str, GroupStatus], cooldown: dict[str, float], now: float, key: str):
    return plan_scaling({"S": 1}, inventory, GROUPS, cooldown, now, key)


def test_an_asg_request_refused_before_any_call_starts_no_cooldown(moto, make_executor):  # noqa: F811
    """moto's S group holds 1 of [1, 10]; the operator lowered its MaxSize to 1 after the decision:
    the executor refuses the target 2 before SetDesiredCapacity. The refusal used to start the
    300-s cool-down (the daemon cools down on every non-skipped result), so the group could not
    act again when the operator raised MaxSize a minute later."""
    ex = make_executor()
    ex.client.update_auto_scaling_group(AutoScalingGroupName=GROUPS[0].asg_name, MaxSize=1)
    res = ex.apply(ScaleRequest("S", 2, "d1:S", basis=1))
    assert res.status == "failed" and "outside ASG" in res.error and not res.may_have_acted
    assert not res.starts_cooldown
    cooldown = after_action({}, "S", T0, 300, res)
    assert cooldown == {}

    ex.client.update_auto_scaling_group(AutoScalingGroupName=GROUPS[0].asg_name, MaxSize=10)
    plan = _next_plan(ex.inventory(), cooldown, T0 + 60, "d2")
    assert [a.request.target for a in plan.actions] == [2] and not plan.skipped
    ok = ex.apply(plan.actions[0].request)
    assert ok.status == "succeeded" and ok.starts_cooldown
    assert after_action(cooldown, "S", T0 + 60, 300, ok) == {"S": T0 + 360}


def test_an_asg_call_that_failed_after_its_retries_still_cools_down(moto, make_executor):  # noqa: F811
    """The other side: SetDesiredCapacity throttled to the end may still have acted."""
    ex = make_executor(max_attempts=2)
    FailAfter(ex.client, "SetDesiredCapacity", ok=0)
    res = ex.apply(ScaleRequest("S", 2, "d1:S", basis=1))
    assert res.status == "failed" and "SetDesiredCapacity" in res.error
    assert res.may_have_acted and res.starts_cooldown
    assert after_action({}, "S", T0, 300, res) == {"S": T0 + 300}


@pytest.mark.docker
def test_docker_requests_refused_before_any_call_start_no_cooldown(docker_executor):
    ex = docker_executor
    for req, says in ((ScaleRequest("web", 9, "a"), "outside [0, 3]"),
                      (ScaleRequest("noimage", 1, "b"), "has no docker_image"),
                      (ScaleRequest("gone", 1, "c"), "unknown group")):
        res = ex.apply(req)
        assert res.status == "failed" and says in res.error and not res.starts_cooldown, res
        assert after_action({"web": T0 - 1}, req.group, T0, 300, res) == {"web": T0 - 1}
    ok = ex.apply(ScaleRequest("web", 1, "d"))
    assert ok.status == "succeeded" and ok.starts_cooldown


# --------------------------------------------------------------------- 2. limits above the host
@pytest.mark.docker
def test_a_cpu_limit_above_the_engines_cpus_is_clamped_and_said(docker_executor):
    """The engine took a quota of 10 cores on a 2-CPU host: a limit that limits nothing, recorded
    as 10 (and an agent reading it back saw cores the host does not have)."""
    ex = docker_executor
    host = ex.host_cpus()
    assert host == ex._docker().info()["NCPU"]
    assert ex.apply(ScaleRequest("web", 1, "k")).status == "succeeded"
    name = f"{ex.namespace}-web-1"
    res = ex.set_cpu_limit(name, host + 8.5)
    assert res.status == "succeeded", res
    assert res.detail["cores"] == host and res.detail["cores_asked"] == host + 8.5 and "clamped" in res.detail
    attrs = ex._docker().api.inspect_container(name)["HostConfig"]
    assert limit_cores(attrs) == pytest.approx(host)
    within = ex.set_cpu_limit(name, 0.5)             # a limit within the host is sent as asked
    assert within.status == "succeeded" and "clamped" not in within.detail and within.detail["cores"] == 0.5


@pytest.mark.docker
def test_a_group_with_more_cores_than_the_engine_starts_clamped(docker_executor):
    ex = docker_executor
    res = ex.apply(ScaleRequest("huge", 1, "k"))
    assert res.status == "succeeded" and "clamped" in res.detail and res.detail["cores_asked"] == 64, res
    attrs = ex._docker().api.inspect_container(res.detail["started"][0])["HostConfig"]
    assert limit_cores(attrs) == pytest.approx(ex.host_cpus())


@pytest.mark.docker
def test_a_cpus_container_given_more_than_the_host_is_clamped_not_refused(engine):
    """On a `--cpus` (NanoCpus) container the engine refused the same limit ("Range of CPUs is
    from 0.01 to 2.00"): the agent's change failed every second."""
    client = engine.client()
    c = client.containers.run(BUSYBOX_TAG, ["sleep", "600"], name="gaps-nano", detach=True, init=True,
                              nano_cpus=500_000_000)
    ex = DockerExecutor([], base_url=engine.base_url, timeout_s=5)
    try:
        res = ex.set_cpu_limit("gaps-nano", 40.0)
        assert res.status == "succeeded", res.error
        host = client.api.inspect_container("gaps-nano")["HostConfig"]
        assert host["NanoCpus"] == ex.host_cpus() * 10**9 and res.detail["cores_asked"] == 40.0
    finally:
        ex.close()
        c.remove(force=True)
        client.close()


def engine_app(engine, client, tmp_path, names: dict[str, str]):
    """What the Measurer and the control loop drive on the private engine: each service's
    container by name, its limit set through a real DockerExecutor (returned too)."""
    ex = DockerExecutor([], base_url=engine.base_url, timeout_s=5)

    class App:
        state_dir = tmp_path

        def set_limit(self, s, cores):
            return ex.set_cpu_limit(names[s], cores)
    App.names, App.client = names, client
    return App, ex


@contextmanager
def chain3_sleepers(engine, tmp_path, prefix: str):
    """chain3's services as busybox sleepers at half a core on the private engine, with what the
    Measurer and the loop drive (engine_app) and a load file path; removed at the end."""
    topo = load_topology("chain3")
    client = engine.client()
    names = {s: f"{prefix}-{s}" for s in topo.service_names}
    made = [client.containers.run(BUSYBOX_TAG, ["sleep", "600"], name=n, detach=True, init=True,
                                  cpu_period=100_000, cpu_quota=50_000) for n in names.values()]
    App, ex = engine_app(engine, client, tmp_path, names)
    try:
        yield SimpleNamespace(topo=topo, client=client, names=names, App=App, ex=ex, load=tmp_path / "load.jsonl")
    finally:
        ex.close()
        for c in made:
            c.remove(force=True)
        client.close()


@pytest.mark.docker
def test_the_testbed_loop_does_not_send_a_clamped_limit_again_every_second(engine, tmp_path):
    """With the clamp, an agent asking for more than the host (chain3's logic: cap 3 on a 2-CPU
    engine) found the engine at 2 each step, unlike the 3 it asked, and sent it again: an action
    per second that changes nothing. The loop's measurements are the real Measurer's."""
    from agents.microservice_cores.daemon_loop import LoadFile
    from agents.microservice_cores.hosting import make_controller
    from samm.testbed.microservices.loop import ControlLoop
    from samm.testbed.microservices.measure import Measurer

    with chain3_sleepers(engine, tmp_path, "gaps-clamp") as app:
        topo, App, ex, load = app.topo, app.App, app.ex, app.load
        host = ex.host_cpus()
        caps = dict(zip(topo.service_names, topo.caps))
        assert max(caps.values()) > host, "this engine has as many CPUs as chain3's largest cap"
        m = Measurer(topo, App(), LoadFile(load))
        limits = AppLimits(topo.service_names, topo.caps, topo.qos_ms)
        controller = make_controller("static-max", topo)
        controller.reset(limits)
        loop = ControlLoop(limits, controller, App())
        m.measure()
        sent = []
        base = int(time.time()) - 2   # a load second of its own per step: one second is fresh to one step
        for k in range(3):
            with load.open("a") as f:
                f.write(json.dumps({"second": base + k, "t_end": base + k + 1, "requests_per_s": 5.0,
                                    "failures_per_s": 0.0, "latency_ms": [10.0] * len(PERCENTILES)}) + "\n")
            rec = loop.step(k, m.measure())
            assert rec.targets is not None and not rec.errors, rec
            sent.append(dict(rec.applied))
        assert set(sent[0]) == set(topo.service_names)            # every service from 0.5 to its cap
        assert sent[1] == {} and sent[2] == {}, sent             # nothing more: the engine holds the clamp
        assert rec.limits == {s: pytest.approx(min(c, host)) for s, c in caps.items()}


@pytest.mark.docker
def test_a_running_container_whose_cgroup_is_hidden_has_unknown_use_and_no_action(engine, tmp_path):
    """Under systemd's ProtectProc=invisible the daemon cannot read the containers' /proc/<pid>/cgroup:
    the Measurer reported a use of 0 for every service, without a word, and AutoScale cut every
    limit by 10 % a second to its floor. Now the use is unknown, named, and the step takes no action."""
    from agents.microservice_cores.daemon_loop import LoadFile
    from agents.microservice_cores.hosting import make_controller
    from samm.monitor.cgroups import CgroupReader
    from samm.testbed.microservices.loop import ControlLoop
    from samm.testbed.microservices.measure import Measurer

    class Hidden(CgroupReader):
        def paths(self, pid):
            raise PermissionError(13, "Permission denied", f"/proc/{pid}/cgroup")

    with chain3_sleepers(engine, tmp_path, "gaps-hidden") as app:
        topo, client, names, App, load = app.topo, app.client, app.names, app.App, app.load
        m = Measurer(topo, App(), LoadFile(load), cgroups=Hidden())
        limits = AppLimits(topo.service_names, topo.caps, topo.qos_ms)
        controller = make_controller("autoscale", topo)
        controller.reset(limits)
        loop = ControlLoop(limits, controller, App())
        m.measure()
        base = int(time.time()) - 1
        with load.open("a") as f:
            f.write(json.dumps({"second": base, "t_end": base + 1, "requests_per_s": 5.0, "failures_per_s": 0.0,
                                "latency_ms": [10.0] * len(PERCENTILES)}) + "\n")
        got = m.measure()
        unknown = got.extra["cpu_unknown"]
        assert [u.split(":")[0] for u in unknown] == list(topo.service_names)
        assert all("Permission denied" in u for u in unknown)
        rec = loop.step(0, got)
        assert rec.action == "no action: CPU use unreadable" and rec.applied == {} and rec.targets is None
        assert rec.errors == unknown
        assert {n: client.containers.get(n).attrs["HostConfig"]["CpuQuota"] for n in names.values()} == \
            {n: 50_000 for n in names.values()}                         # every limit as it was
        assert Measurer(topo, App(), LoadFile(load)).measure().extra["cpu_unknown"] == []  # readable: none


@pytest.mark.docker
def test_the_testbeds_containers_start_within_the_engines_cpus(engine, tmp_path):
    """chain3's logic (cap 3) started with a 3-core quota on a 2-CPU engine, and read back as 3
    until the loop's first change clamped it: the first step saw a limit the host does not have."""
    from samm.testbed.microservices.containers import AppContainers, find_base_port

    topo = load_topology("chain3")
    app = AppContainers(topo, engine.base_url, tmp_path, namespace="msclamp", base_port=find_base_port(3, 18760))
    try:
        host = app.executor.host_cpus()
        app.start()
        for s, cap in zip(topo.service_names, topo.caps):
            held = limit_cores(app.client.api.inspect_container(app.names[s])["HostConfig"])
            assert held == pytest.approx(min(cap, host)), s
    finally:
        app.close()


@pytest.mark.docker
def test_a_clamped_limit_left_in_flight_is_recovered_as_succeeded(engine, tmp_path):
    """A daemon killed while setting 3 cores (chain3's logic) on a 2-CPU engine: the engine holds
    2, the clamp of that request, and `recover()` used to record the change as failed."""
    from agents.microservice_cores.daemon_loop import (ContainersConfig, EngineContainers, LoadFile,
                                                       MicroserviceDaemonLoop, MicroserviceLoopConfig)
    from agents.microservice_cores.hosting import make_controller
    from samm.knowledge.store import KnowledgeStore
    from samm.testbed.microservices.loop import ControlLoop

    topo = load_topology("chain3")
    client = engine.client()
    made = [client.containers.run(BUSYBOX_TAG, ["sleep", "600"], name=f"gaps-rec-{s}", detach=True, init=True,
                                  cpu_period=100_000, cpu_quota=50_000) for s in topo.service_names]
    store = KnowledgeStore(f"sqlite:///{tmp_path / 'k.db'}")
    cfg = MicroserviceLoopConfig(name="rec", app="chain3", load={"path": str(tmp_path / "load.jsonl")},
                                 containers={"base_url": engine.base_url, "name_prefix": "gaps-rec-"})
    containers = EngineContainers(topo.service_names, ContainersConfig(**cfg.containers.model_dump()))
    try:
        host = containers.executor.host_cpus()
        assert containers.set_limit("logic", 3.0).detail["cores"] == host   # what the killed daemon's call did
        decision, _ = store.record_decision("step1", agent="static-max", action={"cores": {"logic": 3.0}},
                                            source="agent", loop="rec", problem="microservice-cores")
        store.begin_action(decision, "rec:step1:logic", "docker", "logic", {"cores": 3.0, "reapply": False},
                           loop="rec")
        limits = AppLimits(topo.service_names, topo.caps, topo.qos_ms)
        controller = make_controller("static-max", topo)
        controller.reset(limits)
        inner = ControlLoop(limits, controller, containers, store, loop_name="rec")
        loop = MicroserviceDaemonLoop("rec", cfg, topo, containers, LoadFile(cfg.load.path), inner, store, time.time)
        notes = loop.recover()
        assert store.action("rec:step1:logic").status == "succeeded", notes
    finally:
        containers.close()
        store.close()
        for c in made:
            c.remove(force=True)
        client.close()


# --------------------------------------------------------------------- 3. Sinan's samples
def _meas(t: float, p99: float) -> StepMeasurement:
    per = np.zeros((TOPO.n_services, len(SERVICE_FIELDS)))
    per[:, FIELD["cpu_limit"]] = TOPO.caps
    per[:, FIELD["cpu_used"]] = 0.05
    return StepMeasurement(TOPO.service_names, per, np.full(len(PERCENTILES), p99), 10.0, 0.0, TOPO.qos_ms, t=t)


def _collect(out, seconds: int, p99: float, seed: int):
    from agents.microservice_cores.sinan_live import SinanCollector

    c = SinanCollector(TOPO, out, seed=seed)
    c.reset(AppLimits(TOPO.service_names, TOPO.caps, TOPO.qos_ms))
    for t in range(seconds):
        c.act(_meas(float(t), p99))
    return c


def test_a_restarted_collector_on_the_same_out_keeps_the_earlier_samples(tmp_path):
    """The daemon's sinan-explore loop writes its samples at shutdown: the run after a restart
    wrote sinan-samples.npz over the first run's, whose seconds were lost."""
    from agents.microservice_cores.sinan_live import SAMPLES_FILE, fit_live, load_samples

    first = _collect(tmp_path, 12, 5.0, seed=0)
    assert first.close() == tmp_path / SAMPLES_FILE
    assert first.close() == tmp_path / SAMPLES_FILE        # the same run's second close rewrites its own
    second = _collect(tmp_path, 20, 400.0, seed=1)          # the restart
    assert second.close() == tmp_path / "sinan-samples-1.npz"
    third = _collect(tmp_path, 9, 5.0, seed=2)
    assert third.close() == tmp_path / "sinan-samples-2.npz"
    assert {p.name for p in tmp_path.iterdir()} == {SAMPLES_FILE, "sinan-samples-1.npz", "sinan-samples-2.npz"}

    k = 5
    data = load_samples([tmp_path], TOPO, k=k)             # the folder: every run in it, a group each
    assert len(data.y_lat) == (12 - k) + (20 - k) + (9 - k)   # n acts: n - 1 measured seconds, k - 1 unlabelled
    assert sorted(np.unique(data.group).tolist()) == [0, 1, 2]
    assert data.y_viol[data.group == 1].all() and not data.y_viol[data.group == 0].any()
    one = load_samples([tmp_path / SAMPLES_FILE], TOPO, k=k)   # a file is still just that file
    assert len(one.y_lat) == 12 - k

    model = fit_live(TOPO, [tmp_path], seed=0)
    assert [os.path.basename(r) for r in model.info["live"]["runs"]] == [SAMPLES_FILE, "sinan-samples-1.npz",
                                                                        "sinan-samples-2.npz"]


def test_one_samples_folder_given_alone_is_read_as_that_folder(tmp_path):
    """`load_samples("DIR", topo)` took each character of the name for a path ("D: cannot read
    the samples")."""
    from agents.microservice_cores.sinan_live import load_samples

    _collect(tmp_path, 12, 5.0, seed=0).close()
    assert len(load_samples(str(tmp_path), TOPO, k=5).y_lat) == len(load_samples([tmp_path], TOPO, k=5).y_lat) == 7
    assert len(load_samples(tmp_path, TOPO, k=5).y_lat) == 7


# --------------------------------------------------------------------- 4. network counters
class _NoLoad:
    def latest(self):
        return None


def _counters(app, s: str) -> dict:
    return json.loads((app.state_dir / f"{s}.json").read_text())


def _restart(app, s: str, while_down=lambda: None) -> float:
    """Kill `s`, start it again and wait until it answers; its container's new start time."""
    app.kill(s)
    deadline = time.monotonic() + 20
    while app.client.api.inspect_container(app.names[s])["State"]["Running"]:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    while_down()
    assert app.ensure_running() == [s] and not app.errors
    app.wait_ready(services=[s])
    return parse_docker_time(app.client.api.inspect_container(app.names[s])["State"]["StartedAt"])


def _wait_for(pred, timeout_s: float = 20.0):
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline
        time.sleep(0.1)


@pytest.mark.docker
def test_a_restarted_young_containers_network_counters_count_from_zero(engine, tmp_path):
    """The CPU counters of a restarted container counted from zero (third audit), its network
    counters did not: a young service whose new counter had passed the old one got the difference
    (a tenth of its traffic); and a counters file the old process left was read against the zero."""
    from samm.testbed.microservices.containers import AppContainers, find_base_port
    from samm.testbed.microservices.measure import Measurer

    s = "geo"
    i = TOPO.service_names.index(s)
    app = AppContainers(TOPO, engine.base_url, tmp_path, namespace="msgaps", base_port=find_base_port(7, 18740))
    try:
        app.start()
        url = f"http://127.0.0.1:{app.ports[s]}/health"
        for _ in range(5):
            urllib.request.urlopen(url, timeout=2).read()
        _wait_for(lambda: (app.state_dir / f"{s}.json").is_file() and _counters(app, s)["rx_bytes"] > 0)
        m = Measurer(TOPO, app, _NoLoad())
        t0 = time.time()
        m.measure(now=t0)
        old = m._prev[s]["rx_bytes"]
        assert old > 0

        _restart(app, s)
        while True:                                         # the new process passes the old counter
            c = _counters(app, s)
            if c["rx_bytes"] > old * 1.5 and c["t"] > time.time() - 0.9:
                break
            for _ in range(20):
                urllib.request.urlopen(url, timeout=2).read()
            time.sleep(0.3)
        row = m.measure(now=t0 + 1.0).per_service[i]
        assert row[FIELD["rx_bytes"]] == pytest.approx(m._prev[s]["rx_bytes"])   # the new counter, not new - old
        assert row[FIELD["rx_packets"]] == pytest.approx(m._prev[s]["rx_messages"])

        # The new process has not written yet: the file is the old one's. Kept so here by a
        # directory where app.py writes its temporary file (each write fails; it tries again).
        blocker = app.state_dir / f"{s}.json.tmp"
        left = None

        def block():
            nonlocal left
            blocker.mkdir()
            left = _counters(app, s)    # the killed process's last write
        started = _restart(app, s, block)
        try:
            assert left["t"] < started and _counters(app, s) == left
            row = m.measure(now=t0 + 2.0).per_service[i]
            assert row[FIELD["rx_bytes"]] == 0.0 and row[FIELD["tx_bytes"]] == 0.0   # not the old life at once
            assert row[FIELD["rx_packets"]] == 0.0
        finally:
            blocker.rmdir()
        _wait_for(lambda: _counters(app, s)["t"] > started)
        row = m.measure(now=t0 + 3.0).per_service[i]
        assert 0 < row[FIELD["rx_bytes"]] == pytest.approx(m._prev[s]["rx_bytes"])   # the new process, from zero
        assert row[FIELD["rx_bytes"]] < left["rx_bytes"]
    finally:
        app.close()


# --------------------------------------------------------------------- 5. workers and interrupts
def test_workers_spawned_before_an_interrupt_are_stopped(tmp_path):
    """Ctrl-C between two spawns in `_start_workers`: the workers spawned so far were in a local
    list only, so `stop_all` (the run's `finally`) left them running, each waiting for its "go"."""
    from agents.oversubscription.settings import SETTINGS
    from agents.oversubscription.workload import Workload
    from samm.monitor.graphite_client import GraphiteSender, RenderClient
    from samm.testbed.oversub.admission import AdmissionExecutor, LiveParams
    from samm.testbed.oversub.cgroups import PmCgroups
    from test_oversub_live import cgroups_or_skip

    cgroups_or_skip()
    setting = SETTINGS["tiny"].scaled(n_pms=2)
    v = 3
    w = Workload(n_subscribers=3, steps=2, sub=[0] * v, arrive=[0] * v, depart=[2] * v, cores=[1.0] * v,
                 mem=[1.0] * v, net=[0.1] * v, usage=np.full((v, 2), 0.3), name="interrupt")

    def rows_then_ctrl_c():
        yield 0
        yield 1
        raise KeyboardInterrupt   # lands after two workers were spawned

    spawned = []
    with PmCgroups(2, quota_host_cores=0.5) as cg:
        ex = AdmissionExecutor(setting, w, agent="probe", service_url="http://127.0.0.1:9", store=None, run="gaps",
                               cgroups=cg, sender=GraphiteSender("127.0.0.1", 9),
                               render=RenderClient("http://127.0.0.1:9"),
                               params=LiveParams(seconds_per_step=1, post_events=False))
        ex.t0 = math.floor(time.time()) + 5.0
        for row in range(v):
            assert ex._place(row, 0.5) >= 0
        children_before = _children()
        try:
            with pytest.raises(KeyboardInterrupt):
                ex._start_workers(0, rows_then_ctrl_c())
            spawned = sorted(_children() - children_before)
            assert len(spawned) == 2
            ex.stop_all()
            assert not [p for p in spawned if _alive(p)], "workers left running after stop_all"
        finally:
            for p in spawned:
                if _alive(p):
                    os.kill(p, 9)


def _children() -> set[int]:
    me, out = os.getpid(), set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = open(f"/proc/{d}/stat").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == me and "samm.testbed.oversub.vm" in \
                    open(f"/proc/{d}/cmdline").read().replace("\0", " "):
                out.add(int(d))
    return out


def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
