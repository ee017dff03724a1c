"""`samm experiment c2marl` and `samm train --problem oversubscription` end to end on the tiny setting."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from agents.oversubscription.settings import get_setting
from agents.report import validate_summary
from samm.cli.main import cli


def test_quick_experiment_writes_the_tables_figures_and_a_valid_summary(tmp_path):
    from agents.oversubscription.experiment import run

    # 5 training episodes (was 15): the rows, figures and saved policies are the same kinds; learning
    # itself is not what this test claims (its curve still has a point per episode)
    summary = run(tmp_path, quick=True, seeds=[1], episodes=5, test_episodes=3, workers=1, progress=False)
    assert validate_summary(summary) == []
    assert summary["setting"]["dual_estimate"] == "broken"      # the default, named in the summary
    assert summary["setting"]["budget_margin"] == 1.0
    report = (tmp_path / "report.md").read_text()
    assert summary["setting"]["rates"] == [0.2, 0.3, 0.4, 0.5, 0.6, 1.0]
    assert "C2MARL's action set: 0.2, 0.3, 0.4, 0.5, 0.6, 1 (the paper's" in report
    for row in ("Grid-0.2", "Grid-1.0", "MA", "SL", "NSigma", "Percentile", "Max", "BorgDefault",
                "C2MARL-0.75", "C2MARL-0.85", "C2MARL-0.95"):
        assert f"| {row} |" in report
    assert (tmp_path / "training-tiny-cold.png").stat().st_size > 10_000
    methods = summary["methods"]
    # Grid-rho saves exactly 1 - rho of the requested cores
    assert abs(methods["tiny-cold/Grid-0.4"]["s_cores"]["mean"] - 0.6) < 1e-9
    assert any(t["name"].startswith("tiny-cold: C2MARL-0.95 S-Cores") for t in summary["targets"])
    # the paper's own protocol (L369: training weekdays' requests, usage redrawn) is a second table,
    # every method on it, and its targets say they are not the test
    assert "### the paper's protocol" in report and "### held-apart days" in report
    for row in ("Grid-1.0", "NSigma", "C2MARL-0.95"):
        assert f"tiny-cold/paper-protocol/{row}" in methods
    assert abs(methods["tiny-cold/paper-protocol/Grid-0.4"]["s_cores"]["mean"] - 0.6) < 1e-9
    assert any(t["name"].startswith("tiny-cold (paper-protocol, not the issue's test): C2MARL-0.95 S-Cores")
               for t in summary["targets"])
    assert (tmp_path / "policies" / "tiny-cold-a0.95-s1" / "metadata.json").is_file()
    # each seed on its own beside the mean, with whether it meets its own level
    one_seed = summary["per_seed"]["tiny-cold"]["C2MARL-0.95"]
    assert [r["seed"] for r in one_seed] == [1]
    assert one_seed[0]["s_cores"] == methods["tiny-cold/C2MARL-0.95"]["s_cores"]["mean"]
    assert isinstance(one_seed[0]["satisfied"], bool)
    assert one_seed[0]["checkpoint_episode"] == 5           # no validation: the last weights
    assert set(summary["per_seed"]["tiny-cold/paper-protocol"]) == {"C2MARL-0.75", "C2MARL-0.85", "C2MARL-0.95"}
    assert "Each C2MARL seed on its own" in report and "| C2MARL-0.85 | 1 |" in report

    # the saved policies evaluated again without training: the same test episodes give the same rows
    import shutil

    again = run(tmp_path / "again", quick=True, seeds=[1], test_episodes=3, workers=1, progress=False,
                policies=tmp_path)
    for key in ("tiny-cold/C2MARL-0.95", "tiny-cold/paper-protocol/C2MARL-0.75"):
        assert again["methods"][key] == methods[key]
    assert not (tmp_path / "again" / "training-tiny-cold.png").exists()    # no training, no curves
    with pytest.raises(FileNotFoundError, match="seed 2"):
        run(tmp_path / "other", quick=True, seeds=[2], test_episodes=3, workers=1, progress=False, policies=tmp_path)
    # a policy saved under another alpha's name is refused, not tabled as that alpha
    mixed = tmp_path / "mixed" / "policies"
    shutil.copytree(tmp_path / "policies", mixed)
    shutil.rmtree(mixed / "tiny-cold-a0.75-s1")
    shutil.copytree(tmp_path / "policies" / "tiny-cold-a0.95-s1", mixed / "tiny-cold-a0.75-s1")
    with pytest.raises(ValueError, match="alpha"):
        run(tmp_path / "m", quick=True, seeds=[1], test_episodes=3, workers=1, progress=False, policies=mixed)
    # --alphas keeps the C2MARL rows (and needs the saved policies) of the levels asked for only
    one = run(tmp_path / "one", quick=True, seeds=[1], test_episodes=3, workers=1, progress=False, policies=mixed,
              alphas=[0.95])
    assert one["methods"]["tiny-cold/C2MARL-0.95"] == methods["tiny-cold/C2MARL-0.95"]
    assert not any("C2MARL-0.75" in k or "C2MARL-0.85" in k for k in one["methods"])
    assert "tiny-cold/Grid-1.0" in one["methods"]
    # --held-apart-only: the test only, the same rows, no paper's-protocol table
    held = run(tmp_path / "held", quick=True, seeds=[1], test_episodes=3, workers=1, progress=False, policies=tmp_path,
               held_apart_only=True)
    assert held["methods"]["tiny-cold/C2MARL-0.75"] == methods["tiny-cold/C2MARL-0.75"]
    assert held["methods"]["tiny-cold/MA"] == methods["tiny-cold/MA"]
    assert not any("paper-protocol" in k for k in held["methods"])
    assert not any("paper-protocol" in t["name"] for t in held["targets"])
    assert "### the paper's protocol" not in (tmp_path / "held" / "report.md").read_text()
    for bad in ({"alphas": [0.9]}, {"threads": 0}, {"validate_every": -1}):
        with pytest.raises(ValueError, match="alpha|threads|validate_every"):
            run(tmp_path / "bad", quick=True, seeds=[1], test_episodes=3, workers=1, progress=False, **bad)
    assert not (tmp_path / "bad").exists()


def test_experiment_trains_with_the_threads_dual_estimate_and_budget_margin_asked_for(tmp_path):
    from agents.oversubscription.experiment import run
    from agents.oversubscription.policy import OversubPolicy

    summary = run(tmp_path, quick=True, seeds=[1], episodes=2, test_episodes=1, workers=1, progress=False,
                  alphas=[0.85], threads=2, dual_estimate="pm-max", budget_margin=2)
    policy = OversubPolicy.load(tmp_path / "policies" / "tiny-cold-a0.85-s1")
    assert policy.training["config"]["torch_threads"] == 2
    assert policy.training["config"]["dual_estimate"] == "pm-max" == summary["setting"]["dual_estimate"]
    assert policy.training["config"]["budget_margin"] == 2.0 == summary["setting"]["budget_margin"]
    assert policy.training["config"]["alpha"] == 0.85     # still judged on its own level
    assert sorted(p.name for p in (tmp_path / "policies").iterdir()) == ["tiny-cold-a0.85-s1"]
    with pytest.raises(ValueError, match="dual_estimate must be one of"):
        run(tmp_path / "bad", quick=True, seeds=[1], episodes=2, workers=1, progress=False, dual_estimate="mean")
    with pytest.raises(ValueError, match="--policies evaluates"):
        run(tmp_path / "bad", quick=True, seeds=[1], workers=1, progress=False, dual_estimate="pm-max",
            policies=tmp_path)
    for bad, match in (({"budget_margin": 0.5}, "budget_margin must be >= 1"),
                       ({"budget_margin": 2, "policies": tmp_path}, "--policies evaluates")):
        with pytest.raises(ValueError, match=match):
            run(tmp_path / "bad", quick=True, seeds=[1], workers=1, progress=False, **bad)
    assert not (tmp_path / "bad").exists()
    for flag, value in (("--dual-estimate", "x"), ("--budget-margin", "0.5")):
        res = CliRunner().invoke(cli, ["experiment", "c2marl", "--out", str(tmp_path / "cli"), flag, value])
        assert res.exit_code != 0 and flag in res.output


def test_experiment_keeps_the_checkpoint_chosen_on_the_validation_week(tmp_path):
    from agents.oversubscription.experiment import run
    from agents.oversubscription.policy import OversubPolicy

    summary = run(tmp_path, quick=True, seeds=[1], episodes=6, test_episodes=1, workers=1, progress=False,
                  alphas=[0.95], held_apart_only=True, validate_every=2)
    policy = OversubPolicy.load(tmp_path / "policies" / "tiny-cold-a0.95-s1")
    assert policy.training["checkpoint"] == "validation"
    assert [r["episode"] for r in policy.training["validation"]["history"]] == [3, 5, 6]
    kept = summary["per_seed"]["tiny-cold"]["C2MARL-0.95"][0]["checkpoint_episode"]
    assert kept == policy.training["checkpoint_episode"] in (3, 5, 6)
    assert "weights of episode" in (tmp_path / "report.md").read_text()


def test_experiment_acts_with_the_ensemble_of_the_last_snapshots(tmp_path):
    from agents.oversubscription.experiment import run
    from agents.oversubscription.network import C2MarlEnsemble
    from agents.oversubscription.policy import OversubPolicy

    summary = run(tmp_path, quick=True, seeds=[1], episodes=6, test_episodes=1, workers=1, progress=False,
                  alphas=[0.95], held_apart_only=True, ensemble=3, ensemble_every=2)
    policy = OversubPolicy.load(tmp_path / "policies" / "tiny-cold-a0.95-s1")
    assert isinstance(policy.net, C2MarlEnsemble) and policy.training["ensemble"]["episodes"] == [2, 4, 6]
    assert summary["per_seed"]["tiny-cold"]["C2MARL-0.95"][0]["ensemble"]["vote"] == "median"
    assert "2, 4, 6 (median vote)" in (tmp_path / "report.md").read_text()
    with pytest.raises(ValueError, match="ensemble excludes validate_every"):
        run(tmp_path / "bad", quick=True, seeds=[1], episodes=6, workers=1, progress=False, ensemble=3,
            validate_every=2)
    for bad, match in (({"episodes": 6, "ensemble_every": 3}, "needs more than 6 episodes"),    # 3 members, 3 apart
                       ({"episodes": 6, "ensemble_every": 2, "policies": tmp_path}, "--policies evaluates")):
        with pytest.raises(ValueError, match=match):
            run(tmp_path / "bad", quick=True, seeds=[1], workers=1, progress=False, ensemble=3, **bad)
    res = CliRunner().invoke(cli, ["experiment", "c2marl", "--out", str(tmp_path / "cli"), "--ensemble", "-1"])
    assert res.exit_code != 0 and "--ensemble" in res.output
    # the saved ensembles tested under another vote: same weights, the vote in the tables
    again = run(tmp_path / "revoted", quick=True, seeds=[1], test_episodes=1, workers=1, progress=False,
                alphas=[0.95], held_apart_only=True, policies=tmp_path, ensemble_vote="max")
    row = again["per_seed"]["tiny-cold"]["C2MARL-0.95"][0]
    assert row["ensemble"] == {"episodes": [2, 4, 6], "vote": "max"}
    assert "2, 4, 6 (max vote)" in (tmp_path / "revoted" / "report.md").read_text()
    assert OversubPolicy.load(tmp_path / "revoted" / "policies" / "tiny-cold-a0.95-s1").net.how == "max"
    for bad, match in (({"ensemble_vote": "min", "ensemble": 3}, "ensemble_vote must be one of"),
                       ({"ensemble_vote": "max"}, "ensemble_vote needs ensemble")):
        with pytest.raises(ValueError, match=match):
            run(tmp_path / "bad", quick=True, seeds=[1], workers=1, progress=False, episodes=6, **bad)
    from agents.oversubscription.network import VOTES

    option = next(p for p in cli.commands["experiment"].commands["c2marl"].params if p.name == "ensemble_vote")
    assert tuple(option.type.choices) == VOTES


def test_train_verb_passes_problem_options_through(tmp_path):
    out = tmp_path / "c2"
    res = CliRunner().invoke(cli, ["train", "--problem", "oversubscription", "--out", str(out), "--seed", "2",
                                   "--episodes", "3", "--setting", "tiny", "--alpha", "0.85",
                                   "--constraint", "attributed", "--updates-per-episode", "3", "--hidden", "16",
                                   "--eps-decay-frac", "0.8", "--threads", "2", "--budget-margin", "2"])
    assert res.exit_code == 0, res.output
    meta = json.loads((out / "metadata.json").read_text())
    conf = meta["training"]["config"]
    assert meta["problem"] == "oversubscription" and conf["alpha"] == 0.85
    assert conf["constraint"] == "attributed"
    assert (conf["updates_per_episode"], conf["hidden"], conf["eps_decay_frac"]) == (3, 16, 0.8)
    assert conf["torch_threads"] == 2
    # trained to half of 0.85's budget, still a 0.85 policy
    steps = get_setting("tiny").episode_steps
    assert conf["budget_margin"] == 2.0 and meta["training"]["constraint_bound"] == pytest.approx(0.15 / 2 / steps)
    bad = CliRunner().invoke(cli, ["train", "--problem", "oversubscription", "--out", str(out), "--setting", "nope"])
    assert bad.exit_code != 0


def test_train_rejects_out_of_range_training_options(tmp_path, capsys):
    from agents.oversubscription.train import main

    for flag, value in (("--updates-per-episode", "0"), ("--hidden", "-4"), ("--eps-decay-frac", "1.5"),
                        ("--threads", "0"), ("--budget-margin", "0.9")):
        assert main(["--setting", "tiny", "--episodes", "1", "--out", str(tmp_path / "x"), flag, value]) == 2
        assert flag in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_experiment_verb_has_help():
    res = CliRunner().invoke(cli, ["experiment", "c2marl", "--help"])
    assert res.exit_code == 0 and "Tables 1, 2, 3 and 5" in res.output


def test_paper_protocol_replays_the_training_requests_with_fresh_usage():
    """The paper's test (L369) keeps the training weekdays' requests and redraws usage; its seeds
    stay apart from the tuning episodes', and the held-apart test is other weeks' requests."""
    import numpy as np

    from agents.oversubscription.data import generate_trace
    from agents.oversubscription.experiment import (PAPER_PROTOCOL_SEED, held_apart_episodes,
                                                    paper_protocol_episodes, test_specs)
    from agents.oversubscription.settings import get_setting

    trace = generate_trace(get_setting("tiny"), 0)
    paper = list(paper_protocol_episodes(trace, 2, warm=False))     # drawn one at a time, as they are run
    train = trace.train_redrawn(0)
    for w in paper:
        assert np.array_equal(w.arrive, train.arrive) and np.array_equal(w.cores, train.cores)
        assert np.array_equal(w.sub, train.sub)
    assert not np.array_equal(paper[0].usage, paper[1].usage)                 # usage redrawn per episode
    assert not np.array_equal(paper[0].usage, trace.train_redrawn(0).usage)   # not a tuning episode
    assert np.array_equal(paper[0].usage, trace.train_redrawn(PAPER_PROTOCOL_SEED).usage)
    held = next(iter(held_apart_episodes(trace, test_specs(trace, 1, False), warm=False)))
    assert not (held.n_vms == train.n_vms and np.array_equal(held.arrive, train.arrive))
