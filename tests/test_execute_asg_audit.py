"""Audit of the Execute stage (second pass): the AWS ASG executor against moto's real HTTP
server, the guard, and the daemon's Execute step over a real SQLite knowledge store.

Faults are injected with botocore `before-send` hooks (test_execute_aws.Sends and `FailAfter`
below), so botocore's real parsing and standard-mode retries run.
"""
from __future__ import annotations

import math

import pytest
from botocore.awsrequest import AWSResponse
from click.testing import CliRunner

from samm.analyze import FleetSpec
from samm.daemon.build import ConfigurationProblem
from samm.daemon.loop import ControlLoop
from samm.execute.aws_asg import AwsAsgExecutor
from samm.execute.base import GroupStatus, Instance, ScaleRequest
from samm.execute.guard import plan_scaling
from samm.knowledge import KnowledgeStore

from test_execute_aws import (GROUPS, Sends, _Body, _error_xml, _Monitor, _Planner, asg,  # noqa: F401
                              make_executor, moto, moto_server)

T0 = 2_000_000_000.0


class FailAfter:
    """Answers every attempt of one operation after the first `ok` with an error."""

    def __init__(self, client, operation: str, ok: int, code: str = "Throttling"):
        self.calls, self.ok, self.code = 0, ok, code
        client.meta.events.register(f"before-send.auto-scaling.{operation}", self)

    def __call__(self, request, **_):
        self.calls += 1
        if self.calls > self.ok:
            return AWSResponse(request.url, 400, {"Content-Type": "text/xml"}, _Body(_error_xml(self.code, "injected")))
        return None


def _loop(executor, store, deltas, clock):
    return ControlLoop(groups=GROUPS, fleet=FleetSpec.from_vm_types(GROUPS), monitor=_Monitor(T0),
                       planner=_Planner(deltas), executor=executor, store=store, agent_name="audit",
                       warmup_s=0, cooldown_s=300, clock=lambda: clock["now"])


# --- a group moved the other way since the decision -------------------------------------------

def test_a_group_moved_away_from_the_target_is_not_stepped_further(moto, make_executor):
    """Decided -1 at 4 (target 3); an operator raised the group to 5 before the call. The
    absolute target terminated two instances, undoing the operator's +1; likewise +1 at 3
    with the group lowered to 1 launched three."""
    ex = make_executor()
    client = moto.client("autoscaling")
    terms = Sends(ex.client, "TerminateInstanceInAutoScalingGroup")
    sets = Sends(ex.client, "SetDesiredCapacity")
    client.set_desired_capacity(AutoScalingGroupName="samm-m5a-xlarge", DesiredCapacity=5)
    res = ex.apply(ScaleRequest("M", 3, "d1:M", basis=4))
    assert res.status == "skipped" and "moved from 4 to 5, away from the target 3" in res.detail["reason"]
    assert asg(moto, "samm-m5a-xlarge")["DesiredCapacity"] == 5 and terms.reached_server == 0
    client.set_desired_capacity(AutoScalingGroupName="samm-m5a-2xlarge", DesiredCapacity=1)
    res = ex.apply(ScaleRequest("L", 4, "d1:L", basis=3))
    assert res.status == "skipped" and "scale out" in res.detail["reason"]
    assert asg(moto, "samm-m5a-2xlarge")["DesiredCapacity"] == 1 and sets.reached_server == 0
    # between basis and target (our own partial progress) still proceeds
    res = ex.apply(ScaleRequest("M", 4, "d2:M", basis=6))
    assert res.status == "succeeded" and asg(moto, "samm-m5a-xlarge")["DesiredCapacity"] == 4


# --- deltas that are not whole numbers --------------------------------------------------------

def _status(name, desired):
    return GroupStatus(name, desired, 0, 10, tuple(Instance(name, f"i-{name}{k}", "running", T0 - 900)
                                                   for k in range(desired)))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, None, 1.5, -0.4, "two"])
def test_a_delta_that_is_not_a_whole_number_skips_its_group_only(bad):
    p = plan_scaling({"S": bad, "M": 1}, {"S": _status("S", 3), "M": _status("M", 1)}, GROUPS, {}, T0, "d1")
    assert [(r.group, r.target) for r in p.requests] == [("M", 2)]
    (skip,) = p.skipped
    assert (skip.group, skip.reason, skip.requested_delta) == ("S", "bad_delta", 0)
    assert "not a whole number" in skip.detail and repr(bad) in skip.detail


def test_huge_deltas_are_clamped_both_ways():
    inv = {"S": _status("S", 3), "M": _status("M", 3)}
    p = plan_scaling({"S": 10 ** 30, "M": -1e300}, inv, GROUPS, {}, T0, "d1")
    assert {r.group: r.target for r in p.requests} == {"S": 10, "M": 0}


def test_a_nan_delta_in_the_daemon_blocks_its_group_and_the_others_act(moto, make_executor, tmp_path):
    """plan_scaling raised on int(nan) after the decision was recorded: no group acted and
    nothing said why."""
    clock = {"now": T0 + 90}
    with KnowledgeStore(f"sqlite:///{tmp_path}/k.db", clock=lambda: clock["now"]) as store:
        rep = _loop(make_executor(), store, {"S": 1, "L": math.nan}, clock).run_once()
        assert {a["group"]: a["status"] for a in rep.actions} == {"S": "succeeded", "L": "blocked"}
        assert rep.blocked["L"].startswith("bad_delta: delta nan")
        assert asg(moto, "samm-m5a-large")["DesiredCapacity"] == 2
        assert asg(moto, "samm-m5a-2xlarge")["DesiredCapacity"] == 1
        assert {a.group_name: a.status for a in store.actions()} == {"S": "succeeded", "L": "blocked"}


# --- a no-change wish for a group the inventory lacks ----------------------------------------

def test_no_change_for_a_deleted_group_is_not_recorded_as_blocked(moto, make_executor, tmp_path):
    moto.client("autoscaling").delete_auto_scaling_group(AutoScalingGroupName="samm-m5a-xlarge", ForceDelete=True)
    clock = {"now": T0 + 90}
    with KnowledgeStore(f"sqlite:///{tmp_path}/k.db", clock=lambda: clock["now"]) as store:
        loop = _loop(make_executor(), store, {"S": 1, "M": 0}, clock)
        rep = loop.run_once()
        assert [a.group_name for a in store.actions()] == ["S"] and rep.blocked == {}
        # a wish that does ask something of it is still recorded as refused
        clock["now"] += 60
        loop.planner = _Planner({"M": 1})
        rep = loop.run_once()
        assert rep.blocked["M"].startswith("unknown_group")


# --- scale-in and instances protected from scale-in ------------------------------------------

def _protect(moto, name, ids):
    moto.client("autoscaling").set_instance_protection(InstanceIds=list(ids), AutoScalingGroupName=name,
                                                       ProtectedFromScaleIn=True)


def test_scale_in_never_terminates_an_instance_protected_from_scale_in(moto, make_executor):
    """TerminateInstanceInAutoScalingGroup ignores the protection (moto and AWS alike), so the
    guard chose the newest, protected instance and the executor terminated it."""
    ex = make_executor()
    assert ex.apply(ScaleRequest("M", 3, "d1:M")).status == "succeeded"
    ids = [i.instance_id for i in ex.inventory()["M"].instances]
    free, kept = ids[0], ids[1:]
    _protect(moto, "samm-m5a-xlarge", kept)
    inv = ex.inventory()
    assert {i.instance_id for i in inv["M"].instances if i.protected} == set(kept)
    plan = plan_scaling({"M": -2}, inv, GROUPS, {}, T0, "d2")
    (action,) = plan.actions
    assert action.request.victim == free and action.request.target == 2 and action.delta == -1
    assert any("protected from scale-in" in n for n in action.notes)
    res = ex.apply(action.request)
    assert res.status == "succeeded" and res.detail["terminated"] == [free]
    left = {i["InstanceId"] for i in asg(moto, "samm-m5a-xlarge")["Instances"]}
    assert left == set(kept)
    # all protected now: the guard skips, and a request naming a protected victim is refused
    plan = plan_scaling({"M": -1}, ex.inventory(), GROUPS, {}, T0, "d3")
    assert not plan.actions and plan.skipped[0].reason == "protected"
    terms = Sends(ex.client, "TerminateInstanceInAutoScalingGroup")
    res = ex.apply(ScaleRequest("M", 1, "d4:M", victim=kept[0], basis=2))
    assert res.status == "failed" and "protected from scale-in" in res.error and terms.attempts == 0
    assert res.detail["victim_protected"] == kept[0]
    assert asg(moto, "samm-m5a-xlarge")["DesiredCapacity"] == 2


# --- a failed terminate whose re-check fails too ---------------------------------------------

def test_a_failed_terminate_and_recheck_still_records_what_was_terminated(moto, make_executor):
    """Scale-in by 2: the first terminate lands, the second is throttled to the end and the
    re-check describe too. The result named the describe and dropped the terminated instance."""
    ex = make_executor(max_attempts=2)
    assert ex.apply(ScaleRequest("M", 3, "d1:M")).status == "succeeded"
    FailAfter(ex.client, "TerminateInstanceInAutoScalingGroup", ok=1)
    FailAfter(ex.client, "DescribeAutoScalingGroups", ok=1)
    res = ex.apply(ScaleRequest("M", 1, "d2:M", basis=3))
    assert res.status == "failed"
    assert res.error.startswith("TerminateInstanceInAutoScalingGroup failed after 2 attempt(s): Throttling")
    assert len(res.detail["terminated"]) == 1 and "DescribeAutoScalingGroups" in res.detail["recheck_error"]
    assert asg(moto, "samm-m5a-xlarge")["DesiredCapacity"] == 2


def test_a_scale_in_on_an_asg_deleted_mid_call_is_not_recorded_as_succeeded(moto, make_executor):
    """The re-check found no ASG, so no live victim, and counted the victim 'already gone':
    the record said succeeded, to 2, for a group that no longer exists."""
    ex = make_executor(max_attempts=2)
    assert ex.apply(ScaleRequest("M", 3, "d1:M")).status == "succeeded"
    other = moto.client("autoscaling")
    Sends(ex.client, "TerminateInstanceInAutoScalingGroup", side_effect=lambda: other.delete_auto_scaling_group(
        AutoScalingGroupName="samm-m5a-xlarge", ForceDelete=True))
    res = ex.apply(ScaleRequest("M", 2, "d2:M", basis=3))
    assert res.status == "failed" and "ASG samm-m5a-xlarge no longer exists" in res.error
    assert res.error.startswith("TerminateInstanceInAutoScalingGroup failed") and "to" not in res.detail
    assert res.detail["terminated"] == [] and "\n" not in res.error


# --- a region or endpoint botocore refuses ----------------------------------------------------

@pytest.mark.parametrize("kw, says", [
    ({"endpoint_url": "not a url"}, "http:// or https://"),
    ({"endpoint_url": "ftp://127.0.0.1:9"}, "http:// or https://"),
    ({"endpoint_url": "http://user:s3cret@[::1"}, "Invalid IPv6 URL"),
    ({"region": "us east 1"}, "doesn't match a supported format"),
])
def test_a_malformed_endpoint_or_region_is_a_configuration_problem(moto_server, kw, says):
    with pytest.raises(ValueError, match="executor aws-asg") as err:
        AwsAsgExecutor(GROUPS, session=moto_server.session(), **kw)
    assert says in str(err.value) and "s3cret" not in str(err.value) and "\n" not in str(err.value)


def test_a_missing_aws_profile_is_a_configuration_problem(monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_PROFILE", "no-such-profile")
    with pytest.raises(ValueError, match=r"profile \(no-such-profile\) could not be found"):
        AwsAsgExecutor(GROUPS)


def test_samm_run_with_a_malformed_endpoint_says_so_in_one_line(tmp_path):
    """It was a traceback (botocore's ValueError) instead of 'cannot start: ...'."""
    from samm.cli.main import cli

    cfg = tmp_path / "samm.yaml"
    cfg.write_text("groups:\n" + "".join(
        f"  - {{name: {g.name}, cores: {g.cores}, ram_gb: {g.ram_gb}, price_per_hour: {g.price_per_hour}, "
        f"min: {g.min}, max: {g.max}, asg_name: {g.asg_name}}}\n" for g in GROUPS)
        + "agent: {name: noop}\nexecutor: {kind: aws-asg, endpoint_url: 'localhost:5000'}\n"
        + f"knowledge: {{url: 'sqlite:///{tmp_path}/k.db'}}\n")
    out = CliRunner().invoke(cli, ["run", "--config", str(cfg), "--iterations", "1"])
    assert out.exit_code == 2, out.output
    assert ("cannot start: executor aws-asg: cannot set up the AWS client (region 'us-east-1', endpoint_url "
            "'localhost:5000'): it must start with http:// or https://") in out.output
    assert "Traceback" not in out.output


def test_make_executor_names_a_bad_aws_setting_as_a_configuration_problem(tmp_path):
    """The executor raises a plain ValueError (execute does not import the daemon); the daemon's
    builder is where it becomes a configuration problem."""
    from samm.config import load_config
    from samm.daemon.build import make_executor

    cfg = tmp_path / "samm.yaml"
    cfg.write_text("groups:\n  - {name: S, cores: 1, ram_gb: 1, price_per_hour: 0.1, min: 0, max: 2, asg_name: s}\n"
            "agent: {name: noop}\nexecutor: {kind: aws-asg, region: 'us east 1'}\n")
    lp = load_config(cfg).control_loops()[0]
    with pytest.raises(ConfigurationProblem, match="executor aws-asg: cannot set up the AWS client"):
        make_executor(lp)
