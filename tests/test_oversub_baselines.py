"""Baseline rules and their tuning on tiny hand-made cases whose answers can be worked out by hand."""
from __future__ import annotations

import numpy as np
import pytest

from agents.oversubscription.baselines import (
    RULES, BorgDefaultRule, BrownDESRule, GridRule, MaxRule, MaxUsageModel, NSigmaRule, ObservedHistory,
    PercentileRule, RuleContext, SLParams, SupervisedMaxRule, forecast_to_rate, make_rule, rates_from_prior,
    replay_usage_history, window_mean_std, window_percentile)
from agents.oversubscription.metrics import summarise
from agents.oversubscription.settings import SETTINGS
from agents.oversubscription.sim import OversubSim, View, run_episode
from agents.oversubscription.tuning import PARAM_GRIDS, evaluate, training_context, tune, tuning_sims
from agents.oversubscription.workload import Workload

TINY = SETTINGS["tiny"]   # 3 subscribers, 12 PMs of 64 cores, 48 steps, hot above 0.6 * 64 = 38.4 cores


def view_with(history) -> View:
    h = np.asarray(history, dtype=np.float64)
    n = h.shape[1]
    return View(t=len(h), hour=len(h) % 24, request=np.zeros((n, 3)), has_request=np.zeros(n, bool),
                allocated=np.zeros((n, 3)), requested_live=np.zeros(n), usage_history=h,
                vm_rows=np.empty(0, dtype=np.int64))


def packed_workload(usage: float = 0.5, n_vms: int = 20, noise_seed: int | None = None) -> Workload:
    """n_vms VMs of 8 cores from subscriber 0, all arriving at step 0 and living the whole episode.
    Best fit stacks them on one PM: at rate r it takes floor(8 / r) of them, which use 4 cores each
    at usage 0.5, so a PM is hot (> 38.4 cores, 10 VMs or more) exactly when r <= 0.8."""
    steps = TINY.episode_steps
    u = np.full((n_vms, steps), usage, dtype=np.float32)
    if noise_seed is not None:
        u += np.random.default_rng(noise_seed).normal(0, 0.01, u.shape).clip(-0.03, 0.03).astype(np.float32)
    return Workload(n_subscribers=TINY.n_subscribers, steps=steps, sub=np.zeros(n_vms), arrive=np.zeros(n_vms),
                    depart=np.full(n_vms, steps + 10), cores=np.full(n_vms, 8.0), mem=np.full(n_vms, 8.0),
                    net=np.full(n_vms, 1.0), usage=u, start_hour=0, name="packed")


class PackedTrace:
    """The data layer's Trace interface over `packed_workload` (redrawn: small seeded noise)."""

    n_test_blocks = 2

    def __init__(self, noisy: bool = False):
        self.noisy = noisy

    def train_workload(self, warm=False):
        return packed_workload()

    def train_redrawn(self, seed, warm=False):
        return packed_workload(noise_seed=seed if self.noisy else None)

    def test_workload(self, index, seed, warm=False):
        return packed_workload(noise_seed=10_000 + 7 * index + seed if self.noisy else None)


# ----------------------------------------------------------------------------- static rules
@pytest.mark.parametrize("rho", [0.2, 0.45, 0.6, 1.0])
def test_grid_saves_exactly_one_minus_rho(rho):
    sim = OversubSim(TINY, packed_workload(n_vms=8))
    rule = GridRule(rho, TINY.n_subscribers)
    rec = run_episode(sim, rule.rates)
    assert rec.placed == 8
    assert rec.s_cores == pytest.approx(1 - rho)


def test_grid_rejects_bad_rate_and_borg_default_is_a_fraction():
    with pytest.raises(ValueError):
        GridRule(0.0, 3)
    rule = BorgDefaultRule(0.9, 3)
    assert np.allclose(rule.rates(view_with(np.zeros((0, 3)))), 0.9)
    assert RULES["BorgDefault"](RuleContext(TINY)).rates(view_with(np.zeros((0, 3))))[0] == pytest.approx(0.9)


# ----------------------------------------------------------------------------- history rules
def test_brown_des_forecast_by_hand():
    # a = 0.5 on 0.2, 0.4, 0.6: S1 = 0.2, 0.3, 0.45; S2 = 0.2, 0.25, 0.35;
    # level = 2 * 0.45 - 0.35 = 0.55, trend = 0.5 / 0.5 * (0.45 - 0.35) = 0.1 -> forecast 0.65
    rule = BrownDESRule(1, smoothing=0.5, headroom=1.0, lo=0.01)
    hist = [[0.2], [0.4], [0.6]]
    assert rule.rates(view_with(hist))[0] == pytest.approx(0.65)
    # step by step gives the same state as all at once
    rule2 = BrownDESRule(1, smoothing=0.5, headroom=1.0, lo=0.01)
    for t in range(1, 4):
        r = rule2.rates(view_with(hist[:t]))
    assert r[0] == pytest.approx(0.65)
    # a = 0.25: S1 = 0.2, 0.25, 0.3375; S2 = 0.2, 0.2125, 0.24375; forecast = 0.43125 + (1/3) * 0.09375
    assert BrownDESRule(1, 0.25, headroom=1.0, lo=0.01).rates(view_with(hist))[0] == pytest.approx(0.4625)
    # headroom scales the forecast and the result is clipped to (lo, 1]
    assert BrownDESRule(1, 0.5, headroom=2.0, lo=0.01).rates(view_with(hist))[0] == 1.0
    assert BrownDESRule(1, 0.5, headroom=0.1, lo=0.2).rates(view_with(hist))[0] == pytest.approx(0.2)


def test_brown_des_skips_steps_without_observation_and_uses_prior():
    nan = np.nan
    rule = BrownDESRule(1, smoothing=0.5, headroom=1.0, lo=0.01)
    assert rule.rates(view_with([[0.2], [nan], [0.4], [nan], [0.6]]))[0] == pytest.approx(0.65)
    with_prior = BrownDESRule(1, smoothing=0.5, headroom=1.0, lo=0.01, prior=np.array([[0.2], [0.4]]))
    assert with_prior.rates(view_with(np.zeros((0, 1))))[0] == pytest.approx(2 * 0.3 - 0.25 + 0.05)
    assert with_prior.rates(view_with([[0.6]]))[0] == pytest.approx(0.65)
    with_prior.reset()   # the episode is forgotten, the prior kept
    assert with_prior.rates(view_with(np.zeros((0, 1))))[0] == pytest.approx(0.4)


def test_nsigma_percentile_and_max_on_known_history():
    hist = np.array([[0.9, 0.1], [0.1, 0.1], [0.5, 0.3], [0.3, np.nan], [0.9, np.nan]])
    # subscriber 0, window 3 -> [0.5, 0.3, 0.9]; subscriber 1 (NaN skipped), window 3 -> [0.1, 0.1, 0.3]
    ns = NSigmaRule(2, n=2, window=3, headroom=1.0, lo=0.01).rates(view_with(hist))
    for i, x in enumerate(([0.5, 0.3, 0.9], [0.1, 0.1, 0.3])):
        assert ns[i] == pytest.approx(min(1.0, np.mean(x) + 2 * np.std(x)))
    pc = PercentileRule(2, p=50, window=3, headroom=1.0, lo=0.01).rates(view_with(hist))
    assert pc == pytest.approx([0.5, 0.1])
    mx = MaxRule(2, n=0.0, p=100, window=3, headroom=1.0, lo=0.01).rates(view_with(hist))
    assert mx == pytest.approx([0.9, 0.3])          # p100 beats the plain mean
    mx2 = MaxRule(2, n=1.0, p=0, window=3, headroom=1.0, lo=0.01).rates(view_with(hist))
    assert mx2[1] == pytest.approx(np.mean([0.1, 0.1, 0.3]) + np.std([0.1, 0.1, 0.3]))  # sigma beats p0


def test_vectorised_window_stats_match_numpy():
    rng = np.random.default_rng(3)
    hist = rng.uniform(0, 1, (60, 4))
    hist[rng.uniform(size=hist.shape) < 0.3] = np.nan
    hist[:, 3] = np.nan
    hist[-1, 3] = 0.4                                   # one observation only
    h = ObservedHistory(4)
    h.sync(hist)
    for window in (1, 5, 24, 100):
        mean, std = window_mean_std(h, window)
        for p in (0, 37.5, 95, 100):
            pc = window_percentile(h, window, p)
            for i in range(4):
                x = hist[:, i][np.isfinite(hist[:, i])][-window:]
                assert pc[i] == pytest.approx(np.percentile(x, p))
                assert mean[i] == pytest.approx(x.mean()) and std[i] == pytest.approx(x.std())
    empty = ObservedHistory(2)
    assert np.isnan(window_percentile(empty, 5, 50)).all() and np.isnan(window_mean_std(empty, 5)[0]).all()


def test_no_history_means_no_oversubscription():
    hist = np.array([[0.2, np.nan, np.nan], [0.2, np.nan, 0.1]])
    ctx = RuleContext(TINY, prior=None, training_histories=[(np.tile([[0.3, 0.3, 0.3]], (40, 1)), 0)])
    for name, params in [("MA", {"headroom": 1.0}), ("NSigma", {"headroom": 1.0}),
                         ("Percentile", {"headroom": 1.0}), ("Max", {"headroom": 1.0}),
                         ("SL", {"headroom": 1.0, "horizon_hours": 8})]:
        r = make_rule(name, ctx, **params).rates(view_with(hist))
        assert r[1] == 1.0, name
        assert r[0] < 1.0 and r[2] < 1.0, name
        assert make_rule(name, ctx, **params).rates(view_with(np.zeros((0, 3)))) == pytest.approx(1.0)


def test_forecast_to_rate_clips_and_maps_nan_to_one():
    assert forecast_to_rate(np.array([0.1, 0.5, 0.9, np.nan]), 1.5, 0.2) == pytest.approx([0.2, 0.75, 1.0, 1.0])
    assert forecast_to_rate(np.array([0.5, np.nan]), 0.5, 0.2) == pytest.approx([0.25, 1.0])


def test_observed_history_window_counts_observations_and_grows():
    h = ObservedHistory(2, prior=np.array([[0.1, np.nan]]))
    h.sync(np.array([[0.2, 0.5]] * 200))
    assert h.count().tolist() == [201, 200]
    assert h.recent(0, 3).tolist() == pytest.approx([0.2, 0.2, 0.2])
    h.reset()
    assert h.count().tolist() == [1, 0] and h.recent(0, 5).tolist() == pytest.approx([0.1])


def test_a_block_of_history_lands_as_row_by_row_appends_would():
    rng = np.random.default_rng(5)
    prior = rng.uniform(0, 1, (30, 3))
    rows = rng.uniform(0, 1, (150, 3))
    rows[rng.uniform(size=rows.shape) < 0.3] = np.nan
    rows[:, 2] = np.nan                                     # one subscriber never observed
    stepwise, block = ObservedHistory(3, prior), ObservedHistory(3, prior)
    for t in range(1, len(rows) + 1):                       # the simulator: one new row per step
        stepwise.sync(rows[:t])
    got = block.sync(rows)                                  # the service: a request's whole history
    assert len(got) == len(rows) and np.array_equal(got[7], rows[7], equal_nan=True)
    assert stepwise.count().tolist() == block.count().tolist()
    for i in range(3):
        expected = np.concatenate([prior[:, i], rows[:, i]])
        expected = expected[np.isfinite(expected)]
        assert np.array_equal(block.recent(i, 1000), expected) and np.array_equal(stepwise.recent(i, 1000), expected)


def test_rates_from_prior_leaves_the_hosted_rule_as_it_was():
    ctx = RuleContext(TINY, prior=np.full((4, 3), 0.3))
    hist = np.array([[0.9, 0.1, np.nan]] * 6)
    for name, params in [("MA", {"headroom": 1.0}), ("NSigma", {"headroom": 1.0}),
                         ("Percentile", {"headroom": 1.0}), ("Max", {"headroom": 1.0})]:
        template = make_rule(name, ctx, **params)
        before = template.rates(view_with(np.zeros((0, 3))))
        first = rates_from_prior(template, view_with(hist))
        assert rates_from_prior(template, view_with(hist)) == pytest.approx(first), name
        assert not np.allclose(first, before), name         # the history moved the forecast
        assert template.history.count().tolist() == [4, 4, 4], name
        assert template.rates(view_with(np.zeros((0, 3)))) == pytest.approx(before), name


def test_rule_restarts_when_a_new_episode_begins_without_reset():
    rule = NSigmaRule(1, n=0, window=100, headroom=1.0, lo=0.01)
    rule.rates(view_with([[0.9]] * 5))
    assert rule.rates(view_with([[0.3]]))[0] == pytest.approx(0.3)


# ----------------------------------------------------------------------------- SL
def _sl_histories():
    t = np.arange(120)
    hour = t % 24
    h = np.full((120, 3), np.nan)
    h[:, 0] = 0.3
    h[:, 1] = np.where((hour >= 12) & (hour <= 14), 0.8, 0.2)   # daily peak 0.8
    return [(h, 0)]


def test_sl_learns_each_subscribers_daily_max():
    model = MaxUsageModel(3, SLParams(horizon_hours=24)).fit(_sl_histories())
    assert model.n_samples == 2 * (120 - 24)           # subscriber 2 has no data, the rest every step
    rule = SupervisedMaxRule(model, headroom=1.0, lo=0.01)
    hist = _sl_histories()[0][0][:30]                   # hour 6: subscriber 1 sits at 0.2 now
    r = rule.rates(view_with(hist))
    assert r[0] == pytest.approx(0.3, abs=0.02)
    assert r[1] == pytest.approx(0.8, abs=0.02)       # the max over the next day, not the current rate
    assert r[2] == 1.0


def test_sl_uses_the_hour_of_day():
    # with a 2-hour horizon the target is 0.8 only when the peak (hours 12-14) is about to come
    model = MaxUsageModel(3, SLParams(horizon_hours=2)).fit(_sl_histories())
    rule = SupervisedMaxRule(model, headroom=1.0, lo=0.01)
    (h, _), = _sl_histories()
    assert rule.rates(view_with(h[:35]))[1] == pytest.approx(0.8, abs=0.05)   # hour 11
    rule.reset()
    assert rule.rates(view_with(h[:29]))[1] == pytest.approx(0.2, abs=0.05)   # hour 5


def test_sl_horizon_shapes_the_target():
    (h, start), = _sl_histories()
    x, y = MaxUsageModel(3, SLParams(horizon_hours=2)).training_set([(h, start)])
    assert set(np.round(y, 6)) == {0.2, 0.3, 0.8}      # a 2-hour max can miss the peak
    with pytest.raises(ValueError):
        MaxUsageModel(3, SLParams(horizon_hours=500)).fit([(h, start)])


# ----------------------------------------------------------------------------- prior and tuning
def test_replay_history_is_the_usage_rate_at_rate_one():
    hist = replay_usage_history(TINY, packed_workload())
    assert hist.shape == (TINY.episode_steps, 3)
    assert np.allclose(hist[:, 0], 0.5) and np.isnan(hist[:, 1:]).all()


def test_grid_best_picks_the_most_saving_safe_rate():
    # hot exactly when rho <= 0.8 (see packed_workload), so 0.85 is the answer
    res = tune("Grid-best", TINY, PackedTrace(), alpha=0.95, episodes=3, seed=0)
    assert res.safe and res.params == {"rho": pytest.approx(0.85)}
    assert res.metrics["s_cores"] == pytest.approx(0.15)
    tried = [r["params"]["rho"] for r in res.table]
    assert tried == pytest.approx(np.arange(0.2, 0.851, 0.05))   # stops at the first safe rate
    assert all(r["stopped_early"] and r["episodes"] == 1 for r in res.table[:-1])
    assert res.table[-1]["episodes"] == 3 and res.table[-1]["pm_hot_r"] == 0.0


def test_exhaustive_tuning_tries_everything_and_agrees():
    res = tune("Grid-best", TINY, PackedTrace(), alpha=0.95, episodes=2, exhaustive=True)
    assert len(res.table) == len(PARAM_GRIDS["Grid-best"]["rho"])
    assert all(r["episodes"] == 2 for r in res.table)
    assert res.params["rho"] == pytest.approx(0.85)
    assert [r["safe"] for r in res.table] == [rho > 0.8 + 1e-9 for rho in PARAM_GRIDS["Grid-best"]["rho"]]


def test_headroom_tuning_uses_the_prior_and_finds_the_break_even():
    # usage is exactly 0.5, known from the prior at step 0: headroom 1.6 reserves 0.8 (hot), 1.8 -> 0.9
    res = tune("MA", TINY, PackedTrace(), alpha=0.95, episodes=2, grid={"smoothing": (0.5,),
                                                                        "headroom": (1.0, 1.6, 1.8, 2.4)})
    assert res.safe and res.params == {"smoothing": 0.5, "headroom": 1.8}
    assert res.metrics["s_cores"] == pytest.approx(0.1)
    assert [r["params"]["headroom"] for r in res.table] == [1.0, 1.6, 1.8]


def test_no_safe_parameters_returns_least_unsafe_flagged():
    res = tune("Grid-best", TINY, PackedTrace(), alpha=0.95, episodes=2, grid={"rho": (0.2, 0.5)})
    assert not res.safe and len(res.table) == 2


def test_tuning_and_evaluation_are_deterministic():
    trace = PackedTrace(noisy=True)
    ctx = training_context(TINY, trace, sl_histories=0)
    sims = tuning_sims(TINY, trace, 3, seed=5)
    grid = {"n": (2.0,), "window": (24,), "headroom": (1.6, 2.0)}
    a = tune("NSigma", TINY, trace, 0.95, ctx=ctx, sims=sims, grid=grid)
    b = tune("NSigma", TINY, trace, 0.95, episodes=3, seed=5, grid=grid)
    strip = lambda res: [{k: v for k, v in r.items() if k != "seconds"} for r in res.table]
    assert strip(a) == strip(b) and a.params == b.params
    rule = make_rule("NSigma", ctx, **a.params)
    e1, e2 = evaluate(rule, TINY, trace, 4, seed=1), evaluate(rule, TINY, trace, 4, seed=1)
    assert e1 == e2 and e1["episodes"] == 4 and e1["rule"].startswith("NSigma")


def test_every_registered_rule_runs_an_episode():
    trace = PackedTrace(noisy=True)
    ctx = training_context(TINY, trace, sl_histories=1)
    sim = OversubSim(TINY, trace.test_workload(0, 0))
    for name, grid in PARAM_GRIDS.items():
        params = {k: v[len(v) // 2] for k, v in grid.items()}
        if name == "SL":
            params["horizon_hours"] = 12   # the tiny episode (48 steps) fits a shorter horizon comfortably
        rule = make_rule(name, ctx, **params)
        rule.reset()
        rec = run_episode(sim, rule.rates)
        s = summarise([rec], TINY.delta_steps)
        assert 0.0 <= s["s_cores"] < 0.81 and rec.placed == 20, name


def test_hindsight_reference_rounds_up_to_the_agents_rates_and_reserves_from_future_usage():
    """benchmarks/oversub_hindsight.py: the reference the 1.3x target is read against."""
    from agents.oversubscription.data import generate_trace
    from agents.oversubscription.sim import OversubSim
    from benchmark_script import load_benchmark

    mod = load_benchmark("oversub_hindsight")
    from agents.oversubscription.baselines import round_up

    Hindsight = mod.Hindsight

    assert list(round_up(np.array([0.05, 0.2, 0.21, 0.55, 0.61, 1.0]))) == [0.2, 0.2, 0.3, 0.6, 1.0, 1.0]
    assert list(round_up(np.array([0.61, 0.7, 0.95, 1.0]), (0.2, 0.6, 0.7, 0.8, 0.9, 1.0))) == [0.7, 0.7, 1.0, 1.0]
    trace = generate_trace("tiny", 0)
    w = trace.test_workload(0, 1)
    sim = OversubSim(SETTINGS["tiny"], w)
    view = sim.reset()
    while not view.has_request.any():
        view, _ = sim.step(np.ones(3))
    for agg in ("max", "mean"):
        rule = Hindsight(3, h=1.5, stat="max", agg=agg).bind(w)
        rates = rule.rates(view)
        peak = w.usage.max(axis=1)
        for i in np.flatnonzero(view.has_request):
            mine = view.vm_rows[w.sub[view.vm_rows] == i]
            want = peak[mine].max() if agg == "max" else np.average(peak[mine], weights=w.cores[mine])
            assert rates[i] == pytest.approx(np.clip(1.5 * want, 0.2, 1.0))
        assert np.all(rates[~view.has_request] == pytest.approx(0.2))
        discrete = Hindsight(3, h=1.5, stat="max", agg=agg, discrete=True).bind(w).rates(view)
        assert set(np.round(discrete, 6)) <= {0.2, 0.3, 0.4, 0.5, 0.6, 1.0} and np.all(discrete >= rates - 1e-12)


def test_baselines_at_another_level_match_the_experiments_rows_when_tuned_at_its_level(tmp_path):
    """benchmarks/oversub_baselines_at.py tunes and tests with the experiment's own code: at the
    experiment's 0.95 it gives the experiment's baseline rows, number for number."""
    import json

    from agents.oversubscription.experiment import HELD_APART, Budget, Case, run_case
    from benchmark_script import load_benchmark

    mod = load_benchmark("oversub_baselines_at")

    out = tmp_path / "rows.json"
    assert mod.main(["--case", "tiny-cold", "--tune-alpha", "0.95", "--test-episodes", "3", "--tune-episodes", "2",
                     "--workers", "1", "--json", str(out)]) == 0
    rows = {r["method"]: r for r in json.loads(out.read_text())["rows"]}
    res = run_case(Case("tiny", False), Budget(test_episodes=3, tune_episodes=2, seeds=(), paper_protocol=False),
                   workers=1, progress=False)
    expected = res["rows"][HELD_APART]
    assert set(rows) == set(expected) and {"MA", "SL", "NSigma", "Grid-1.0"} <= set(rows)
    for name, r in rows.items():
        assert r["params"] == res["tuned"][name]["params"]
        assert r["pm_hot_r"] == expected[name][0]["pm_hot_r"] and r["s_cores"] == expected[name][0]["s_cores"]
    assert rows["Grid-0.4"]["s_cores"] == pytest.approx(0.6)
    assert mod.main(["--case", "tiny-cold", "--tune-alpha", "1.0"]) == 2     # not a level
