"""The CLI's problem-neutral verbs: choice lists come from the problem catalogue, and each verb
dispatches to the problem named by --problem."""
import json
from pathlib import Path

from click.testing import CliRunner

from samm.cli.main import cli

EXAMPLES = Path(__file__).resolve().parents[1] / "agents" / "lra_placement" / "data"


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_problem_choices_come_from_the_catalogue():
    for verb in ("train", "evaluate", "tune"):
        out = run(verb, "--help").output
        assert "autoscaling" in out and "lra-placement" in out, verb
    assert "lra-reinforce" in run("train", "--help").output
    r = run("evaluate", "--problem", "nope", "--agent", "x")
    assert r.exit_code == 2 and "nope" in r.output


def test_evaluate_a_placement_planner_beside_the_optimum():
    r = run("evaluate", "--problem", "lra-placement", "--agent", "greedy", "--seeds", "1-2", "--predictor",
            "synthetic", "--json")
    assert r.exit_code == 0, r.output
    res = json.loads(r.output)
    assert [e["seed"] for e in res["episodes"]] == [1, 2]
    assert all(e["valid"] and 0.9 < e["ratio_to_optimum"] <= 1 + 1e-9 for e in res["episodes"])
    r = run("evaluate", "--problem", "lra-placement", "--agent", "magic", "--seeds", "1", "--predictor", "synthetic")
    assert r.exit_code == 2 and "unknown planner 'magic'" in r.output


def test_tune_says_what_a_problem_cannot_do():
    r = run("tune", "--problem", "lra-placement", "--agent", "threshold")
    assert r.exit_code == 2 and "no tunable baselines" in r.output


def test_place_writes_the_plan_and_the_orchestrator_files(tmp_path):
    r = run("place", "--cluster", str(EXAMPLES / "example-cluster.yaml"), "--batch", str(EXAMPLES / "example-batch.csv"),
            "--out", str(tmp_path), "--planner", "greedy-ls", "--predictor", "synthetic", "--json")
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output.strip().splitlines()[-1])
    assert summary["constraint_violations"] == 0 and summary["n_containers"] == 36
    assert (tmp_path / "plan.csv").is_file() and (tmp_path / "docker-compose.yml").is_file()
    assert any((tmp_path / "kubernetes").glob("*.yaml"))


def test_train_rejects_another_problems_learner(tmp_path):
    r = run("train", "--problem", "lra-placement", "--agent", "lstm-ppo", "--out", str(tmp_path))
    assert r.exit_code == 2 and "not the learning agent" in r.output
