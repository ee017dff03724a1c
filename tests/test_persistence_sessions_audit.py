"""Audit of policy persistence and of the problem routes' per-session state: a save killed between
its renames, the generic session reset reaching the problem routes' sessions, the reclaimer-online
agent's parameter names, and the loaders on damaged policy folders."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]

# A small Reclaimer policy (chain3, a few hidden units), built the same way here and in a child.
TINY = """
import torch
from agents.microservice_cores.features import ROW
from agents.microservice_cores.policy import ReclaimerPolicy
from agents.microservice_cores.sac import Sac
from agents.microservice_cores.topology import load_topology
from agents.microservice_cores.train import scaled_schedule, sim_config

def tiny_policy(version, seed, hidden=16):
    topo = load_topology("chain3")
    cfg = scaled_schedule(sim_config(n_envs=2, hidden=hidden), 1200)
    torch.manual_seed(seed)
    sac = Sac(cfg.k * ROW + topo.n_services, cfg.k * ROW, topo.n_services, cfg)
    return ReclaimerPolicy(sac, topo, cfg, version=version)
"""
_tiny: dict = {}
exec(TINY, _tiny)
tiny_policy = _tiny["tiny_policy"]

# The child saves over the folder and is SIGKILLed by its own first rename's successor: the state
# a daemon killed (OOM, power, kill -9) in the middle of a save leaves behind.
KILLED_MID_SAVE = TINY + """
import os, signal, sys
renames = []
real_replace = os.replace

def replace_then_die(src, dst):
    real_replace(src, dst)
    renames.append(dst)
    if len(renames) == 1:
        os.kill(os.getpid(), signal.SIGKILL)

os.replace = replace_then_die
tiny_policy("second", seed=1, hidden=int(sys.argv[2])).save(sys.argv[1])
"""


def _save_killed_between_renames(folder: Path, hidden: int) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", KILLED_MID_SAVE, str(folder), str(hidden)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]


def _actor_weights(policy) -> dict:
    return {k: v.clone() for k, v in policy.agent.state_dict().items()}


def _same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k].shape == b[k].shape and bool((a[k] == b[k]).all()) for k in a)


@pytest.mark.parametrize("hidden", [16, 32], ids=["same-network", "changed-network"])
def test_a_save_killed_between_its_renames_loads_as_the_new_policy_whole(tmp_path, hidden):
    from agents.microservice_cores.policy import ReclaimerPolicy

    folder = tmp_path / "policy"
    tiny_policy("first", seed=0).save(folder)
    _save_killed_between_renames(folder, hidden)
    loaded = ReclaimerPolicy.load(folder)
    second = tiny_policy("second", seed=1, hidden=hidden)
    # never the new weights under the old metadata (served as "first", or refused as not fitting)
    assert loaded.version == "second"
    assert _same_weights(_actor_weights(loaded), _actor_weights(second))
    # and the next save completes normally over the leftover
    tiny_policy("third", seed=2).save(folder)
    assert ReclaimerPolicy.load(folder).version == "third"
    assert not (folder / ".weights.pt.tmp").exists()


# -- the session reset reaches the problem routes' sessions ---------------------------------------

def _allocate_body(topo, session: str, used: float) -> dict:
    from agents.microservice_cores.observation import PERCENTILES, SERVICE_FIELDS

    rows = np.zeros((topo.n_services, len(SERVICE_FIELDS)))
    rows[:, SERVICE_FIELDS.index("cpu_used")] = used
    rows[:, SERVICE_FIELDS.index("cpu_limit")] = topo.caps
    return {"session": session, "services": list(topo.service_names), "per_service": rows.tolist(),
            "latency_ms": [5.0 + i for i in range(len(PERCENTILES))], "requests_per_s": 100.0}


def _schedule_body(slot: int, session: str, cores: int) -> dict:
    return {"slot": slot, "capacity": 40, "session": session,
            "eligible": [{"id": f"j{slot}-{i}", "cores": cores + i, "duration": 3, "earliest": slot,
                          "latest": slot + 4} for i in range(3)]}


@pytest.fixture(scope="module")
def served_problem_agents():
    """The Policy Evaluation Service on a real uvicorn server, hosting a Reclaimer policy (allocate:
    a frame stack per session) and the shipped OSDEC policy (schedule: slot summaries per session)."""
    import httpx

    from agents.deferrable_jobs.policy import shipped_policy
    from samm.localproc import AppInThread
    from samm.plan.registry import PolicyRegistry
    from samm.plan.service import create_app

    reclaimer = tiny_policy("r1", seed=0)
    registry = PolicyRegistry(None)
    registry.host("reclaimer", reclaimer)
    registry.host("osdec", shipped_policy())
    with AppInThread(create_app(registry)) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        yield client, reclaimer.topo, registry


def test_the_session_reset_starts_an_allocate_session_afresh(served_problem_agents):
    client, topo, _ = served_problem_agents

    def allocate(session, used):
        r = client.post("/v1/agents/reclaimer/allocate", json=_allocate_body(topo, session, used))
        assert r.status_code == 200, r.text
        return r.json()["cores"]

    fresh = allocate("never-used", 0.1)
    for used in (0.3, 0.5, 0.7, 0.9):
        allocate("app-a", used)
    r = client.post("/v1/agents/reclaimer/sessions/app-a/reset")
    assert r.status_code == 200 and r.json() == {"session_id": "app-a", "existed": True}
    # the frame stack went with the reset: the first second after it is decided as a new session's
    assert allocate("app-a", 0.1) == pytest.approx(fresh, abs=0)
    assert client.post("/v1/agents/reclaimer/sessions/unknown/reset").json()["existed"] is False


def _schedule_scores(client, slot: int, session: str, cores: int = 1) -> list[float]:
    """The sorted scores /schedule answers for one slot of a session."""
    r = client.post("/v1/agents/osdec/schedule", json=_schedule_body(slot, session, cores))
    assert r.status_code == 200, r.text
    return sorted(r.json()["scores"].values())


def test_the_session_reset_drops_a_schedule_sessions_slot_history(served_problem_agents):
    client, _, _ = served_problem_agents

    def scores(slot, session, cores=1):
        return _schedule_scores(client, slot, session, cores)

    fresh = scores(30, "cluster-fresh")
    for session in ("cluster-a", "cluster-b"):
        for slot in range(20, 30):
            scores(slot, session, cores=4)
    assert scores(30, "cluster-b") != pytest.approx(fresh, abs=0)   # the slot history changes the scores
    r = client.post("/v1/agents/osdec/sessions/cluster-a/reset")
    assert r.status_code == 200 and r.json()["existed"] is True
    assert scores(30, "cluster-a") == pytest.approx(fresh, abs=0)


def test_a_schedule_session_starts_afresh_when_another_policy_is_hosted(served_problem_agents):
    """As the service's sessions promise (and the allocate route did): the slot summaries are scaled
    by the hosted policy's setting, so an upload or a rollback must not inherit them."""
    from agents.deferrable_jobs.policy import shipped_policy

    client, _, registry = served_problem_agents

    def scores(slot, session, cores=1):
        return _schedule_scores(client, slot, session, cores)

    fresh = scores(30, "swap-fresh")
    for slot in range(20, 30):
        scores(slot, "swap-a", cores=4)
    registry.host("osdec", shipped_policy())   # the same weights, another hosted policy
    assert scores(30, "swap-a") == pytest.approx(fresh, abs=0)


def test_an_allocate_session_in_use_neither_expires_nor_goes_first():
    """The allocate route read its session without marking it used: one called every second expired
    one TTL after it began (its frame stack lost mid-run), and was the first evicted past the cap."""
    import httpx

    from samm.localproc import AppInThread
    from samm.plan.registry import PolicyRegistry
    from samm.plan.service import create_app
    from samm.plan.sessions import SessionStore

    now = [0.0]
    policy = tiny_policy("r1", seed=0)
    registry = PolicyRegistry(None)
    registry.host("reclaimer", policy)
    store = SessionStore(ttl_s=10.0, max_sessions=2, clock=lambda: now[0])
    with AppInThread(create_app(registry, sessions=store)) as server, \
            httpx.Client(base_url=server.url, timeout=60) as client:
        def allocate(at, session, used):
            now[0] = at
            r = client.post("/v1/agents/reclaimer/allocate", json=_allocate_body(policy.topo, session, used))
            assert r.status_code == 200, r.text
            return r.json()["cores"]

        allocate(0, "a", 0.9)
        allocate(1, "b", 0.9)
        allocate(6, "a", 0.9)            # "a" used last: "b" is the one to go past the cap of 2
        fresh = allocate(7, "c", 0.1)
        # "a", used 6 s ago within a 10 s TTL, goes on from its frames: not answered as a new session
        assert allocate(12, "a", 0.1) != pytest.approx(fresh, abs=0)


def test_a_stand_alone_problem_app_resets_its_sessions_too():
    from fastapi.testclient import TestClient

    from agents.microservice_cores.service import create_app

    policy = tiny_policy("r1", seed=0)
    client = TestClient(create_app("reclaimer", policy))
    first = client.post("/v1/agents/reclaimer/allocate", json=_allocate_body(policy.topo, "s", 0.1)).json()["cores"]
    client.post("/v1/agents/reclaimer/allocate", json=_allocate_body(policy.topo, "s", 0.9))
    r = client.post("/v1/agents/reclaimer/sessions/s/reset")
    assert r.status_code == 200 and r.json()["existed"] is True
    again = client.post("/v1/agents/reclaimer/allocate", json=_allocate_body(policy.topo, "s", 0.1)).json()["cores"]
    assert again == pytest.approx(first, abs=0)
    assert client.post("/v1/agents/reclaimer/sessions/bad%20id/reset").status_code == 422


# -- the loaders on a folder whose files do not belong together -----------------------------------

def _second_rename_fails(monkeypatch) -> None:
    """A save's second rename (the weights, after the metadata's commit) fails, as a full disk or a
    kill would leave it."""
    real_replace, calls = os.replace, []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError("no space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)


def test_a_first_save_cut_short_between_its_renames_loads(tmp_path, monkeypatch):
    """No earlier policy: the metadata is renamed, the weights still beside it (an OSError here, as
    a full disk or a kill would leave it)."""
    from agents.microservice_cores.policy import ReclaimerPolicy

    _second_rename_fails(monkeypatch)
    with pytest.raises(OSError):
        tiny_policy("first", seed=0).save(tmp_path / "p")
    monkeypatch.undo()
    assert not (tmp_path / "p" / "weights.pt").exists()
    assert ReclaimerPolicy.load(tmp_path / "p").version == "first"


def test_weights_copied_over_from_another_save_are_refused_naming_the_file(tmp_path):
    from agents.registry import load_policy

    tiny_policy("first", seed=0).save(tmp_path / "first")
    tiny_policy("second", seed=1).save(tmp_path / "second")
    shutil.copy(tmp_path / "second" / "weights.pt", tmp_path / "first" / "weights.pt")
    with pytest.raises(ValueError) as e:
        load_policy(tmp_path / "first")    # it loaded: the second's network served as "first"
    text = str(e.value)
    assert "\n" not in text and text.startswith(str(tmp_path / "first" / "weights.pt"))
    assert "metadata.json" in text


@pytest.mark.parametrize("digest", [5, "abc", None, ["0" * 64]])
def test_a_recorded_digest_of_the_wrong_type_is_named(tmp_path, digest):
    from agents.registry import load_policy

    folder = tiny_policy("first", seed=0).save(tmp_path / "p")
    meta = json.loads((folder / "metadata.json").read_text())
    meta["weights_sha256"] = digest
    (folder / "metadata.json").write_text(json.dumps(meta))
    if digest is None:   # as the shipped policies: no digest recorded, the weights load as they are
        assert load_policy(folder).version == "first"
        return
    with pytest.raises(ValueError, match=r"metadata.json: weights_sha256 must be a SHA-256 hex digest"):
        load_policy(folder)


def test_the_shipped_torch_policies_load_unchanged():
    """They record no digest: loaded as before."""
    from agents.deferrable_jobs.policy import SHIPPED_DIR, shipped_policy

    assert "weights_sha256" not in json.loads((SHIPPED_DIR / "metadata.json").read_text())
    assert shipped_policy().version


# -- reclaimer-online's parameters, named like every agent's -------------------------------------

@pytest.mark.parametrize("params, named", [
    ({"lrr": 1e-4}, "unknown parameter 'lrr' (known: batch, explore, headroom_floor, lr, "),
    ({"lr": "abc"}, "lr must be a number, got 'abc'"),
    ({"seed": "x"}, "seed must be a whole number, got 'x'"),
    ({"explore": "False"}, "explore must be true or false, got 'False'"),
])
def test_reclaimer_online_names_a_bad_parameter(tmp_path, params, named):
    from agents.microservice_cores.hosting import make_controller

    folder = tiny_policy("first", seed=0).save(tmp_path / "p")
    with pytest.raises(ValueError) as e:
        make_controller("reclaimer-online", "chain3", policy_dir=folder, **params)
    assert str(e.value).startswith("reclaimer-online: ") and named in str(e.value)


def test_reclaimer_online_takes_its_parameters_and_the_wrappers(tmp_path):
    from agents.microservice_cores.hosting import make_controller

    folder = tiny_policy("first", seed=0).save(tmp_path / "p")
    ctl = make_controller("reclaimer-online", "chain3", policy_dir=folder, lr=1e-4, seed=3, explore=False,
                          scale_down_window=5)
    inner = ctl.inner if hasattr(ctl, "inner") else ctl
    assert (inner.cfg.lr, inner.cfg.seed, inner.cfg.explore) == (1e-4, 3, False)


# -- agents/params.py ------------------------------------------------------------------------------

def test_an_integer_past_any_float_is_named_not_an_overflow_error():
    from agents.baselines.threshold import ThresholdAgent

    huge = json.loads("1" + "0" * 400)    # what a JSON or YAML parameter of 400 digits parses to
    with pytest.raises(ValueError, match=r"^threshold: cooldown_steps must be a finite number, got 1000"):
        ThresholdAgent(params={"cooldown_steps": huge})


def test_a_save_after_one_cut_short_keeps_that_policy_if_it_is_cut_short_too(tmp_path, monkeypatch):
    """Two interrupted saves in a row: the second, cut short before its commit, must leave the first
    one's policy loadable (its pending weights were otherwise overwritten first)."""
    from agents.microservice_cores.policy import ReclaimerPolicy

    folder = tmp_path / "p"
    tiny_policy("zeroth", seed=0).save(folder)
    _second_rename_fails(monkeypatch)
    with pytest.raises(OSError):
        tiny_policy("first", seed=1).save(folder)             # metadata committed, weights pending
    monkeypatch.undo()

    import torch

    def torch_save_dies(obj, path, *a, **kw):
        Path(path).write_bytes(b"PK\x03\x04 half a file")
        raise OSError("killed while writing")

    monkeypatch.setattr(torch, "save", torch_save_dies)
    with pytest.raises(OSError):
        tiny_policy("second", seed=2).save(folder)            # cut short before its commit
    monkeypatch.undo()
    loaded = ReclaimerPolicy.load(folder)
    assert loaded.version == "first"
    assert _same_weights(_actor_weights(loaded), _actor_weights(tiny_policy("first", seed=1)))


# --- lead's follow-up: a Reclaimer policy whose metadata sizes the networks absurdly ------------

@pytest.mark.parametrize("field, value", [("observe_queue", 1e9), ("observe_queue", "yes"), ("k", "5"),
                                          ("k", 10 ** 6), ("id_width", 1.5), ("hidden", None),
                                          ("actor_layers", -1)])
def test_a_reclaimer_policy_sizing_its_networks_absurdly_is_refused_in_one_line(tmp_path, field, value):
    """`observe_queue: 1e9` allocated gigabytes (an upload could take `samm serve` down); a string
    `k` escaped the loader as a bare TypeError."""
    import json
    import shutil

    from agents.microservice_cores.policy import ReclaimerPolicy

    d = tmp_path / "p"
    shutil.copytree(Path(__file__).resolve().parent.parent / "agents/microservice_cores/policies/reclaimer-hotel", d)
    meta = json.loads((d / "metadata.json").read_text())
    meta["config"][field] = value
    (d / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=f"metadata.json: missing or malformed field.*{field} must be") as err:
        ReclaimerPolicy.load(d)
    assert "\n" not in str(err.value)


# --- lead's follow-up: the autoscaling (LSTM-PPO) and placement policies save as one -----------

PPO = """
import numpy as np, torch
from agents.ppo.agent import LstmPpoAgent
from agents.ppo.normalize import RunningMeanStd
from samm.analyze import OBSERVATION_NAMES

def ppo(version, seed, hidden=16, normalise=True):
    torch.manual_seed(seed)
    rms = None
    if normalise:
        rms = RunningMeanStd((len(OBSERVATION_NAMES),))
        rms.mean[:] = seed
    return LstmPpoAgent(OBSERVATION_NAMES, "per-type", ("S", "M", "L"), params={"lstm_hidden": hidden},
                        obs_rms=rms, version=version)
"""
_ppo: dict = {}
exec(PPO, _ppo)

PPO_KILLED = PPO + """
import os, signal, sys
renames, real_replace = [], os.replace

def replace_then_die(src, dst):
    real_replace(src, dst)
    renames.append(dst)
    if len(renames) == int(sys.argv[2]):
        os.kill(os.getpid(), signal.SIGKILL)

os.replace = replace_then_die
ppo("second", seed=1, hidden=32).save(sys.argv[1])
"""


@pytest.mark.parametrize("after", [1, 2], ids=["after-metadata", "after-weights"])
def test_an_lstm_ppo_save_killed_part_way_loads_as_the_new_policy_whole(tmp_path, after):
    """The agent wrote its weights, normaliser and metadata in place, one after the other: killed
    part-way, new weights sat under the old settings (or a truncated file lost the policy)."""
    from agents.base import load_agent

    folder = tmp_path / "policy"
    _ppo["ppo"]("first", seed=0).save(folder)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", PPO_KILLED, str(folder), str(after)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    loaded = load_agent(folder)
    assert loaded.version == "second" and loaded.params["lstm_hidden"] == 32
    assert float(loaded.obs_rms.mean[0]) == 1.0   # the new save's normaliser, not the old one's
    second = _ppo["ppo"]("second", seed=1, hidden=32)
    assert all(bool((a == b).all()) for a, b in zip(loaded.net.state_dict().values(), second.net.state_dict().values()))


def test_an_lstm_ppo_save_without_a_normaliser_does_not_inherit_the_last_ones(tmp_path):
    from agents.base import load_agent

    folder = tmp_path / "policy"
    _ppo["ppo"]("first", seed=3).save(folder)
    _ppo["ppo"]("second", seed=4, normalise=False).save(folder)
    loaded = load_agent(folder)
    assert loaded.version == "second" and loaded.obs_rms is None


@pytest.mark.parametrize("version", [["v1"], 3, {"v": 1}])
def test_a_policy_whose_version_is_not_a_string_is_refused_naming_the_file(tmp_path, version):
    """Accepted by the Reclaimer, C2MARL, OSDEC and placement loaders; the version goes into every
    decision's answer."""
    import json
    import shutil

    from agents.microservice_cores.policy import ReclaimerPolicy

    d = tmp_path / "p"
    shutil.copytree(Path(__file__).resolve().parent.parent / "agents/microservice_cores/policies/reclaimer-hotel", d)
    meta = json.loads((d / "metadata.json").read_text())
    (d / "metadata.json").write_text(json.dumps({**meta, "version": version}))
    with pytest.raises(ValueError, match="metadata.json: version must be a string"):
        ReclaimerPolicy.load(d)


def test_an_lstm_ppo_policy_whose_version_is_not_a_string_is_refused(tmp_path):
    import json
    import shutil

    from agents.base import load_agent

    d = tmp_path / "p"
    shutil.copytree(Path(__file__).resolve().parent.parent / "agents/policies/lstm-ppo-default", d)
    meta = json.loads((d / "metadata.json").read_text())
    (d / "metadata.json").write_text(json.dumps({**meta, "version": [1]}))
    with pytest.raises(ValueError, match="metadata.json: version must be a string"):
        load_agent(d)
