"""The oversubscription problem's REST operations: admit a VM request (or one step's requests).

    POST /v1/agents/{name}/admit
    {"subscriber": 0, "cores": 8, "mem_gb": 32, "net_gbps": 2, "hour": 13,
     "allocated": [[cores, mem, net], ...one row per subscriber],
     "requested_live": [cores, ...one per subscriber],
     "usage_history": [[rate or null, ...one per subscriber], ...one row per past step]}   (optional)
    -> {"subscriber": 0, "rate": 0.5, "reserved_cores": 4.0, "rates_offered": [0.2, ..., 1.0],
        "agent": "c2marl", "policy_version": "...", "latency_ms": 0.3}

    POST /v1/agents/{name}/admit/batch
    {"hour": 13, "allocated": [...], "requested_live": [...], "usage_history": [...],
     "requests": [{"subscriber": 0, "cores": 8, "mem_gb": 32, "net_gbps": 2}, ...]}
    -> {"decisions": [one admit response per request, in order], "rates": [one per subscriber], ...}

The hosted policy decides one rate per subscriber from a `View` (`sim.View`); the single call
builds the View of that one request, the batch call the View of all of a step's requests (each
subscriber's requests summed, exactly as the simulator builds it), so one batch call per step
reproduces the simulator's decisions (§6.2: the paper decides per subscriber per step).

`usage_history` is not in the paper's state; the rule baselines (MA, SL, N-sigma, ...) need each
subscriber's past usage rates, so a caller that has them sends them (rows of past steps, null
where a subscriber had no live VM). Without it the policy sees an empty history.

A policy object has `setting` (a `Setting`), `rates(view) -> [N]` in (0, 1] and `metadata()`.
`add_routes` takes it directly or a registry with `.get(name)` (what `samm serve` passes), then
the policy is looked up per request so an uploaded version takes effect at once.

Input errors are 422s that name the field (wrong number of subscribers, NaN/inf, negative
values, a subscriber out of range, a value past its upper bound, a string or a boolean where an
integer belongs); a policy that fails or answers rates outside (0, 1] is a
500 naming the agent, never a silent default (the caller chooses its safe default: the live
admission executor admits without oversubscription and records the error).
"""
from __future__ import annotations

import sys
import threading
import time
from typing import Annotated, Any

import numpy as np
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from .settings import RATES
from .sim import View

# Upper bounds, far past any real request but small enough that no sum the routes or a policy
# form overflows (a 1e300-core request was answered with 5e299 reserved cores): a value past one
# is a 422 naming the field. One VM asks for at most MAX_VM (cores, GB of memory, Gb/s), a
# subscriber holds at most MAX_TOTAL of each; a usage rate (used / requested cores) is at most
# 1 on a real host, a measured one a little more (timing jitter): MAX_USAGE_RATE leaves room.
MAX_VM = 1e6
MAX_TOTAL = 1e12
MAX_USAGE_RATE = 10.0
MAX_SUBSCRIBERS = 4096
MAX_HISTORY = 10_000
MAX_BATCH = 10_000

NonNegative = Annotated[float, Field(ge=0, le=MAX_TOTAL, allow_inf_nan=False)]
UsageRate = Annotated[float, Field(ge=0, le=MAX_USAGE_RATE, allow_inf_nan=False)]
Resources = Annotated[list[NonNegative], Field(min_length=3, max_length=3,
                                                description="[cores, mem_gb, net_gbps]")]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ClusterState(Strict):
    hour: int = Field(ge=0, le=23, strict=True, description="Hour of the day of this step.")
    allocated: list[Resources] = Field(max_length=MAX_SUBSCRIBERS,
                                       description="Live reservations per subscriber: [cores, mem_gb, net_gbps].")
    requested_live: list[NonNegative] = Field(max_length=MAX_SUBSCRIBERS,
                                              description="Live requested cores per subscriber.")
    usage_history: list[list[UsageRate | None]] = Field(
        default_factory=list, max_length=MAX_HISTORY,
        description="Optional: past steps' usage rates (used / requested cores) per subscriber, oldest first; "
                    f"null where a subscriber had no live VM; each in [0, {MAX_USAGE_RATE:g}].")


class VmRequest(Strict):
    subscriber: int = Field(ge=0, strict=True, description="Subscriber index, 0..N-1.")
    cores: float = Field(gt=0, le=MAX_VM, allow_inf_nan=False, description=f"Requested cores (at most {MAX_VM:g}).")
    mem_gb: float = Field(default=0.0, ge=0, le=MAX_VM, allow_inf_nan=False)
    net_gbps: float = Field(default=0.0, ge=0, le=MAX_VM, allow_inf_nan=False)


class AdmitRequest(ClusterState, VmRequest):
    pass


class BatchAdmitRequest(ClusterState):
    requests: list[VmRequest] = Field(min_length=1, max_length=MAX_BATCH,
                                      description="The step's VM requests, in arrival order.")


class AdmitResponse(BaseModel):
    subscriber: int
    rate: float = Field(description="Oversubscription rate: the VM reserves rate x its requested cores.")
    reserved_cores: float
    rates_offered: list[float] = Field(description="The agent's action set (§6.2's unless it was trained on another); "
                                                   "empty for a headroom policy, whose rates are continuous.")
    agent: str
    policy_version: str | None = None
    latency_ms: float = Field(description="Time the policy took to decide (ms).")


class BatchAdmitResponse(BaseModel):
    decisions: list[AdmitResponse]
    rates: list[float] = Field(description="The policy's rate for every subscriber this step.")
    agent: str
    policy_version: str | None = None
    latency_ms: float


def _check_state(state: ClusterState, n: int) -> None:
    """The per-subscriber fields must have one entry per subscriber of the hosted setting."""
    if len(state.allocated) != n:
        raise HTTPException(422, f"allocated: expected {n} rows (one per subscriber), got {len(state.allocated)}")
    if len(state.requested_live) != n:
        raise HTTPException(422, f"requested_live: expected {n} values (one per subscriber), "
                                 f"got {len(state.requested_live)}")
    for i, row in enumerate(state.usage_history):
        if len(row) != n:
            raise HTTPException(422, f"usage_history[{i}]: expected {n} values (one per subscriber), got {len(row)}")


def _check_subscriber(req: VmRequest, n: int, where: str) -> None:
    if req.subscriber >= n:
        raise HTTPException(422, f"{where}subscriber: must be in [0, {n}), got {req.subscriber}")


def build_view(state: ClusterState, requests: list[VmRequest], n: int) -> View:
    """The `View` a policy decides on: the state plus the requests summed per subscriber."""
    req = np.zeros((n, 3))
    for r in requests:
        req[r.subscriber] += (r.cores, r.mem_gb, r.net_gbps)
    # numpy reads a JSON null (None) as NaN in a float array: no per-value Python pass
    hist = np.array(state.usage_history, dtype=np.float64).reshape(len(state.usage_history), n)
    return View(t=len(state.usage_history), hour=int(state.hour), request=req, has_request=req[:, 0] > 0,
                allocated=np.asarray(state.allocated, dtype=np.float64).reshape(n, 3),
                requested_live=np.asarray(state.requested_live, dtype=np.float64).reshape(n),
                usage_history=hist, vm_rows=np.arange(len(requests)))


def _version(policy) -> str | None:
    if getattr(policy, "version", None) is not None:  # cheaper than metadata() on every call
        return str(policy.version)
    try:
        meta = policy.metadata() or {}
    except Exception:  # noqa: BLE001 - metadata is informative only
        return None
    v = meta.get("version") or meta.get("policy_version")
    return None if v is None else str(v)


_thread_state = threading.local()


def _one_torch_thread() -> None:
    """`samm serve` gives torch one thread, but that setting is per calling thread (OpenMP):
    an app served from another thread (TestClient, the testbed's uvicorn thread) would use
    every core for a tiny network. Measured on the Azure setting with an OversubPolicy:
    decision median 4.4 ms without this, 0.36 ms with it (2-core machine)."""
    if getattr(_thread_state, "done", False):
        return
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)
        _thread_state.done = True


def decide_rates(policy, view: View, name: str) -> tuple[np.ndarray, float]:
    """The policy's rates for `view` and the milliseconds it took; a broken policy is a 500."""
    n = int(policy.setting.n_subscribers)
    _one_torch_thread()
    started = time.perf_counter()
    try:
        rates = np.asarray(policy.rates(view), dtype=np.float64).reshape(-1)
    except Exception as exc:  # noqa: BLE001 - reported to the caller, who picks its safe default
        raise HTTPException(500, f"agent {name!r} failed to decide: {type(exc).__name__}: {exc}") from None
    ms = (time.perf_counter() - started) * 1e3
    if rates.shape != (n,) or not np.all(np.isfinite(rates)) or np.any(rates <= 0) or np.any(rates > 1):
        raise HTTPException(500, f"agent {name!r} returned invalid rates {rates.tolist()} "
                                 f"(need {n} values in (0, 1])")
    return rates, ms


def offered(policy) -> list[float]:
    """The rates a policy chooses among: a learned policy's action set, none for a headroom policy, else
    the paper's (the rules' rates are continuous, so they report the agent's set for comparison, as before)."""
    if getattr(policy, "headroom", False):    # a headroom times a forecast: any rate in [0.2, 1]
        return []
    grid = getattr(policy, "rate_set", None)
    return [float(r) for r in (RATES if grid is None else grid)]


def _policy_of(source, name: str):
    from agents.problem_service import hosted_policy

    return hosted_policy(source, name, "rates")


def add_routes(app: FastAPI, name: str, policy_or_registry: Any) -> None:
    # async: a decision is well under a millisecond; a threadpool hop would cost as much, and
    # one event loop also serialises calls to a policy that keeps state
    async def admit(req: AdmitRequest) -> AdmitResponse:
        policy = _policy_of(policy_or_registry, name)
        n = int(policy.setting.n_subscribers)
        _check_state(req, n)
        _check_subscriber(req, n, "")
        rates, ms = decide_rates(policy, build_view(req, [req], n), name)
        rate = float(rates[req.subscriber])
        return AdmitResponse(subscriber=req.subscriber, rate=rate, reserved_cores=rate * req.cores,
                             rates_offered=offered(policy), agent=name, policy_version=_version(policy),
                             latency_ms=round(ms, 4))

    async def admit_batch(req: BatchAdmitRequest) -> BatchAdmitResponse:
        policy = _policy_of(policy_or_registry, name)
        n = int(policy.setting.n_subscribers)
        _check_state(req, n)
        for i, r in enumerate(req.requests):
            _check_subscriber(r, n, f"requests[{i}].")
        rates, ms = decide_rates(policy, build_view(req, req.requests, n), name)
        version = _version(policy)
        decisions = [AdmitResponse(subscriber=r.subscriber, rate=float(rates[r.subscriber]),
                                   reserved_cores=float(rates[r.subscriber]) * r.cores, rates_offered=offered(policy),
                                   agent=name, policy_version=version, latency_ms=round(ms, 4))
                     for r in req.requests]
        return BatchAdmitResponse(decisions=decisions, rates=rates.tolist(), agent=name, policy_version=version,
                                  latency_ms=round(ms, 4))

    # postponed annotations: hand FastAPI the classes themselves
    admit.__annotations__ = {"req": AdmitRequest, "return": AdmitResponse}
    admit_batch.__annotations__ = {"req": BatchAdmitRequest, "return": BatchAdmitResponse}
    app.add_api_route(f"/v1/agents/{name}/admit", admit, methods=["POST"], response_model=AdmitResponse,
                      summary=f"Admit one VM request ({name})",
                      description="The oversubscription rate for the request's subscriber and the cores the VM "
                                  "reserves (rate x requested cores).")
    app.add_api_route(f"/v1/agents/{name}/admit/batch", admit_batch, methods=["POST"],
                      response_model=BatchAdmitResponse, summary=f"Admit one step's VM requests ({name})",
                      description="One decision per subscriber for all of a step's requests (the paper's step), "
                                  "returned per request in order.")


def create_app(name: str, policy_or_registry: Any) -> FastAPI:
    """A FastAPI app serving only the admit routes (tests, the live testbed's in-process
    service). `samm serve` mounts the same routes on the Policy Evaluation Service instead."""
    from agents.problem_service import standalone_app

    return standalone_app(f"SAMM oversubscription admission ({name})", name, policy_or_registry, add_routes)
