"""Second audit of the LRA placement learning side: the Metis loader, the interference predictor,
the cross-batch trainer's CLI and the saved policy with another predictor or slot count."""
from __future__ import annotations

import numpy as np
import pytest

from agents.lra_placement.cluster import Batch, Cluster, Constraints
from agents.lra_placement.data import load_metis
from agents.lra_placement.policy import PlacementPolicy
from agents.lra_placement.predictor import ForestParams, ForestPredictor, SyntheticInterference
from agents.lra_placement.reinforce import ReinforceConfig, reinforce
from agents.lra_placement.train import TrainConfig, main as train_main, train_generalist

NAN = np.nan


def _metis_file(path, alloc, rps=None, **extra):
    """A Metis-shaped .npz: 9 columns, the first 7 the apps (as the real files)."""
    alloc = np.asarray(alloc, dtype=np.int64)
    if rps is None:
        rps = np.where(alloc > 0, 0.9, NAN)
    np.savez(path, alloc=alloc, rps=np.asarray(rps, dtype=np.float64), **extra)
    return path


def _rows(*rows):
    return np.asarray([list(r) + [0] * (9 - len(r)) for r in rows])


# --- the Metis loader ---------------------------------------------------------------------------
def test_load_metis_refuses_rps_with_fewer_rows_than_alloc(tmp_path):
    # an rps of one row broadcast over every alloc row: each machine got the first one's throughputs
    alloc = _rows((1,), (1, 1), (2, 1))
    path = _metis_file(tmp_path / "m.npz", alloc, rps=np.where(alloc[:1] > 0, 0.9, NAN))
    with pytest.raises(ValueError, match=r"m\.npz: alloc and rps must be .* of one shape, got \(3, 9\) and \(1, 9\)"):
        load_metis(path)


def test_load_metis_refuses_a_file_with_containers_past_the_seventh_app(tmp_path):
    # Metis's early 9-app profiles (0805-2045.npz, ...) lost their apps 8 and 9 silently: a machine with
    # 1 Redis and 4 containers of app 8 trained the forest as a solo Redis
    path = _metis_file(tmp_path / "nine.npz", _rows((1,), (1, 0, 0, 0, 0, 0, 0, 4)))
    with pytest.raises(ValueError, match=r"nine\.npz: 1 rows hold containers of apps past the first 7 "
                                         r"\(columns 7\.\.8\): not a 7-app file"):
        load_metis(path)


@pytest.mark.parametrize("arrays, match", [
    ({"alloc": np.ones(9), "rps": np.ones(9)}, r"of one shape, got \(9,\) and \(9,\)"),          # was IndexError
    ({"rps": np.ones((2, 9))}, r"not a Metis co-location file \(KeyError"),                        # was a bare KeyError
    ({"alloc": np.ones((2, 5)), "rps": np.ones((2, 5))}, r"\(rows, >= 7 apps\)"),                 # failed later in fit
])
def test_load_metis_a_malformed_file_is_an_error_naming_it(tmp_path, arrays, match):
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match=r"bad\.npz: .*" + match):
        load_metis(path)


def test_validation_cli_with_a_one_dimensional_file_is_a_usage_error(tmp_path, capsys):
    from agents.lra_placement.validation import main

    path = tmp_path / "flat.npz"
    np.savez(path, alloc=np.ones(9), rps=np.ones(9))
    with pytest.raises(SystemExit) as exc:   # was an IndexError traceback
        main(["--data", str(path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--data" in err and "flat.npz" in err


def test_validation_cli_with_a_truncated_file_is_a_usage_error(tmp_path, capsys):
    from agents.lra_placement.validation import main

    whole = _metis_file(tmp_path / "whole.npz", _rows((1,), (1, 1)))
    path = tmp_path / "cut.npz"
    path.write_bytes(whole.read_bytes()[:300])   # a copy cut short
    with pytest.raises(SystemExit) as exc:       # was a BadZipFile traceback
        main(["--data", str(path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--data" in err and "cut.npz: not a Metis co-location file (BadZipFile" in err


def test_load_metis_of_a_well_formed_file_still_loads(tmp_path):
    data = load_metis(_metis_file(tmp_path / "ok.npz", _rows((1,), (1, 1), (0, 0, 2))))
    assert data.n_rows == 3 and data.alloc.shape == (3, 7) and data.dropped_failed == 0


# --- the forest ---------------------------------------------------------------------------------
def test_forest_fit_with_a_nan_count_names_it_not_negative_counts():
    fp = ForestPredictor(app_names=("a", "b"), slots=2, params=ForestParams(n_estimators=2, max_depth=2, n_jobs=1))
    with pytest.raises(ValueError, match="whole, finite container counts") as exc:
        fp.fit(np.array([[NAN, 1.0], [1.0, 0.0]]), np.array([[1.0, 1.0], [1.0, NAN]]))
    assert "negative" not in str(exc.value)   # a NaN count was reported as "1 negative counts"


# --- the trainer's CLI --------------------------------------------------------------------------
_FAST = ["--predictor", "synthetic", "--episodes", "16", "--validate-every", "0", "--quiet", "--nodes", "2",
         "--hidden", "8"]


def test_train_into_an_out_that_is_a_file_is_refused_before_training(tmp_path, capsys):
    out = tmp_path / "policy"
    out.write_text("not a folder")
    # was a FileExistsError traceback from policy.save, after the whole run (minutes)
    assert train_main(_FAST + ["--out", str(out / "sub")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --out: output folder") and "\n" not in err and "trained" not in err


def test_train_with_a_log_in_a_missing_folder_is_refused_before_training(tmp_path, capsys):
    out = tmp_path / "run"
    # was a FileNotFoundError traceback after training, with the policy saved but its log lost
    assert train_main(_FAST + ["--out", str(out), "--log", str(tmp_path / "nodir" / "log.csv")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: --log {tmp_path / 'nodir' / 'log.csv'}: folder {tmp_path / 'nodir'} does not exist"
    assert not out.exists()


def test_train_with_good_outputs_still_trains(tmp_path):
    assert train_main(_FAST + ["--out", str(tmp_path / "run"), "--log", str(tmp_path / "log.csv")]) == 0
    assert (tmp_path / "run" / "policy.pt").is_file() and (tmp_path / "log.csv").is_file()


# --- a saved policy with another predictor or slot count ----------------------------------------
@pytest.fixture(scope="module")
def small_policy(tmp_path_factory):
    """A 3-app policy trained on 4-slot nodes, saved with its predictor table."""
    out = tmp_path_factory.mktemp("pol") / "policy"
    cfg = TrainConfig(slots=4, validate_every=0, hidden=(8,), n_nodes_choices=(3,))
    train_generalist(cfg, SyntheticInterference(3, 0, 4), total_episodes=32, progress=False, out=out)
    return out


def test_policy_loaded_with_a_predictor_of_other_apps_is_refused(small_policy):
    # loaded fine, then every plan failed in a matmul ("mismatch in its core dimension 0")
    with pytest.raises(ValueError, match="the predictor covers 5 apps, the policy 3"):
        PlacementPolicy.load(small_policy, predictor=SyntheticInterference(5, 0, 4))


def test_policy_plan_with_a_predictor_of_other_apps_names_both_counts(small_policy):
    policy = PlacementPolicy.load(small_policy)
    with pytest.raises(ValueError, match="the predictor covers 5 apps, the placement 3"):
        policy.plan(Cluster(3, 4), Batch(np.array([2, 1, 1])), Constraints.none(3),
                    predictor=SyntheticInterference(5, 0, 4))


def test_reinforce_with_a_predictor_of_other_apps_names_both_counts():
    with pytest.raises(ValueError, match="the predictor covers 4 apps, the placement 3"):
        reinforce(Cluster(2, 4), Batch(np.array([1, 1, 1])), Constraints.none(3), SyntheticInterference(4, 0, 4),
                  np.random.default_rng(0), ReinforceConfig(episodes=8))


def test_policy_plan_past_its_stored_table_is_refused(small_policy):
    # the stored table covers nodes of <= 4 containers and scored every fuller node 0: a plan for
    # 8-slot nodes was chosen by those zeros, silently
    policy = PlacementPolicy.load(small_policy)
    with pytest.raises(ValueError, match="stored predictor covers nodes of at most 4 slots, the cluster has 8"):
        policy.plan(Cluster(3, 8), Batch(np.array([6, 6, 6])), Constraints.none(3))


def test_policy_plan_within_or_with_a_predictor_for_the_slots_still_plans(small_policy):
    policy = PlacementPolicy.load(small_policy)
    batch = Batch(np.array([2, 1, 1]))
    assert policy.plan(Cluster(3, 2), batch, Constraints.none(3)).sum() == 4
    plan = policy.plan(Cluster(3, 8), Batch(np.array([6, 6, 6])), Constraints.none(3),
                       predictor=SyntheticInterference(3, 0, 8))
    assert plan.sum() == 18 and plan.sum(axis=1).max() <= 8


# --- the experiment's arguments -----------------------------------------------------------------
def test_experiment_run_refuses_a_seed_given_twice(tmp_path):
    from agents.lra_placement import experiment as ex

    # `samm experiment lra --seeds 1,1` is refused by the CLI's parser; the Python entry point ran
    # seed 1 twice and reported n = 2 with a std of 0, as the other experiments' run() no longer do
    with pytest.raises(ValueError, match="seeds names 1 more than once"):
        ex.run(tmp_path / "out", quick=True, seeds=(1, 1), predictor="synthetic", progress=False)
    assert not (tmp_path / "out").exists()
