"""The headroom action (`C2MarlConfig.action="headroom"`, ours): each agent scales a production predictor's
forecast of its subscriber's usage by one of HEADROOM_SCALES x the anchor's headroom, instead of picking
a rate. The anchor's forecast, the rate it makes, training and the saved policy, the tuned anchor, the
admit route and the refusals."""
from __future__ import annotations

import json

import numpy as np
import pytest
from fastapi.testclient import TestClient

from agents.oversubscription.baselines import MaxRule, NSigmaRule, PercentileRule, replay_usage_history
from agents.oversubscription.c2marl import C2MarlConfig
from agents.oversubscription.features import observation, observation_size
from agents.oversubscription.policy import OversubPolicy
from agents.oversubscription.settings import HEADROOM_SCALES, RATES, SETTINGS, check_headrooms
from agents.oversubscription.shield import ANCHOR_LO, Shield, ShieldSpec
from agents.oversubscription.train import main as train_main
from agents.oversubscription.train import anchor_rule, anchor_spec, make_shield, parse_anchor, train

from oversub_toy import toy_workload, views_at_rate_one

S = SETTINGS["tiny"]


def _views(workload):
    return views_at_rate_one(S, workload)


def test_the_anchor_is_the_nsigma_forecast_and_a_headroom_scales_it_into_a_rate():
    prior = replay_usage_history(S, toy_workload(seed=7))
    anchor = Shield(ShieldSpec.anchor(1.5, 6), S.n_subscribers, prior)
    rule = NSigmaRule(S.n_subscribers, n=1.5, window=6, headroom=1.0, lo=ANCHOR_LO, prior=prior)
    for v in _views(toy_workload(seed=1))[:30]:
        rule.history.sync(v.usage_history)
        forecast = rule.forecast(v)
        assert np.allclose(anchor.floor_fresh(v), np.clip(forecast, ANCHOR_LO, 1.0))
    # rate = clip(h x forecast, the smallest rate, 1): scaled, not floored
    got = anchor.apply(np.array([2.0, 3.0, 4.0]), np.array([0.05, 0.2, 0.5]))
    assert np.allclose(got, [RATES[0], 0.6, 1.0])
    assert np.allclose(anchor.apply(np.array([2.5, 2.5, 2.5]), np.array([0.1, 0.16, 0.3])), [0.25, 0.4, 0.75])
    # a subscriber with no history at all is not oversubscribed (forecast 1), as with the rules
    empty = Shield(ShieldSpec.anchor(2.0, 24), S.n_subscribers, None)
    first = _views(toy_workload(seed=2))[0]
    assert np.allclose(empty.apply(np.full(S.n_subscribers, 2.5), empty.floor_fresh(first)), 1.0)
    with pytest.raises(ValueError, match="mode"):
        ShieldSpec(mode="scale")
    back = Shield.from_json(anchor.to_json(), S.n_subscribers)
    assert back.spec == anchor.spec and back.spec.mode == "headroom"


@pytest.mark.parametrize("rule, cls, params", [("Percentile", PercentileRule, {"p": 95.0, "window": 6}),
                                               ("Max", MaxRule, {"n": 1.5, "p": 95.0, "window": 6})])
def test_an_anchor_on_the_percentile_or_max_predictor_is_that_rules_forecast(rule, cls, params):
    prior = replay_usage_history(S, toy_workload(seed=7))
    spec = ShieldSpec.from_record({"rule": rule, **params, "headroom": 2.0, "source": "given"})
    anchor = Shield(spec, S.n_subscribers, prior)
    reference = cls(S.n_subscribers, **params, headroom=1.0, lo=ANCHOR_LO, prior=prior)
    nsigma = Shield(ShieldSpec.anchor(1.5, 6), S.n_subscribers, prior)
    differs = False
    for v in _views(toy_workload(seed=1))[:30]:
        reference.history.sync(v.usage_history)
        assert np.allclose(anchor.floor_fresh(v), np.clip(reference.forecast(v), ANCHOR_LO, 1.0))
        differs |= not np.allclose(anchor.floor_fresh(v), nsigma.floor_fresh(v))
    assert differs      # not N-sigma's forecast under another name
    saved = anchor.to_json()
    assert saved["kind"] == rule.lower()
    assert {k for k in ("n", "p") if k in saved} == set(params) - {"window"}   # only what the rule reads
    back = Shield.from_json(saved, S.n_subscribers)
    assert back.spec == spec and back.spec.rule == rule
    with pytest.raises(ValueError, match="kind must be one of"):
        Shield.from_json({**saved, "kind": "oracle"}, S.n_subscribers)
    with pytest.raises(ValueError, match="shield rule"):
        ShieldSpec(rule="Oracle")
    # a shield saved before the rule was a choice (kind "nsigma", no p) loads as N-sigma
    old = {k: v for k, v in nsigma.to_json().items() if k != "p"}
    assert Shield.from_json(old, S.n_subscribers).spec == nsigma.spec
    # and one saved with the parameters its rule ignores (session 65's percentile anchors) loads as before
    noisy = {**saved, "n": 5.0} if rule == "Percentile" else saved
    assert Shield.from_json(noisy, S.n_subscribers).floor_fresh(v) == pytest.approx(anchor.floor_fresh(v))


def test_headrooms_parse_and_refuse():
    assert check_headrooms([2.5, 3]) == (2.5, 3.0)
    for bad in ([3.0, 2.5], [0.0, 1.0], [], ["x"], None):
        with pytest.raises(ValueError, match="headrooms must"):
            check_headrooms(bad)
    assert parse_anchor("tuned") is None and parse_anchor("2, 24, 3") == (2.0, 24, 3.0)
    assert parse_anchor("tuned:Max") is None and parse_anchor("tuned:best") is None
    assert [anchor_rule(a) for a in ("tuned", "tuned:Percentile", "tuned:Max", "tuned:best", "2,24,3")] == [
        "NSigma", "Percentile", "Max", "best", "NSigma"]
    for bad in ("2,24", "a,b,c", "2,0,3", "2,24,0", "-1,24,3", "tuned:Oracle", "tuned:max"):
        with pytest.raises(ValueError, match="anchor"):
            parse_anchor(bad)
    with pytest.raises(ValueError, match="no shield"):
        make_shield(S, C2MarlConfig(action="headroom", shield="nsigma"), None, False, np.zeros((1, S.n_subscribers)))
    with pytest.raises(ValueError, match="action must be"):
        make_shield(S, C2MarlConfig(action="scale"), None, False)


def test_training_acts_with_headrooms_over_the_forecast_and_the_saved_policy_does_the_same(tmp_path):
    ws = [toy_workload(seed=i) for i in range(3)]
    prior = replay_usage_history(S, ws[0])
    cfg = C2MarlConfig(episodes=6, seed=2, updates_per_episode=5, action="headroom", anchor="1.5,6,2.0")
    policy, _ = train(S, cfg, workload_fn=lambda ep: ws[ep % 3], progress=False, out=tmp_path / "p",
                      shield_prior=prior)
    headrooms = [round(2.0 * k, 6) for k in HEADROOM_SCALES]
    assert policy.action_values.tolist() == headrooms and policy.rate_set is None
    assert policy.observation_space.shape == (observation_size(S, cfg.features) + S.n_subscribers,)
    meta = json.loads((tmp_path / "p" / "metadata.json").read_text())
    assert meta["rates"] is None and meta["headrooms"] == headrooms and meta["shield"]["mode"] == "headroom"
    assert meta["training"]["anchor"] == {"rule": "NSigma", "n": 1.5, "window": 6, "headroom": 2.0, "source": "given"}
    loaded = OversubPolicy.load(tmp_path / "p")
    reference = Shield(ShieldSpec.anchor(1.5, 6), S.n_subscribers, prior)
    for v in _views(ws[1])[:25]:
        forecast = reference.floor_fresh(v)
        obs = observation(v, S, cfg.features, forecast)
        a = loaded.action_indices(obs)
        rates = loaded.rates(v)
        assert np.allclose(rates, np.clip(np.array(headrooms)[a] * forecast, RATES[0], 1.0))
        assert np.allclose(rates, policy.rates(v))
        d, _ = loaded.decide(obs)
        assert np.allclose(d.info["rates"], rates)
    # a headroom list that the network does not fit, or that does not ascend, is refused on load
    meta["headrooms"] = headrooms[::-1]
    (tmp_path / "p" / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="ascend"):
        OversubPolicy.load(tmp_path / "p")


def test_a_tuned_anchor_is_the_nsigma_baseline_tuned_on_the_training_days(monkeypatch):
    import agents.oversubscription.train as train_mod
    from agents.oversubscription.data import generate_trace
    from agents.oversubscription.tuning import tune

    monkeypatch.setattr(train_mod, "ANCHOR_TUNE_EPISODES", 3)
    trace = generate_trace(S, 7)
    cfg = C2MarlConfig(alpha=0.85, action="headroom")
    a = anchor_spec(S, cfg, trace, False)
    p = tune("NSigma", S, trace, 0.85, episodes=3, seed=0).params
    assert a["rule"] == "NSigma" and a["source"].startswith("tuned")
    assert (a["n"], a["window"], a["headroom"]) == (p["n"], p["window"], p["headroom"])
    shield, values, record = make_shield(S, cfg, trace, False)
    assert shield.spec == ShieldSpec.anchor(a["n"], a["window"])
    assert values == tuple(round(a["headroom"] * k, 6) for k in HEADROOM_SCALES)
    assert values[2] == a["headroom"]      # the tuned rule itself is the middle action
    assert record == a


def test_tuned_best_anchors_on_the_safe_predictor_that_saves_most_on_the_training_days(monkeypatch):
    import agents.oversubscription.train as train_mod
    from agents.oversubscription.data import generate_trace
    from agents.oversubscription.tuning import tune

    monkeypatch.setattr(train_mod, "ANCHOR_TUNE_EPISODES", 3)
    trace = generate_trace(S, 7)
    tuned = {r: tune(r, S, trace, 0.85, episodes=3, seed=0) for r in ("NSigma", "Percentile", "Max")}
    best = anchor_spec(S, C2MarlConfig(alpha=0.85, action="headroom", anchor="tuned:best"), trace, False)
    safe = {r: t.metrics["s_cores"] for r, t in tuned.items() if t.safe}
    assert safe, "the toy trace should let one predictor be safe"
    assert best["rule"] == max(safe, key=safe.get)
    assert {k: best[k] for k in tuned[best["rule"]].params} == tuned[best["rule"]].params
    assert set(best["candidates"]) == set(tuned)
    assert all(best["candidates"][r]["safe"] == t.safe for r, t in tuned.items())
    # a named rule is that rule tuned, and its shield forecasts with it
    cfg = C2MarlConfig(alpha=0.85, action="headroom", anchor="tuned:Max")
    shield, values, record = make_shield(S, cfg, trace, False)
    assert record["rule"] == "Max" and "candidates" not in record
    assert {k: record[k] for k in tuned["Max"].params} == tuned["Max"].params
    assert shield.spec.rule == "Max" and (shield.spec.n, shield.spec.p) == (record["n"], record["p"])
    assert values[2] == record["headroom"]
    with pytest.raises(ValueError, match="anchor 'tuned:Max' tunes another rule"):
        train(S, cfg, progress=False, trace=trace, tuned_anchor={**record, "rule": "NSigma"})


def test_an_anchor_margin_tunes_the_anchor_to_a_stricter_budget_and_says_so(tmp_path, capsys, monkeypatch):
    import agents.oversubscription.train as train_mod
    from agents.oversubscription.c2marl import anchor_level
    from agents.oversubscription.data import generate_trace
    from agents.oversubscription.experiment import run
    from agents.oversubscription.shield import anchor_words
    from agents.oversubscription.tuning import tune

    monkeypatch.setattr(train_mod, "ANCHOR_TUNE_EPISODES", 3)
    trace = generate_trace(S, 7)
    # a margin of 2 halves the budget: 0.75 is tuned at 0.875, and 1 leaves the level (and the record) alone
    assert anchor_level(C2MarlConfig(alpha=0.75, anchor_margin=2.0)) == 0.875
    assert anchor_level(C2MarlConfig(alpha=0.95)) == 0.95
    # on this toy trace a 40 % budget lets N-sigma break a PM in one tuning episode of three, a 20 % one not
    plain = anchor_spec(S, C2MarlConfig(alpha=0.6, action="headroom"), trace, False)
    strict = anchor_spec(S, C2MarlConfig(alpha=0.6, action="headroom", anchor_margin=2.0), trace, False)
    at_6, at_8 = (tune("NSigma", S, trace, a, episodes=3, seed=0) for a in (0.6, 0.8))
    assert "tuned_at" not in plain and strict["tuned_at"] == 0.8
    keys = ("n", "window", "headroom")
    assert tuple(plain[k] for k in keys) == tuple(at_6.params[k] for k in keys)
    assert tuple(strict[k] for k in keys) == tuple(at_8.params[k] for k in keys)
    assert at_8.params != at_6.params and at_8.metrics["pm_hot_r"] < at_6.metrics["pm_hot_r"]
    assert at_8.metrics["s_cores"] < at_6.metrics["s_cores"]
    assert anchor_words(strict).endswith("(tuned at 0.8)")
    # the CLI records it in the saved policy, and the experiment passes it on
    assert train_main(["--setting", "tiny", "--trace-seed", "7", "--alpha", "0.6", "--action", "headroom",
                       "--anchor-margin", "2", "--episodes", "1", "--quiet", "--out", str(tmp_path / "p")]) == 0
    assert OversubPolicy.load(tmp_path / "p").training["anchor"] == strict
    assert "(tuned at 0.8)" in capsys.readouterr().out
    run(tmp_path / "e", quick=True, seeds=[1], episodes=1, test_episodes=1, workers=1, progress=False,
        alphas=[0.95], held_apart_only=True, action="headroom", anchor_margin=2.0)
    record = OversubPolicy.load(tmp_path / "e" / "policies" / "tiny-cold-a0.95-s1").training["anchor"]
    assert record["tuned_at"] == 0.975   # tuned anew: the baselines' 0.95 tuning is not that level's
    # refused where it cannot apply: a given anchor, the rate action, below 1
    with pytest.raises(ValueError, match="a given anchor"):
        anchor_spec(S, C2MarlConfig(alpha=0.75, action="headroom", anchor="2,24,3", anchor_margin=2.0), trace, False)
    assert train_main(["--setting", "tiny", "--anchor-margin", "2", "--episodes", "1"]) == 2
    assert train_main(["--setting", "tiny", "--action", "headroom", "--anchor-margin", "0.5", "--episodes", "1"]) == 2
    with pytest.raises(ValueError, match="anchor_margin"):
        run(tmp_path / "x", quick=True, anchor_margin=2.0)
    with pytest.raises(ValueError, match="anchor_margin must be >= 1"):
        run(tmp_path / "x", quick=True, action="headroom", anchor_margin=0.5)


def test_an_anchor_tuned_at_a_looser_level_keeps_the_agents_level_and_says_so(tmp_path, capsys, monkeypatch):
    import agents.oversubscription.train as train_mod
    from agents.oversubscription.c2marl import anchor_level
    from agents.oversubscription.data import generate_trace
    from agents.oversubscription.experiment import run
    from agents.oversubscription.tuning import tune

    monkeypatch.setattr(train_mod, "ANCHOR_TUNE_EPISODES", 3)
    trace = generate_trace(S, 7)
    assert anchor_level(C2MarlConfig(alpha=0.8, anchor_tuned_at=0.6)) == 0.6
    # on this toy trace the rule tuned at 0.6 differs from the one tuned at 0.8 (the margin test above)
    loose = anchor_spec(S, C2MarlConfig(alpha=0.8, action="headroom", anchor_tuned_at=0.6), trace, False)
    at_6, at_8 = (tune("NSigma", S, trace, a, episodes=3, seed=0) for a in (0.6, 0.8))
    keys = ("n", "window", "headroom")
    assert at_6.params != at_8.params
    assert tuple(loose[k] for k in keys) == tuple(at_6.params[k] for k in keys) and loose["tuned_at"] == 0.6
    same = anchor_spec(S, C2MarlConfig(alpha=0.6, action="headroom", anchor_tuned_at=0.6), trace, False)
    assert "tuned_at" not in same      # at alpha itself the record is the default's
    # the CLI keeps the agents' level and records the anchor's; the experiment passes it to every alpha
    assert train_main(["--setting", "tiny", "--trace-seed", "7", "--alpha", "0.8", "--action", "headroom",
                       "--anchor-tuned-at", "0.6", "--episodes", "1", "--quiet", "--out", str(tmp_path / "p")]) == 0
    saved = OversubPolicy.load(tmp_path / "p")
    assert saved.training["anchor"] == loose and saved.training["config"]["alpha"] == 0.8
    assert "(tuned at 0.6)" in capsys.readouterr().out
    run(tmp_path / "e", quick=True, seeds=[1], episodes=1, test_episodes=1, workers=1, progress=False,
        alphas=[0.95], held_apart_only=True, action="headroom", anchor_tuned_at=0.85)
    assert OversubPolicy.load(tmp_path / "e" / "policies" / "tiny-cold-a0.95-s1").training["anchor"]["tuned_at"] == 0.85
    # refused: with a margin, with a given anchor, with the rate action, outside (0, 1)
    with pytest.raises(ValueError, match="give one"):
        anchor_level(C2MarlConfig(alpha=0.95, anchor_margin=2.0, anchor_tuned_at=0.85))
    with pytest.raises(ValueError, match="a given anchor"):
        anchor_spec(S, C2MarlConfig(alpha=0.95, action="headroom", anchor="2,24,3", anchor_tuned_at=0.85), trace, False)
    for argv in (["--action", "headroom", "--anchor-tuned-at", "0.85", "--anchor-margin", "2"],
                 ["--anchor-tuned-at", "0.85"], ["--action", "headroom", "--anchor-tuned-at", "1"]):
        assert train_main(["--setting", "tiny", "--episodes", "1", *argv]) == 2
    with pytest.raises(ValueError, match="anchor_tuned_at"):
        run(tmp_path / "x", quick=True, anchor_tuned_at=0.85)
    with pytest.raises(ValueError, match="give one"):
        run(tmp_path / "x", quick=True, action="headroom", anchor_margin=2.0, anchor_tuned_at=0.85)


def test_the_experiment_tunes_each_levels_anchor_once_for_all_its_seeds(tmp_path, monkeypatch):
    import agents.oversubscription.train as train_mod
    import agents.oversubscription.tuning as tuning
    from agents.oversubscription.data import generate_trace
    from agents.oversubscription.experiment import run

    monkeypatch.setattr(train_mod, "ANCHOR_TUNE_EPISODES", 3)
    calls = []
    real = tuning.tune

    def counted(rule, *a, **k):
        calls.append((rule, a[2]))
        return real(rule, *a, **k)

    monkeypatch.setattr(tuning, "tune", counted)
    run(tmp_path, quick=True, seeds=[1, 2], episodes=2, test_episodes=1, workers=1, progress=False,
        alphas=[0.85, 0.95], held_apart_only=True, action="headroom")
    # each level's anchor is tuned once for the two seeds; at 0.95 it is tune_all's N-sigma baseline,
    # tuned on the same episodes, so the rule is not tuned a second time
    assert [c for c in calls if c[1] == 0.85] == [("NSigma", 0.85)]
    assert [c for c in calls if c == ("NSigma", 0.95)] == [("NSigma", 0.95)]
    for alpha in (0.85, 0.95):
        records = [OversubPolicy.load(tmp_path / "policies" / f"tiny-cold-a{alpha}-s{s}").training["anchor"]
                   for s in (1, 2)]
        p = real("NSigma", S, generate_trace(S, 0), alpha, episodes=3, seed=0).params
        assert records[0] == records[1] and records[0]["source"].startswith("tuned")
        assert (records[0]["n"], records[0]["window"], records[0]["headroom"]) == (p["n"], p["window"], p["headroom"])
    with pytest.raises(ValueError, match="tuned_anchor is for"):
        train(S, C2MarlConfig(episodes=1, action="headroom", anchor="2,24,3"), progress=False,
              tuned_anchor={"rule": "NSigma", "n": 2.0, "window": 24, "headroom": 3.0, "source": "tuned"})


def test_the_admit_route_hosts_a_headroom_policy(tmp_path):
    from agents.oversubscription.network import C2MarlNet
    from agents.oversubscription.service import create_app

    prior = replay_usage_history(S, toy_workload(seed=7))
    anchor = Shield(ShieldSpec.anchor(2.0, 24), S.n_subscribers, prior)
    net = C2MarlNet(S.n_subscribers, observation_size(S, "usage", True), len(HEADROOM_SCALES))
    policy = OversubPolicy(net, S, version="h-1", features="usage", shield=anchor,
                           rates=[round(3.0 * k, 6) for k in HEADROOM_SCALES])
    c = TestClient(create_app("c2marl", policy))
    body = {"subscriber": 1, "cores": 8.0, "mem_gb": 32.0, "net_gbps": 2.0, "hour": 13,
            "allocated": [[4.0, 16.0, 1.0], [0.0, 0.0, 0.0], [10.0, 40.0, 2.5]],
            "requested_live": [8.0, 0.0, 10.0], "usage_history": [[0.1, 0.2, None], [0.12, 0.25, 0.3]]}
    d = c.post("/v1/agents/c2marl/admit", json=body).json()
    assert d["rates_offered"] == [] and RATES[0] <= d["rate"] <= 1.0
    assert d["reserved_cores"] == pytest.approx(8.0 * d["rate"])


def test_the_cli_names_the_rule_its_anchor_forecasts_with(tmp_path, capsys, monkeypatch):
    import agents.oversubscription.train as train_mod
    from agents.oversubscription.shield import anchor_words

    monkeypatch.setattr(train_mod, "ANCHOR_TUNE_EPISODES", 2)
    # a percentile anchor reads no n: the summary line once failed on it after the policy was saved
    assert train_main(["--setting", "tiny", "--action", "headroom", "--anchor", "tuned:Percentile", "--episodes", "1",
                       "--quiet", "--out", str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    record = OversubPolicy.load(tmp_path / "p").training["anchor"]
    assert record["rule"] == "Percentile" and "n" not in record
    assert f"headroom action over Percentile: p {record['p']:g}, window {record['window']}, headroom" in out
    assert anchor_words({"rule": "Max", "n": 3.0, "p": 99.0, "window": 24, "headroom": 2.0,
                         "source": "tuned"}) == "Max: n 3, p 99, window 24, headroom 2 (tuned)"
    assert anchor_words({"n": 2.0, "window": 24, "headroom": 3.0}) == "NSigma: n 2, window 24, headroom 3 (given)"


def test_the_cli_and_the_experiment_refuse_a_bad_action_or_anchor(tmp_path, capsys):
    from agents.oversubscription.experiment import run

    assert train_main(["--setting", "tiny", "--action", "headroom", "--shield", "nsigma", "--episodes", "1"]) == 2
    assert train_main(["--setting", "tiny", "--action", "headroom", "--anchor", "2,24", "--episodes", "1"]) == 2
    assert "--anchor" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train_main(["--setting", "tiny", "--action", "scale", "--episodes", "1"])
    with pytest.raises(ValueError, match="action must be"):
        run(tmp_path / "x", quick=True, action="scale")
    with pytest.raises(ValueError, match="anchor is the headroom action's"):
        run(tmp_path / "x", quick=True, anchor="2,24,3")
    with pytest.raises(ValueError, match="--policies evaluates"):
        run(tmp_path / "x", quick=True, action="headroom", policies=tmp_path)


def test_the_frontier_benchmark_runs_a_headroom_policy_beside_the_rule(tmp_path, capsys):
    """benchmarks/oversub_shield_frontier.py: N-sigma at each headroom and the saved policy on the same
    held-apart episodes; raising the rule's headroom never saves more."""
    from benchmark_script import load_benchmark

    cfg = C2MarlConfig(episodes=3, seed=1, updates_per_episode=2, action="headroom", anchor="2,24,3.0")
    train(S, cfg, trace_seed=7, progress=False, out=tmp_path / "p")
    mod = load_benchmark("oversub_shield_frontier")
    assert mod.main(["--setting", "tiny", "--trace-seed", "7", "--episodes", "2", "--headrooms", "2.0", "3.0",
                     "--policies", str(tmp_path / "p"), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 3 and "(headrooms 2.5-4)" in rows[2]["rule"]
    assert rows[0]["s_cores"] >= rows[1]["s_cores"]


def test_the_shipped_policy_is_a_headroom_policy_anchored_on_the_hosted_nsigma_rule():
    """`samm serve --agent c2marl` hosts a headroom policy (docs/oversubscription.md, session 63) whose
    anchor is the N-sigma rule `--agent nsigma` hosts, so its middle action reserves what the rule does."""
    from agents.oversubscription.policy import HOSTED_RULES, RulePolicy, shipped_policy

    policy = shipped_policy()
    assert policy.headroom and policy.rate_set is None
    rule, params = HOSTED_RULES["nsigma"]
    anchor = policy.training["anchor"]
    assert (anchor["rule"], anchor["n"], anchor["window"], anchor["headroom"]) == (
        rule, params["n"], params["window"], params["headroom"])
    assert policy.action_values[2] == pytest.approx(params["headroom"])
    # the forecast times the tuned headroom is the hosted rule's rate, on the same history
    setting = policy.setting
    views = views_at_rate_one(setting, toy_workload(n_subscribers=setting.n_subscribers, steps=30, seed=3))
    rule_policy = RulePolicy("nsigma")
    oversubscribed = 0
    for view in views[::7]:
        middle = policy.shield.apply(np.full(setting.n_subscribers, params["headroom"]), policy.shield.floor_fresh(view))
        assert np.allclose(middle, rule_policy.rates(view))
        oversubscribed += int((middle < 0.99).sum())
    assert oversubscribed > 5     # the comparison is not all rates of 1


def test_the_admit_latency_benchmark_serves_the_policy_and_the_rule_over_loopback(capsys):
    """benchmarks/oversub_admit_latency.py: a real `samm serve` answers every admit of both agents."""
    from benchmark_script import load_benchmark

    bench = load_benchmark("oversub_admit_latency")
    assert bench.main(["--rate", "40", "--seconds", "0.5", "--history", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [r["agent"] for r in out["rows"]] == ["c2marl", "nsigma"]
    for r in out["rows"]:
        assert r["requests"] == 20 and r["errors"] == 0
        assert 0 < r["decision_p50_ms"] <= r["round_trip_p99_ms"]
    assert out["c2marl_over_nsigma"]["decision_p99_ms"] > 0
