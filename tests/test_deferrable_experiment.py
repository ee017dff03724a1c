"""`samm experiment osdec --quick`: the summary follows the shared schema, the tables carry the
paper's figures beside ours, and the CLI's evaluate verb runs a heuristic on test episodes."""
from __future__ import annotations

import json

from click.testing import CliRunner

from agents.deferrable_jobs.experiment import PAPER_TABLE1, run
from agents.report import validate_summary
from samm.cli.main import cli


def test_quick_experiment_writes_a_valid_summary_and_report(tmp_path):
    # one training iteration (2,048 slots, the quick run's 4,096 halved): every row, figure and saved
    # policy is still made; this test checks the report, not what training learns
    summary = run(tmp_path, quick=True, workers=1, progress=False, steps=2048)
    assert validate_summary(summary) == []
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert validate_summary(on_disk) == []
    methods = summary["methods"]
    for name in ("tiny/fifo", "tiny/sjf", "tiny/tetris", "tiny/easy-backfill", "tiny/osdec", "tiny/ppo"):
        assert methods[name]["total_reward"]["n"] >= 1, name
    assert methods["tiny/osdec"]["total_reward"]["n"] == 2           # one per seed
    assert summary["paper_figures"]["osdec"]["total_reward"] == PAPER_TABLE1["osdec"][2]
    report = (tmp_path / "report.md").read_text()
    assert "## Table 1 (tiny)" in report and "3475.37" in report
    assert (tmp_path / "training-curves.png").stat().st_size > 1000
    assert (tmp_path / "policies" / "osdec-tiny-seed1" / "weights.pt").is_file()
    # the total is the sum of its parts, per method
    for name, m in methods.items():
        parts = m["utilisation"]["mean"] + m["delay_penalty"]["mean"] + m["violation_penalty"]["mean"]
        assert abs(parts - m["total_reward"]["mean"]) < 1e-6, name


def test_a_skip_mapping_run_merges_an_earlier_run_into_one_report(tmp_path):
    first = tmp_path / "paper"
    # 2,048 slots each (one iteration; the quick default is 4,096): the merge, not the training, is tested
    run(first, quick=True, workers=1, progress=False, variants=["ppo"], seeds=[1], steps=2048)
    summary = run(tmp_path / "skip", quick=True, workers=1, progress=False, variants=["osdec"], seeds=[1],
                  mapping="skip", merge=[str(first)], steps=2048)
    assert validate_summary(summary) == []
    assert {"tiny/ppo", "tiny/osdec+skip"} <= set(summary["methods"])
    assert summary["steps_per_row"]["ppo"] == summary["steps_per_row"]["osdec+skip"] == 2048
    names = [t["name"] for t in summary["targets"]]
    assert any(n.startswith("osdec+skip:") for n in names) and not any(n.startswith("osdec:") for n in names)
    assert (tmp_path / "skip" / "policies" / "osdec+skip-tiny-seed1" / "metadata.json").is_file()


def test_evaluate_verb_runs_a_heuristic_and_rejects_bad_parameters():
    runner = CliRunner()
    r = runner.invoke(cli, ["evaluate", "--problem", "deferrable-jobs", "--agent", "sjf", "--seeds", "1", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["summary"]["total_reward"]["n"] == 1 and out["episodes"][0]["jobs"] > 0
    r = runner.invoke(cli, ["evaluate", "--problem", "deferrable-jobs", "--agent", "fifo", "--seeds", "1",
                            "--params", '{"margin": 0.9}'])
    assert r.exit_code != 0 and "margin" in r.output
