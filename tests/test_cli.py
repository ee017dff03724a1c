"""The `samm` command line."""
import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from samm.cli.main import cli


def all_commands(group, prefix=()):
    import click

    for name, cmd in group.commands.items():
        yield prefix + (name,)
        if isinstance(cmd, click.Group):
            yield from all_commands(cmd, prefix + (name,))


def test_every_verb_has_help():
    runner = CliRunner()
    verbs = list(all_commands(cli))
    assert ("sim", "run") in verbs and ("sim", "bench") in verbs and ("demo",) in verbs
    # the spelling of each problem's testbed, beside the hyphenated verbs
    assert {("testbed", "microservices"), ("testbed", "oversub"), ("testbed", "deferrable"),
            ("testbed-microservices",)} <= set(verbs)
    for verb in [()] + verbs:
        res = runner.invoke(cli, [*verb, "--help"])
        assert res.exit_code == 0, (verb, res.output)
        assert "Usage:" in res.output


def test_seed_lists_parse_as_ranges_or_commas_and_bad_ones_are_clear_errors():
    from samm.cli.seeds import parse_seeds

    assert parse_seeds("1-5") == [1, 2, 3, 4, 5] and parse_seeds("6,9") == [6, 9] and parse_seeds("7") == [7]
    with pytest.raises(ValueError):
        parse_seeds("a-b")
    r = CliRunner().invoke(cli, ["evaluate", "--agent", "threshold", "--seeds", "one,two"])
    assert r.exit_code != 0 and "--seeds must be a list" in r.output, r.output
    # these once gave [] (a run over no episodes) or silently dropped a typo
    for bad in ("5-1", "", ",", "1,,2", "1,2,", "1-", "1-2-3"):
        with pytest.raises(ValueError):
            parse_seeds(bad)
        r = CliRunner().invoke(cli, ["tune", "--agent", "threshold", "--seeds", bad])
        assert r.exit_code == 2 and "--seeds must be a list" in r.output, (bad, r.output)


def test_a_seed_given_twice_is_refused_by_every_verb():
    """`--seeds 1,1` ran one seed twice: a row of n = 2 with a std of 0, as if measured twice."""
    from samm.cli.seeds import parse_seeds

    with pytest.raises(ValueError, match="'3,1,3' names 3 more than once"):
        parse_seeds("3,1,3")
    r = CliRunner().invoke(cli, ["tune", "--agent", "threshold", "--seeds", "1,1"])
    assert r.exit_code == 2 and "names 1 more than once" in r.output, r.output


def test_console_script_is_installed():
    out = subprocess.run([sys.executable, "-m", "samm.cli.main", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and "samm" in out.stdout


def test_bad_config_is_a_clear_error_not_a_traceback(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("penalty: 3\n")
    res = CliRunner().invoke(cli, ["sim", "run", "--config", str(p), "--json"])
    assert res.exit_code == 2 and "penalty" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(cli, ["sim", "run", "--policy", "static:1,2", "--json"])
    assert res.exit_code == 2 and "static" in res.output
    res = CliRunner().invoke(cli, ["sim", "run", "--workload", "nope.swf", "--json"])
    assert res.exit_code == 2 and "nope.swf" in res.output


@pytest.mark.jvm
def test_sim_run_json_report():
    res = CliRunner().invoke(cli, ["sim", "run", "--workload", "seed-1551", "--policy", "static:10,10,10",
                                   "--action-mode", "per-type", "--seed", "3", "--json"])
    assert res.exit_code == 0, res.output
    r = json.loads(res.output)
    for key in ("steps", "terminated", "total_reward", "vm_cost", "wait_penalty", "jobs_finished", "mean_wait_s",
                "p95_wait_s", "makespan_s", "mean_allocated_cores", "mean_cpu_util", "wall_seconds"):
        assert key in r
    assert r["terminated"] and r["jobs_finished"] == 1551
    assert r["total_reward"] == pytest.approx(-(r["vm_cost"] + r["wait_penalty"]), abs=1e-4)


@pytest.mark.jvm
def test_sim_run_on_a_real_swf_window():
    from pathlib import Path

    trace = Path(__file__).resolve().parents[2] / "shared/data/pwa-swf/KTH-SP2-1996-2.1-cln.swf.gz"
    if not trace.exists():
        pytest.skip(f"{trace} not found")
    res = CliRunner().invoke(cli, ["sim", "run", "--workload", str(trace), "--window", "0:21600",
                                   "--policy", "static:4,4,4", "--action-mode", "per-type", "--json"])
    assert res.exit_code == 0, res.output
    r = json.loads(res.output)
    assert r["terminated"] and r["jobs_finished"] == r["jobs_total"] > 10


@pytest.mark.jvm
def test_evaluate_the_shipped_policy():
    res = CliRunner().invoke(cli, ["evaluate", "--agent", "lstm-ppo", "--seeds", "1,2", "--json"])
    assert res.exit_code == 0, res.output
    r = json.loads(res.output)
    assert r["agent"] == "lstm-ppo" and r["deterministic"] and len(r["episodes"]) == 2
    # the shipped policy must stay well ahead of the paper's threshold rule ($35 on seed-1551)
    assert r["summary"]["all_terminated"] and r["summary"]["total_cost"]["mean"] < 23.0


@pytest.mark.jvm
def test_promote_uses_paired_episodes(tmp_path):
    from agents.factory import make_agent
    from agents.shipped import shipped_policy_dir
    from sim_bridge.config import SimConfig

    weak = tmp_path / "weak"
    make_agent("threshold", SimConfig(), {"upper": 0.75, "lower": 0.75, "cooldown_steps": 5}).save(weak)
    live = tmp_path / "live"
    import shutil

    shutil.copytree(weak, live)
    args = ["policy", "promote", "--seeds", "1-3", "--margin", "0.05", "--max-p", "0.2"]
    res = CliRunner().invoke(cli, args + ["--candidate", str(shipped_policy_dir()), "--incumbent", str(weak),
                                          "--install", str(live)])
    assert res.exit_code == 0, res.output
    evidence = json.loads(res.output)
    assert evidence["promote"] and evidence["wins"] == 3 and len(evidence["pairs"]) == 3
    assert (live / "policy.pt").exists() and (tmp_path / "live.previous" / "metadata.json").exists()
    res = CliRunner().invoke(cli, args + ["--candidate", str(weak), "--incumbent", str(shipped_policy_dir())])
    assert res.exit_code == 3 and not json.loads(res.output)["promote"]


@pytest.mark.jvm
def test_train_on_a_workload_mix_then_refuse_a_mismatched_fine_tune(tmp_path):
    """`samm train --workload-mix FILE`: a policy on the extended features that records its mix;
    fine-tuning it with the paper's features is refused with a message naming the mismatch."""
    import yaml

    mix = tmp_path / "mix.yaml"
    mix.write_text(yaml.safe_dump({"name": "cli-tiny", "load": [0.3, 0.6], "span_h": [0.5, 1.0], "max_jobs": 200,
                                   "sources": [{"kind": "batch", "weight": 1.0, "batches": [2, 3],
                                                "run_s": [60.0, 240.0]}]}))
    ppo = json.dumps({"num_steps": 32, "bptt_chunk": 8, "num_minibatches": 2})
    res = CliRunner().invoke(cli, ["train", "--workload-mix", str(mix), "--timesteps", "256", "--envs", "4",
                                   "--validation", "1", "--eval-every", "1", "--ppo", ppo, "--out",
                                   str(tmp_path / "run"), "--quiet"])
    assert res.exit_code == 0, res.output
    meta = json.loads((tmp_path / "run" / "policy" / "metadata.json").read_text())
    assert len(meta["feature_names"]) == 18 and meta["training"]["workload_mix"] == "cli-tiny"
    assert meta["training"]["reward"] == "waste" and meta["training"]["ppo"]["max_episode_steps"] == 600
    res = CliRunner().invoke(cli, ["train", "--init-policy", str(tmp_path / "run" / "policy"), "--features", "paper",
                                   "--workload", "seed-1551-short", "--timesteps", "256", "--envs", "4", "--ppo", ppo,
                                   "--out", str(tmp_path / "ft"), "--quiet"])
    assert res.exit_code != 0 and "features" in res.output


def test_workload_mix_with_a_test_trace_is_refused(tmp_path):
    import yaml

    mix = tmp_path / "mix.yaml"
    mix.write_text(yaml.safe_dump({"sources": [{"kind": "swf", "traces": ["KTH-SP2-1996-2.1-cln.swf.gz"]}]}))
    res = CliRunner().invoke(cli, ["train", "--workload-mix", str(mix), "--out", str(tmp_path / "x"), "--quiet"])
    assert res.exit_code != 0 and "KTH-SP2-1996-2.1-cln.swf.gz" in res.output


@pytest.mark.parametrize("args, names", [
    (["sim", "bench", "--threads", "-1"], "--threads"),
    (["sim", "bench", "--envs", "0"], "--envs"),
    (["testbed-deferrable", "--agent-param", "eps=abc"], "--agent-param"),
    (["train", "--out", "OUT", "--ppo", "[1]"], "--ppo must be a JSON object"),
    (["sim", "run", "--initial", "a,1,1"], "--initial"),
    (["run", "--config", "deploy/configs/samm.example.yaml", "--iterations", "0"], "--iterations"),
    (["serve", "--port", "0"], "--port"),
    (["collect", "--group", "S", "--interval", "inf"], "--interval"),
    (["collect", "--group", "S", "--once", "--duration", "nan"], "--duration"),
    (["testbed", "--compression", "nan"], "--compression"),
    (["reclaimer-ceiling", "--policy", "POLICY", "--out", "OUT", "--eval-seeds", "1-"], "--eval-seeds"),
    (["experiment", "paper", "--out", "OUT", "--tune-seeds", "5-1"], "--tune-seeds must be a list"),
])
def test_bad_option_values_are_usage_errors_naming_the_option(tmp_path, monkeypatch, args, names):
    """Each of these once gave a traceback, went on with a value it could not use, or named another option."""
    from pathlib import Path

    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    (tmp_path / "policy").mkdir()
    args = [str(tmp_path / "out") if a == "OUT" else str(tmp_path / "policy") if a == "POLICY" else a for a in args]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), (args, res.output, res.exception)
    assert names in res.output and "Traceback" not in res.output, res.output
    assert not (tmp_path / "out").exists()


def test_a_broken_sim_config_file_is_named_not_a_traceback(tmp_path):
    p = tmp_path / "sim.yaml"
    p.write_text("cooldown_s: [\n")
    res = CliRunner().invoke(cli, ["sim", "run", "--config", str(p), "--json"])
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit) and str(p) in res.output, res.output
