"""Second audit of `samm experiment ...` and their shared reporting (agents/report.py): malformed
summaries the validator passed, output folders that are files or hold an earlier run's report, the
paper experiment's late check of its --out, `--merge` of runs on other test episodes or seeds, and
report lines that misstated a goal or printed "nan"/"0k". Each test failed before its fix."""
from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import replace

import pytest
from click.testing import CliRunner

from agents import report
from samm.cli.main import cli

GOOD = {"schema": report.SCHEMA, "problem": "x", "paper": {}, "setting": {}, "methods": {}, "paper_figures": {},
        "targets": [], "figures": []}


def _experiment(*args: str):
    return CliRunner().invoke(cli, ["experiment", *args])


# --- validate_summary ---------------------------------------------------------------------------------
def test_validate_summary_names_a_summary_that_is_not_an_object():
    """A summary.json holding a list raised TypeError (list indices must be integers) from the validator."""
    assert report.validate_summary(["schema", "problem"]) == ["summary: want a JSON object, got list"]


@pytest.mark.parametrize("change, problem", [
    ({"methods": {"m": {"score": {"mean": "0.9", "std": 0.1, "n": 5}}}}, "methods.m.score"),
    ({"methods": {"m": {"score": {"mean": 0.9, "std": [0.1], "n": 5}}}}, "methods.m.score"),
    ({"methods": {"m": {"score": {"mean": 0.9, "std": 0.1, "n": -1}}}}, "methods.m.score"),
    ({"methods": {"m": {"score": {"mean": 0.9, "std": 0.1, "n": True}}}}, "methods.m.score"),
    ({"targets": [{"name": None, "value": 1.0, "goal": ">= 1", "met": True}]}, "targets[0]"),
    ({"targets": [{"name": "t", "value": 1.0, "goal": 1.3, "met": True}]}, "targets[0]"),
    ({"figures": "curve.png"}, "figures"),
    ({"figures": [3]}, "figures"),
    ({"paper": ["title"]}, "paper"),
    ({"setting": None}, "setting"),
    ({"paper_figures": "none"}, "paper_figures"),
    ({"problem": 7}, "problem"),
])
def test_validate_summary_refuses_malformed_values(change, problem):
    """Each of these passed as [] (only the keys were checked): fmt then raised on a string mean, and a
    report's 'figures' loop wrote one image per character of a string."""
    found = report.validate_summary({**GOOD, **change})
    assert len(found) == 1 and found[0].startswith(problem), found


def test_validate_summary_still_takes_what_stats_and_targets_write():
    ok = {**GOOD, "methods": {"m": {"a": report.stats([1.0, 2.0]), "b": report.stats([]),
                                    "c": {"mean": 1, "std": None, "n": 1}}},
          "targets": [report.Target("t", None, ">= 1", False).to_json(), report.Target("u", True, "true", True).to_json()],
          "figures": ["a.png"]}
    assert report.validate_summary(ok) == []
    assert report.validate_summary(json.loads(json.dumps(ok))) == []


# --- output folders -----------------------------------------------------------------------------------
def test_an_out_that_is_a_file_is_named_as_such(tmp_path):
    """prepare_out said '[Errno 17] File exists: ...' (or Errno 20 for a path under a file)."""
    from agents.deferrable_jobs.experiment import run

    afile = tmp_path / "results.txt"
    afile.write_text("keep me")
    for out in (afile, afile / "sub"):
        with pytest.raises(OSError, match=f"output folder {out} is a file"):
            report.prepare_out(out)
    with pytest.raises(OSError, match="is a file"):
        run(afile / "sub", quick=True, seeds=[1], variants=["osdec"], workers=1, progress=False)
    assert afile.read_text() == "keep me"


def test_a_rerun_that_fails_part_way_leaves_no_report_that_looks_like_its_own(tmp_path):
    """Only summary.json was moved aside: the earlier run's report.md stayed in the folder of a run
    that failed, read as that run's results."""
    from agents.microservice_cores.experiment import run

    out = tmp_path / "out"
    run(out, quick=True, seeds=[1], methods=["autoscale"], workers=1, progress=False)
    earlier = (out / "report.md").read_text()
    broken = tmp_path / "policy"
    broken.mkdir()
    (broken / "metadata.json").write_text("{not json")
    with pytest.raises(ValueError, match="metadata.json"):
        run(out, quick=True, seeds=[1], methods=["reclaimer"], workers=1, progress=False,
            policy_dirs={"chain3": str(broken)})
    assert not (out / "report.md").exists() and not (out / "summary.json").exists()
    assert (out / "report.previous.md").read_text() == earlier


@pytest.fixture
def unwritable_dir(tmp_path):
    """A folder nobody may create a file in: immutable (root ignores permission bits), else read-only."""
    d = tmp_path / "locked"
    d.mkdir()
    immutable = shutil.which("chattr") and subprocess.run(["chattr", "+i", str(d)], capture_output=True).returncode == 0
    if not immutable:
        d.chmod(0o555)
    try:
        try:
            (d / "probe").write_bytes(b"")
        except OSError:
            pass
        else:
            (d / "probe").unlink()
            pytest.skip("cannot make a folder unwritable here")
        yield d
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(d)], check=False)
        d.chmod(0o755)


def test_paper_experiment_refuses_an_unwritable_out_before_tuning(unwritable_dir, monkeypatch):
    """`samm experiment paper --policy DIR` tuned the three rules and evaluated every agent (hours with
    the suite), then failed writing summary.json into an --out that could take no file."""
    import agents.experiment as paper

    def tuning_ran(*_a, **_k):
        raise AssertionError("the baselines were tuned before the --out was checked")

    monkeypatch.setattr(paper, "tune", tuning_ran)
    res = _experiment("paper", "--out", str(unwritable_dir), "--policy", "agents/policies/lstm-ppo-paper",
                      "--no-swf", "--quiet")
    assert res.exit_code == 2, res.output
    assert f"output folder {unwritable_dir} is not writable" in res.output and "Traceback" not in res.output


def test_paper_experiment_moves_an_earlier_summary_aside_only_when_it_starts(tmp_path, monkeypatch):
    """A paper run that stopped part-way left the earlier run's summary.json and report.md as its own; a
    run refused at its checks (a training run already in --out) must leave them where they were."""
    import agents.experiment as paper

    class Stop(Exception):
        pass

    def tuning_ran(*_a, **_k):
        raise Stop

    monkeypatch.setattr(paper, "tune", tuning_ran)
    (tmp_path / "summary.json").write_text("{}")
    (tmp_path / "report.md").write_text("# earlier")
    (tmp_path / "train").mkdir()
    from agents.ppo.train import CHECKPOINT_FILE

    (tmp_path / "train" / CHECKPOINT_FILE).write_bytes(b"x")
    with pytest.raises(ValueError, match="already holds a training run"):
        paper.run_paper_experiment(tmp_path, None, seeds=[1], tune_seeds=[101], swf=False, progress=False)
    assert (tmp_path / "summary.json").read_text() == "{}" and (tmp_path / "report.md").exists()
    with pytest.raises(Stop):     # the work starts: the earlier run's files are set aside
        paper.run_paper_experiment(tmp_path, "agents/policies/lstm-ppo-paper", seeds=[1], tune_seeds=[101],
                                   swf=False, progress=False)
    assert not (tmp_path / "summary.json").exists() and not (tmp_path / "report.md").exists()
    assert (tmp_path / "summary.previous.json").read_text() == "{}"
    assert (tmp_path / "report.previous.md").read_text() == "# earlier"


# --- osdec: --merge and the report ---------------------------------------------------------------------
def _osdec_folder(path, **setting):
    from agents.deferrable_jobs.experiment import METRICS

    path.mkdir()
    runs = [{"setting": "tiny", "variant": "ppo", "seed": 1, "train_seconds": 1.0, "curve": [],
             **{k: 1.0 for k in METRICS}}]
    (path / "runs.json").write_text(json.dumps(runs))
    base = {"table1_setting": "tiny", "test_episodes": 4, "seeds": [1], "steps_per_run": 4096}
    (path / "summary.json").write_text(json.dumps({"setting": {**base, **setting}}))
    return path


@pytest.mark.parametrize("setting, words", [({"test_episodes": 100}, "test_episodes 100 (this run: 4)"),
                                            ({"seeds": [1, 2, 3]}, "seeds [1, 2, 3] (this run: [1])"),
                                            ({"table1_setting": "default"}, "table1_setting 'default'")])
def test_osdec_merge_refuses_runs_on_other_test_episodes_or_seeds(tmp_path, setting, words):
    """Rows of a run tested on 100 episodes (or other seeds, or the full setting) were merged beside
    rows and heuristics tested on 4, in one table and one set of targets, nothing said."""
    from agents.deferrable_jobs.experiment import _merged_runs, run

    other = _osdec_folder(tmp_path / "other", **setting)
    with pytest.raises(ValueError, match=r"--merge .*other: run with other " + words.replace("[", r"\[")
                       .replace("]", r"\]").replace("(", r"\(").replace(")", r"\)")):
        run(tmp_path / "out", quick=True, seeds=[1], variants=["osdec"], workers=1, progress=False, merge=[str(other)])
    assert not (tmp_path / "out").exists()         # refused before the heuristics and the training
    res = _experiment("osdec", "--out", str(tmp_path / "cli"), "--quick", "--seeds", "1", "--variants", "osdec",
                      "--workers", "1", "--quiet", "--merge", str(other))
    assert res.exit_code == 2 and "run with other" in res.output and "Traceback" not in res.output
    from agents.deferrable_jobs.experiment import QUICK

    same = _osdec_folder(tmp_path / "same")      # the same test episodes and seeds: other steps are fine
    assert _merged_runs(same, replace(QUICK, seeds=(1,), steps=999), "tiny")[0]["steps"] == 4096


def _osdec_summary(settings, rewards, steps=4096):
    from agents.deferrable_jobs import experiment as dj

    metrics = {k: 1.0 for k in dj.METRICS}
    heur = {s: {"fifo": {**metrics, "total_reward": 100.0, "params": {}}} for s in settings}
    runs = [{"setting": s, "variant": "osdec", "seed": 1, "train_seconds": 1.0, "curve": [], "steps": steps,
             **metrics, "total_reward": r} for s, r in zip(settings, rewards)]
    return dj._summarise(runs, heur, replace(dj.QUICK, settings=tuple(settings)), settings[0], [], 1.0, True)


def test_osdec_table4_goal_says_what_was_judged():
    """With three Table 4 settings run, the goal read '>= 5 of 3' (unmeetable) beside met: true at 3."""
    summary = _osdec_summary(["core1", "core2", "core3"], [110.0, 120.0, 130.0])
    t4 = next(t for t in summary["targets"] if "Table 4" in t["name"])
    assert t4 == {"name": "osdec: Table 4 settings where it beats every heuristic", "value": 3,
                  "goal": ">= 3 of 3", "met": True}
    full = _osdec_summary(["core1", "core2", "core3", "dur1", "dur2", "dur3"], [110.0] * 4 + [90.0] * 2)
    assert next(t for t in full["targets"] if "Table 4" in t["name"])["goal"] == ">= 5 of 6"   # as recorded


def test_osdec_report_names_a_run_of_under_a_thousand_steps():
    """`--steps 512` labelled every learned row '(0k steps)'."""
    from agents.deferrable_jobs.experiment import _report

    assert "| osdec (512 steps) |" in _report(_osdec_summary(["tiny"], [110.0], steps=512))
    assert "| osdec (40k steps) |" in _report(_osdec_summary(["tiny"], [110.0], steps=40_960))


# --- reclaimer: a relative figure without a scale -------------------------------------------------------
def test_reclaimer_relative_figure_against_a_zero_baseline_is_unknown_not_nan():
    """A baseline at 0 mean cores gave NaN: report.md printed '+nan %' and the target 'nan'."""
    from agents.microservice_cores import experiment as mc

    def row(cores):
        return {"mean_cores": cores, "mean_cores_std": 0.0, "max_cores": cores, "mean_used": 0.0,
                "p99_mean_ms": 5.0, "p99_max_ms": 5.0, "violation_rate": 0.0, "violating_seconds": 0,
                "seconds": 60, "episodes": 1, "per_seed": {"mean_cores": [cores], "violation_rate": [0.0]}}

    results = {"hotel": {"10.0": {"reclaimer": row(2.0), "autoscale": row(0.0), "sinan": row(4.0)}}}
    summary = mc._summarise(results, {}, mc.QUICK, 1.0)
    rel = summary["apps"]["hotel"]["relative"]
    assert rel["mean_vs_autoscale"] is None and rel["mean_vs_sinan"] == -50.0
    target = next(t for t in summary["targets"] if "AutoScale" in t["name"])
    assert target["value"] is None and target["met"] is False
    text = mc._report(summary)
    assert "nan %" not in text and "| nan |" not in text
    assert "| AutoScale, mean cores | – | -38.4 % |" in text and "| Sinan, mean cores | -50.0 % | -27.5 % |" in text
    assert "| hotel: mean cores vs AutoScale <= -38.4 % | – | NO |" in text


def test_reclaimer_summary_follows_the_shared_schema(tmp_path):
    """docs/experiment-summary.md: every experiment writes the one schema. The reclaimer's summary.json
    had no `schema`, `methods`, `paper_figures` nor `figures`, and its targets no `goal`."""
    from agents.microservice_cores.experiment import run

    summary = run(tmp_path, quick=True, seeds=[1, 2], methods=["autoscale", "static-max"], workers=1,
                  progress=False)
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert report.validate_summary(summary) == [] and report.validate_summary(on_disk) == []
    level = next(iter(on_disk["apps"]["chain3"]["levels"]))
    row = on_disk["apps"]["chain3"]["levels"][level]["autoscale"]
    st = on_disk["methods"][f"chain3/{level}/autoscale"]["mean_cores"]
    assert st["n"] == 2 and st["mean"] == pytest.approx(row["mean_cores"]) and st["std"] == pytest.approx(
        row["mean_cores_std"])
    assert on_disk["figures"] == ["cores-chain3.png", "latency-cdf-chain3.png"]
    assert all((tmp_path / f).is_file() for f in on_disk["figures"])
    assert on_disk["seeds"] == [1, 2] and on_disk["experiment"] == "reclaimer"     # its own keys as before


def test_reclaimer_experiment_of_an_application_given_as_a_topology_file(tmp_path):
    """`--apps my/app.yaml` (load_topology takes a file) ran every cell, then failed writing
    'cores-/.../app.yaml.png': no report.md, and the whole run's work lost to a traceback-like line."""
    from agents.microservice_cores.topology import TOPOLOGY_DIR

    mine = tmp_path / "topologies" / "mychain.yaml"
    mine.parent.mkdir()
    mine.write_text((TOPOLOGY_DIR / "chain3.yaml").read_text())
    out = tmp_path / "out"
    res = _experiment("reclaimer", "--out", str(out), "--quick", "--seeds", "1", "--apps", str(mine), "--methods",
                      "autoscale", "--workers", "1", "--quiet")
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["figures"] == ["cores-mychain.png", "latency-cdf-mychain.png"]
    assert all((out / f).stat().st_size > 1000 for f in summary["figures"])
    assert "![cores](cores-mychain.png)" in (out / "report.md").read_text()
    other = tmp_path / "elsewhere" / "mychain.yaml"      # two files of one name: one's figures over the other's
    other.parent.mkdir()
    other.write_text(mine.read_text())
    res = _experiment("reclaimer", "--out", str(tmp_path / "two"), "--quick", "--seeds", "1", "--apps",
                      f"{mine},{other}", "--methods", "autoscale", "--workers", "1", "--quiet")
    assert res.exit_code == 2 and "share a file name" in res.output and not (tmp_path / "two").exists()


# --- a value given twice ---------------------------------------------------------------------------------
@pytest.mark.parametrize("verb, args, words", [
    ("osdec", ["--seeds", "1,1", "--variants", "osdec"], "names 1 more than once"),
    ("osdec", ["--seeds", "1", "--variants", "osdec,ppo,osdec"], "variants names 'osdec' more than once"),
    ("osdec", ["--seeds", "1", "--variants", "osdec", "--settings", "tiny,tiny"], "settings names 'tiny' more"),
    ("reclaimer", ["--seeds", "2,1,2", "--methods", "autoscale"], "names 2 more than once"),
    ("reclaimer", ["--seeds", "1", "--apps", "chain3,chain3", "--methods", "autoscale"], "apps names 'chain3' more"),
    ("c2marl", ["--seeds", "1,1", "--episodes", "2", "--test-episodes", "1", "--held-apart-only"],
     "names 1 more than once"),
])
def test_a_seed_variant_setting_or_app_given_twice_is_refused_before_the_work(tmp_path, verb, args, words):
    """`--seeds 1,1` trained (or ran) seed 1 twice and reported the row as n = 2 with std 0; a setting
    given twice counted twice in 'Table 4 settings where it beats every heuristic' (2 of 2 for one)."""
    out = tmp_path / "out"
    res = _experiment(verb, "--out", str(out), "--quick", "--workers", "1", "--quiet", *args)
    assert res.exit_code == 2 and words in res.output and "Traceback" not in res.output, res.output
    assert not out.exists()


def test_paper_experiment_refuses_a_seed_given_twice(tmp_path, monkeypatch):
    import agents.experiment as paper

    def tuning_ran(*_a, **_k):
        raise AssertionError("the baselines were tuned")

    monkeypatch.setattr(paper, "tune", tuning_ran)
    for flags, words in ((["--seeds", "1,2,1"], "--seeds: '1,2,1' names 1 more than once"),
                         (["--tune-seeds", "101,101"], "--tune-seeds: '101,101' names 101 more than once")):
        res = _experiment("paper", "--out", str(tmp_path / "out"), "--policy", "agents/policies/lstm-ppo-paper",
                          "--no-swf", "--quiet", *flags)
        assert res.exit_code == 2 and words in res.output, res.output
        assert not (tmp_path / "out").exists()


# --- a target without a value ----------------------------------------------------------------------------
def test_a_target_without_a_value_reads_as_unknown_in_report_md(tmp_path):
    """osdec printed 'None (> 1.0 x best heuristic)' for a run whose every seed's reward was NaN, and
    c2marl 'None' in its targets table when no baseline was safe on the test days."""
    import math

    from agents.deferrable_jobs.experiment import _report as osdec_report
    from agents.oversubscription.experiment import _report as c2marl_report

    text = osdec_report(_osdec_summary(["tiny"], [math.nan]))
    assert "osdec: total reward above every heuristic on tiny (best: fifo): – (> 1.0 x best heuristic) — NOT met" \
        in text and "None" not in text
    summary = {"setting": {}, "figures": [], "targets": [report.Target(
        "tiny-cold: C2MARL-0.95 S-Cores / best safe baseline (None)", None, ">= 1.3 and constraint met",
        False).to_json()]}
    c2marl_report(tmp_path, [], summary)
    assert "| tiny-cold: C2MARL-0.95 S-Cores / best safe baseline (None) | – | >= 1.3 and constraint met | NO |" in (
        tmp_path / "report.md").read_text()
