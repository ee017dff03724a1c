"""Regression tests of the microservice testbed's load freshness and Sinan's live samples:

* a load second whose successor arrived late (within the 2-s staleness window) was read as fresh
  by two steps: the controller acted twice on one p99 and the summary counted that second twice;
* Sinan's live samples held the limits the explorer chose, not those the engine applied (the
  guard's floor, the executor's clamp to the engine's CPUs, a failed update), and an unlimited
  container read as the host's CPUs;
* Sinan's samples were written only at close: a daemon killed with SIGKILL lost its whole run.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from agents.microservice_cores.control import AppLimits
from agents.microservice_cores.daemon_loop import LoadFile
from agents.microservice_cores.observation import FIELD, PERCENTILES, SERVICE_FIELDS, StepMeasurement
from agents.microservice_cores.sinan import FEATURES_PER_SERVICE
from agents.microservice_cores.sinan_live import SinanCollector, load_samples
from agents.microservice_cores.topology import load_topology
from fixtures_docker import real_engine
from test_execute_live_gaps import engine_app
from samm.testbed.microservices.loop import ControlLoop
from samm.testbed.microservices.measure import Measurer
from samm.testbed.microservices.run import MicroservicesRunOptions, summarize

TOPO = load_topology("testbed")
CHAIN = load_topology("chain3")
REPO = Path(__file__).resolve().parents[1]
NF = len(FEATURES_PER_SERVICE)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    yield from real_engine(tmp_path_factory, "tsf")


def _line(second: int, p99: float = 10.0) -> str:
    return json.dumps({"second": second, "t_end": second + 1, "requests_per_s": 5.0, "failures_per_s": 0.0,
                       "latency_ms": [p99] * len(PERCENTILES)}) + "\n"


class _NoEngine:
    """Containers whose engine cannot be read: only the load side of Measurer is exercised."""
    names = {s: s for s in TOPO.service_names}

    def __init__(self, state_dir):
        self.state_dir = state_dir

    class client:
        class api:
            @staticmethod
            def inspect_container(name):
                raise ConnectionError("no engine")


class _Counting:
    """A controller that counts the seconds it was asked about (the caps, every time)."""
    name = "counting"

    def __init__(self, topo):
        self.topo, self.seen = topo, []

    def reset(self, limits):
        pass

    def act(self, m):
        self.seen.append(m.extra.get("load_second"))
        return self.topo.caps.copy()


# --------------------------------------------------------------------- 1. one load second, one step
def test_a_load_second_read_by_two_steps_is_fresh_to_the_first_only(tmp_path):
    """Locust's line for second S+1 arriving 0.5 s late: the step at S+1.8 found S again (0.8 s
    old, within the 2-s rule) and took it as fresh; the summary counted its p99 twice."""
    S = int(time.time()) - 5
    path = tmp_path / "load.jsonl"
    path.write_text(_line(S - 1, p99=7.0))
    m = Measurer(TOPO, _NoEngine(tmp_path), LoadFile(path), stale_s=2.0)
    m.measure(now=S + 0.3, claim=False)                 # primes the counters: no step uses its second
    path.open("a").write(_line(S, p99=30.0))
    ms = [m.measure(now=S + 1.3)]                       # second S: fresh
    ms.append(m.measure(now=S + 1.8))                   # S+1's line not there yet: S again
    path.open("a").write(_line(S + 1, p99=40.0))
    ms.append(m.measure(now=S + 2.3))                   # S+1: fresh
    ms.append(m.measure(now=S + 3.3))                   # Locust stopped: nothing new, within 2 s
    assert [x.extra["latency_state"] for x in ms] == ["ok", "stale", "ok", "stale"]
    assert [x.extra["load_second"] for x in ms] == [S, S, S + 1, S + 1]
    assert ms[1].extra["load_repeated"] and not ms[1].latency_known and np.isnan(ms[1].requests_per_s)

    loop = ControlLoop(AppLimits(TOPO.service_names, TOPO.caps, TOPO.qos_ms), _Counting(TOPO), None)
    for k, x in enumerate(ms):
        x.extra["engine_errors"] = []                   # the load side alone decides here
        x.extra["running"] = {s: True for s in TOPO.service_names}
        loop.actuator = type("A", (), {"set_limit": staticmethod(lambda s, c: _Ok())})()
        loop.step(k, x)
    assert loop.controller.seen == [S, S + 1]          # asked once per load second
    assert [r.action for r in loop.records][1] == "no action: stale latency"
    summary = summarize(loop.records, TOPO, MicroservicesRunOptions(), "r", "l", time.time(), [])
    assert summary["known_latency_seconds"] == 2 and summary["stale_seconds"] == 2
    assert summary["p99_ms"]["mean"] == pytest.approx(35.0)   # 30 and 40, not 30, 30, 40


def test_a_replaced_load_file_repeating_its_last_line_is_not_fresh_again(tmp_path):
    """A new load file (another inode) whose last line is the second already used: the reader
    parses it into a new dict, and an identity check took it as fresh, counting its p99 twice."""
    S = int(time.time()) - 5
    path = tmp_path / "load.jsonl"
    path.write_text(_line(S - 1))
    m = Measurer(TOPO, _NoEngine(tmp_path), LoadFile(path), stale_s=2.0)
    m.measure(now=S + 0.3, claim=False)
    path.open("a").write(_line(S, p99=30.0))
    first = m.measure(now=S + 1.3)
    replacement = tmp_path / "load.new"
    replacement.write_text(_line(S - 1) + _line(S, p99=30.0))
    os.replace(replacement, path)                       # a new file, the same newest second
    again = m.measure(now=S + 1.8)
    assert first.extra["latency_state"] == "ok"
    assert again.extra["load_second"] == S and again.extra["load_repeated"]
    assert again.extra["latency_state"] == "stale" and not again.latency_known
    path.open("a").write(_line(S + 1, p99=40.0))
    assert m.measure(now=S + 2.3).extra["latency_state"] == "ok"


class _Ok:
    status, error, detail = "succeeded", None, {}


def test_a_priming_measurement_leaves_its_second_to_the_first_step(tmp_path):
    """The counters' priming read (the testbed's, the daemon's recover) takes no decision: the
    second it saw is still fresh to step 0, and a second measurement of one priming is too."""
    S = int(time.time()) - 5
    path = tmp_path / "load.jsonl"
    path.write_text(_line(S))
    m = Measurer(TOPO, _NoEngine(tmp_path), LoadFile(path), stale_s=2.0)
    m.measure(now=S + 1.2, claim=False)
    assert m.measure(now=S + 1.5).extra["latency_state"] == "ok"
    assert m.measure(now=S + 1.7).extra["latency_state"] == "stale"


@pytest.mark.docker
def test_the_daemon_loop_acts_once_per_load_second_on_a_real_engine(engine, tmp_path):
    """The daemon's step (EngineMeasurer through MicroserviceDaemonLoop) on real containers: a
    step finding the second its predecessor used records "stale", not a second decision on it."""
    from agents.microservice_cores.daemon_loop import (ContainersConfig, EngineContainers, LoadFileConfig,
                                                       MicroserviceDaemonLoop, MicroserviceLoopConfig)
    from samm.execute.local_dockerd import BUSYBOX_TAG

    client = engine.client()
    made = [client.containers.run(BUSYBOX_TAG, ["sleep", "600"], name=f"tsfd-{s}", detach=True, init=True,
                                  cpu_period=100_000, cpu_quota=20_000) for s in CHAIN.service_names]
    path = tmp_path / "load.jsonl"
    cfg = MicroserviceLoopConfig(name="tsfd", app="chain3", containers=ContainersConfig(
        name_prefix="tsfd-", base_url=engine.base_url), load=LoadFileConfig(path=str(path)))
    containers = EngineContainers(CHAIN.service_names, cfg.containers)
    controller = _Counting(CHAIN)
    limits = AppLimits(CHAIN.service_names, CHAIN.caps, CHAIN.qos_ms)
    inner = ControlLoop(limits, controller, containers, None, loop_name="tsfd")
    clock = [1000.0]
    loop = MicroserviceDaemonLoop("tsfd", cfg, CHAIN, containers, LoadFile(path), inner, None, lambda: clock[0])
    try:
        S = int(time.time())
        path.write_text(_line(S - 1))
        loop.run_once()                                # primes
        reps = []
        for k in range(3):
            clock[0] += 1.0
            if k == 2:
                path.open("a").write(_line(S))
            reps.append(loop.run_once())
        assert [r.status for r in reps] == ["ok", "stale", "ok"], [r.reasons for r in reps]
        assert controller.seen == [S - 1, S]
    finally:
        containers.close()
        for c in made:
            c.remove(force=True)
        client.close()


# --------------------------------------------------------------------- 2. the limits applied
def _meas(topo, t: float, limit, p99: float = 5.0, unlimited=()) -> StepMeasurement:
    per = np.zeros((topo.n_services, len(SERVICE_FIELDS)))
    per[:, FIELD["cpu_limit"]] = limit
    per[:, FIELD["cpu_used"]] = 0.05
    return StepMeasurement(topo.service_names, per, np.full(len(PERCENTILES), p99), 10.0, 0.0, topo.qos_ms, t=t,
                           extra={"unlimited": list(unlimited)})


def test_sinan_samples_hold_the_limits_in_force_not_those_chosen(tmp_path):
    """An update refused by the engine left the old limit in force; the sample said the chosen one."""
    c = SinanCollector(CHAIN, tmp_path, seed=3)
    c.reset(AppLimits(CHAIN.service_names, CHAIN.caps, CHAIN.qos_ms))
    held = CHAIN.caps * 0.5
    chosen = [c.act(_meas(CHAIN, float(t), held)) for t in range(6)]   # every update "failed"
    assert any(np.abs(x - held).max() > 1e-3 for x in chosen)           # the explorer did ask for others
    X, _ = c.samples()
    np.testing.assert_allclose(X[:, 0:NF * 3:NF], np.tile(held / CHAIN.caps, (5, 1)), rtol=1e-6)


def test_an_unlimited_container_reads_as_its_cap_in_sinan_features(tmp_path):
    """No CPU quota read as the host's CPUs (16 here): a limit the model never saw, 16/cap."""
    c = SinanCollector(CHAIN, tmp_path, seed=0)
    c.reset(AppLimits(CHAIN.service_names, CHAIN.caps, CHAIN.qos_ms))
    front = CHAIN.service_names[0]
    lim = CHAIN.caps * 0.5
    lim[0] = 16.0
    c.act(_meas(CHAIN, 0.0, lim, unlimited=[front]))
    c.act(_meas(CHAIN, 1.0, lim, unlimited=[front]))   # still unlimited: the update did not take
    X, _ = c.samples()
    assert X[0, 0] == pytest.approx(1.0)               # applied / cap: the cap
    assert X[0, 4] == pytest.approx(0.05 / CHAIN.caps[0])   # use / limit: of the cap, not of 16
    assert X[0, 5] == pytest.approx(1.0)               # applied / limit before: cap / cap
    assert c.hist.limit[0, -1, 0] == pytest.approx(CHAIN.caps[0])


@pytest.mark.docker
def test_sinan_samples_on_real_containers_hold_the_engines_clamp_and_the_cap_of_unlimited(engine, tmp_path):
    """On a 2-CPU engine, chain3's logic (cap 3) without a CPU quota: it read as the host's CPUs,
    the explorer's next limit for it (2.25) was clamped to the engine's 2 CPUs by the executor,
    and the sample said 2.25, over a limit of 2 that was never there."""
    from samm.execute.local_dockerd import BUSYBOX_TAG

    client = engine.client()
    names = {s: f"tsfs-{s}" for s in CHAIN.service_names}
    logic = CHAIN.service_names.index("logic")
    made = []
    for i, (s, n) in enumerate(names.items()):
        quota = {} if i == logic else {"cpu_period": 100_000, "cpu_quota": int(CHAIN.caps[i] * 100_000)}
        made.append(client.containers.run(BUSYBOX_TAG, ["sleep", "600"], name=n, detach=True, init=True, **quota))
    App, ex = engine_app(engine, client, tmp_path, names)
    path = tmp_path / "load.jsonl"
    try:
        host = ex.host_cpus()
        if CHAIN.caps[logic] <= host:
            pytest.skip(f"this engine has {host} CPUs: chain3's logic (cap 3) is not clamped")
        col = SinanCollector(CHAIN, tmp_path / "samples", seed=0)
        limits = AppLimits(CHAIN.service_names, CHAIN.caps, CHAIN.qos_ms)
        col.reset(limits)
        m = Measurer(CHAIN, App(), LoadFile(path))
        loop = ControlLoop(limits, col, App())
        m.measure(claim=False)
        for k in range(3):
            time.sleep(1.3 - time.time() % 1.0)        # as the testbed: 0.3 s after Locust's second
            path.open("a").write(_line(int(time.time()) - 1))
            mk = m.measure()
            if k == 0:
                assert mk.extra["unlimited"] == ["logic"] and mk.cpu_limit[logic] == host
            rec = loop.step(k, mk)
            assert rec.targets is not None, rec
        X, _ = col.samples()
        chosen, in_force = loop.records[0].targets, loop.records[1].limits   # the engine's, after step 0
        assert chosen["logic"] > host + 0.1 and in_force["logic"] == pytest.approx(host)   # clamped
        np.testing.assert_allclose(X[0, 0:NF * 3:NF] * CHAIN.caps, [in_force[s] for s in CHAIN.service_names],
                                   rtol=1e-5)
        # applied over the limit before it: that of an unlimited container is its cap (3), not the host's 2
        assert X[0, logic * NF + 5] == pytest.approx(host / CHAIN.caps[logic], rel=1e-5)
    finally:
        ex.close()
        for c in made:
            c.remove(force=True)
        client.close()


@pytest.fixture(scope="module")
def one_cpu_engine(tmp_path_factory):
    """A private engine that sees one CPU (dockerd counts the CPUs of its affinity), as a remote
    engine sees other CPUs than this host."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("this host has one CPU: an engine with fewer cannot be made")
    was = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(was)})          # the engine started now inherits it
    gen = real_engine(tmp_path_factory, "tsf1")
    try:
        engine = next(gen)
    finally:
        os.sched_setaffinity(0, was)
    yield engine
    next(gen, None)


@pytest.mark.docker
def test_an_unlimited_container_reads_as_the_engines_cpus_not_this_hosts(one_cpu_engine, tmp_path):
    """A container without a quota read as os.cpu_count() of the SAMM host: on an engine with more
    CPUs (a remote one) a service at its cap looked limited, and the loop never set the cap."""
    from agents.microservice_cores.daemon_loop import ContainersConfig, EngineContainers, EngineMeasurer
    from samm.execute.local_dockerd import BUSYBOX_TAG

    client = one_cpu_engine.client()
    made = [client.containers.run(BUSYBOX_TAG, ["sleep", "600"], name=f"tsfu-{s}", detach=True, init=True)
            for s in CHAIN.service_names]
    containers = EngineContainers(CHAIN.service_names, ContainersConfig(name_prefix="tsfu-",
                                                                        base_url=one_cpu_engine.base_url))
    try:
        assert containers.executor.host_cpus() == 1 and os.cpu_count() > 1
        assert containers.resolve() == []
        m = EngineMeasurer(CHAIN, containers, LoadFile(tmp_path / "load.jsonl")).measure()
        assert not m.extra["engine_errors"] and m.extra["unlimited"] == list(CHAIN.service_names)
        assert m.cpu_limit.tolist() == [1.0, 1.0, 1.0]
        assert containers.read_limit("front") == 1.0   # what the daemon's recover() compares
    finally:
        containers.close()
        for c in made:
            c.remove(force=True)
        client.close()


# --------------------------------------------------------------------- 3. samples kept on a kill
_KILLED = r"""
import sys
import numpy as np
from agents.microservice_cores.control import AppLimits
from agents.microservice_cores.observation import FIELD, PERCENTILES, SERVICE_FIELDS, StepMeasurement
from agents.microservice_cores.sinan_live import SinanCollector
from agents.microservice_cores.topology import load_topology

topo = load_topology("testbed")
c = SinanCollector(topo, sys.argv[1], seed=1)
c.reset(AppLimits(topo.service_names, topo.caps, topo.qos_ms))
rng = np.random.default_rng(0)
t = 0
while True:
    per = np.zeros((topo.n_services, len(SERVICE_FIELDS)))
    per[:, FIELD["cpu_limit"]] = topo.caps * 0.5
    per[:, FIELD["cpu_used"]] = rng.uniform(0, 0.2, topo.n_services)
    c.act(StepMeasurement(topo.service_names, per, np.full(len(PERCENTILES), rng.uniform(1, 50)), 10.0, 0.0,
                          topo.qos_ms, t=float(t)))
    t += 1
    print(t, flush=True)
"""


def _replay(n: int) -> SinanCollector:
    """The killed child's collector, run here for n seconds."""
    c = SinanCollector(TOPO, None, seed=1)
    c.reset(AppLimits(TOPO.service_names, TOPO.caps, TOPO.qos_ms))
    rng = np.random.default_rng(0)
    for t in range(n):
        per = np.zeros((TOPO.n_services, len(SERVICE_FIELDS)))
        per[:, FIELD["cpu_limit"]] = TOPO.caps * 0.5
        per[:, FIELD["cpu_used"]] = rng.uniform(0, 0.2, TOPO.n_services)
        c.act(StepMeasurement(TOPO.service_names, per, np.full(len(PERCENTILES), rng.uniform(1, 50)), 10.0, 0.0,
                              TOPO.qos_ms, t=float(t)))
    return c


def test_a_collector_killed_with_sigkill_keeps_its_samples(tmp_path):
    """Samples were written only at close(): a daemon killed (kill -9, the OOM killer) lost them all."""
    out = tmp_path / "samples"
    p = subprocess.Popen([sys.executable, "-c", _KILLED, str(out)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        acts = 0
        while acts < 40:
            line = p.stdout.readline()
            assert line, "the collector exited"
            acts = int(line)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    assert p.returncode == -signal.SIGKILL
    assert [f.name for f in out.iterdir()] == ["sinan-samples.jsonl"]
    data = load_samples(out, TOPO, k=5)
    n = len(data.y_lat) + 4                            # measured seconds in the journal
    assert n >= acts - 1                                # at most the allocation in force is lost
    X, p99 = _replay(n + 1).samples()
    np.testing.assert_array_equal(data.X, X[:n - 4])   # exactly what close() would have written
    np.testing.assert_allclose(data.y_lat, np.log(np.maximum(p99[:n - 4], 1e-3) / TOPO.qos_ms))


def _journal(out: Path, seconds: int, seed: int = 0) -> SinanCollector:
    c = SinanCollector(CHAIN, out, seed=seed)
    c.reset(AppLimits(CHAIN.service_names, CHAIN.caps, CHAIN.qos_ms))
    for t in range(seconds):
        c.act(_meas(CHAIN, float(t), CHAIN.caps * 0.5, p99=float(t)))
    return c


def test_a_torn_last_line_is_skipped_and_said_a_bad_middle_line_refused(tmp_path, caplog):
    c = _journal(tmp_path, 12)
    journal = tmp_path / "sinan-samples.jsonl"
    whole = load_samples(tmp_path, CHAIN, k=5)
    text = journal.read_text()
    journal.write_text(text[:-40])                     # killed in the middle of its last line
    with caplog.at_level(logging.WARNING):
        torn = load_samples(tmp_path, CHAIN, k=5)
    assert "last line (12) is torn" in caplog.text
    np.testing.assert_array_equal(torn.X, whole.X[:-1])
    lines = text.splitlines(keepends=True)
    journal.write_text("".join(lines[:3] + ["{not json\n"] + lines[4:]))
    with pytest.raises(ValueError, match=r"sinan-samples.jsonl: line 4 is not a sample"):
        load_samples(tmp_path, CHAIN, k=5)
    c.close()


@pytest.mark.parametrize("content", ["", '{"app": "chain3", "serv', '{"app": "chain3", "services": '
                                     '["front", "logic", "db"]}\n{"x": [0.1'])
def test_a_run_killed_before_its_first_whole_sample_is_skipped_beside_others(tmp_path, caplog, content):
    """Its journal is empty, or holds a torn header or sample: it stood for no run, not a reason to
    refuse the folder's other runs."""
    _journal(tmp_path, 12, seed=0).close()
    (tmp_path / "sinan-samples-1.jsonl").write_text(content)
    with caplog.at_level(logging.WARNING):
        assert len(load_samples(tmp_path, CHAIN, k=5).y_lat) == 7
    assert "sinan-samples-1.jsonl: 0 measured seconds" in caplog.text
    with pytest.raises(ValueError, match="sinan-samples-1.jsonl: 0 measured seconds, fewer than the look-ahead"):
        load_samples(tmp_path / "sinan-samples-1.jsonl", CHAIN, k=5)


def test_close_puts_the_npz_in_place_of_the_journal_and_a_killed_run_keeps_its_number(tmp_path):
    killed = _journal(tmp_path, 14, seed=1)             # never closed: its journal stays
    killed._end_journal()
    done = _journal(tmp_path, 12, seed=2)
    assert (tmp_path / "sinan-samples-1.jsonl").exists()
    X, _ = done.samples()
    assert done.close() == tmp_path / "sinan-samples-1.npz"
    assert sorted(f.name for f in tmp_path.iterdir()) == ["sinan-samples-1.npz", "sinan-samples.jsonl"]
    data = load_samples(tmp_path, CHAIN, k=5)          # the killed run first, then the closed one
    assert sorted(np.unique(data.group).tolist()) == [0, 1]
    np.testing.assert_array_equal(data.X[data.group == 1], X[:7])
    third = _journal(tmp_path, 6, seed=3)
    assert third.close() == tmp_path / "sinan-samples-2.npz"


def test_a_killed_run_too_short_to_label_is_skipped_beside_others(tmp_path, caplog):
    """A daemon killed in its first seconds left a journal of fewer seconds than the look-ahead:
    the whole folder was refused."""
    _journal(tmp_path, 12, seed=0).close()
    _journal(tmp_path, 3, seed=1)._end_journal()
    with caplog.at_level(logging.WARNING):
        data = load_samples(tmp_path, CHAIN, k=5)
    assert len(data.y_lat) == 11 - 4 and "sinan-samples-1.jsonl: 2 measured seconds" in caplog.text
    with pytest.raises(ValueError, match="fewer than the look-ahead"):
        load_samples(tmp_path / "sinan-samples-1.jsonl", CHAIN, k=5)


def test_a_journal_that_cannot_be_written_is_said_once_and_the_explorer_goes_on(tmp_path, caplog):
    """Writing as they come must not cost a decision: a failing journal is logged, once."""
    out = tmp_path / "out"
    out.write_text("a file where the folder should be")
    with caplog.at_level(logging.WARNING):
        c = _journal(out, 8)
    assert len(c.samples()[1]) == 7
    assert caplog.text.count("writing samples to") == 1
