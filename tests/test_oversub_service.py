"""The oversubscription admit routes: typed requests, the View the policy sees, 4xx naming the
field, a broken policy as a 500, and the decision latency for the Azure setting."""
from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest
from fastapi.testclient import TestClient

from agents.oversubscription.features import observation
from agents.oversubscription.service import create_app
from agents.oversubscription.settings import RATES, SETTINGS

N = 3


class Recording:
    """0.5 for subscriber 0, 1.0 otherwise; keeps every View it was asked about."""

    def __init__(self, setting=SETTINGS["tiny"], fail: bool = False, answer=None):
        self.setting = setting
        self.views = []
        self.fail = fail
        self.answer = answer

    def rates(self, view):
        self.views.append(view)
        if self.fail:
            raise RuntimeError("broken policy")
        if self.answer is not None:
            return self.answer
        r = np.ones(self.setting.n_subscribers)
        r[0] = 0.5
        return r

    def metadata(self):
        return {"version": "rec-1"}


def body(**changes):
    b = {"subscriber": 0, "cores": 8.0, "mem_gb": 32.0, "net_gbps": 2.0, "hour": 13,
         "allocated": [[4.0, 16.0, 1.0], [0.0, 0.0, 0.0], [10.0, 40.0, 2.5]],
         "requested_live": [8.0, 0.0, 10.0]}
    b.update(changes)
    return b


@pytest.fixture
def policy():
    return Recording()


@pytest.fixture
def client(policy):
    return TestClient(create_app("rec", policy))


def test_admit_returns_rate_and_reserved_cores_from_the_policys_view(client, policy):
    r = client.post("/v1/agents/rec/admit", json=body(usage_history=[[0.5, None, 0.25], [0.6, None, 0.3]]))
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["subscriber"] == 0 and d["rate"] == 0.5 and d["reserved_cores"] == 4.0
    assert d["rates_offered"] == list(RATES) and d["agent"] == "rec" and d["policy_version"] == "rec-1"
    assert d["latency_ms"] >= 0
    v = policy.views[-1]
    assert v.hour == 13 and v.t == 2
    np.testing.assert_array_equal(v.request, [[8, 32, 2], [0, 0, 0], [0, 0, 0]])
    np.testing.assert_array_equal(v.has_request, [True, False, False])
    np.testing.assert_array_equal(v.allocated[2], [10, 40, 2.5])
    np.testing.assert_array_equal(v.requested_live, [8, 0, 10])
    assert v.usage_history.shape == (2, 3) and math.isnan(v.usage_history[0, 1]) and v.usage_history[1, 2] == 0.3
    observation(v, policy.setting)  # the View is one the paper's observation accepts

    r = client.post("/v1/agents/rec/admit", json=body(subscriber=2, cores=3.0))
    assert r.json()["rate"] == 1.0 and r.json()["reserved_cores"] == 3.0
    assert policy.views[-1].usage_history.shape == (0, 3)  # no history sent: an empty one


def test_batch_decides_once_per_step_with_requests_summed_per_subscriber(client, policy):
    state = {k: v for k, v in body().items() if k in ("hour", "allocated", "requested_live")}
    reqs = [{"subscriber": 0, "cores": 4, "mem_gb": 8, "net_gbps": 1},
            {"subscriber": 2, "cores": 2},
            {"subscriber": 0, "cores": 6, "mem_gb": 2, "net_gbps": 0.5}]
    r = client.post("/v1/agents/rec/admit/batch", json=state | {"requests": reqs})
    assert r.status_code == 200, r.text
    d = r.json()
    assert len(policy.views) == 1
    np.testing.assert_array_equal(policy.views[0].request, [[10, 10, 1.5], [0, 0, 0], [2, 0, 0]])
    assert [x["rate"] for x in d["decisions"]] == [0.5, 1.0, 0.5]
    assert [x["reserved_cores"] for x in d["decisions"]] == [2.0, 2.0, 3.0]
    assert [x["subscriber"] for x in d["decisions"]] == [0, 2, 0]
    assert d["rates"] == [0.5, 1.0, 1.0]


@pytest.mark.parametrize("changes, field", [
    ({"allocated": [[0, 0, 0]] * 2}, "allocated"),
    ({"allocated": [[0, 0]] * 3}, "allocated"),
    ({"requested_live": [0.0] * 4}, "requested_live"),
    ({"usage_history": [[0.1, 0.2]]}, "usage_history[0]"),
    ({"subscriber": 3}, "subscriber"),
    ({"subscriber": -1}, "subscriber"),
    ({"cores": 0}, "cores"),
    ({"cores": -2}, "cores"),
    ({"mem_gb": -1}, "mem_gb"),
    ({"net_gbps": -0.5}, "net_gbps"),
    ({"hour": 24}, "hour"),
    ({"requested_live": [1.0, -1.0, 0.0]}, "requested_live"),
    ({"allocated": [[0, 0, 0], [0, -1, 0], [0, 0, 0]]}, "allocated"),
    ({"rate": 0.5}, "rate"),  # extra fields are refused
])
def test_bad_requests_are_422_naming_the_field(client, policy, changes, field):
    r = client.post("/v1/agents/rec/admit", json=body(**changes))
    assert r.status_code == 422, r.text
    assert field in r.json()["detail"]
    assert policy.views == []


@pytest.mark.parametrize("token, field", [("NaN", "cores"), ("Infinity", "cores"), ("-Infinity", "mem_gb")])
def test_non_finite_numbers_are_422(client, token, field):
    raw = ('{"subscriber": 0, "cores": %s, "mem_gb": %s, "hour": 1, "allocated": [[0,0,0],[0,0,0],[0,0,0]], '
           '"requested_live": [0,0,0]}') % ((token, 1) if field == "cores" else (1, token))
    r = client.post("/v1/agents/rec/admit", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422 and field in r.json()["detail"]
    text = json.dumps(body(usage_history=[[0.1, 0.2, 0.3]])).replace("0.2,", "NaN,")
    r = client.post("/v1/agents/rec/admit", content=text, headers={"content-type": "application/json"})
    assert r.status_code == 422 and "usage_history" in r.json()["detail"]


def test_a_request_with_thousands_of_bad_values_gets_a_short_422(client, policy):
    # every error of 10,000 history rows made a 2-MB message; the first ones name the problem
    r = client.post("/v1/agents/rec/admit", json=body(usage_history=[[11.0, 0.1, 0.1]] * 10_000))
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert detail.startswith("body.usage_history.0.0:") and detail.endswith("... and 9980 more error(s)")
    assert len(detail) < 5_000 and policy.views == []


def test_batch_names_the_request_out_of_range(client):
    state = {k: v for k, v in body().items() if k in ("hour", "allocated", "requested_live")}
    r = client.post("/v1/agents/rec/admit/batch",
                    json=state | {"requests": [{"subscriber": 1, "cores": 1}, {"subscriber": 7, "cores": 1}]})
    assert r.status_code == 422 and "requests[1].subscriber" in r.json()["detail"]
    r = client.post("/v1/agents/rec/admit/batch", json=state | {"requests": []})
    assert r.status_code == 422 and "requests" in r.json()["detail"]


@pytest.mark.parametrize("policy_kw, text", [
    ({"fail": True}, "broken policy"),
    ({"answer": np.array([0.5, 0.0, 1.0])}, "invalid rates"),
    ({"answer": np.array([0.5, 1.0])}, "invalid rates"),
    ({"answer": np.array([np.nan, 1.0, 1.0])}, "invalid rates"),
])
def test_a_broken_policy_is_a_500_naming_the_agent(policy_kw, text):
    c = TestClient(create_app("rec", Recording(**policy_kw)))
    r = c.post("/v1/agents/rec/admit", json=body())
    assert r.status_code == 500 and text in r.json()["detail"] and "'rec'" in r.json()["detail"]


def test_registry_form_follows_the_hosted_version():
    """`samm serve` passes its registry: each call uses the policy hosted at that moment."""

    class Registry:
        def __init__(self):
            self.current = Recording()

        def get(self, name):
            return self.current if name == "rec" else None

    reg = Registry()
    c = TestClient(create_app("rec", reg))
    assert c.post("/v1/agents/rec/admit", json=body()).json()["rate"] == 0.5
    reg.current = Recording(answer=np.array([0.2, 1.0, 1.0]))
    assert c.post("/v1/agents/rec/admit", json=body()).json()["rate"] == 0.2
    assert c.post("/v1/agents/other/admit", json=body()).status_code == 404


class ObservationPolicy:
    """Does what a hosted policy must at least do per call: the paper's observation for the
    Azure setting, then one rate per subscriber from the action set."""

    setting = SETTINGS["azure"]

    def rates(self, view):
        obs = observation(view, self.setting)
        idx = (obs[:9] * 10).astype(int) % len(RATES)
        return np.asarray(RATES)[idx]

    def metadata(self):
        return {"version": "obs-1"}


def test_admit_latency_p99_azure():
    """2,000 in-process calls (TestClient, 9 subscribers). Prints the figures; the bound is
    loose on purpose (a shared 2-core machine)."""
    c = TestClient(create_app("azure", ObservationPolicy()))
    rng = np.random.default_rng(0)
    n = 9
    calls, inside = [], []
    for i in range(2000):
        b = {"subscriber": int(rng.integers(n)), "cores": float(rng.choice([1, 2, 4, 8, 16])), "mem_gb": 8.0,
             "net_gbps": 1.0, "hour": i % 24, "allocated": rng.uniform(0, 500, (n, 3)).round(2).tolist(),
             "requested_live": rng.uniform(0, 800, n).round(2).tolist()}
        t = time.perf_counter()
        r = c.post("/v1/agents/azure/admit", json=b)
        calls.append((time.perf_counter() - t) * 1e3)
        assert r.status_code == 200
        inside.append(r.json()["latency_ms"])
    p50, p99 = np.percentile(calls, [50, 99])
    d99 = np.percentile(inside, 99)
    print(f"\nadmit, azure (9 subscribers), 2000 in-process calls: round trip p50 {p50:.3f} ms, p99 {p99:.3f} ms; "
          f"policy decision p99 {d99:.4f} ms")
    assert p99 < 50.0


def test_mounted_on_the_policy_evaluation_service():
    """`samm serve` mounts the routes through the problem's spec (`routes`), with its registry."""
    from agents.oversubscription.features import observation_size
    from agents.oversubscription.network import C2MarlNet
    from agents.oversubscription.policy import OversubPolicy
    from samm.plan.registry import PolicyRegistry
    from samm.plan.service import create_app as create_service

    s = SETTINGS["tiny"]
    reg = PolicyRegistry()
    reg.host("c2marl", OversubPolicy(C2MarlNet(N, observation_size(s), len(RATES)), s, version="untrained-1"))
    c = TestClient(create_service(reg))
    r = c.post("/v1/agents/c2marl/admit", json=body(subscriber=1, cores=4.0))
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["rate"] in RATES and d["reserved_cores"] == pytest.approx(d["rate"] * 4.0)
    assert d["policy_version"] == "untrained-1"
    r = c.post("/v1/agents/c2marl/admit", json=body(cores="inf"))
    assert r.status_code == 422 and "cores" in r.json()["detail"]
    paths = c.get("/openapi.json").json()["paths"]
    assert "/v1/agents/c2marl/admit" in paths and "/v1/agents/c2marl/admit/batch" in paths


def test_a_tuned_production_rule_is_hosted_behind_the_same_routes():
    """`samm serve --agent nsigma --agent-param nsigma:headroom=2`: the N-sigma rule over each
    request's own usage history, no state shared between calls."""
    from agents.registry import make_policy
    from samm.plan.registry import PolicyRegistry
    from samm.plan.service import create_app as create_service

    reg = PolicyRegistry()
    reg.host("nsigma", make_policy("nsigma", None, setting="tiny", prior="none", headroom="2"))
    c = TestClient(create_service(reg))
    flat = [[0.2, None, 0.3]] * 3
    b = body(usage_history=flat)
    del b["subscriber"], b["cores"], b["mem_gb"], b["net_gbps"]
    b["requests"] = [{"subscriber": s, "cores": 4.0, "mem_gb": 8.0, "net_gbps": 1.0} for s in range(N)]
    r = c.post("/v1/agents/nsigma/admit/batch", json=b)
    assert r.status_code == 200, r.text
    # mean 0.2 / 0.3 with no spread, times headroom 2; no history at all -> no oversubscription
    assert r.json()["rates"] == pytest.approx([0.4, 1.0, 0.6])
    assert r.json()["policy_version"] == "nsigma(headroom=2, n=2, window=24)"
    r = c.post("/v1/agents/nsigma/admit", json=body(usage_history=[[0.4, None, None]]))
    assert r.status_code == 200 and r.json()["rate"] == pytest.approx(0.8)   # the earlier call left nothing behind
    with pytest.raises(ValueError, match="number"):
        make_policy("nsigma", None, setting="tiny", prior="none", headroom="lots")
    with pytest.raises(ValueError, match="parameters"):
        make_policy("nsigma", "some/dir")
    with pytest.raises(ValueError, match="unknown agent 'nsigmas'"):
        make_policy("nsigmas")
    from agents.oversubscription import PROBLEM
    from agents.oversubscription.policy import HOSTED_RULES

    assert set(PROBLEM.agents) == {"c2marl", *HOSTED_RULES}   # the spec's list, kept import-free, agrees


def test_the_hosted_rule_decides_as_the_baseline_over_an_episode_and_in_the_testbed():
    """What `samm serve --agent nsigma` answers equals baselines.NSigmaRule step by step (the rule
    the tables use), and the live testbed builds it for its own setting."""
    from agents.oversubscription.baselines import NSigmaRule, replay_usage_history
    from agents.oversubscription.data import generate_trace
    from agents.oversubscription.policy import RulePolicy
    from agents.oversubscription.sim import OversubSim
    from samm.testbed.oversub.run import resolve_policy

    s = SETTINGS["tiny"]
    hosted = RulePolicy("nsigma", setting="tiny")
    trace = generate_trace(s, 0)
    rule = NSigmaRule(s.n_subscribers, n=2.0, window=24, headroom=3.0,
                      prior=replay_usage_history(s, trace.train_workload()))
    sim = OversubSim(s, trace.test_workload(0, 1))
    view, steps = sim.reset(), 0
    while view is not None:
        expected = rule.rates(view)
        assert np.array_equal(hosted.rates(view), expected)
        view, _ = sim.step(expected)
        steps += 1
    assert steps == s.episode_steps
    live = resolve_policy("nsigma", None, s)
    assert isinstance(live, RulePolicy) and live.setting == s
