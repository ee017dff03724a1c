"""Three seams made to say one thing:

* a missing (NaN) CPU sample is missing everywhere: left out of the CPU metrics and of the
  most-idle-VM feature (it was idle in the one and busy in the other), and with every sample
  missing those are NaN, on which the daemon records "nothing (features unknown)" instead of
  scaling in on a fleet it cannot see;
* `samm evaluate` and `samm tune` reach a problem plug-in through its spec (`evaluate`, `tune`),
  and a problem without one is one line naming the missing field;
* an experiment's target shows its value on the side of the goal's bound it was judged on
  ("0.15 >= 0.15: not met" was 0.14996 rounded to 4 places)."""
import json
import subprocess
import sys

import numpy as np
import pytest

from agents.report import Target, shown_value
from samm.analyze import FleetSpec, RawSnapshot, compute_metrics
from samm.analyze.features import compute_features
from sim_bridge.config import PAPER_VM_TYPES
from test_problem_plugin_seam import ROOT, _distribution, _env, _toy

FLEET = FleetSpec.from_vm_types(PAPER_VM_TYPES)  # S/M/L = 2/4/8 cores, 8/16/32 GB


def snap(cpu, types=None, states=None, ram=None):
    n = len(cpu)
    types = types if types is not None else [i % 3 for i in range(n)]
    states = states if states is not None else [1] * n
    return RawSnapshot(vm_type=np.array(types), vm_state=np.array(states), vm_cpu_busy=np.array(cpu, dtype=float),
                       vm_ram_used_gb=np.array(ram if ram is not None else [4.0] * n, dtype=float),
                       vm_running_for_s=np.full(n, 600.0), jobs_submitted_total=np.array(10.0),
                       jobs_submitted_interval=np.array(2.0), jobs_waiting_now=np.array(0.0),
                       jobs_waiting_interval=np.array(0.0), jobs_running=np.array(3.0),
                       jobs_waiting_cores=np.array(0.0), jobs_running_cores=np.array(6.0),
                       head_job_cores=np.array(0.0))


# --- 1. a missing CPU sample: neither idle nor busy ---------------------------------------------

def test_a_missing_cpu_sample_is_left_out_of_the_cpu_metrics_not_counted_idle():
    m = compute_metrics(snap([np.nan, 0.8, 0.6]), FLEET)
    assert m[1] == pytest.approx(0.7)  # was (0 + 0.8 + 0.6) / 3: the missing VM read as idle
    assert m[2] == pytest.approx(np.percentile([0.6, 0.8], 90))
    assert m[3] == pytest.approx(np.mean([4 / 8, 4 / 16, 4 / 32]))  # its RAM was measured: it counts


def test_a_missing_queue_count_is_an_unknown_feature_and_ratio_not_zero():
    """`jobs_waiting`, `jobs_running` and `jobs_submitted_interval` read a NaN count as 0 (an
    empty queue), where the module promises NaN for what the snapshot cannot tell and the daemon
    then decides nothing."""
    import dataclasses

    names = ("cpu_mean", "jobs_waiting", "jobs_running", "jobs_submitted_interval")
    whole = compute_features(snap([0.5, 0.5]), FLEET, names)
    assert np.isfinite(whole).all() and whole.tolist()[1:] == [0.0, 3.0, 2.0]
    for field, name in (("jobs_waiting_now", "jobs_waiting"), ("jobs_running", "jobs_running"),
                        ("jobs_submitted_interval", "jobs_submitted_interval")):
        f = compute_features(dataclasses.replace(snap([0.5, 0.5]), **{field: np.array(np.nan)}), FLEET, names)
        assert np.isnan(f[names.index(name)]) and np.isfinite(f[0]), (field, f)
    # the paper's waiting ratios over a missing count, likewise (they read 0: an empty queue)
    for field, col in (("jobs_waiting_now", 5), ("jobs_submitted_total", 5), ("jobs_waiting_interval", 6),
                       ("jobs_submitted_interval", 6)):
        m = compute_metrics(dataclasses.replace(snap([0.5, 0.5]), **{field: np.array(np.nan)}), FLEET)
        assert np.isnan(m[col]) and np.isfinite(m[11 - col]) and np.isfinite(m[:5]).all(), (field, m)


def test_every_cpu_sample_missing_makes_the_cpu_metrics_unknown_not_an_idle_fleet():
    m = compute_metrics(snap([np.nan, np.nan]), FLEET)
    assert np.isnan(m[1]) and np.isnan(m[2])  # were 0: "idle", a scale-in on missing data
    assert np.isfinite(m[[0, 3, 4, 5, 6]]).all()
    # no VM measured at all (all booting) is still the documented 0, not unknown
    booting = compute_metrics(snap([np.nan, np.nan], states=[0, 0]), FLEET)
    assert np.all(booting[1:] == 0.0)
    # a RAM sample missing is missing too
    r = compute_metrics(snap([0.5, 0.5], types=[0, 0], ram=[np.nan, 4.0]), FLEET)
    assert r[3] == pytest.approx(0.5) and r[1] == pytest.approx(0.5)


def test_the_free_slot_feature_and_the_cpu_metrics_give_a_missing_sample_one_meaning():
    names = ("cpu_mean", "largest_free_slot_ratio")
    # an 8-core L VM without a sample beside a half-busy 2-core S VM: the S VM's 1 idle core
    f = compute_features(snap([0.5, np.nan], types=[0, 2]), FLEET, names)
    assert f[0] == pytest.approx(0.5) and f[1] == pytest.approx(1 / 8)
    # no running VM with a sample: both unknown (the free slot read "every VM busy", the CPU "idle")
    f = compute_features(snap([np.nan, np.nan], types=[0, 2]), FLEET, names)
    assert np.isnan(f).all()
    # nothing running: no free slot, as before
    f = compute_features(snap([np.nan], types=[2], states=[0]), FLEET, names)
    assert f.tolist() == [0.0, 0.0]


def test_a_batch_with_one_blind_row_leaves_the_other_rows_as_they_were():
    """The simulator's batched path: a NaN in one row must not move any other row's values."""
    rng = np.random.default_rng(7)
    e, v = 5, 12
    cpu = rng.random((e, v))
    types, states = rng.integers(0, 3, (e, v)), np.ones((e, v), dtype=np.int64)
    z = np.full(e, 5.0)
    clean = RawSnapshot(types, states, cpu, rng.random((e, v)) * 8, np.full((e, v), 600.0), z, z, z, z, z)
    blind_cpu = cpu.copy()
    blind_cpu[2] = np.nan
    blind = RawSnapshot(types, states, blind_cpu, clean.vm_ram_used_gb, clean.vm_running_for_s, z, z, z, z, z)
    a, b = compute_metrics(clean, FLEET), compute_metrics(blind, FLEET)
    np.testing.assert_array_equal(np.delete(a, 2, axis=0), np.delete(b, 2, axis=0))
    assert np.isnan(b[2, 1:3]).all() and np.array_equal(a[2, [0, 3, 4, 5, 6]], b[2, [0, 3, 4, 5, 6]])


class _BlindMonitor:
    """A live source whose running VMs all came back without a CPU sample (NaN)."""

    def __init__(self):
        self.end = 1_000_020.0

    def read(self):
        from samm.daemon.monitoring import MonitorOutcome

        self.end += 60.0
        raw = snap([np.nan, np.nan, np.nan], types=[0, 1, 2], ram=[4.0, 8.0, 16.0])
        return MonitorOutcome(self.end - 60.0, self.end, "ok", raw=raw)


def test_the_daemon_does_not_scale_in_on_a_fleet_whose_cpu_it_cannot_see(tmp_path):
    """The threshold rule (remove a VM per group below 75 % CPU) read the missing samples as an
    idle fleet and scaled in; now the iteration records "nothing (features unknown)"."""
    from agents.factory import make_agent
    from samm.daemon.loop import ControlLoop
    from samm.knowledge import KnowledgeStore
    from samm.plan.client import InProcessPlanner
    from sim_bridge.config import SimConfig

    store = KnowledgeStore(f"sqlite:///{tmp_path}/k.db")
    try:
        loop = ControlLoop(groups=[], fleet=FLEET, monitor=_BlindMonitor(),
                           planner=InProcessPlanner(make_agent("threshold", SimConfig())), executor=None,
                           store=store, agent_name="threshold", warmup_s=0, cooldown_s=0, dry_run=True,
                           clock=lambda: 1_000_100.0)
        rep = loop.run_once()
        assert rep.plan is None and not rep.actions
        assert np.isnan(rep.features["cpu_mean"])
        rec = store.decision(rep.key)
        assert rec.action is None and rec.action_name == "nothing (features unknown)"
        assert "cpu_mean" in rec.reason
    finally:
        store.close()


# --- 2. `samm evaluate` / `samm tune` of a problem plug-in ---------------------------------------

SCORED = {
    "__init__.py": '''
        from agents.registry import ProblemSpec, register_problem

        PROBLEM = register_problem(ProblemSpec(
            name="scored-plugin", title="a plug-in that can be evaluated and tuned", paper="-",
            agents={"scored-pick": "sammscored.hooks:make"}, make_policy="sammscored.hooks:make",
            evaluate="sammscored.hooks:evaluate", tune="sammscored.hooks:tune"))
        ''',
    "hooks.py": '''
        import json
        from pathlib import Path


        def make(agent, policy_dir=None, **params):
            raise AssertionError("not served here")


        def evaluate(agent, seeds, policy_dir=None, params=None):
            if agent != "scored-pick":
                raise ValueError(f"unknown agent {agent!r} of scored-plugin")
            return {"agent": agent, "seeds": seeds, "policy_dir": policy_dir, "params": params,
                    "summary": {"score": {"mean": 0.5, "std": float("nan"), "n": len(seeds)}}}


        def tune(agent, seeds, out=None, progress=True):
            best = {"k": len(seeds)}
            if out:
                Path(out).mkdir(parents=True, exist_ok=True)
                (Path(out) / "tuned.json").write_text(json.dumps(best))
            return {"agent": agent, "best_params": best, "progress": progress}
        ''',
}

BADREF = {"__init__.py": '''
    from agents.registry import ProblemSpec, register_problem

    PROBLEM = register_problem(ProblemSpec(name="badref-plugin", title="x", paper="-",
                                           evaluate="no_such_module_xyz:evaluate"))
    '''}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    _toy(site)  # the plug-in seam's toy: served and trained, but names no evaluate nor tune
    _distribution(site, "sammscored", "scored-plugin = sammscored\n", {f"sammscored/{k}": v for k, v in SCORED.items()})
    _distribution(site, "sammbadref", "badref-plugin = sammbadref\n", {f"sammbadref/{k}": v for k, v in BADREF.items()})
    return site


def samm(site, *args):
    return subprocess.run([sys.executable, "-m", "samm.cli.main", *args], cwd=ROOT, env=_env(site),
                          capture_output=True, text=True, timeout=120)


def _one_line(r, *says):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    for s in says:
        assert s in lines[0], lines[0]
    return lines[0]


def test_samm_evaluate_runs_a_plugins_evaluator_with_the_shared_options(site, tmp_path):
    r = samm(site, "evaluate", "--problem", "scored-plugin", "--agent", "scored-pick", "--seeds", "1-3",
             "--params", '{"k": 2}', "--policy", str(tmp_path), "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["seeds"] == [1, 2, 3] and res["params"] == {"k": 2} and res["policy_dir"] == str(tmp_path)
    assert '"std": null' in r.stdout and "NaN" not in r.stdout  # strict JSON, as every --json
    r = samm(site, "evaluate", "--problem", "scored-plugin", "--agent", "scored-pick", "--seeds", "4")
    assert r.returncode == 0 and "scored-pick on scored-plugin" in r.stdout and '"n": 1' in r.stdout, r.stderr


def test_samm_tune_runs_a_plugins_tuner_and_it_saves_to_out(site, tmp_path):
    out = tmp_path / "tuned"
    r = samm(site, "tune", "--problem", "scored-plugin", "--agent", "scored-pick", "--seeds", "1,2", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == 'best scored-pick: {"k": 2}'
    assert json.loads((out / "tuned.json").read_text()) == {"k": 2}
    r = samm(site, "tune", "--problem", "scored-plugin", "--agent", "scored-pick", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["progress"] is False, r.stderr


def test_a_plugin_without_an_evaluator_or_tuner_is_one_line_naming_the_missing_field(site):
    _one_line(samm(site, "evaluate", "--problem", "toy-plugin", "--agent", "toy-pick"),
              "'toy-plugin' has no evaluator", "`evaluate`")
    _one_line(samm(site, "tune", "--problem", "toy-plugin", "--agent", "toy-pick"),
              "'toy-plugin' has no tunable baselines", "`tune`")
    _one_line(samm(site, "evaluate", "--problem", "badref-plugin", "--agent", "x"),
              "no_such_module_xyz")


def test_samm_train_of_a_plugin_without_a_trainer_is_one_line_not_a_traceback(site, tmp_path):
    _one_line(samm(site, "train", "--problem", "scored-plugin", "--out", str(tmp_path / "run")),
              "'scored-plugin' has no trainer", "`train`")
    assert not (tmp_path / "run").exists()


def test_a_plugins_refusal_and_an_option_it_does_not_read_are_one_line(site):
    _one_line(samm(site, "evaluate", "--problem", "scored-plugin", "--agent", "magic"),
              "unknown agent 'magic' of scored-plugin")
    _one_line(samm(site, "evaluate", "--problem", "scored-plugin", "--agent", "scored-pick", "--workload", "x.swf"),
              "--workload", "not scored-plugin")
    _one_line(samm(site, "tune", "--problem", "scored-plugin", "--agent", "scored-pick", "--max-steps", "5"),
              "--max-steps")


def test_autoscaling_tune_still_names_its_baselines():
    from click.testing import CliRunner

    from samm.cli.main import cli

    r = CliRunner().invoke(cli, ["tune", "--agent", "lstm-ppo"])
    assert r.exit_code == 2 and "'lstm-ppo' is not a tunable baseline of autoscaling" in r.output
    assert "threshold, target-tracking, queue" in r.output


# --- 3. a target's value shown on the side it was judged on --------------------------------------

@pytest.mark.parametrize("value, goal, digits, shown", [
    (0.14996, ">= 0.15", 4, 0.14996),          # not met: was shown 0.15
    (0.100004, "<= 0.10", 4, 0.100004),        # not met: was shown 0.1
    (1.00004, "> 1.0 x best heuristic", 4, 1.00004),  # met: was shown 1.0
    (1800.04, "<= 1800", 1, 1800.04),
    (0.1499999999999999, ">= 0.15", 4, 0.1499999999999999),
])
def test_a_borderline_value_keeps_the_digits_that_put_it_on_its_side_of_the_goal(value, goal, digits, shown):
    assert shown_value(value, goal, digits) == shown


def test_the_verdict_decides_which_borderline_needs_more_digits():
    # the placement experiment judges ">= 0" with a tolerance (v >= -1e-12): a rounding that
    # reads as met where it was met keeps its places
    assert shown_value(-1e-13, ">= 0", 5, met=True) == 0.0
    assert Target("t", -1e-13, ">= 0", True, digits=5).to_json()["value"] == 0.0
    # a ratio above 1.3 whose constraint was broken: rounding does not cross the bound, nothing to add
    assert shown_value(1.30004, ">= 1.3 and constraint met", 3, met=False) == 1.3
    # a ratio just under 1.3, not met: 1.3 would read as met on the ratio
    assert shown_value(1.29996, ">= 1.3 and constraint met", 3, met=False) == 1.29996


@pytest.mark.parametrize("value, goal, digits", [(0.123456, ">= 0.15", 4), (0.15004, ">= 0.15", 4),
                                                  (-0.0123456, ">= 0", 5), (3.14159, "<= 450 s", 2),
                                                  (1.23456, ">= 1.3 and constraint met", 3)])
def test_a_value_away_from_the_bound_is_rounded_as_before(value, goal, digits):
    assert shown_value(value, goal, digits) == round(value, digits)  # recorded summaries do not move


def test_values_without_digits_or_numbers_pass_as_they_are():
    for v in (None, True, 5, float("nan"), "x"):
        got = Target("t", v, ">= 1", False, digits=3).to_json()["value"]
        assert got is v or (isinstance(v, float) and np.isnan(got))
    assert Target("t", 0.123456, ">= 1", False).to_json() == {"name": "t", "value": 0.123456, "goal": ">= 1",
                                                             "met": False}


def test_an_experiments_target_reads_as_it_was_judged():
    """The placement experiment's 400-container plan time: 60.0004 s is not within 60 s, and its
    summary said "60.0 | <= 60 s | no"."""
    from agents.lra_placement import experiment as ex
    from agents.report import validate_summary

    targets, _ = ex.compute_targets({}, {ex.PER_BATCH: [{"seconds": 450.004, "violations": 0, "invalid": 0}]},
                                    policy_400={"seconds": 60.0004})
    rows = {t["goal"]: t for t in (t.to_json() for t in targets)}
    assert rows["<= 60 s"]["value"] == 60.0004 and rows["<= 60 s"]["met"] is False
    assert rows["<= 450 s"]["value"] == 450.004 and rows["<= 450 s"]["met"] is False
    assert validate_summary({"schema": "samm.experiment/1", "problem": "p", "paper": {}, "setting": {}, "methods": {},
                             "paper_figures": {}, "targets": list(rows.values()), "figures": []}) == []


@pytest.mark.parametrize("value, goal, met, text", [(0.14996, ">= 0.15", False, "+14.996%"),
                                                    (0.100004, "<= 0.10", False, "+10.0004%"),
                                                    (0.153, ">= 0.15", True, "+15.3%"), (-0.0234, "<= 0.10", True, "-2.3%"),
                                                    (None, ">= 0.15", False, "–")])
def test_the_paper_reports_verdict_line_shows_the_percentages_as_judged(value, goal, met, text):
    """report.md's "LSTM-PPO vs tuned threshold: +15.0% lower total cost ... met: False"."""
    from agents.experiment import _judged_pct

    assert _judged_pct(Target("t", value, goal, met, digits=4)) == text


def test_the_reclaimer_reports_target_rows_keep_the_places_their_verdict_needs():
    """Its report rendered every target value with 3 places: -69.9996 % against "<= -70 %" read
    "-70.000 | NO"."""
    from agents.report import judged_places

    assert format(-69.9996, f".{judged_places(-69.9996, '<= -70 %', 3, False)}f") == "-69.9996"
    assert judged_places(-75.123456, "<= -70 %", 3) == 3 and judged_places(None, "<= -70 %", 3) == 3
    assert judged_places(0.0100001, "<= min(AutoScale's, Sinan-style's, 0.01)", 3) == 3  # no bound to read
