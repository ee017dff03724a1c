"""Second audit of the Docker executor against a real private dockerd: what others do to the
engine between a decision and its apply, crash loops, left-over containers and engine errors."""
from __future__ import annotations

import time

import pytest

from samm.config import GroupConfig
from samm.execute.base import ScaleRequest
from samm.execute.docker_exec import DockerExecutor
from samm.execute.local_dockerd import BUSYBOX_TAG
from fixtures_docker import real_engine

@pytest.fixture(scope="module")
def dockerd(tmp_path_factory):
    yield from real_engine(tmp_path_factory, "dockerd2")


def group(name: str, **kw) -> GroupConfig:
    base = dict(name=name, cores=1, ram_gb=0.0625, price_per_hour=0.1, min=0, max=4, docker_image=BUSYBOX_TAG)
    return GroupConfig(**(base | kw))


def _clean(ex: DockerExecutor) -> None:
    for c in ex._docker().containers.list(all=True, filters={"label": f"samm.namespace={ex.namespace}"}):
        c.remove(force=True)


@pytest.fixture
def executor(dockerd, request):
    ex = DockerExecutor([group("web")], base_url=dockerd.base_url,
                        namespace=f"a{abs(hash(request.node.name)) % 10**8}", stop_timeout_s=1, timeout_s=20)
    yield ex
    _clean(ex)
    ex.close()


def ours(ex: DockerExecutor, name: str, *, created: bool = False):
    """A container an operator made with the group's labels (`docker run`/`docker create`)."""
    labels = {"samm.namespace": ex.namespace, "samm.group": "web"}
    make = ex._docker().containers.create if created else ex._docker().containers.run
    return make(BUSYBOX_TAG, ["sleep", "600"], name=name, detach=True, init=True, labels=labels)


def running(ex: DockerExecutor) -> set[str]:
    return {c.name for c in ex._docker().containers.list(filters={"label": f"samm.namespace={ex.namespace}"})}


def wait_exited(ex: DockerExecutor, name: str) -> None:
    deadline = time.monotonic() + 15
    while ex._docker().containers.get(name).status != "exited":
        assert time.monotonic() < deadline, f"{name} did not exit"
        time.sleep(0.05)


@pytest.mark.docker
def test_an_operators_docker_run_since_a_scale_out_decision_is_not_undone(executor):
    ns = executor.namespace
    assert executor.apply(ScaleRequest("web", 1, "k")).status == "succeeded"
    ours(executor, f"{ns}-op-1")
    ours(executor, f"{ns}-op-2")
    # decided 1 -> 2; the operator took it to 3 meanwhile: the executor used to remove one of them
    res = executor.apply(ScaleRequest("web", 2, "out", basis=1))
    assert res.status == "skipped" and "past the target" in res.detail["reason"], res
    assert res.detail["removed"] == [] and len(running(executor)) == 3


@pytest.mark.docker
def test_an_operators_docker_rm_since_a_scale_in_decision_is_not_undone(executor):
    ns = executor.namespace
    assert executor.apply(ScaleRequest("web", 3, "k")).status == "succeeded"
    for n in (2, 3):
        executor._docker().containers.get(f"{ns}-web-{n}").remove(force=True)
    # decided 3 -> 2; the operator took it to 1 meanwhile: the executor used to launch one again
    res = executor.apply(ScaleRequest("web", 2, "in", basis=3))
    assert res.status == "skipped" and "past the target" in res.detail["reason"], res
    assert res.detail["started"] == [] and running(executor) == {f"{ns}-web-1"}
    # progress towards the target still proceeds (no basis given: as before)
    assert executor.apply(ScaleRequest("web", 2, "plain")).status == "succeeded"
    assert len(running(executor)) == 2


@pytest.mark.docker
def test_a_created_never_started_container_is_not_counted_as_capacity(executor):
    """An apply cut off between create and start (an engine restart) leaves a `created`
    container; it used to count as a pending instance forever, so the target was 'met'."""
    ns = executor.namespace
    ours(executor, f"{ns}-web-1", created=True)
    assert [i.state for i in executor.inventory()["web"].instances] == ["terminating"]
    res = executor.apply(ScaleRequest("web", 1, "k"))
    assert res.status == "succeeded" and res.detail["reaped"] == [f"{ns}-web-1"], res
    assert len(running(executor)) == 1 and executor.inventory()["web"].live == 1


@pytest.mark.docker
@pytest.mark.parametrize("stopped", [False, True])
def test_a_container_removed_outside_between_listing_and_scale_in(executor, stopped):
    ns = executor.namespace
    assert executor.apply(ScaleRequest("web", 2, "k")).status == "succeeded"
    listed = executor._containers

    def listing_then_operator_rm(group):
        found = listed(group)
        victim = executor._docker().containers.get(f"{ns}-web-2")
        victim.stop(timeout=1) if stopped else victim.remove(force=True)
        return found

    executor._containers = listing_then_operator_rm
    res = executor.apply(ScaleRequest("web", 1, "in", victim=f"{ns}-web-2"))
    executor._containers = listed
    assert res.status == "succeeded", res     # used to fail: 404 No such container
    assert running(executor) == {f"{ns}-web-1"}
    if not stopped:
        assert res.detail["already_gone"] == [f"{ns}-web-2"]


@pytest.mark.docker
def test_an_exited_container_removed_outside_before_its_reaping(executor):
    ns = executor.namespace
    executor.commands["web"] = ["sh", "-c", "sleep 600"]
    assert executor.apply(ScaleRequest("web", 1, "k")).status == "succeeded"
    executor._docker().containers.get(f"{ns}-web-1").kill()
    wait_exited(executor, f"{ns}-web-1")
    listed = executor._containers

    def listing_then_operator_rm(group):
        found = listed(group)
        executor._docker().containers.get(f"{ns}-web-1").remove(force=True)
        return found

    executor._containers = listing_then_operator_rm
    res = executor.apply(ScaleRequest("web", 1, "k2"))
    executor._containers = listed
    assert res.status == "succeeded" and len(res.detail["started"]) == 1, res
    assert len(running(executor)) == 1


@pytest.mark.docker
def test_a_container_that_crashes_right_after_start_is_not_relaunched_every_loop(executor):
    ns = executor.namespace
    executor.commands["web"] = ["no-such-command"]
    assert executor.apply(ScaleRequest("web", 1, "k")).status == "succeeded"
    wait_exited(executor, f"{ns}-web-1")
    res = executor.apply(ScaleRequest("web", 1, "k"))
    # it used to reap it and launch another one, which crashed the same way, at every decision
    assert res.status == "failed" and res.detail["started"] == [], res
    assert "exited with code 127" in res.error and f"docker logs {ns}-web-1" in res.error and "\n" not in res.error
    assert executor._docker().containers.get(f"{ns}-web-1").status == "exited"   # kept: its logs say why
    # scale-in and a met target are not held up by it
    assert executor.apply(ScaleRequest("web", 0, "zero")).status == "skipped"
    # once the back-off has passed, it is reaped and replaced
    executor.crash_backoff_s = 0
    executor.commands["web"] = ["sleep", "600"]
    res = executor.apply(ScaleRequest("web", 1, "k3"))
    assert res.status == "succeeded" and res.detail["reaped"] == [f"{ns}-web-1"], res


@pytest.mark.docker
def test_a_container_killed_from_outside_is_still_replaced_at_once(executor):
    ns = executor.namespace
    assert executor.apply(ScaleRequest("web", 1, "k")).status == "succeeded"
    executor._docker().containers.get(f"{ns}-web-1").kill()     # 137: not a crash of its own
    wait_exited(executor, f"{ns}-web-1")
    res = executor.apply(ScaleRequest("web", 1, "k"))
    assert res.status == "succeeded" and res.detail["reaped"] == [f"{ns}-web-1"], res


@pytest.mark.docker
def test_an_engine_error_is_one_line(executor):
    ns = executor.namespace
    assert executor.apply(ScaleRequest("web", 1, "k")).status == "succeeded"
    # more cores than the engine has are clamped to its CPUs (a larger quota limits nothing)
    res = executor.set_cpu_limit(f"{ns}-web-1", 1e12)
    assert res.status == "succeeded" and "clamped" in res.detail, res
    # a quota the kernel refuses: runc's error text used to come through with its newlines
    from samm.execute.docker_exec import _call, _CallFailed
    c = executor._docker().containers.get(f"{ns}-web-1")
    with pytest.raises(_CallFailed) as err:
        _call("container.update", c.update, cpu_period=100_000, cpu_quota=10**17)
    assert str(err.value).startswith("docker container.update failed"), err.value
    assert "\n" not in str(err.value) and "invalid argument" in str(err.value)


@pytest.mark.parametrize("cores", [1e305, 1.7e308])
def test_a_cpu_limit_whose_quota_overflows_is_refused_not_raised(cores):
    ex = DockerExecutor([group("web")], base_url="unix:///nonexistent/docker.sock", timeout_s=1)
    res = ex.set_cpu_limit("any", cores)     # used to raise OverflowError out of set_cpu_limit
    assert res.status == "failed" and "too large" in res.error, res


@pytest.mark.docker
def test_an_image_not_held_locally_fails_at_once_in_one_line_and_leaves_nothing(executor):
    """No registry here: create must not pull (a hang), and must leave no container behind."""
    executor.groups["web"] = group("web", docker_image="samm-audit/absent:1")
    res = executor.apply(ScaleRequest("web", 1, "k"))
    assert res.status == "failed" and res.detail["call"] == "containers.create", res
    assert "No such image" in res.error and "\n" not in res.error
    assert executor._docker().containers.list(all=True, filters={"label": f"samm.namespace={executor.namespace}"}) == []
