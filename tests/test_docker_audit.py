"""Regression tests of the Docker execute path / microservice testbed audit (session 95):
malformed load lines, bad run options, an unwritable --out, the loop's knowledge-store failures
and replays, and a run that stops mid-way still writing the seconds it ran."""
from __future__ import annotations

import csv
import json
import os
import shutil
import time

import numpy as np
import pytest

from agents.microservice_cores.control import AppLimits
from agents.microservice_cores.daemon_loop import LoadFile
from agents.microservice_cores.observation import FIELD, PERCENTILES, SERVICE_FIELDS, StepMeasurement
from agents.microservice_cores.topology import load_topology
from fixtures_docker import locust_installed, real_engine  # noqa: F401  (fixtures)
from samm.execute.base import ActionResult
from samm.knowledge.store import KnowledgeStore
from samm.testbed.microservices.measure import Measurer
from samm.testbed.microservices.run import MicroservicesRunOptions, parse_faults, run_microservices

TOPO = load_topology("testbed")


# ------------------------------------------------------------------------------ the load file
class _NoEngine:
    """Containers whose engine cannot be read: only the load side of Measurer is exercised."""
    names = {s: s for s in TOPO.service_names}

    def __init__(self, state_dir):
        self.state_dir = state_dir   # no counters there: network fields are zeros

    class client:
        class api:
            @staticmethod
            def inspect_container(name):
                raise ConnectionError("no engine")


def _line(second: int, **over) -> str:
    rec = {"second": second, "t_end": second + 1, "requests_per_s": 5.0, "failures_per_s": 0.0,
           "latency_ms": [10.0] * len(PERCENTILES)} | over
    return json.dumps(rec)


@pytest.mark.parametrize("bad", [
    "[1, 2]", '{"t_end": 1}', '{"second": "abc", "t_end": 1}', '{"second": null}', '{"second": Infinity}',
    "NO_T_END", "NULL_RPS", "SHORT_LATENCY", "NAN_T_END", "FAR_FUTURE"])
def test_a_malformed_load_line_is_skipped_and_never_stops_the_measurement(tmp_path, bad):
    now = int(time.time())
    bad = {"NO_T_END": json.dumps({"second": now + 5}),
           "NULL_RPS": _line(now + 5, t_end=now, requests_per_s=None),
           "SHORT_LATENCY": _line(now + 5, t_end=now, latency_ms=[1, 2]),
           "NAN_T_END": _line(now + 5, t_end=float("nan")),
           "FAR_FUTURE": _line(now + 1000)}.get(bad, bad)
    path = tmp_path / "load.jsonl"
    path.write_text(_line(now - 1) + "\n" + bad + "\n")
    lf = LoadFile(path)
    m = Measurer(TOPO, _NoEngine(tmp_path), lf).measure()
    assert lf.latest()["second"] == now - 1          # the good second is the newest one
    assert lf._reader.rejected == 1 and lf._reader.last_rejected
    assert m.extra["latency_state"] == "ok" and m.p99_ms == 10.0


def test_a_load_second_ending_after_now_is_stale(tmp_path):
    now = time.time()
    path = tmp_path / "load.jsonl"
    path.write_text(_line(int(now) + 10) + "\n")      # within the reader's limit, but not of this clock
    m = Measurer(TOPO, _NoEngine(tmp_path), LoadFile(path), stale_s=2.0).measure(now=now)
    assert m.extra["latency_state"] == "stale" and not m.latency_known


@pytest.mark.parametrize("content", ["[1]", '{"rx_bytes": 5}', '{"rx_bytes": "x", "tx_bytes": 1, "rx_messages": 1, '
                                     '"tx_messages": 1}', '{"rx_bytes": NaN, "tx_bytes": 1, "rx_messages": 1, "tx_messages": 1}'])
def test_a_bad_counters_file_is_ignored_not_fatal(tmp_path, content):
    good = {"rx_bytes": 100, "tx_bytes": 100, "rx_messages": 1, "tx_messages": 1}
    front = tmp_path / f"{TOPO.service_names[0]}.json"
    front.write_text(json.dumps(good))
    m = Measurer(TOPO, _NoEngine(tmp_path), LoadFile(tmp_path / "load.jsonl"))
    m.measure()
    front.write_text(content)                      # another process's file (the daemon's counters_dir)
    for _ in range(2):
        row = m.measure().per_service[0]
        assert np.all(np.isfinite(row)) and row[FIELD["rx_bytes"]] == 0.0
    front.write_text(json.dumps(good | {"rx_bytes": 400}))
    assert m.measure().per_service[0][FIELD["rx_bytes"]] > 0     # the good counters count on


# ------------------------------------------------------------------------------ run options and CLI
@pytest.mark.parametrize("over, names", [
    ({"fault_at": float("nan")}, "fault_at"), ({"fault_at": float("inf")}, "fault_at"),
    ({"fault_at": -5.0}, "fault_at"), ({"stall_seconds": float("nan")}, "stall_seconds"),
    ({"stall_seconds": -1.0}, "stall_seconds"), ({"warmup_s": float("nan")}, "warmup_s"),
    ({"warmup_s": float("inf")}, "warmup_s"), ({"base_port": -1}, "base_port"), ({"base_port": 70000}, "base_port"),
    ({"run_name": "a b"}, "run_name"), ({"cpu_burst": float("nan")}, "cpu burst"), ({"users": 0}, "users"),
    ({"faults": ("stall-load@7",), "seconds": 3}, "never fires"), ({"initial": "fraction=abc"}, "initial fraction")])
def test_bad_run_options_are_refused_before_anything_starts(tmp_path, monkeypatch, over, names):
    from samm.testbed.microservices import containers

    def no_engine(*a, **k):
        raise AssertionError("an engine was started for options that are refused")
    monkeypatch.setattr(containers.PrivateDockerd, "start", no_engine)
    monkeypatch.setattr(containers.AppContainers, "__init__", no_engine)
    o = MicroservicesRunOptions(out_dir=str(tmp_path / "run"), plots=False, **({"faults": ("stall-load",)} | over))
    with pytest.raises(ValueError, match=names):
        run_microservices(o)


def test_good_run_options_pass_the_check():
    from samm.testbed.microservices.run import check_options

    check_options(MicroservicesRunOptions(fault_at=0.0, warmup_s=0.0, base_port=18100, run_name="r-1.a"))
    assert parse_faults(("kill-service@0", "stall-load"), 2, 3) == {0: ["kill-service"], 2: ["stall-load"]}


def test_an_unwritable_out_dir_is_a_clear_error():
    from click.testing import CliRunner

    from samm.cli.main import cli

    res = CliRunner().invoke(cli, ["testbed-microservices", "--seconds", "2", "--out", "/proc/samm-nope/run"])
    assert res.exit_code == 2, res.output
    assert "--out" in res.output and "cannot write there" in res.output
    assert not isinstance(res.exception, OSError)


# ------------------------------------------------------------------------------ the control loop
SVCS = ("a", "b")
LIMITS = AppLimits(services=SVCS, caps=np.array([1.0, 0.5]), qos_ms=100.0)


class _Fixed:
    name = "fixed"

    def __init__(self, cores):
        self.cores = cores

    def reset(self, limits):
        pass

    def act(self, m):
        return np.array(self.cores)


class _Actuator:
    def __init__(self):
        self.calls = []

    def set_limit(self, s, cores):
        self.calls.append((s, cores))
        return ActionResult("succeeded", {"container": s})


def _m(limits=(1.0, 0.5)) -> StepMeasurement:
    ps = np.zeros((len(SVCS), len(SERVICE_FIELDS)))
    ps[:, FIELD["cpu_limit"]] = limits
    return StepMeasurement(SVCS, ps, np.full(len(PERCENTILES), 10.0), 5.0, 0.0, 100.0, t=time.time(),
                           extra={"latency_state": "ok", "running": {s: True for s in SVCS}})


def _loop(tmp_path, name="L"):
    from samm.testbed.microservices.loop import ControlLoop

    store = KnowledgeStore(f"sqlite:///{tmp_path / 'k.db'}")
    act = _Actuator()
    return ControlLoop(LIMITS, _Fixed([0.3, 0.2]), act, store, loop_name=name), store, act


def test_an_unreadable_knowledge_store_means_no_action_recorded(tmp_path, monkeypatch):
    loop, store, act = _loop(tmp_path)

    def locked(*a, **k):
        raise RuntimeError("database is locked")
    monkeypatch.setattr(store, "decision", locked)
    rec = loop.step(0, _m())
    assert rec.action == "no action: knowledge store unreadable" and rec.targets is None
    assert any("database is locked" in e for e in rec.errors)
    assert act.calls == []                           # unknown whether step 0 already acted: it does not


def test_a_replayed_decision_is_held_to_the_bounds(tmp_path):
    loop, store, act = _loop(tmp_path)
    for key, cores in (("step5", {"a": 50.0, "b": -3}), ("step6", {"a": 0.5})):
        store.record_decision(key, agent="x", loop="L", problem="microservice-cores", source="agent",
                              action={"cores": cores}, action_name="resize", now=time.time())
    rec = loop.step(5, _m())
    assert rec.action == "replayed decision" and rec.targets == {"a": 1.0, "b": LIMITS.floor}
    assert set(rec.clipped) == {"a", "b"} and act.calls == [("b", LIMITS.floor)]
    rec = loop.step(6, _m())                        # a record of other services: nothing applied, no crash
    assert rec.action == "no action: recorded decision unreadable" and rec.targets is None
    assert act.calls == [("b", LIMITS.floor)]


def test_a_step_a_whole_second_late_takes_no_action(tmp_path):
    """After an engine call blocked for seconds, the testbed's steps come due at once: each would
    act on the same load second (a burst of decisions); they are recorded with no action."""
    loop, store, act = _loop(tmp_path)
    m = _m()
    m.extra["late_s"] = 3.2
    rec = loop.step(0, m)
    assert rec.action == "no action: step late (the loop fell behind)" and act.calls == []
    assert store.decision("step0", loop="L").source == "none"
    m = _m()
    m.extra["late_s"] = 0.4                          # within its second: a normal step
    assert loop.step(1, m).applied == {"a": 0.3, "b": 0.2}


def test_an_outcome_the_store_did_not_take_is_written_at_the_next_step(tmp_path, monkeypatch):
    loop, store, act = _loop(tmp_path)
    finish = store.finish_action

    def broken(*a, **k):
        raise RuntimeError("disk I/O error")
    monkeypatch.setattr(store, "finish_action", broken)
    rec = loop.step(0, _m())
    assert rec.applied == {"a": 0.3, "b": 0.2} and any("not written" in e for e in rec.errors)
    assert len(store.in_flight_actions(loop="L")) == 2
    loop.step(1, _m((0.3, 0.2)))                     # still broken: kept for later, no crash
    monkeypatch.setattr(store, "finish_action", finish)
    loop.step(2, _m((0.3, 0.2)))
    assert store.in_flight_actions(loop="L") == []
    assert {store.action(f"L:step0:{s}").status for s in SVCS} == {"succeeded"}
    assert len(act.calls) == 2                       # and nothing was sent twice


def test_an_action_the_store_did_not_begin_is_not_finished_again_every_step(tmp_path, monkeypatch):
    """begin_action refused (PostgreSQL: a value too long): the loop acts (the record is not worth
    stopping it) but its outcome went to the retry list, where finishing an action the store never
    had failed every step, for ever, one more entry per service per step."""
    loop, store, act = _loop(tmp_path)

    def refused(*a, **k):
        raise RuntimeError("value too long for type character varying(128)")
    monkeypatch.setattr(store, "begin_action", refused)
    for k in range(3):
        loop.step(k, _m((1.0, 0.5) if k == 0 else (0.3, 0.2)))
    assert act.calls == [("a", 0.3), ("b", 0.2)]
    assert loop._unrecorded == {}
    first = loop._by_step[0]
    assert first.applied == {"a": 0.3, "b": 0.2}
    assert sum("not recorded" in e for e in first.errors) == 2 and not any("not written" in e for e in first.errors)


def test_service_names_the_store_cannot_key_are_refused_before_a_step(tmp_path):
    from samm.testbed.microservices.loop import ControlLoop, store_key_problem

    long_name = "s" * 70
    store = KnowledgeStore(f"sqlite:///{tmp_path / 'k.db'}")
    with pytest.raises(ValueError, match="70 characters.*at most 64"):
        ControlLoop(AppLimits((long_name, "b"), np.array([1.0, 1.0]), 100.0), _Fixed([0.3, 0.2]), _Actuator(), store)
    ControlLoop(AppLimits((long_name, "b"), np.array([1.0, 1.0]), 100.0), _Fixed([0.3, 0.2]), _Actuator(), None)
    assert store_key_problem("L", ("a" * 64,)) is None                 # the longest name that fits
    assert "at most 38" in store_key_problem("x" * 63, ("a" * 39,))   # the key's 128 with a long loop name


# ------------------------------------------------------------------------------ a real run stopped mid-way
@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    yield from real_engine(tmp_path_factory, "msaudit")


class _Interrupting:
    """AutoScale-like fixed limits, then Ctrl-C at its third call."""
    name = "interrupting"

    def __init__(self):
        self.calls = 0

    def reset(self, limits):
        self.caps = limits.caps

    def act(self, m):
        self.calls += 1
        if self.calls == 3:
            raise KeyboardInterrupt
        return self.caps * 0.8


@pytest.mark.docker
def test_a_run_stopped_mid_way_still_writes_its_seconds(engine, locust_installed, tmp_path):  # noqa: F811
    from samm.testbed.microservices.containers import find_base_port

    out = tmp_path / "run"
    o = MicroservicesRunOptions(users=2, seconds=8, out_dir=str(out), docker_host=engine.base_url, warmup_s=1.0,
                                run_name="stopped", plots=False, base_port=find_base_port(7, 18900))
    with pytest.raises(KeyboardInterrupt):
        run_microservices(o, controller=_Interrupting())
    rows = list(csv.DictReader(open(out / "steps.csv")))
    # the seconds before Ctrl-C (at least two acted; a second without a completed request asks nothing)
    assert 2 <= len(rows) < 8 and sum(r["action"].startswith(("resize", "hold")) for r in rows) == 2
    s = json.loads((out / "summary.json").read_text())
    assert s["completed"] is False and s["error"].startswith("KeyboardInterrupt") and s["seconds"] == len(rows)
    client = engine.client()
    try:
        assert client.containers.list(all=True) == []    # and the app was taken down
    finally:
        client.close()


@pytest.mark.docker
def test_an_engine_restart_that_fails_is_recorded_and_the_run_ends_with_its_report(locust_installed, tmp_path,  # noqa: F811
                                                                                   monkeypatch):
    from samm.testbed.microservices import containers
    from samm.testbed.microservices.containers import find_base_port

    if os.geteuid() != 0 or shutil.which("dockerd") is None:   # the private engine needs both
        pytest.skip("no private dockerd here (root and dockerd needed)")

    def broken(self, down_s=0.0):
        raise RuntimeError("dockerd did not come back")
    monkeypatch.setattr(containers.PrivateDockerd, "restart", broken)
    out = tmp_path / "run"
    o = MicroservicesRunOptions(users=1, seconds=3, out_dir=str(out), warmup_s=1.0, faults=("restart-engine@1",),
                                run_name="nobackengine", plots=False, base_port=find_base_port(7, 18950))
    res = run_microservices(o)
    failed = [e for e in res.summary["events"] if e["event"] == "engine restart failed"]
    assert failed and "did not come back" in failed[0]["error"]
    assert json.loads((out / "summary.json").read_text())["events"] == res.summary["events"]


# ------------------------------------------------------------------------------ live Sinan samples
def _samples(path, X, p99, app="testbed", services=None):
    np.savez_compressed(path, X=X, p99_ms=p99, qos_ms=TOPO.qos_ms, app=app,
                        services=np.array(services or TOPO.service_names), seed=0)
    return path


def test_live_samples_of_the_wrong_width_or_not_samples_are_refused_by_name(tmp_path):
    from agents.microservice_cores.sinan import n_features
    from agents.microservice_cores.sinan_live import load_samples

    width = n_features(TOPO.n_services)
    narrow = _samples(tmp_path / "narrow.npz", np.zeros((40, 5), np.float32), np.full(40, 20.0))
    with pytest.raises(ValueError, match=r"X is \(40, 5\), not \(40, %d\)" % width):
        load_samples([narrow], TOPO)                 # was fitted without a word
    nan = _samples(tmp_path / "nan.npz", np.full((40, width), np.nan, np.float32), np.full(40, 20.0))
    with pytest.raises(ValueError, match="NaN"):
        load_samples([nan], TOPO)
    (tmp_path / "garbage.npz").write_text("garbage\n")
    with pytest.raises(ValueError, match="garbage.npz: cannot read the samples"):
        load_samples([tmp_path / "garbage.npz"], TOPO)
    np.savez_compressed(tmp_path / "other.npz", a=np.zeros(3))
    with pytest.raises(ValueError, match="not a sinan-samples.npz"):
        load_samples([tmp_path / "other.npz"], TOPO)
    good = _samples(tmp_path / "good.npz", np.zeros((40, width), np.float32), np.full(40, 20.0))
    assert load_samples([good], TOPO, k=5).X.shape == (36, width)


def test_the_live_sinan_fit_command_names_a_bad_sample_without_a_traceback(tmp_path):
    from click.testing import CliRunner

    from agents.microservice_cores.sinan_live import main

    (tmp_path / "empty").mkdir()
    res = CliRunner().invoke(main, ["--samples", str(tmp_path / "empty"), "--out", str(tmp_path / "m")])
    assert res.exit_code == 1 and "sinan-samples.npz: cannot read the samples" in res.output
    assert isinstance(res.exception, SystemExit)


@pytest.mark.docker
def test_a_removed_service_container_is_created_again_with_its_last_limit(engine, tmp_path):  # noqa: F811
    """`docker rm -f` of a service mid-run: the supervisor used to report NotFound every second
    (the loop: "no action: engine unreachable") and the service stayed down to the end."""
    from samm.testbed.microservices.containers import AppContainers, find_base_port

    app = AppContainers(TOPO, engine.base_url, tmp_path, namespace="msrm", base_port=find_base_port(7, 19000))
    try:
        app.start(seed=0)
        assert app.set_limit("rate", 0.07).status == "succeeded"
        app.client.api.remove_container(app.names["rate"], force=True)
        assert app.ensure_running() == ["rate"] and app.errors == []
        assert app.client.api.inspect_container(app.names["rate"])["State"]["Running"]
        assert abs(app.read_limit("rate") - 0.07) < 1e-9
        app.wait_ready(20.0, services=["rate"])
        assert app.ensure_running() == []            # and once back, nothing more to do
    finally:
        app.close()


class _KillsLocust:
    """Holds the caps; at its first call, SIGKILLs the run's Locust (captured at its start)."""
    name = "kills-locust"

    def __init__(self, generators):
        self.generators = generators

    def reset(self, limits):
        self.caps = limits.caps

    def act(self, m):
        if self.generators and self.generators[0].alive():
            os.kill(self.generators[0].proc.pid, 9)
            self.generators[0].proc.wait(5)
        return self.caps


@pytest.mark.docker
def test_a_load_generator_that_dies_is_recorded_and_the_run_goes_on(engine, locust_installed, tmp_path,  # noqa: F811
                                                                    monkeypatch):
    from samm.testbed.microservices import load as load_mod
    from samm.testbed.microservices.containers import find_base_port

    generators = []
    start = load_mod.LoadGenerator.start

    def capture(self, *a, **k):
        generators.append(self)
        return start(self, *a, **k)
    monkeypatch.setattr(load_mod.LoadGenerator, "start", capture)
    o = MicroservicesRunOptions(users=2, seconds=6, out_dir=str(tmp_path / "run"), docker_host=engine.base_url,
                                warmup_s=1.0, run_name="locustdies", plots=False, base_port=find_base_port(7, 19050))
    res = run_microservices(o, controller=_KillsLocust(generators))
    gone = [e for e in res.summary["events"] if e["event"].startswith("load generator exited (status -9)")]
    assert len(gone) == 1                            # said once, at the step it was seen
    assert res.summary["seconds"] == 6 and res.summary["stale_seconds"] >= 1
    assert all(r.targets is None for r in res.records if r.latency_state == "stale")


def test_a_boolean_scale_target_is_refused_before_the_engine_is_asked():
    from samm.config import GroupConfig
    from samm.execute.base import ScaleRequest
    from samm.execute.docker_exec import DockerExecutor

    g = GroupConfig(name="w", cores=1, ram_gb=0.1, price_per_hour=0.0, min=0, max=3, docker_image="local/busybox:samm")
    ex = DockerExecutor([g], base_url="unix:///nonexistent/docker.sock", timeout_s=1)
    for target in (True, False, 2.0):
        res = ex.apply(ScaleRequest("w", target, "k"))
        assert res.status == "failed" and "outside [0, 3]" in res.error    # True was taken as 1 container


@pytest.mark.docker
def test_a_container_made_with_cpus_gets_and_reports_its_limit(engine, tmp_path):  # noqa: F811
    """`docker run --cpus` / Compose's `cpus` set NanoCpus: the engine refused every quota update
    (409), and the limit was read as the host's CPU count."""
    from samm.execute.docker_exec import DockerExecutor, limit_cores
    from samm.execute.local_dockerd import BUSYBOX_TAG

    client = engine.client()
    c = client.containers.run(BUSYBOX_TAG, ["sleep", "600"], name="audit-nano", detach=True, init=True,
                              nano_cpus=500_000_000)
    try:
        ex = DockerExecutor([], base_url=engine.base_url, timeout_s=5)
        res = ex.set_cpu_limit("audit-nano", 0.3)
        assert res.status == "succeeded", res.error
        host = client.api.inspect_container("audit-nano")["HostConfig"]
        assert host["NanoCpus"] == 300_000_000 and limit_cores(host) == pytest.approx(0.3)

        class App:
            names = {s: "audit-nano" for s in TOPO.service_names}
            state_dir = tmp_path
        App.client = client
        m = Measurer(TOPO, App(), LoadFile(tmp_path / "load.jsonl")).measure()
        assert np.allclose(m.cpu_limit, 0.3)                   # not the host's CPU count
        assert np.allclose(list(m.extra["kernel_limit"].values()), 0.3)        # the cgroup agrees
        ex.close()
    finally:
        c.remove(force=True)
        client.close()
