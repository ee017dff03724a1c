"""The Reclaimer served and live, a second audit: the /allocate route's sessions and the limits it
reads, the online learner's log in a long-running daemon, and the daemon's loop timing against the
learner's chain (over a real uvicorn where the route is involved)."""
from __future__ import annotations

import csv
import json
import urllib.error
import urllib.request

import numpy as np
import pytest

from agents.microservice_cores.control import AppLimits
from agents.microservice_cores.observation import FIELD, PERCENTILES, SERVICE_FIELDS
from agents.microservice_cores.online import OnlineConfig, OnlineReclaimer
from agents.microservice_cores.policy import shipped_policy
from samm.localproc import AppInThread
from tests.test_reclaimer_live_audit import _meas


def _post(url: str, body: dict | None = None) -> tuple[int, dict]:
    data = json.dumps(body or {}).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _body(topo, session: str, limits) -> dict:
    rows = np.zeros((topo.n_services, len(SERVICE_FIELDS)))
    rows[:, FIELD["cpu_used"]] = topo.caps * 0.2
    rows[:, FIELD["cpu_limit"]] = limits
    return {"session": session, "services": list(topo.service_names), "per_service": rows.tolist(),
            "latency_ms": [5.0] * len(PERCENTILES), "requests_per_s": 50.0, "failures_per_s": 0.0}


@pytest.fixture(scope="module")
def served():
    from agents.microservice_cores.service import create_app

    pol = shipped_policy("testbed")
    with AppInThread(create_app("reclaimer", pol)) as server:
        yield pol.topo, f"{server.url}/v1/agents/reclaimer"


# -- the /allocate route --------------------------------------------------------------------------
@pytest.mark.parametrize("session", ["hotel prod", "x" * 129, "hotel/prod"])
def test_a_session_the_reset_route_cannot_name_is_refused_over_real_http(served, session):
    """Such a session was accepted (its frame stack kept) while POST .../sessions/{session}/reset
    answered 422 or 404: the caller could never start it afresh."""
    topo, url = served
    status, reply = _post(f"{url}/allocate", _body(topo, session, topo.caps * 0.6))
    assert status == 422 and "session" in reply["detail"], reply


def test_a_session_the_reset_route_names_is_kept_and_reset_over_real_http(served):
    topo, url = served
    assert _post(f"{url}/allocate", _body(topo, "hotel-prod.eu:1", topo.caps * 0.6))[0] == 200
    assert _post(f"{url}/sessions/hotel-prod.eu:1/reset") == (200, {"session_id": "hotel-prod.eu:1", "existed": True})


def test_a_limit_of_none_is_read_as_the_cap_when_the_policy_decides_over_real_http(served):
    """0 is Docker's "no limit": the held answer gave the cap for it, but a decided one fed the
    policy 0 cores in force (a previous action of 0) and came back with lower limits than the
    same containers at their caps."""
    topo, url = served
    unlimited = _post(f"{url}/allocate", _body(topo, "none-set", np.zeros(topo.n_services)))[1]
    at_caps = _post(f"{url}/allocate", _body(topo, "caps-set", topo.caps))[1]
    assert unlimited["action"] == at_caps["action"] == "set"
    assert unlimited["cores"] == pytest.approx(at_caps["cores"])


# -- the online learner's log ---------------------------------------------------------------------
def _learner(out, **cfg) -> OnlineReclaimer:
    pol = shipped_policy("testbed").fork()
    c = OnlineReclaimer(pol, OnlineConfig(**cfg), out=out)
    c.reset(AppLimits(pol.topo.service_names, pol.topo.caps, pol.topo.qos_ms))
    return c


def test_a_learner_saved_only_at_close_writes_its_log_as_it_goes(tmp_path):
    """save_every 0 ("only at close") with `out`: every second's row stayed in memory for as long
    as the daemon ran (one a second, never written nor dropped)."""
    c = _learner(tmp_path / "ft", start_after=10**6, save_every=0)
    c.rows_kept = 4
    for t in range(10):
        c.act(_meas(c.topo, float(t)))
        assert len(c.rows) <= 4
    assert not (tmp_path / "ft" / "policy").exists()          # the policy still only at close
    c.close()
    with open(tmp_path / "ft" / "online.csv", newline="") as f:
        steps = [int(r["step"]) for r in csv.DictReader(f)]
    assert steps == list(range(1, 11))                         # every second once, in order


def test_a_log_that_cannot_be_written_costs_no_decision(tmp_path, caplog):
    import logging

    blocked = tmp_path / "not-a-folder"
    blocked.write_text("x")
    c = _learner(blocked, start_after=10**6, save_every=0)
    c.rows_kept = 3
    with caplog.at_level(logging.WARNING, logger="agents.microservice_cores.online"):
        for t in range(7):
            assert np.isfinite(c.act(_meas(c.topo, float(t)))).all()
    assert c.save_errors == 2 and "saving under" in caplog.text
    assert len(c.rows) == 7                                    # kept for the next try, nothing dropped


# -- the daemon's loop ----------------------------------------------------------------------------
def _daemon_config(tmp_path, agent: dict, interval_s: float):
    from samm.config import SammConfig
    from samm.localproc import free_port

    entry = {"name": "hotel", "problem": "microservice-cores", "app": "testbed",
             "containers": {"name_prefix": "msd-", "base_url": f"unix://{tmp_path}/no-engine.sock", "timeout_s": 0.5},
             "load": {"path": str(tmp_path / "load.jsonl")}, "agent": agent, "timing": {"interval_s": interval_s}}
    return SammConfig.model_validate({"loops": [entry], "knowledge": {"url": f"sqlite:///{tmp_path}/k.db"},
                                      "graphite": {"publish": False, "render_url": f"http://127.0.0.1:{free_port()}",
                                                   "timeout_s": 0.5}})


@pytest.mark.parametrize("params", [{}, {"max_gap_s": 2.0}, {"scale_down_window": 5}])
def test_an_online_learner_whose_steps_break_its_chain_is_refused(tmp_path, params):
    """Steps 2 s apart against the default max_gap_s of 1.5 s: every measurement broke the chain,
    and the daemon ran a learner that never stored one transition, without a word."""
    from samm.daemon.build import ConfigurationProblem, build_daemon

    agent = {"name": "reclaimer-online", "params": {"out": str(tmp_path / "ft"), **params}}
    with pytest.raises(ConfigurationProblem, match="interval_s is 2 s: it would never learn"):
        build_daemon(_daemon_config(tmp_path, agent, 2.0))
    assert not (tmp_path / "ft").exists()


def test_an_online_learner_within_its_gap_still_builds(tmp_path):
    from samm.daemon.build import build_daemon

    agent = {"name": "reclaimer-online", "params": {"out": str(tmp_path / "ft"), "max_gap_s": 2.5}}
    build_daemon(_daemon_config(tmp_path, agent, 2.0)).close()
    build_daemon(_daemon_config(tmp_path, {"name": "reclaimer"}, 2.0)).close()


def test_a_learner_restarted_twice_keeps_one_version_suffix_and_its_whole_count(tmp_path):
    """Each restart on the same `out` wrapped the version once more ("v+online3+online3+online3")
    and the saved record counted only the seconds since the last restart."""
    from agents.microservice_cores.hosting import make_controller
    from agents.microservice_cores.policy import ReclaimerPolicy

    out = tmp_path / "ft"
    base = shipped_policy("testbed").version
    for run in range(3):
        c = make_controller("reclaimer-online", "testbed", out=str(out), start_after=10**6, save_every=0)
        c.reset(AppLimits(c.topo.service_names, c.topo.caps, c.topo.qos_ms))
        for t in range(4):
            c.act(_meas(c.topo, 100.0 * run + t))
        c.close()
    saved = ReclaimerPolicy.load(out / "policy")
    assert saved.version == f"{base}+online9"
    online = saved.training["online"]
    assert (online["steps"], online["transitions"], online["base_version"]) == (12, 9, base)


@pytest.mark.parametrize("kind", ["policy_dir", "online-out"])
def test_a_policy_of_another_application_is_a_configuration_problem(tmp_path, kind):
    """A loop of the testbed given chain3's policy (as policy_dir, or left under reclaimer-online's
    `out` by an earlier run) failed the controller's reset outside the build's error handling:
    `samm run` printed a traceback instead of "cannot start: ..."."""
    from fixtures_reclaimer import tiny_reclaimer_policy

    from agents.microservice_cores.policy import ReclaimerPolicy
    from samm.daemon.build import ConfigurationProblem, build_daemon

    other = tiny_reclaimer_policy(tmp_path / "other")
    assert ReclaimerPolicy.load(other).topo.name != "testbed"
    if kind == "policy_dir":
        agent = {"name": "reclaimer", "policy_dir": str(other)}
    else:
        ReclaimerPolicy.load(other).save(tmp_path / "ft" / "policy")
        agent = {"name": "reclaimer-online", "params": {"out": str(tmp_path / "ft")}}
    with pytest.raises(ConfigurationProblem, match="loop 'hotel': agent .* for testbed: this policy controls"):
        build_daemon(_daemon_config(tmp_path, agent, 1.0))


@pytest.mark.parametrize("out", ["", "  ", 5])
def test_an_online_out_that_names_no_folder_is_refused(tmp_path, monkeypatch, out):
    """out: "" became Path("") = ".": the learner wrote policy/ and online.csv into whatever folder
    the daemon was started from (5 was a bare TypeError from pathlib)."""
    from agents.microservice_cores.hosting import make_controller

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="reclaimer-online: out must be a folder"):
        make_controller("reclaimer-online", "testbed", out=out)
    assert list(tmp_path.iterdir()) == []
