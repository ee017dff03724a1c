"""The real-container microservice testbed, third audit pass (regressions): a load line whose
`second` is not its `t_end` - 1 stood for the newest second for good; a '?' or '%' in --out put
the run's knowledge store outside it; a ':' in --out stopped every container from being made; a
restarted young container's CPU was taken as the difference from the old container's counter."""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from agents.microservice_cores.observation import FIELD, PERCENTILES
from agents.microservice_cores.topology import load_topology
from fixtures_docker import real_engine
from samm.knowledge.store import KnowledgeStore
from samm.testbed.microservices.containers import AppContainers, find_base_port
from samm.testbed.microservices.load import LoadGenerator
from samm.testbed.microservices.measure import CgroupReader, Measurer
from samm.testbed.microservices.run import MicroservicesRunOptions, run_microservices

TOPO = load_topology("testbed")


def _line(second: int, **over) -> str:
    rec = {"second": second, "t_end": second + 1, "requests_per_s": 5.0, "failures_per_s": 0.0,
           "latency_ms": [10.0] * len(PERCENTILES)} | over
    return json.dumps(rec)


def _reader(tmp_path) -> LoadGenerator:
    return LoadGenerator(tmp_path / "topology.json", 18100, 1, tmp_path)   # its reading half only


@pytest.mark.parametrize("bad", ["FAR_SECOND", "NEGATIVE_LATENCY"])
def test_a_load_line_out_of_its_format_never_stands_for_the_newest_second(tmp_path, bad):
    """A line whose `second` was far ahead of its (recent) `t_end` passed the checks and stayed
    the newest second past every real line: the load looked stale for the rest of the run. A
    negative latency passed as a p99 the controller acted on."""
    now = int(time.time())
    bad = {"FAR_SECOND": _line(now + 10**6, t_end=now - 1),
           "NEGATIVE_LATENCY": _line(now + 5, latency_ms=[-1.0] * len(PERCENTILES))}[bad]
    gen = _reader(tmp_path)
    gen.path.write_text(_line(now - 2) + "\n" + bad + "\n" + _line(now - 1) + "\n")
    assert gen.latest()["second"] == now - 1
    assert gen.rejected == 1 and gen.last_rejected


@pytest.mark.parametrize("name", ["run?1", "c%41d", "lauf ü 2"])
def test_the_knowledge_store_stays_in_an_out_dir_with_url_characters(tmp_path, name):
    """`sqlite:///<out>/knowledge.db` read a '?' as the start of the URL's query (the store was
    the file <parent>/run) and '%41' as 'A' (another run's directory, with its decisions)."""
    out = tmp_path / name
    o = MicroservicesRunOptions(seconds=2, out_dir=str(out), docker_host="unix:///nonexistent-samm.sock",
                                plots=False)
    with pytest.raises(Exception):   # no engine there: the run stops before any container
        run_microservices(o)
    assert (out / "knowledge.db").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


def test_a_port_block_past_65535_is_refused_by_name_before_the_engine_starts(tmp_path):
    """`--base-port 65530` passed the option check (a port number) but the 7 services needed
    ports up to 65536: `bind` raised OverflowError once the engine and the store were up."""
    with pytest.raises(ValueError, match=r"base_port: ports 65530\.\.65536 for 7 services are not all in 1\.\.65535"):
        run_microservices(MicroservicesRunOptions(seconds=2, out_dir=str(tmp_path / "out"), base_port=65530,
                                                  docker_host="unix:///nonexistent-samm.sock"))
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match="not all in 1..65535"):
        AppContainers(TOPO, "unix:///nonexistent-samm.sock", tmp_path, base_port=65530)


def test_a_run_name_whose_loop_has_decisions_is_refused_before_anything_starts(tmp_path):
    """A second run with the same --run-name and --out found run one's `step<k>` decisions in
    knowledge.db and replayed each of them ("replayed decision") instead of asking its controller."""
    out = tmp_path / "out"
    out.mkdir()
    store = KnowledgeStore(f"sqlite:///{out / 'knowledge.db'}")
    store.record_decision("step0", agent="autoscale", loop="microservices-again", problem="microservice-cores",
                          source="agent", action={"cores": dict(zip(TOPO.service_names, TOPO.caps.tolist()))})
    store.close()
    o = MicroservicesRunOptions(seconds=2, out_dir=str(out), run_name="again",
                                docker_host="unix:///nonexistent-samm.sock")
    with pytest.raises(ValueError, match="loop microservices-again already has decisions in sqlite:///.*knowledge.db"):
        run_microservices(o)
    assert sorted(p.name for p in out.iterdir()) == ["knowledge.db"]   # nothing else started or written


# ------------------------------------------------------------------------------ real engine
@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    yield from real_engine(tmp_path_factory, "ms3")


class _NoLoad:
    def latest(self):
        return None


class _Recording(CgroupReader):
    """The real reader, keeping what it read last per cgroup (to compare the measurement with)."""

    def __init__(self):
        super().__init__()
        self.last: dict = {}

    def read(self, paths):
        out = super().read(paths)
        self.last[tuple(sorted(map(str, paths.values())))] = out
        return out


def _cpu_s(reader: CgroupReader, app: AppContainers, s: str) -> float:
    pid = app.client.api.inspect_container(app.names[s])["State"]["Pid"]
    return reader.read(reader.paths(pid))["cpu_s"]


@pytest.mark.docker
def test_a_run_dir_with_a_colon_space_and_unicode_starts(engine, tmp_path):
    """A ':' in the run directory (a time in --out) split the "host:container:mode" binds: no
    container could be made ("invalid volume specification")."""
    app = AppContainers(TOPO, engine.base_url, tmp_path / "run 14:30 ü", namespace="ms3b",
                        base_port=find_base_port(7, 18720))
    try:
        app.start()   # every service answers /health
        deadline = time.monotonic() + 10   # each service writes its counters into the run's state/
        while not all((app.state_dir / f"{s}.json").is_file() for s in app.services):
            assert time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        app.close()


@pytest.mark.docker
def test_a_restarted_container_counts_its_cpu_from_zero(engine, tmp_path):
    """A container started again whose new counter had passed the old one's (a young service)
    got the difference of the two as its CPU, not the new counter."""
    app = AppContainers(TOPO, engine.base_url, tmp_path, namespace="ms3a", base_port=find_base_port(7, 18700))
    try:
        app.start()
        s = "rate"
        cg = _Recording()
        m = Measurer(TOPO, app, _NoLoad(), cgroups=cg)
        t0 = time.time()
        m.measure(now=t0)
        old = cg.last[tuple(sorted(map(str, m._paths[s][1].values())))]["cpu_s"]
        app.kill(s)
        deadline = time.monotonic() + 20
        while app.client.api.inspect_container(app.names[s])["State"]["Running"]:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert app.ensure_running() == [s] and not app.errors
        app.wait_ready(services=[s])
        while _cpu_s(cg, app, s) < old + 0.05:   # the new container passes the old one's counter
            assert time.monotonic() < deadline + 40
            ex = app.client.api.exec_create(app.names[s], ["sh", "-c", "i=0; while [ $i -lt 50000 ]; do i=$((i+1)); done"])
            app.client.api.exec_start(ex["Id"])
        row = m.measure(now=t0 + 1.0).per_service[TOPO.service_names.index(s)]
        new = cg.last[tuple(sorted(map(str, m._paths[s][1].values())))]["cpu_s"]
        assert new > old and row[FIELD["cpu_used"]] == pytest.approx(new, abs=1e-6)
    finally:
        app.close()


@pytest.mark.docker
def test_a_second_app_in_a_live_apps_namespace_is_refused_and_leftovers_still_go(engine, tmp_path):
    """Two testbeds with one run name on one engine (`--run-name` with `--docker-host`): the
    second's start force-removed the first's running containers as "leftovers" in mid-run. The
    containers of an owner that is gone (its ports no longer held) are still removed."""
    first = AppContainers(TOPO, engine.base_url, tmp_path / "a", namespace="ms3c", base_port=find_base_port(7, 18740))
    second = None
    try:
        first.start()
        second = AppContainers(TOPO, engine.base_url, tmp_path / "b", namespace="ms3c",
                               base_port=find_base_port(7, 18760))
        with pytest.raises(RuntimeError, match=f"'ms3c' is in use by a live testbed on ports {first.base_port}"):
            second.start()
        assert all(first.client.api.inspect_container(n)["State"]["Running"] for n in first.names.values())
        first.ports_held.release()          # its process gone: what it left behind is leftovers
        second.start()
        ids = {first.client.api.inspect_container(n)["Config"]["Labels"]["samm.base_port"]
               for n in second.names.values()}
        assert ids == {str(second.base_port)}
    finally:
        if second is not None:
            second.close()
        first.close()


def _node_path(node: dict, service: str, path: str = "-") -> str | None:
    """The node path (app.py's `<stage>.<i>` chain) of the first call of `service` in a call tree."""
    if node.get("call") == service:
        return path
    base = "" if path == "-" else path + "."
    for s, stage in enumerate(node.get("stages") or []):
        for i, child in enumerate(stage):
            found = _node_path(child, service, f"{base}{s}.{i}")
            if found:
                return found
    return None


@pytest.mark.docker
def test_a_service_whose_own_work_raises_answers_500_and_counts_it(engine, tmp_path):
    """The db's "database is locked" (a write lock held past the timeout) escaped the handler:
    the connection was dropped without an answer, the caller took it for a stale keep-alive and
    sent the whole call again, and the db's `failed` counter never saw it."""
    app = AppContainers(TOPO, engine.base_url, tmp_path, namespace="ms3d", base_port=find_base_port(7, 18780))
    try:
        app.start()
        topo = json.loads((app.conf_dir / "topology.json").read_text())
        rtype, path = next((r, p) for r, req in topo["requests"].items() if (p := _node_path(req, "db")))
        holder = ("import os, sqlite3, time; c = sqlite3.connect(os.path.join('/tmp' if os.path.isdir('/tmp') "
                  "else '.', 'db.sqlite')); c.execute('PRAGMA locking_mode=EXCLUSIVE'); "
                  "c.execute('UPDATE item SET body = body WHERE id = 1'); c.commit(); print('held', flush=True); "
                  "time.sleep(30)")
        ex = app.client.api.exec_create(app.names["db"], [app.python.executable, "-I", "-c", holder])
        out = app.client.api.exec_start(ex["Id"], stream=True)
        assert b"held" in next(out)
        with pytest.raises(urllib.error.HTTPError) as err:   # before: RemoteDisconnected, no answer
            urllib.request.urlopen(f"http://127.0.0.1:{app.ports['db']}/r/{rtype}/{path}", timeout=15)
        assert err.value.code == 500 and "database is locked" in err.value.read().decode()
        time.sleep(1.5)   # the counters file is written each second
        assert json.loads((app.state_dir / "db.json").read_text())["failed"] >= 1
    finally:
        app.close()
