"""The platform: a problem added in one file (env + policy) is registered, saved, loaded and
served over REST with request models generated from its spaces; bad input gets a 4xx naming
the field; spaces round-trip through JSON."""
import base64
import json
import math

import gymnasium as gym
import numpy as np
import pytest
from fastapi.testclient import TestClient
from gymnasium import spaces

from agents.policy import Decision, Policy
from agents.registry import ProblemSpec, get_problem, load_policy, problem_names, register_problem
from agents.spaces import BoundedSet, NamedBox, check_spaces, same_space, space_from_json, space_to_json
from samm.plan.registry import PolicyRegistry
from samm.plan.service import create_app

# --- a whole toy problem: pick the slot with the largest item sum, masked --------------------

OBS = spaces.Dict({"level": spaces.Box(0.0, 1.0, (2,), np.float32),
                   "items": BoundedSet(spaces.Box(0.0, 10.0, (3,), np.float32), max_size=4)})
ACT = spaces.Discrete(4)


class ToyEnv(gym.Env):
    observation_space, action_space = OBS, ACT

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return OBS.sample(), {"action_mask": np.ones(4, np.int8)}

    def step(self, action):
        return OBS.sample(), 0.0, True, False, {"action_mask": np.ones(4, np.int8)}


class ToyPolicy:
    problem, kind, stateful = "toy", "toy-argmax", True
    observation_space, action_space = OBS, ACT

    def __init__(self, version="toy-1"):
        self.version = version

    def initial_state(self):
        return 0  # decisions made so far in this session

    def decide(self, observation, state=None, *, mask=None, deterministic=True):
        scores = np.zeros(4)
        for i, row in enumerate(observation["items"]):
            scores[i] = row.sum()
        if mask is not None:
            scores[np.asarray(mask) == 0] = -np.inf
        return Decision(int(np.argmax(scores)), None, {"calls": state + 1}), state + 1

    def metadata(self):
        return {"problem": "toy", "kind": self.kind, "version": self.version,
                "observation_space": space_to_json(OBS), "action_space": space_to_json(ACT)}

    def save(self, d):
        d.mkdir(parents=True, exist_ok=True)
        (d / "metadata.json").write_text(json.dumps(self.metadata()))

    @classmethod
    def load(cls, d):
        meta = json.loads((d / "metadata.json").read_text())
        check_spaces(space_from_json(meta["observation_space"]), space_from_json(meta["action_space"]), OBS, ACT)
        return cls(meta["version"])


register_problem(ProblemSpec(name="toy", title="toy", paper="-", env_id="samm/Toy-v0",
                             env_entry_point=ToyEnv, agents={"toy-argmax": ToyPolicy},
                             policy_loader=ToyPolicy.load))

TOKEN = "t0ken"


@pytest.fixture()
def client(tmp_path):
    reg = PolicyRegistry(tmp_path / "store")
    reg.host("toy", ToyPolicy())
    return TestClient(create_app(reg, token=TOKEN))


def good_body(**kw):
    body = {"session_id": "s1", "observation": {"level": [0.1, 0.9], "items": [[1, 1, 1], [5, 5, 0]]}}
    body.update(kw)
    return body


def test_problem_catalogue_lists_every_problem_and_suggests_names():
    names = problem_names()
    assert {"autoscaling", "lra-placement", "toy"} <= set(names)
    with pytest.raises(ValueError, match="did you mean 'autoscaling'"):
        get_problem("autoscalin")
    env = gym.make("samm/Toy-v0")
    assert isinstance(ToyPolicy(), Policy) and env.observation_space == OBS


def test_toy_problem_is_served_with_its_own_schema(client):
    info = client.get("/v1/agents/toy").json()
    assert info["problem"] == "toy" and info["action_space"] == {"type": "Discrete", "n": 4, "start": 0}
    r = client.post("/v1/agents/toy/decide", json=good_body())
    assert r.status_code == 200, r.text
    assert r.json()["action"] == 1 and r.json()["info"] == {"calls": 1}
    assert r.json()["memory"] == "session"
    alone = client.post("/v1/agents/toy/decide", json=good_body(session_id=None)).json()
    assert alone["memory"] == "not kept" and alone["info"] == {"calls": 1}
    # per-session state
    assert client.post("/v1/agents/toy/decide", json=good_body()).json()["info"] == {"calls": 2}
    assert client.post("/v1/agents/toy/decide", json=good_body(session_id="s2")).json()["info"] == {"calls": 1}
    # the mask is honoured
    r = client.post("/v1/agents/toy/decide", json=good_body(action_mask=[1, 0, 1, 1]))
    assert r.json()["action"] == 0
    schema = client.get("/openapi.json").json()
    req = schema["components"]["schemas"]["ToyDecideRequest"]
    assert set(req["properties"]) == {"session_id", "observation", "deterministic", "action_mask"}
    obs = schema["components"]["schemas"]["ToyObservation"]
    assert set(obs["properties"]) == {"level", "items"}


@pytest.mark.parametrize("body, field", [
    (good_body(observation={"level": [0.1, math.nan], "items": []}), "level"),      # NaN (sent as a string-free NaN)
    (good_body(observation={"level": [0.1, 2.0], "items": []}), "level"),           # out of bounds
    (good_body(observation={"level": [0.1], "items": []}), "level"),                # wrong shape
    (good_body(observation={"level": [0.1, 0.2], "items": [[1, 1, 1]] * 5}), "items"),  # over the maximum
    (good_body(observation={"level": [0.1, 0.2], "items": [[1, 1]]}), "items"),     # row shape
    (good_body(action_mask=[0, 0, 0, 0]), "action_mask"),                           # nothing allowed
    (good_body(action_mask=[1, 1]), "action_mask"),                                 # wrong length
    (good_body(observation={"level": [0.1, 0.2]}), "items"),                        # missing field
    (good_body(extra=1), "extra"),                                                  # unknown field
])
def test_malformed_requests_get_4xx_naming_the_field(client, body, field):
    r = client.post("/v1/agents/toy/decide", content=json.dumps(body).replace("NaN", "NaN"),
                    headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert field in r.json()["detail"]


def test_uploads_authenticate_before_validating_the_body(client, tmp_path):
    assert client.put("/v1/agents/toy/policy", content=b"{not json").status_code == 401
    assert client.put("/v1/agents/toy/policy", json={"bogus": 1}).status_code == 401
    assert client.put("/v1/agents/toy/policy", json={}, headers={"authorization": "Bearer no"}).status_code == 403
    assert client.post("/v1/agents/toy/policy/rollback").status_code == 401
    # a valid upload of the toy problem's policy goes through the problem's loader
    ToyPolicy("toy-2").save(tmp_path / "p")
    files = {p.name: base64.b64encode(p.read_bytes()).decode() for p in (tmp_path / "p").iterdir()}
    r = client.put("/v1/agents/toy/policy", json={"files": files}, headers={"authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200 and r.json()["policy_version"] == "toy-2", r.text
    assert load_policy(tmp_path / "p").version == "toy-2"


@pytest.mark.parametrize("space", [
    spaces.Box(0, 1, (3,), np.float32),
    spaces.Box(np.array([0, -1], np.float32), np.array([1, np.inf], np.float32), dtype=np.float32),
    spaces.Box(0, 8, (4, 7), np.int64),
    spaces.Discrete(5, start=1),
    spaces.MultiDiscrete([3, 3, 3]),
    spaces.MultiBinary(6),
    NamedBox(["a", "b"], 0.0, [1.0, np.inf]),
    BoundedSet(spaces.Box(0, 1, (2,), np.float32), 10),
    spaces.Dict({"x": spaces.Discrete(2), "y": spaces.Tuple([spaces.Discrete(3), spaces.MultiBinary(2)])}),
])
def test_spaces_round_trip_through_json(space):
    back = space_from_json(json.loads(json.dumps(space_to_json(space))))
    assert same_space(back, space) and type(back) is type(space)
    space.seed(0)
    assert back.contains(space.sample())


def test_saved_policy_spaces_are_checked():
    with pytest.raises(ValueError, match="action space"):
        check_spaces(OBS, spaces.Discrete(3), OBS, ACT)
    with pytest.raises(ValueError, match="observation space"):
        check_spaces(spaces.Box(0, 1, (2,)), ACT, OBS, ACT)
