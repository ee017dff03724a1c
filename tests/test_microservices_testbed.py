"""The real-container microservice testbed (issue 18): the app's call graph on real containers,
the control loop changing real CPU limits within bounds, and the kill / stall / engine-restart
faults. A real dockerd (root) and real Locust; skipped with the reason when either is missing."""
from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from agents.microservice_cores.control import MIN_CORES
from agents.microservice_cores.topology import load_topology
from fixtures_docker import locust_installed, real_engine  # noqa: F401  (fixtures)
from samm.execute import cfs_burst
from samm.execute.local_dockerd import DockerdUnavailable
from samm.testbed.microservices.containers import REPO_ROOT, AppContainers, find_base_port, host_python, reserve_ports
from samm.testbed.microservices.run import MicroservicesRunOptions, cpu_burst_of, parse_faults, run_microservices

TOPO = load_topology("testbed")
CAPS = dict(zip(TOPO.service_names, TOPO.caps))


def test_testbed_topology_fits_the_machine():
    assert TOPO.n_services >= 5
    kinds = {s.kind for s in TOPO.services.values()}
    assert {"cache", "db"} <= kinds
    assert TOPO.caps.sum() <= 1.5 + 1e-9
    # the fluid CPU demand at the top of the users range stays well inside the caps
    top = TOPO.core_demand(TOPO.users[1] * TOPO.rate_per_user)
    assert np.all(top < TOPO.caps)


def test_the_cpu_burst_is_the_runs_else_the_topologys():
    burst_topo = TOPO.model_copy(update={"cfs_burst": 0.5})
    assert cpu_burst_of(MicroservicesRunOptions(), TOPO) is None            # testbed: none
    assert cpu_burst_of(MicroservicesRunOptions(), burst_topo) == 0.5
    assert cpu_burst_of(MicroservicesRunOptions(cpu_burst=1.0), burst_topo) == 1.0
    assert cpu_burst_of(MicroservicesRunOptions(cpu_burst=0.0), burst_topo) == 0.0   # asked: none


def test_fault_specs():
    assert parse_faults(("kill-service", "stall-load@8"), 5) == {5: ["kill-service"], 8: ["stall-load"]}
    with pytest.raises(ValueError, match="unknown fault"):
        parse_faults(("explode",), 1)


def test_host_python_is_bound_read_only():
    hp = host_python()
    assert any(hp.executable.startswith(c.rstrip("/") + "/") for c in hp.binds)
    assert all(h.startswith("/") and c.startswith("/") for c, h in hp.binds.items())


def test_a_held_port_block_is_skipped_by_every_process_until_released():
    """Two testbeds on one host (or two test workers) never pick the same ports, even before
    the first one's services listen."""
    start = find_base_port(3, 19500)
    held = reserve_ports(3, start)
    other_process = [sys.executable, "-c", "from samm.testbed.microservices.containers import find_base_port; "
                     f"print(find_base_port(3, {start}))"]
    try:
        assert held.base == start
        assert find_base_port(3, start) == start + 10
        assert int(subprocess.run(other_process, capture_output=True, text=True, check=True, cwd=REPO_ROOT).stdout) \
            == start + 10
        # an explicit base port that another testbed holds is refused before any container starts
        with pytest.raises(RuntimeError, match="held by another SAMM testbed"):
            AppContainers(TOPO, "unix:///nonexistent.sock", "/tmp", base_port=start + 1)
    finally:
        held.release()
    assert find_base_port(3, start) == start
    # a port some other program listens on makes its block unusable too
    with socket.socket() as s:
        s.bind(("127.0.0.1", start + 2))
        s.listen()
        assert find_base_port(3, start) == start + 10


def test_port_lock_files_that_cannot_be_made_are_a_clear_error(tmp_path, monkeypatch):
    from samm.testbed.microservices import containers

    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setattr(containers, "PORT_LOCK_DIR", blocker / "samm-ports")
    with pytest.raises(RuntimeError, match="cannot hold ports .* through their lock files in .*not-a-dir"):
        reserve_ports(3, 19600)


# ------------------------------------------------------------------------------ real engine
docker = pytest.mark.docker


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    yield from real_engine(tmp_path_factory, "msd")


def _get(port: int, path: str):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@docker
def test_call_graph_answers_on_real_containers(engine, tmp_path):
    app = AppContainers(TOPO, engine.base_url, tmp_path, namespace="mscg", base_port=find_base_port(7, 18300))
    try:
        app.start()
        port = app.ports["frontend"]
        db_seen = 0
        for _ in range(25):
            code, body = _get(port, "/r/search/-")
            assert code == 200, body
            front, search_t, profile_t = body["trace"]
            assert front == "frontend" and search_t[:2] == ["search", ["geo"]] and len(search_t) == 3
            rate_t = search_t[2]  # geo and rate were called in parallel, then profile
            assert rate_t[:2] == ["rate", ["cache"]] and rate_t[2:] in ([], [["db"]])
            assert profile_t[:2] == ["profile", ["cache"]] and profile_t[2:] in ([], [["db"]])
            db_seen += len(rate_t[2:]) + len(profile_t[2:])
            code, body = _get(port, "/r/profile/-")
            assert code == 200, body
            assert body["trace"][0] == "frontend" and body["trace"][1][:2] == ["profile", ["cache"]]
        assert db_seen > 0  # cache misses (p = 0.2 per chance) reached the database
        # a node that is not this service's is refused
        assert _get(app.ports["geo"], "/r/search/-")[0] == 404
        # containers: host network, the host's Python and the repo read-only, DockerExecutor's labels
        inv = app.executor.inventory()
        assert {s: [i.instance_id for i in inv[s].instances] for s in TOPO.service_names} == \
            {s: [f"mscg-{s}-1"] for s in TOPO.service_names}
        attrs = app.client.containers.get("mscg-db-1").attrs
        assert attrs["HostConfig"]["NetworkMode"] == "host"
        mounts = {m["Destination"]: m["RW"] for m in attrs["Mounts"]}
        assert mounts[str(REPO_ROOT)] is False and mounts["/state"] is True
        assert all(mounts[c] is False for c in app.python.binds)
        assert attrs["HostConfig"]["CpuQuota"] == round(CAPS["db"] * 100_000)
        # the file is rewritten once a second, so its first version may predate the requests above
        state, counters, deadline = app.state_dir / "frontend.json", {}, time.monotonic() + 10
        while time.monotonic() < deadline:
            if state.exists():
                counters = json.loads(state.read_text())
                if counters["rx_messages"] > 0:
                    break
            time.sleep(0.2)
        assert counters["rx_messages"] > 0 and counters["tx_bytes"] > 0
    finally:
        app.close()


@docker
def test_cgroup_reader_counts_throttled_periods_of_a_busy_container_under_a_small_limit(engine):
    """The throttling counters the testbed keeps beside each second (not a policy feature): a
    container spinning under 0.05 core runs out of quota in most periods; one sleeping under a
    whole core never does."""
    from samm.testbed.microservices.measure import CgroupReader
    client, reader = engine.client(), CgroupReader()
    made = []
    try:
        for name, cmd, quota in (("thr-busy", ["sh", "-c", "while :; do :; done"], 5_000),
                                 ("thr-idle", ["sleep", "60"], 100_000)):
            made.append(client.containers.run("local/busybox:samm", cmd, detach=True, name=name,
                                              cpu_period=100_000, cpu_quota=quota))
        paths = {}
        for c in made:
            c.reload()
            paths[c.name] = reader.paths(c.attrs["State"]["Pid"])
        before = {n: reader.read(p) for n, p in paths.items()}
        time.sleep(2.0)
        after = {n: reader.read(p) for n, p in paths.items()}
        d = {n: {k: after[n][k] - before[n][k] for k in ("nr_periods", "nr_throttled", "throttled_s", "cpu_s")}
             for n in paths}
        busy, idle = d["thr-busy"], d["thr-idle"]
        assert busy["nr_periods"] >= 15 and busy["nr_throttled"] >= 0.8 * busy["nr_periods"], busy
        assert busy["throttled_s"] > 1.0, busy  # waiting ~95 ms of every 100 ms period
        assert busy["cpu_s"] == pytest.approx(0.1, abs=0.04), busy  # 0.05 core for 2 s
        assert idle["nr_throttled"] == 0 and idle["throttled_s"] == 0, idle
    finally:
        for c in made:
            c.remove(force=True)
        client.close()


@pytest.fixture(scope="module")
def fault_run(engine, locust_installed, tmp_path_factory):
    """AutoScale at light load for 14 s: the kill fault at second 3, Locust frozen at 7 for 3 s."""
    out = tmp_path_factory.mktemp("ms-faults")
    o = MicroservicesRunOptions(agent="autoscale", users=4, seconds=14, out_dir=str(out), docker_host=engine.base_url,
                                faults=("kill-service@3", "stall-load@7"), stall_seconds=3, warmup_s=1.0,
                                run_name="faults", plots=False, base_port=find_base_port(7, 18400))
    return run_microservices(o)


@docker
def test_loop_changes_real_limits_within_bounds(fault_run):
    recs = fault_run.records
    assert len(recs) == 14
    for r in recs:
        for s, c in r.limits.items():  # read back from the engine at every step
            assert MIN_CORES - 1e-9 <= c <= CAPS[s] + 1e-9, (r.step, s, c)
        for s, c in r.kernel_limits.items():  # and the kernel agrees with the engine
            assert c == pytest.approx(r.limits[s], abs=1e-3), (r.step, s)
    # at 4 users AutoScale shrinks over-provisioned limits: real changes were made
    assert fault_run.summary["actions"]["limit_changes"] > 0
    assert recs[-1].total_cores < TOPO.caps.sum() - 0.05
    # what the loop applied at step k is what the engine holds at step k+1
    for a, b in zip(recs, recs[1:]):
        for s, c in a.applied.items():
            if s not in b.restarted:
                assert b.limits[s] == pytest.approx(c, abs=0.006), (a.step, s)
    assert (fault_run.out_dir / "steps.csv").read_text().count("\n") == 15
    # the throttling counters came along with every measured second of a running service
    header = (fault_run.out_dir / "steps.csv").read_text().splitlines()[0].split(",")
    assert {f"throttled_{s}" for s in TOPO.service_names} <= set(header)
    shares = [v for r in recs[1:] for v in r.throttled.values()]
    assert len(shares) >= 5 * len(TOPO.service_names) and all(0.0 <= v <= 1.0 for v in shares)
    split = fault_run.summary["throttled_when_violating"]
    assert split["other_max_service"] is not None and 0.0 <= split["other_max_service"] <= 1.0


@docker
def test_stall_fault_leads_to_no_action_and_a_record(fault_run):
    from samm.knowledge.store import KnowledgeStore

    stale = [r for r in fault_run.records if r.latency_state == "stale"]
    assert stale, [r.latency_state for r in fault_run.records]
    for r in stale:
        assert r.action == "no action: stale latency" and not r.applied and math.isnan(r.p99_ms)
    store = KnowledgeStore(fault_run.knowledge_url)
    try:
        by_key = {d.iteration_key: d for d in store.decisions(loop=fault_run.loop)}
    finally:
        store.close()
    assert len(by_key) == 14
    for r in stale:
        d = by_key[f"step{r.step}"]
        assert (d.source, d.action, d.reason) == ("none", None, "no action: stale latency")
    acted = [r for r in fault_run.records if r.targets]
    assert acted and all(by_key[f"step{r.step}"].source == "agent" for r in acted)
    assert fault_run.summary["stale_seconds"] == len(stale)


@docker
def test_kill_fault_restarts_the_container(fault_run):
    recs = fault_run.records
    restarted = [r for r in recs if "rate" in r.restarted]
    assert restarted and restarted[0].step in (3, 4)  # the same step, or the next if the exit was slow
    r = restarted[0]
    # the loop's last limit for the service went back on, within bounds
    assert "rate" in r.reapplied and MIN_CORES <= r.reapplied["rate"] <= CAPS["rate"]
    later = [x for x in recs if x.step > r.step]
    assert all(x.limits["rate"] <= CAPS["rate"] + 1e-9 for x in later)
    # the app serves again after the restart (requests complete once the load is back)
    assert any(x.latency_state == "ok" and x.failures_per_s == 0 for x in later)


class Wild:
    """A controller that asks for the impossible: far above the caps, negative, NaN."""

    name = "wild"

    def __init__(self):
        self.k = 0

    def reset(self, limits):
        self.limits = limits

    def act(self, m):
        self.k += 1
        n = len(m.services)
        return [np.full(n, 10.0), np.full(n, -1.0), np.full(n, np.nan), np.full(n, 0.07)][self.k % 4]


def _host_has_cfs_burst() -> bool:
    try:
        cfs_burst.cpu_cgroup_dir(os.getpid())
        return True
    except OSError:
        return False


@docker
def test_guard_keeps_a_wild_controller_within_bounds(engine, locust_installed, tmp_path):
    """Limits swing between the caps and the floor; where the kernel has a CFS burst the run gives
    one of the whole quota with each, so every fall below the burst held must lower it first (the
    kernel refuses the quota otherwise, which would show as a failed limit change)."""
    burst = 1.0 if _host_has_cfs_burst() else None
    o = MicroservicesRunOptions(users=2, seconds=7, out_dir=str(tmp_path), docker_host=engine.base_url, warmup_s=1.0,
                                run_name="wild", plots=False, base_port=find_base_port(7, 18500), cpu_burst=burst)
    res = run_microservices(o, controller=Wild())
    assert res.summary["cpu_burst"] == burst
    assert not [e for r in res.records for e in r.errors], [r.errors for r in res.records]
    seen = set()
    for r in res.records:
        for s, c in r.limits.items():
            assert MIN_CORES - 1e-9 <= c <= CAPS[s] + 1e-9
            seen.add(round(c / CAPS[s], 3) if c > MIN_CORES + 1e-6 else "floor")
        if r.targets:
            assert set(r.clipped) <= set(TOPO.service_names)
    assert "floor" in seen and 1.0 in seen  # both bounds were reached on the real containers
    assert res.summary["actions"]["clipped_steps"] > 0


@pytest.mark.slow
@docker
def test_engine_restart_fault_recovers(locust_installed, tmp_path):
    try:
        o = MicroservicesRunOptions(users=4, seconds=16, out_dir=str(tmp_path), faults=("restart-engine@4",),
                                    warmup_s=1.0, run_name="engine", plots=False, base_port=find_base_port(7, 18600))
        res = run_microservices(o)
    except DockerdUnavailable as exc:
        pytest.skip(f"no real Docker engine here: {exc}")
    recs = res.records
    down = [r for r in recs if r.step >= 4 and (r.errors or r.action.startswith("no action"))]
    assert down, "the engine restart left no trace"
    for r in down:
        assert not r.applied  # nothing applied while the engine or the app was down
    assert any(len(r.restarted) == len(TOPO.service_names) for r in recs)
    assert recs[-1].latency_state == "ok" and all(c <= CAPS[s] + 1e-9 for s, c in recs[-1].limits.items())


@pytest.mark.slow
@docker
def test_cli_writes_steps_summary_and_plots(engine, locust_installed, tmp_path):
    from click.testing import CliRunner

    from samm.cli.main import cli

    out = tmp_path / "run"
    res = CliRunner().invoke(cli, ["testbed-microservices", "--agent", "autoscale",
                                   "--users", "3", "--seconds", "6", "--out", str(out), "--warmup", "1",
                                   "--docker-host", engine.base_url])
    assert res.exit_code == 0, res.output
    assert "cores: mean" in res.output
    s = json.loads((out / "summary.json").read_text())
    assert s["agent"] == "autoscale" and s["seconds"] == 6
    assert s["total_cores"]["max"] <= TOPO.caps.sum() + 1e-9
    for f in ("steps.csv", "cores.png", "p99.png", "load.jsonl", "knowledge.db"):
        assert (out / f).stat().st_size > 0
