"""A stand-alone FastAPI app for one problem's extra REST operations (tests, a live testbed's
in-process service); `samm serve` mounts the same routes on the Policy Evaluation Service.

Validation errors are 422s that name the field and never echo the input (a NaN in the body
could not be written back as JSON)."""
from __future__ import annotations

from typing import Any, Callable

from fastapi import FastAPI


def standalone_app(title: str, name: str, policy_or_registry: Any,
                   add_routes: Callable[[FastAPI, str, Any], None]) -> FastAPI:
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    from samm.plan.schemas import validation_detail

    app = FastAPI(title=title)

    @app.exception_handler(RequestValidationError)
    async def invalid(request, exc: RequestValidationError):
        return JSONResponse(status_code=422, content={"detail": validation_detail(exc.errors())})

    @app.get("/healthz")
    async def healthz() -> dict:
        return {"status": "ok", "agent": name}

    add_routes(app, name, policy_or_registry)
    return app


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
