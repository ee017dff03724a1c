"""Tenth audit of the Plan stage (the Policy Evaluation Service and the daemon's HTTP client),
against a real uvicorn. Each test once failed: an in-bounds observation that drove a hosted
policy to a NaN answer was a text/plain "Internal Server Error" with a traceback in the log, a NaN
feature read as "service unreachable: InvalidJSONError" (requests refuses to send it), a refused
session reset passed without a word, /schedule kept sessions that the reset route cannot name,
and a 422 of /allocate or /plan echoed a caller's long name whole (a 1-MB name, a 1-MB answer)."""
import json
import logging
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from agents.deferrable_jobs.policy import shipped_policy
from agents.factory import make_agent
from agents.microservice_cores.observation import FIELD, PERCENTILES, SERVICE_FIELDS
from agents.microservice_cores.policy import shipped_policy as reclaimer_policy
from samm.localproc import AppInThread
from samm.plan.client import HttpPlanner
from samm.plan.registry import PolicyRegistry
from samm.plan.service import create_app
from sim_bridge.config import SimConfig

sys.path.insert(0, str(Path(__file__).parent))
from test_lra_service import policy as lra_policy  # noqa: E402 - the placement tests' small policy

AUTOSCALER = make_agent("lstm-ppo", SimConfig())
RECLAIMER = reclaimer_policy("testbed")


@pytest.fixture(scope="module")
def service():
    reg = PolicyRegistry()
    reg.host("lstm-ppo", AUTOSCALER)
    reg.host("osdec", shipped_policy())
    reg.host("lra", lra_policy())
    reg.host("reclaimer", RECLAIMER)
    with AppInThread(create_app(reg, token="tenth-token")) as srv, \
            httpx.Client(base_url=srv.url, timeout=60) as client:
        yield srv.url, client


def assert_named(r, status: int, *words: str):
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json", r.headers
    detail = r.json()["detail"]
    assert isinstance(detail, str) and "\n" not in detail and all(w in detail for w in words), detail


def osdec_observation(token: float) -> dict:
    space = shipped_policy().observation_space
    obs = {k: np.zeros(s.shape).tolist() for k, s in space.spaces.items()}
    obs["tokens"][0][0] = token
    return obs


# -- a policy's answer outside its action space -----------------------------------------------------
def test_a_policy_answering_nan_is_a_500_naming_the_agent_not_a_plain_text_error(service):
    """osdec's tokens are Box(-inf, inf): 1e30 is a valid observation, and the network answers NaN
    for it. Building the response then raised pydantic's ValidationError out of the route:
    uvicorn answered "Internal Server Error" as text/plain, which no client reads as the
    documented {"detail": ...} of a failed agent."""
    _, client = service
    r = client.post("/v1/agents/osdec/decide", json={"observation": osdec_observation(1e30)})
    assert_named(r, 500, "'osdec'", "failed", "action space", "finite")
    # the service goes on deciding, and an ordinary observation is still a 200
    ok = client.post("/v1/agents/osdec/decide", json={"observation": osdec_observation(0.0)})
    assert ok.status_code == 200, ok.text


# -- the daemon's HTTP client ----------------------------------------------------------------------
def test_a_non_finite_feature_falls_back_naming_it_not_an_unreachable_service(service):
    """requests refuses to send a NaN (InvalidJSONError, a RequestException): the fallback said
    "service ... unreachable", sending the operator to a service that was fine. In process the
    same observation said "non-finite observation"; now both do, and nothing is sent."""
    url, client = service
    planner = HttpPlanner(url, "lstm-ppo", session_id="tenth-nan")
    x = np.full(len(AUTOSCALER.feature_names), 0.2)
    for bad in (np.nan, np.inf):
        x[1] = bad
        out = planner.decide(x)
        assert out.source == "fallback" and out.deltas == {}
        assert "non-finite observation" in out.reason and "unreachable" not in out.reason, out.reason
    assert planner.spec is not None  # the agent's spec is still good: no extra agent-list read
    x[1] = 0.2
    assert planner.decide(x).source == "agent"


def test_a_refused_session_reset_is_reported_not_silent(service, caplog):
    """reset() only caught a failure to reach the service: a 404 (the agent is not hosted) or a
    422 left the old recurrent memory in place and nothing said so."""
    url, _ = service
    assert HttpPlanner(url, "lstm-ppo", session_id="tenth-reset").reset() is True
    with caplog.at_level(logging.WARNING, logger="samm.plan.client"):
        assert HttpPlanner(url, "no-such-agent", session_id="tenth-reset").reset() is False
    assert any("session reset failed" in m and "HTTP 404" in m and "no-such-agent" in m for m in caplog.messages), \
        caplog.messages


# -- /schedule's sessions and the reset route --------------------------------------------------------
def schedule_body(session: str) -> dict:
    return {"slot": 5, "capacity": 6, "session": session,
            "eligible": [{"id": "a", "cores": 4, "duration": 2, "earliest": 4, "latest": 6}]}


@pytest.mark.parametrize("session", ["cluster a", "team/cluster", "x" * 129, "x" * 200, ""])
def test_a_schedule_session_the_reset_route_cannot_name_is_refused(service, session):
    """/schedule took any session of up to 200 characters while the reset route takes letters,
    digits and . _ : - up to 128: a history kept under "cluster a" could never be reset (the
    allocate route was given the reset route's pattern for the same reason)."""
    _, client = service
    r = client.post("/v1/agents/osdec/schedule", json=schedule_body(session))
    assert_named(r, 422, "session")


def test_every_schedule_session_it_accepts_can_be_reset(service):
    _, client = service
    session = "c" * 128
    r = client.post("/v1/agents/osdec/schedule", json=schedule_body(session))
    assert r.status_code == 200, r.text
    reset = client.post(f"/v1/agents/osdec/sessions/{session}/reset")
    assert reset.status_code == 200 and reset.json() == {"session_id": session, "existed": True}, reset.text


def test_openapi_documents_the_schedule_session_pattern(service):
    _, client = service
    schema = client.get("/openapi.json").json()
    body = schema["paths"]["/v1/agents/osdec/schedule"]["post"]["requestBody"]["content"]["application/json"]
    session = json.dumps(body["schema"])
    assert "A-Za-z0-9._:-" in session


# -- a refusal names the field, not the caller's whole input ---------------------------------------
LONG = "q" * 1_000_000


def allocate_body(services: list[str]) -> dict:
    topo = RECLAIMER.topo
    rows = np.zeros((topo.n_services, len(SERVICE_FIELDS)))
    rows[:, FIELD["cpu_limit"]] = topo.caps
    return {"session": "tenth", "services": services, "per_service": rows.tolist(),
            "latency_ms": [5.0] * len(PERCENTILES)}


def plan_body(**changes) -> dict:
    body = {"nodes": [f"w{i}" for i in range(9)], "slots": 8, "batch": {"app0": 4, "app1": 2},
            "constraints": [{"app_a": "app0", "app_b": "app1", "rule": "anti-affinity"}]}
    return {**body, **changes}


@pytest.mark.parametrize("path, body, words", [
    ("/v1/agents/reclaimer/allocate", allocate_body([LONG] * 7), ("services:", "expected", "qqq...")),
    ("/v1/agents/reclaimer/allocate", allocate_body([f"s{i}-{LONG[:100]}" for i in range(512)]),
     ("services:", "... and 492 more")),
    ("/v1/agents/lra/plan", plan_body(batch={LONG: 1}), ("batch.qqq", "unknown app", "app0")),
    ("/v1/agents/lra/plan", plan_body(constraints=[{"app_a": LONG, "app_b": "app1", "rule": "anti-affinity"}]),
     ("constraints[0].app_a", "unknown app")),
])
def test_a_refusal_does_not_echo_a_long_name_whole(service, path, body, words):
    """The services check answered `got {req.services}` (512 names, each of any length), the
    placement route's unknown app its whole key: a 1-MB name was a 1-MB 422."""
    _, client = service
    r = client.post(path, json=body)
    assert_named(r, 422, *words)
    assert len(r.content) < 2_000, len(r.content)


def test_an_ordinary_wrong_service_list_is_still_named_in_full(service):
    _, client = service
    r = client.post("/v1/agents/reclaimer/allocate", json=allocate_body(["s1"]))
    assert_named(r, 422, "services:", "got ['s1']", "frontend")


# -- a failed answer leaves the session's memory as it was ------------------------------------------
class CountingPolicy:
    """Stateful: its memory counts the calls of a session; its action is the observation, or NaN
    for one past 0.9 (a network driven out of its range)."""
    problem, kind, version, stateful = "tenth-counting", "counting", "c-1", True

    def __init__(self):
        from gymnasium import spaces

        self.observation_space = spaces.Box(0.0, 1.0, (1,), np.float32)
        self.action_space = spaces.Box(0.0, 1.0, (1,), np.float32)

    def initial_state(self):
        return 0

    def decide(self, observation, state=None, *, mask=None, deterministic=True):
        from agents.policy import Decision

        x = float(observation[0])
        return Decision([x if x <= 0.9 else float("nan")], None, {"calls": state + 1}), state + 1


def test_a_failed_answer_is_a_named_500_and_keeps_the_sessions_memory():
    """The session stored the memory of a call whose answer then failed: the caller, told the call
    failed, had its next decision made from a memory of one call more."""
    from agents.registry import ProblemSpec, problem_names, register_problem

    if "tenth-counting" not in problem_names():
        register_problem(ProblemSpec(name="tenth-counting", title="x", paper="-",
                                     agents={"counting": CountingPolicy}))
    reg = PolicyRegistry()
    reg.host("counting", CountingPolicy())
    with AppInThread(create_app(reg)) as srv, httpx.Client(base_url=srv.url, timeout=60) as client:
        def decide(x):
            return client.post("/v1/agents/counting/decide", json={"session_id": "s", "observation": [x]})

        assert decide(0.5).json()["info"] == {"calls": 1}
        assert_named(decide(0.95), 500, "'counting'", "action space")
        r = decide(0.5)
        assert r.status_code == 200 and r.json()["info"] == {"calls": 2}, r.text


# -- a policy with NaN weights ---------------------------------------------------------------------
def nan_weights(version: str):
    import torch

    from agents.ppo.agent import LstmPpoAgent

    agent = LstmPpoAgent(AUTOSCALER.feature_names, action_mode=AUTOSCALER.action_mode, version=version)
    with torch.no_grad():
        for p in agent.net.parameters():
            p.fill_(float("nan"))
    return agent


def test_a_policy_with_nan_weights_decides_nothing_on_any_path(tmp_path):
    """NaN weights still give an argmax: the service answered 200 "remove S, remove M, remove L"
    with probabilities of NaN (a body no strict JSON reader takes), the daemon's HttpPlanner
    (Python's json takes NaN) and its in-process planner acted on it. (A saved policy with NaN
    weights is refused by its loader; a policy object hosted or planned with directly is not.)"""
    from samm.plan.client import InProcessPlanner

    obs = {n: 0.2 for n in AUTOSCALER.feature_names}
    x = np.full(len(AUTOSCALER.feature_names), 0.2)
    reg = PolicyRegistry(tmp_path / "store")
    reg.host("broken", nan_weights("nan-1"))
    reg.host("lstm-ppo", AUTOSCALER)
    with AppInThread(create_app(reg, token="tenth-token")) as srv, \
            httpx.Client(base_url=srv.url, timeout=60) as client:
        r = client.post("/v1/agents/broken/decide", json={"session_id": "a", "observation": obs})
        assert_named(r, 500, "'broken'", "not finite")
        out = HttpPlanner(srv.url, "broken", session_id="a").decide(x)
        assert out.source == "fallback" and out.deltas == {} and "not finite" in out.reason, out.reason
    local = InProcessPlanner(nan_weights("nan-3")).decide(x)
    assert local.source == "fallback" and local.deltas == {} and "not finite" in local.reason, local.reason
