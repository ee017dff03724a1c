"""The placement problem's REST operation beside the generic decide route: plan a whole batch.

    POST /v1/agents/{name}/plan
    {"nodes": ["w1", "w2", ...], "slots": 8, "batch": {"Redis": 4, "MMS": 2},
     "constraints": [{"app_a": "MMS", "app_b": "ISR", "rule": "anti-affinity"}],
     "planner": "policy", "seed": 0}
    -> {"placement": [{"node": "w1", "app": "Redis", "count": 2}, ...], "score": 0.93, ...}

`planner` is `policy` (the hosted policy) or any planner of `baselines.PLANNERS` (the exact
`optimum` included). Apps are the predictor's, by name (the 422 for an unknown app lists them;
`GET /v1/agents/{name}` does not); an unknown app, a batch larger than the cluster, an impossible
batch, more slots than the planner can tabulate (the policy: 17 for 7 apps) or a batch too large
for the exact `optimum` is a 422 naming the field. The plan is checked (`check_plan`) before it is
returned: never a full node or a broken rule.
"""
from __future__ import annotations

import os
import time
from typing import Literal

import anyio
import numpy as np
from anyio.lowlevel import RunVar
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from samm.plan.schemas import cut_name

from .cluster import (MAX_TABULATED_COMPOSITIONS, Batch, Cluster, Constraints, Rule, check_plan, composition_count,
                      max_tabulated_slots, per_app_score, score)
from .errors import Infeasible
from .hosting import predictor_for

#: the exact optimum's time limit per request, None for its own (`OptimumParams.time_limit_s`, 120 s,
#: enumeration and prediction included): past it the request is a 504 and the worker thread is free
OPTIMUM_TIME_LIMIT_S: float | None = None
#: (the service documents every error's body as its one-line Problem)
PLAN_TIMED_OUT = {504: {"description": "The planner found no placement within its time limit (the exact "
                                       "optimum's, 120 s); nothing was planned"}}

#: plans computed at once (each holds a thread: CPU work); past it a request waits without one. Below
#: the 40 threads of the pool every synchronous route shares, so those always find one
PLAN_THREADS = min(32, os.cpu_count() or 2)
_PLAN_LIMITER: RunVar = RunVar("lra_plan_limiter")

PLANNER_NAMES = ("policy", "optimum", "greedy-ls", "greedy", "k8s-default", "least-loaded", "round-robin", "random")


class Strict(BaseModel):
    # strict: `true` or "2" is not a container count (JSON has real integers; the CLI's batch file
    # refuses them too)
    model_config = ConfigDict(extra="forbid", strict=True)


class RuleModel(Strict):
    app_a: str
    app_b: str
    rule: Literal["anti-affinity", "cardinality"]
    limit: int = Field(default=0, ge=0, le=64)


class PlanRequest(Strict):
    nodes: list[str] = Field(min_length=1, max_length=1024, description="Node names (identical nodes).")
    slots: int = Field(default=8, ge=1, le=64, description="Containers per node.")
    batch: dict[str, int] = Field(description="Containers to place per app (the predictor's app names).")
    constraints: list[RuleModel] = Field(default_factory=list, max_length=256)
    planner: Literal[PLANNER_NAMES] = "policy"  # type: ignore[valid-type]
    seed: int = Field(default=0, ge=0, description="Seed of the planner's random choices (numpy's: non-negative).")


class PlacementRow(BaseModel):
    node: str
    app: str
    count: int


class PlanResponse(BaseModel):
    placement: list[PlacementRow]
    score: float = Field(description="Mean normalised throughput of the batch's containers (predicted).")
    per_app: dict[str, float | None]
    seconds: float
    planner: str
    policy_version: str | None


def build_problem(req: PlanRequest, app_names: tuple[str, ...]) -> tuple[Cluster, Batch, Constraints]:
    """Request -> the problem objects, or HTTPException(422) naming the field."""
    if len(set(req.nodes)) != len(req.nodes):
        raise HTTPException(422, "nodes: node names must be unique")
    if not all(n.strip() for n in req.nodes):  # a placement onto "" names no node a caller can act on
        raise HTTPException(422, "nodes: a node name may not be empty or blank")
    index = {a: i for i, a in enumerate(app_names)}
    counts = np.zeros(len(app_names), dtype=np.int64)
    cluster = Cluster(len(req.nodes), req.slots, tuple(req.nodes))
    for app, n in req.batch.items():
        if app not in index:
            raise HTTPException(422, f"batch.{cut_name(app)}: unknown app; apps are {list(app_names)}")
        if n < 0:
            raise HTTPException(422, f"batch.{app}: must be >= 0, got {n}")
        if n > cluster.capacity:  # checked per app: a count past int64 would not fit `counts`
            raise HTTPException(422, f"batch.{app}: {n} containers > capacity {cluster.capacity}")
        counts[index[app]] = n
    if counts.sum() == 0:
        raise HTTPException(422, "batch: no containers to place")
    if counts.sum() > cluster.capacity:
        raise HTTPException(422, f"batch: {int(counts.sum())} containers > capacity {cluster.capacity}")
    rules = []
    for i, r in enumerate(req.constraints):
        for key in ("app_a", "app_b"):
            if getattr(r, key) not in index:
                raise HTTPException(422, f"constraints[{i}].{key}: unknown app {cut_name(getattr(r, key))!r}")
        if r.rule == "cardinality" and r.limit < 1:
            raise HTTPException(422, f"constraints[{i}].limit: a cardinality limit must be >= 1")
        rules.append(Rule(index[r.app_a], index[r.app_b], r.rule, r.limit))
    return cluster, Batch(counts), Constraints(len(app_names), tuple(rules))


def check_slots(slots: int, n_apps: int, limit: int = MAX_TABULATED_COMPOSITIONS, who: str = "") -> None:
    """HTTPException(422) for a slot count whose compositions the predictor and the policy would
    tabulate past `limit` (64 slots: 1.3e9 rows, the service out of memory); `who` names a
    planner whose own limit is lower."""
    n = composition_count(n_apps, slots)
    if n > limit:
        raise HTTPException(422, f"slots: {slots} slots per node make {n:,} compositions of {n_apps} apps, more than "
                                 f"{limit:,}{who}; at most {max_tabulated_slots(n_apps, limit)} slots")


def check_optimum_size(cluster: Cluster, batch: Batch) -> None:
    """HTTPException(422) for a batch whose exact optimum would need more node compositions than
    its integer program takes (`OptimumParams.max_compositions`; 20 slots and 20 of each of 7 apps
    make 888,030): the planner's ValueError reached the caller as a bare 500."""
    from .optimum import OptimumParams, count_compositions

    n, limit = count_compositions(cluster.slots, batch.counts), OptimumParams.max_compositions
    if n > limit:
        raise HTTPException(422, f"planner: optimum would solve over {n:,} node compositions of this batch on "
                                 f"{cluster.slots} slots, more than its {limit:,}; use greedy-ls or policy, or "
                                 "fewer slots")


def _plan_limiter():
    """This event loop's limiter of concurrent plans (a RunVar: anyio's own default is per loop too)."""
    try:
        return _PLAN_LIMITER.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(PLAN_THREADS)
        _PLAN_LIMITER.set(limiter)
        return limiter


def add_routes(app: FastAPI, name: str, registry) -> None:
    async def plan(req: PlanRequest) -> PlanResponse:
        # in threads of its own: seconds of CPU each (an optimum up to its time limit) took every
        # thread of the pool the service's other routes share, and /healthz waited for them
        return await anyio.to_thread.run_sync(plan_batch, req, limiter=_plan_limiter())

    def plan_batch(req: PlanRequest) -> PlanResponse:
        policy = registry.get(name)
        check_slots(req.slots, len(policy.app_names))  # before the predictor tabulates them
        if req.planner == "policy":  # its table is smaller: 18 slots passed, fit a forest, then a bare 500
            from .network import MAX_COMPOSITIONS

            check_slots(req.slots, len(policy.app_names), MAX_COMPOSITIONS, " (the policy's table)")
        try:
            predictor = predictor_for(policy, req.slots)
        except FileNotFoundError:  # the forest for another slot count needs the Metis data
            raise HTTPException(422, f"slots: this service has no interference model for {req.slots} slots per node "
                                     f"(the hosted policy's is for {getattr(policy, 'slots', None)}; other counts "
                                     "need the Metis data, which is not installed here)") from None
        except OSError as exc:  # was a bare 500
            from .place import model_problem

            raise HTTPException(500, model_problem(req.slots, exc)) from None
        cluster, batch, constraints = build_problem(req, tuple(predictor.app_names))
        if req.planner == "optimum":
            check_optimum_size(cluster, batch)
        rng = np.random.default_rng(req.seed)
        started = time.perf_counter()
        try:
            if req.planner == "policy":
                placement = policy.plan(cluster, batch, constraints, predictor, rng)
            else:
                from .baselines import PLANNERS

                limit = {} if req.planner != "optimum" or OPTIMUM_TIME_LIMIT_S is None else {
                    "time_limit_s": OPTIMUM_TIME_LIMIT_S}
                placement = PLANNERS[req.planner](cluster, batch, constraints, predictor, rng, **limit)
        except Infeasible as exc:
            raise HTTPException(422, f"batch: no placement fits the nodes and constraints ({exc})") from None
        except TimeoutError as exc:  # HiGHS stopped by its limit with no plan: was a text/plain 500
            raise HTTPException(504, f"planner: {req.planner} found no placement within its time limit ({exc}); "
                                     "use greedy-ls or policy, or a smaller batch") from None
        seconds = time.perf_counter() - started
        problems = check_plan(placement, batch, cluster, constraints)
        if problems:  # a planner bug must never reach an orchestrator
            raise HTTPException(500, f"planner {req.planner} produced an invalid plan: {problems}")
        apps = predictor.app_names
        rows = [PlacementRow(node=cluster.node_names[n], app=apps[a], count=int(placement[n, a]))
                for n, a in zip(*np.nonzero(placement))]
        pa = per_app_score(placement, predictor)
        return PlanResponse(placement=rows, score=score(placement, predictor),
                            per_app={apps[a]: (None if np.isnan(v) else float(v)) for a, v in enumerate(pa)},
                            seconds=round(seconds, 6), planner=req.planner,
                            policy_version=policy.version if req.planner == "policy" else None)

    plan.__annotations__ = {"req": PlanRequest, "return": PlanResponse}
    app.add_api_route(f"/v1/agents/{name}/plan", plan, methods=["POST"], response_model=PlanResponse,
                      responses=PLAN_TIMED_OUT,
                      summary=f"Plan a batch ({name})",
                      description="Place a whole batch of containers on identical nodes (the hosted policy, or a "
                                  "baseline planner, or the exact optimum).")
