"""The Reclaimer policy fine-tuned while it acts (agents/microservice_cores/online.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from agents.microservice_cores.control import AppLimits
from agents.microservice_cores.env import ALPHA
from agents.microservice_cores.hosting import make_controller
from agents.microservice_cores.observation import FIELD, PERCENTILES, SERVICE_FIELDS, StepMeasurement
from agents.microservice_cores.online import OnlineConfig, OnlineReclaimer
from agents.microservice_cores.policy import ReclaimerPolicy, shipped_policy


def _policy() -> ReclaimerPolicy:
    return shipped_policy("testbed")


def _meas(topo, t: float, limit_share: float, p99: float) -> StepMeasurement:
    per = np.zeros((topo.n_services, len(SERVICE_FIELDS)))
    per[:, FIELD["cpu_limit"]] = topo.caps * limit_share
    per[:, FIELD["cpu_used"]] = topo.caps * limit_share * 0.5
    return StepMeasurement(services=topo.service_names, per_service=per,
                           latency_ms=np.full(len(PERCENTILES), p99), requests_per_s=50.0,
                           failures_per_s=0.0, qos_ms=topo.qos_ms, t=t)


def _learner(**cfg) -> OnlineReclaimer:
    pol = _policy()
    c = OnlineReclaimer(pol, OnlineConfig(**cfg))
    c.reset(AppLimits(pol.topo.service_names, pol.topo.caps, pol.topo.qos_ms))
    return c


def test_a_transition_holds_the_limits_in_force_and_the_next_seconds_reward():
    """The reward of second t scores the limits in force during it (set at t-1), read back from
    the measurement, not the action asked for."""
    c = _learner(start_after=10**6)
    topo = c.topo
    qos = topo.qos_ms * c.policy.cfg.qos_margin
    c.act(_meas(topo, 0.0, 0.5, p99=1.0))
    assert c.transitions == 0                     # nothing to complete yet
    c.act(_meas(topo, 1.0, 0.25, p99=qos * 2))    # second 1 ran at 25 % of the caps and broke QoS
    c.act(_meas(topo, 2.0, 0.75, p99=qos / 2))    # second 2 ran at 75 % and met it
    assert c.transitions == 2
    assert c.buf.act[0] == pytest.approx(np.full(topo.n_services, 0.25))
    assert c.buf.rew[0] == -1.0 and c.buf.violated[0]
    assert c.buf.act[1] == pytest.approx(np.full(topo.n_services, 0.75))
    assert c.buf.rew[1] == pytest.approx(ALPHA * (1 - 0.75), rel=1e-5)   # the paper's alpha(1 - sum/caps)
    assert c.buf.rew[1] > 0 and not c.buf.violated[1]
    # the next observation of transition 0 is the observation transition 1 starts from
    assert np.array_equal(c.buf.nxt[0], c.buf.obs[1])


def test_a_gap_in_the_measurements_breaks_the_chain():
    c = _learner(start_after=10**6, max_gap_s=1.5)
    topo = c.topo
    for t in (0.0, 1.0, 2.0):
        c.act(_meas(topo, t, 0.5, 1.0))
    assert c.transitions == 2
    c.act(_meas(topo, 9.0, 0.5, 1.0))             # the loop skipped 6 seconds (stale latency)
    assert c.transitions == 2                     # no transition spans the gap
    c.act(_meas(topo, 10.0, 0.5, 1.0))
    assert c.transitions == 3


def test_updates_start_after_start_after_and_change_the_actor_and_actions_stay_within_bounds():
    c = _learner(start_after=5, updates_per_step=2, batch=4)
    topo = c.topo
    before = [p.detach().clone() for p in c.agent.actor.parameters()]
    for t in range(5):
        out = c.act(_meas(topo, float(t), 0.5, 1.0))
        assert np.all(out >= c.limits.floor) and np.all(out <= topo.caps + 1e-12)
    assert c.updates == 0                         # 4 transitions < start_after
    for t in range(5, 9):
        c.act(_meas(topo, float(t), 0.5, 1.0))
    assert c.updates == 2 * 4
    after = list(c.agent.actor.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after))


def test_close_saves_a_loadable_policy_that_records_its_fine_tuning(tmp_path):
    pol = _policy()
    c = make_controller("reclaimer-online", pol.topo, out=str(tmp_path / "ft"), start_after=3, batch=2,
                        save_every=0)
    assert isinstance(c, OnlineReclaimer)
    c.reset(AppLimits(pol.topo.service_names, pol.topo.caps, pol.topo.qos_ms))
    for t in range(6):
        c.act(_meas(pol.topo, float(t), 0.5, 1.0))
    c.close()
    loaded = ReclaimerPolicy.load(tmp_path / "ft" / "policy")
    online = loaded.training["online"]
    assert online["transitions"] == 5 and online["updates"] == c.updates > 0
    assert loaded.version.endswith("+online5")
    rows = (tmp_path / "ft" / "online.csv").read_text().splitlines()
    assert len(rows) == 1 + 6
    # the saved weights are the fine-tuned ones
    for a, b in zip(loaded.agent.actor.parameters(), c.agent.actor.parameters()):
        assert torch.equal(a, b)


def test_unknown_online_parameters_are_named():
    with pytest.raises(ValueError, match="unknown parameter.*bogus"):
        make_controller("reclaimer-online", _policy().topo, bogus=1)


def test_periodic_saves_append_each_second_to_the_csv_once(tmp_path):
    pol = _policy()
    c = OnlineReclaimer(pol, OnlineConfig(start_after=10**6, save_every=3), out=tmp_path / "ft")
    c.reset(AppLimits(pol.topo.service_names, pol.topo.caps, pol.topo.qos_ms))
    for t in range(7):
        c.act(_meas(pol.topo, float(t), 0.5, 1.0))
    c.close()
    lines = (tmp_path / "ft" / "online.csv").read_text().splitlines()
    assert lines[0].startswith("step,") and [int(x.split(",")[0]) for x in lines[1:]] == list(range(1, 8))


def test_a_second_with_a_non_finite_counter_never_enters_the_replay():
    c = _learner(start_after=10**6)
    topo = c.topo
    c.act(_meas(topo, 0.0, 0.5, 1.0))
    bad = _meas(topo, 1.0, 0.5, 1.0)
    bad.per_service[0, FIELD["cpu_used"]] = np.nan
    c.act(bad)
    c.act(_meas(topo, 2.0, 0.5, 1.0))
    assert c.transitions == 0                     # neither the transition into nor out of it
    assert np.isfinite(c.buf.obs[: max(c.buf.size, 1)].astype(np.float32)).all()


def test_a_fine_tuning_learning_rate_reaches_the_actor_and_critics_only():
    c = _learner(lr=3e-5)
    assert {g["lr"] for g in c.agent.opt_actor.param_groups} == {3e-5}
    assert {g["lr"] for g in c.agent.opt_critic.param_groups} == {3e-5}
    assert {g["lr"] for g in c.agent.opt_alpha.param_groups} != {3e-5}
    with pytest.raises(ValueError, match="online lr must be > 0"):
        _learner(lr=0.0)
