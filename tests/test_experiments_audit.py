"""Audit of `samm experiment lra|c2marl|osdec|reclaimer`: bad option values are one line naming the
option before any work (not a silent default, not a traceback after the training), an --out that
cannot take a file is refused before the work (not after it, losing the run), and summary.json is
strict JSON (no NaN) written whole."""
from __future__ import annotations

import json
import math
import shutil
import subprocess

import pytest
from click.testing import CliRunner

from agents.report import Target, experiment_summary, prepare_out, write_json, write_summary
from samm.cli.main import cli

# the smallest runs: each would take seconds to minutes if a refused value were taken as valid
C2MARL_SMALL = ["--quick", "--seeds", "1", "--episodes", "2", "--test-episodes", "1", "--held-apart-only",
                "--workers", "1", "--quiet"]
OSDEC_SMALL = ["--quick", "--seeds", "1", "--variants", "osdec", "--workers", "1", "--quiet"]
RECLAIMER_SMALL = ["--quick", "--seeds", "1", "--methods", "autoscale", "--workers", "1", "--quiet"]


def _experiment(*args: str):
    return CliRunner().invoke(cli, ["experiment", *args])


def _strict_json(text: str):
    """json.loads refusing NaN and infinities, as strict JSON readers (JavaScript, jq) do."""
    def refuse(name):
        raise ValueError(f"not JSON: {name}")
    return json.loads(text, parse_constant=refuse)


# --- summary.json -------------------------------------------------------------------------------
def test_summary_with_a_nan_is_written_as_strict_json_with_null(tmp_path):
    summary = experiment_summary("lra-placement", {"title": "t", "file": "f"}, {"seeds": [1]},
                                 {"m": {"score": [1.0, float("nan")]}}, {},
                                 [Target("worst ratio", float("nan"), ">= 0.98", False)],
                                 agent_variants={"m": {"worst_ratio_to_optimum": math.nan, "gap": float("inf")}})
    write_summary(tmp_path, summary)
    on_disk = _strict_json((tmp_path / "summary.json").read_text())
    assert on_disk["targets"][0]["value"] is None
    assert on_disk["agent_variants"]["m"] == {"worst_ratio_to_optimum": None, "gap": None}
    assert on_disk["methods"]["m"]["score"] == {"mean": 1.0, "std": 0.0, "n": 1}
    assert not (tmp_path / "summary.json.tmp").exists()


def test_write_json_keeps_numpy_values_and_finite_numbers_as_they_are(tmp_path):
    import numpy as np

    obj = {"a": np.float64(0.25), "b": np.int64(3), "c": np.array([1.5, np.nan]), "d": (1, "x"), "e": np.bool_(True)}
    write_json(tmp_path / "x.json", obj)
    assert _strict_json((tmp_path / "x.json").read_text()) == {"a": 0.25, "b": 3, "c": [1.5, None], "d": [1, "x"],
                                                                 "e": True}


# --- an --out that cannot take a file -------------------------------------------------------------
@pytest.fixture
def unwritable_dir(tmp_path):
    """A folder nobody may create a file in: immutable (root ignores permission bits), else read-only."""
    d = tmp_path / "locked"
    d.mkdir()
    immutable = shutil.which("chattr") and subprocess.run(["chattr", "+i", str(d)], capture_output=True).returncode == 0
    if not immutable:
        d.chmod(0o555)
    try:
        probe = d / "probe"
        try:
            probe.write_bytes(b"")
        except OSError:
            pass
        else:
            probe.unlink()
            pytest.skip("cannot make a folder unwritable here")
        yield d
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(d)], check=False)
        d.chmod(0o755)


@pytest.mark.parametrize("verb, args", [
    ("lra", ["--quick", "--seeds", "1", "--predictor", "synthetic", "--quiet"]),
    ("c2marl", C2MARL_SMALL),
    ("osdec", OSDEC_SMALL),
    ("reclaimer", RECLAIMER_SMALL),
])
def test_an_unwritable_out_is_refused_before_the_work(unwritable_dir, verb, args):
    res = _experiment(verb, "--out", str(unwritable_dir), *args)
    assert res.exit_code == 2, res.output
    assert f"output folder {unwritable_dir} is not writable" in res.output
    assert "Traceback" not in res.output
    assert list(unwritable_dir.iterdir()) == []


def test_prepare_out_makes_the_folder_and_leaves_nothing_in_it(tmp_path):
    out = prepare_out(tmp_path / "a" / "b")
    assert out.is_dir() and list(out.iterdir()) == []


# --- c2marl ---------------------------------------------------------------------------------------
def test_c2marl_refuses_an_unknown_case_beside_a_known_one(tmp_path):
    from agents.oversubscription.experiment import run

    with pytest.raises(ValueError, match=r"unknown case \['bogus'\]"):
        run(tmp_path / "x", quick=True, seeds=[1], episodes=2, test_episodes=1, workers=1, progress=False,
            held_apart_only=True, cases=["tiny-cold", "bogus"])
    assert not (tmp_path / "x").exists()
    res = _experiment("c2marl", "--out", str(tmp_path / "y"), *C2MARL_SMALL, "--cases", "tiny-cold,bogus")
    assert res.exit_code == 2 and "unknown case ['bogus']" in res.output


@pytest.mark.parametrize("field, value", [("episodes", 0), ("episodes", -3), ("test_episodes", 0),
                                          ("test_episodes", -1)])
def test_c2marl_refuses_a_count_below_one(tmp_path, field, value):
    from agents.oversubscription.experiment import run

    kw = {"episodes": 2, "test_episodes": 1, field: value}
    with pytest.raises(ValueError, match=f"{field} must be at least 1, not {value}"):
        run(tmp_path / "x", quick=True, seeds=[1], workers=1, progress=False, held_apart_only=True, **kw)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("flag, value", [("--episodes", "-3"), ("--test-episodes", "0"), ("--workers", "0")])
def test_c2marl_cli_refuses_a_count_below_one(tmp_path, flag, value):
    res = _experiment("c2marl", "--out", str(tmp_path / "x"), *C2MARL_SMALL, flag, value)
    assert res.exit_code == 2 and flag in res.output
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("flag, value, error", [("--alphas", ",", "--alphas names no safety level"),
                                                ("--alphas", "", "--alphas names no safety level"),
                                                ("--cases", "", "unknown case ['']")])
def test_c2marl_cli_refuses_a_list_naming_nothing(tmp_path, flag, value, error):
    res = _experiment("c2marl", "--out", str(tmp_path / "x"), *C2MARL_SMALL, flag, value)
    assert res.exit_code == 2 and error in res.output
    assert not (tmp_path / "x").exists()


# --- osdec ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("field, value", [("steps", 0), ("steps", -5), ("test_episodes", 0), ("test_episodes", -1)])
def test_osdec_refuses_a_count_below_one(tmp_path, field, value):
    from agents.deferrable_jobs.experiment import run

    with pytest.raises(ValueError, match=f"{field} must be at least 1, not {value}"):
        run(tmp_path / "x", quick=True, seeds=[1], variants=["osdec"], workers=1, progress=False, **{field: value})
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("flag, value", [("--steps", "0"), ("--test-episodes", "-1"), ("--workers", "0"),
                                         ("--variants", ","), ("--settings", ",")])
def test_osdec_cli_refuses_a_bad_count_or_an_empty_list(tmp_path, flag, value):
    res = _experiment("osdec", "--out", str(tmp_path / "x"), *OSDEC_SMALL, flag, value)
    assert res.exit_code == 2 and flag in res.output
    assert "Traceback" not in res.output
    assert not (tmp_path / "x").exists()


def test_osdec_merge_of_an_unfinished_folder_is_refused_before_the_training(tmp_path):
    from agents.deferrable_jobs.experiment import run

    empty = tmp_path / "empty"
    empty.mkdir()
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "runs.json").write_text("[{\"setting\": \"tiny\"}]")
    (corrupt / "summary.json").write_text("{}")
    for folder in (empty, corrupt):
        with pytest.raises(ValueError, match=f"--merge {folder}: not a finished"):
            run(tmp_path / "out", quick=True, seeds=[1], variants=["osdec"], workers=1, progress=False,
                merge=[str(folder)])
        assert not (tmp_path / "out").exists()       # refused before the heuristics and the training
    res = _experiment("osdec", "--out", str(tmp_path / "cli"), *OSDEC_SMALL, "--merge", str(empty))
    assert res.exit_code == 2 and f"--merge {empty}" in res.output and "Traceback" not in res.output


# --- reclaimer ------------------------------------------------------------------------------------
def test_reclaimer_refuses_a_policy_for_an_app_it_does_not_run(tmp_path):
    from agents.microservice_cores.experiment import run

    with pytest.raises(ValueError, match=r"a policy is given for \['chain33'\]"):
        run(tmp_path / "x", quick=True, seeds=[1], methods=["reclaimer"], workers=1, progress=False,
            policy_dirs={"chain33": str(tmp_path)})
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("flag, value, error", [("--train-steps", "0", "--train-steps"),
                                                ("--train-steps", "-5", "--train-steps"),
                                                ("--methods", ",", "--methods names no method"),
                                                ("--apps", "", "unknown application ''")])
def test_reclaimer_cli_refuses_a_count_below_one_or_a_list_naming_nothing(tmp_path, flag, value, error):
    res = _experiment("reclaimer", "--out", str(tmp_path / "x"), *RECLAIMER_SMALL, flag, value)
    assert res.exit_code == 2 and error in res.output
    assert not (tmp_path / "x").exists()


def test_reclaimer_summary_is_strict_json_written_whole(tmp_path):
    from agents.microservice_cores.experiment import run

    with pytest.raises(ValueError, match="train_steps must be at least 1"):
        run(tmp_path / "x", quick=True, seeds=[1], methods=["autoscale"], train_steps=0, progress=False)
    summary = run(tmp_path, quick=True, seeds=[1], methods=["autoscale"], workers=1, progress=False)
    on_disk = _strict_json((tmp_path / "summary.json").read_text())
    assert on_disk["apps"]["chain3"]["overall"] == json.loads(json.dumps(summary["apps"]["chain3"]["overall"]))
    assert not (tmp_path / "summary.json.tmp").exists()


def test_quick_runs_take_seeds_1_to_5_when_typed(tmp_path):
    """--seeds 1-5 typed with --quick was taken for the option's default and silently cut to 1,2."""
    res = _experiment("reclaimer", "--out", str(tmp_path / "typed"), "--quick", "--seeds", "1-5", "--methods",
                      "autoscale", "--workers", "1", "--quiet")
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "typed" / "summary.json").read_text())["seeds"] == [1, 2, 3, 4, 5]
    res = _experiment("reclaimer", "--out", str(tmp_path / "default"), "--quick", "--methods", "autoscale",
                      "--workers", "1", "--quiet")
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "default" / "summary.json").read_text())["seeds"] == [1, 2]


def test_a_rerun_that_fails_part_way_leaves_no_summary_that_looks_like_its_own(tmp_path):
    """The earlier run's summary.json is kept as summary.previous.json; the failed run writes none."""
    from agents.microservice_cores.experiment import run

    out = tmp_path / "out"
    run(out, quick=True, seeds=[1], methods=["autoscale"], workers=1, progress=False)
    earlier = (out / "summary.json").read_text()
    broken = tmp_path / "policy"
    broken.mkdir()
    (broken / "metadata.json").write_text("{not json")
    with pytest.raises(ValueError, match="metadata.json"):
        run(out, quick=True, seeds=[1], methods=["reclaimer"], workers=1, progress=False,
            policy_dirs={"chain3": str(broken)})
    assert not (out / "summary.json").exists()
    assert (out / "summary.previous.json").read_text() == earlier
    run(out, quick=True, seeds=[1], methods=["autoscale"], workers=1, progress=False)    # a finished run writes one
    assert json.loads((out / "summary.json").read_text())["seeds"] == [1]


def test_many_workers_start_no_more_processes_than_cells(tmp_path):
    """A fork-started pool starts all its workers at once: --workers 16 for 2 cells forked 16 processes."""
    import threading

    import psutil

    from agents.microservice_cores.experiment import run

    me, most, done = psutil.Process(), [0], threading.Event()
    # a pytest worker may already hold children of its own (a session's JVM, Graphite, PostgreSQL)
    before = {p.pid for p in me.children(recursive=True)}

    def watch():
        while not done.wait(0.05):
            most[0] = max(most[0], len({p.pid for p in me.children()} - before))
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        run(tmp_path, quick=True, seeds=[1], methods=["autoscale"], workers=16, progress=False)
    finally:
        done.set()
        watcher.join()
    assert 0 < most[0] <= 2


def test_a_refused_run_leaves_the_earlier_summary_where_it_was(tmp_path):
    """summary.json is moved aside only by a run that starts its work, not by one refused at its checks."""
    from agents.deferrable_jobs.experiment import run as osdec
    from agents.microservice_cores.experiment import run as reclaimer
    from agents.oversubscription.experiment import run as c2marl

    (tmp_path / "summary.json").write_text("{}")
    (tmp_path / "policies").mkdir()      # --policies naming the --out's own policies: refused
    refused = [lambda: osdec(tmp_path, quick=True, settings=["bogus"], progress=False),
               lambda: reclaimer(tmp_path, quick=True, apps=["bogus"], progress=False),
               lambda: c2marl(tmp_path, quick=True, seeds=[1], progress=False, policies=tmp_path)]
    for call in refused:
        with pytest.raises(ValueError):
            call()
        assert (tmp_path / "summary.json").read_text() == "{}"
        assert not (tmp_path / "summary.previous.json").exists()
