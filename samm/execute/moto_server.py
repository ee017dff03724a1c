"""A local stand-in for AWS: moto's real HTTP server on loopback, and the paper's three Auto
Scaling Groups created through the same API calls a user makes on real AWS.

Used by the AWS executor's tests and by `samm testbed`. moto has no timing semantics (every
instance is InService at once, cool-downs are not enforced, desired capacity outside
[Min, Max] is accepted), which is why the guard and the executor check those themselves.
"""
from __future__ import annotations

import builtins
import logging
from dataclasses import dataclass
from typing import Sequence

import boto3
import requests

log = logging.getLogger(__name__)

DUMMY_CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
PAPER_ASG_NAMES = ("samm-m5a-large", "samm-m5a-xlarge", "samm-m5a-2xlarge")
PAPER_INSTANCE_TYPES = ("m5a.large", "m5a.xlarge", "m5a.2xlarge")


class MotoServer:
    """`with MotoServer() as m: boto3.client(..., endpoint_url=m.endpoint_url)`.

    Binds an ephemeral port on 127.0.0.1 (moto's default is 0.0.0.0: never expose it). The
    server runs in a thread of this process and holds moto's process-global state, so one
    server per process; `reset()` empties it between tests.
    """

    def __init__(self, region: str = "us-east-1", quiet: bool = True):
        self.region = region
        self.quiet = quiet
        self._server = None
        self._session: boto3.Session | None = None
        self.endpoint_url: str | None = None

    def start(self) -> "MotoServer":
        from moto.server import ThreadedMotoServer

        if self.quiet:
            # werkzeug logs every request and moto's intentional HTTP 500s with tracebacks.
            logging.getLogger("werkzeug").setLevel(logging.ERROR + 10)
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=not self.quiet)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint_url = f"http://{host}:{port}"
        log.info("moto server on %s", self.endpoint_url)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def reset(self) -> None:
        """Forget every resource (moto's `POST /moto-api/reset`)."""
        r = requests.post(f"{self.endpoint_url}/moto-api/reset", timeout=10)
        r.raise_for_status()

    def session(self) -> boto3.Session:
        """A boto3 session with dummy credentials, so nothing from ~/.aws or the environment
        can point a test at a real account. Shared, because each new session parses the large
        EC2 service model again (~0.3 s); not for use from several threads."""
        if self._session is None:
            self._session = boto3.Session(region_name=self.region, **DUMMY_CREDENTIALS)
        return self._session

    def client(self, service: str, **kw):
        return self.session().client(service, endpoint_url=self.endpoint_url, **kw)

    def __enter__(self) -> "MotoServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@dataclass(frozen=True)
class PaperAsgs:
    """What `create_paper_asgs` made."""

    names: tuple[str, ...]
    instance_types: tuple[str, ...]
    launch_template_id: str
    subnet_ids: tuple[str, ...]


def _per_group(value: int | Sequence[int], n: int, what: str) -> list[int]:
    if isinstance(value, int):
        return [value] * n
    values = list(value)
    if len(values) != n:
        raise ValueError(f"{what}: need one value per group ({n}), got {values}")
    return values


def create_paper_asgs(session: boto3.Session | None = None, endpoint_url: str | None = None, *,
                      names: Sequence[str] = PAPER_ASG_NAMES,
                      instance_types: Sequence[str] = PAPER_INSTANCE_TYPES,
                      min: int | Sequence[int] = (1, 0, 0), max: int | Sequence[int] = 10,
                      desired: int | Sequence[int] = 1, image_id: str | None = None,
                      launch_template_name: str = "samm-worker", large_subnets: bool = False) -> PaperAsgs:
    """The paper's set-up: one launch template with a version per instance type, and one ASG per
    type in the default VPC's subnets (a VPC and a subnet are created where there is none).
    `min`/`max`/`desired` take one value for all groups or one per group (they shadow the
    builtins here, hence `builtins.max` below). `large_subnets` gives every group its own /18 subnet
    in a new /16 VPC: moto fills an ASG's first subnet only, and a default subnet (/20) holds
    about 4,000 instances."""
    names, instance_types = tuple(names), tuple(instance_types)
    if len(names) != len(instance_types):
        raise ValueError(f"need one instance type per ASG: names {names}, types {instance_types}")
    n = len(names)
    mins, maxs, desireds = (_per_group(min, n, "min"), _per_group(max, n, "max"),
                            _per_group(desired, n, "desired"))
    for name, lo, hi, d in zip(names, mins, maxs, desireds):
        if not lo <= d <= hi:
            raise ValueError(f"ASG {name}: need min <= desired <= max, got {lo} <= {d} <= {hi}")

    session = session or boto3.Session(region_name="us-east-1", **DUMMY_CREDENTIALS)
    ec2 = session.client("ec2", endpoint_url=endpoint_url)
    asg = session.client("autoscaling", endpoint_url=endpoint_url)

    subnets = ec2.describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]}])["Subnets"]
    group_subnets: list[tuple[str, ...]] | None = None
    if large_subnets:
        vpc = ec2.create_vpc(CidrBlock="10.64.0.0/16")["Vpc"]["VpcId"]
        zone = ec2.describe_availability_zones()["AvailabilityZones"][0]["ZoneName"]
        group_subnets = [(ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.64.{64 * k}.0/18", AvailabilityZone=zone)
                          ["Subnet"]["SubnetId"],) for k in range(n)]
        subnet_ids = tuple(s for g in group_subnets for s in g)
    elif subnets:
        subnet_ids = tuple(s["SubnetId"] for s in subnets)
    else:
        vpc = ec2.create_vpc(CidrBlock="10.42.0.0/16")["Vpc"]["VpcId"]
        zone = ec2.describe_availability_zones()["AvailabilityZones"][0]["ZoneName"]
        subnet_ids = (ec2.create_subnet(VpcId=vpc, CidrBlock="10.42.1.0/24", AvailabilityZone=zone)
                      ["Subnet"]["SubnetId"],)

    if image_id is None:
        images = ec2.describe_images(Owners=["amazon"], Filters=[
            {"Name": "name", "Values": ["amzn2-ami-hvm-*-x86_64-gp2"]}])["Images"]
        if not images:
            raise RuntimeError("no Amazon Linux 2 image found; pass image_id")
        image_id = builtins.max(images, key=lambda i: (i.get("CreationDate", ""), i["Name"]))["ImageId"]

    lt = ec2.create_launch_template(LaunchTemplateName=launch_template_name,
                                    LaunchTemplateData={"ImageId": image_id, "InstanceType": instance_types[0]})
    lt_id = lt["LaunchTemplate"]["LaunchTemplateId"]
    versions = ["1"]
    for itype in instance_types[1:]:
        v = ec2.create_launch_template_version(LaunchTemplateId=lt_id, SourceVersion="1",
                                               LaunchTemplateData={"InstanceType": itype})
        versions.append(str(v["LaunchTemplateVersion"]["VersionNumber"]))

    for k, (name, version, lo, hi, d) in enumerate(zip(names, versions, mins, maxs, desireds)):
        asg.create_auto_scaling_group(
            AutoScalingGroupName=name, MinSize=lo, MaxSize=hi, DesiredCapacity=d,
            LaunchTemplate={"LaunchTemplateId": lt_id, "Version": version},
            VPCZoneIdentifier=",".join(group_subnets[k] if group_subnets else subnet_ids),
            Tags=[{"Key": "samm:managed", "Value": "true", "PropagateAtLaunch": True}])
        log.info("created ASG %s (%s..%s, desired %s, template %s v%s)", name, lo, hi, d, lt_id, version)
    return PaperAsgs(names, instance_types, lt_id, subnet_ids)
