"""The Reclaimer's live path under bad input (audit): the online learner's configuration, its
seconds out of order, a checkpoint that cannot be written and limits above the caps; the REST
allocate route's held limits, over a real uvicorn."""
from __future__ import annotations

import json
import logging
import urllib.request

import numpy as np
import pytest

from agents.microservice_cores.control import MIN_CORES, AppLimits
from agents.microservice_cores.hosting import make_controller
from agents.microservice_cores.observation import FIELD, PERCENTILES, SERVICE_FIELDS, StepMeasurement
from agents.microservice_cores.online import OnlineConfig, OnlineReclaimer
from agents.microservice_cores.policy import shipped_policy
from samm.localproc import AppInThread


def _meas(topo, t: float, limit=None, p99: float = 1.0) -> StepMeasurement:
    per = np.zeros((topo.n_services, len(SERVICE_FIELDS)))
    per[:, FIELD["cpu_limit"]] = topo.caps * 0.5 if limit is None else limit
    per[:, FIELD["cpu_used"]] = topo.caps * 0.25
    return StepMeasurement(services=topo.service_names, per_service=per, latency_ms=np.full(len(PERCENTILES), p99),
                           requests_per_s=50.0, failures_per_s=0.0, qos_ms=topo.qos_ms, t=t)


def _learner(out=None, **cfg) -> OnlineReclaimer:
    pol = shipped_policy("testbed")
    c = OnlineReclaimer(pol, OnlineConfig(**cfg), out=out)
    c.reset(AppLimits(pol.topo.service_names, pol.topo.caps, pol.topo.qos_ms))
    return c


# -- the online learner ---------------------------------------------------------------------------
@pytest.mark.parametrize("field, value", [("replay", 0), ("updates_per_step", -1), ("start_after", -5),
                                          ("save_every", "60"), ("batch", 0), ("max_gap_s", float("nan")),
                                          ("max_gap_s", 0.0), ("replay", 1.5)])
def test_an_online_setting_that_breaks_learning_is_refused_naming_it(field, value):
    """A replay of 0 failed every control second with a bare IndexError (the loop then took no
    action, each second); a NaN max_gap_s never broke a chain; a negative count never learned."""
    with pytest.raises(ValueError, match=f"online {field} must be"):
        OnlineConfig(**{field: value})
    with pytest.raises(ValueError, match=f"online {field} must be"):
        make_controller("reclaimer-online", "testbed", **{field: value})


def test_a_repeated_or_earlier_second_breaks_the_online_chain():
    """A second measured again, or one before the last (a clock stepped back), must not become a
    transition from the second it does not follow."""
    c = _learner(start_after=10**6)
    for t in (0.0, 1.0, 1.0, 0.5, 1.5, 2.5):
        c.act(_meas(c.topo, t))
    assert [r["gap"] for r in c.rows] == [0, 0, 1, 1, 0, 0]
    assert c.transitions == 3                     # 0 -> 1, 0.5 -> 1.5, 1.5 -> 2.5


def test_a_periodic_save_that_fails_costs_no_decision_and_close_still_says_so(tmp_path, caplog):
    """`out` that cannot be written (here a file): every `save_every`-th second raised out of
    `act`, so the loop took no action in it; now the save is logged and tried again, the rows kept."""
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("x")
    c = _learner(out=blocked, start_after=10**6, save_every=2)
    with caplog.at_level(logging.WARNING, logger="agents.microservice_cores.online"):
        for t in range(5):
            cores = c.act(_meas(c.topo, float(t)))
            assert np.isfinite(cores).all() and (cores >= MIN_CORES).all() and (cores <= c.topo.caps + 1e-12).all()
    assert c.save_errors == 2 and "saving under" in caplog.text and "not-a-folder" in caplog.text
    assert len(c.rows) == 5                       # nothing written, nothing dropped
    with pytest.raises(OSError):
        c.close()


def test_a_limit_above_the_cap_is_scored_as_the_cap_it_is_stored_as():
    """A container without a limit reads as the host's CPUs: its second was stored as the action
    at the cap but scored with the cost of 16 cores per service, a reward of -73 in a replay of
    [-1, 1]."""
    c = _learner(start_after=10**6)
    c.act(_meas(c.topo, 0.0))
    c.act(_meas(c.topo, 1.0, limit=np.full(c.topo.n_services, 16.0)))
    assert c.transitions == 1
    assert c.buf.act[0] == pytest.approx(np.ones(c.topo.n_services))
    assert -1.0 <= float(np.min(c.buf.rew[0])) and float(np.max(c.buf.rew[0])) <= 1.0
    assert float(np.mean(c.buf.rew[0])) == pytest.approx(0.0, abs=1e-6)   # alpha (1 - caps / caps)


# -- the REST allocate route ----------------------------------------------------------------------
def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def test_allocate_holds_limits_within_floor_and_cap_over_real_http():
    """Held limits (unknown latency) were the request's cpu_limit verbatim: 0 (a container without
    a limit, as Docker reports it) came back as 0 cores, 1e6 as 1e6; each is now within [floor, cap],
    an unlimited one at its cap."""
    from agents.microservice_cores.service import create_app

    pol = shipped_policy("testbed")
    topo = pol.topo
    rows = np.zeros((topo.n_services, len(SERVICE_FIELDS)))
    rows[:, FIELD["cpu_used"]] = 0.05
    limits = topo.caps * 0.5
    limits[0], limits[1], limits[2] = 0.0, 1e6, 0.001
    rows[:, FIELD["cpu_limit"]] = limits
    body = {"session": "s1", "services": list(topo.service_names), "per_service": rows.tolist(),
            "latency_ms": None, "requests_per_s": 10.0, "failures_per_s": 0.0}
    with AppInThread(create_app("reclaimer", pol)) as server:
        held = _post(f"{server.url}/v1/agents/reclaimer/allocate", body)
    assert held["action"] == "hold"
    cores = np.array(held["cores"])
    want = limits.copy()
    want[0], want[1], want[2] = topo.caps[0], topo.caps[1], MIN_CORES
    assert cores == pytest.approx(want)
    assert held["total_cores"] == pytest.approx(want.sum())


# -- the daemon's loop ----------------------------------------------------------------------------
def _daemon_config(tmp_path, **over):
    from samm.config import SammConfig
    from samm.localproc import free_port

    entry = {"name": "hotel", "problem": "microservice-cores", "app": "testbed",
             # an engine that is not there: the loop's own steps are driven by hand below
             "containers": {"name_prefix": "msd-", "base_url": f"unix://{tmp_path}/no-engine.sock", "timeout_s": 0.5},
             "load": {"path": str(tmp_path / "load.jsonl")},
             "agent": {"name": "sinan-explore", "params": {"out": str(tmp_path / "samples")}}}
    entry.update(over)
    return SammConfig.model_validate({"loops": [entry], "knowledge": {"url": f"sqlite:///{tmp_path}/k.db"},
                                      "graphite": {"publish": False, "render_url": f"http://127.0.0.1:{free_port()}",
                                                   "timeout_s": 0.5}})


def test_the_daemon_closes_its_controller_so_sinan_samples_are_written(tmp_path):
    """`samm run` never called the controller's close: sinan-explore's samples were never written
    and reclaimer-online lost what it learned since its last periodic save."""
    from samm.daemon.build import build_daemon

    d = build_daemon(_daemon_config(tmp_path))
    loop = d.loops[0]
    topo = loop.topology
    try:
        for k in range(1, 8):   # the testbed loop's steps, on measurements of a second each
            rec = loop.inner.step(k, _meas(topo, float(k), limit=topo.caps, p99=5.0))
            assert rec.targets is not None            # the controller decided (the engine then failed)
    finally:
        d.close()
    from agents.microservice_cores.sinan_live import load_samples

    data = load_samples([tmp_path / "samples"], topo)
    assert len(data.y_lat) == 6 - 5 + 1              # 6 measured outcomes, a look-ahead of 5


def test_a_daemon_that_never_stepped_writes_no_untrained_policy_at_close(tmp_path):
    """A daemon stopped (or whose later loop failed to build) before any step must not save the
    base policy over the fine-tuned one a previous run left in `out`."""
    from samm.daemon.build import build_daemon

    agent = {"name": "reclaimer-online", "params": {"out": str(tmp_path / "ft")}}
    build_daemon(_daemon_config(tmp_path, agent=agent)).close()
    assert not (tmp_path / "ft").exists()


def test_sinan_explore_in_a_dry_run_is_refused_naming_why(tmp_path):
    """Its samples pair each allocation with the latency under it: in a dry run none is applied."""
    from samm.daemon.build import ConfigurationProblem, build_daemon

    with pytest.raises(ConfigurationProblem, match="sinan-explore.*dry run"):
        build_daemon(_daemon_config(tmp_path, executor={"kind": "docker", "dry_run": True}))


# -- the Sinan live model -------------------------------------------------------------------------
@pytest.mark.parametrize("p99", [np.float64(3.0), "2d"])
def test_samples_whose_p99_is_not_one_value_a_second_are_refused_naming_it(tmp_path, p99):
    """A 0-d p99_ms raised a bare TypeError (the CLI printed a traceback); a 2-d one became labels
    of the wrong shape, fitted silently."""
    from agents.microservice_cores.sinan_live import SinanCollector, load_samples

    topo = shipped_policy("testbed").topo
    c = SinanCollector(topo, tmp_path / "run")
    c.reset(AppLimits(topo.service_names, topo.caps, topo.qos_ms))
    for t in range(12):
        c.act(_meas(topo, float(t), p99=5.0))
    with np.load(c.close()) as f:
        data = dict(f)
    data["p99_ms"] = p99 if not isinstance(p99, str) else np.stack([data["p99_ms"]] * 3, axis=1)
    bad = tmp_path / "bad.npz"
    np.savez(bad, **data)
    with pytest.raises(ValueError, match="bad.npz: p99_ms is .* not one value per measured second"):
        load_samples([bad], topo)


def test_a_learner_without_out_keeps_a_bounded_record():
    """Without `out` its rows were never written nor dropped: a daemon's learner grew by one row
    a second for as long as it ran."""
    c = _learner(start_after=10**6)
    c.rows_kept = 4
    for t in range(10):
        c.act(_meas(c.topo, float(t)))
    assert [r["step"] for r in c.rows] == [7, 8, 9, 10] and c.steps == 10


# -- the headroom ceiling's memory ----------------------------------------------------------------
def test_a_saved_ceiling_window_too_long_to_hold_is_refused_at_load(tmp_path):
    """A window of 1e9 s was accepted, then its memory asked 52 GiB at the first decision."""
    from agents.microservice_cores.action_map import MAX_WINDOW_S, check_ceiling
    from agents.microservice_cores.policy import ReclaimerPolicy

    assert check_ceiling({"multiple": 2, "window": MAX_WINDOW_S}).window == MAX_WINDOW_S
    d = shipped_policy("testbed").save(tmp_path / "p")
    meta = json.loads((d / "metadata.json").read_text())
    meta["headroom_ceiling"] = {"multiple": 2.0, "sqrt": 0.0, "window": 10**9, "release": 0.0, "hold": 0}
    (d / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="metadata.json.*window must be at most 86400 s"):
        ReclaimerPolicy.load(d)


def test_a_session_does_not_outlive_the_policy_it_was_made_by_over_real_http(tmp_path):
    """Sessions were keyed by the version string only: after an upload that repeats the version
    over other weights, a running session went on acting with the replaced network."""
    import torch

    from agents.microservice_cores.service import create_app
    from samm.plan.registry import PolicyRegistry

    old, new = shipped_policy("testbed"), shipped_policy("testbed")
    assert old.version == new.version
    with torch.no_grad():
        for p in new.agent.actor.parameters():
            p.mul_(-1.0)                          # other weights, the same version
    topo = old.topo
    rows = np.zeros((topo.n_services, len(SERVICE_FIELDS)))
    rows[:, FIELD["cpu_used"]] = topo.caps * 0.2
    rows[:, FIELD["cpu_limit"]] = topo.caps * 0.6
    body = {"session": "s1", "services": list(topo.service_names), "per_service": rows.tolist(),
            "latency_ms": [5.0] * len(PERCENTILES), "requests_per_s": 50.0, "failures_per_s": 0.0}
    reg = PolicyRegistry(tmp_path / "store")
    reg.host("reclaimer", old)
    with AppInThread(create_app("reclaimer", reg)) as server:
        url = f"{server.url}/v1/agents/reclaimer/allocate"
        _post(url, body)                          # the session's first second, under the old policy
        reg.host("reclaimer", new)                # swapped in (as an upload or a rollback does)
        after_swap = _post(url, body)["cores"]
        fresh = _post(url, {**body, "session": "s2"})["cores"]
    assert after_swap == pytest.approx(fresh)     # a new session of the new policy, its first second


_CUT_SHORT = r"""
import resource, signal, sys
import numpy as np
from agents.microservice_cores.control import AppLimits
from agents.microservice_cores.observation import FIELD, PERCENTILES, SERVICE_FIELDS, StepMeasurement
from agents.microservice_cores.sinan_live import SinanCollector
from agents.microservice_cores.topology import load_topology

topo = load_topology("testbed")
c = SinanCollector(topo, sys.argv[1], seed=1)
c.reset(AppLimits(topo.service_names, topo.caps, topo.qos_ms))
rng = np.random.default_rng(0)
for t in range(400):
    per = np.zeros((topo.n_services, len(SERVICE_FIELDS)))
    per[:, FIELD["cpu_limit"]] = topo.caps
    per[:, FIELD["cpu_used"]] = rng.uniform(0, 0.2, topo.n_services)
    c.act(StepMeasurement(topo.service_names, per, np.full(len(PERCENTILES), rng.uniform(1, 50)), 10.0, 0.0,
                          topo.qos_ms, t=float(t)))
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)      # a write past the limit fails (EFBIG), as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
try:
    c.close()
except OSError as exc:
    print("cut short:", exc)
"""


def test_samples_written_again_and_cut_short_leave_the_earlier_ones_whole(tmp_path):
    """sinan-samples.npz was written in place: a second run's write cut short (a full disk, a
    kill) left a torn file where the first run's samples were."""
    import subprocess
    import sys
    from pathlib import Path

    from agents.microservice_cores.sinan_live import SAMPLES_FILE, SinanCollector, load_samples

    topo = shipped_policy("testbed").topo
    first = SinanCollector(topo, tmp_path)
    first.reset(AppLimits(topo.service_names, topo.caps, topo.qos_ms))
    for t in range(12):
        first.act(_meas(topo, float(t), p99=5.0))
    first.close()
    before = load_samples([tmp_path], topo)
    r = subprocess.run([sys.executable, "-c", _CUT_SHORT, str(tmp_path)], capture_output=True, text=True,
                       timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0 and "cut short" in r.stdout, r.stdout + r.stderr[-2000:]
    after = load_samples([tmp_path], topo)   # the first run's, whole, then what the second's journal kept
    n = len(before.X)
    assert np.array_equal(after.X[:n], before.X) and np.array_equal(after.y_lat[:n], before.y_lat)
    assert len(after.X) > n
    # no temporary file left: the first run's samples and the second run's journal
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([SAMPLES_FILE, "sinan-samples-1.jsonl"])


def test_a_restarted_online_learner_continues_its_policy_and_its_log(tmp_path):
    """A daemon restart with the same `out` started again from the base policy and wrote its first
    save over the fine-tuned one, and truncated online.csv: everything learned was lost."""
    out = tmp_path / "online"
    earlier = shipped_policy("testbed").fork()  # a copy: the shipped one is shared
    earlier.version = "fine-tuned-before-the-restart"
    earlier.save(out / "policy")
    (out / "online.csv").write_text("t,reward\n0,0.5\n")
    learner = make_controller("reclaimer-online", "testbed", out=str(out))
    assert learner.policy.version == "fine-tuned-before-the-restart"
    learner.rows.append({"t": 1, "reward": 0.25})
    learner.save()
    assert (out / "online.csv").read_text().splitlines() == ["t,reward", "0,0.5", "1,0.25"]
