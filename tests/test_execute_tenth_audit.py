"""Tenth audit of the Execute stage, with real components: moto's HTTP server (faults injected by
botocore `before-send` hooks, so botocore's real parsing and retries run), a private Docker
engine, and the daemon's Execute step over a real SQLite knowledge store.

* a request whose opening read failed (DescribeAutoScalingGroups throttled or denied; a Docker
  engine that could not be reached or listed), or whose change AWS rejected on its only attempt
  (ValidationError, AccessDenied), changed nothing, yet started the group's cool-down: the next,
  legitimate decision was blocked for the whole window;
* an agent's numpy scalar (np.float32 cores, the dtype of its network's output) was refused as
  "not a positive finite number", and an int too large for a float raised OverflowError past
  `set_cpu_limit`;
* a limit under the kernel's smallest CFS quota was raised to it silently: the result recorded the
  cores asked, not the 0.01 the engine held;
* the crash back-off compared the engine's FinishedAt with this host's clock: an engine behind it
  relaunched a crash loop every interval, one ahead held scale-out back for as long as the skew.
Each test failed before its fix."""
from __future__ import annotations

import re
import time

import numpy as np
import pytest

from samm.analyze import FleetSpec
from samm.daemon.loop import ControlLoop
from samm.execute import cfs_burst, docker_exec
from samm.execute.base import ScaleRequest
from samm.execute.docker_exec import (CPU_PERIOD_US, MIN_CPU_QUOTA_US, DockerExecutor, cpu_quota_for,
                                      limit_cores)
from samm.execute.guard import after_action
from samm.knowledge import KnowledgeStore

from fixtures_docker import real_engine
from test_execute_asg_audit import FailAfter
import test_execute_aws
from test_execute_aws import GROUPS, Sends, _Monitor, _Planner, asg
from test_docker_executor_second_audit import group, wait_exited

T0 = 2_000_000_000.0
# moto's fixtures, shared with the earlier AWS tests (assigned, not imported: pyflakes stays quiet)
moto_server, moto, make_executor = test_execute_aws.moto_server, test_execute_aws.moto, test_execute_aws.make_executor


# --------------------------------------------------- 1. a failed read applied nothing: no cool-down
@pytest.mark.parametrize("code, status", [("Throttling", 400), ("AccessDenied", 403)])
def test_an_asg_request_whose_describe_failed_starts_no_cooldown(moto, make_executor, code, status):
    """DescribeAutoScalingGroups, the first call of every request, throttled to the end (or denied:
    a policy without autoscaling:Describe*): nothing was sent that changes the group."""
    ex = make_executor(max_attempts=2)
    Sends(ex.client, "DescribeAutoScalingGroups", fail=99, status=status, code=code)
    sets = Sends(ex.client, "SetDesiredCapacity")
    res = ex.apply(ScaleRequest("S", 2, "d1:S", basis=1))
    assert res.status == "failed" and res.error.startswith("DescribeAutoScalingGroups failed") and code in res.error
    assert "\n" not in res.error
    assert sets.attempts == 0 and asg(moto, "samm-m5a-large")["DesiredCapacity"] == 1
    assert not res.may_have_acted and not res.starts_cooldown
    assert after_action({}, "S", T0, 300, res) == {}


@pytest.mark.parametrize("api, code, status", [("SetDesiredCapacity", "ValidationError", 400),
                                               ("SetDesiredCapacity", "AccessDenied", 403),
                                               ("TerminateInstanceInAutoScalingGroup", "ValidationError", 400)])
def test_a_change_aws_rejected_outright_starts_no_cooldown(moto, make_executor, api, code, status):
    """AWS answered the one attempt with a 4xx (MaxSize lowered between the describe and the set,
    a policy without the permission): the call changed nothing, yet the group cooled down."""
    ex = make_executor(max_attempts=3)
    moto.client("autoscaling").set_desired_capacity(AutoScalingGroupName="samm-m5a-xlarge", DesiredCapacity=2)
    sends = Sends(ex.client, api, fail=99, status=status, code=code)
    res = ex.apply(ScaleRequest("M", 3 if api == "SetDesiredCapacity" else 1, "d1:M", basis=2))
    assert res.status == "failed" and res.error.startswith(f"{api} failed after 1 attempt(s): {code}"), res
    assert sends.attempts == 1 and asg(moto, "samm-m5a-xlarge")["DesiredCapacity"] == 2
    assert not res.may_have_acted and after_action({}, "M", T0, 300, res) == {}


def test_a_scale_in_whose_second_terminate_was_rejected_still_cools_down(moto, make_executor):
    """The first of two terminates acted: the request did change the group."""
    ex = make_executor()
    moto.client("autoscaling").set_desired_capacity(AutoScalingGroupName="samm-m5a-xlarge", DesiredCapacity=3)
    FailAfter(ex.client, "TerminateInstanceInAutoScalingGroup", ok=1, code="ValidationError")
    res = ex.apply(ScaleRequest("M", 1, "d1:M", basis=3))
    assert res.status == "failed" and len(res.detail["terminated"]) == 1 and "ValidationError" in res.error
    assert asg(moto, "samm-m5a-xlarge")["DesiredCapacity"] == 2
    assert res.may_have_acted and res.starts_cooldown


def test_a_terminate_that_failed_still_cools_down(moto, make_executor):
    """The other side, unchanged: a scale-in whose terminate failed after its retries may have acted."""
    ex = make_executor(max_attempts=2)
    FailAfter(ex.client, "TerminateInstanceInAutoScalingGroup", ok=0)
    moto.client("autoscaling").set_desired_capacity(AutoScalingGroupName="samm-m5a-xlarge", DesiredCapacity=2)
    res = ex.apply(ScaleRequest("M", 1, "d1:M", basis=2))
    assert res.status == "failed" and res.error.startswith("TerminateInstanceInAutoScalingGroup failed")
    assert res.may_have_acted and res.starts_cooldown


def test_the_daemon_acts_at_the_next_decision_after_a_throttled_describe(moto, make_executor, tmp_path):
    """The daemon's Execute step: the inventory's describe passed, the apply's was throttled to
    the end. The group got a 300-s cool-down, so the same wish a minute later was blocked."""
    clock = {"now": T0 + 90}
    ex = make_executor(max_attempts=2)
    throttle = FailAfter(ex.client, "DescribeAutoScalingGroups", ok=1)   # the inventory's passes
    with KnowledgeStore(f"sqlite:///{tmp_path}/k.db", clock=lambda: clock["now"]) as store:
        loop = ControlLoop(groups=GROUPS, fleet=FleetSpec.from_vm_types(GROUPS), monitor=_Monitor(T0),
                           planner=_Planner({"S": 1}), executor=ex, store=store, agent_name="tenth",
                           warmup_s=0, cooldown_s=300, clock=lambda: clock["now"])
        rep = loop.run_once()
        assert [(a["group"], a["status"]) for a in rep.actions] == [("S", "failed")]
        assert "DescribeAutoScalingGroups" in rep.actions[0]["error"]
        assert store.cooldowns() == {}
        throttle.ok = 10 ** 9   # AWS answers again
        clock["now"] += 60
        rep = loop.run_once()
        assert [(a["group"], a["status"]) for a in rep.actions] == [("S", "succeeded")], rep.blocked
        assert asg(moto, "samm-m5a-large")["DesiredCapacity"] == 2


def test_a_docker_request_to_an_unreachable_engine_starts_no_cooldown(tmp_path):
    ex = DockerExecutor([group("web")], base_url=f"unix://{tmp_path}/absent.sock", timeout_s=2)
    try:
        res = ex.apply(ScaleRequest("web", 1, "x", basis=0))
        assert res.status == "failed" and res.error.startswith("docker connect failed") and "\n" not in res.error
        assert not res.may_have_acted and after_action({}, "web", T0, 300, res) == {}
        res = ex.set_cpu_limit("samm-web-1", 0.5)
        assert res.status == "failed" and not res.may_have_acted
    finally:
        ex.close()


# --------------------------------------------------- 2. numbers an agent gives
def test_numpy_scalars_are_numbers_of_cores_and_huge_ints_are_refused():
    assert cpu_quota_for(np.float32(0.5)) == 50_000 and cpu_quota_for(np.int64(2)) == 200_000
    assert cfs_burst.burst_us(100_000, np.float32(0.25)) == 25_000
    for bad in (True, np.float32("nan"), np.float64(-1.0), 10 ** 400, "1"):
        with pytest.raises(ValueError, match="positive finite"):
            cpu_quota_for(bad)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        cfs_burst.burst_us(100_000, 10 ** 400)
    res = DockerExecutor([group("web")], base_url="unix:///nonexistent.sock").set_cpu_limit("x", 10 ** 400)
    assert res.status == "failed" and "positive finite" in res.error and not res.may_have_acted


# --------------------------------------------------- 3. the kernel's floor, on a real engine
@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    yield from real_engine(tmp_path_factory, "tenth")


@pytest.fixture
def executor(engine, request):
    ex = DockerExecutor([group("web")], base_url=engine.base_url,
                        namespace=f"t{abs(hash(request.node.name)) % 10**8}", stop_timeout_s=1, timeout_s=20)
    yield ex
    for c in ex._docker().containers.list(all=True, filters={"label": f"samm.namespace={ex.namespace}"}):
        c.remove(force=True)
    ex.close()


@pytest.mark.docker
def test_a_limit_below_the_kernels_smallest_quota_is_recorded_as_held(executor):
    ex = executor
    assert ex.apply(ScaleRequest("web", 1, "k")).status == "succeeded"
    name = f"{ex.namespace}-web-1"
    res = ex.set_cpu_limit(name, 0.004)
    assert res.status == "succeeded", res
    held = limit_cores(ex._docker().containers.get(name).attrs["HostConfig"])
    assert held == MIN_CPU_QUOTA_US / CPU_PERIOD_US == 0.01
    assert res.detail["cores"] == held and res.detail["cpu_quota"] == MIN_CPU_QUOTA_US
    assert res.detail["cores_asked"] == 0.004 and "raised to 0.01" in res.detail["clamped"]
    ok = ex.set_cpu_limit(name, np.float32(0.25))   # an agent's output: recorded as a JSON number
    assert ok.status == "succeeded" and "clamped" not in ok.detail and type(ok.detail["cores"]) is float
    assert limit_cores(ex._docker().containers.get(name).attrs["HostConfig"]) == 0.25
    gone = ex.set_cpu_limit(f"{ex.namespace}-web-9", 0.5)   # removed or renamed since it was read
    assert gone.status == "failed" and "containers.get" in gone.error and not gone.may_have_acted


# --------------------------------------------------- 4. the crash back-off on the engine's clock
class _Skewed:
    """This host's clock `by` seconds off the engine's (a remote engine, an unsynchronised VM)."""

    def __init__(self, by: float):
        self.by = by

    def time(self) -> float:
        return time.time() + self.by

    def __getattr__(self, name):
        return getattr(time, name)


def _crash_once(ex: DockerExecutor) -> str:
    ex.commands["web"] = ["no-such-command"]
    assert ex.apply(ScaleRequest("web", 1, "crash")).status == "succeeded"
    name = f"{ex.namespace}-web-1"
    wait_exited(ex, name)
    return name


@pytest.mark.docker
def test_a_crash_loop_is_held_back_by_the_engines_clock_not_this_hosts(executor, monkeypatch):
    """SAMM's clock 10 minutes ahead of the engine's: the crash that just happened looked 10
    minutes old, past the 60-s back-off, so the crashing container was reaped and relaunched."""
    name = _crash_once(executor)
    monkeypatch.setattr(docker_exec, "time", _Skewed(600))
    res = executor.apply(ScaleRequest("web", 1, "again"))
    assert res.status == "failed" and res.detail["started"] == [] and f"docker logs {name}" in res.error, res
    assert not res.may_have_acted
    assert executor._docker().containers.get(name).status == "exited"   # kept, not reaped


@pytest.mark.docker
def test_an_engine_clock_ahead_does_not_stretch_the_crash_back_off(executor, monkeypatch):
    """The other way: SAMM 10 minutes behind said "no new one for 660 s" and held scale-out that long."""
    _crash_once(executor)
    monkeypatch.setattr(docker_exec, "time", _Skewed(-600))
    res = executor.apply(ScaleRequest("web", 1, "again"))
    wait = float(re.search(r"no new one for (\d+) s", res.error).group(1))
    assert 0 < wait <= executor.crash_backoff_s, res.error
    executor.crash_backoff_s = 0
    executor.commands["web"] = ["sleep", "600"]
    assert executor.apply(ScaleRequest("web", 1, "later")).status == "succeeded"
