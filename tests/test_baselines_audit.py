"""Audit of every problem's baselines against their papers' definitions, and of their parameters:
a bad key or value is one line naming it (agents/params.py's wording) when the rule is built, never
a constructor's TypeError, a crash at the first decision, a hang, or a rule that runs on garbage."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from agents.deferrable_jobs.baselines import make_rule as make_deferrable_rule
from agents.lra_placement.hosting import make_policy as make_lra_policy
from agents.microservice_cores.autoscale import AutoScale, autoscale_step
from agents.microservice_cores.hosting import make_controller
from agents.microservice_cores.sinan import SinanParams, load_sinan
from agents.microservice_cores.static_search import StaticSearchParams, search_static
from agents.microservice_cores.topology import load_topology
from agents.microservice_cores.vpa import VPAParams
from agents.oversubscription.baselines import MaxRule, NSigmaRule, PercentileRule
from agents.oversubscription.hosting import make_policy as make_oversub_policy

TESTBED = load_topology("testbed")


# ------------------------------------------------------------------------------------------
# unknown keys: one line naming the key and the known ones
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, key, known", [
    ("autoscale", "nosie", "noise"),
    ("vpa", "percentil", "percentile"),
    ("sinan", "p_dwn", "p_down"),
])
def test_a_misspelt_microservice_rule_key_names_the_known_ones(name, key, known):
    with pytest.raises(ValueError) as err:
        make_controller(name, TESTBED, **{key: 0.1})
    msg = str(err.value)
    assert "\n" not in msg and repr(key) in msg and known in msg and "scale_down_window" in msg


def test_a_misspelt_lra_hosting_key_names_the_known_ones():
    with pytest.raises(ValueError, match=r"lra-reinforce: unknown parameter 'nodse' \(known: nodes\)"):
        make_lra_policy("lra-reinforce", nodse=3)


# ------------------------------------------------------------------------------------------
# AutoScale (Reclaimer L250): "otherwise hold", and its noise and seed
# ------------------------------------------------------------------------------------------
def test_autoscale_holds_a_negative_ratio_outside_every_band():
    # [0, 0.1] -> -10 %; a negative use (a broken counter) is in no band: the paper's "otherwise hold"
    ratios = np.array([-0.2, -1e-9, 0.0, 0.1, 0.3, 0.5, 1.0, 1.7])
    np.testing.assert_allclose(autoscale_step(ratios * 2.0, np.full(len(ratios), 2.0)),
                               [2.0, 2.0, 1.8, 1.8, 2.2, 2.6, 2.6, 2.6])


@pytest.mark.parametrize("params, key", [
    ({"noise": float("nan")}, "noise"), ({"noise": -0.5}, "noise"), ({"noise": 3}, "noise"),
    ({"noise": "x"}, "noise"), ({"seed": "x"}, "seed"), ({"seed": -1}, "seed"), ({"seed": 2.5}, "seed"),
])
def test_autoscale_refuses_a_bad_noise_or_seed_when_built(params, key):
    # before: NaN or negative noise failed at the first act (numpy's uniform), noise 3 gave negative limits
    with pytest.raises(ValueError, match=rf"^autoscale: {key} must be"):
        make_controller("autoscale", TESTBED, **params)


def test_autoscale_noise_is_reproducible_per_seed():
    from agents.microservice_cores.episode import app_limits
    from agents.microservice_cores.observation import FIELD, PERCENTILES, SERVICE_FIELDS, StepMeasurement

    per = np.zeros((TESTBED.n_services, len(SERVICE_FIELDS)))
    per[:, FIELD["cpu_used"]], per[:, FIELD["cpu_limit"]] = 0.2, 1.0
    m = StepMeasurement(services=TESTBED.service_names, per_service=per, latency_ms=np.full(len(PERCENTILES), 5.0),
                        requests_per_s=10.0, failures_per_s=0.0, qos_ms=TESTBED.qos_ms)
    runs = []
    for seed in (7, np.int64(7), "7"):
        c = AutoScale(noise=0.05, seed=seed)
        c.reset(app_limits(TESTBED))
        runs.append([c.act(m) for _ in range(3)])
    np.testing.assert_array_equal(runs[0], runs[1])
    np.testing.assert_array_equal(runs[0], runs[2])


# ------------------------------------------------------------------------------------------
# the VPA recommender's and the Sinan-style scheduler's parameters
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("params, key", [
    ({"margin": float("nan")}, "margin"), ({"margin": float("inf")}, "margin"),
    ({"min_cores": float("nan")}, "min_cores"), ({"min_cores": float("inf")}, "min_cores"),
    ({"half_life_s": float("nan")}, "half_life_s"), ({"percentile": "high"}, "percentile"),
    ({"window_s": 2.5}, "window_s"), ({"window_s": True}, "window_s"), ({"window_s": 10**10}, "window_s"),
    ({"window_s": "60"}, None),
])
def test_vpa_params_are_checked_when_built(params, key):
    # before: NaN margin/floor made every limit the cap in silence; window 2.5 failed at reset; 10**10
    # asked for that many rows; a string compared with a number was a TypeError
    if key is None:
        assert VPAParams(**params).window_s == 60 and type(VPAParams(**params).window_s) is int
        return
    with pytest.raises(ValueError, match=rf"^vpa: {key} must be"):
        VPAParams(**params)


def test_vpa_defaults_and_numeric_strings_read_as_numbers():
    assert VPAParams() == VPAParams(percentile=95.0, margin=0.15, window_s=60, min_cores=0.025)
    p = VPAParams(percentile="90", margin="0.1", window_s=30.0)
    assert (p.percentile, p.margin, p.window_s) == (90.0, 0.1, 30)


@pytest.mark.parametrize("params, key", [
    ({"p_down": "abc"}, "p_down"), ({"p_down": float("nan")}, "p_down"), ({"p_hold": float("nan")}, "p_hold"),
    ({"margin": float("nan")}, "margin"), ({"victims_window": 0}, "victims_window"),
    ({"down_ops": [-1.0]}, r"down_ops\[0\]"), ({"down_ops": 0.9}, "down_ops"), ({"up_mult": [0.5]}, r"up_mult\[0\]"),
    ({"max_util": 0}, "max_util"), ({"steady_rps": float("nan")}, "steady_rps"), ({"min_cores": -1}, "min_cores"),
    ({"block_down_on_violation": "false"}, "block_down_on_violation"),
])
def test_sinan_params_are_checked_when_built(params, key):
    # before: p_down="abc" raised numpy's UFuncTypeError at the first decision, NaN thresholds
    # never scaled down, victims_window=0 kept every past action ([-0:] is the whole list)
    with pytest.raises(ValueError, match=rf"^sinan: {key} must be"):
        SinanParams(**params)
    with pytest.raises(ValueError, match=rf"^sinan: {key} must be"):
        make_controller("sinan", TESTBED, **params)


def test_sinan_defaults_and_the_shipped_schedulers_pass_their_checks():
    from agents.microservice_cores.sinan import SHIPPED_DIR

    p = SinanParams(p_down="0.1", down_ops=[0.9, 0.75])
    assert p.p_down == 0.1 and p.down_ops == (0.9, 0.75) and p.victims_window == 5
    assert SinanParams() == SinanParams(down_ops=(0.90, 0.75), up_mult=(1.10, 1.25), up_cap=(0.25, 0.50))
    for app in ("hotel", "social", "testbed"):
        model = load_sinan(SHIPPED_DIR / f"sinan-{app}.joblib", app)
        assert SinanParams(**model.scheduler).p_down == model.scheduler["p_down"]


@pytest.mark.parametrize("seed", ["abc", float("nan"), 2.7, -1])
def test_sinan_explore_seed_is_a_whole_number(seed, tmp_path):
    # before: int() read 2.7 as 2 in silence; -1 failed only once the collection had begun
    with pytest.raises(ValueError, match=r"^sinan-explore: seed must be"):
        make_controller("sinan-explore", TESTBED, out=str(tmp_path), seed=seed)


# ------------------------------------------------------------------------------------------
# the static search: every parameter lets it end
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("params, key", [
    ({"rel_tol": -0.1}, "rel_tol"), ({"rel_tol": 0}, "rel_tol"), ({"m_low": 0.0}, "m_low"),
    ({"seeds": ()}, "seeds"), ({"max_violation": float("nan")}, "max_violation"), ({"shrink": 1.5}, "shrink"),
])
def test_static_search_params_that_never_end_or_divide_by_zero_are_refused(params, key):
    # before: rel_tol <= 0 spun the bisection forever, m_low = 0 raised ZeroDivisionError
    with pytest.raises(ValueError, match=rf"^static-search: {key} must be"):
        StaticSearchParams(**params)


def test_static_search_with_a_tolerance_below_float_precision_ends():
    chain = load_topology("chain3")
    p = StaticSearchParams(seeds=(1,), steps=10, warmup=3, measure_s=3, rel_tol=1e-300, descent_rounds=0)
    res = search_static(chain, 60, p)   # before: adjacent floats never narrowed the bracket
    assert res.feasible and np.all(res.cores <= chain.caps)


# ------------------------------------------------------------------------------------------
# oversubscription: Bashir et al.'s predictors
# ------------------------------------------------------------------------------------------
def view_of(history, hour=0):
    return SimpleNamespace(usage_history=np.asarray(history, dtype=np.float64), hour=hour)


def test_max_predictor_refuses_a_percentile_outside_0_100():
    # before: MaxRule took p=150 (PercentileRule refused it); a full window then indexed past its end
    with pytest.raises(ValueError, match=r"p \(a percentile\) must lie in \[0, 100\], got 150"):
        make_oversub_policy("max-predictor", p=150, prior="none")
    with pytest.raises(ValueError, match="must lie in"):
        MaxRule(1, p=-5)


def test_max_predictor_is_the_larger_of_n_sigma_and_the_percentile_by_hand():
    h = [[0.1], [0.2], [0.3], [0.4]]           # mean 0.25, population std 0.1118
    rate = lambda rule: float(rule.rates(view_of(h))[0])
    assert rate(NSigmaRule(1, n=1, window=4, headroom=1, lo=0.01)) == pytest.approx(0.25 + np.sqrt(0.0125))
    assert rate(PercentileRule(1, p=50, window=4, headroom=1, lo=0.01)) == pytest.approx(0.25)
    assert rate(MaxRule(1, n=0, p=100, window=4, headroom=1, lo=0.01)) == pytest.approx(0.4)
    assert rate(MaxRule(1, n=2, p=0, window=4, headroom=1, lo=0.01)) == pytest.approx(0.25 + 2 * np.sqrt(0.0125))
    assert rate(NSigmaRule(1, n=1, window=2, headroom=2, lo=0.01)) == pytest.approx(2 * (0.35 + 0.05))


@pytest.mark.parametrize("make", [
    lambda w: NSigmaRule(1, n=1, window=w, headroom=1, lo=0.01),
    lambda w: PercentileRule(1, p=50, window=w, headroom=1, lo=0.01),
])
@pytest.mark.parametrize("window", [0, -3, 2.5, "many"])
def test_a_window_below_one_observation_is_refused(make, window):
    # before: N-sigma with window 0 reserved 1.0 in silence, the percentile raised IndexError
    with pytest.raises(ValueError, match=r"^window must be a whole number of observations >= 1"):
        make(window)


def test_a_window_longer_than_any_history_reads_the_whole_history():
    # before: a hosted window=10**12 allocated [10**12, N] on every admit request (MemoryError: a 500)
    pol = make_oversub_policy("nsigma", window=10**12, prior="none")
    n = pol.setting.n_subscribers
    hist = np.tile(np.array([[0.2], [0.3], [0.25]]), (1, n))
    whole = make_oversub_policy("nsigma", window=3, prior="none")
    np.testing.assert_allclose(pol.rates(view_of(hist)), whole.rates(view_of(hist)))


def test_a_nan_headroom_is_refused():
    with pytest.raises(ValueError, match="headroom must be a finite positive number, got nan"):
        NSigmaRule(2, headroom=float("nan"))


# ------------------------------------------------------------------------------------------
# deferrable jobs: the heuristics' parameters
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, params, key", [
    ("tetris", {"eps": float("nan")}, "eps"), ("tetris", {"eps": float("inf")}, "eps"),
    ("fifo", {"margin": "abc"}, "margin"), ("fifo", {"margin": None}, "margin"),
    ("sjf", {"margin": float("nan")}, "margin"),
])
def test_deferrable_rule_params_are_finite_numbers_named(name, params, key):
    # before: eps NaN or inf scored every job alike (Tetris became first-fit in silence), and
    # margin "abc" gave float()'s message without the rule or the key
    with pytest.raises(ValueError, match=rf"^{name}: {key} must be"):
        make_deferrable_rule(name, **params)
    assert make_deferrable_rule("tetris", margin=0.1, eps=0.5).params == {"margin": 0.1, "eps": 0.5}


# ------------------------------------------------------------------------------------------
# the headroom ceiling's choice
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw, match", [({"max_violation": float("nan")}, "max_violation must lie in"),
                                       ({"max_violation": -0.1}, "max_violation must lie in"),
                                       ({"seeds": []}, "at least one validation seed")])
def test_choose_ceiling_refuses_a_bound_no_row_can_break(kw, match):
    # before: max_violation=NaN counted every grid value clean and chose the lowest ceiling
    from agents.microservice_cores.ceiling import choose_ceiling

    class Policy:
        def with_ceiling(self, ceiling):
            return ceiling

    evaluated = []

    def evaluate(policy, topo, seeds):
        evaluated.append(policy)
        return {"violation_rate": 0.5, "mean_cores": 1.0, "levels": {}}

    args = {"seeds": [101], **kw}
    with pytest.raises(ValueError, match=match):
        choose_ceiling(Policy(), None, args.pop("seeds"), evaluate_fn=evaluate, **args)
    assert evaluated == []          # refused before any episode runs
