"""Executor for AWS EC2 Auto Scaling Groups: one managed group per ASG (`GroupConfig.asg_name`).

Scale-out raises DesiredCapacity (`HonorCooldown=False`: cool-down and warm-up are the guard's,
as in cluster-autoscaler and escalator); scale-in terminates a named instance with
`ShouldDecrementDesiredCapacity=True`, so AWS does not pick one by its own termination policy.
Requests carry an absolute target, so a replay finds the target met and changes nothing.

Every AWS call goes through `_call`: logged, with botocore's standard retry mode (throttling,
5xx and connection errors retried with back-off, at most `max_attempts` attempts in all) and
explicit time-outs. `apply` never raises: failures become an ActionResult naming the call and
the AWS error code. One that certainly changed nothing (the DescribeAutoScalingGroups opening
every request failed, or AWS rejected the change on its only attempt: a ValidationError, missing
permissions) has `may_have_acted` false and starts no cool-down. `inventory` raises
`ExecutorError` (the daemon skips that cycle).
"""
from __future__ import annotations

import logging
import time
from datetime import datetime
from typing import Any, Iterable, Sequence
from urllib.parse import urlsplit

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, ParamValidationError
from botocore import xform_name
from botocore.parsers import ResponseParserError

from samm.config import GroupConfig, SammConfig
from samm.execute.base import (ActionResult, Executor, ExecutorError, GroupStatus, Instance,
                               InstanceState, ScaleRequest, moved_past, refused)
from samm.execute.guard import choose_victims

log = logging.getLogger(__name__)

# ASG lifecycle states -> ours. Standby/EnteringStandby/Warmed:* instances serve nothing and
# are not part of the capacity the guard reasons about, so they are left out.
_LIFECYCLE: dict[str, InstanceState] = {
    "Pending": "pending", "Pending:Wait": "pending", "Pending:Proceed": "pending",
    "InService": "running",
    "Terminating": "terminating", "Terminating:Wait": "terminating", "Terminating:Proceed": "terminating",
    "Terminated": "terminating", "Detaching": "terminating", "Detached": "terminating",
}
_EC2_IDS_PER_CALL = 100
_MAX_ERROR_TEXT = 300


class AwsCallError(Exception):
    """One AWS call failed after botocore's retries. `rejected`: it certainly changed nothing, as
    AWS refused its one and only attempt (a 4xx: ValidationError, AccessDenied, Throttling) or
    botocore refused it before sending; after a retry an earlier attempt may have acted unseen
    (a time-out), and a 5xx may have been half done."""

    def __init__(self, api: str, code: str, message: str, attempts: int | None = None, rejected: bool = False):
        self.api, self.code, self.message, self.attempts, self.rejected = api, code, message, attempts, rejected
        tries = f" after {attempts} attempt(s)" if attempts else ""
        super().__init__(f"{api} failed{tries}: {code}: {message}")


class AwsAsgExecutor(Executor):
    kind = "aws-asg"

    def __init__(self, groups: Sequence[GroupConfig], region: str = "us-east-1", endpoint_url: str | None = None,
                 max_attempts: int = 5, connect_timeout: float = 5.0, read_timeout: float = 20.0,
                 session: boto3.Session | None = None, client: Any = None, ec2_client: Any = None,
                 launch_times: bool = True):
        missing = [g.name for g in groups if not g.asg_name]
        if missing:
            raise ValueError(f"aws-asg executor: groups {missing} have no asg_name")
        asgs = [g.asg_name for g in groups]
        shared = sorted({a for a in asgs if asgs.count(a) > 1})
        if shared:
            raise ValueError(f"aws-asg executor: ASGs {shared} are named by more than one group")
        self.groups = {g.name: g for g in groups}
        self._group_of_asg = {g.asg_name: g.name for g in groups}
        self.region = region
        self.launch_times = launch_times
        config = Config(retries={"mode": "standard", "total_max_attempts": max_attempts},
                        connect_timeout=connect_timeout, read_timeout=read_timeout)
        try:
            if endpoint_url and urlsplit(endpoint_url).scheme.lower() not in ("http", "https"):
                # botocore accepts ftp://x here and then fails every call of every iteration
                raise ValueError("it must start with http:// or https://")
            session = session or boto3.Session(region_name=region)
            self.client = client or session.client("autoscaling", region_name=region, endpoint_url=endpoint_url,
                                                   config=config)
            self.ec2 = ec2_client
            if self.ec2 is None and launch_times:
                self.ec2 = session.client("ec2", region_name=region, endpoint_url=endpoint_url, config=config)
        except (ValueError, BotoCoreError) as exc:  # a malformed endpoint_url or region, a missing profile
            raise _bad_setting(region, endpoint_url, exc) from None
        self._ec2_warned = False
        # A launch time never changes, so EC2 is asked only about instances not seen before;
        # asking about every instance on every inventory cost ~78 % of an iteration at 1,000.
        self._known_launch: dict[str, float] = {}

    @classmethod
    def from_config(cls, config: SammConfig, **kw) -> "AwsAsgExecutor":
        ex = config.executor
        return cls(config.groups, region=ex.region, endpoint_url=ex.endpoint_url, max_attempts=ex.max_attempts, **kw)

    # -- AWS calls -----------------------------------------------------------------------------
    def _call(self, api: str, client: Any = None, **params) -> dict:
        client = client or self.client
        mutating = not _read_only(api)
        started = time.monotonic()
        try:
            out = getattr(client, xform_name(api))(**params)
        except ClientError as exc:
            err, meta = exc.response.get("Error", {}), exc.response.get("ResponseMetadata", {})
            attempts = meta.get("RetryAttempts")
            status = meta.get("HTTPStatusCode")
            fail = AwsCallError(api, err.get("Code", "Unknown"), err.get("Message", str(exc))[:_MAX_ERROR_TEXT],
                                None if attempts is None else attempts + 1,
                                rejected=attempts == 0 and isinstance(status, int) and 400 <= status < 500)
        except (BotoCoreError, ResponseParserError) as exc:
            # Connection errors, time-outs, and unparseable error bodies (moto's HTML HTTP 500;
            # ResponseParserError is not a BotoCoreError).
            fail = AwsCallError(api, type(exc).__name__, str(exc).splitlines()[0][:_MAX_ERROR_TEXT],
                                rejected=isinstance(exc, ParamValidationError))
        else:
            attempts = _attempts(out)
            log.log(logging.INFO if mutating else logging.DEBUG, "aws %s %s -> ok in %.2f s (%d attempt(s))",
                    api, _brief(params), time.monotonic() - started, attempts)
            return out
        log.warning("aws %s %s -> %s (%.2f s)", api, _brief(params), fail, time.monotonic() - started)
        raise fail

    def _describe(self, asg_names: Iterable[str]) -> dict[str, dict]:
        found: dict[str, dict] = {}
        params: dict[str, Any] = {"AutoScalingGroupNames": list(asg_names)}
        while True:
            page = self._call("DescribeAutoScalingGroups", **params)
            for g in page.get("AutoScalingGroups", []):
                found[g["AutoScalingGroupName"]] = g
            if not page.get("NextToken"):
                return found
            params["NextToken"] = page["NextToken"]

    def _launch_times(self, instance_ids: list[str]) -> dict[str, float]:
        """Launch times from EC2, cached per instance id; best effort: without
        ec2:DescribeInstances (or when an instance vanished between the two calls) times are
        unknown, which only weakens victim choice. Unknown ids are asked again next time."""
        if not self.launch_times or self.ec2 is None or not instance_ids:
            return {}
        unseen = [i for i in dict.fromkeys(instance_ids) if i not in self._known_launch]
        for i in range(0, len(unseen), _EC2_IDS_PER_CALL):
            chunk = unseen[i:i + _EC2_IDS_PER_CALL]
            try:
                out = self._call("DescribeInstances", client=self.ec2, InstanceIds=chunk)
            except AwsCallError as exc:
                if not self._ec2_warned:
                    log.warning("launch times unknown (%s); victims are chosen without them", exc)
                    self._ec2_warned = True
                continue
            for res in out.get("Reservations", []):
                for inst in res.get("Instances", []):
                    if isinstance(inst.get("LaunchTime"), datetime):
                        self._known_launch[inst["InstanceId"]] = inst["LaunchTime"].timestamp()
        return {i: self._known_launch[i] for i in instance_ids if i in self._known_launch}

    def _forget_launch_times(self, live_ids: Iterable[str]) -> None:
        """Drop cached times of instances that left every managed group (bounded memory)."""
        live = set(live_ids)
        for gone in [i for i in self._known_launch if i not in live]:
            del self._known_launch[gone]

    def _status(self, group: str, asg: dict, times: dict[str, float]) -> GroupStatus:
        instances = []
        for inst in asg.get("Instances", []):
            state = _LIFECYCLE.get(inst.get("LifecycleState", ""))
            if state is None:
                log.debug("ASG %s: instance %s in %s left out", asg["AutoScalingGroupName"], inst.get("InstanceId"),
                          inst.get("LifecycleState"))
                continue
            instances.append(Instance(group, inst["InstanceId"], state, times.get(inst["InstanceId"]),
                                      protected=bool(inst.get("ProtectedFromScaleIn"))))
        return GroupStatus(group, int(asg["DesiredCapacity"]), int(asg["MinSize"]), int(asg["MaxSize"]),
                           tuple(instances))

    # -- the Executor contract -----------------------------------------------------------------
    def inventory(self) -> dict[str, GroupStatus]:
        """Every managed group that exists; a missing ASG is logged and left out (the guard then
        reports the group as unknown)."""
        try:
            asgs = self._describe(self._group_of_asg)
            ids = [i["InstanceId"] for a in asgs.values() for i in a.get("Instances", [])]
            self._forget_launch_times(ids)
            times = self._launch_times(ids)
        except AwsCallError as exc:
            raise ExecutorError(str(exc)) from None
        for name in self._group_of_asg:
            if name not in asgs:
                log.warning("ASG %s (group %s) not found in %s", name, self._group_of_asg[name], self.region)
        return {self._group_of_asg[n]: self._status(self._group_of_asg[n], a, times) for n, a in asgs.items()}

    def apply(self, request: ScaleRequest) -> ActionResult:
        detail: dict[str, Any] = {"group": request.group, "target": request.target,
                                  "idempotency_key": request.idempotency_key}
        try:
            return self._apply(request, detail)
        except AwsCallError as exc:
            # Nothing was applied, so no cool-down is due (`base.refused`), when the call that
            # failed only read (the opening Describe: throttled, denied, unreachable) or AWS
            # rejected a Set/Terminate outright, and no earlier terminate of this request acted.
            nothing = (_read_only(exc.api) or exc.rejected) and not detail.get("terminated")
            return ActionResult("failed", detail, str(exc), may_have_acted=not nothing)
        except Exception as exc:  # never let one request take the control loop down
            log.exception("apply %s failed unexpectedly", request)
            return ActionResult("failed", detail, f"unexpected {type(exc).__name__}: {exc}")

    def _apply(self, req: ScaleRequest, detail: dict) -> ActionResult:
        cfg = self.groups.get(req.group)
        if cfg is None:
            return refused(detail, f"group {req.group!r} is not managed by this executor")
        name = cfg.asg_name
        detail["asg"] = name
        asg = self._describe([name]).get(name)
        if asg is None:
            return refused(detail, f"DescribeAutoScalingGroups: ASG {name!r} not found in {self.region}")
        desired, lo, hi = int(asg["DesiredCapacity"]), int(asg["MinSize"]), int(asg["MaxSize"])
        detail["from"] = desired
        # moto accepts any desired capacity; real AWS answers ValidationError. Refuse it here
        # either way, before any call that changes something.
        if not lo <= req.target <= hi:
            which = f"MaxSize {hi}" if req.target > hi else f"MinSize {lo}"
            return refused(detail, f"target {req.target} is outside ASG {name} bounds [{lo}, {hi}] ({which}); refused")
        if desired == req.target:
            detail["reason"] = "already at target"
            return ActionResult("skipped", detail)
        stale = moved_past(req, desired)
        if stale:
            detail["reason"] = stale
            return ActionResult("skipped", detail)

        if desired < req.target:
            out = self._call("SetDesiredCapacity", AutoScalingGroupName=name, DesiredCapacity=req.target,
                             HonorCooldown=False)
            detail["attempts"] = _attempts(out)  # > 1: botocore retried throttling/5xx
            detail["to"] = req.target
            return ActionResult("succeeded", detail)

        status = self._status(req.group, asg, self._launch_times([i["InstanceId"] for i in asg.get("Instances", [])]))
        live = {i.instance_id for i in status.instances if i.state != "terminating"}
        # TerminateInstanceInAutoScalingGroup ignores scale-in protection; SAMM's scale-in must not
        removable = {i.instance_id for i in status.instances if i.state != "terminating" and not i.protected}
        needed = desired - req.target
        victims: list[str] = []
        if req.victim is not None:
            if req.victim in removable:
                victims.append(req.victim)
            elif req.victim in live:
                detail["victim_protected"] = req.victim
            else:
                # The capacity has not dropped yet (desired > target), so the decision still
                # stands: remove another instance rather than none.
                detail["victim_gone"] = req.victim
        victims += choose_victims(status, needed - len(victims), exclude=victims)
        if len(victims) < needed:
            protected = len(live) - len(removable)
            return refused(detail, f"ASG {name}: desired {desired} but only {len(removable)} live instance(s) that "
                                   f"may be removed ({protected} protected from scale-in); cannot remove {needed}")
        terminated, gone = [], []
        detail["attempts"] = 0
        for victim in victims:
            try:
                out = self._call("TerminateInstanceInAutoScalingGroup", InstanceId=victim,
                                 ShouldDecrementDesiredCapacity=True)
                detail["attempts"] += _attempts(out)
                terminated.append(victim)
            except AwsCallError as failed:
                # A victim that vanished between the describe and the call (health replacement,
                # spot interruption, a concurrent replay) counts as done; anything else fails.
                try:
                    again = self._describe([name]).get(name)
                except AwsCallError as recheck:
                    # unknown whether it went: the terminate's own error is the one to report,
                    # with the instances already terminated (they did act)
                    detail.update(terminated=terminated, recheck_error=str(recheck))
                    raise failed from None
                if again is None:  # the ASG was deleted meanwhile: not a scale-in that succeeded
                    detail.update(terminated=terminated)
                    raise AwsCallError(failed.api, failed.code, f"ASG {name} no longer exists; {failed.message}",
                                       failed.attempts) from None
                still = {i["InstanceId"] for i in again.get("Instances", [])
                         if _LIFECYCLE.get(i.get("LifecycleState", "")) in ("pending", "running")}
                if victim in still:
                    detail.update(terminated=terminated)
                    raise
                gone.append(victim)
        detail.update(terminated=terminated, to=req.target)
        if gone:
            detail["already_gone"] = gone
        return ActionResult("succeeded", detail)

    def close(self) -> None:
        for c in (self.client, self.ec2):
            if c is not None and hasattr(c, "close"):
                c.close()


def _read_only(api: str) -> bool:
    """Whether an AWS call only reads (the same test `_call` logs mutating calls by)."""
    return api.startswith("Describe")


def _attempts(out: dict) -> int:
    return int(out.get("ResponseMetadata", {}).get("RetryAttempts", 0)) + 1


def _brief(params: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items() if k != "NextToken")


def _bad_setting(region: str, endpoint_url: str | None, exc: Exception) -> ValueError:
    """botocore's refusal of the executor's region or endpoint_url, in one line naming both
    (`make_executor` turns it into a configuration problem: `samm run` prints "cannot start: ..."
    instead of a traceback). The endpoint's password (if any) is masked, also where botocore's
    message repeats the URL."""
    from samm.config import url_without_password

    shown = url_without_password(endpoint_url) if endpoint_url else None
    why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if endpoint_url:
        why = why.replace(endpoint_url, shown)
    return ValueError(f"executor aws-asg: cannot set up the AWS client (region {region!r}, "
                      f"endpoint_url {shown!r}): {why}")
