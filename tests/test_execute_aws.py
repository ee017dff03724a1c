"""The AWS ASG executor against moto's real HTTP server on loopback.

Faults are injected with botocore `before-send` hooks that answer the first K attempts
themselves, so botocore's real parsing and standard-mode retries run.
"""
from __future__ import annotations

import time

import pytest
from botocore.awsrequest import AWSResponse

from samm.config import GroupConfig
from samm.execute.aws_asg import AwsAsgExecutor
from samm.execute.base import ExecutorError, ScaleRequest
from samm.execute.moto_server import PAPER_ASG_NAMES, MotoServer, create_paper_asgs

GROUPS = [GroupConfig(name=n, cores=c, ram_gb=4.0 * c, price_per_hour=0.1 * c, min=lo, max=10, asg_name=asg)
          for n, c, lo, asg in zip("SML", (2, 4, 8), (1, 0, 0), PAPER_ASG_NAMES)]


@pytest.fixture(scope="session")
def moto_server():
    with MotoServer() as m:
        yield m


@pytest.fixture
def moto(moto_server):
    moto_server.reset()
    create_paper_asgs(moto_server.session(), moto_server.endpoint_url)
    yield moto_server


@pytest.fixture
def make_executor(moto):
    made = []

    def make(groups=GROUPS, **kw):
        kw.setdefault("max_attempts", 5)
        ex = AwsAsgExecutor(groups, endpoint_url=moto.endpoint_url, session=moto.session(), **kw)
        made.append(ex)
        return ex

    yield make
    for ex in made:
        ex.close()


class _Body:
    def __init__(self, body: bytes):
        self.body = body

    def stream(self, **_):
        yield self.body


def _error_xml(code: str, message: str) -> bytes:
    return (f'<ErrorResponse xmlns="http://autoscaling.amazonaws.com/doc/2011-01-01/"><Error><Type>Sender</Type>'
            f'<Code>{code}</Code><Message>{message}</Message></Error><RequestId>fake</RequestId>'
            f'</ErrorResponse>').encode()


class Sends:
    """Counts the attempts of one operation; answers the first `fail` of them with an error."""

    def __init__(self, client, operation: str, fail: int = 0, status: int = 400, code: str = "Throttling",
                 side_effect=None):
        self.attempts = self.reached_server = 0
        self.fail, self.status, self.code, self.side_effect = fail, status, code, side_effect
        client.meta.events.register(f"before-send.{client.meta.service_model.service_id.hyphenize()}.{operation}",
                                    self)

    def __call__(self, request, **_):
        self.attempts += 1
        if self.attempts <= self.fail:
            return AWSResponse(request.url, self.status, {"Content-Type": "text/xml"},
                               _Body(_error_xml(self.code, "injected")))
        if self.side_effect:
            self.side_effect()
            self.side_effect = None
        self.reached_server += 1
        return None


def asg(moto, name):
    return moto.client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0]


def test_create_paper_asgs(moto):
    types = {g["AutoScalingGroupName"]: ({i["InstanceType"] for i in g["Instances"]}, g["MinSize"], g["MaxSize"],
                                         g["DesiredCapacity"])
             for g in moto.client("autoscaling").describe_auto_scaling_groups()["AutoScalingGroups"]}
    assert types == {"samm-m5a-large": ({"m5a.large"}, 1, 10, 1), "samm-m5a-xlarge": ({"m5a.xlarge"}, 0, 10, 1),
                     "samm-m5a-2xlarge": ({"m5a.2xlarge"}, 0, 10, 1)}
    with pytest.raises(ValueError, match="min <= desired <= max"):
        create_paper_asgs(moto.session(), moto.endpoint_url, names=("x",), instance_types=("t3.micro",), min=0, desired=11)


def test_inventory_shapes(make_executor):
    before = time.time()
    inv = make_executor().inventory()
    assert sorted(inv) == ["L", "M", "S"]
    s = inv["S"]
    assert (s.name, s.desired, s.min, s.max, s.live) == ("S", 1, 1, 10, 1)
    (i,) = s.instances
    assert i.group == "S" and i.instance_id.startswith("i-") and i.state == "running"
    assert i.launched_at is not None and abs(i.launched_at - before) < 120  # from EC2 DescribeInstances
    assert inv["M"].min == 0


def test_inventory_leaves_out_a_missing_asg(make_executor):
    extra = GroupConfig(name="XL", cores=16, ram_gb=64, price_per_hour=1.6, min=0, max=5, asg_name="no-such-asg")
    assert sorted(make_executor(GROUPS + [extra]).inventory()) == ["L", "M", "S"]


def test_launch_times_are_best_effort(make_executor):
    ex = make_executor()
    Sends(ex.ec2, "DescribeInstances", fail=99, status=403, code="UnauthorizedOperation")
    inv = ex.inventory()
    assert inv["S"].live == 1 and all(i.launched_at is None for g in inv.values() for i in g.instances)


def test_launch_times_are_asked_once_per_instance(moto, make_executor):
    """A launch time never changes: EC2 is asked only about instances it has not seen, and a
    terminated instance's cached time is dropped."""
    ex = make_executor()
    asked: list[list[str]] = []
    ex.ec2.meta.events.register("before-parameter-build.ec2.DescribeInstances",
                                lambda params, **_: asked.append(sorted(params.get("InstanceIds", []))))
    first = ex.inventory()
    assert len(asked) == 1 and len(asked[0]) == 3
    again = ex.inventory()
    assert len(asked) == 1  # nothing new: no EC2 call at all
    assert {i.instance_id: i.launched_at for g in again.values() for i in g.instances} == \
        {i.instance_id: i.launched_at for g in first.values() for i in g.instances}
    assert ex.apply(ScaleRequest("M", 2, "d1:M")).status == "succeeded"
    ex.inventory()
    new = {i.instance_id for i in ex.inventory()["M"].instances} - {i.instance_id for i in first["M"].instances}
    assert len(asked) >= 2 and set(asked[-1]) == new and len(new) == 1  # only the new instance
    (m_old,) = first["M"].instances
    assert ex.apply(ScaleRequest("M", 1, "d2:M", victim=m_old.instance_id)).status == "succeeded"
    ex.inventory()
    assert m_old.instance_id not in ex._known_launch and new <= set(ex._known_launch)


def test_scale_out_sets_desired(moto, make_executor):
    ex = make_executor()
    res = ex.apply(ScaleRequest("M", 3, "d1:M"))
    assert res.status == "succeeded", res.error
    assert res.detail["from"] == 1 and res.detail["to"] == 3
    assert asg(moto, "samm-m5a-xlarge")["DesiredCapacity"] == 3
    m = ex.inventory()["M"]
    assert m.desired == 3 and m.live == 3


def test_scale_in_terminates_the_chosen_victim_with_decrement(moto, make_executor):
    ex = make_executor()
    assert ex.apply(ScaleRequest("S", 3, "d1:S")).status == "succeeded"
    ids = sorted(i.instance_id for i in ex.inventory()["S"].instances)
    victim = ids[1]
    res = ex.apply(ScaleRequest("S", 2, "d2:S", victim=victim))
    assert res.status == "succeeded", res.error
    assert res.detail["terminated"] == [victim]
    after = asg(moto, "samm-m5a-large")
    assert after["DesiredCapacity"] == 2
    assert victim not in {i["InstanceId"] for i in after["Instances"]}
    assert {i["InstanceId"] for i in after["Instances"]} == set(ids) - {victim}  # no replacement launched


def test_scale_in_without_a_living_victim_chooses_one(moto, make_executor):
    ex = make_executor()
    ex.apply(ScaleRequest("L", 2, "d1:L"))
    res = ex.apply(ScaleRequest("L", 1, "d2:L", victim="i-00000000gone"))
    assert res.status == "succeeded", res.error
    assert res.detail["victim_gone"] == "i-00000000gone" and len(res.detail["terminated"]) == 1
    assert asg(moto, "samm-m5a-2xlarge")["DesiredCapacity"] == 1


def test_victim_vanishing_mid_call_counts_as_done(moto, make_executor):
    """Someone else terminates the victim between our describe and our call: moto answers HTTP
    500 (real AWS: ValidationError); the executor re-checks and finds the work done."""
    ex = make_executor(max_attempts=2)
    ex.apply(ScaleRequest("M", 2, "d1:M"))
    victim = ex.inventory()["M"].instances[0].instance_id
    other = moto.client("autoscaling")
    Sends(ex.client, "TerminateInstanceInAutoScalingGroup", side_effect=lambda: other.terminate_instance_in_auto_scaling_group(
        InstanceId=victim, ShouldDecrementDesiredCapacity=True))
    res = ex.apply(ScaleRequest("M", 1, "d2:M", victim=victim))
    assert res.status == "succeeded", res.error
    assert res.detail["already_gone"] == [victim]
    assert asg(moto, "samm-m5a-xlarge")["DesiredCapacity"] == 1


@pytest.mark.parametrize("group, target, bound", [("S", 11, "MaxSize 10"), ("S", 0, "MinSize 1"), ("M", -1, "MinSize 0")])
def test_bounds_are_refused_on_our_side(moto, make_executor, group, target, bound):
    ex = make_executor()
    sets = Sends(ex.client, "SetDesiredCapacity")
    terms = Sends(ex.client, "TerminateInstanceInAutoScalingGroup")
    res = ex.apply(ScaleRequest(group, target, f"d1:{group}"))
    assert res.status == "failed" and bound in res.error and "refused" in res.error
    assert sets.attempts == terms.attempts == 0  # nothing was sent (moto would have accepted it)
    assert ex.inventory()[group].desired == 1


def test_a_group_moved_past_the_target_is_not_reversed(moto, make_executor):
    # An operator moves the group between the decision and the call: the absolute target would
    # turn a scale-out into terminations (and a scale-in into launches). Left as the operator set it.
    ex = make_executor()
    client = moto.client("autoscaling")
    terms = Sends(ex.client, "TerminateInstanceInAutoScalingGroup")
    client.set_desired_capacity(AutoScalingGroupName="samm-m5a-xlarge", DesiredCapacity=5)
    res = ex.apply(ScaleRequest("M", 3, "d1:M", basis=1))
    assert res.status == "skipped" and "moved from 1 to 5, past the target 3" in res.detail["reason"]
    assert asg(moto, "samm-m5a-xlarge")["DesiredCapacity"] == 5 and terms.reached_server == 0
    client.set_desired_capacity(AutoScalingGroupName="samm-m5a-xlarge", DesiredCapacity=1)
    res = ex.apply(ScaleRequest("M", 4, "d2:M", basis=5))
    assert res.status == "skipped" and "scale in" in res.detail["reason"]
    assert asg(moto, "samm-m5a-xlarge")["DesiredCapacity"] == 1
    # progress towards the target (a replay after part of a scale-in) still proceeds
    client.set_desired_capacity(AutoScalingGroupName="samm-m5a-xlarge", DesiredCapacity=3)
    res = ex.apply(ScaleRequest("M", 2, "d3:M", basis=4))
    assert res.status == "succeeded", res.error
    assert asg(moto, "samm-m5a-xlarge")["DesiredCapacity"] == 2


def test_replaying_a_request_does_not_act_twice(moto, make_executor):
    ex = make_executor()
    sets = Sends(ex.client, "SetDesiredCapacity")
    terms = Sends(ex.client, "TerminateInstanceInAutoScalingGroup")
    out = ScaleRequest("M", 2, "d1:M")
    assert [ex.apply(out).status for _ in range(3)] == ["succeeded", "skipped", "skipped"]
    victim = ex.inventory()["M"].instances[0].instance_id
    inn = ScaleRequest("M", 1, "d2:M", victim=victim)
    first, second = ex.apply(inn), ex.apply(inn)
    assert (first.status, second.status) == ("succeeded", "skipped")
    assert second.detail["reason"] == "already at target"
    assert sets.reached_server == 1 and terms.reached_server == 1
    assert ex.inventory()["M"].desired == 1


@pytest.mark.parametrize("status, code", [(400, "Throttling"), (503, "ServiceUnavailable"), (500, "InternalFailure")])
def test_transient_errors_are_retried_and_act_once(moto, make_executor, status, code):
    ex = make_executor(max_attempts=5)
    sets = Sends(ex.client, "SetDesiredCapacity", fail=2, status=status, code=code)
    res = ex.apply(ScaleRequest("L", 4, "d1:L"))
    assert res.status == "succeeded", res.error
    assert sets.attempts == 3 and sets.reached_server == 1  # two injected failures, then the real call
    assert res.detail["attempts"] == 3  # recorded with the action
    assert asg(moto, "samm-m5a-2xlarge")["DesiredCapacity"] == 4


def test_fault_proxy_throttles_a_separate_client(moto):
    """The testbed's proxy (for a daemon in another process, out of reach of event hooks):
    botocore retries the injected Throttling through it and the action lands once."""
    from samm.testbed.aws_proxy import AwsFaultProxy

    with AwsFaultProxy(moto.endpoint_url) as proxy:
        ex = AwsAsgExecutor(GROUPS, endpoint_url=proxy.endpoint_url, session=moto.session(), max_attempts=5)
        try:
            proxy.fail_next("SetDesiredCapacity", 2)
            proxy.fail_next("DescribeInstances", 1, status=403, code="UnauthorizedOperation")
            res = ex.apply(ScaleRequest("L", 3, "d1:L"))
            assert res.status == "succeeded" and res.detail["attempts"] == 3, res
            assert proxy.snapshot()["SetDesiredCapacity"] == {"failed": 2, "forwarded": 1}
            assert asg(moto, "samm-m5a-2xlarge")["DesiredCapacity"] == 3
            inv = ex.inventory()  # the EC2 error document parses: launch times unknown, not a crash
            assert inv["L"].desired == 3 and all(i.launched_at is None for i in inv["L"].instances)
            assert proxy.snapshot()["DescribeInstances"]["failed"] == 1
            assert all(i.launched_at is not None for i in ex.inventory()["L"].instances)  # asked again
        finally:
            ex.close()


def test_persistent_5xx_fails_quickly_naming_the_call(moto, make_executor):
    ex = make_executor(max_attempts=3)
    sets = Sends(ex.client, "SetDesiredCapacity", fail=99, status=500, code="InternalFailure")
    started = time.monotonic()
    res = ex.apply(ScaleRequest("L", 4, "d1:L"))
    elapsed = time.monotonic() - started
    assert res.status == "failed"
    assert "SetDesiredCapacity" in res.error and "InternalFailure" in res.error and "3 attempt" in res.error
    assert sets.attempts == 3 and sets.reached_server == 0
    assert elapsed < 5, elapsed
    assert ex.inventory()["L"].desired == 1


def test_unknown_asg_is_a_failed_result(moto, make_executor):
    ghost = GroupConfig(name="S", cores=2, ram_gb=8, price_per_hour=0.2, min=0, max=10, asg_name="no-such-asg")
    res = make_executor([ghost]).apply(ScaleRequest("S", 2, "d1:S"))
    assert res.status == "failed" and "no-such-asg" in res.error and "not found" in res.error
    res = make_executor().apply(ScaleRequest("XL", 2, "d1:XL"))
    assert res.status == "failed" and "'XL' is not managed" in res.error


def test_asg_deleted_mid_call_gives_moto_500_as_a_failed_result(moto, make_executor):
    """moto answers an unknown group with an HTML HTTP 500 (retried, then unparseable)."""
    ex = make_executor(max_attempts=2)
    other = moto.client("autoscaling")
    Sends(ex.client, "SetDesiredCapacity", side_effect=lambda: other.delete_auto_scaling_group(
        AutoScalingGroupName="samm-m5a-xlarge", ForceDelete=True))
    res = ex.apply(ScaleRequest("M", 2, "d1:M"))
    assert res.status == "failed" and res.error.startswith("SetDesiredCapacity failed")


def test_unreachable_endpoint(moto_server):
    ex = AwsAsgExecutor(GROUPS, endpoint_url="http://127.0.0.1:9", session=moto_server.session(), max_attempts=2,
                        connect_timeout=1, read_timeout=1)
    try:
        with pytest.raises(ExecutorError, match="DescribeAutoScalingGroups failed: EndpointConnectionError"):
            ex.inventory()
        res = ex.apply(ScaleRequest("S", 2, "d1:S"))
        assert res.status == "failed" and "EndpointConnectionError" in res.error
    finally:
        ex.close()


def test_guard_plan_applied_through_the_executor(moto, make_executor, caplog):
    """The daemon's Execute step in miniature: inventory -> guard -> apply -> cool-down."""
    from samm.execute.guard import after_action, plan_scaling

    ex = make_executor()
    now = 1_000_000.0
    plan = plan_scaling({"S": 1, "M": -1, "L": 5}, ex.inventory(), GROUPS, {}, now, "tick-1")
    cooldown = {}
    with caplog.at_level("INFO", logger="samm.execute.aws_asg"):
        for req in plan.requests:
            assert ex.apply(req).status == "succeeded"
            cooldown = after_action(cooldown, req.group, now, 300)
    assert {g: s.desired for g, s in ex.inventory().items()} == {"S": 2, "M": 0, "L": 6}
    assert sum("SetDesiredCapacity" in r.getMessage() for r in caplog.records) == 2
    assert sum("TerminateInstanceInAutoScalingGroup" in r.getMessage() for r in caplog.records) == 1
    # the same decision replayed acts no more; the next one waits for the cool-down
    assert {ex.apply(r).status for r in plan.requests} == {"skipped"}
    nxt = plan_scaling({"S": 1}, ex.inventory(), GROUPS, cooldown, now + 60, "tick-2")
    assert not nxt.requests and nxt.skipped[0].reason == "cooldown"


# --- the daemon's Execute stage (ControlLoop) over the real executor ----------------------------

class _Monitor:
    """One actionable snapshot per read, each a minute after the last (the loop's window key)."""

    def __init__(self, start: float):
        import numpy as np

        from samm.analyze import RawSnapshot
        from samm.daemon.monitoring import MonitorOutcome

        self.end, self.outcome = start, MonitorOutcome
        self.raw = RawSnapshot(vm_type=np.array([0, 1, 2]), vm_state=np.ones(3, dtype=int),
                               vm_cpu_busy=np.full(3, 0.9), vm_ram_used_gb=np.full(3, 2.0),
                               vm_running_for_s=np.full(3, 600.0), jobs_submitted_total=np.array(10.0),
                               jobs_submitted_interval=np.array(2.0), jobs_waiting_now=np.array(1.0),
                               jobs_waiting_interval=np.array(1.0), jobs_running=np.array(3.0))

    def read(self):
        self.end += 60
        return self.outcome(self.end - 60, self.end, "ok", raw=self.raw)


class _Planner:
    feature_names = None

    def __init__(self, deltas):
        self.deltas = deltas

    def decide(self, features):
        from samm.plan.client import PlanOutcome

        return PlanOutcome(dict(self.deltas), action=None, action_name="scale")


def test_an_outcome_the_store_failed_to_take_still_cools_its_group_down(moto, make_executor, tmp_path):
    """The call acted, then writing its outcome (and so its cool-down) failed while the daemon
    lived on: the next iteration must resolve that action and honour the cool-down, not act again."""
    from samm.analyze import FleetSpec
    from samm.daemon.loop import ControlLoop
    from samm.knowledge import KnowledgeError, KnowledgeStore

    clock = {"now": 1_000_030.0}
    store = KnowledgeStore(f"sqlite:///{tmp_path}/k.db", clock=lambda: clock["now"])
    loop = ControlLoop(groups=GROUPS, fleet=FleetSpec.from_vm_types(GROUPS), monitor=_Monitor(1_000_000.0),
                       planner=_Planner({"M": 1}), executor=make_executor(), store=store, agent_name="test",
                       warmup_s=0, cooldown_s=300, clock=lambda: clock["now"])
    finish = store.finish_action

    def lost_write(*a, **kw):
        store.finish_action = finish
        raise KnowledgeError("database is locked")

    store.finish_action = lost_write
    try:
        with pytest.raises(KnowledgeError):
            loop.run_once()
        assert asg(moto, "samm-m5a-xlarge")["DesiredCapacity"] == 2  # it did act
        assert store.cooldowns() == {} and [a.status for a in store.actions()] == ["in_flight"]
        clock["now"] += 60
        rep = loop.run_once()
        assert asg(moto, "samm-m5a-xlarge")["DesiredCapacity"] == 2, "acted again inside the cool-down"
        assert [a["status"] for a in rep.actions] == ["blocked"] and "cooldown" in rep.blocked["M"]
        first = store.actions()[0]
        assert first.status == "succeeded" and first.result == {"recovered": True}
        assert store.cooldowns() == {"M": clock["now"] + 300}
    finally:
        store.close()
