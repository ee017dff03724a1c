"""DockerExecutor against a real dockerd started by the session fixture (root only)."""
from __future__ import annotations

import time

import pytest

from samm.config import GroupConfig
from samm.execute.base import ExecutorError, ScaleRequest
from samm.execute.docker_exec import DockerExecutor, parse_docker_time, stats_summary
from fixtures_docker import real_engine
from samm.execute.local_dockerd import BUSYBOX_TAG, LocalDockerd, ensure_busybox_image

pytestmark = pytest.mark.docker


@pytest.fixture(scope="session")
def dockerd(tmp_path_factory):
    yield from real_engine(tmp_path_factory, "dockerd")


def group(name: str, **kw) -> GroupConfig:
    base = dict(name=name, cores=1, ram_gb=0.0625, price_per_hour=0.1, min=0, max=4, docker_image=BUSYBOX_TAG)
    return GroupConfig(**(base | kw))


@pytest.fixture
def executor(dockerd, request):
    # A namespace per test keeps tests from seeing each other's containers.
    ex = DockerExecutor([group("web", docker_label="app=web"), group("big", cores=2, ram_gb=0.125, min=1, max=2)],
                        base_url=dockerd.base_url, namespace=f"t{abs(hash(request.node.name)) % 10**8}",
                        stop_timeout_s=2)
    yield ex
    client = ex._docker()
    for c in client.containers.list(all=True, filters={"label": f"samm.namespace={ex.namespace}"}):
        c.remove(force=True)
    ex.close()


def live_names(ex: DockerExecutor, name: str) -> set[str]:
    return {i.instance_id for i in ex.inventory()[name].instances if i.state != "terminating"}


def test_scale_out_sets_labels_and_limits(executor):
    ns = executor.namespace
    before = time.time()
    res = executor.apply(ScaleRequest("web", 2, "k1"))
    assert res.status == "succeeded", res
    assert sorted(res.detail["started"]) == [f"{ns}-web-1", f"{ns}-web-2"]
    inv = executor.inventory()
    web = inv["web"]
    assert (web.desired, web.live, web.min, web.max) == (2, 2, 0, 4)
    assert {i.state for i in web.instances} == {"running"}
    assert all(before - 2 <= i.launched_at <= time.time() + 1 for i in web.instances)
    assert inv["big"].live == 0

    attrs = executor._docker().containers.get(f"{ns}-web-1").attrs
    host = attrs["HostConfig"]
    assert (host["CpuPeriod"], host["CpuQuota"], host["Memory"]) == (100_000, 100_000, 64 * 2**20)
    assert host["NanoCpus"] == 0 and host["Init"] is True
    labels = attrs["Config"]["Labels"]
    assert labels["samm.group"] == "web" and labels["samm.namespace"] == executor.namespace
    assert labels["app"] == "web" and labels["samm.request"] == "k1"

    res = executor.apply(ScaleRequest("big", 1, "k2"))
    assert res.status == "succeeded"
    host = executor._docker().containers.get(f"{ns}-big-1").attrs["HostConfig"]
    assert (host["CpuQuota"], host["Memory"]) == (200_000, 128 * 2**20)


def test_replay_does_not_act_twice(executor):
    first = executor.apply(ScaleRequest("web", 2, "same"))
    again = executor.apply(ScaleRequest("web", 2, "same"))
    assert first.status == "succeeded" and again.status == "skipped"
    assert again.detail["started"] == [] and again.detail["removed"] == []
    assert len(live_names(executor, "web")) == 2


def test_scale_in_removes_victim_then_newest(executor):
    ns = executor.namespace
    assert executor.apply(ScaleRequest("web", 4, "out")).status == "succeeded"
    res = executor.apply(ScaleRequest("web", 2, "in", victim=f"{ns}-web-2"))
    assert res.status == "succeeded", res
    # The victim goes first; the second one removed is the newest.
    assert res.detail["removed"] == [f"{ns}-web-2", f"{ns}-web-4"]
    assert live_names(executor, "web") == {f"{ns}-web-1", f"{ns}-web-3"}
    gone = executor._docker().containers.list(all=True, filters={"name": f"{ns}-web-2",
                                                                 "label": f"samm.namespace={executor.namespace}"})
    assert gone == []
    replay = executor.apply(ScaleRequest("web", 2, "in", victim=f"{ns}-web-2"))
    assert replay.status == "skipped"
    assert executor.apply(ScaleRequest("web", 0, "zero")).status == "succeeded"
    assert live_names(executor, "web") == set()


def test_bounds_and_unknown_group_refused(executor):
    for req, needle in ((ScaleRequest("web", 5, "a"), "outside [0, 4]"),
                        (ScaleRequest("big", 0, "b"), "outside [1, 2]"),
                        (ScaleRequest("web", -1, "c"), "outside"),
                        (ScaleRequest("db", 1, "d"), "unknown group 'db'")):
        res = executor.apply(req)
        assert res.status == "failed" and needle in res.error, res
    assert live_names(executor, "web") == set() and live_names(executor, "big") == set()


def test_exited_instance_is_replaced(executor):
    ns = executor.namespace
    executor.commands["web"] = ["sh", "-c", "sleep 600"]
    assert executor.apply(ScaleRequest("web", 1, "a")).status == "succeeded"
    executor._docker().containers.get(f"{ns}-web-1").kill()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        states = [i.state for i in executor.inventory()["web"].instances]
        if states == ["terminating"]:
            break
        time.sleep(0.05)
    assert states == ["terminating"]
    res = executor.apply(ScaleRequest("web", 1, "a"))
    assert res.status == "succeeded" and res.detail["reaped"] == [f"{ns}-web-1"]
    assert len(live_names(executor, "web")) == 1


def test_name_taken_by_someone_else(executor):
    ns = executor.namespace
    # An unlabelled container squatting on the next name: not ours, so skip past it.
    squatter = executor._docker().containers.run(BUSYBOX_TAG, ["sleep", "60"], name=f"{ns}-web-1", detach=True,
                                                 init=True, labels={"samm.namespace": ns})
    res = executor.apply(ScaleRequest("web", 1, "a"))
    assert res.status == "succeeded" and res.detail["started"] == [f"{ns}-web-2"], res
    assert live_names(executor, "web") == {f"{ns}-web-2"}
    squatter.remove(force=True)
    with pytest.raises(ValueError, match="namespace"):
        DockerExecutor([group("web")], base_url="unix:///nonexistent", namespace="bad name")


def test_bad_cpu_limit_refused(executor):
    ns = executor.namespace
    for bad in (0, -1, float("nan"), float("inf"), "2"):
        res = executor.set_cpu_limit(f"{ns}-web-1", bad)
        assert res.status == "failed" and "cores must be a positive finite number" in res.error
    res = executor.set_cpu_limit("no-such-container", 0.5)
    assert res.status == "failed" and "containers.get" in res.error


def _measure(ex: DockerExecutor, name: str, ok, deadline_s: float = 15.0) -> dict:
    """Polls stats until `ok(sample)`; the 2 shared cores make single samples noisy."""
    deadline = time.monotonic() + deadline_s
    sample = {}
    while time.monotonic() < deadline:
        sample = ex.container_stats(name)
        if sample["cpu_percent"] is not None and ok(sample):
            return sample
    return sample


@pytest.mark.slow  # a CPU measurement: noisy on a loaded 2-core machine
def test_live_cpu_limit_update_is_measured(executor):
    ns = executor.namespace
    executor.commands["web"] = ["sh", "-c", "while :; do :; done"]
    executor.groups["web"] = group("web", cores=1)
    assert executor.apply(ScaleRequest("web", 1, "busy")).status == "succeeded"
    res = executor.set_cpu_limit(f"{ns}-web-1", 0.5)
    assert res.status == "succeeded" and res.detail["cpu_quota"] == 50_000

    s = _measure(executor, f"{ns}-web-1", lambda s: 35 <= s["cpu_percent"] <= 60)
    print("0.5 cores:", s)
    assert 35 <= s["cpu_percent"] <= 60, s
    assert s["throttle_ratio"] > 0.5 and s["mem_working_set_bytes"] > 0

    assert executor.set_cpu_limit(f"{ns}-web-1", 0.2).status == "succeeded"
    host = executor._docker().containers.get(f"{ns}-web-1").attrs["HostConfig"]
    assert (host["CpuPeriod"], host["CpuQuota"]) == (100_000, 20_000)
    s = _measure(executor, f"{ns}-web-1", lambda s: 10 <= s["cpu_percent"] <= 26)
    print("0.2 cores:", s)
    assert 10 <= s["cpu_percent"] <= 26, s
    assert s["throttle_ratio"] > 0.5


def test_engine_stopped_gives_failed_result(tmp_path, dockerd):
    ns = "down"
    with LocalDockerd(tmp_path) as engine:
        client = engine.client()
        ensure_busybox_image(client)
        client.close()
        ex = DockerExecutor([group("web")], base_url=engine.base_url, namespace="down", stop_timeout_s=1)
        assert ex.apply(ScaleRequest("web", 1, "up")).status == "succeeded"
    res = ex.apply(ScaleRequest("web", 2, "while-down"))
    assert res.status == "failed" and res.error.startswith("docker containers.list failed"), res
    assert ex.set_cpu_limit(f"{ns}-web-1", 0.5).status == "failed"
    with pytest.raises(ExecutorError, match="containers.list"):
        ex.inventory()
    with pytest.raises(ExecutorError, match="containers.get"):
        ex.container_stats(f"{ns}-web-1")
    ex.close()

    never = DockerExecutor([group("web")], base_url=f"unix://{tmp_path}/absent.sock")
    res = never.apply(ScaleRequest("web", 1, "x"))
    assert res.status == "failed" and res.error.startswith("docker connect failed"), res


def test_stats_formulas_and_time_parsing():
    raw = {
        "cpu_stats": {"cpu_usage": {"total_usage": 1_500_000_000}, "system_cpu_usage": 20_000_000_000,
                      "online_cpus": 2, "throttling_data": {"periods": 30, "throttled_periods": 12}},
        "precpu_stats": {"cpu_usage": {"total_usage": 1_000_000_000}, "system_cpu_usage": 18_000_000_000,
                         "throttling_data": {"periods": 20, "throttled_periods": 7}},
        "memory_stats": {"usage": 10_000, "stats": {"total_inactive_file": 3_000}},
    }
    assert stats_summary(raw) == {"cpu_percent": 50.0, "mem_working_set_bytes": 7_000, "throttle_ratio": 0.5}
    raw["memory_stats"] = {"usage": 10_000, "stats": {"inactive_file": 4_000}}  # cgroup v2 naming
    raw["precpu_stats"] = {}  # first sample: no delta to speak of
    assert stats_summary(raw) == {"cpu_percent": None, "mem_working_set_bytes": 6_000, "throttle_ratio": 0.4}
    assert parse_docker_time("2026-11-22T01:58:31.117729723Z") == pytest.approx(1795312711.117729723, abs=1e-6)
    assert parse_docker_time("0001-01-01T00:00:00Z") is None
    assert parse_docker_time("garbage") is None
