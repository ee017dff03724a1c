"""The microservice-cores problem's REST operation: one second's measurements in, cores out.

    POST /v1/agents/{name}/allocate
    {"session": "hotel-prod",                       # the caller's application; its frames are kept
                                                    # (letters, digits, . _ : -, at most 128: the reset route's)
     "services": ["frontend", ...],                 # in the policy's order (checked)
     "per_service": [[rx_packets, tx_packets, rx_bytes, tx_bytes, rss_bytes, cache_bytes,
                      page_faults, cpu_used, cpu_limit, io_bytes, io_ops], ...one row per service],
     "latency_ms": [p50, p66, p75, p80, p90, p95, p98, p99, p99.9, p99.99, p99.999, p100] or null,
     "requests_per_s": 812.0, "failures_per_s": 0.0}
    -> {"cores": [...], "total_cores": 7.9, "action": "set" | "hold", "reason": null | "...",
        "agent": "reclaimer", "policy_version": "...", "latency_ms": 0.4}

The policy stacks the last k = 5 seconds per session (a session is one application's control
loop), so callers send every second, in order. Sessions live in the service's shared store
(`samm.plan.sessions`): idle ones expire after its TTL and the least recently used go past its cap,
both O(1); POST /v1/agents/{name}/sessions/{session}/reset starts one afresh. A cpu_limit of 0
is Docker's "no limit": it reads as the service's cap, on a held answer and on a decided one.

Unknown latency (null, or any NaN) means the load generator is stale: the answer holds the
current limits (`action: "hold"`, with the reason; each within [floor, cap] like every answer's
cores) and the frame is not pushed. Input errors are
422s naming the field; a failing policy is a 500 naming the agent (the caller's safe default is to
hold its limits).
"""
from __future__ import annotations

import time
from typing import Annotated, Any

import numpy as np
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from agents.problem_service import hosted_policy, problem_sessions
from samm.plan.schemas import cut_name, first_names
from samm.plan.service import SESSION_PATTERN
from samm.plan.sessions import _policy_tag, _tagged_by

from .control import AppLimits, clip_cores
from .observation import FIELD, PERCENTILES, SERVICE_FIELDS, StepMeasurement

# Far above any real counter (a petabyte per second), far below where the float32 features
# overflow to inf: a larger value is a broken exporter, answered with a 422 naming it.
LARGEST = 1e15
NonNegative = Annotated[float, Field(ge=0, le=LARGEST, allow_inf_nan=False)]


class AllocateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # the reset route's pattern: a name it refuses (a space, a slash, past 128 characters) made a
    # frame stack that no reset could reach
    session: str = Field(pattern=SESSION_PATTERN, description="The caller's application (its frame stack).")
    services: list[str] = Field(min_length=1, max_length=512, description="Service names, in the policy's order.")
    per_service: list[Annotated[list[NonNegative], Field(min_length=len(SERVICE_FIELDS), max_length=len(SERVICE_FIELDS))]] = Field(
        max_length=512, description=f"One row per service: {', '.join(SERVICE_FIELDS)} over the last second.")
    latency_ms: list[float | None] | None = Field(
        default=None, description=f"End-to-end latency percentiles {list(PERCENTILES)} of the last second; "
                                  "null when unknown (the caller's limits are then held).")
    requests_per_s: NonNegative = 0.0
    failures_per_s: NonNegative = 0.0


class AllocateResponse(BaseModel):
    cores: list[float]
    total_cores: float
    action: str
    reason: str | None = None
    agent: str
    policy_version: str
    latency_ms: float


def add_routes(app: FastAPI, name: str, policy_or_registry: Any) -> None:
    sessions = problem_sessions(app, name)

    async def allocate(req: AllocateRequest) -> AllocateResponse:
        policy = hosted_policy(policy_or_registry, name, "act")
        topo = policy.topo
        if tuple(req.services) != topo.service_names:
            # the first names, each cut: 512 long names were echoed whole, a 422 of 700 KB
            raise HTTPException(422, detail=f"services: expected {list(topo.service_names)} (the policy's "
                                            f"application {topo.name!r}), got "
                                            f"{first_names([cut_name(s) for s in req.services])}")
        if len(req.per_service) != topo.n_services:
            raise HTTPException(422, detail=f"per_service: {len(req.per_service)} rows for {topo.n_services} services")
        if req.latency_ms is not None and len(req.latency_ms) != len(PERCENTILES):
            raise HTTPException(422, detail=f"latency_ms: {len(req.latency_ms)} values, expected {len(PERCENTILES)}")
        # checked here, not in the model: a NaN (or inf) must pass (unknown latency: the limits are held)
        for i, v in enumerate(req.latency_ms or ()):
            if v is not None and (v < 0 or LARGEST < v < np.inf):
                raise HTTPException(422, detail=f"latency_ms[{i}]: must be in [0, {LARGEST:g}], got {v}")
        rows = np.asarray(req.per_service, dtype=np.float64)
        # a limit of 0 is Docker's "none": what is in force is the cap, on either answer. The policy
        # read a 0 as a service without CPU (its previous action 0) and set lower limits for it
        limit = rows[:, FIELD["cpu_limit"]]
        rows[:, FIELD["cpu_limit"]] = np.where(limit > 0, limit, topo.caps)
        version = str(getattr(policy, "version", "unversioned"))
        lat = None if req.latency_ms is None else np.array([np.nan if v is None else v for v in req.latency_ms], float)
        started = time.perf_counter()
        if lat is None or not np.isfinite(lat).all():
            # the limits in force, within [floor, cap] as every answer's: a container without a
            # limit (0 as Docker reports it, or the host's CPUs) gets its cap, the safe side, never
            # 0 cores or more than its cap
            current = clip_cores(rows[:, FIELD["cpu_limit"]], AppLimits(topo.service_names, topo.caps, topo.qos_ms))
            return AllocateResponse(cores=current.tolist(), total_cores=float(current.sum()), action="hold",
                                    reason="latency unknown (stale load data): limits held", agent=name,
                                    policy_version=version, latency_ms=0.0)
        m = StepMeasurement(services=topo.service_names, per_service=rows, latency_ms=lat,
                            requests_per_s=req.requests_per_s, failures_per_s=req.failures_per_s, qos_ms=topo.qos_ms)

        def fresh():
            ctl = policy.fork()
            ctl.reset(AppLimits(topo.service_names, topo.caps, topo.qos_ms))
            return ctl
        # tagged with the policy object, not its version string: an upload may repeat the version
        # over other weights, and a session must not go on with the replaced network. Keyed by the
        # session alone, as the session reset route names it.
        # get_or_make marks the session used: a plain get did not, so a session called every second
        # expired one TTL after it began (its frame stack lost mid-run) and was evicted first
        held = sessions.get_or_make(req.session, lambda: (fresh(), _policy_tag(policy)))
        if not _tagged_by(held[1], policy):
            held = (fresh(), _policy_tag(policy))
            sessions.put(req.session, held)
        ctl = held[0]
        try:
            cores = ctl.act(m)
        except Exception as exc:  # a failing policy is the caller's to handle: say which
            raise HTTPException(500, detail=f"agent {name!r} failed: {type(exc).__name__}: {exc}") from None
        ms = (time.perf_counter() - started) * 1000
        return AllocateResponse(cores=[float(c) for c in cores], total_cores=float(np.sum(cores)), action="set",
                                agent=name, policy_version=version, latency_ms=round(ms, 4))

    allocate.__annotations__ = {"req": AllocateRequest, "return": AllocateResponse}
    app.add_api_route(f"/v1/agents/{name}/allocate", allocate, methods=["POST"], response_model=AllocateResponse,
                      summary=f"Cores per service for the next second ({name})",
                      description="One second of per-service measurements and end-to-end latency in; the CPU "
                                  "limit of every service for the next second out (held when latency is unknown).")


def create_app(name: str, policy_or_registry: Any) -> FastAPI:
    from agents.problem_service import standalone_app

    return standalone_app(f"SAMM microservice cores ({name})", name, policy_or_registry, add_routes)
