"""The N-sigma shield under C2MARL's rates (agents/oversubscription/shield.py, ours)."""
from __future__ import annotations

import numpy as np
import pytest

from agents.oversubscription.baselines import NSigmaRule, replay_usage_history
from agents.oversubscription.c2marl import C2MarlConfig
from agents.oversubscription.features import observation_size
from agents.oversubscription.settings import RATES, SETTINGS
from agents.oversubscription.shield import Shield, ShieldSpec

from oversub_toy import toy_workload, views_at_rate_one

S = SETTINGS["tiny"]


def _views(workload):
    return views_at_rate_one(S, workload)


def test_floor_is_the_nsigma_rule_with_the_shields_knobs_incremental_or_fresh():
    prior = replay_usage_history(S, toy_workload(seed=7))
    prior[3, 1] = np.nan                                   # a step without a live VM is skipped
    spec = ShieldSpec(n=1.5, window=6, headroom=2.0)
    shield = Shield(spec, S.n_subscribers, prior)
    rule = NSigmaRule(S.n_subscribers, n=1.5, window=6, headroom=2.0, prior=prior)
    views = _views(toy_workload(seed=1))
    for v in views:
        expected = rule.rates(v)
        assert np.array_equal(shield.floor(v), expected)
        assert np.array_equal(shield.floor_fresh(v), expected)
    # a new episode (shorter history) starts the incremental floor over from the prior
    assert np.array_equal(shield.floor(views[0]), Shield(spec, S.n_subscribers, prior).floor(views[0]))
    # the usage of the toy's subscribers rises 0.2 -> 0.8, so their floors do too
    f = shield.floor_fresh(views[-1])
    assert f[0] < f[1] <= f[2] and np.all((f >= spec.lo) & (f <= 1.0))


def test_shield_only_raises_rates_and_survives_json_with_gaps():
    prior = np.array([[0.1, np.nan, 0.3], [0.2, 0.25, np.nan]])
    s = Shield(ShieldSpec(headroom=3.0), 3, prior)
    assert np.array_equal(s.apply(np.array([0.2, 0.6, 1.0]), np.array([0.5, 0.3, 0.4])), [0.5, 0.6, 1.0])
    back = Shield.from_json(s.to_json(), 3)
    assert back.spec == s.spec
    assert np.array_equal(np.isnan(back.prior), np.isnan(prior))
    assert np.allclose(np.nan_to_num(back.prior), np.nan_to_num(prior))
    with pytest.raises(ValueError, match="headroom"):
        ShieldSpec(headroom=0.0)
    with pytest.raises(ValueError, match="kind must be one of"):
        Shield.from_json({"kind": "oracle"}, 3)


def test_shielded_training_applies_the_floor_and_the_policy_keeps_it(tmp_path):
    from agents.oversubscription.policy import OversubPolicy
    from agents.oversubscription.train import train

    ws = [toy_workload(seed=i) for i in range(3)]
    prior = replay_usage_history(S, ws[0])
    cfg = C2MarlConfig(episodes=6, seed=2, updates_per_episode=5, shield="nsigma", shield_headroom=1.5)
    policy, logs = train(S, cfg, workload_fn=lambda ep: ws[ep % 3], progress=False, out=tmp_path / "p",
                         shield_prior=prior)
    assert policy.observation_space.shape == (observation_size(S, cfg.features) + S.n_subscribers,)
    loaded = OversubPolicy.load(tmp_path / "p")
    assert loaded.shield is not None and loaded.shield.spec.headroom == 1.5
    reference = Shield(ShieldSpec(headroom=1.5), S.n_subscribers, prior)
    for v in _views(ws[1])[:20]:
        floor = reference.floor_fresh(v)
        rates = loaded.rates(v)
        assert np.array_equal(rates, policy.rates(v))
        assert np.all(rates >= floor - 1e-12)
        # each rate is the floor or one of the agent's RATES above it
        assert all(np.isclose(r, f) or (r > f and np.isclose(RATES, r).any()) for r, f in zip(rates, floor))
    # decide() reads the floor from the end of its observation vector and applies the same max
    obs = np.zeros(loaded.observation_space.shape, np.float32)
    obs[-S.n_subscribers:] = [0.9, 0.25, 1.0]
    decision, _ = loaded.decide(obs)
    agent = np.asarray(RATES)[decision.action]
    assert np.allclose(decision.info["rates"], np.maximum(agent, [0.9, 0.25, 1.0]))


def test_unknown_shield_is_refused():
    from agents.oversubscription.train import train

    with pytest.raises(ValueError, match="shield must be"):
        train(S, C2MarlConfig(episodes=1, shield="magic"), workload_fn=lambda ep: toy_workload(),
              progress=False, shield_prior=np.zeros((1, S.n_subscribers)))
