"""Ninth audit round, LRA placement's offline side: the data model refuses counts, sizes and rules it
cannot represent instead of truncating or misreading them, a predictor of another number of apps is
named instead of scoring reshaped nonsense, and `samm experiment lra` keeps going (and stays honest)
when the exact optimum finds no plan."""
from __future__ import annotations

import math

import numpy as np
import pytest

from agents.lra_placement import experiment as ex
from agents.lra_placement.baselines import PLANNERS, node_values
from agents.lra_placement.cluster import Batch, Cluster, Constraints, Rule, check_plan
from agents.lra_placement.env import LraPlacementEnv, sample_batch
from agents.lra_placement.predictor import ForestPredictor, SyntheticInterference, all_compositions

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# --- batches, clusters and rules -------------------------------------------------------------------
@pytest.mark.parametrize("counts", [[1.5, 2], [2, 0.5, 1], [np.nan, 2], [np.inf, 1]])
def test_a_batch_with_counts_that_are_not_whole_is_refused_not_truncated(counts):
    # 1.5 containers became 1 silently (a batch of 3 placed as 3 while 3.5 were asked for); NaN failed
    # with numpy's "cannot convert float NaN to integer", naming no field
    with pytest.raises(ValueError, match=r"^a batch's counts must be whole numbers, got "):
        Batch(counts)


def test_env_reset_with_a_fractional_batch_places_nothing_silently():
    env = LraPlacementEnv(n_nodes=3, slots=2, n_apps=3, seed=1)
    with pytest.raises(ValueError, match="whole numbers"):
        env.reset(options={"batch": [1.5, 1, 1]})   # was: reset to a batch of [1, 1, 1]
    obs, info = env.reset(options={"batch": [2.0, 1, 0]})   # whole floats still mean what they say
    assert obs["remaining"].tolist() == [2.0, 1.0, 0.0] and info["action_mask"].all()


def test_a_batch_order_with_fractional_app_indexes_is_refused():
    with pytest.raises(ValueError, match=r"^a batch's order \(app indexes\) must be whole numbers"):
        Batch([1, 2], order=[0.5, 1, 1])     # was: app 0.5 read as app 0
    assert Batch([1, 2], order=[1.0, 0.0, 1.0]).order.tolist() == [1, 0, 1]


@pytest.mark.parametrize("n_nodes, slots, field", [(2.5, 8, "n_nodes"), (3, float("nan"), "slots"),
                                                    ("3", 8, "n_nodes"), (True, 8, "n_nodes")])
def test_a_cluster_size_that_is_not_whole_names_the_field(n_nodes, slots, field):
    # a float failed in range() with "'float' object cannot be interpreted as an integer"; True was one node
    with pytest.raises(ValueError, match=rf"^{field} must be a whole number, got "):
        Cluster(n_nodes, slots)


def test_a_cluster_of_whole_float_sizes_has_int_sizes():
    cluster = Cluster(3, 8.0)     # slots 8.0 made the capacity the float 24.0
    assert cluster.slots == 8 and isinstance(cluster.slots, int)
    assert cluster.capacity == 24 and isinstance(cluster.capacity, int)


@pytest.mark.parametrize("rule, match", [
    (Rule(0, 1, "anti_affinity"), r"has kind 'anti_affinity', not one of anti-affinity, cardinality$"),
    (Rule(0, 1, "affinity", 3), r"has kind 'affinity'"),
    (Rule(0, 5, "cardinality", 1), r"names an app outside 0\.\.2$"),
    (Rule(-1, 0, "anti-affinity"), r"names an app outside 0\.\.2$"),
    (Rule(0, 1, "cardinality", -1), r"has a negative limit$"),
    (Rule(0, 1, "cardinality", 2.5), r"needs whole app indexes and limit$"),
])
def test_constraints_refuse_a_rule_they_cannot_check(rule, match):
    # every check read an unknown kind as a cardinality cap: "anti_affinity" (limit 0) forbade both
    # apps everywhere, "affinity" capped the pair at 3, silently; an app past n_apps was an IndexError
    with pytest.raises(ValueError, match=r"^constraints: rule .*" + match):
        Constraints(3, (rule,))


def test_valid_rules_still_build_and_check():
    cons = Constraints(3, (Rule(0, 1, "anti-affinity"), Rule(2, 2, "cardinality", 0), Rule(0, 2, "cardinality", 3)))
    assert cons.composition_ok(np.array([[1, 0, 0], [1, 1, 0], [0, 0, 1]])).tolist() == [True, False, False]


# --- a predictor of another number of apps -----------------------------------------------------------
def _table_forest(n_apps: int = 7, slots: int = 2) -> ForestPredictor:
    """A table-only forest predictor (the form `ForestPredictor.load` gives), without fitting."""
    fp = ForestPredictor(app_names=tuple(f"app{i}" for i in range(n_apps)), slots=slots)
    comps = all_compositions(n_apps, slots)
    fp.table_keys = fp._keys(comps)
    fp.table = np.where(comps > 0, 1.0 / np.maximum(comps.sum(axis=1, keepdims=True), 1), 0.0)
    return fp


def test_forest_lookup_of_another_number_of_apps_names_both():
    fp = _table_forest()
    # (7, 8) counts were reshaped into 8 rows of 7 apps and answered as if they were those nodes
    with pytest.raises(ValueError, match=r"^compositions of 8 apps given to a predictor of 7 \(app0, "):
        fp.throughput(np.zeros((7, 8), dtype=np.int64))
    assert fp.throughput(np.array([[1, 0, 0, 0, 0, 0, 1]])).tolist() == [[0.5, 0, 0, 0, 0, 0, 0.5]]


@pytest.mark.parametrize("planner", ["greedy", "greedy-ls"])
def test_an_interference_aware_baseline_with_a_predictor_of_other_apps_names_both_counts(planner):
    fp = _table_forest()
    batch = Batch(np.ones(14, dtype=np.int64))   # 14 apps: two of the predictor's rows per node, silently
    with pytest.raises(ValueError, match=r"^the batch has 14 apps but the predictor knows 7$"):
        PLANNERS[planner](Cluster(7, 2), batch, Constraints.none(14), fp, np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"^the batch has 3 apps but the predictor knows 7$"):
        node_values(np.ones((2, 3), dtype=np.int64), SyntheticInterference(7))


def test_an_interference_aware_baseline_with_its_own_predictor_still_plans():
    fp = _table_forest()
    batch = Batch([2, 1, 0, 0, 0, 0, 1])
    cluster = Cluster(3, 2)
    plan = PLANNERS["greedy-ls"](cluster, batch, Constraints.none(7), fp, np.random.default_rng(0))
    assert check_plan(plan, batch, cluster, Constraints.none(7)) == []


# --- the experiment when the optimum finds no plan -------------------------------------------------
TINY = ex.Case(n_nodes=3, size_range=(6, 9), skew="zipf", constrained=True, slots=4)


def _tiny_budgets(**kw) -> ex.Budgets:
    return ex.Budgets(per_batch_s={3: 30.0}, per_batch_episodes=64, fine_tune_s={3: 0.2}, **kw)


def test_run_case_records_a_missing_optimum_instead_of_raising():
    # HiGHS with no time to find a plan raised TimeoutError out of run_case: the whole experiment
    # (every case run before it) was lost
    pred = SyntheticInterference(n_apps=7, seed=0, slots=4)
    res = ex.run_case(TINY, pred, seeds=[3, 4], budgets=_tiny_budgets(optimum_time_limit_s=1e-9), keep_curve=True)
    for rec, info in zip(res["runs"][ex.OPTIMUM], res["optimum"]):
        assert rec["invalid"] == 1 and rec["error"].startswith("TimeoutError: HiGHS found no placement")
        assert math.isnan(info["score"]) and info["optimal"] is False and info["n_compositions"] is None
    for m in ("greedy-ls", ex.PER_BATCH):   # the other methods still planned, validly, with no ratio to report
        for rec in res["runs"][m]:
            assert rec["invalid"] == 0 and math.isfinite(rec["score"]) and math.isnan(rec["ratio"])
    assert ex.case_stats(res)["greedy-ls"]["ratio"] == {"mean": None, "std": None, "n": 0}
    assert math.isnan(res["curve"]["optimum"])


def test_convergence_plot_without_an_optimum_line_is_still_written(tmp_path):
    curve = {"points": [{"episodes": 32, "mean": 0.8, "best": 0.85}, {"episodes": 64, "mean": 0.82, "best": 0.86}],
             "optimum": math.nan, "case": TINY.name, "batch_size": 8, "seed": 3}
    ex.plot_convergence(curve, 0.86, tmp_path / "c.png")
    assert (tmp_path / "c.png").read_bytes()[:8] == PNG_MAGIC


class _Dead:
    """Predicts throughput 0 for every container (a forest that never saw these apps present)."""

    app_names = tuple(f"app{i}" for i in range(7))

    def throughput(self, compositions):
        return np.zeros(np.shape(compositions))


def test_run_case_with_an_optimum_of_score_zero_has_no_ratio_not_a_zero_division():
    res = ex.run_case(TINY, _Dead(), seeds=[3], budgets=_tiny_budgets())   # was ZeroDivisionError: 0.0 / 0.0
    assert res["optimum"][0]["score"] == 0.0
    assert all(math.isnan(recs[0]["ratio"]) for recs in res["runs"].values())


@pytest.mark.parametrize("limit", [0, -5.0, float("nan"), float("inf"), "10", True])
def test_run_refuses_a_bad_optimum_time_limit_before_touching_out(tmp_path, limit):
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text("{}")   # an earlier run's: must not be moved aside by a refused call
    with pytest.raises(ValueError, match=r"^optimum_time_limit_s must be a number of seconds > 0, got "):
        ex.run(out, quick=True, seeds=(1,), predictor="synthetic", progress=False, optimum_time_limit_s=limit)
    assert (out / "summary.json").read_text() == "{}" and not (out / "summary.previous.json").exists()


# --- the rules CSV and the batch sampler --------------------------------------------------------------
@pytest.mark.parametrize("limit", ["n/a", "-1", "-", "2.5"])
def test_an_anti_affinity_rows_limit_is_ignored_as_documented(tmp_path, limit):
    # cluster.py: "`limit` is ignored for anti-affinity"; "n/a" was refused as "limit must be an integer"
    path = tmp_path / "rules.csv"
    path.write_text(f"app_a,app_b,rule,limit\napp0,app1,anti-affinity,{limit}\n")
    cons = Constraints.from_csv(path, ("app0", "app1", "app2"))
    assert [(r.a, r.b, r.kind) for r in cons.rules] == [(0, 1, "anti-affinity")]
    assert cons.composition_ok(np.array([[1, 1, 0], [1, 0, 1]])).tolist() == [False, True]


def test_a_cardinality_rows_limit_must_still_be_an_integer(tmp_path):
    path = tmp_path / "rules.csv"
    path.write_text("app_a,app_b,rule,limit\napp0,app1,cardinality,n/a\n")
    with pytest.raises(ValueError, match=r"rules\.csv:2: limit must be an integer, got 'n/a'$"):
        Constraints.from_csv(path, ("app0", "app1", "app2"))


@pytest.mark.parametrize("size_range, n_apps, match", [((2.5, 3.7), 3, r"^size_range must be a whole number, got 2\.5$"),
                                                      ((2, 3), 0, r"^n_apps must be >= 1, got 0$")])
def test_sample_batch_refuses_what_it_would_truncate_or_misname(size_range, n_apps, match):
    # (2.5, 3.7) drew 2-3 containers silently; 0 apps failed in numpy naming "pvals"
    with pytest.raises(ValueError, match=match):
        sample_batch(np.random.default_rng(0), n_apps, size_range)
    assert sample_batch(np.random.default_rng(0), 3, (2.0, 3)).size in (2, 3)


def test_quick_run_whose_optimum_finds_no_plan_still_writes_an_honest_report(tmp_path):
    summary = ex.run(tmp_path, quick=True, seeds=(1,), predictor="synthetic", progress=False,
                     optimum_time_limit_s=1e-9)
    setting = summary["setting"]
    assert setting["budgets"]["optimum_time_limit_s"] == 1e-9 and setting["optimum_proved"] == 0
    assert summary["methods"][ex.OPTIMUM]["invalid"]["mean"] == 1.0      # counted, not hidden
    assert summary["methods"]["greedy-ls"]["ratio"]["n"] == 0             # no ratio without an optimum
    assert summary["methods"]["greedy-ls"]["invalid"]["mean"] == 0
    quality = [t for t in summary["targets"] if "optimum" in t["name"] or "greedy-ls" in t["name"]]
    assert quality and not any(t["met"] for t in quality)                 # not met, not invented
    report = (tmp_path / "report.md").read_text()
    assert "time limit 1e-09 s); proved optimal on 0 of 3 batches" in report
