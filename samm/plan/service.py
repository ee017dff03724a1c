"""The Policy Evaluation Service: hosted agents decide over REST.

Typed requests and responses, explicit 4xx errors naming the offending field (never a 500 for
bad input), recurrent state per session, bearer-token policy uploads with validation and
rollback, OpenAPI at /openapi.json and Prometheus metrics at /metrics.
"""
from __future__ import annotations

import base64
import binascii
import hmac
import json
import logging
import math
import time

import anyio
import numpy as np
from fastapi import FastAPI, Header, HTTPException, Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.routing import Match

from samm import __version__

from . import dataplane
from .registry import PolicyRegistry, PolicyRejected, _is_autoscaler, broken_probabilities
from .schemas import (AGENT_FAILED, Problem, add_problem_routes, decide_models, document_errors, first_names,
                      json_body_problem, validation_detail)
from .sessions import DEFAULT_MAX_SESSIONS, DEFAULT_SESSION_TTL_S, SessionStore

log = logging.getLogger(__name__)

SESSION_PATTERN = r"^[A-Za-z0-9._:-]{1,128}$"
AGENT_PATTERN = r"^[A-Za-z0-9._-]{1,64}$"
# a request body past this is refused before it is held in memory (413); the largest shipped
# policy is ~0.8 MB as Base64, a decide or plan request a few KB
DEFAULT_MAX_BODY_BYTES = 64 * 2**20
# a request's whole body must arrive within this (408 past it): one trickled a byte at a time held
# its connection for ever; 64 MB at 1 MB/s still arrives
DEFAULT_BODY_TIMEOUT_S = 120.0


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DecideRequest(Strict):
    session_id: str = Field(pattern=SESSION_PATTERN, description="Caller's session; recurrent state is kept per session.")
    observation: dict[str, float] = Field(description="Named features, exactly the agent's `feature_names`.")
    deterministic: bool = Field(default=True, description="Most likely action (default) or a sample.")


class DecideResponse(BaseModel):
    action: int | list[int]
    action_name: str
    probabilities: list[float] | list[list[float]] | None
    value: float | None
    policy_version: str
    session_id: str


class AgentInfo(BaseModel):
    name: str
    problem: str
    kind: str
    policy_version: str
    previous_version: str | None
    observation_space: dict
    action_space: dict
    # autoscaling agents only (their named-feature contract)
    feature_names: list[str] | None = None
    action_mode: str | None = None
    action_names: list[str] | None = None
    type_names: list[str] | None = None


class AgentList(BaseModel):
    agents: list[AgentInfo]


class PolicyUpload(Strict):
    files: dict[str, str] = Field(description="File name -> Base64 content; metadata.json plus the agent's weights.")


class PolicyVersion(BaseModel):
    name: str
    policy_version: str
    previous_version: str | None


class Health(BaseModel):
    status: str
    version: str
    agents: int
    sessions: int = Field(description="Live sessions held by every route: the decide routes' and each problem "
                                      "route's (every store has its own --max-sessions cap).")
    decide_sessions: int = Field(description="Of which the decide routes' (their one shared store).")
    problem_sessions: dict[str, int] = Field(description="Of which each agent's problem routes' (/allocate, "
                                                         "/schedule), by agent.")


def create_app(registry: PolicyRegistry, token: str | None = None,
               session_ttl_s: float = DEFAULT_SESSION_TTL_S, max_sessions: int = DEFAULT_MAX_SESSIONS,
               sessions: SessionStore | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S) -> FastAPI:
    app = FastAPI(title="SAMM Policy Evaluation Service", version=__version__,
                  description="Decisions of hosted agents over REST. Each agent's decide request and response "
                              "are generated from its observation and action spaces.")
    # a token read from a file or a secret often ends in a newline, which no client can send: every
    # upload was refused as "invalid token" (the header's own whitespace is stripped below)
    token = (token or "").strip() or None
    if sessions is None:  # not `or`: an empty store is falsy (it has a length), and a caller's own was dropped
        sessions = SessionStore(ttl_s=session_ttl_s, max_sessions=max_sessions)
    metrics = CollectorRegistry()
    requests = Counter("samm_service_requests", "HTTP requests", ["endpoint", "status"], registry=metrics)
    latency = Histogram("samm_service_decide_latency_seconds", "Decision latency", ["agent"], registry=metrics,
                        buckets=(0.0002, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25))
    decisions = Counter("samm_service_decisions", "Decisions by action", ["agent", "action"], registry=metrics)
    app.state.registry, app.state.sessions = registry, sessions

    class CountRequests:
        """Plain ASGI middleware (Starlette's BaseHTTPMiddleware costs ~1 ms per request)."""

        def __init__(self, inner):
            self.inner = inner

        async def __call__(self, scope, receive, send):
            if scope["type"] != "http":
                return await self.inner(scope, receive, send)
            status = {"code": 500}

            async def send_wrapper(message):
                if message["type"] == "http.response.start":
                    status["code"] = message["status"]
                await send(message)

            try:
                await self.inner(scope, receive, send_wrapper)
            finally:
                requests.labels(_endpoint_of(app, scope), str(status["code"])).inc()

    class AuthenticateFirst:
        """Policy uploads and rollbacks check the bearer token before the body is read or
        validated: an anonymous caller learns nothing about the schema (401, never 422)."""

        def __init__(self, inner):
            self.inner = inner

        async def __call__(self, scope, receive, send):
            if scope["type"] == "http" and scope["method"] in ("PUT", "POST") and _is_policy_path(scope["path"]):
                headers = dict(scope.get("headers") or [])
                auth = headers.get(b"authorization")
                try:
                    require_token(auth.decode("latin-1") if auth is not None else None)
                except HTTPException as exc:
                    resp = JSONResponse(status_code=exc.status_code, content={"detail": exc.detail})
                    return await resp(scope, receive, send)
            return await self.inner(scope, receive, send)

    class LimitBody:
        """Refuse a body over max_body_bytes: by its Content-Length before reading, or, when it
        comes chunked, as soon as the bytes read pass the limit."""

        def __init__(self, inner):
            self.inner = inner

        async def __call__(self, scope, receive, send):
            if scope["type"] != "http":
                return await self.inner(scope, receive, send)
            declared = dict(scope.get("headers") or []).get(b"content-length")
            if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
                resp = JSONResponse(status_code=413, content={"detail": _too_large(max_body_bytes)})
                return await resp(scope, receive, send)
            seen = 0

            async def counted_receive():
                nonlocal seen
                message = await receive()
                if message["type"] == "http.request":
                    seen += len(message.get("body", b""))
                    if seen > max_body_bytes:
                        # CheckJson answers it (FastAPI's body reader also passes an HTTPException on)
                        raise HTTPException(413, _too_large(max_body_bytes))
                return message

            return await self.inner(scope, counted_receive, send)

    class CheckJson:
        """Read a request's whole body (within LimitBody's bound) and refuse, as a 422 naming it, one
        that no route should read (`json_body_problem`: a key twice, nesting too deep), in one
        place for every route; the route then reads the same body."""

        def __init__(self, inner):
            self.inner = inner

        async def __call__(self, scope, receive, send):
            if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
                return await self.inner(scope, receive, send)
            chunks, gone = [], None
            try:
                with anyio.move_on_after(body_timeout_s) as deadline:
                    while True:
                        message = await receive()
                        if message["type"] != "http.request":
                            gone = message  # the caller went away: the route sees it as before
                            break
                        chunks.append(message.get("body", b""))
                        if not message.get("more_body", False):
                            break
            except HTTPException as exc:  # over the body limit, while it arrived
                return await JSONResponse(status_code=exc.status_code, content={"detail": exc.detail})(
                    scope, receive, send)
            if deadline.cancelled_caught:  # a trickled body held its connection and its bytes for ever
                return await JSONResponse(status_code=408, headers={"connection": "close"}, content={
                    "detail": f"request body not complete within {body_timeout_s:g} s"})(scope, receive, send)
            body = b"".join(chunks)
            del chunks  # one copy of the body is held, not two
            problem = json_body_problem(body) if body and gone is None else None
            if problem:
                return await JSONResponse(status_code=422, content={"detail": problem})(scope, receive, send)
            pending = [{"type": "http.request", "body": body, "more_body": gone is not None}]
            if gone is not None:
                pending.append(gone)
            del body

            async def replay():
                return pending.pop(0) if pending else await receive()

            return await self.inner(scope, replay, send)

    app.add_middleware(CheckJson)  # inside LimitBody (its bound holds) and AuthenticateFirst (401 first)
    app.add_middleware(LimitBody)
    app.add_middleware(AuthenticateFirst)
    app.add_middleware(CountRequests)  # added last = outermost: counts the uploads refused above too

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        # name the field: "body.observation.cpu_mean: Input should be a valid number"
        return JSONResponse(status_code=422, content={"detail": validation_detail(
            exc.errors(), content_type=request.headers.get("content-type"))})

    def agent_or_404(name: str):
        agent = registry.get(name)
        if agent is None:
            raise HTTPException(404, f"no hosted agent {name!r}; hosted: {registry.names()}")
        return agent

    def require_token(authorization: str | None) -> None:
        if token is None:
            raise HTTPException(403, "policy uploads are disabled: the service has no token configured")
        # the scheme is case-insensitive (RFC 9110 11.1): "bearer TOKEN" from curl scripts is one
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not given:
            raise HTTPException(401, "missing bearer token")
        if not hmac.compare_digest(given.strip().encode(), token.encode()):
            raise HTTPException(403, "invalid token")

    errors = {404: {"model": Problem}, 422: {"model": Problem}}

    @app.get("/healthz", response_model=Health)
    def healthz() -> Health:
        from agents.problem_service import problem_session_counts

        decide, problem = len(sessions), problem_session_counts(app)
        return Health(status="ok", version=__version__, agents=len(registry.names()),
                      sessions=decide + sum(problem.values()), decide_sessions=decide, problem_sessions=problem)

    @app.get("/metrics", response_class=PlainTextResponse)
    def prometheus() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(metrics).decode(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/agents", response_model=AgentList)
    def list_agents() -> AgentList:
        return AgentList(agents=[AgentInfo(**registry.describe(n)) for n in registry.names()])

    @app.get("/v1/agents/{agent}", response_model=AgentInfo, responses=errors)
    def describe_agent(agent: str = Path(pattern=AGENT_PATTERN)) -> AgentInfo:
        agent_or_404(agent)
        return AgentInfo(**registry.describe(agent))

    # Agents of every problem but autoscaling get a route whose models come from their spaces;
    # registered before the autoscaler's parametric route, so they match first.
    for hosted in registry.names():
        policy = registry.get(hosted)
        if not _is_autoscaler(policy):
            _add_space_routes(app, hosted, registry, sessions, latency, errors | AGENT_FAILED)

    @app.post("/v1/agents/{agent}/decide", response_model=DecideResponse, responses=errors | AGENT_FAILED,
              summary="Decide (autoscaling agents: named features)")
    async def decide(req: DecideRequest, agent: str = Path(pattern=AGENT_PATTERN)) -> Response:
        # async on purpose: a decision is ~1 ms of CPU; a threadpool hop would cost as much
        a = agent_or_404(agent)
        if not _is_autoscaler(a):
            raise HTTPException(422, f"agent {agent!r} is not an autoscaling agent; see its own schema")
        obs = req.observation
        missing = [f for f in a.feature_names if f not in obs]
        unknown = [f for f in obs if f not in a.feature_names]
        if missing or unknown:
            # the first names only: 200,000 unknown ones were a 422 of 3.4 MB
            raise HTTPException(422, "observation: " + "; ".join(
                ([f"missing {first_names(missing)}"] if missing else [])
                + ([f"unknown {first_names(unknown)}"] if unknown else []))
                + f" (expected exactly {list(a.feature_names)})")
        space = a.observation_space  # the bounds are the agent's, not the service's
        for i, name in enumerate(a.feature_names):
            v = obs[name]
            if not math.isfinite(v):
                raise HTTPException(422, f"observation.{name}: must be a finite number, got {v}")
            lo, hi = float(space.low[i]), float(space.high[i])
            if not lo <= v <= hi:
                raise HTTPException(422, f"observation.{name}: must be within [{lo:g}, {hi:g}], got {v}")
        x = np.array([[obs[f] for f in a.feature_names]], dtype=np.float32)
        started = time.perf_counter()
        state = sessions.checkout(agent, req.session_id, a)
        try:
            d, state = a.act(x, state, deterministic=req.deterministic)
        except Exception as exc:  # noqa: BLE001 - a failing policy is a 500 naming it, never a dropped connection
            log.exception("agent %s failed to decide", agent)
            raise HTTPException(500, f"agent {agent!r} failed: {type(exc).__name__}: {exc}") from None
        if broken_probabilities(d):
            # a broken policy (NaN weights) still answers an argmax: 200 with "remove" every type, in
            # a body no strict JSON reader takes; a 500 is the daemon's do-nothing
            log.error("agent %s answered non-finite probabilities", agent)
            raise HTTPException(500, f"agent {agent!r} failed: its action probabilities are not finite "
                                     "(a broken policy); nothing decided")
        sessions.store(agent, req.session_id, a, state)
        latency.labels(agent).observe(time.perf_counter() - started)
        act = np.asarray(d.actions)[0]
        action = int(act) if a.action_mode == "paper" else [int(v) for v in act]
        name = a.describe_action(act)
        decisions.labels(agent, name).inc()
        probs = None if d.probabilities is None else np.asarray(d.probabilities)[0].round(6).tolist()
        value = None if d.values is None else float(np.asarray(d.values)[0])
        value = value if value is None or math.isfinite(value) else None  # JSON has no NaN
        # the response model is the contract (and the OpenAPI schema); writing the JSON directly
        # skips FastAPI's validate-and-encode pass, a third of the route's time (measured)
        return Response(content=json.dumps({"action": action, "action_name": name, "probabilities": probs,
                                            "value": value, "policy_version": a.version,
                                            "session_id": req.session_id}), media_type="application/json")

    @app.post("/v1/agents/{agent}/sessions/{session_id}/reset", response_model=dict, responses=errors)
    async def reset_session(agent: str = Path(pattern=AGENT_PATTERN),
                            session_id: str = Path(pattern=SESSION_PATTERN)) -> dict:
        # async like the decide routes, so never run between a decide's checkout and its store (in a
        # worker thread it could, and that decide then stored the memory the reset had dropped)
        from agents.problem_service import reset_problem_sessions

        agent_or_404(agent)
        # the problem routes (allocate, schedule) keep their sessions apart: a reset reaches them too
        existed = [sessions.reset(agent, session_id), reset_problem_sessions(app, agent, session_id)]
        return {"session_id": session_id, "existed": any(existed)}

    from agents.registry import entry, get_problem

    for hosted in registry.names():  # problem-specific operations (e.g. a placement batch plan)
        policy = registry.get(hosted)
        spec = get_problem(policy.problem)
        if spec.routes:
            add_problem_routes(app, entry(spec, "routes"), hosted, registry)

    @app.put("/v1/agents/{agent}/policy", response_model=PolicyVersion,
             responses={**errors, **{code: {"model": Problem} for code in (401, 403, 413, 503)}})
    def upload_policy(body: PolicyUpload, agent: str = Path(pattern=AGENT_PATTERN),
                      authorization: str | None = Header(default=None)) -> PolicyVersion:
        require_token(authorization)  # (already checked before the body by AuthenticateFirst)
        agent_or_404(agent)
        try:
            files = {k: base64.b64decode(v, validate=True) for k, v in body.files.items()}
        except (binascii.Error, ValueError) as exc:
            raise HTTPException(422, f"files: not valid Base64 ({exc})") from None
        try:
            swapped = registry.upload_hosted(agent, files)
        except PolicyRejected as exc:
            raise HTTPException(422, f"policy rejected, {registry.describe(agent)['policy_version']} kept: {exc}") from None
        except OSError as exc:  # the service's own store, not the caller's policy
            log.error("policy store %s: %s", registry.store_dir, exc)
            raise HTTPException(503, f"policy store unavailable ({exc.strerror or exc}), "
                                     f"{registry.describe(agent)['policy_version']} kept") from None
        return _policy_version(agent, swapped)

    @app.post("/v1/agents/{agent}/policy/rollback", response_model=PolicyVersion,
              responses={**errors, **{code: {"model": Problem} for code in (401, 403, 409, 503)}})
    def rollback(agent: str = Path(pattern=AGENT_PATTERN), authorization: str | None = Header(default=None)) -> PolicyVersion:
        require_token(authorization)
        agent_or_404(agent)
        try:
            swapped = registry.rollback_hosted(agent)
        except PolicyRejected as exc:
            raise HTTPException(409, str(exc)) from None
        except OSError as exc:  # the store could not record which policy a restart should host
            log.error("policy store %s: %s", registry.store_dir, exc)
            raise HTTPException(503, f"policy store unavailable ({exc.strerror or exc}), "
                                     f"{registry.describe(agent)['policy_version']} kept") from None
        return _policy_version(agent, swapped)

    document_errors(app, body_limit=True)
    return app


# uvicorn's default parser (httptools) waits for a request's headers for ever and takes any size
# of them (200 MB of headers were held in memory and answered): the body limit alone bounded nothing
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_MAX_HEADER_BYTES = 64 * 2**10


def server_config(app, host: str, port: int, header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
                  max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES, **uvicorn_options):
    """uvicorn's Config for `app`, its HTTP protocol bounding each request's headers: they must
    arrive whole within `header_timeout_s` of the connection or of the request's first byte (else
    a 408 and the connection closed) and be at most `max_header_bytes` (else a 431)."""
    import uvicorn

    return uvicorn.Config(app, host=host, port=port, http=bounded_headers_protocol(header_timeout_s, max_header_bytes),
                          **uvicorn_options)


def bounded_headers_protocol(timeout_s: float, max_bytes: int):
    """uvicorn's httptools protocol with a deadline and a size limit on each request's headers."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class BoundedHeaders(HttpToolsProtocol):
        _deadline = None
        _header_bytes: int | None = 0   # None once the headers are whole (the body is LimitBody's)

        def connection_made(self, transport):
            super().connection_made(transport)
            self._await_headers()

        def on_message_begin(self):
            super().on_message_begin()
            self._await_headers()

        def _await_headers(self):
            self._header_bytes = 0
            if self._deadline is None:
                self._deadline = self.loop.call_later(timeout_s, self._refuse, 408,
                                                      f"request headers not complete within {timeout_s:g} s")

        def on_headers_complete(self):
            self._header_bytes = None
            self._stop_deadline()
            super().on_headers_complete()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._header_bytes is not None:  # bytes of headers not yet whole
                self._header_bytes += len(data)
                if self._header_bytes > max_bytes:
                    self._refuse(431, f"request headers over {max_bytes:,} bytes")

        def connection_lost(self, exc):
            self._stop_deadline()
            super().connection_lost(exc)

        def _stop_deadline(self):
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _refuse(self, status: int, detail: str) -> None:
            self._deadline = None
            if self.transport.is_closing():
                return
            body = json.dumps({"detail": detail}).encode()
            reason = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}[status]
            self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                                 b"connection: close\r\n\r\n%s" % (status, reason, len(body), body))
            self.transport.close()

    return BoundedHeaders


def _policy_version(name: str, hosted) -> PolicyVersion:
    """The versions an upload or rollback swapped, as it swapped them (not as a concurrent one left them)."""
    return PolicyVersion(name=name, policy_version=hosted.agent.version,
                         previous_version=hosted.previous.version if hosted.previous is not None else None)


def _too_large(limit: int) -> str:
    return f"request body over {limit:,} bytes (the service's --max-body-mb)"


def _is_policy_path(path: str) -> bool:
    parts = path.strip("/").split("/")
    return len(parts) >= 4 and parts[:2] == ["v1", "agents"] and parts[3] == "policy"


def _endpoint_of(app: FastAPI, scope) -> str:
    """The route template a request was for (the request counter's label), also for one refused
    before it reached the router: a refused upload (401, 403), and any body over the limit (413),
    which was counted as "unmatched" whatever route it was sent to."""
    route = scope.get("route")
    if route is None:
        route = next((r for r in app.router.routes if r.matches(scope)[0] == Match.FULL), None)
    return getattr(route, "path", None) or "unmatched"


def _space_route_errors(errors: dict) -> dict:
    """What the route of one named agent answers: never a 404 (it exists while its agent is hosted),
    a 501 for a policy that answers only its problem's own route."""
    return {**{code: r for code, r in errors.items() if code != 404},
            501: {"model": Problem, "description": "This agent decides only through its problem's own route"}}


def _add_space_routes(app: FastAPI, name: str, registry: PolicyRegistry, sessions: SessionStore, latency,
                      errors: dict) -> None:
    """POST /v1/agents/{name}/decide with request/response models generated from the spaces."""
    policy = registry.get(name)
    Request_, Response_ = decide_models(name, policy)
    unkept: set[str] = set()

    async def decide_any(req: Request_) -> Response_:  # type: ignore[valid-type]
        p = registry.get(name)
        body = req.model_dump()
        started = time.perf_counter()
        remembers = bool(getattr(p, "stateful", False))
        kept = remembers and req.session_id is not None          # its memory lives under the session
        if kept:
            state = sessions.checkout(name, req.session_id, p)
        else:
            state = sessions.fresh(p) if remembers else None
        try:
            d, state = dataplane.decide(p, body["observation"], mask=body.get("action_mask"),
                                        deterministic=req.deterministic, state=state)
        except dataplane.InvalidInput as exc:
            raise HTTPException(422, str(exc)) from None
        except NotImplementedError as exc:  # e.g. a heuristic that only answers its problem's own route
            raise HTTPException(501, str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - a failing policy is a 500 naming it, never a dropped connection
            log.exception("agent %s failed to decide", name)
            raise HTTPException(500, f"agent {name!r} failed: {type(exc).__name__}: {exc}") from None
        try:  # before the session keeps the new memory: a failed answer leaves it as it was
            answer = Response_(action=d.action, action_name=d.name, info=d.info, policy_version=p.version,
                               session_id=req.session_id,
                               memory="session" if kept else "not kept" if remembers else "none")
        except ValidationError as exc:  # e.g. a NaN action from an extreme (in-bounds) input: a plain-text 500
            log.error("agent %s answered outside its action space: %s", name, exc.errors()[:1])
            raise HTTPException(500, f"agent {name!r} failed: its answer is not an element of its action space "
                                     f"({validation_detail(exc.errors(), limit=1)})") from None
        if kept:
            sessions.store(name, req.session_id, p, state)
        latency.labels(name).observe(time.perf_counter() - started)
        if remembers and not kept and p.version not in unkept:     # once per version, not per call
            unkept.add(p.version)
            log.warning("agent %s keeps a memory per session, but a decide call named no session_id: it "
                        "decided from an empty memory", name)
        return answer

    # the module has postponed annotations: give FastAPI the generated classes themselves
    decide_any.__annotations__ = {"req": Request_, "return": Response_}
    app.add_api_route(f"/v1/agents/{name}/decide", decide_any, methods=["POST"], response_model=Response_,
                      responses=_space_route_errors(errors), summary=f"Decide ({policy.problem}: {name})",
                      description=f"One decision of the hosted `{name}` agent ({policy.problem}, {policy.kind}). "
                                  "The observation must be an element of the agent's observation space.")
