"""The daemon's configuration: one pydantic model loaded from YAML, with `SAMM_...` environment
overrides. Unknown keys are rejected with the key's name and its line in the file; secrets are
`SecretStr` and never printed.

Environment overrides use `__` between levels: `SAMM_SERVICE__PORT=9000`,
`SAMM_KNOWLEDGE__URL=postgresql://...`, `SAMM_SERVICE__TOKEN=...`. Values are parsed as YAML
scalars (so `true`, `3`, `1.5` get their types). They reach mapping keys only: not the entries of
`loops:`, a list.
"""
from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (BaseModel, ConfigDict, Field, SecretStr, SerializationInfo, ValidationError, field_serializer,
                      field_validator, model_validator)

ENV_PREFIX = "SAMM_"


class Strict(BaseModel):
    # an infinite or NaN duration, port or size passes `gt=0` and only fails later, in the scheduler
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


#: The longest interval, grace or lateness: APScheduler and the first-run arithmetic overflow on
#: larger ones, and no control loop waits a week between decisions
MAX_PERIOD_S = 7 * 86_400.0

#: The largest group size: AWS takes an ASG's sizes, and the simulator its VM types, as 32-bit
#: integers; a larger one passed `samm config check` and then stopped `samm run` with an
#: OverflowError traceback (NumPy's int64 fleet arrays, or the JVM)
MAX_GROUP_SIZE = 2**31 - 1
#: The most cores of one VM: far beyond any machine, and small enough that the fleet's core
#: capacity, Σ cores × max over the groups in int64, cannot wrap round to a negative number
MAX_VM_CORES = 2**20


# "scheme://user:PASSWORD@": up to the last "@", since a password may hold a raw "@" itself
_URL_PASSWORD = re.compile(r"^([\w+.-]+://[^:/@]*:)(.*)@")
# libpq also takes a password (and a client key's passphrase) as query parameters
_QUERY_PASSWORD = re.compile(r"([?&](?:password|sslpassword)=)[^&#]*", re.IGNORECASE)


def http_url_problem(url: str) -> str | None:
    """Why `url` cannot be an http(s) server's address (None: it can be tried). Without a scheme
    or a host ("graphite.internal:8080", written like carbon's HOST:PORT) `samm config check`
    passed it and every request of `samm run` failed: each snapshot stale, each decision the
    fallback, the daemon running and never acting. The URL itself is not repeated (a password)."""
    try:
        parts = urlsplit(url)
        if parts.scheme in ("http", "https") and parts.hostname:
            parts.port  # noqa: B018 - raises ValueError for a port that is not 0..65535
            return None
    except ValueError:  # an unclosed IPv6 bracket, a bad port
        pass
    return "must be an http(s)://HOST[:PORT] URL"


def _http_url(url: str | None) -> str | None:
    if url is not None and (problem := http_url_problem(url)):
        raise ValueError(problem)
    return url


def url_without_password(url: str) -> str:
    """The URL with its passwords (user info, `?password=`, `?sslpassword=`) as ***, everything
    else as written."""
    return _QUERY_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"\1***@", url, count=1))


def _masked_url(self, url: str | None, info: SerializationInfo) -> str | None:
    """A URL field's JSON form: `samm config check` prints the JSON dump and promises secrets
    masked, so a password in a URL is ***; a dump that is to be loaded again as a config asks
    for it with context={"secrets": "keep"}."""
    if url is None or (info.context or {}).get("secrets") == "keep":
        return url
    return url_without_password(url)


#: the labels by which the docker executor finds each group's containers (samm/execute/docker_exec.py)
DOCKER_LABELS_OF_SAMM = ("samm.namespace", "samm.group", "samm.request")


class GroupConfig(Strict):
    """One managed resource group (a VM type)."""

    # at most 50: an action's key "<loop>/<window end>:<group>" must fit the store's 128
    # characters with a 63-character loop name (PostgreSQL refuses a longer one; SQLite does not)
    name: str = Field(min_length=1, max_length=50, pattern=r"^[A-Za-z0-9_-]+$")
    cores: int = Field(ge=1, le=MAX_VM_CORES)
    ram_gb: float = Field(gt=0)
    price_per_hour: float = Field(ge=0)
    min: int = Field(ge=0, le=MAX_GROUP_SIZE)
    max: int = Field(ge=1, le=MAX_GROUP_SIZE)
    asg_name: str | None = Field(default=None, description="AWS Auto Scaling Group (executor aws-asg)")
    docker_image: str | None = Field(default=None, description="image of the group's containers (executor docker)")
    docker_label: str | None = None

    @model_validator(mode="after")
    def _bounds(self) -> "GroupConfig":
        if self.min > self.max:
            raise ValueError(f"group {self.name!r}: min {self.min} > max {self.max}")
        return self

    @model_validator(mode="after")
    def _docker_label(self) -> "GroupConfig":
        key = (self.docker_label or "").partition("=")[0].strip()
        if key in DOCKER_LABELS_OF_SAMM:
            # the docker executor finds a group's containers by these: its own containers then
            # belonged to another group (or to none), and every iteration started more
            raise ValueError(f"group {self.name!r}: docker_label {self.docker_label!r} would replace SAMM's own "
                             f"label {key!r}; choose another key")
        return self


class GraphiteConfig(Strict):
    render_url: str = "http://127.0.0.1:8080"
    carbon_host: str = "127.0.0.1"
    carbon_port: int = Field(default=2003, ge=1, le=65535)
    prefix: str = Field(default="samm", pattern=r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")
    # a socket timeout beyond ~9.2e9 s overflows (OverflowError on every read: a daemon that never sees a metric)
    timeout_s: float = Field(default=5.0, gt=0, le=MAX_PERIOD_S)
    lateness_s: float = Field(default=5.0, ge=0, le=MAX_PERIOD_S, description="wait this long after an interval ends before reading it")
    publish: bool = Field(default=True, description="publish SAMM's own metrics, decisions and events")

    _render_url_masked = field_serializer("render_url", when_used="json")(_masked_url)
    _render_url_http = field_validator("render_url")(_http_url)

    @field_validator("carbon_host")
    @classmethod
    def _bare_host(cls, host: str) -> str:
        # "graphite.internal:2003" (the collector's SAMM_GRAPHITE form) or a URL passed the check,
        # and every point the daemon published was dropped ("carbon ...:2003:2003 unreachable")
        try:
            ipaddress.ip_address(host)  # an IPv6 address holds colons of its own
            return host
        except ValueError:
            pass
        if not host or re.search(r"[:/\s\[\]]", host):
            raise ValueError("must be a host name or address alone (the port is graphite.carbon_port)")
        return host


class AgentConfig(Strict):
    name: str = "lstm-ppo"
    policy_dir: str | None = None
    params: dict = Field(default_factory=dict)
    mode: Literal["in-process", "http"] = "in-process"
    service_url: str | None = None
    fallback: Literal["noop"] = "noop"

    _service_url_masked = field_serializer("service_url", when_used="json")(_masked_url)
    _service_url_http = field_validator("service_url")(_http_url)

    @model_validator(mode="after")
    def _http(self) -> "AgentConfig":
        if self.mode == "http" and not self.service_url:
            raise ValueError("agent.mode 'http' needs agent.service_url")
        return self


class ExecutorConfig(Strict):
    kind: Literal["aws-asg", "docker", "sim"] = "sim"
    dry_run: bool = False
    region: str = "us-east-1"
    endpoint_url: str | None = None
    # botocore's standard retry mode waits up to 20 s between attempts: 20 attempts can already hold
    # one API call for about six minutes, longer than any interval; 10**20 retried without end
    max_attempts: int = Field(default=5, ge=1, le=20)

    _endpoint_url_masked = field_serializer("endpoint_url", when_used="json")(_masked_url)


class TimingConfig(Strict):
    interval_s: float = Field(default=60.0, gt=0, le=MAX_PERIOD_S)
    # bounded as the intervals are: an infinite warm-up measured no VM ever, so every CPU and RAM
    # metric read 0, an idle fleet a rule scales in; an infinite cool-down acted once, then never
    warmup_s: float = Field(default=120.0, ge=0, le=MAX_PERIOD_S)
    cooldown_s: float = Field(default=300.0, ge=0, le=MAX_PERIOD_S)
    misfire_grace_s: float = Field(default=30.0, ge=0, le=MAX_PERIOD_S)


class SimulationConfig(Strict):
    """The managed system when `executor.kind` is `sim`: a CloudSim Plus simulation."""

    workload: str = "seed-1551"
    # the simulator's seed space (`samm sim run --seed`): a larger seed overflowed its int64 and
    # every iteration's monitor failed, a daemon that ran and never decided
    seed: int = Field(default=1, ge=0, le=2**62 - 1)
    initial: dict[str, int] = Field(default_factory=dict, description="VMs per group at the start (default: 1 each, within min..max, as in the paper)")
    host_mips: float = Field(default=4400.0, gt=0)
    max_iterations: int | None = Field(default=None, ge=1, description="stop after this many iterations")


class KnowledgeConfig(Strict):
    url: str = "sqlite:///samm.db"
    # unbounded by default, as before: an operator chooses how much history to keep
    retention_days: float | None = Field(default=None, ge=1, le=36_500, description=(
        "Delete snapshots, observations, decisions and actions older than this many days; the "
        "daemon prunes once an hour (`samm knowledge prune` does it by hand). Cool-downs, leases "
        "and policy versions are never pruned. Default: keep everything."))

    _url_masked = field_serializer("url", when_used="json")(_masked_url)


def _check_database_url(url: str) -> None:
    """The store's own parse, at the check: "samm.db" or mysql://... passed `samm config check`
    and stopped `samm run` at start. Its message never holds the password."""
    from samm.knowledge.engine import KnowledgeError, normalize_url

    try:
        normalize_url(url)
    except KnowledgeError as exc:
        raise ValueError(str(exc)) from None


class HaConfig(Strict):
    """Standby daemons (samm/daemon/leadership.py): several `samm run` against one PostgreSQL,
    exactly one acting at a time."""
    enabled: bool = False
    # bounded as the intervals are: a larger one overflowed the lease keeper's wait (a traceback at start)
    lease_ttl_s: float | None = Field(default=None, gt=0, le=MAX_PERIOD_S, description="Lease length; default 0.75 × the "
                                      "shortest loop interval, at least 1.5 s (a standby leads within two "
                                      "intervals)")
    holder: str | None = Field(default=None, min_length=1, max_length=200,
                               description="This daemon's name in the lease, to which @host:pid is appended "
                                           "(two daemons given one name must not both lead); default host:pid")


class ServiceConfig(Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    token: SecretStr | None = None
    session_ttl_s: float = Field(default=3600.0, gt=0)
    max_sessions: int = Field(default=10_000, ge=1)


def _check_groups(groups: list[GroupConfig], executor: ExecutorConfig, where: str = "") -> None:
    names = [g.name for g in groups]
    if len(set(names)) != len(names):
        raise ValueError(f"{where}group names must be unique, got {names}")
    if executor.kind == "aws-asg":
        missing = [g.name for g in groups if not g.asg_name]
        if missing:
            raise ValueError(f"{where}executor aws-asg needs asg_name for groups {missing}")
    if executor.kind == "docker":
        missing = [g.name for g in groups if not g.docker_image]
        if missing:
            raise ValueError(f"{where}executor docker needs docker_image for groups {missing}")


def _check_simulation(groups: list[GroupConfig], executor: ExecutorConfig, simulation: SimulationConfig,
                      where: str = "") -> None:
    """With `executor.kind: sim` the groups become the simulator's VM types: its rules are checked
    here, or `samm config check` passed a config on which `samm run` stopped with a traceback."""
    if executor.kind != "sim":
        return
    names = [g.name for g in groups]
    unknown = sorted(set(simulation.initial) - set(names))
    if unknown:  # a misspelt group silently started at the default count
        raise ValueError(f"{where}simulation.initial names no group: {unknown} (groups: {names})")
    for g in groups:
        n = simulation.initial.get(g.name)
        if n is not None and not g.min <= n <= g.max:
            raise ValueError(f"{where}simulation.initial.{g.name}: {n} is outside the group's min..max ({g.min}..{g.max})")
    from sim_bridge.config import SimConfig, VmType

    # model_construct: the fields are valid already; only the simulator's own limits are asked
    types = tuple(VmType.model_construct(name=g.name, cores=g.cores, max=g.max) for g in groups)
    problem = SimConfig.model_construct(vm_types=types, host_mips=simulation.host_mips).simulator_problem()
    if problem:
        raise ValueError(f"{where}the simulator (executor sim) would refuse this config: {problem}")


LOOP_NAME = r"^[a-z0-9][a-z0-9_-]{0,62}$"


class AutoscalingLoop(Strict):
    """One autoscaling control loop: its source is Graphite (shared `graphite` section) or, with
    `executor.kind: sim`, its own simulation; its guard is bounds + cool-down + dry-run."""

    name: str = Field(pattern=LOOP_NAME, description="unique; names the loop's records, metrics and scheduler job")
    problem: Literal["autoscaling"] = "autoscaling"
    groups: list[GroupConfig] = Field(min_length=1)
    agent: AgentConfig = AgentConfig()
    executor: ExecutorConfig = ExecutorConfig()
    timing: TimingConfig = TimingConfig()
    simulation: SimulationConfig = SimulationConfig()

    @model_validator(mode="after")
    def _groups(self) -> "AutoscalingLoop":
        _check_groups(self.groups, self.executor, f"loop {self.name!r}: ")
        _check_simulation(self.groups, self.executor, self.simulation, f"loop {self.name!r}: ")
        return self


#: Loop sections, one model per problem, chosen by `problem`: autoscaling's is above; every other
#: problem's comes from its package (`ProblemSpec.loop_config`), so adding a problem edits no config.
LoopConfig = Any


def loop_model(entry: Any) -> BaseModel:
    """One `loops:` entry validated by its problem's model (`problem` defaults to autoscaling)."""
    if isinstance(entry, BaseModel):
        return entry
    if not isinstance(entry, dict):
        raise ValueError(f"each loop must be a mapping, got {type(entry).__name__}")
    problem = entry.get("problem", "autoscaling")
    if problem == "autoscaling":
        return AutoscalingLoop.model_validate(entry)
    from agents.registry import get_problem, load_entry_point

    spec = get_problem(str(problem))  # ValueError naming close matches
    if not spec.loop_config:
        raise ValueError(f"problem {problem!r} has no daemon loop (it runs through `samm serve` and its own CLI)")
    return load_entry_point(spec.loop_config).model_validate(entry)


class SammConfig(Strict):
    """Either `loops: [...]` (several control loops) or today's single-loop keys at the top level
    (`groups`, `agent`, `executor`, `timing`, `simulation`), which load as one loop named `default`."""

    loops: list[Any] | None = Field(default=None, min_length=1)
    groups: list[GroupConfig] | None = Field(default=None, min_length=1)
    graphite: GraphiteConfig = GraphiteConfig()
    agent: AgentConfig = AgentConfig()
    executor: ExecutorConfig = ExecutorConfig()
    timing: TimingConfig = TimingConfig()
    knowledge: KnowledgeConfig = KnowledgeConfig()
    service: ServiceConfig = ServiceConfig()
    simulation: SimulationConfig = SimulationConfig()
    ha: HaConfig = HaConfig()

    @field_validator("loops", mode="before")
    @classmethod
    def _loop_models(cls, v):
        if v is None:
            return v
        if not isinstance(v, list):
            raise ValueError("loops must be a list of loop mappings")
        out = []
        for i, entry in enumerate(v):
            try:
                out.append(loop_model(entry))
            except ValidationError as exc:  # keep the entry's index, so the error names its line
                raise ValidationError.from_exception_data(exc.title, [
                    {"type": e["type"], "loc": (i, *e["loc"]), "input": e["input"], **({"ctx": e["ctx"]} if "ctx" in e else {})}
                    for e in exc.errors()]) from None
        return out

    @model_validator(mode="after")
    def _loops(self) -> "SammConfig":
        if self.ha.enabled and not re.match(r"postgres(ql)?[+:]", self.knowledge.url):  # the store takes both
            raise ValueError(f"ha.enabled needs a PostgreSQL knowledge store (knowledge.url), got "
                             f"{self.knowledge.url.split(':', 1)[0]}: an SQLite store is single-daemon")
        _check_database_url(self.knowledge.url)  # after the rule above, which names the store it wants
        if self.loops is None:
            if self.groups is None:
                raise ValueError("groups: Field required (or declare `loops`)")
            _check_groups(self.groups, self.executor)
            _check_simulation(self.groups, self.executor, self.simulation)
            return self
        legacy = [k for k in ("groups", "agent", "executor", "timing", "simulation") if k in self.model_fields_set]
        if legacy:
            raise ValueError(f"with `loops`, put {legacy} inside each loop, not at the top level")
        names = [lp.name for lp in self.loops]
        if len(set(names)) != len(names):
            raise ValueError(f"loop names must be unique, got {names}")
        # cool-downs and idempotency keys are per loop: two loops on one ASG would each act
        # inside the other's cool-down
        owner: dict[tuple, str] = {}
        for lp in self.loops:
            ex = getattr(lp, "executor", None)
            kind = getattr(ex, "kind", None)
            if kind not in ("aws-asg", "docker"):
                continue
            for g in getattr(lp, "groups", None) or ():  # a microservice loop has services, not groups
                # a Docker group is its containers labelled samm.group=<name> (one namespace per engine)
                target = (kind, ex.region, ex.endpoint_url, g.asg_name) if kind == "aws-asg" else (
                    kind, ex.endpoint_url, g.name)
                if owner.setdefault(target, lp.name) == lp.name:
                    continue
                if kind == "aws-asg":
                    raise ValueError(f"ASG {g.asg_name!r} ({ex.region}) is managed by loops {owner[target]!r} and "
                                     f"{lp.name!r}: give each ASG to one loop")
                raise ValueError(f"Docker group {g.name!r} ({ex.endpoint_url or 'the default engine'}) is managed by "
                                 f"loops {owner[target]!r} and {lp.name!r}: its containers would be scaled by both; "
                                 "name the groups apart or give each engine's group to one loop")
        # an agent's `out` (an online learner's policy and log, an explorer's samples) is written
        # as that loop's own: two loops on one folder overwrote each other's files
        outs: dict[str, str] = {}
        for lp in self.loops:
            out = getattr(getattr(lp, "agent", None), "params", {}).get("out")
            if isinstance(out, str) and out:
                key = os.path.normpath(os.path.abspath(os.path.expanduser(out)))
                if outs.setdefault(key, lp.name) != lp.name:
                    raise ValueError(f"loops {outs[key]!r} and {lp.name!r} both write their agent's files to {out!r} "
                                     "(agent.params.out): give each loop its own folder")
        return self

    def control_loops(self) -> list[LoopConfig]:
        """The loops to run: `loops`, or the top-level keys as the one loop `default`."""
        if self.loops is not None:
            return list(self.loops)
        return [AutoscalingLoop(name="default", groups=self.groups, agent=self.agent, executor=self.executor,
                                timing=self.timing, simulation=self.simulation)]


class ConfigError(ValueError):
    """A configuration problem, already phrased for the user (file, line, key)."""


def _line_index(text: str) -> dict[tuple, int]:
    """Maps key paths to 1-based line numbers by walking the YAML node tree."""
    lines: dict[tuple, int] = {}

    seen: set[int] = set()

    def walk(node, path):
        # an alias is the node it names: walked once, or a 1-KB file of nested aliases (the
        # "billion laughs") is walked billions of times
        if id(node) in seen:
            return
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                key = path + (k.value,)
                lines[key] = k.start_mark.line + 1
                walk(v, key)
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                lines[path + (i,)] = v.start_mark.line + 1
                walk(v, path + (i,))

    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return lines
    if root is not None:
        walk(root, ())
    return lines


# taken as written, not read as YAML: a token of digits became a number (the config was then
# refused, "service.token: Input should be a valid string"), and " #..." in a password or a
# token was cut off as a comment
_VERBATIM_ENV = {("service", "token"), ("knowledge", "url")}


def _apply_env(data: dict, environ: dict[str, str]) -> dict[tuple[str, ...], str]:
    """Applies the overrides to `data`; returns the key path each one set -> its variable's name."""
    applied = {}
    for name, raw in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        path = name[len(ENV_PREFIX):].lower().split("__")
        node = data
        for depth, part in enumerate(path[:-1], 1):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):  # name the key that is no mapping, not the whole path
                what = "a list (an override reaches mapping keys only)" if isinstance(node, list) else "not a section"
                raise ConfigError(f"{name}: {'.'.join(path[:depth])} is {what}")
        if raw == "" or tuple(path) in _VERBATIM_ENV:
            node[path[-1]] = raw if raw != "" else None
        else:
            try:
                node[path[-1]] = yaml.safe_load(raw)
            except yaml.YAMLError as exc:
                raise ConfigError(f"{name}: not a valid YAML value ({exc.problem or exc})") from None
        applied[tuple(path)] = name
    return applied


def _overrides_named_in(msg: str, from_env: dict[tuple[str, ...], str]) -> list[str]:
    """The overrides whose key a top-level rule's message names ("ha.enabled needs ...", "put
    ['executor'] inside each loop"): such a rule has no key of its own, so the error named the file
    alone, for a value it may not even hold."""
    return [name for key, name in from_env.items() if ".".join(key) in msg or repr(key[0]) in msg]


# a daemon config is a few KB: the bound keeps a wrong path (/dev/zero, a log, a disk image)
# from being read into memory without end
MAX_CONFIG_BYTES = 1 << 20


#: far more values than any daemon config holds; YAML aliases (&a ... *a) can make 1 KB stand for
#: billions of them, which `samm config check` then printed until memory ran out
MAX_CONFIG_VALUES = 100_000


class _CyclicAlias(Exception):
    pass


def _expanded_size(data: Any) -> int:
    """How many values `data` holds once every alias is written out (shared ones counted at each
    use, each counted once: linear in the file); _CyclicAlias if a value contains itself."""
    sizes: dict[int, int] = {}
    inside: set[int] = set()

    def size(node: Any) -> int:
        if not isinstance(node, (dict, list)):
            return 1
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in inside:
            raise _CyclicAlias
        inside.add(id(node))
        n = 1 + sum(size(v) for v in (node.values() if isinstance(node, dict) else node))
        inside.discard(id(node))
        sizes[id(node)] = n
        return n

    return size(data)


def _check_expansion(path: Path, data: dict) -> None:
    try:
        n = _expanded_size(data)
    except _CyclicAlias:  # pydantic's JSON dump and any walk of the value would not end
        raise ConfigError(f"{path}: a YAML alias (*name) refers to a value that contains it: not a SAMM config") from None
    if n > MAX_CONFIG_VALUES:
        raise ConfigError(f"{path}: holds {n} values once its YAML aliases (*name) are expanded, more than "
                          f"{MAX_CONFIG_VALUES}: not a SAMM config")


def _read_config_text(path: Path) -> str:
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes: not a SAMM config")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}); is it a binary file?") from None


class DuplicateKeyError(yaml.YAMLError):
    """A mapping that names one key twice: YAML keeps only the last value, so the other one,
    perhaps the one the operator meant, was dropped without a word."""

    def __init__(self, key, line: int, first_line: int):
        super().__init__(f"duplicate key {key!r} (first on line {first_line}): YAML would keep only the last one")
        self.line = line


class _UniqueKeyLoader(yaml.SafeLoader):
    """`yaml.safe_load` that refuses a key given twice in one mapping (merge keys `<<:` may still
    be overridden, which is what they are for)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                    continue
                key = self.construct_object(key_node)
                line = key_node.start_mark.line + 1
                if key in first:
                    raise DuplicateKeyError(key, line, first[key])
                first[key] = line
        return super().construct_mapping(node, deep=deep)


def load_config(path: str | Path, environ: dict[str, str] | None = None) -> SammConfig:
    path = Path(path)
    try:
        return _load_config(path, _read_config_text(path), environ)
    except RecursionError:  # PyYAML composes nested lists recursively: "[[[[..." thousands deep
        raise ConfigError(f"{path}: nested too deeply to be a SAMM config") from None


def _load_config(path: Path, text: str, environ: dict[str, str] | None) -> SammConfig:
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader) or {}
    except DuplicateKeyError as exc:
        raise ConfigError(f"{path}:{exc.line}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({' '.join(str(exc).split())})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    from_env = _apply_env(data, dict(os.environ if environ is None else environ))
    try:
        cfg = SammConfig.model_validate(data)
    except ValidationError as exc:
        lines = _line_index(text)
        msgs = []
        for e in exc.errors():
            loc = tuple(e["loc"])
            where = ".".join(str(x) for x in loc) or "(top level)"
            line = lines.get(loc) or next((lines[loc[:i]] for i in range(len(loc) - 1, 0, -1) if loc[:i] in lines), None)
            at = f"{path}:{line}" if line else str(path)
            # a value set by an override is not the file's: naming the file's line pointed at a
            # good value (or at a section without the key) and never at the variable
            env = next((name for key, name in from_env.items() if loc[:len(key)] == key), None)
            at = f"{env} (environment)" if env else at
            if not loc and from_env:  # a rule across sections: also name the overrides it mentions
                named = _overrides_named_in(e["msg"], from_env)
                at = f"{at} with {', '.join(named)} (environment)" if named else at
            if e["type"] == "extra_forbidden":
                msgs.append(f"{at}: unknown key {where!r}")
            else:
                msgs.append(f"{at}: {where}: {e['msg']}")
        raise ConfigError("\n".join(msgs)) from None
    # after validation, which names unknown keys first and reads a shared value once; what is
    # refused here is the expanded whole that dumping or using the config would write out
    _check_expansion(path, data)
    return cfg
