"""A stand-alone FastAPI app for one problem's extra REST operations (tests, a live testbed's
in-process service); `samm serve` mounts the same routes on the Policy Evaluation Service.

A problem route keeps its per-session state in `problem_sessions(app, name)`, so that
POST /v1/agents/{name}/sessions/{session_id}/reset (the service's, and the stand-alone app's)
drops it as it drops the generic decide route's.

Validation errors are 422s that name the field and never echo the input (a NaN in the body
could not be written back as JSON)."""
from __future__ import annotations

from typing import Any, Callable

from fastapi import FastAPI


def standalone_app(title: str, name: str, policy_or_registry: Any,
                   add_routes: Callable[[FastAPI, str, Any], None]) -> FastAPI:
    from fastapi import Path
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    from samm.plan.schemas import add_problem_routes, document_errors, validation_detail
    from samm.plan.service import SESSION_PATTERN

    app = FastAPI(title=title)

    @app.exception_handler(RequestValidationError)
    async def invalid(request, exc: RequestValidationError):
        return JSONResponse(status_code=422, content={"detail": validation_detail(
            exc.errors(), content_type=request.headers.get("content-type"))})

    @app.get("/healthz")
    async def healthz() -> dict:
        return {"status": "ok", "agent": name, "sessions": sum(problem_session_counts(app).values())}

    @app.post(f"/v1/agents/{name}/sessions/{{session_id}}/reset", response_model=dict,
              summary=f"Start a session of {name} afresh")
    async def reset_session(session_id: str = Path(pattern=SESSION_PATTERN)) -> dict:
        return {"session_id": session_id, "existed": reset_problem_sessions(app, name, session_id)}

    add_problem_routes(app, add_routes, name, policy_or_registry)
    document_errors(app, body_limit=False)  # the problem routes' 422s are one line, as the service's
    return app


def problem_sessions(app: FastAPI, name: str):
    """The per-session state of agent `name`'s problem routes on `app` (the service's cap and TTL),
    registered so that the session reset route reaches it: a cache of its own, which the generic
    reset never saw, kept a reset session's frame stack or slot history."""
    from samm.plan.sessions import sessions_for

    cache = sessions_for(app)
    registered = getattr(app.state, "problem_sessions", None)
    if registered is None:
        registered = app.state.problem_sessions = {}
    registered.setdefault(name, []).append(cache)
    return cache


def problem_session_counts(app: FastAPI) -> dict[str, int]:
    """Live sessions held by each agent's problem routes on `app` (those idle past the TTL dropped
    first): each route's cache has its own cap, so /healthz counting only the decide routes' store
    under-counted the memory held by a service whose callers use /allocate or /schedule."""
    counts = {}
    for name, caches in getattr(app.state, "problem_sessions", {}).items():
        for cache in caches:
            cache.expire()
        counts[name] = sum(len(cache) for cache in caches)
    return counts


def reset_problem_sessions(app: FastAPI, name: str, session_id: str) -> bool:
    """Drop `session_id` from agent `name`'s problem routes; whether one held it."""
    caches = getattr(app.state, "problem_sessions", {}).get(name, ())
    return any([cache.pop(session_id) for cache in caches])   # a list: every cache, not the first hit


def hosted_policy(source: Any, name: str, operation: str):
    """`source` is the policy itself (it has `operation`, e.g. "schedule") or a registry holding
    it under `name` (what `samm serve` passes, so an uploaded version takes effect at once)."""
    from fastapi import HTTPException

    if hasattr(source, operation):
        return source
    policy = source.get(name)
    if policy is None:
        raise HTTPException(404, f"no hosted agent {name!r}")
    return policy
