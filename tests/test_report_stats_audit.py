"""Audit of the figures every experiment reports (aggregation, statistics, tables): degenerate
inputs that crashed or printed garbage. Each test failed before its fix."""
from __future__ import annotations

import math

import numpy as np
import pytest

from agents import generalisation_stats as gs
from agents import report


# --- agents/report.py ---------------------------------------------------------------------------------
def test_stats_of_values_near_the_float_limit_stay_finite():
    """The sum overflowed: mean inf and std inf (written as null) for two finite values."""
    assert report.stats([1e308, 1e308]) == {"mean": 1e308, "std": 0.0, "n": 2}
    st = report.stats([1e308, -1e308])
    assert st["mean"] == 0.0 and st["std"] == pytest.approx(1e308)
    # ordinary values: exactly numpy's mean and population std, as before
    v = [0.1, 0.2, 0.7, 3.3]
    assert report.stats(v) == {"mean": float(np.mean(v)), "std": float(np.std(v)), "n": 4}


def test_fmt_shows_a_missing_std_as_a_dash():
    """A summary read back from JSON has std null where it was not finite: fmt raised TypeError."""
    assert report.fmt({"mean": 1.5, "std": None, "n": 1}, 2) == "1.50 ± –"


def test_validate_summary_reports_wrong_containers_instead_of_raising():
    """The validator raised AttributeError ('list' has no .items()) instead of naming the problem."""
    good = {"schema": report.SCHEMA, "problem": "x", "paper": {}, "setting": {}, "methods": {}, "paper_figures": {},
            "targets": [], "figures": []}
    assert report.validate_summary(good) == []
    assert report.validate_summary({**good, "methods": {"m": [1.0, 2.0]}}) == [
        "methods.m: want metric -> {mean, std, n}, got list"]
    problems = report.validate_summary({**good, "methods": [1], "targets": {"a": 1}})
    assert problems == ["methods: want method -> metric -> stats, got list", "targets: want a list, got dict"]


# --- agents/generalisation_stats.py ----------------------------------------------------------------------
def test_ratios_to_best_does_not_depend_on_where_a_nan_cost_stands():
    """A NaN cost raised 'non-positive cost nan' when its rule came first and was ignored otherwise."""
    assert gs.ratios_to_best({"a": math.nan, "b": 2.0}, ["a", "b"])[0] == "b"
    assert gs.ratios_to_best({"b": 2.0, "a": math.nan}, ["b", "a"])[0] == "b"
    with pytest.raises(ValueError, match="non-positive cost"):
        gs.ratios_to_best({"a": math.nan}, ["a"])


def _ep(seed, cost):
    return {"seed": seed, "total_cost": cost, "jobs_finished": 1, "jobs_total": 1, "makespan_s": 60.0}


def test_suite_names_the_window_agent_and_seed_of_bad_episodes():
    """A NaN episode cost surfaced as 'best rule has a non-positive cost nan' or, for a non-rule,
    as a geometric-mean error naming no window; an agent without episodes as a bare 'no episodes'."""
    with pytest.raises(ValueError, match=r"window 'w', agent 'ppo': total_cost is not a finite number .*\[2\]"):
        gs.summarise_suite({"w": {"thr": [_ep(1, 2.0), _ep(2, 3.0)], "ppo": [_ep(1, 1.0), _ep(2, math.nan)]}},
                           ["thr"])
    with pytest.raises(ValueError, match="window 'w', agent 'ppo': no episodes"):
        gs.summarise_suite({"w": {"thr": [_ep(1, 2.0)], "ppo": []}}, ["thr"])


# --- samm/testbed/billing.py -----------------------------------------------------------------------------
def _bill(**kw):
    from samm.testbed.billing import GroupSpec, InstanceRecord, summarize
    from samm.testbed.jobqueue import JobRecord, RunRecord

    args = {"instances": [InstanceRecord("S", "s1", 0.0)],
            "jobs": [JobRecord(0, 1, 10.0, 0.0, 0.0, "done", 1, 0, 0.0, 0.0, 0.0, 0.0, 30.0, "s1")],
            "runs": [RunRecord(0, 1, "s1", 1, 0.0, 30.0, "done")],
            "groups": {"S": GroupSpec(cores=2, price_per_hour=0.2, max=10)}, "compression": 10.0, "t0": 0.0}
    return summarize(**{**args, **kw})


def test_billing_refuses_non_finite_clock_inputs():
    """compression inf passed `> 0` and billed every instance from 0; t0 NaN likewise; step_s inf
    and a NaN finish failed as 'cannot convert float NaN to integer'."""
    from samm.testbed.jobqueue import JobRecord

    assert _bill()["vm_cost"] == pytest.approx(60 * 0.2 / 3600, abs=1e-6)   # one whole step, per second
    for kw, field in (({"compression": math.inf}, "compression"), ({"t0": math.nan}, "t0"),
                      ({"step_s": math.inf}, "step_s")):
        with pytest.raises(ValueError, match=field):
            _bill(**kw)
    nan_finish = [JobRecord(0, 1, 10.0, 0.0, 0.0, "done", 1, 0, 0.0, 0.0, 0.0, 0.0, math.nan, "s1")]
    with pytest.raises(ValueError, match="non-finite finish time"):
        _bill(jobs=nan_finish)


def test_billing_refuses_a_group_spec_without_cores_or_with_a_nan_price():
    """0 cores read as 100 % CPU (a division by zero capped at 1); a NaN price billed NaN dollars."""
    from samm.testbed.billing import GroupSpec

    with pytest.raises(ValueError, match="group 'S': cores must be a finite number >= 1, got 0"):
        _bill(groups={"S": GroupSpec(cores=0, price_per_hour=0.2)})
    with pytest.raises(ValueError, match="group 'S': price_per_hour must be a finite number >= 0, got nan"):
        _bill(groups={"S": GroupSpec(cores=2, price_per_hour=math.nan)})


# --- samm/testbed/report.py --------------------------------------------------------------------------
def test_testbed_tables_without_rows_or_with_non_finite_values():
    """table([]) raised TypeError (max of one int); NaN and inf printed as 'nan' and 'inf %', and
    the fidelity gap of a NaN as '+nan %'."""
    from samm.testbed.report import fidelity_table, table

    assert table([]).count("\n") == 1     # the header and its rule
    row = {"makespan_s": 90.0, "total_cost": math.nan, "vm_cost": 0.01, "wait_penalty": 0.0,
           "mean_allocated_cores": 2.0, "mean_cpu_util": math.inf, "mean_wait_s": 0.0}
    body = table([("a", row)]).splitlines()[2]
    assert "nan" not in body and "inf" not in body and body.count(" - ") == 2
    fid = fidelity_table([("a", {"total_cost": 1.0, "makespan_s": math.nan, "mean_allocated_cores": 1.0},
                           {"total_cost": 1.1, "makespan_s": 2.0, "mean_allocated_cores": 1.0})])
    assert "nan" not in fid and "| a | makespan_s | - | 2.00 | - |" in fid


# --- the problems' aggregation ------------------------------------------------------------------------
def test_reclaimer_overall_p99_leaves_out_a_level_without_one():
    """A level with no finite p99 (None) counted as 0 ms: the overall mean of 0 and 50 read 25 ms,
    and the table printed 0.0 ms for an unknown p99."""
    from agents.microservice_cores import experiment as mc
    from agents.microservice_cores.episode import EpisodeResult

    def ep(p99):
        t = len(p99)
        return EpisodeResult("m", "chain3", 10.0, 1, np.ones((t, 3)), np.full((t, 3), 0.5), np.asarray(p99, float),
                             np.ones(t), np.zeros(t), 100.0)

    rows = {"10.0": {"autoscale": mc._aggregate([ep([math.nan] * 4)])},
            "20.0": {"autoscale": mc._aggregate([ep([50.0] * 4)])}}
    summary = mc._summarise({"hotel": rows}, {}, mc.QUICK, 1.0)
    assert summary["apps"]["hotel"]["overall"]["autoscale"]["p99_mean_ms"] == 50.0
    text = mc._report(summary)
    assert "| 10.0 | autoscale | 3.00 ± 0.00 | 3.00 | – |" in text
    all_none = mc._summarise({"hotel": {"10.0": rows["10.0"]}}, {}, mc.QUICK, 1.0)
    assert all_none["apps"]["hotel"]["overall"]["autoscale"]["p99_mean_ms"] is None


def _osdec_summary(ours: list[float], best: float):
    from agents.deferrable_jobs import experiment as dj

    metrics = {k: 1.0 for k in dj.METRICS}
    heur = {"tiny": {"fifo": {**metrics, "total_reward": best, "params": {}}}}
    runs = [{"setting": "tiny", "variant": "osdec", "seed": s, "train_seconds": 1.0, "curve": [],
             **metrics, "total_reward": r} for s, r in enumerate(ours)]
    summary = dj._summarise(runs, heur, dj.QUICK, "tiny", [], 1.0, True)
    return next(t for t in summary["targets"] if "above every heuristic" in t["name"])


def test_osdec_reward_target_without_a_finite_reward_or_a_positive_best():
    """Every seed's reward NaN: TypeError (None > float); a best heuristic at 0: ZeroDivisionError;
    a negative best: the ratio turned upside down (0.5 reported beside 'met')."""
    assert _osdec_summary([110.0, 130.0], 100.0) == {
        "name": "osdec: total reward above every heuristic on tiny (best: fifo)", "value": 1.2,
        "goal": "> 1.0 x best heuristic", "met": True}
    t = _osdec_summary([math.nan, math.nan], 100.0)
    assert t["value"] is None and t["met"] is False
    t = _osdec_summary([1.0], 0.0)
    assert t["value"] is None and t["met"] is True
    t = _osdec_summary([-5.0], -10.0)
    assert t["value"] is None and t["met"] is True


def test_lra_gain_vs_round_robin_skips_cases_without_a_gain():
    """Round-robin scoring 0 raised ZeroDivisionError; one case without a valid round-robin plan
    (NaN) made the mean over every case NaN."""
    from agents.lra_placement import experiment as lra

    class Case:
        n_nodes, size_range = 9, (10, 20)

    def st(score):
        return {"score": report.stats([score])}

    per_case = {"a": {"__case__": Case, "m": st(0.6), lra.STAND_IN: st(0.5)},
                "b": {"__case__": Case, "m": st(0.6), lra.STAND_IN: st(math.nan)},
                "c": {"__case__": Case, "m": st(0.6), lra.STAND_IN: st(0.0)}}
    gain = lra.gain_vs_stand_in(per_case, "m")
    assert gain == {"all": pytest.approx(20.0), "10-20": pytest.approx(20.0)}


def test_oversub_evaluation_refuses_zero_test_episodes(capsys):
    """--episodes 0 evaluated no test day and reported PM-Hot-R 0.0 % with every level satisfied."""
    from pathlib import Path

    from agents.oversubscription import evaluate as ev

    shipped = Path(ev.__file__).parent / "policies" / "c2marl-azure-0.95"
    with pytest.raises(ValueError, match="episodes must be a whole number >= 1, got 0"):
        ev.evaluate_saved(shipped, episodes=0)
    with pytest.raises(SystemExit) as exc:
        ev.main(["--policy", str(shipped), "--episodes", "-3"])
    assert exc.value.code == 2 and "--episodes must be at least 1, got -3" in capsys.readouterr().err


def test_billing_a_horizon_inside_a_step_samples_its_last_step_at_the_horizon():
    """end_s = 90 s with 60-s steps: the last step was sampled at 120 s, after every alive instance
    had stopped (at end_s), so it counted 0 cores and no CPU: 1.0 mean cores for a fleet of 2."""
    from samm.testbed.jobqueue import RunRecord

    s = _bill(jobs=[], runs=[RunRecord(0, 1, "s1", 1, 0.0, 90.0, "done")], compression=1.0, end_s=90.0)
    assert s["steps"] == 2 and s["horizon_s"] == 90.0
    assert s["mean_allocated_cores"] == 2.0 and s["mean_allocated_cores_tw"] == 2.0
    assert s["mean_cpu_util"] == pytest.approx(0.5)        # 1 of 2 cores held in both steps
    assert s["vm_cost"] == pytest.approx(90 * 0.2 / 3600, abs=1e-6)
    whole = _bill(jobs=[], runs=[RunRecord(0, 1, "s1", 1, 0.0, 90.0, "done")], compression=1.0, end_s=120.0)
    assert whole["mean_allocated_cores"] == 2.0 and whole["mean_cpu_util"] == pytest.approx((0.5 + 0.25) / 2)


# -- the paper experiment's verdict and table (agents/experiment.py) ------------------------------
def test_paper_table_and_verdict_survive_a_rule_that_finished_no_job():
    """After hours of training and evaluation, a summary without a metric raised TypeError in the
    table, and a tuned threshold with makespan 0 a ZeroDivisionError in the verdict: report.md and
    summary.json were never written."""
    from agents.evaluate import summarise
    from agents.experiment import _change, _row, _table

    assert _change(10.0, 0.0) is None and _change(None, 2.0) is None and _change(3.0, 2.0) == 0.5
    ep = {"total_cost": 9.0, "jobs_finished": 0, "jobs_total": 4, "terminated": False}
    rows = [_row("lstm-ppo", {"summary": summarise([ep])}), _row("threshold (tuned)", {"summary": summarise([ep])})]
    assert rows[0]["makespan_min"] is None
    text = _table(rows, ref="threshold (tuned)")
    assert "| lstm-ppo | 9.00 ± 0.00 | – |" in text and "+0.0%" in text


def test_a_summary_of_no_episodes_does_not_say_they_all_ended():
    from agents.evaluate import summarise

    assert summarise([])["all_terminated"] is False
