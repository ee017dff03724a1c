"""The deferrable-jobs problem's REST operation: which eligible jobs start this slot.

    POST /v1/agents/{name}/schedule
    {"slot": 37, "capacity": 41,
     "eligible": [{"id": "j7", "cores": 2, "duration": 4, "earliest": 35, "latest": 40, "submitted": 33}, ...],
     "running":  [{"id": "j3", "cores": 4, "remaining": 2, "duration": 6}, ...],
     "future":   [{"id": "j9", "cores": 1, "duration": 2, "earliest": 39, "latest": 45, "submitted": 36}, ...],
     "session": "cluster-a"}
    -> {"start": ["j7", ...], "scores": {"j7": 0.8, ...}, "free": 37.0, "agent": "osdec", ...}

Times are in slots (the hosted setting's slot length). The service builds the simulator's View
of the request (running jobs as started `duration - remaining` slots ago) and asks the policy;
the answer always fits the free cores (prefix rule) and names only eligible jobs. The policy's
auxiliary inputs (the recent slots' summaries) are kept per `session`, so one caller per
cluster sends only the current slot; POST /v1/agents/{name}/sessions/{session}/reset drops them.

Input errors are 422s naming the field (a job outside its window, duplicate ids, NaN); a failed
policy is a 500 naming the agent: the caller's safe default is to start nothing and record it.
"""
from __future__ import annotations

import json
import time
from typing import Annotated, Any

import numpy as np
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agents.problem_service import problem_sessions
from samm.plan.schemas import validation_detail
from samm.plan.service import SESSION_PATTERN
from samm.plan.sessions import _policy_tag, _tagged_by

from .episode import Episode
from .features import SummaryHistory, slot_summary
from .rules import select_by_scores
from .sim import View

MAX_JOBS = 5_000
# Slots and capacity go into the View's int64 arrays: past 2**63 they overflow there (a 500 that
# blamed the agent); 2**53 leaves room for the offsets computed from them and is exact as a float.
LARGEST = 2**53
Slot = Annotated[int, Field(ge=0, le=LARGEST)]
JobId = Annotated[str | int, Field(description="The caller's job id (echoed in `start`).")]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class WaitingJob(Strict):
    id: JobId
    cores: int = Field(ge=1, le=100_000)
    duration: int = Field(ge=1, le=100_000, description="Run time in slots.")
    earliest: Slot = Field(description="Earliest start slot, e_i.")
    latest: Slot = Field(description="Latest start slot, l_i >= earliest.")
    submitted: Slot | None = Field(default=None, description="Submission slot, g_i (default: earliest).")


class RunningJob(Strict):
    id: JobId
    cores: int = Field(ge=1, le=100_000)
    remaining: int = Field(ge=1, le=100_000, description="Slots left to run, this one included.")
    duration: int | None = Field(default=None, ge=1, le=100_000, description="Whole run time (default: remaining).")


class ScheduleRequest(Strict):
    slot: Slot = Field(description="The current slot t.")
    capacity: float = Field(ge=0, le=LARGEST, allow_inf_nan=False, description="C_t: cores left after on-demand use.")
    eligible: list[WaitingJob] = Field(default_factory=list, max_length=MAX_JOBS)
    running: list[RunningJob] = Field(default_factory=list, max_length=MAX_JOBS)
    future: list[WaitingJob] = Field(default_factory=list, max_length=MAX_JOBS)
    # the reset route's pattern: a name it refuses (a space, a slash, 129 to 200 characters, or
    # none) kept a history that no POST .../sessions/{session}/reset could reach
    session: str = Field(default="default", pattern=SESSION_PATTERN,
                         description="Keeps this caller's recent slots (letters, digits, . _ : -, at most 128).")


class ScheduleResponse(BaseModel):
    start: list[str | int] = Field(description="Eligible jobs to start now; their cores fit `free`.")
    scores: dict[str, float] = Field(description="The policy's confidence per eligible job shown to it (id -> score).")
    free: float = Field(description="C_t minus the running jobs' cores.")
    agent: str
    policy_version: str | None = None
    latency_ms: float


def build_view(req: ScheduleRequest, slots: int) -> tuple[View, list]:
    """The simulator's View of a request and the job ids by row; ValueError naming a bad job."""
    t = req.slot
    ids: list = []
    rows: list[tuple[int, int, int, int, int]] = []
    start: list[int] = []
    seen: set = set()

    def add(job_id, where: str):
        key = str(job_id)
        if key in seen:
            raise ValueError(f"{where}: duplicate job id {job_id!r}")
        seen.add(key)
        ids.append(job_id)

    for i, j in enumerate(req.eligible):
        sub = j.earliest if j.submitted is None else j.submitted
        if not (j.earliest <= t <= j.latest) or sub > j.earliest:
            raise ValueError(f"eligible[{i}]: needs submitted <= earliest <= slot {t} <= latest")
        add(j.id, f"eligible[{i}]")
        rows.append((j.cores, j.duration, j.earliest, j.latest, sub))
        start.append(-1)
    for i, j in enumerate(req.running):
        d = j.duration or j.remaining
        if j.remaining > d:
            raise ValueError(f"running[{i}]: remaining {j.remaining} exceeds duration {d}")
        s = t - (d - j.remaining)
        add(j.id, f"running[{i}]")
        rows.append((j.cores, d, s, s, min(s, t)))
        start.append(s)
    for i, j in enumerate(req.future):
        sub = min(t, j.earliest) if j.submitted is None else j.submitted
        if not (t < j.earliest <= j.latest) or sub > t:
            raise ValueError(f"future[{i}]: needs submitted <= slot {t} < earliest <= latest")
        add(j.id, f"future[{i}]")
        rows.append((j.cores, j.duration, j.earliest, j.latest, sub))
        start.append(-1)
    a = np.asarray(rows, dtype=np.int64).reshape(-1, 5)
    # the Episode's rows stay in request order (ids by row); its checks are on values, not order
    ep = Episode.__new__(Episode)
    object.__setattr__(ep, "cores", a[:, 0])
    object.__setattr__(ep, "duration", a[:, 1])
    object.__setattr__(ep, "earliest", a[:, 2])
    object.__setattr__(ep, "latest", a[:, 3])
    object.__setattr__(ep, "submit", a[:, 4])
    # one value: the View carries C_t (a series as long as the slot number would cost megabytes when
    # slots count from the Unix epoch, as the daemon's may)
    object.__setattr__(ep, "capacity", np.full(1, int(req.capacity), dtype=np.int64))
    n_e, n_r = len(req.eligible), len(req.running)
    elig = np.arange(n_e)
    if n_e > 1:
        elig = elig[np.lexsort((ep.submit[elig], ep.latest[elig]))]
    running = np.arange(n_e, n_e + n_r)
    future = np.arange(n_e + n_r, len(rows))
    running_cores = int(ep.cores[running].sum()) if n_r else 0
    in_day = t % slots
    view = View(t=in_day, slots=slots, capacity=int(req.capacity), running_cores=running_cores, eligible=elig,
                running=running, future=future, episode=ep, start=np.asarray(start, dtype=np.int64) - (t - in_day))
    _shift(ep, t - in_day)
    return view, ids


def _shift(ep: Episode, offset: int) -> None:
    """Express slots relative to the policy's day (its time-left feature counts slots of a day)."""
    if offset:
        for name in ("earliest", "latest", "submit"):
            object.__setattr__(ep, name, getattr(ep, name) - offset)


def _policy_of(source, name: str):
    from agents.problem_service import hosted_policy

    return hosted_policy(source, name, "schedule")


def schedule(policy, req: ScheduleRequest, history: SummaryHistory) -> tuple[list, dict, float]:
    """(ids to start, scores by id, free cores) for one request: the one path the REST route and
    the in-process live loop share."""
    view, ids = build_view(req, policy.setting.slots)
    history.seek(req.slot)
    shown, scores = (policy.scores(view, history) if hasattr(policy, "scores")
                     else (np.zeros(0, np.int64), np.zeros(0)))
    if hasattr(policy, "scores"):
        rows = shown[select_by_scores(scores, view.episode.cores[shown], view.free,
                                      getattr(policy, "mapping", "prefix"))]
    else:
        rows = policy.schedule(view, history)
    chosen = [ids[int(r)] for r in rows]
    elig = set(int(r) for r in view.eligible)
    if any(int(r) not in elig for r in rows) or view.episode.cores[np.asarray(rows, np.int64)].sum() > max(view.free, 0):
        raise RuntimeError("policy answered jobs that are not eligible or do not fit")
    return chosen, {str(ids[int(r)]): float(s) for r, s in zip(shown, scores)}, view.free


def remember(policy, req: ScheduleRequest, history: SummaryHistory) -> None:
    """Put the slot summary `schedule` pushes for `req` into `history`, deciding nothing: a
    restarted caller rebuilds its window from the slots it already decided."""
    view, _ = build_view(req, policy.setting.slots)
    history.seek(req.slot)
    history.push(slot_summary(view, policy.setting))


def _session_history(sessions, session: str, policy) -> SummaryHistory:
    """The session's recent slot summaries, started afresh when another policy is hosted (an upload
    or a rollback): they are scaled by the policy's setting, and the service's sessions promise it."""
    held = sessions.get_or_make(session, lambda: (SummaryHistory(), _policy_tag(policy)))
    if not _tagged_by(held[1], policy):
        held = (SummaryHistory(), _policy_tag(policy))
        sessions.put(session, held)
    return held[0]


def add_routes(app: FastAPI, name: str, policy_or_registry: Any) -> None:
    sessions = problem_sessions(app, name)

    # The body is parsed by pydantic-core straight from the bytes and the answer written with
    # json.dumps: with 200+ jobs per request FastAPI's own body and response handling cost more
    # than the decision (measured in docs/benchmarks.md). The models still define the contract
    # and the OpenAPI schema.
    async def schedule_route(request: Request) -> Response:
        policy = _policy_of(policy_or_registry, name)
        try:
            req = ScheduleRequest.model_validate_json(await request.body())
        except ValidationError as e:
            return JSONResponse(status_code=422, content={"detail": validation_detail(e.errors())})
        t0 = time.perf_counter()
        try:
            history = _session_history(sessions, req.session, policy)
            start, scores, free = schedule(policy, req, history)
        except ValueError as e:
            return JSONResponse(status_code=422, content={"detail": str(e)})
        except Exception as e:  # noqa: BLE001 - a failed policy is the caller's "start nothing"
            return JSONResponse(status_code=500, content={"detail": f"agent {name!r} failed: {type(e).__name__}: {e}"})
        ms = (time.perf_counter() - t0) * 1000
        body = {"start": start, "scores": scores, "free": free, "agent": name,
                "policy_version": getattr(policy, "version", None), "latency_ms": round(ms, 4)}
        return Response(content=json.dumps(body), media_type="application/json")

    app.add_api_route(f"/v1/agents/{name}/schedule", schedule_route, methods=["POST"],
                      response_model=ScheduleResponse, summary=f"Jobs to start this slot ({name})",
                      description="Scores the eligible jobs and starts the longest prefix, highest score first, "
                                  "that fits the free cores (OSDEC §4.1.2), or packs past misfits under the "
                                  "policy's `skip` mapping.",
                      openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                          "schema": ScheduleRequest.model_json_schema()}}}},
                      responses={422: {"description": "Invalid request: the detail names the field"},
                                 500: {"description": "The agent failed; start nothing this slot"}})


def create_app(name: str, policy_or_registry: Any) -> FastAPI:
    """A FastAPI app serving only the schedule route (tests, the live loop's in-process service);
    `samm serve` mounts the same route on the Policy Evaluation Service."""
    from agents.problem_service import standalone_app

    return standalone_app(f"SAMM deferrable-job scheduling ({name})", name, policy_or_registry, add_routes)
