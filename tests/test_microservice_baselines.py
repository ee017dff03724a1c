"""Baselines of the microservice-cores problem: AutoScale's rule at its band edges, the VPA-style
recommender on hand-made use sequences, the Sinan-style scheduler (its decision logic on a stub
model, then a tiny trained model on chain3) and the static-allocation search on chain3."""
from __future__ import annotations

import copy

import numpy as np
import pytest

from agents.microservice_cores.autoscale import AutoScale, autoscale_step
from agents.microservice_cores.control import MIN_CORES, AppLimits
from agents.microservice_cores.episode import app_limits, run_episodes
from agents.microservice_cores.observation import FIELD, PERCENTILES, SERVICE_FIELDS, StepMeasurement
from agents.microservice_cores.sinan import (
    HISTORY_S, History, SinanController, SinanParams, SinanTrainParams, SinanTuneParams, build_features,
    collect, load_controller, load_sinan, n_features, train_for_experiment, train_sinan, tune_sinan)
from agents.microservice_cores.static_search import StaticSearchParams, search_static, violation_rate
from agents.microservice_cores.topology import load_topology
from agents.microservice_cores.vpa import VPAParams, VPARecommender, vpa_recommend, weighted_percentile

CHAIN = load_topology("chain3")


def meas(use, limit, p99=10.0, qos=50.0, rps=100.0, services=None) -> StepMeasurement:
    use = np.asarray(use, dtype=float)
    per = np.zeros((len(use), len(SERVICE_FIELDS)))
    per[:, FIELD["cpu_used"]] = use
    per[:, FIELD["cpu_limit"]] = np.broadcast_to(np.asarray(limit, dtype=float), use.shape)
    per[:, FIELD["rss_bytes"]] = 50 * 2**20
    lat = np.full(len(PERCENTILES), p99, dtype=float)
    services = services or tuple(f"s{i}" for i in range(len(use)))
    return StepMeasurement(services=services, per_service=per, latency_ms=lat, requests_per_s=rps,
                           failures_per_s=0.0, qos_ms=qos)


def limits_for(m: int, cap: float = 1000.0, qos: float = 50.0) -> AppLimits:
    return AppLimits(services=tuple(f"s{i}" for i in range(m)), caps=np.full(m, cap), qos_ms=qos)


# ------------------------------------------------------------------------------------------
# AutoScale (the paper's L250 rule): every band edge
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ratio, factor", [
    (0.0, 0.9), (0.05, 0.9), (0.10, 0.9),                 # [0, 0.1] -> -10 % (0.1 included)
    (0.1000001, 1.0), (0.2, 1.0), (0.2999999, 1.0),       # (0.1, 0.3) -> hold
    (0.30, 1.1), (0.4, 1.1), (0.4999999, 1.1),            # [0.3, 0.5) -> +10 % (0.5 excluded)
    (0.50, 1.3), (0.75, 1.3), (1.0, 1.3),                 # [0.5, 1.0] -> +30 %
    (1.2, 1.3),                                           # above 1 (measurement noise): +30 %
])
def test_autoscale_band_edges(ratio, factor):
    for limit in (1.0, 4.0):
        out = autoscale_step(np.array([ratio * limit]), np.array([limit]))
        assert out[0] == pytest.approx(limit * factor, rel=1e-12), (ratio, limit)


def test_autoscale_vector_and_unknown_use():
    use = np.array([0.1, 0.2, 0.3, 0.5, 1.0, np.nan])
    out = autoscale_step(use, np.ones(6))
    np.testing.assert_allclose(out, [0.9, 1.0, 1.1, 1.3, 1.3, 1.0])


def test_autoscale_controller_clips_and_noise():
    lim = limits_for(3, cap=2.0)
    ctl = AutoScale()
    ctl.reset(lim)
    out = ctl.act(meas([1.9, 0.001, 0.5], [2.0, 0.01, 1.0]))
    assert out[0] == 2.0                                 # +30 % capped at the cap
    assert out[1] == MIN_CORES                           # -10 % floored
    assert out[2] == pytest.approx(1.3)
    noisy = AutoScale(noise=0.05, seed=3)
    noisy.reset(lim)
    outs = np.array([noisy.act(meas([0.2, 0.2, 0.2], [1.0, 1.0, 1.0])) for _ in range(200)])
    assert outs.min() >= 0.95 - 1e-12 and outs.max() <= 1.05 + 1e-12 and outs.std() > 0.01


# ------------------------------------------------------------------------------------------
# VPA-style recommender
# ------------------------------------------------------------------------------------------
def test_weighted_percentile_matches_numpy_and_decay():
    x = np.arange(1.0, 101.0)[:, None]
    assert weighted_percentile(x, 95)[0] == pytest.approx(np.percentile(x, 95))
    assert weighted_percentile(x, 95, np.ones(100))[0] == 95.0       # histogram reading: inverted CDF
    w = 0.5 ** (np.arange(100)[::-1] / 1.0)                          # half-life one sample: the newest dominates
    assert weighted_percentile(x, 60, w)[0] == 100.0                 # the newest holds half the weight
    assert weighted_percentile(x, 40, w)[0] == 99.0


def test_vpa_percentile_margin_window():
    p = VPAParams(percentile=95, margin=0.15, window_s=60, min_cores=0.0)
    ctl = VPARecommender(p)
    ctl.reset(limits_for(2))
    for t in range(1, 101):                              # service 0 uses t cores at second t, service 1 constant 2
        out = ctl.act(meas([float(t), 2.0], [1000.0, 1000.0]))
    # the window holds seconds 41..100
    assert out[0] == pytest.approx(1.15 * np.percentile(np.arange(41.0, 101.0), 95))
    assert out[1] == pytest.approx(2.3)
    np.testing.assert_allclose(ctl.window()[:, 0], np.arange(41.0, 101.0))


def test_vpa_old_samples_leave_the_window():
    p = VPAParams(percentile=100, margin=0.0, window_s=10, min_cores=0.0)
    ctl = VPARecommender(p)
    ctl.reset(limits_for(1))
    ctl.observe(meas([5.0], [10.0]))                     # a spike
    for _ in range(9):
        out = ctl.act(meas([1.0], [10.0]))
    assert out[0] == 5.0                                 # still inside the 10-s window
    out = ctl.act(meas([1.0], [10.0]))
    assert out[0] == 1.0                                 # gone


@pytest.mark.parametrize("margin", [0.0, 0.15, 0.5])
def test_vpa_margin(margin):
    window = np.full((60, 1), 0.8)
    assert vpa_recommend(window, VPAParams(margin=margin, min_cores=0.0))[0] == pytest.approx(0.8 * (1 + margin))


def test_vpa_floor_cap_seed_and_nan():
    ctl = VPARecommender()                               # defaults: p95, +15 %, 60 s, 25 millicores
    ctl.reset(limits_for(3, cap=1.0))
    out = ctl.act(meas([0.0, 0.5, 3.0], [1.0, 1.0, 1.0]))
    # a controller with no warm-up seeds its window from the first second it sees
    np.testing.assert_allclose(out, [0.025, 0.575, 1.0])
    before = ctl.window().copy()
    ctl.observe(meas([np.nan, 0.5, 0.5], [1.0, 1.0, 1.0]))
    np.testing.assert_array_equal(ctl.window(), before)  # unknown use is not recorded


def test_vpa_runs_an_episode_within_bounds():
    res = run_episodes(CHAIN, lambda i: VPARecommender(), 70, seeds=[1], steps=30, warmup=20)[0]
    assert np.all(res.cores <= CHAIN.caps + 1e-12) and np.all(res.cores >= 0.025 - 1e-12)
    assert res.mean_cores < CHAIN.caps.sum()
    # the model's share of throttled periods per service, for the sim-to-real comparison
    shares = res.extra["throttled_mean"]
    assert set(shares) == set(CHAIN.service_names) and all(0.0 <= v <= 1.0 for v in shares.values())


# ------------------------------------------------------------------------------------------
# Sinan-style scheduler: decisions on a stub model
# ------------------------------------------------------------------------------------------
class StubModel:
    """Predicts every candidate's p99 from its total cores (fewer cores, higher latency)."""

    def __init__(self, services, caps, qos, safe_above: float):
        self.app, self.services, self.caps, self.qos_ms = "stub", tuple(services), caps, qos
        self.safe_above = safe_above

    def predict(self, X):
        total = X[:, n_features(len(self.services)) - 4] * self.caps.sum()   # the candidate's share of caps
        lat = np.where(total >= self.safe_above, 0.5 * self.qos_ms, 2.0 * self.qos_ms)
        pv = np.where(total >= self.safe_above, 0.0, 1.0)
        return lat, pv


def warm(ctl, use, limit, p99=10.0, n=HISTORY_S):
    out = None
    for _ in range(n):
        out = ctl.act(meas(use, limit, p99=p99, services=CHAIN.service_names))
    return out


def test_sinan_holds_until_it_has_a_history():
    ctl = SinanController(StubModel(CHAIN.service_names, CHAIN.caps, CHAIN.qos_ms, 0.0))
    ctl.reset(app_limits(CHAIN))
    for _ in range(HISTORY_S - 1):
        out = ctl.act(meas([0.1, 0.1, 0.1], CHAIN.caps, services=CHAIN.service_names))
        np.testing.assert_allclose(out, CHAIN.caps)


def test_sinan_takes_the_cheapest_safe_candidate():
    ctl = SinanController(StubModel(CHAIN.service_names, CHAIN.caps, CHAIN.qos_ms, 0.0))
    ctl.reset(app_limits(CHAIN))
    cur = np.array([1.0, 1.0, 1.0])
    out = warm(ctl, [0.1, 0.1, 0.1], cur)
    np.testing.assert_allclose(out, cur * min(SinanParams().down_ops))   # scale every service down
    assert ctl.last_choice["why"] == "down"


def test_sinan_scales_up_when_nothing_cheaper_is_safe_and_maxes_when_nothing_is():
    cur = np.array([1.0, 1.0, 1.0])
    ctl = SinanController(StubModel(CHAIN.service_names, CHAIN.caps, CHAIN.qos_ms, safe_above=3.05))
    ctl.reset(app_limits(CHAIN))
    out = warm(ctl, [0.1, 0.1, 0.1], cur)
    assert ctl.last_choice["why"] == "up" and 3.05 <= out.sum() < CHAIN.caps.sum()
    cands = ctl.candidates()
    ups = cands.cores[np.array(cands.kind) == "up"].sum(axis=1)
    assert out.sum() == pytest.approx(ups[ups >= 3.05].min())            # the cheapest safe scale-up
    ctl = SinanController(StubModel(CHAIN.service_names, CHAIN.caps, CHAIN.qos_ms, safe_above=1e9))
    ctl.reset(app_limits(CHAIN))
    out = warm(ctl, [0.1, 0.1, 0.1], cur)
    np.testing.assert_allclose(out, CHAIN.caps)
    assert ctl.last_choice["why"] == "max"


def test_sinan_observed_violation_rules_out_down_and_hold():
    ctl = SinanController(StubModel(CHAIN.service_names, CHAIN.caps, CHAIN.qos_ms, 0.0))
    ctl.reset(app_limits(CHAIN))
    cur = np.array([1.0, 1.0, 1.0])
    out = warm(ctl, [0.1, 0.1, 0.1], cur, p99=2 * CHAIN.qos_ms)
    assert ctl.last_choice["why"] == "up" and out.sum() > cur.sum()


def test_sinan_saturated_services_are_raised_in_every_candidate():
    ctl = SinanController(StubModel(CHAIN.service_names, CHAIN.caps, CHAIN.qos_ms, 0.0))
    ctl.reset(app_limits(CHAIN))
    warm(ctl, [0.95, 0.1, 0.1], [1.0, 1.0, 1.0])          # service 0 at 95 % utilisation
    cands = ctl.candidates()
    assert np.all(cands.cores[:, 0] >= 0.95 / 0.7 - 1e-9)
    assert np.all(cands.cores <= CHAIN.caps + 1e-12) and cands.kind[:2] == ["hold", "max"]


def test_features_shape_and_projection():
    h = History(1, 3)
    h.push_measurement(meas([0.5, 0.2, 0.1], [1.0, 1.0, 1.0], services=CHAIN.service_names))
    X = build_features(h, np.array([[1.0, 1.0, 1.0], [0.5, 0.5, 0.5]]), CHAIN.caps, CHAIN.qos_ms)
    assert X.shape == (2, n_features(3)) and np.all(np.isfinite(X))
    assert X[1, 1] == pytest.approx(2 * X[0, 1])             # projected utilisation doubles at half the cores


# ------------------------------------------------------------------------------------------
# Sinan-style: data collection, a tiny model on chain3, save/load
# ------------------------------------------------------------------------------------------
TINY = SinanTrainParams(copies=12, batches=2, explore_s=150, warmup=20, max_iter=60)


def test_sinan_collection_shapes_and_bounds():
    d = collect(CHAIN, 0, SinanTrainParams(copies=4, batches=1, explore_s=30, warmup=10))
    n = 4 * (30 - 5 + 1)
    assert d.X.shape == (n, n_features(3)) and d.y_lat.shape == (n,) and set(np.unique(d.y_viol)) <= {0, 1}
    share = d.X[:, 0::7][:, :3]                                  # cand / cap per service
    assert np.all(share <= 1.0 + 1e-6) and np.all(share * CHAIN.caps >= 0.02 - 1e-6)
    assert np.all((d.users >= CHAIN.users[0]) & (d.users <= CHAIN.users[1]))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    out = tmp_path_factory.mktemp("sinan")
    return train_sinan("chain3", seed=0, params=TINY, out_dir=out, tune=False), out


def test_sinan_save_load(tiny_model):
    model, out = tiny_model
    loaded = load_sinan(out, "chain3")
    X = np.random.default_rng(0).random((5, n_features(3))).astype(np.float32)
    for a, b in zip(model.predict(X), loaded.predict(X)):
        np.testing.assert_allclose(a, b)
    with pytest.raises(ValueError):
        load_sinan(out / "sinan-chain3.joblib", "hotel")
    with pytest.raises(ValueError):
        SinanController(loaded).reset(app_limits(load_topology("hotel")))
    assert model.info["samples"] > 0 and model.info["total_s"] > 0


def test_sinan_entry_points(tiny_model, tmp_path):
    _, out = tiny_model
    ctl = load_controller("chain3", out, p_down=0.1)
    assert isinstance(ctl, SinanController) and ctl.p.p_down == 0.1
    assert load_controller(CHAIN, out / "sinan-chain3.joblib").p == SinanParams()   # untuned: Sinan's own
    with pytest.raises(ValueError, match="no Sinan-style model"):
        load_controller("chain3", tmp_path)
    small = train_for_experiment(CHAIN, seed=1, seconds=200, out=tmp_path, tune=False)
    used = small.info["params"]
    assert used["batches"] == 1 and used["copies"] * used["explore_s"] <= 200
    assert (tmp_path / "sinan-chain3.joblib").is_file()


def test_sinan_on_chain3_is_cheaper_than_the_caps_and_safe(tiny_model):
    model, _ = tiny_model
    res = run_episodes(CHAIN, lambda i: SinanController(model), 70, seeds=[1, 2], steps=120, warmup=30)
    mean = np.mean([r.mean_cores for r in res])
    assert mean < 0.8 * CHAIN.caps.sum()
    assert np.mean([r.violation_rate for r in res]) <= 0.02
    assert all(np.all(r.cores <= CHAIN.caps + 1e-12) for r in res)


def test_sinan_tuning_sets_the_controller_threshold(tiny_model):
    model = copy.deepcopy(tiny_model[0])
    tp = SinanTuneParams(grid=(0.055, 0.2), levels=(0.5,), seeds=(5,), steps=60)
    table = tune_sinan(model, CHAIN, tp)
    assert table[0]["p_down"] == 0.055 and model.scheduler["p_down"] in (0.055, 0.2)
    assert model.scheduler["p_hold"] == pytest.approx(model.scheduler["p_down"] + 0.045)
    ctl = SinanController(model)
    assert ctl.p.p_down == model.scheduler["p_down"]
    feasible = [r for r in table if r["feasible"]]
    if feasible:
        assert model.scheduler["p_down"] == min(feasible, key=lambda r: r["mean_cores"])["p_down"]


def test_sinan_collector_keeps_each_allocation_with_the_second_it_was_in_force(tmp_path):
    """Sinan's data collection as a controller (for the real containers): every second's features
    with the applied allocation, labelled by the p99 of the next second, written on close and read
    back as training data with `collect`'s labels."""
    from agents.microservice_cores.hosting import make_controller
    from agents.microservice_cores.sinan_live import SinanCollector, load_samples

    col = make_controller("sinan-explore", CHAIN, out=str(tmp_path / "run"), seed=4)
    assert isinstance(col, SinanCollector)
    res = run_episodes(CHAIN, lambda i: col, 70, seeds=[1], steps=60, warmup=10)[0]
    X, p99 = col.samples()
    assert X.shape == (59, n_features(3)) and np.all(np.isfinite(X))
    np.testing.assert_allclose(X[:, 0:21:7], res.cores[:59] / CHAIN.caps, rtol=1e-6)   # the allocation applied
    np.testing.assert_allclose(p99, res.p99_ms[:59])                                   # ... and its second's p99
    assert len(np.unique(res.cores.sum(axis=1).round(6))) > 5                         # it explores
    path = col.close()
    data = load_samples([path.parent], CHAIN, k=5)
    assert data.X.shape == (55, n_features(3)) and set(np.unique(data.group)) == {0}
    viol = p99 > CHAIN.qos_ms
    assert data.y_viol.tolist() == [int(viol[t:t + 5].any()) for t in range(55)]
    np.testing.assert_allclose(data.y_lat, np.log(np.maximum(p99[:55], 1e-3) / CHAIN.qos_ms))
    with pytest.raises(ValueError, match="not of 'hotel'"):
        load_samples([path], load_topology("hotel"))
    with pytest.raises(ValueError, match="unknown parameter"):
        make_controller("sinan-explore", CHAIN, out=str(tmp_path), every=3)
    with pytest.raises(ValueError, match="needs out=DIR"):
        make_controller("sinan-explore", CHAIN)
    assert SinanCollector(CHAIN, tmp_path / "none").close() is None                    # nothing measured, nothing written


def test_a_model_fitted_on_live_samples_keeps_the_reference_scheduler(tiny_model, tmp_path):
    from agents.microservice_cores.sinan_live import SinanCollector, fit_live

    ref_model, ref_dir = tiny_model
    ref = copy.deepcopy(ref_model)
    ref.scheduler = {"p_down": 0.2, "p_hold": 0.245}
    ref.save(tmp_path / "ref")
    dirs = []
    for seed in (1, 2):
        col = SinanCollector(CHAIN, tmp_path / f"run{seed}", seed=seed)
        run_episodes(CHAIN, lambda i: col, 70, seeds=[seed], steps=80, warmup=10)
        dirs.append(col.close().parent)
    model = fit_live(CHAIN, dirs, seed=0, live_weight=2, scheduler_from=tmp_path / "ref", out_dir=tmp_path / "m")
    assert model.info["live"]["samples"] == 2 * 75 and model.info["samples"] == 2 * 2 * 75
    assert model.info["live"]["twin_samples"] == 0 and model.scheduler == ref.scheduler
    ctl = load_controller(CHAIN, tmp_path / "m")
    assert ctl.p.p_down == 0.2
    res = run_episodes(CHAIN, lambda i: ctl, 70, seeds=[3], steps=30, warmup=10)[0]
    assert np.all(res.cores <= CHAIN.caps + 1e-12) and np.all(np.isfinite(res.cores))
    both = fit_live(CHAIN, dirs[:1], seed=0, twin_seconds=7 * 300, scheduler_from=tmp_path / "ref")
    assert both.info["live"]["twin_samples"] > 0 and both.info["held_out"] > 0
    with pytest.raises(ValueError, match="live_weight"):
        fit_live(CHAIN, dirs, live_weight=0)


def test_the_testbed_model_fitted_on_the_real_containers_ships_with_its_samples():
    from agents.microservice_cores.sinan import SHIPPED_DIR
    from agents.microservice_cores.sinan_live import load_samples

    where = SHIPPED_DIR / "sinan-testbed-live"
    ctl = load_controller("testbed", where)
    live = ctl.model.info["live"]
    assert live["live_weight"] == 20 and live["samples"] == 1189 and live["twin_samples"] > 0
    assert ctl.p == SinanParams(**load_sinan(SHIPPED_DIR, "testbed").scheduler)   # the twin model's scheduler
    data = load_samples([where / "samples-u6.npz", where / "samples-u14.npz"], load_topology("testbed"))
    assert len(data.y_lat) == live["samples"] and data.y_viol.mean() == pytest.approx(live["violation_share"])


# ------------------------------------------------------------------------------------------
# static search on chain3
# ------------------------------------------------------------------------------------------
def test_static_search_chain3():
    p = StaticSearchParams(seeds=(1001, 1002), steps=120, warmup=30, measure_s=30, floors=(0.0, 0.1),
                           rel_tol=0.05, descent_rounds=1)
    res = search_static(CHAIN, 70, p)
    assert res.feasible and res.total_cores < CHAIN.caps.sum()
    again = violation_rate(CHAIN, res.cores, 70, list(p.seeds), steps=p.steps, warmup=p.warmup)
    assert again == pytest.approx(res.violation_rate) and again <= 0.01
    assert np.all(res.cores <= CHAIN.caps + 1e-12) and np.all(res.cores >= MIN_CORES - 1e-12)
    # it is a search, not a guess: 10 % fewer cores everywhere breaks the target
    assert violation_rate(CHAIN, res.cores * 0.9, 70, list(p.seeds), steps=p.steps, warmup=p.warmup) > 0.01


def test_static_search_returns_caps_when_nothing_is_feasible():
    strict = CHAIN.model_copy(update={"qos_ms": 1.0})
    p = StaticSearchParams(seeds=(1,), steps=20, warmup=10, measure_s=10, floors=(0.0,))
    res = search_static(strict, 70, p)
    assert not res.feasible
    np.testing.assert_allclose(res.cores, CHAIN.caps)


# ------------------------------------------------------------------------------------------
# HPA-style scale-down window around any controller (ours)
# ------------------------------------------------------------------------------------------
class _Scripted:
    """A controller that answers a fixed sequence of cores, and records what limits it was shown."""
    name = "scripted"

    def __init__(self, answers):
        self.answers = [np.asarray(a, dtype=float) for a in answers]
        self.seen_limits = []

    def reset(self, limits):
        self.i = 0

    def act(self, m):
        self.seen_limits.append(m.per_service[:, FIELD["cpu_limit"]].copy())
        out = self.answers[self.i]
        self.i += 1
        return out


def test_scale_down_window_rises_at_once_and_falls_to_the_window_max():
    from agents.microservice_cores.control import ScaleDownWindow

    inner = _Scripted([[1.0, 4.0], [3.0, 1.0], [0.5, 1.0], [0.5, 1.0], [0.5, 0.2], [0.5, 0.2], [np.nan, 0.2]])
    ctl = ScaleDownWindow(inner, 3)
    ctl.reset(limits_for(2, cap=5.0))
    outs, limit = [], np.array([5.0, 5.0])
    for _ in range(7):
        limit = ctl.act(meas([0.1, 0.1], limit))
        outs.append(limit)
    np.testing.assert_allclose(outs, [[1.0, 4.0], [3.0, 4.0], [3.0, 4.0], [3.0, 1.0], [0.5, 1.0], [0.5, 1.0],
                                      [5.0, 0.2]])                      # NaN holds the cap, as clip_cores
    np.testing.assert_allclose(inner.seen_limits[2], [3.0, 4.0])        # the inner controller sees the limits in force
    assert ctl.name == "scripted+window3"
    one = ScaleDownWindow(_Scripted([[1.0], [0.2]]), 1)
    one.reset(limits_for(1, cap=5.0))
    assert [float(one.act(meas([0.1], 1.0))[0]) for _ in range(2)] == [1.0, 0.2]   # 1 s: unchanged
    for bad in (0, -2, 2.5, float("nan"), float("inf"), "5", True):
        with pytest.raises(ValueError, match="scale_down_window"):
            ScaleDownWindow(_Scripted([]), bad)


class _ForkingScripted(_Scripted):
    """A scripted controller that forks as a learned policy does: the same answers, its own place."""

    def fork(self):
        twin = _ForkingScripted([])
        twin.answers = self.answers
        return twin


def test_a_forked_window_shares_the_inner_policy_and_keeps_its_own_history():
    from agents.microservice_cores.control import ScaleDownWindow

    ctl = ScaleDownWindow(_ForkingScripted([[4.0], [1.0], [1.0]]), 2)
    ctl.reset(limits_for(1, cap=5.0))
    assert ctl.forks and float(ctl.act(meas([0.1], 5.0))[0]) == 4.0
    twin = ctl.fork()
    assert isinstance(twin, ScaleDownWindow) and twin.window_s == 2 and twin.name == ctl.name
    assert twin.inner is not ctl.inner and twin.inner.answers is ctl.inner.answers
    twin.reset(limits_for(1, cap=5.0))
    # the original still holds its 4-core second; the fork starts empty and follows its own inner copy
    assert [float(ctl.act(meas([0.1], 4.0))[0]) for _ in range(2)] == [4.0, 1.0]
    assert [float(twin.act(meas([0.1], 5.0))[0]) for _ in range(3)] == [4.0, 4.0, 1.0]
    rule = ScaleDownWindow(_Scripted([]), 3)
    assert not rule.forks
    with pytest.raises(TypeError, match="does not fork"):
        rule.fork()


def test_make_controller_wraps_any_controller_in_the_window():
    from agents.microservice_cores.control import ScaleDownWindow
    from agents.microservice_cores.hosting import make_controller

    ctl = make_controller("autoscale", CHAIN, scale_down_window=4)
    assert isinstance(ctl, ScaleDownWindow) and ctl.window_s == 4 and ctl.name == "autoscale+window4"
    ctl.reset(app_limits(CHAIN))
    caps = CHAIN.caps
    first = ctl.act(meas(np.zeros(3), caps, services=CHAIN.service_names))
    np.testing.assert_allclose(first, np.maximum(caps * 0.9, MIN_CORES))  # AutoScale's -10 % on idle services
    held = ctl.act(meas(np.zeros(3), first, services=CHAIN.service_names))
    np.testing.assert_allclose(held, first)                               # its next -10 % waits for the window
    for bad in ("5", True, 0):
        with pytest.raises(ValueError, match="scale_down_window"):
            make_controller("autoscale", CHAIN, scale_down_window=bad)


def test_headroom_floor_lifts_a_limit_to_k_times_the_mean_use_of_the_last_seconds():
    from agents.microservice_cores.control import HeadroomFloor

    inner = _Scripted([[0.1, 2.0]] * 7 + [[0.1, 9.0]])
    ctl = HeadroomFloor(inner, 4.0, window_s=3)
    ctl.reset(limits_for(2, cap=5.0))
    uses = [[0.01, 0.1], [0.05, 0.1], [0.09, 0.1], [0.30, 0.1], [np.nan, 0.1], [np.nan, 0.1], [np.nan, 0.1],
            [2.0, 0.1]]
    outs = [ctl.act(meas(u, 1.0)) for u in uses]
    # mean use of the last 3 measured seconds x 4: 0.04 (under the asked 0.1), then 0.12, 0.2, 0.59
    np.testing.assert_allclose([o[0] for o in outs[:4]], [0.1, 0.12, 0.2, 4 * (0.05 + 0.09 + 0.30) / 3])
    # unmeasured seconds do not count; a window with nothing measured has no floor
    np.testing.assert_allclose([o[0] for o in outs[4:7]], [4 * 0.39 / 2, 4 * 0.30, 0.1])
    assert outs[7][0] == 5.0 and outs[7][1] == 5.0           # never past the cap, whatever the use or the ask
    np.testing.assert_allclose([o[1] for o in outs[:7]], 2.0)  # headroom already over 4x: untouched
    assert ctl.name == "scripted+floor4"
    for bad in (0, -1.0, float("nan"), float("inf"), "4", True):
        with pytest.raises(ValueError, match="headroom_floor"):
            HeadroomFloor(_Scripted([]), bad)


def test_the_floor_bounds_what_the_window_lets_through_and_forks_with_the_policy():
    from agents.microservice_cores.control import HeadroomFloor, ScaleDownWindow
    from agents.microservice_cores.hosting import make_controller

    ctl = make_controller("autoscale", CHAIN, scale_down_window=3, headroom_floor=4)
    assert isinstance(ctl, HeadroomFloor) and isinstance(ctl.inner, ScaleDownWindow)
    assert ctl.name == "autoscale+window3+floor4" and not ctl.forks
    with pytest.raises(TypeError, match="does not fork"):
        ctl.fork()
    ctl.reset(app_limits(CHAIN))
    got = ctl.act(meas(0.05 * CHAIN.caps, CHAIN.caps, services=CHAIN.service_names))
    np.testing.assert_allclose(got, np.maximum(0.9 * CHAIN.caps, MIN_CORES))   # AutoScale's -10 %, over the floor
    learned = HeadroomFloor(ScaleDownWindow(_ForkingScripted([[1.0], [0.1], [0.1]]), 2), 2.0)
    assert learned.forks
    learned.reset(limits_for(1, cap=5.0))
    assert float(learned.act(meas([0.2], 5.0))[0]) == 1.0
    twin = learned.fork()
    assert isinstance(twin, HeadroomFloor) and twin.ratio == 2.0 and isinstance(twin.inner, ScaleDownWindow)
    twin.reset(limits_for(1, cap=5.0))
    # its own window and use: the fork's window holds 1.0 one more second, then the floor (2 x 0.2) bounds 0.1
    np.testing.assert_allclose([float(twin.act(meas([0.2], 5.0))[0]) for _ in range(3)], [1.0, 1.0, 0.4])
    for bad in ("4", 0):
        with pytest.raises(ValueError, match="headroom_floor"):
            make_controller("autoscale", CHAIN, headroom_floor=bad)


def test_testbed_compare_names_a_window_and_a_policy_per_agent():
    from benchmark_script import load_benchmark

    mod = load_benchmark("microservice_testbed_compare")
    assert mod.split_agent("autoscale") == ("autoscale", None, {})
    assert mod.split_agent("reclaimer@runs/x/policy") == ("reclaimer", "runs/x/policy", {})
    assert mod.split_agent("reclaimer@runs/x/policy+window5") == ("reclaimer", "runs/x/policy", {"scale_down_window": 5})
    assert mod.split_agent("autoscale+window10") == ("autoscale", None, {"scale_down_window": 10})
    assert mod.split_agent("reclaimer+window5+floor3.5") == ("reclaimer", None,
                                                             {"scale_down_window": 5, "headroom_floor": 3.5})
    assert mod.split_agent("reclaimer+window5+throttle0.2") == ("reclaimer", None,
                                                                {"scale_down_window": 5, "throttle_guard": 0.2})
    with pytest.raises(ValueError, match="unknown modifier"):
        mod.split_agent("reclaimer+margin2")


def test_throttle_guard_lifts_only_the_services_the_kernel_throttled():
    from agents.microservice_cores.control import ScaleDownWindow, ThrottleGuard
    from agents.microservice_cores.hosting import make_controller

    inner = _Scripted([[0.1, 0.1, 0.1]] * 5)
    ctl = ThrottleGuard(inner, 0.2)
    ctl.reset(limits_for(3, cap=0.5))

    def with_shares(shares, limit=0.3):
        m = meas([0.05, 0.05, 0.05], limit)
        if shares is not None:
            m.extra["throttled"] = dict(zip(m.services, shares))
        return m

    # s0 over the share: at least its limit in force x 1.1; s1 at exactly the share and s2 unmeasured: as asked
    np.testing.assert_allclose(ctl.act(with_shares([0.5, 0.2, None])), [0.33, 0.1, 0.1])
    np.testing.assert_allclose(ctl.act(with_shares([0.0, 0.0, 0.0])), [0.1, 0.1, 0.1])  # no throttling: untouched
    np.testing.assert_allclose(ctl.act(with_shares(None)), [0.1, 0.1, 0.1])  # no counters (the simulator): no guard
    np.testing.assert_allclose(ctl.act(with_shares([1.0, float("nan"), 0.9], limit=0.48)), [0.5, 0.1, 0.5])  # the cap
    assert ctl.fired == 3 and ctl.name == "scripted+throttle0.2"
    for bad in (1.0, -0.1, float("nan"), "0.2", True):
        with pytest.raises(ValueError, match="throttle_guard"):
            ThrottleGuard(_Scripted([]), bad)
    with pytest.raises(ValueError, match="throttle_step"):
        ThrottleGuard(_Scripted([]), 0.2, step=-1)
    # through the controller factory: outermost, around the window; a step alone is refused
    ctl = make_controller("autoscale", CHAIN, scale_down_window=3, throttle_guard=0.25, throttle_step=0.5)
    assert isinstance(ctl, ThrottleGuard) and isinstance(ctl.inner, ScaleDownWindow) and ctl.step == 0.5
    assert ctl.name == "autoscale+window3+throttle0.25"
    with pytest.raises(ValueError, match="throttle_step needs throttle_guard"):
        make_controller("autoscale", CHAIN, throttle_step=0.5)
