"""Methodology guards: no figure measured on the seeds its method was tuned or selected on, and the
data each phase touches kept apart (tuning, validation and test), with every method of a table on the
same episodes."""
from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from samm.cli.seeds import require_disjoint


def test_require_disjoint_names_the_shared_seeds_in_one_line():
    require_disjoint([1, 2, 3], "--seeds", [101, 102], "--tune-seeds")  # apart: nothing to say
    with pytest.raises(ValueError) as err:
        require_disjoint(range(1, 11), "--seeds", range(3, 20), "--tune-seeds")
    msg = str(err.value)
    assert "\n" not in msg and "--seeds and --tune-seeds share seed(s) 3, 4, 5, 6, 7, ..." in msg


def test_paper_experiment_refuses_evaluation_seeds_that_also_tune_the_baselines(tmp_path, monkeypatch):
    """`samm experiment paper --seeds 1-5 --tune-seeds 3-7` tuned the three rules (and chose the trained
    policy's snapshot) on seeds 3-5, then reported every method on them: now refused before any work."""
    import agents.experiment as paper
    from samm.cli.main import cli

    def tuning_ran(*_a, **_k):  # without the guard the grid search starts on the shared seeds
        raise AssertionError("the baselines were tuned on evaluation seeds")

    monkeypatch.setattr(paper, "tune", tuning_ran)
    out = tmp_path / "exp"
    res = CliRunner().invoke(cli, ["experiment", "paper", "--out", str(out), "--policy", "agents/policies/lstm-ppo-paper",
                                   "--seeds", "1-5", "--tune-seeds", "3-7", "--no-swf", "--quiet"])
    assert res.exit_code == 2, res.output
    assert "--seeds and --tune-seeds share seed(s) 3, 4, 5" in res.output
    assert not out.exists()


def _chain3_policy(training: dict):
    import torch

    from agents.microservice_cores.features import ROW
    from agents.microservice_cores.policy import ReclaimerPolicy
    from agents.microservice_cores.sac import Sac
    from agents.microservice_cores.topology import load_topology
    from agents.microservice_cores.train import scaled_schedule, sim_config

    topo = load_topology("chain3")
    cfg = scaled_schedule(sim_config(n_envs=2, hidden=16), 1200)
    torch.manual_seed(0)
    sac = Sac(cfg.k * ROW + topo.n_services, cfg.k * ROW, topo.n_services, cfg)
    return ReclaimerPolicy(sac, topo, cfg, version="test-1", training=training)


def test_reclaimer_experiment_refuses_seeds_its_policy_was_selected_on(tmp_path):
    """A policy whose checkpoint and ceiling were chosen on seeds 7-9 (recorded in its metadata) was
    reported on `--seeds 8` as if they were fresh episodes."""
    from agents.microservice_cores.experiment import run

    _chain3_policy({"seed": 0, "selected": {"validation_seeds": [7, 8]}, "ceiling": {"seeds": [9]}}).save(tmp_path / "p")
    with pytest.raises(ValueError, match=r"--seeds and the validation seeds recorded in .*metadata.json share seed\(s\) 8"):
        run(tmp_path / "e", quick=True, seeds=[8], apps=["chain3"], methods=["reclaimer"], progress=False,
            policy_dirs={"chain3": tmp_path / "p"}, workers=1)
    assert not (tmp_path / "e").exists()
    # apart from them (the training seed is no selection): the run goes ahead as before
    summary = run(tmp_path / "ok", quick=True, seeds=[0, 1], apps=["chain3"], methods=["reclaimer"], progress=False,
                  policy_dirs={"chain3": tmp_path / "p"}, workers=1)
    assert summary["seeds"] == [0, 1]


def test_reclaimer_experiment_refuses_the_static_search_seeds():
    from agents.microservice_cores.experiment import run
    from agents.microservice_cores.static_search import StaticSearchParams

    seed = StaticSearchParams().seeds[0]
    with pytest.raises(ValueError, match=rf"the static search's seeds share seed\(s\) {seed}"):
        run("/nonexistent/never-made", quick=True, seeds=[seed], apps=["chain3"], methods=["static-best"],
            progress=False, workers=1)


def test_every_reclaimer_method_sees_the_same_requests_on_the_same_seeds():
    """The paired comparison: the requests of each second depend on the seeds, not on the controller."""
    from agents.microservice_cores.autoscale import AutoScale
    from agents.microservice_cores.episode import StaticController, run_episodes
    from agents.microservice_cores.topology import load_topology

    topo = load_topology("chain3")
    a = run_episodes(topo, lambda i: AutoScale(), 50, [1, 2], steps=30, method="autoscale")
    b = run_episodes(topo, lambda i: StaticController.maximum(topo), 50, [1, 2], steps=30, method="static-max")
    assert [x.mean_cores != y.mean_cores for x, y in zip(a, b)] == [True, True]  # different actions...
    assert all(np.array_equal(x.requests, y.requests) for x, y in zip(a, b))  # ...on the same load


def test_oversubscription_training_validation_and_test_hours_are_apart():
    """C2MARL trains on week 1's block, selects on the week before, and is tested on weeks 2..; the
    baselines tune on week 1's block with usage redrawn."""
    from agents.oversubscription.data import generate_trace
    from agents.oversubscription.settings import get_setting

    setting = get_setting("tiny")
    trace = generate_trace(setting, 0)
    hours = lambda start: set(range(start, start + setting.episode_steps))  # noqa: E731
    train = hours(trace.train_start())
    validation = set().union(*(hours(trace.validation_start(i)) for i in range(4)))
    test = set().union(*(hours(trace.test_start(i)) for i in range(trace.n_test_blocks)))
    assert train and validation and test
    assert not train & validation and not (train | validation) & test


def test_samm_tune_defaults_to_seeds_apart_from_samm_evaluates():
    """`samm tune` tuned on 1-3 by default, inside `samm evaluate`'s default 1-5: a tuned rule
    evaluated with both defaults was scored on the seeds it was tuned on."""
    from samm.cli.main import cli
    from samm.cli.seeds import parse_seeds

    def default(verb):
        return next(p.default for p in cli.commands[verb].params if p.name == "seeds")

    assert not set(parse_seeds(default("tune"))) & set(parse_seeds(default("evaluate")))
