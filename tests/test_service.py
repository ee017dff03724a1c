"""The Policy Evaluation Service over its real ASGI app (FastAPI TestClient) plus a fuzz of its
OpenAPI schema with schemathesis: malformed input gets a 4xx naming the field, never a 500."""
import base64
import json

import numpy as np
import pytest
from fastapi.testclient import TestClient

from agents.factory import make_agent
from agents.ppo.agent import LstmPpoAgent
from samm.analyze import OBSERVATION_NAMES
from samm.plan.registry import PolicyRegistry
from samm.plan.service import create_app
from samm.plan.sessions import SessionStore
from sim_bridge.config import SimConfig

TOKEN = "s3cret-token"
# the shipped policy's features (since issue 11 the `extended` set: the seven metrics first)
SHIPPED_FEATURES = tuple(make_agent("lstm-ppo", SimConfig()).feature_names)
OBS = {n: 0.2 for n in SHIPPED_FEATURES}


@pytest.fixture()
def app(tmp_path):
    reg = PolicyRegistry(tmp_path / "store")
    reg.host("lstm-ppo", make_agent("lstm-ppo", SimConfig()))
    reg.host("threshold", make_agent("threshold", SimConfig()))
    return create_app(reg, token=TOKEN)


@pytest.fixture()
def client(app):
    return TestClient(app)


def files_of(directory):
    return {p.name: base64.b64encode(p.read_bytes()).decode() for p in directory.iterdir() if p.is_file()}


def test_lists_agents_and_decides(client):
    r = client.get("/v1/agents")
    assert r.status_code == 200
    names = {a["name"]: a for a in r.json()["agents"]}
    assert set(names) == {"lstm-ppo", "threshold"}
    assert names["lstm-ppo"]["feature_names"] == list(SHIPPED_FEATURES)
    assert list(SHIPPED_FEATURES[:7]) == list(OBSERVATION_NAMES)
    r = client.post("/v1/agents/lstm-ppo/decide", json={"session_id": "a", "observation": OBS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["policy_version"] == names["lstm-ppo"]["policy_version"]
    assert isinstance(body["action"], list) and len(body["action"]) == 3  # per-type
    assert len(body["probabilities"]) == 3 and abs(sum(body["probabilities"][0]) - 1) < 1e-4
    assert body["value"] is not None and body["action_name"]
    r = client.post("/v1/agents/threshold/decide", json={"session_id": "a", "observation": {"cpu_mean": 0.95}})
    assert r.status_code == 200 and r.json()["action"] == [2, 2, 2] and r.json()["probabilities"] is None


def test_recurrent_state_is_per_session_and_resettable(client, app):
    seq = [dict(OBS, allocated_cores_ratio=x, waiting_ratio_interval=1 - x) for x in np.linspace(0.1, 0.9, 6)]
    values_a = [client.post("/v1/agents/lstm-ppo/decide", json={"session_id": "a", "observation": o}).json()["value"] for o in seq]
    # another caller interleaving its own observations does not disturb session a's state
    agent = app.state.registry.get("lstm-ppo")
    state = agent.initial_state(1)
    expect = []
    for o in seq:
        client.post("/v1/agents/lstm-ppo/decide", json={"session_id": "b", "observation": OBS})
        d, state = agent.act(np.array([[o[n] for n in SHIPPED_FEATURES]], np.float32), state)
        expect.append(float(d.values[0]))
    client.post("/v1/agents/lstm-ppo/sessions/a/reset")
    values_again = [client.post("/v1/agents/lstm-ppo/decide", json={"session_id": "a", "observation": o}).json()["value"] for o in seq]
    np.testing.assert_allclose(values_a, expect, rtol=1e-5)
    np.testing.assert_allclose(values_again, values_a, rtol=1e-5)
    assert client.post("/v1/agents/lstm-ppo/sessions/a/reset").json()["existed"] is True


def test_session_ttl():
    now = [0.0]
    store = SessionStore(ttl_s=10, clock=lambda: now[0])
    agent = LstmPpoAgent()
    store.store("x", "s", agent, "state-1")
    assert store.checkout("x", "s", agent) == "state-1"
    now[0] = 11.0
    assert store.checkout("x", "s", agent) != "state-1" and len(store) == 0


@pytest.mark.parametrize("payload, field", [
    ({"session_id": "a", "observation": {**OBS, "cpu_mean": 1.5}}, "observation.cpu_mean"),
    ({"session_id": "a", "observation": {k: v for k, v in OBS.items() if k != "ram_p90"}}, "missing ['ram_p90']"),
    ({"session_id": "a", "observation": {**OBS, "bogus": 0.1}}, "unknown ['bogus']"),
    ({"session_id": "a", "observation": {**OBS, "cpu_mean": "high"}}, "body.observation.cpu_mean"),
    ({"session_id": "", "observation": OBS}, "body.session_id"),
    ({"session_id": "a", "observation": OBS, "extra": 1}, "body.extra"),
    ({"observation": OBS}, "body.session_id"),
])
def test_bad_requests_are_4xx_naming_the_field(client, payload, field):
    r = client.post("/v1/agents/lstm-ppo/decide", json=payload)
    assert r.status_code == 422, r.text
    assert field in r.json()["detail"]


def test_nan_and_unknown_agent(client):
    r = client.post("/v1/agents/lstm-ppo/decide", content=json.dumps({"session_id": "a", "observation": {**OBS, "cpu_mean": float("nan")}}),
                    headers={"content-type": "application/json"})
    assert r.status_code == 422 and "cpu_mean" in r.text
    r = client.post("/v1/agents/nope/decide", json={"session_id": "a", "observation": OBS})
    assert r.status_code == 404
    r = client.post("/v1/agents/lstm-ppo/decide", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422


def test_upload_needs_a_token_validates_and_rolls_back(client, tmp_path):
    v0 = client.get("/v1/agents").json()["agents"][0]["policy_version"]
    new = LstmPpoAgent(SHIPPED_FEATURES, action_mode="per-type", version="candidate-1")
    new.save(tmp_path / "cand")
    body = {"files": files_of(tmp_path / "cand")}
    assert client.put("/v1/agents/lstm-ppo/policy", json=body).status_code == 401
    assert client.put("/v1/agents/lstm-ppo/policy", json=body, headers={"authorization": "Bearer wrong"}).status_code == 403
    auth = {"authorization": f"Bearer {TOKEN}"}
    # a policy for another action space is rejected and the current one stays
    LstmPpoAgent(SHIPPED_FEATURES, action_mode="paper", version="wrong-space").save(tmp_path / "bad")
    r = client.put("/v1/agents/lstm-ppo/policy", json={"files": files_of(tmp_path / "bad")}, headers=auth)
    assert r.status_code == 422 and "action_mode" in r.json()["detail"]
    corrupt = dict(body["files"], **{"policy.pt": base64.b64encode(b"garbage").decode()})
    assert client.put("/v1/agents/lstm-ppo/policy", json={"files": corrupt}, headers=auth).status_code == 422
    assert client.get("/v1/agents").json()["agents"][0]["policy_version"] == v0
    r = client.put("/v1/agents/lstm-ppo/policy", json=body, headers=auth)
    assert r.status_code == 200 and r.json()["policy_version"] == "candidate-1" and r.json()["previous_version"] == v0
    d = client.post("/v1/agents/lstm-ppo/decide", json={"session_id": "z", "observation": OBS}).json()
    assert d["policy_version"] == "candidate-1"
    r = client.post("/v1/agents/lstm-ppo/policy/rollback", headers=auth)
    assert r.status_code == 200 and r.json()["policy_version"] == v0


@pytest.mark.parametrize("fname", ["a\x00b", "x" * 300, "\ud800"])
def test_an_upload_with_an_unwritable_file_name_is_rejected_and_leaves_nothing(client, app, fname):
    store = app.state.registry.store_dir
    before = set(store.iterdir())
    files = {"metadata.json": base64.b64encode(b"{}").decode(), fname: ""}
    r = client.put("/v1/agents/lstm-ppo/policy", content=json.dumps({"files": files}),
                   headers={"authorization": f"Bearer {TOKEN}", "content-type": "application/json"})
    assert r.status_code == 422 and "invalid file name" in r.json()["detail"], r.text
    assert set(store.iterdir()) == before
    assert client.get("/healthz").json()["status"] == "ok"


def test_health_metrics_and_openapi(client):
    assert client.get("/healthz").json()["status"] == "ok"
    client.post("/v1/agents/threshold/decide", json={"session_id": "m", "observation": {"cpu_mean": 0.1}})
    text = client.get("/metrics").text
    assert "samm_service_requests_total" in text and "samm_service_decide_latency_seconds_bucket" in text
    assert 'samm_service_decisions_total{action="remove S, remove M, remove L",agent="threshold"}' in text
    spec = client.get("/openapi.json").json()
    assert "/v1/agents/{agent}/decide" in spec["paths"]


def test_fuzz_openapi_never_500(app):
    import schemathesis
    from hypothesis import HealthCheck, settings

    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    failures, calls = [], []
    for op in schema.get_all_operations():
        operation = op.ok()
        strategy = operation.as_strategy()

        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @__import__("hypothesis").given(case=strategy)
        def run(case):
            response = case.call()
            calls.append(operation.label)
            if response.status_code >= 500:
                failures.append((operation.label, response.status_code, response.text[:200]))

        run()
    assert len(set(calls)) >= 7 and len(calls) > 100  # every operation was exercised
    assert not failures, failures[:5]


def test_samm_serve_runs_uvicorn_on_loopback(tmp_path):
    import os
    import socket
    import subprocess
    import sys
    import time

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, SAMM_SERVICE__TOKEN=TOKEN)
    proc = subprocess.Popen([sys.executable, "-m", "samm.cli.main", "serve", "--port", str(port),
                             "--agent", "lstm-ppo", "--agent", "queue"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        else:
            pytest.fail("samm serve did not come up: " + proc.stderr.read1().decode())
        r = httpx.post(f"http://127.0.0.1:{port}/v1/agents/lstm-ppo/decide",
                       json={"session_id": "x", "observation": OBS}, timeout=5)
        assert r.status_code == 200 and r.json()["policy_version"]
        agents = httpx.get(f"http://127.0.0.1:{port}/v1/agents", timeout=5).json()["agents"]
        assert {a["name"] for a in agents} == {"lstm-ppo", "queue"}
    finally:
        proc.terminate()
        proc.wait(timeout=10)
