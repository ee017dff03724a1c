"""Applications as YAML: services, the calls of each request type, and the paper's load.

The simulator and the real-container testbed read the same file, so the testbed's application and
its simulated twin cannot drift apart.

    name: hotel
    qos_ms: 200                    # the paper's QoS target on the end-to-end p99 of each second
    users: [500, 3500]             # the paper's user range (Table 2)
    rate_per_user: 1.0             # requests/s per user: exponential think time of mean 1/rate
    services:
      frontend: {cpu_ms: 0.5, workers: 64, cap: 6}
      memcached-rate: {cpu_ms: 0.06, cap: 2, kind: cache}
      ...
    requests:
      search:
        weight: 0.6
        call: frontend             # a node: the service it calls, then its stages in order;
        stages:                    # a stage is a list of nodes called in parallel
          - [{call: search, stages: [[{call: geo}], [{call: rate}]]}]
          - [{call: profile, stages: [[{call: memcached-profile}], [{call: mongodb-profile, p: 0.1}]]}]

A node's latency = its own service's sojourn + the sum over its stages of the slowest node of
the stage. `p` is the probability that the call happens at all (a cache miss to the database).
`detached: true` marks an asynchronous call (through a message queue): it loads its service and
its own calls, but the caller does not wait for it. Both belong on calls under a request: its own
first call is always made. `cpu_ms` is the mean CPU time of one call (exponentially distributed), `workers` its concurrency
(threads) and `cap` the paper's hand-set per-service maximum u^(i) (cores, at least
control.MIN_CORES, the smallest CPU quota). Unknown keys are rejected.
"""
from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .control import MIN_CORES

TOPOLOGY_DIR = Path(__file__).parent / "topologies"
#: the most concurrent calls of one service: the simulator's Erlang C recursion runs to it
#: in compiled 64-bit integers
MAX_WORKERS = 1_000_000
#: the most requests per second an application may be driven at (users x rate_per_user): far past any
#: real load, far below where the simulator's Poisson draw fails ("lam value too large", ~9.2e18)
MAX_REQUESTS_PER_S = 1e12


class _Strict(BaseModel):
    # inf passes gt=0 and would reach the simulator as a NaN mix or an infinite CPU time
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ServiceSpec(_Strict):
    cpu_ms: float = Field(gt=0, description="mean CPU time per call, ms")
    overhead_ms: float = Field(default=0.0, ge=0, description="CPU per call beyond cpu_ms that a real "
                               "implementation spends anyway (its RPC/HTTP stack); the simulator adds it, "
                               "the testbed's services do not burn it on purpose")
    workers: int = Field(default=32, ge=1, le=MAX_WORKERS, description="concurrent calls the service can serve")
    cap: float = Field(gt=0, description="u^(i): the most cores the service may get")
    kind: Literal["logic", "cache", "db", "frontend"] = "logic"
    rss_mb: float = Field(default=60.0, ge=0, description="resident memory at rest")
    kb_per_call: float = Field(default=2.0, ge=0, description="network payload per call, KiB each way")
    io_kb_per_call: float = Field(default=0.0, ge=0, description="disk IO per call (databases)")
    cache_mb: float = Field(default=4.0, ge=0, description="page cache at rest (a database adds its IO)")
    faults_per_call: float = Field(default=0.5, ge=0, description="page faults per call")
    faults_per_s: float = Field(default=0.0, ge=0, description="page faults per second whatever the load")

    @field_validator("cap")
    @classmethod
    def _cap_at_least_the_floor(cls, v):
        # a cap under the floor every controller keeps clipped each limit to the cap, below the
        # kernel's smallest quota: the live loop found the engine's limit a quota step off and sent
        # the same limit again every second
        if v < MIN_CORES:
            raise ValueError(f"must be at least {MIN_CORES:g} core (the smallest CPU quota), not {v:g}")
        return v


class CallNode(_Strict):
    call: str
    p: float = Field(default=1.0, gt=0, le=1)
    #: an asynchronous call (a message queue): it loads its service but is not waited for
    detached: bool = False
    stages: list[list["CallNode"]] = Field(default_factory=list)


class RequestType(CallNode):
    weight: float = Field(gt=0)

    @model_validator(mode="after")
    def _always_sent(self):
        # a request reaches its first service every time: a root `p` made the missed share of the
        # requests count with a latency of 0 ms (a p50 of 0), a detached root waited for nothing
        if self.p < 1.0 or self.detached:
            raise ValueError(f"a request type's own call ({self.call!r}) is always made: p and detached "
                             "belong on the calls under it (use weight for how often it is sent)")
        return self


class Topology(_Strict):
    name: str
    qos_ms: float = Field(gt=0)
    users: tuple[int, int]
    rate_per_user: float = Field(gt=0)
    hop_ms: float = Field(default=0.1, ge=0, description="network latency per call, one way")
    timeout_s: float = Field(default=5.0, gt=0, description="a call waiting longer than this fails")
    percentiles_over: Literal["draws", "requests"] = Field(
        default="draws",
        description="what a second's latency percentiles are taken over: a fixed number of drawn "
                    "requests (the simulator's `samples`), or that second's own requests (at most "
                    "`samples` of them), as a load generator computes them; the second matters "
                    "where a second holds few requests, whose p99 is near their maximum")
    throttle_chain: float = Field(
        default=0.0, ge=0, lt=1,
        description="the chance that a call which met a throttled CFS period sits out the next whole "
                    "period too (again with this chance, and so on): quota spent by a burst of calls "
                    "runs out in the following periods as well")
    cfs_burst: float = Field(
        default=0.0, ge=0, le=1,
        description="a CFS burst of this share of each quota (the testbed's --cpu-burst): a period is "
                    "throttled only when its demand exceeds the quota plus the burst, taken as banked "
                    "in full (a service below its limit refills it within a few periods)")
    jitter_p: float = Field(default=0.0, ge=0, le=1,
                            description="host noise: the chance that a call is delayed by an extra "
                                        "Exp(jitter_ms) (scheduling, the interpreter's pauses)")
    jitter_ms: float = Field(default=0.0, ge=0, description="mean of that extra delay")
    services: dict[str, ServiceSpec]
    requests: dict[str, RequestType]

    @field_validator("users")
    @classmethod
    def _users(cls, v):
        if not 0 < v[0] <= v[1]:
            raise ValueError("users must be [low, high] with 0 < low <= high")
        return v

    @model_validator(mode="after")
    def _load_drawable(self):
        # a load past the Poisson draw's range loaded fine and failed at the first simulated step
        if self.users[1] * self.rate_per_user > MAX_REQUESTS_PER_S:
            raise ValueError(f"users x rate_per_user ({self.users[1]} x {self.rate_per_user:g} requests/s) must be "
                             f"at most {MAX_REQUESTS_PER_S:g} requests/s")
        return self

    @model_validator(mode="after")
    def _timeout_beyond_qos(self):
        # failed requests count at the timeout (sim.py), so a timeout within the target would score
        # a second whose requests all failed as meeting it
        if self.timeout_s * 1000.0 <= self.qos_ms:
            raise ValueError(f"timeout_s ({self.timeout_s:g} s) must exceed the QoS target ({self.qos_ms:g} ms): "
                             "a failed request counts at the timeout and could never break a longer target")
        return self

    @model_validator(mode="after")
    def _calls_known(self):
        def walk(node: CallNode, where: str):
            if node.call not in self.services:
                raise ValueError(f"request {where!r} calls unknown service {node.call!r}")
            for stage in node.stages:
                if not stage:
                    raise ValueError(f"request {where!r}: an empty stage under {node.call!r}")
                for child in stage:
                    walk(child, where)
        if not self.requests:
            raise ValueError("at least one request type is needed")
        for name, req in self.requests.items():
            walk(req, name)
        return self

    @model_validator(mode="after")
    def _no_call_waits_on_its_own_service(self):
        # a call holds one of its service's workers while it waits for its calls (the testbed's
        # services, as DeathStarBench's): one that waits, directly or further down, on a call of
        # its own service waits on its own pool, and with every worker so held none is left to
        # answer (with workers: 1, every request fails at the timeout); the simulator models no
        # such wait, so the twin and the testbed part. A detached call is not waited for.
        def walk(node: CallNode, waiting: tuple[str, ...], where: str):
            waiting = () if node.detached else waiting      # the services whose calls wait for this one
            if node.call in waiting:
                path = " -> ".join(waiting[waiting.index(node.call):] + (node.call,))
                raise ValueError(f"request {where!r}: {path}: a call of {node.call!r} would wait on a call of "
                                 "its own service (a cycle in the call graph)")
            for stage in node.stages:
                for child in stage:
                    walk(child, waiting + (node.call,), where)
        for name, req in self.requests.items():
            walk(req, (), name)
        return self

    # -- derived, read by the simulator ------------------------------------------------------
    @cached_property
    def service_names(self) -> tuple[str, ...]:
        return tuple(self.services)

    @property
    def n_services(self) -> int:
        return len(self.services)

    @cached_property
    def caps(self) -> np.ndarray:
        return np.array([s.cap for s in self.services.values()], dtype=np.float64)

    @cached_property
    def mix(self) -> np.ndarray:
        w = np.array([r.weight for r in self.requests.values()], dtype=np.float64)
        return w / w.sum()

    @cached_property
    def visits(self) -> np.ndarray:
        """(request types, services): expected calls of each service per request of each type."""
        idx = {s: i for i, s in enumerate(self.services)}
        out = np.zeros((len(self.requests), self.n_services))

        def walk(node: CallNode, row: int, prob: float):
            p = prob * node.p
            out[row, idx[node.call]] += p
            for stage in node.stages:
                for child in stage:
                    walk(child, row, p)
        for row, req in enumerate(self.requests.values()):
            walk(req, row, 1.0)
        return out

    @cached_property
    def cpu_seconds(self) -> np.ndarray:
        """Mean CPU seconds of one call per service (its work plus its stack's overhead)."""
        return np.array([s.cpu_ms + s.overhead_ms for s in self.services.values()]) / 1000.0

    def mean_visits(self) -> np.ndarray:
        """Expected calls per service for one request of the mix."""
        return self.mix @ self.visits

    def core_demand(self, requests_per_s: float) -> np.ndarray:
        """Mean cores each service uses at a request rate (the fluid load, no queueing)."""
        return requests_per_s * self.mean_visits() * self.cpu_seconds


CallNode.model_rebuild()
RequestType.model_rebuild()


def load_topology(name_or_path: str | Path, _within: tuple = ()) -> Topology:
    """A shipped topology by name (hotel, social, chain3, testbed) or a YAML file. A file may start
    from another topology, `extends: <name or file>` (a relative file from its own folder), and
    set only the keys it changes; each key it sets replaces the base's whole value."""
    p = Path(name_or_path)
    if not p.suffix:
        p = TOPOLOGY_DIR / f"{name_or_path}.yaml"
        if not p.is_file():
            known = sorted(f.stem for f in TOPOLOGY_DIR.glob("*.yaml"))
            raise ValueError(f"unknown application {str(name_or_path)!r} (known: {', '.join(known)})")
    try:
        data = yaml.load(p.read_text(), Loader=_UniqueKeyLoader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"{p}: cannot read topology ({' '.join(str(exc).split())})") from None
    except RecursionError:
        raise ValueError(f"{p}: cannot read topology (nested too deeply)") from None
    if not isinstance(data, dict):
        raise ValueError(f"{p}: a topology must be a YAML mapping")
    base = data.pop("extends", None)
    if base is not None:
        if not isinstance(base, str) or not base:
            raise ValueError(f"{p}: extends must name a topology or a YAML file, not {base!r}")
        here = p.resolve()
        if here in _within:
            raise ValueError(f"{p}: extends loops back to itself")
        where = Path(base)
        if where.suffix and not where.is_absolute():
            where = p.parent / where
        data = {**load_topology(where if where.suffix else base, _within + (here,)).model_dump(mode="json"), **data}
    try:
        return Topology.model_validate(data)
    except RecursionError:
        raise ValueError(f"{p}: a request's calls are nested too deeply") from None
    except ValidationError as exc:
        raise ValueError(f"{p}: {validation_problems(exc)}") from None


def validation_problems(exc: ValidationError, shown: int = 3) -> str:
    """pydantic's report as one line, each problem after the field it is in: its own spans two
    lines per problem plus a link each, and named neither the file nor the option it came from."""
    problems = []
    for err in exc.errors():
        where = ".".join(map(str, err["loc"]))
        msg = err["msg"].removeprefix("Value error, ")
        problems.append(f"{where}: {msg}" if where else msg)
    more = len(problems) - shown
    return "; ".join(problems[:shown]) + (f"; and {more} more" if more > 0 else "")


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load that refuses a key given twice in one mapping: YAML keeps the last silently, so a
    service defined twice would run with the second definition's numbers unnoticed."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":   # `<<: *base` then its own keys override
                continue
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool)):   # an unhashable key: SafeLoader names it
                continue
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)

