"""The placement agent over REST: one container per `decide` (request model generated from its
spaces), a whole batch per `plan`; malformed requests get a 4xx naming the field; the mask and
the operation constraints are honoured; a saved policy's spaces round-trip."""
import json

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from agents.lra_placement.cluster import Batch, Cluster, Constraints, Rule, check_plan
from agents.lra_placement.network import NodeScorer
from agents.lra_placement.policy import PlacementPolicy
from agents.lra_placement.predictor import SyntheticInterference
from agents.lra_placement.reinforce import ReinforceConfig
from agents.registry import load_policy
from agents.spaces import same_space
from samm.plan.registry import PolicyRegistry
from samm.plan.service import create_app

N, A, SLOTS = 81, 7, 8


def policy(n_nodes=N, seed=0):
    torch.manual_seed(seed)
    pred = SyntheticInterference(n_apps=A, slots=SLOTS)
    names = tuple(f"app{i}" for i in range(A))
    return PlacementPolicy(NodeScorer(ReinforceConfig().scorer_config(A)), names, n_nodes, SLOTS, pred,
                           version="test-1")


@pytest.fixture(scope="module")
def client():
    reg = PolicyRegistry()
    reg.host("lra", policy())
    return TestClient(create_app(reg, token="tok"))


def observation(counts=None, app=0, remaining=None):
    counts = np.zeros((N, A)) if counts is None else counts
    return {"app": np.eye(A)[app].tolist(), "counts": np.asarray(counts).tolist(),
            "remaining": (np.ones(A) if remaining is None else remaining).tolist()}


def test_decide_places_one_container_and_honours_the_mask(client):
    r = client.post("/v1/agents/lra/decide", json={"observation": observation()})
    assert r.status_code == 200, r.text
    assert 0 <= r.json()["action"] < N and r.json()["policy_version"] == "test-1"
    mask = [0] * N
    mask[42] = 1
    r = client.post("/v1/agents/lra/decide", json={"observation": observation(), "action_mask": mask})
    assert r.json()["action"] == 42
    # a full node is never chosen: every node but 7 is full
    counts = np.zeros((N, A))
    counts[:, 1] = SLOTS
    counts[7, 1] = 3
    r = client.post("/v1/agents/lra/decide", json={"observation": observation(counts)})
    assert r.json()["action"] == 7


@pytest.mark.parametrize("body, field", [
    ({"observation": observation(np.zeros((N - 1, A)))}, "counts"),                 # wrong node count
    ({"observation": {**observation(), "app": [2.0] + [0.0] * (A - 1)}}, "app"),     # out of bounds
    ({"observation": {**observation(), "remaining": [float("nan")] * A}}, "remaining"),  # NaN
    ({"observation": observation(), "action_mask": [0] * N}, "action_mask"),         # nothing allowed
    ({"observation": observation(), "action_mask": [1] * (N + 1)}, "action_mask"),   # wrong length
    ({"observation": {k: v for k, v in observation().items() if k != "counts"}}, "counts"),  # missing
])
def test_malformed_placement_requests_name_the_field(client, body, field):
    r = client.post("/v1/agents/lra/decide", content=json.dumps(body), headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert field in r.json()["detail"]


def test_openapi_documents_the_placement_schema(client):
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    obs = schemas["LraObservation"]["properties"]
    assert set(obs) == {"app", "counts", "remaining"}
    assert obs["counts"]["minItems"] == N and obs["counts"]["maxItems"] == N
    assert "PlanRequest" in schemas


@pytest.mark.parametrize("planner", ["policy", "greedy-ls", "optimum"])
def test_plan_places_a_batch_within_slots_and_rules(client, planner):
    nodes = [f"w{i}" for i in range(9)]
    body = {"nodes": nodes, "slots": SLOTS, "batch": {"app0": 10, "app1": 6, "app2": 20},
            "constraints": [{"app_a": "app0", "app_b": "app1", "rule": "anti-affinity"},
                            {"app_a": "app2", "app_b": "app2", "rule": "cardinality", "limit": 3}],
            "planner": planner, "seed": 1}
    r = client.post("/v1/agents/lra/plan", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    placement = np.zeros((9, A), dtype=np.int64)
    for row in out["placement"]:
        placement[nodes.index(row["node"]), int(row["app"][3:])] = row["count"]
    cons = Constraints(A, (Rule(0, 1, "anti-affinity"), Rule(2, 2, "cardinality", 3)))
    batch = Batch(np.array([10, 6, 20, 0, 0, 0, 0]))
    assert check_plan(placement, batch, Cluster(9, SLOTS, tuple(nodes)), cons) == []
    assert 0 < out["score"] <= 1 and out["planner"] == planner


@pytest.mark.parametrize("body, status, field", [
    ({"nodes": ["a", "b"], "batch": {"nope": 1}}, 422, "batch.nope"),
    ({"nodes": ["a", "b"], "batch": {"app0": 17}}, 422, "capacity"),
    ({"nodes": ["a", "a"], "batch": {"app0": 1}}, 422, "unique"),
    ({"nodes": ["a"], "batch": {"app0": 1}, "planner": "magic"}, 422, "planner"),
    ({"nodes": ["a"], "batch": {"app0": 2}, "constraints": [{"app_a": "app0", "app_b": "app0", "rule": "anti-affinity"}]},
     422, "no placement"),
    ({"nodes": ["a"], "batch": {"app0": 1}, "seed": -1}, 422, "seed"),                  # numpy's seeds are >= 0
    ({"nodes": ["a"], "batch": {"app0": 2**63}}, 422, "batch.app0"),                    # past int64
    ({"nodes": ["a"], "batch": {"app0": 2**62, "app1": 2**62}}, 422, "batch.app0"),     # a sum past int64
])
def test_bad_plan_requests_get_4xx_naming_the_problem(client, body, status, field):
    r = client.post("/v1/agents/lra/plan", json=body)
    assert r.status_code == status, r.text
    assert field in r.text


def test_saved_policy_spaces_round_trip_and_upload_checks_them(tmp_path, client):
    p = policy(n_nodes=N, seed=3)
    p.save(tmp_path / "p")
    back = load_policy(tmp_path / "p")
    assert same_space(back.observation_space, p.observation_space) and same_space(back.action_space, p.action_space)
    obs = {k: np.asarray(v, np.float32) for k, v in observation().items()}
    assert back.decide(obs)[0].action == p.decide(obs)[0].action
    # a policy for another cluster size does not fit the hosted agent's spaces: rejected, kept
    import base64

    policy(n_nodes=9).save(tmp_path / "small")
    files = {f.name: base64.b64encode(f.read_bytes()).decode() for f in (tmp_path / "small").iterdir()}
    r = client.put("/v1/agents/lra/policy", json={"files": files}, headers={"authorization": "Bearer tok"})
    assert r.status_code == 422 and "observation_space" in r.json()["detail"]


def test_a_valid_placement_policy_upload_is_accepted(tmp_path, client):
    """The upload's test decision sampled the observation space, whose `app` is never one-hot:
    every placement policy upload was a 422 ("observation.app: must be one-hot")."""
    import base64

    p = policy(n_nodes=N, seed=5)
    p.save(tmp_path / "p")
    files = {f.name: base64.b64encode(f.read_bytes()).decode() for f in (tmp_path / "p").iterdir() if f.is_file()}
    r = client.put("/v1/agents/lra/policy", json={"files": files}, headers={"authorization": "Bearer tok"})
    assert r.status_code == 200, r.text
    assert r.json()["policy_version"] == p.version
