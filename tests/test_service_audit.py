"""Audit of the Policy Evaluation Service's lifecycle: `samm serve` options, uploads against a
failing store, the request counter, the session store's TTL, the daemon's HTTP client against a
real uvicorn answering what the service never should, and `samm policy promote --install`.
Each test once failed: a traceback, a silently ignored option, a crash of the daemon's
iteration, or an action taken from a reply that did not match the agent's action space."""
import base64
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient

from agents.factory import make_agent
from agents.ppo.agent import LstmPpoAgent
from samm.cli.main import cli
from samm.localproc import AppInThread, free_port
from samm.plan.client import HttpPlanner
from samm.plan.registry import PolicyRegistry
from samm.plan.service import create_app
from samm.plan.sessions import LruTtlCache, SessionStore
from sim_bridge.config import SimConfig

TOKEN = "audit-token"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture()
def app(tmp_path):
    reg = PolicyRegistry(tmp_path / "store")
    reg.host("lstm-ppo", make_agent("lstm-ppo", SimConfig()))
    return create_app(reg, token=TOKEN)


def files_of(directory: Path) -> dict:
    return {p.name: base64.b64encode(p.read_bytes()).decode() for p in directory.iterdir() if p.is_file()}


def candidate_files(tmp_path: Path, version: str) -> dict:
    agent = make_agent("lstm-ppo", SimConfig())
    LstmPpoAgent(agent.feature_names, action_mode=agent.action_mode, version=version).save(tmp_path / version)
    return files_of(tmp_path / version)


# -- the service ---------------------------------------------------------------------------------
def test_refused_uploads_and_rollbacks_are_counted_in_metrics(app):
    """A token guessed wrong never reached the request counter: the middleware that refuses it
    ran outside the one that counts."""
    client = TestClient(app)
    assert client.put("/v1/agents/lstm-ppo/policy", json={"files": {}}).status_code == 401
    bad = {"authorization": "Bearer guess"}
    assert client.put("/v1/agents/lstm-ppo/policy", json={"files": {}}, headers=bad).status_code == 403
    assert client.post("/v1/agents/lstm-ppo/policy/rollback", headers=bad).status_code == 403
    text = client.get("/metrics").text
    assert 'samm_service_requests_total{endpoint="/v1/agents/{agent}/policy",status="401"} 1.0' in text
    assert 'samm_service_requests_total{endpoint="/v1/agents/{agent}/policy",status="403"} 1.0' in text
    assert 'samm_service_requests_total{endpoint="/v1/agents/{agent}/policy/rollback",status="403"} 1.0' in text


def test_an_upload_after_the_store_was_removed_succeeds(app, tmp_path):
    """The default store is under /tmp, whose cleaners remove it under a long-running service:
    every later upload was a 500."""
    store = app.state.registry.store_dir
    shutil.rmtree(store)
    client = TestClient(app)
    r = client.put("/v1/agents/lstm-ppo/policy", json={"files": candidate_files(tmp_path, "cand-1")},
                   headers={"authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200, r.text
    assert r.json()["policy_version"] == "cand-1"


@pytest.mark.parametrize("header", [f"bearer {TOKEN}", f"BEARER {TOKEN}"])
def test_the_bearer_scheme_is_case_insensitive(app, tmp_path, header):
    """RFC 9110 makes the scheme case-insensitive: curl scripts write `bearer`."""
    r = TestClient(app).put("/v1/agents/lstm-ppo/policy", json={"files": candidate_files(tmp_path, "cand-3")},
                            headers={"authorization": header})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("header", ["Bearer", "Bearer ", "Basic " + TOKEN, f"Bearer {TOKEN}x"])
def test_a_header_without_the_token_is_still_refused(app, header):
    r = TestClient(app).put("/v1/agents/lstm-ppo/policy", json={"files": {}}, headers={"authorization": header})
    assert r.status_code in (401, 403), r.text


def test_a_broken_store_is_a_503_naming_it_and_keeps_the_policy(app, tmp_path):
    store = app.state.registry.store_dir
    v0 = app.state.registry.get("lstm-ppo").version
    shutil.rmtree(store)
    store.write_text("not a directory")  # the store's own trouble, like a full disk
    client = TestClient(app, raise_server_exceptions=False)
    r = client.put("/v1/agents/lstm-ppo/policy", json={"files": candidate_files(tmp_path, "cand-2")},
                   headers={"authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 503, r.text
    assert "policy store" in r.json()["detail"] and v0 in r.json()["detail"]
    d = client.post("/v1/agents/lstm-ppo/decide", json={"session_id": "s", "observation": {
        n: 0.1 for n in app.state.registry.get("lstm-ppo").feature_names}})
    assert d.status_code == 200 and d.json()["policy_version"] == v0


def test_a_failed_write_leaves_no_half_written_policy(tmp_path, monkeypatch):
    """Only a rejection removed the upload's directory: a store error left it behind."""
    reg = PolicyRegistry(tmp_path / "store")
    reg.host("lstm-ppo", make_agent("lstm-ppo", SimConfig()))
    files = {k: base64.b64decode(v) for k, v in candidate_files(tmp_path, "cand-3").items()}
    real_write = Path.write_bytes

    def disk_full_on_weights(self, data):
        if self.name == "policy.pt":
            raise OSError(28, "No space left on device")
        return real_write(self, data)

    monkeypatch.setattr(Path, "write_bytes", disk_full_on_weights)
    with pytest.raises(OSError):
        reg.upload("lstm-ppo", files)
    assert list((tmp_path / "store").iterdir()) == []


@pytest.mark.parametrize("ttl", [float("nan"), 0.0, -1.0])
def test_a_session_ttl_that_expires_everything_is_refused(ttl):
    """A NaN TTL passed the `<= 0` check: every session's state then expired on the next call."""
    with pytest.raises(ValueError, match="ttl_s"):
        SessionStore(ttl_s=ttl)
    with pytest.raises(ValueError, match="ttl_s"):
        LruTtlCache(ttl_s=ttl)


# -- samm serve ----------------------------------------------------------------------------------
def corrupt_c2marl(tmp_path: Path) -> Path:
    d = tmp_path / "c2marl-corrupt"
    shutil.copytree(REPO / "agents/oversubscription/policies/c2marl-azure-0.95", d)
    (d / "weights.pt").write_bytes(b"\x00 not a torch file")
    return d


@pytest.mark.parametrize("args, names", [
    (["--store", "FILE/store"], "--store"),
    (["--session-ttl", "nan"], "--session-ttl"),
    (["--agent", "threshold", "--agent", "threshold"], "--agent threshold is given more than once"),
    (["--agent", "lra-reinforce", "--agent-param", "lra-reinforc:nodes=81"], "--agent-param lra-reinforc"),
    (["--agent", "c2marl=CORRUPT"], "cannot load the policy"),
])
def test_serve_refuses_bad_options_in_one_line(tmp_path, no_uvicorn, args, names):
    """Each once gave a traceback (an unusable store, corrupt weights of a non-autoscaling
    policy) or served with the option silently ignored or unusable (a NaN TTL, an agent named
    twice, a parameter of an agent not hosted)."""
    (tmp_path / "file").write_text("x")
    args = [a.replace("FILE", str(tmp_path / "file")) for a in args]
    args = [a.replace("CORRUPT", str(corrupt_c2marl(tmp_path))) if "CORRUPT" in a else a for a in args]
    res = CliRunner().invoke(cli, ["serve", "--port", str(free_port()), *args])
    assert not no_uvicorn, "served anyway"
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), (res.output, res.exception)
    assert names in res.output and "Traceback" not in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1, res.output


# -- the daemon's HTTP client --------------------------------------------------------------------
AGENT = {"name": "a", "feature_names": ["x", "y"], "action_mode": "per-type", "type_names": ["S", "M", "L"]}
GOOD = {"action": [1, 2, 0], "action_name": "keep S, add M, remove L", "policy_version": "v1"}


@pytest.fixture(scope="module")
def fake_service():
    """A real uvicorn answering what the test sets: the service's replies, or ones it never gives."""
    answers = {"agents": {"agents": [AGENT]}, "decide": GOOD, "features": None}
    app = FastAPI()
    app.get("/v1/agents")(lambda: JSONResponse(answers["agents"]))

    @app.post("/v1/agents/{name}/decide")
    def decide(name: str, body: dict):
        if answers["features"] and sorted(body["observation"]) != sorted(answers["features"]):
            return JSONResponse({"detail": "observation: expected exactly " + str(answers["features"])}, 422)
        return JSONResponse(answers["decide"])
    with AppInThread(app) as server:
        yield server.url, answers


@pytest.mark.parametrize("agents, reason", [
    ([AGENT], "agent list not understood"),                                     # a list, not {"agents": ...}
    ({"agents": ["a"]}, "does not host agent 'a'"),
    ({"agents": [{"name": "a", "feature_names": None}]}, "not an autoscaling agent"),  # another problem's agent
    ({"agents": [{"name": "a"}]}, "not an autoscaling agent"),
    ({"agents": [dict(AGENT, type_names=3)]}, "type_names"),
])
def test_an_agent_list_off_the_schema_falls_back_with_the_reason(fake_service, agents, reason):
    """These raised TypeError/KeyError out of `decide`: the daemon's iteration crashed with no
    decision recorded, instead of doing nothing with a reason."""
    url, answers = fake_service
    answers["agents"], answers["decide"] = agents, GOOD
    try:
        planner = HttpPlanner(url, "a", session_id="s", timeout_s=5)
        assert planner.feature_names is None
        out = planner.decide(np.zeros(2))
    finally:
        answers["agents"] = {"agents": [AGENT]}
    assert out.source == "fallback" and out.deltas == {} and reason in out.reason, out.reason


@pytest.mark.parametrize("reply, mode", [
    ([1, 2, 0], "per-type"),                                          # not an object
    ({"action": None, "action_name": "x"}, "per-type"),
    ({"action": {"S": 2}, "action_name": "x"}, "per-type"),
    ({"action": [10**30, 1, 1], "action_name": "x"}, "per-type"),     # OverflowError
    ({"action": [2, 2, 2, 0, 0, 0], "action_name": "x"}, "per-type"),  # two rows: the first was acted on
    ({"action": [[2, 2, 2]], "action_name": "x"}, "per-type"),
    ({"action": [1.9, 2, 2], "action_name": "x"}, "per-type"),        # truncated to 1
    ({"action": ["2", "2", "2"], "action_name": "x"}, "per-type"),
    ({"action": [True, True, True], "action_name": "x"}, "per-type"),
    ({"action": [1, 1, 1], "action_name": "x"}, "paper"),             # another action space: "add S"
    ({"action": 2.5, "action_name": "x"}, "paper"),
])
def test_a_reply_off_the_action_space_is_never_acted_on(fake_service, reply, mode):
    url, answers = fake_service
    answers["agents"], answers["decide"] = {"agents": [dict(AGENT, action_mode=mode)]}, reply
    try:
        out = HttpPlanner(url, "a", session_id="s", timeout_s=5).decide(np.zeros(2))
    finally:
        answers["agents"], answers["decide"] = {"agents": [AGENT]}, GOOD
    assert out.source == "fallback" and out.deltas == {} and "not understood" in out.reason, out


def test_a_good_reply_with_odd_extras_is_acted_on_and_recordable(fake_service):
    """A value, probabilities or name of another type went into the decision record as is."""
    url, answers = fake_service
    answers["decide"] = {"action": [1, 2, 0], "value": "high", "probabilities": "p", "policy_version": 7}
    try:
        out = HttpPlanner(url, "a", session_id="s", timeout_s=5).decide(np.zeros(2))
    finally:
        answers["decide"] = GOOD
    assert out.source == "agent" and out.deltas == {"S": 0, "M": 1, "L": -1}
    assert out.value is None and out.probabilities is None and out.policy_version is None
    assert isinstance(out.action_name, str)


def test_the_client_reads_the_agent_again_after_the_service_changed_it(fake_service):
    """The agent list was read once: a service restarted with another policy under the same name
    (other features) answered 422 to every later call, and the daemon did nothing until restarted."""
    url, answers = fake_service
    planner = HttpPlanner(url, "a", session_id="s", timeout_s=5)
    try:
        answers["features"] = ["x", "y"]
        assert planner.decide(np.zeros(2)).source == "agent"
        answers["agents"] = {"agents": [dict(AGENT, feature_names=["x", "y", "z"])]}
        answers["features"] = ["x", "y", "z"]
        out = planner.decide(np.zeros(2))
        assert out.source == "fallback" and "422" in out.reason
        assert planner.feature_names == ("x", "y", "z")
        assert planner.decide(np.zeros(3)).source == "agent"
    finally:
        answers.update(agents={"agents": [AGENT]}, features=None)


def test_a_long_or_odd_daemon_session_name_still_gets_decisions(tmp_path):
    """The daemon names its session after the host (up to 64 characters) and the loop (up to
    63): past the service's 128 characters, or with a character it refuses, every call was a
    422 and the daemon did nothing for good."""
    import re

    from samm.plan.service import SESSION_PATTERN

    reg = PolicyRegistry(tmp_path / "store")
    reg.host("lstm-ppo", make_agent("lstm-ppo", SimConfig()))
    with AppInThread(create_app(reg)) as server:
        url = server.url
        n = len(reg.get("lstm-ppo").feature_names)
        for name in (f"samm-{'h' * 64}-4194303-{'loop-' * 12}", "samm-höst name-12-default"):
            planner = HttpPlanner(url, "lstm-ppo", session_id=name, timeout_s=10)
            out = planner.decide(np.full(n, 0.1))
            assert out.source == "agent", out.reason
            assert re.match(SESSION_PATTERN, planner.session_id)
            assert HttpPlanner(url, "lstm-ppo", session_id=name).session_id == planner.session_id  # kept on restart


# -- samm policy promote ---------------------------------------------------------------------------
def test_promote_refuses_an_install_target_it_cannot_write_before_evaluating(tmp_path, monkeypatch):
    """The evaluation ran for minutes, promoted, then crashed with a traceback on the install."""
    from agents import promote

    evaluated = []
    monkeypatch.setattr(promote, "compare", lambda *a, **k: evaluated.append(1) or {"promote": True})
    (tmp_path / "file").write_text("x")
    pol = tmp_path / "pol"
    make_agent("threshold", SimConfig()).save(pol)
    res = CliRunner().invoke(cli, ["policy", "promote", "--candidate", str(pol), "--incumbent", str(pol),
                                   "--seeds", "1", "--install", str(tmp_path / "file" / "target")])
    assert res.exit_code == 2 and "--install" in res.output and "Traceback" not in res.output, res.output
    assert not evaluated


def test_install_leaves_nothing_half_copied_and_the_target_intact(tmp_path):
    from agents.promote import install

    cand, target = tmp_path / "cand", tmp_path / "target"
    cand.mkdir()
    target.mkdir()
    (cand / "metadata.json").write_text("{}")
    (cand / "weights.pt").symlink_to(tmp_path / "gone")  # unreadable: the copy fails half-way
    (target / "metadata.json").write_text('{"old": 1}')
    with pytest.raises(OSError):
        install(cand, target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cand", "target"]
    assert json.loads((target / "metadata.json").read_text()) == {"old": 1}


def test_promote_suite_enforces_an_explicit_max_p(tmp_path, monkeypatch):
    """With --suite, --max-p was accepted and silently not checked."""
    from agents import generalisation, promote

    seen = {}
    monkeypatch.setattr(generalisation, "suite_workloads", lambda cfg: [])
    monkeypatch.setattr(promote, "compare_on_suite", lambda *a, **k: seen.update(k) or {"promote": False})
    pol = tmp_path / "pol"
    make_agent("threshold", SimConfig()).save(pol)
    base = ["policy", "promote", "--candidate", str(pol), "--incumbent", str(pol), "--suite", "generalisation"]
    assert CliRunner().invoke(cli, base + ["--max-p", "0.05"]).exit_code == 3
    assert seen["max_p"] == 0.05
    assert CliRunner().invoke(cli, base).exit_code == 3
    assert seen["max_p"] is None  # the suite's default: the sign test reported, not required
