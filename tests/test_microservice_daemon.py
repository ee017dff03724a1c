"""The microservice-cores loop in the SAMM daemon (issue 18, "Real containers"): a `loops:` entry
with `problem: microservice-cores` is validated by the problem's own model and built through its
ProblemSpec; `samm run` then sets the real containers' CPU limits of the testbed application
(read back from the engine) within [floor, cap], one decision per step in the knowledge store;
a dry run records and changes nothing; a container that is gone stops the step (no action, the
reason recorded) and one created again gets the loop's limit back; a bad config is refused naming
the field.

The application, the engine and the load are the real-container testbed's (a private dockerd,
the services as containers, Locust); skipped with the reason without root, dockerd or Locust."""
from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from agents.microservice_cores.control import MIN_CORES
from agents.microservice_cores.daemon_loop import LoadFile, MicroserviceLoopConfig
from agents.microservice_cores.topology import load_topology
from samm.config import ConfigError, SammConfig, load_config
from samm.daemon.build import ConfigurationProblem, build_daemon
from samm.execute import cfs_burst
from samm.knowledge.store import KnowledgeStore
from samm.localproc import free_port
from samm.testbed.microservices.containers import AppContainers, find_base_port
from samm.testbed.microservices.load import LoadGenerator
# the testbed's fixtures: a private real dockerd with the busybox image; Locust installed
from fixtures_docker import locust_installed  # noqa: F401
from test_microservices_testbed import engine  # noqa: F401  (the same module-scoped engine)

TOPO = load_topology("testbed")
CAPS = dict(zip(TOPO.service_names, TOPO.caps))
REPO = Path(__file__).resolve().parents[1]


def entry(**over) -> dict:
    e = {"name": "hotel", "problem": "microservice-cores", "app": "testbed",
         "containers": {"name_prefix": "msd-"}, "load": {"path": "/nonexistent/load.jsonl"},
         "agent": {"name": "autoscale"}}
    e.update(over)
    return e


def config_dict(tmp_path, **over) -> dict:
    return {"loops": [entry(**over)], "knowledge": {"url": f"sqlite:///{tmp_path}/k.db"},
            "graphite": {"publish": False, "render_url": f"http://127.0.0.1:{free_port()}", "timeout_s": 0.5}}


# ------------------------------------------------------------------------------ no engine needed
def test_loop_entries_are_validated_by_the_problems_model(tmp_path):
    (lp,) = SammConfig.model_validate(config_dict(tmp_path)).control_loops()
    assert isinstance(lp, MicroserviceLoopConfig)
    assert lp.timing.interval_s == 1.0 and lp.executor.kind == "docker" and not lp.executor.dry_run
    for bad, named in (({"bogus": 1}, "bogus"),
                       ({"containers": {"base_url": "unix:///x.sock"}}, "containers needs name_prefix or labels"),
                       ({"agent": {"name": "sac"}}, "unknown controller 'sac'"),
                       ({"app": "hotell"}, "unknown application 'hotell'"),
                       ({"executor": {"kind": "aws-asg"}}, "executor.kind"),
                       ({"timing": {"interval_s": 0}}, "timing.interval_s"),
                       ({"executor": {"kind": "docker", "cpu_burst": 1.5}}, "cpu_burst"),
                       ({"load": {"path": "x", "every": 1}}, "every")):
        with pytest.raises(ValueError, match=named):
            SammConfig.model_validate(config_dict(tmp_path, **bad))


def test_a_topology_whose_service_names_the_store_cannot_key_is_refused_at_config_check(tmp_path):
    """PostgreSQL keeps 128 characters of an action key `<loop>:step<k>:<service>` (SQLite any):
    the loop ran and left that service's limit changes unrecorded; refused when the file is read."""
    topo = tmp_path / "longnames.yaml"
    name = "logic-" + "x" * 70
    topo.write_text((REPO / "agents/microservice_cores/topologies/chain3.yaml").read_text()
                    .replace("name: chain3", "name: longnames").replace("logic", name))
    with pytest.raises(ValueError, match=f"service name '{name[:40]}'... is {len(name)} characters"):
        SammConfig.model_validate(config_dict(tmp_path, app=str(topo)))


def test_a_bad_config_file_is_refused_naming_the_field(tmp_path):
    data = config_dict(tmp_path)
    data["loops"][0]["containers"] = {"name_prefx": "msd-"}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ConfigError, match="name_prefx"):
        load_config(path)
    r = subprocess.run([sys.executable, "-m", "samm.cli.main", "run", "--config", str(path)], capture_output=True,
                       text=True, timeout=60, cwd=REPO)
    assert r.returncode == 2 and "name_prefx" in r.stderr, r.stderr


def test_an_agent_that_cannot_be_made_stops_the_build_with_the_reason(tmp_path):
    cfg = SammConfig.model_validate(config_dict(tmp_path, agent={"name": "static"}))
    with pytest.raises(ConfigurationProblem, match="loop 'hotel': agent 'static'.*cores"):
        build_daemon(cfg)


def test_a_bad_scale_down_window_stops_the_build_with_the_reason(tmp_path):
    cfg = SammConfig.model_validate(config_dict(tmp_path, agent={"name": "autoscale", "params": {"scale_down_window": 0}}))
    with pytest.raises(ConfigurationProblem, match="loop 'hotel': agent 'autoscale'.*scale_down_window"):
        build_daemon(cfg)


def test_the_shipped_example_config_loads():
    cfg = load_config(REPO / "deploy" / "configs" / "microservices.yaml")
    (lp,) = cfg.control_loops()
    assert lp.problem == "microservice-cores" and lp.app == "testbed" and lp.timing.interval_s == 1.0
    assert lp.containers.name_prefix and lp.load.path.endswith("load.jsonl")


def test_load_file_follows_the_newest_second_and_a_replaced_file(tmp_path):
    path = tmp_path / "load.jsonl"
    lf = LoadFile(path, keep=3)
    assert lf.latest() is None                                   # no file yet
    line = lambda s: json.dumps({"second": s, "t_end": s + 1, "requests_per_s": 1.0, "failures_per_s": 0.0,  # noqa: E731
                                 "latency_ms": [10.0] * 12}) + "\n"
    path.write_text("".join(line(s) for s in range(100, 110)) + '{"second": 110')   # the last line unfinished
    assert lf.latest()["second"] == 109
    assert len(lf._reader.records) == 3                          # only the newest seconds stay in memory
    path.write_text(line(5))                                     # a new load run replaced the file
    assert lf.latest()["second"] == 5


# ------------------------------------------------------------------------------ real engine
docker = pytest.mark.docker
USERS = 4


@pytest.fixture(scope="module")
def app(engine, locust_installed, tmp_path_factory):  # noqa: F811
    """The testbed application on the private engine, named msd-<service>-1, with 4 Locust users."""
    out = tmp_path_factory.mktemp("msdaemon")
    containers = AppContainers(TOPO, engine.base_url, out, namespace="msd", base_port=find_base_port(7, 18700))
    load = None
    try:
        containers.start(seed=0)
        load = LoadGenerator(containers.conf_dir / "topology.json", containers.base_port, USERS, out,
                             run_time_s=600, seed=0)
        load.start()
        yield containers, load
    finally:
        if load is not None:
            load.stop()
        containers.close()


def app_config(tmp_path, engine, containers, load, **over) -> dict:  # noqa: F811
    return config_dict(tmp_path, containers={"base_url": engine.base_url, "name_prefix": "msd-",
                                             "counters_dir": str(containers.state_dir)},
                       load={"path": str(load.path)}, **over)


def at_caps(containers) -> None:
    for s in TOPO.service_names:
        assert containers.set_limit(s, CAPS[s]).status == "succeeded"


def engine_limits(containers) -> dict:
    return {s: containers.read_limit(s) for s in TOPO.service_names}


@docker
def test_samm_run_sets_real_limits_within_bounds(app, engine, tmp_path):  # noqa: F811
    containers, load = app
    at_caps(containers)
    path = tmp_path / "microservices.yaml"
    path.write_text(yaml.safe_dump(app_config(tmp_path, engine, containers, load), sort_keys=False))
    r = subprocess.run([sys.executable, "-m", "samm.cli.main", "run", "--config", str(path), "--iterations", "5",
                        "--json", "--log-level", "WARNING"], capture_output=True, text=True, timeout=90, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    reps = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    assert len(reps) == 5 and all(r["loop"] == "hotel" for r in reps)
    assert len({r["key"] for r in reps}) == 5                     # one step per second
    assert all(r["status"] == "ok" for r in reps), [(r["status"], r["reasons"]) for r in reps]
    # the real limits, read back from the engine: within [floor, cap], and AutoScale shrank the
    # over-provisioned services at 4 users (use / limit <= 0.1: -10 % a step)
    now = engine_limits(containers)
    for s, c in now.items():
        assert MIN_CORES - 1e-9 <= c <= CAPS[s] + 1e-9, (s, c)
    assert sum(now.values()) < TOPO.caps.sum() - 0.05, now
    changed = [a for r in reps for a in r["actions"] if a["status"] == "succeeded"]
    assert changed and all(MIN_CORES <= a["target"] <= CAPS[a["group"]] + 1e-9 for a in changed)
    for a in reps[-1]["actions"]:                                 # the last step's changes are in force
        if a["status"] == "succeeded":
            assert now[a["group"]] == pytest.approx(a["target"], abs=0.006)
    # one decision per iteration key, by the problem's loop, with its actions
    store = KnowledgeStore(f"sqlite:///{tmp_path}/k.db")
    try:
        decisions = store.decisions(loop="hotel")
        actions = [a for d in decisions for a in store.actions(d.id)]
    finally:
        store.close()
    assert [d.iteration_key for d in decisions] == [r["key"] for r in reps]
    assert all(d.problem == "microservice-cores" and d.source == "agent" and d.agent == "autoscale"
               for d in decisions)
    for d in decisions:
        assert set(d.action["cores"]) == set(TOPO.service_names)
        assert all(MIN_CORES - 1e-9 <= c <= CAPS[s] + 1e-9 for s, c in d.action["cores"].items())
    assert len(actions) == len(changed) and all(a.status == "succeeded" for a in actions)


def direct(tmp_path, engine, containers, load, **over):  # noqa: F811
    """The daemon as `samm run` builds it, iterated by hand once a second."""
    d = build_daemon(SammConfig.model_validate(app_config(tmp_path, engine, containers, load, **over)))
    loop = d.loops[0]
    loop.recover()
    return d, loop


def next_second(after: float = 0.3) -> None:
    time.sleep(math.floor(time.time()) + 1 + after - time.time())


@docker
def test_dry_run_records_decisions_and_changes_no_limit(app, engine, tmp_path):  # noqa: F811
    containers, load = app
    at_caps(containers)
    d, loop = direct(tmp_path, engine, containers, load, executor={"kind": "docker", "dry_run": True})
    try:
        reps = []
        for _ in range(3):
            next_second()
            reps.append(loop.run_once())
        assert engine_limits(containers) == pytest.approx(CAPS, abs=1e-9)     # nothing changed
        assert all(r.status == "ok" and r.decided for r in reps), [(r.status, r.reasons) for r in reps]
        would = [a for r in reps for a in r.actions]
        assert would and all(a["status"] == "dry_run" for a in would)
        decisions = d.store.decisions(loop="hotel")
        assert [x.iteration_key for x in decisions] == [r.key for r in reps]
        assert all(x.source == "agent" and "dry run" in x.reason for x in decisions)
        recorded = [a for x in decisions for a in d.store.actions(x.id)]
        assert len(recorded) == len(would) and {a.status for a in recorded} == {"dry_run"}
        again = loop.run_once()                               # at once: almost always the same second
        if again.key == reps[-1].key:                         # a step already decided is not decided again
            assert not again.decided and not again.actions
    finally:
        d.close()


@docker
def test_a_restarted_container_gets_the_loops_limit_back(app, engine, tmp_path):  # noqa: F811
    containers, load = app
    at_caps(containers)
    d, loop = direct(tmp_path, engine, containers, load)
    try:
        want: dict = {}
        for _ in range(4):                                    # until AutoScale shrank a service (at 4 users: at once)
            next_second()
            want |= {a["group"]: a["target"] for a in loop.run_once().actions if a["status"] == "succeeded"}
            if want:
                break
        victim = sorted(want)[0]
        assert want[victim] < CAPS[victim]
        # another party removes the container: that step takes no action, and says why
        containers.client.api.remove_container(containers.names[victim], force=True)
        next_second()
        gone = loop.run_once()
        assert gone.status == "no-action" and not gone.actions
        assert any(f"{victim}: no container found" in x for x in gone.reasons), gone.reasons
        assert d.store.decision(gone.key, loop="hotel").reason == "no action: engine unreachable"
        # and creates it again at its cap: a new container
        containers._run(victim, CAPS[victim])
        containers.wait_ready(10, [victim])
        assert containers.read_limit(victim) == pytest.approx(CAPS[victim])
        next_second()
        rep = loop.run_once()
        back = [a for a in rep.actions if a["group"] == victim and a["key"].endswith(":reapply")]
        assert back and back[0]["status"] == "succeeded" and back[0]["target"] == pytest.approx(want[victim])
        # then the controller decides as usual, within bounds. The requests in flight while the
        # container was gone may fail into the measured second (under load they did: 6 of 6), and
        # the guard rightly refuses to act on such a second, so allow a few seconds for it
        for _ in range(5):
            if d.store.decision(rep.key, loop="hotel").source == "agent":
                break
            next_second()
            rep = loop.run_once()
        assert d.store.decision(rep.key, loop="hotel").source == "agent", (rep.status, rep.reasons)
        assert MIN_CORES - 1e-9 <= containers.read_limit(victim) <= CAPS[victim] + 1e-9
        assert f"cores.{victim}" in rep.features
    finally:
        d.close()


@docker
def test_a_cpu_burst_in_the_config_goes_on_with_every_limit(app, engine, tmp_path):  # noqa: F811
    """`executor: {cpu_burst: 1.0}`: each limit the loop changes comes with a CFS burst of its whole
    quota, read back from the container's cgroup; the limits stay within bounds."""
    containers, load = app
    at_caps(containers)
    d, loop = direct(tmp_path, engine, containers, load, executor={"kind": "docker", "cpu_burst": 1.0})
    try:
        changed: dict = {}
        for _ in range(4):                                    # AutoScale shrinks at 4 users at once
            next_second()
            rep = loop.run_once()
            assert not any("cpu burst" in x for x in rep.reasons), rep.reasons
            changed |= {a["group"]: a["target"] for a in rep.actions if a["status"] == "succeeded"}
            if changed:
                break
        assert changed
        for s, cores in changed.items():
            try:
                held = containers.read_burst(s)
            except OSError as exc:
                pytest.skip(f"this kernel or engine has no CFS burst: {exc}")
            assert held == int(round(cores * 100_000)), (s, cores, held)
            assert MIN_CORES - 1e-9 <= containers.read_limit(s) <= CAPS[s] + 1e-9
    finally:
        d.close()
        at_caps(containers)   # the module's app goes on without the burst: raise the quotas back, then
        for s in TOPO.service_names:                          # lower the bursts to nothing
            try:
                info = containers.client.api.inspect_container(containers.names[s])
                cfs_burst.write_burst(cfs_burst.cpu_cgroup_dir(info["State"]["Pid"], info["Id"]), 0)
            except OSError:
                pass
