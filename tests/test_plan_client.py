"""The daemon's two ways to ask for a decision: in-process, or over HTTP from a real uvicorn
serving the Policy Evaluation Service. Both must give the same decisions for the same
observations, and any failure must fall back to doing nothing, with the reason."""

import numpy as np
import pytest

from agents.factory import make_agent
from samm.localproc import AppInThread, free_port
from samm.plan.client import HttpPlanner, InProcessPlanner
from samm.plan.registry import PolicyRegistry
from samm.plan.service import create_app
from sim_bridge.config import SimConfig


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    reg = PolicyRegistry(tmp_path_factory.mktemp("store"))
    reg.host("lstm-ppo", make_agent("lstm-ppo", SimConfig()))
    with AppInThread(create_app(reg)) as server:
        yield server.url


N_FEATURES = len(make_agent("lstm-ppo", SimConfig()).feature_names)  # the shipped policy's


def observations(n=12, seed=0):
    rng = np.random.default_rng(seed)
    return rng.uniform(0, 1, size=(n, N_FEATURES)).astype(np.float32)


def test_http_and_in_process_decide_alike_with_recurrent_state(service):
    local = InProcessPlanner(make_agent("lstm-ppo", SimConfig()))
    remote = HttpPlanner(service, "lstm-ppo", session_id="daemon-a")
    for x in observations():
        a, b = local.decide(x), remote.decide(x)
        assert b.source == "agent", b.reason
        assert a.action == b.action and a.deltas == b.deltas
        assert b.value == pytest.approx(a.value, abs=1e-4)
    assert remote.feature_names == local.feature_names


def test_unreachable_service_falls_back_to_doing_nothing():
    planner = HttpPlanner(f"http://127.0.0.1:{free_port()}", "lstm-ppo", session_id="x", timeout_s=0.5)
    out = planner.decide(np.zeros(7, dtype=np.float32))
    assert out.source == "fallback" and out.deltas == {} and "unreachable" in out.reason


def test_bad_observation_and_unknown_agent_fall_back(service):
    out = HttpPlanner(service, "no-such-agent", session_id="x").decide(np.zeros(N_FEATURES))
    assert out.source == "fallback" and "does not host" in out.reason
    out = HttpPlanner(service, "lstm-ppo", session_id="x").decide(np.full(N_FEATURES, 50.0))  # out of bounds: HTTP 422
    assert out.source == "fallback" and "422" in out.reason
    local = InProcessPlanner(make_agent("lstm-ppo", SimConfig()))
    out = local.decide(np.array([np.nan] * N_FEATURES))
    assert out.source == "fallback" and "non-finite" in out.reason
