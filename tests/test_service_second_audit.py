"""Second audit of the Policy Evaluation Service: what /healthz counts, the daemon's HTTP client
against a real uvicorn that answers slowly, with error pages or with numbers past any float, and
/openapi.json against the errors the routes really answer. Each test once failed: /healthz left
out every problem route's sessions, a trickled answer held the daemon's iteration for as long as
it trickled, a proxy's error page made a reason of many lines, a reply's huge value raised out of
the iteration, and the schema documented 422s the routes never answer (and left out 413 and 500)."""
import time

import httpx
import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.testclient import TestClient

from agents.deferrable_jobs.policy import shipped_policy
from agents.factory import make_agent
from agents.ppo.agent import LstmPpoAgent
from samm.localproc import AppInThread
from samm.plan.client import HttpPlanner
from samm.plan.registry import PolicyRegistry
from samm.plan.service import create_app
from samm.plan.sessions import SessionStore
from sim_bridge.config import SimConfig

SHIPPED = make_agent("lstm-ppo", SimConfig())
OBS = {n: 0.2 for n in SHIPPED.feature_names}


def schedule_body(session: str, slot: int = 30) -> dict:
    return {"slot": slot, "capacity": 40, "session": session,
            "eligible": [{"id": f"j{slot}-{i}", "cores": 1 + i, "duration": 3, "earliest": slot,
                          "latest": slot + 4} for i in range(3)]}


# -- /healthz counts every route's sessions ----------------------------------------------------------
def test_healthz_counts_the_problem_routes_sessions_too(tmp_path):
    """Each problem route keeps its own session cache (its own --max-sessions cap): /healthz counted
    only the decide routes' store, so a service whose callers use /schedule reported 0 sessions
    however much memory it held."""
    now = [0.0]
    reg = PolicyRegistry(tmp_path / "store")
    reg.host("lstm-ppo", LstmPpoAgent(SHIPPED.feature_names, action_mode=SHIPPED.action_mode, version="v1"))
    reg.host("osdec", shipped_policy())
    app = create_app(reg, sessions=SessionStore(ttl_s=60, clock=lambda: now[0]))
    with AppInThread(app) as srv, httpx.Client(base_url=srv.url, timeout=60) as client:
        for session in ("c1", "c2", "c3"):
            r = client.post("/v1/agents/osdec/schedule", json=schedule_body(session))
            assert r.status_code == 200, r.text
        r = client.post("/v1/agents/lstm-ppo/decide", json={"session_id": "d1", "observation": OBS})
        assert r.status_code == 200, r.text
        health = client.get("/healthz").json()
        assert (health["sessions"], health["decide_sessions"], health["problem_sessions"]) == (4, 1, {"osdec": 3})
        now[0] = 61.0   # every session idle past the TTL: none is held any more
        health = client.get("/healthz").json()
        assert (health["sessions"], health["problem_sessions"]) == (0, {"osdec": 0})


def test_a_stand_alone_problem_app_reports_its_sessions():
    from agents.deferrable_jobs.service import create_app as schedule_app

    client = TestClient(schedule_app("osdec", shipped_policy()))
    assert client.get("/healthz").json()["sessions"] == 0
    for session in ("a", "b"):
        assert client.post("/v1/agents/osdec/schedule", json=schedule_body(session)).status_code == 200
    assert client.get("/healthz").json() == {"status": "ok", "agent": "osdec", "sessions": 2}


# -- the daemon's HTTP client ---------------------------------------------------------------------
AGENT = {"name": "a", "feature_names": ["x", "y"], "action_mode": "per-type", "type_names": ["S", "M", "L"]}
GOOD = b'{"action": [1, 2, 0], "action_name": "keep S, add M, remove L", "policy_version": "v1"}'


@pytest.fixture(scope="module")
def odd_service():
    """A real uvicorn answering as the test sets: `decide` is (status, body bytes, seconds per byte)."""
    answers = {"agents": (200, {"agents": [AGENT]}), "decide": (200, GOOD, 0.0)}
    app = FastAPI()

    @app.get("/v1/agents")
    def agents():
        status, body = answers["agents"]
        return JSONResponse(body, status) if isinstance(body, dict) else Response(body, status)

    @app.post("/v1/agents/{name}/decide")
    async def decide(name: str):
        import asyncio

        status, body, per_byte = answers["decide"]
        if not per_byte:
            return Response(body, status, media_type="application/json")

        async def trickle():
            for i in range(len(body)):
                yield body[i:i + 1]
                await asyncio.sleep(per_byte)
        return StreamingResponse(trickle(), status, media_type="application/json")

    with AppInThread(app) as server:
        yield server.url, answers
        answers.update(agents=(200, {"agents": [AGENT]}), decide=(200, GOOD, 0.0))


@pytest.fixture()
def answers(odd_service):
    url, answers = odd_service
    yield url, answers
    answers.update(agents=(200, {"agents": [AGENT]}), decide=(200, GOOD, 0.0))


def test_a_trickled_answer_is_cut_at_the_timeout(answers):
    """requests' timeout bounds each socket read: a service (or a proxy) sending its answer a byte
    every 0.2 s held the daemon's iteration for the whole answer (~18 s here, hours for a larger
    one) although the planner's timeout was 1 s."""
    url, answers = answers
    answers["decide"] = (200, GOOD, 0.2)
    planner = HttpPlanner(url, "a", session_id="s", timeout_s=1.0)
    assert planner.feature_names == ("x", "y")
    started = time.monotonic()
    out = planner.decide(np.zeros(2))
    took = time.monotonic() - started
    assert out.source == "fallback" and out.deltas == {} and "Timeout" in out.reason, out
    assert took < 6, took
    answers["decide"] = (200, GOOD, 0.0)
    assert planner.decide(np.zeros(2)).source == "agent"


def test_an_error_page_is_one_line_in_the_recorded_reason(answers):
    """A proxy's HTML error page went into the decision's reason (and the log line) as is, newlines
    and all: a reason is one line."""
    url, answers = answers
    page = b"<html>\n<head><title>502 Bad Gateway</title></head>\n<body>\n<center>nginx</center>\n</body>\n</html>\n"
    answers["decide"] = (502, page, 0.0)
    out = HttpPlanner(url, "a", session_id="s", timeout_s=5).decide(np.zeros(2))
    assert out.source == "fallback" and "HTTP 502" in out.reason and "502 Bad Gateway" in out.reason, out
    assert "\n" not in out.reason, out.reason


def test_an_agent_list_refused_names_its_status(answers):
    """A 503 (or a proxy's 404) on the agent list was recorded as "unreachable: HTTPError"."""
    url, answers = answers
    answers["agents"] = (503, b"service starting\n")
    out = HttpPlanner(url, "a", session_id="s", timeout_s=5).decide(np.zeros(2))
    assert out.source == "fallback" and "HTTP 503" in out.reason and "service starting" in out.reason, out
    assert "\n" not in out.reason


def test_a_value_past_any_float_is_dropped_not_raised(answers):
    """JSON integers have no limit: `math.isfinite(10**400)` raised OverflowError out of `decide`,
    and the daemon's iteration ended with no decision recorded."""
    url, answers = answers
    answers["decide"] = (200, b'{"action": [1, 2, 0], "value": 1' + b"0" * 400 + b', "policy_version": "v1"}', 0.0)
    out = HttpPlanner(url, "a", session_id="s", timeout_s=5).decide(np.zeros(2))
    assert out.source == "agent" and out.deltas == {"S": 0, "M": 1, "L": -1} and out.value is None, out


# -- /openapi.json says what the routes answer -------------------------------------------------------
def _schema_of(spec: dict, path: str, status: str) -> dict:
    return spec["paths"][path]["post"]["responses"][status]["content"]["application/json"]["schema"]


def test_openapi_documents_the_errors_the_routes_answer(tmp_path):
    """The problem routes' 422s were documented as FastAPI's list of error objects while every one
    answers `{"detail": "<one line>"}` (a generated client failed to read them); a body over the
    limit (413) and a failing agent (500) were undocumented on the decide routes."""
    from agents.registry import make_policy

    reg = PolicyRegistry(tmp_path / "store")
    reg.host("lstm-ppo", make_agent("lstm-ppo", SimConfig()))
    reg.host("osdec", shipped_policy())
    reg.host("c2marl", make_policy("c2marl", None))
    client = TestClient(create_app(reg, max_body_bytes=4096))
    spec = client.get("/openapi.json").json()
    problem = {"$ref": "#/components/schemas/Problem"}
    for path in ("/v1/agents/c2marl/admit", "/v1/agents/c2marl/admit/batch", "/v1/agents/osdec/schedule",
                 "/v1/agents/osdec/decide", "/v1/agents/{agent}/decide"):
        assert _schema_of(spec, path, "422") == problem, path
        assert _schema_of(spec, path, "413") == problem, path
    for path in ("/v1/agents/osdec/decide", "/v1/agents/{agent}/decide", "/v1/agents/c2marl/admit",
                 "/v1/agents/c2marl/admit/batch", "/v1/agents/osdec/schedule"):
        assert _schema_of(spec, path, "500") == problem, path
    assert "HTTPValidationError" not in spec["components"]["schemas"]
    # what is documented is what comes back
    r = client.post("/v1/agents/c2marl/admit", json={"subscriber": "x"})
    assert r.status_code == 422 and isinstance(r.json()["detail"], str), r.text
    r = client.post("/v1/agents/osdec/schedule", json={"slot": 1, "padding": "x" * 5000})
    assert r.status_code == 413 and isinstance(r.json()["detail"], str), r.text


def test_a_stand_alone_problem_apps_openapi_documents_its_422s():
    from agents.deferrable_jobs.service import create_app as schedule_app

    client = TestClient(schedule_app("osdec", shipped_policy()))
    spec = client.get("/openapi.json").json()
    reset = "/v1/agents/osdec/sessions/{session_id}/reset"
    assert _schema_of(spec, reset, "422") == {"$ref": "#/components/schemas/Problem"}
    r = client.post("/v1/agents/osdec/sessions/bad%20id/reset")
    assert r.status_code == 422 and isinstance(r.json()["detail"], str), r.text
    assert "413" not in spec["paths"]["/v1/agents/osdec/schedule"]["post"]["responses"]  # no body limit here
    assert _schema_of(spec, "/v1/agents/osdec/schedule", "500") == {"$ref": "#/components/schemas/Problem"}


# -- bad requests get a short answer that names the problem --------------------------------------------
def test_an_observation_of_thousands_of_unknown_names_gets_a_short_422(tmp_path):
    """Every unknown name was listed: 200,000 of them (a caller sending all its metrics) made a
    422 of 3.4 MB."""
    reg = PolicyRegistry(tmp_path / "store")
    reg.host("lstm-ppo", SHIPPED)
    obs = {f"metric_{i:06d}": 0.1 for i in range(50_000)}
    r = TestClient(create_app(reg)).post("/v1/agents/lstm-ppo/decide", json={"session_id": "s", "observation": obs})
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert len(detail) < 4000, len(detail)
    assert "metric_000000" in detail and "and 49980 more" in detail and "cpu_mean" in detail, detail[:500]


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "text/plain"])
def test_a_json_body_sent_under_another_content_type_is_named(tmp_path, content_type):
    """`curl -d` sends a form Content-Type: the valid request was refused as "body: Input should be
    a valid dictionary or object", which named nothing the caller could fix."""
    import json

    reg = PolicyRegistry(tmp_path / "store")
    reg.host("lstm-ppo", SHIPPED)
    client = TestClient(create_app(reg))
    body = json.dumps({"session_id": "s", "observation": OBS})
    r = client.post("/v1/agents/lstm-ppo/decide", content=body, headers={"content-type": content_type})
    assert r.status_code == 422
    assert "Content-Type" in r.json()["detail"] and "application/json" in r.json()["detail"], r.text
    r = client.post("/v1/agents/lstm-ppo/decide", content=body, headers={"content-type": "application/json; charset=utf-8"})
    assert r.status_code == 200, r.text


def test_a_body_over_the_limit_is_counted_under_its_route(tmp_path):
    """A body refused by its Content-Length never reaches the router: its 413 was counted as
    endpoint "unmatched" (only uploads were named), so /metrics hid which route callers overfill."""
    reg = PolicyRegistry(tmp_path / "store")
    reg.host("lstm-ppo", SHIPPED)
    reg.host("osdec", shipped_policy())
    client = TestClient(create_app(reg, max_body_bytes=1000))
    for path in ("/v1/agents/lstm-ppo/decide", "/v1/agents/osdec/schedule"):
        r = client.post(path, content=b"{" + b" " * 2000 + b"}", headers={"content-type": "application/json"})
        assert r.status_code == 413, r.text
    assert client.get("/v1/agents/none/nothing").status_code == 404
    text = client.get("/metrics").text
    assert 'samm_service_requests_total{endpoint="/v1/agents/{agent}/decide",status="413"} 1.0' in text
    assert 'samm_service_requests_total{endpoint="/v1/agents/osdec/schedule",status="413"} 1.0' in text
    assert 'samm_service_requests_total{endpoint="unmatched",status="404"} 1.0' in text   # a path no route serves


def test_a_service_that_is_down_costs_an_iteration_one_timeout_not_two():
    """The loop reads the features, then decides: each read the agent list, so a service that
    never answers held the iteration for two timeouts."""
    import socket
    import time as _time

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts, never answers
    try:
        planner = HttpPlanner(f"http://127.0.0.1:{silent.getsockname()[1]}", "lstm-ppo", "s", timeout_s=0.5)
        t0 = _time.monotonic()
        assert planner.feature_names is None
        out = planner.decide(np.zeros(7))
        took = _time.monotonic() - t0
        assert out.source == "fallback" and "unreachable" in out.reason
        assert took < 0.9, took  # one 0.5-s timeout, not two
    finally:
        silent.close()


def test_a_redirected_decide_names_the_redirect():
    """A proxy's 301 turns the POST into a GET of another URL: the reason said only "HTTP 404" (or
    405), which sent operators to look at the service."""
    from fastapi.responses import RedirectResponse

    app = FastAPI()

    @app.get("/v1/agents")
    def agents():
        return {"agents": [AGENT]}

    @app.post("/v1/agents/{name}/decide")
    def decide(name: str):
        return RedirectResponse("/elsewhere/decide", status_code=301)

    with AppInThread(app) as srv:
        out = HttpPlanner(srv.url, "a", session_id="s", timeout_s=5).decide(np.zeros(2))
    assert out.source == "fallback", out
    assert out.reason.startswith(f"service answered HTTP 404 (redirected to {srv.url}/elsewhere/decide): "), out.reason
