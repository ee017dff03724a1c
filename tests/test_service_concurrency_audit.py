"""Audit of the Policy Evaluation Service under concurrent callers, against a real uvicorn server
(`AppInThread`): async decide routes run on the event loop, sync routes (uploads, rollbacks) in
uvicorn's thread pool. Each race is made deterministic by holding one step on a threading.Event.
Each test once failed: a reset undone by the decide it raced, an upload or rollback reporting a
version another one had swapped in, a session that kept the memory of a policy replaced under the
same version string (every decide of it a 500), and a session store passed to `create_app` that
was silently replaced by a new one."""
import base64
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from agents.factory import make_agent
from agents.ppo.agent import LstmPpoAgent
from samm.localproc import AppInThread
from samm.plan.registry import PolicyRegistry
from samm.plan.service import create_app
from samm.plan.sessions import SessionStore
from sim_bridge.config import SimConfig

TOKEN = "conc-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
WAIT_S = 20.0  # how long a held step waits for the other side of its race (never reached when all is well)
SHIPPED = make_agent("lstm-ppo", SimConfig())
OBS = {n: 0.2 for n in SHIPPED.feature_names}


def lstm(version: str, **params) -> LstmPpoAgent:
    return LstmPpoAgent(SHIPPED.feature_names, action_mode=SHIPPED.action_mode, version=version, params=params or None)


def upload_files(tmp_path: Path, agent) -> dict:
    folder = tmp_path / f"saved-{agent.version}-{id(agent)}"
    agent.save(folder)
    return {p.name: base64.b64encode(p.read_bytes()).decode() for p in folder.iterdir() if p.is_file()}


class CountingAgent(LstmPpoAgent):
    """The real LSTM agent whose state also counts the session's decisions; `gate` (entered,
    release) holds the next decision between the route's checkout and store."""

    gate: tuple[threading.Event, threading.Event] | None = None

    def initial_state(self, batch=1):
        return {"lstm": super().initial_state(batch), "calls": 0}

    def act(self, features, state, deterministic=True):
        gate, self.gate = self.gate, None
        if gate:
            gate[0].set()
            gate[1].wait(WAIT_S)
        d, lstm_state = super().act(features, state["lstm"], deterministic)
        return d, {"lstm": lstm_state, "calls": state["calls"] + 1}


class GatedRegistry(PolicyRegistry):
    """`gate` (entered, release) holds the next `describe` call."""

    gate: tuple[threading.Event, threading.Event] | None = None

    def describe(self, name):
        gate, self.gate = self.gate, None
        if gate:
            gate[0].set()
            gate[1].wait(WAIT_S)
        return super().describe(name)


def wait_for(event: threading.Event, future) -> None:
    """Until the held step is reached, or the request finished without reaching it."""
    deadline = time.monotonic() + 60
    while not (event.is_set() or future.done()) and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_session_store_given_to_create_app_is_the_one_it_uses(tmp_path):
    """`sessions or SessionStore()` replaced the caller's store: an empty store has a length, so
    it is falsy, and every given store was dropped for a new one with the default TTL and cap."""
    reg = PolicyRegistry(tmp_path / "store")
    reg.host("lstm-ppo", lstm("v1"))
    store = SessionStore(ttl_s=5, max_sessions=3)
    app = create_app(reg, sessions=store)
    assert app.state.sessions is store
    r = TestClient(app).post("/v1/agents/lstm-ppo/decide", json={"session_id": "s", "observation": OBS})
    assert r.status_code == 200, r.text
    assert len(store) == 1


def test_a_reset_racing_a_decide_of_its_session_is_never_undone(tmp_path, monkeypatch):
    """The reset route ran in a worker thread, the decide route on the event loop: a reset landing
    between a decide's checkout and its store was undone, the decide storing the memory the reset
    had dropped (`existed: true`, and the session went on from its old state)."""
    agent = CountingAgent(SHIPPED.feature_names, action_mode=SHIPPED.action_mode, version="counting")
    reg = PolicyRegistry(tmp_path / "store")
    reg.host("a", agent)
    app = create_app(reg)
    sessions = app.state.sessions
    in_act, released, reset_entered = threading.Event(), threading.Event(), threading.Event()
    real_reset = sessions.reset
    with AppInThread(app) as srv:
        def held_reset(name, session_id):
            reset_entered.set()
            if threading.current_thread() is not srv.thread:  # off the loop, a decide can get between
                in_act.wait(WAIT_S)
            try:
                return real_reset(name, session_id)
            finally:
                released.set()

        monkeypatch.setattr(sessions, "reset", held_reset)
        decide = {"session_id": "s", "observation": OBS}
        for _ in range(2):
            assert httpx.post(f"{srv.url}/v1/agents/a/decide", json=decide, timeout=60).status_code == 200
        assert sessions.checkout("a", "s", agent)["calls"] == 2
        agent.gate = (in_act, released)
        with ThreadPoolExecutor(1) as pool:
            reset = pool.submit(httpx.post, f"{srv.url}/v1/agents/a/sessions/s/reset", timeout=60)
            assert reset_entered.wait(60)
            assert httpx.post(f"{srv.url}/v1/agents/a/decide", json=decide, timeout=60).status_code == 200
            assert reset.result().json() == {"session_id": "s", "existed": True}
    # reset then decide: one call since; decide then reset: none
    assert sessions.checkout("a", "s", agent)["calls"] <= 1


@pytest.mark.parametrize("op", ["upload", "rollback"])
def test_concurrent_swaps_each_report_the_versions_they_swapped(tmp_path, op):
    """The route read `previous_version` back after the swap: a second upload (or rollback) in
    between made the first answer e.g. `v1, previous v1`, a swap that never happened."""
    reg = GatedRegistry(tmp_path / "store")
    reg.host("a", lstm("base"))
    with AppInThread(create_app(reg, token=TOKEN)) as srv:
        def swap(files: dict | None):
            if files is None:
                return httpx.post(f"{srv.url}/v1/agents/a/policy/rollback", headers=AUTH, timeout=60)
            return httpx.put(f"{srv.url}/v1/agents/a/policy", headers=AUTH, timeout=60, json={"files": files})

        if op == "upload":
            first, second = (upload_files(tmp_path, lstm(v)) for v in ("v1", "v2"))
            expected = [("v1", "base"), ("v2", "v1")]
        else:
            assert swap(upload_files(tmp_path, lstm("v1"))).status_code == 200  # hosted v1, previous base
            first = second = None
            expected = [("base", "v1"), ("v1", "base")]
        entered, release = threading.Event(), threading.Event()
        reg.gate = (entered, release)
        with ThreadPoolExecutor(1) as pool:
            answer1 = pool.submit(swap, first)
            wait_for(entered, answer1)
            answer2 = swap(second)
            release.set()
            answers = [answer1.result(), answer2]
    assert [r.status_code for r in answers] == [200, 200], [r.text for r in answers]
    assert [(r.json()["policy_version"], r.json()["previous_version"]) for r in answers] == expected
    assert (reg.describe("a")["policy_version"], reg.describe("a")["previous_version"]) == expected[-1]


def test_an_upload_repeating_the_version_string_starts_its_sessions_afresh(tmp_path):
    """Session state was tagged with the version string: a retrained policy uploaded under the
    same version (here with a smaller LSTM) was handed the old policy's state, and every decide
    of every existing session was a 500 (a matmul shape error) until the session's TTL."""
    reg = PolicyRegistry(tmp_path / "store")
    reg.host("a", lstm("v1"))
    smaller = lstm("v1", lstm_hidden=64)
    with AppInThread(create_app(reg, token=TOKEN)) as srv, httpx.Client(base_url=srv.url, timeout=60) as client:
        for _ in range(2):
            assert client.post("/v1/agents/a/decide", json={"session_id": "old", "observation": OBS}).status_code == 200
        r = client.put("/v1/agents/a/policy", headers=AUTH, json={"files": upload_files(tmp_path, smaller)})
        assert r.status_code == 200, r.text
        again = client.post("/v1/agents/a/decide", json={"session_id": "old", "observation": OBS})
        fresh = client.post("/v1/agents/a/decide", json={"session_id": "new", "observation": OBS})
    assert again.status_code == 200, again.text
    # the old session starts afresh under the new weights: the same answer as a new session
    assert again.json()["value"] == fresh.json()["value"]
    assert again.json()["probabilities"] == fresh.json()["probabilities"]


class FailingAgent(LstmPpoAgent):
    """The real LSTM agent, failing at its next decision once `fail` is set (a policy that
    passed its upload's test decision and fails on some later input)."""

    fail = False

    def act(self, features, state, deterministic=True):
        if self.fail:
            raise RuntimeError("the policy's weights hold NaN")
        return super().act(features, state, deterministic)


def test_a_failing_autoscaling_policy_is_a_500_naming_it_and_the_connection_survives(tmp_path):
    """The autoscaling decide route let the policy's exception escape: a bare `Internal Server
    Error` naming nothing, and uvicorn dropped the keep-alive connection, so the caller's next
    request on it failed with a connection reset (the generic route already answered a 500)."""
    agent = FailingAgent(SHIPPED.feature_names, action_mode=SHIPPED.action_mode, version="failing")
    reg = PolicyRegistry(tmp_path / "store")
    reg.host("a", agent)
    decide = {"session_id": "s", "observation": OBS}
    with AppInThread(create_app(reg)) as srv, httpx.Client(base_url=srv.url, timeout=60) as client:
        agent.fail = True
        r = client.post("/v1/agents/a/decide", json=decide)
        agent.fail = False
        assert r.status_code == 500
        assert r.json()["detail"] == "agent 'a' failed: RuntimeError: the policy's weights hold NaN"
        assert client.post("/v1/agents/a/decide", json=decide).status_code == 200


def test_healthz_counts_only_the_sessions_still_alive(tmp_path):
    """/healthz counted sessions past their TTL until the next decide happened to expire them:
    an idle service reported every session it ever had."""
    now = [0.0]
    reg = PolicyRegistry(tmp_path / "store")
    reg.host("lstm-ppo", lstm("v1"))
    client = TestClient(create_app(reg, sessions=SessionStore(ttl_s=60, clock=lambda: now[0])))
    for session in ("s1", "s2"):
        r = client.post("/v1/agents/lstm-ppo/decide", json={"session_id": session, "observation": OBS})
        assert r.status_code == 200, r.text
    assert client.get("/healthz").json()["sessions"] == 2
    now[0] = 61.0
    assert client.get("/healthz").json()["sessions"] == 0
