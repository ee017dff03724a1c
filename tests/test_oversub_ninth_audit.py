"""Ninth audit of the oversubscription offline side (simulator, baselines, tuning, training, the
experiment): each test names the defect it pins."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest

from agents.oversubscription.experiment import run
from agents.oversubscription.features import observation_size
from agents.oversubscription.network import C2MarlNet
from agents.oversubscription.policy import OversubPolicy
from agents.oversubscription.settings import RATES, get_setting


# ----------------------------------------------------------------------------- experiment --policies

def _fake_saved_run(policies, case: str, setting: str, warm: bool, alpha: float, seed: int) -> None:
    """A policy folder an earlier run could have saved for (case, alpha, seed): untrained weights, the
    training metadata `experiment.load_run_policy` checks."""
    s = get_setting(setting)
    net = C2MarlNet(s.n_subscribers, observation_size(s), len(RATES), 8)
    training = {"config": {"alpha": alpha, "seed": seed}, "warm": warm, "trace_seed": 0}
    OversubPolicy(net, s, training=training).save(policies / f"{case}-a{alpha:.2f}-s{seed}")


def test_missing_saved_policies_are_refused_before_any_case_runs_and_before_out_is_made(tmp_path):
    """`--policies` was checked case by case inside the case loop: a policy missing for the last case
    surfaced only after every earlier case's baselines were tuned and tested (here the internal-like
    warm case, minutes; hours on the full cases), and a refused run still left its --out behind."""
    earlier = tmp_path / "earlier" / "policies"
    earlier.mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="tiny-cold-a0.95-s1"):
        run(tmp_path / "out", quick=True, seeds=[1], alphas=[0.95], test_episodes=1, workers=1, progress=False,
            policies=tmp_path / "earlier")
    assert not (tmp_path / "out").exists()
    _fake_saved_run(earlier, "internal-warm", "internal", True, 0.95, 1)
    t0 = time.perf_counter()
    with pytest.raises(FileNotFoundError, match=r"no saved policy .*tiny-cold-a0\.95-s1 \(C2MARL-0\.95, seed 1\)"):
        run(tmp_path / "out", quick=True, cases=["internal-warm", "tiny-cold"], seeds=[1], alphas=[0.95],
            test_episodes=1, workers=1, progress=False, policies=tmp_path / "earlier")
    assert time.perf_counter() - t0 < 30       # no tuning of the internal-like baselines first
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- tuning and evaluation CLIs

@pytest.mark.parametrize("flag", ["--seed", "--test-seed"])
def test_tuning_cli_refuses_a_negative_seed_in_one_line(capsys, flag):
    """Was a NumPy traceback ("expected non-negative integer") from the episodes' seeding."""
    from agents.oversubscription import tuning

    assert tuning.main(["--setting", "tiny", "--rules", "Grid-0.2", "--episodes", "1", "--test-episodes", "1",
                        flag, "-1"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err == f"error: {flag} must be >= 0, not -1\n"


def test_evaluation_cli_names_a_folder_that_is_no_policy_and_a_negative_trace_seed(tmp_path, capsys):
    """Were tracebacks: the registry's "no metadata.json" ValueError, and NumPy's seeding error."""
    from agents.oversubscription import evaluate as ev

    for argv, match in ((["--policy", str(tmp_path)], "no metadata.json; not a saved SAMM policy"),
                        (["--policy", str(ev.__file__), "--trace-seed", "-1"], "--trace-seed must be >= 0, got -1")):
        with pytest.raises(SystemExit) as exc:
            ev.main(argv)
        err = capsys.readouterr().err
        assert exc.value.code == 2 and match in err and "Traceback" not in err


def test_evaluation_of_a_saved_policy_replays_its_own_trace_and_start(tmp_path):
    """A policy trained with --warm --trace-seed 2 was tested cold on trace 0: its "training_days" row
    was another trace's days, in the other start."""
    from agents.oversubscription import evaluate as ev

    _fake_saved_run(tmp_path, "tiny-warm", "tiny", True, 0.95, 1)
    folder = tmp_path / "tiny-warm-a0.95-s1"
    policy = OversubPolicy.load(folder)
    policy.training["trace_seed"] = 2
    policy.save(folder)
    own = ev.evaluate_saved(folder, episodes=2)
    assert own == ev.evaluate_saved(folder, episodes=2, trace_seed=2, warm=True)
    assert own["training_days"] != ev.evaluate_saved(folder, episodes=2, trace_seed=0, warm=False)["training_days"]
    assert ev.evaluate_saved(folder, episodes=2, warm=False) != own     # still chosen when given
    for kw in ({"trace_seed": -1}, {"test_seed": -1}, {"trace_seed": 1.5}):
        with pytest.raises(ValueError, match=f"{next(iter(kw))} must be a whole number >= 0"):
            ev.evaluate_saved(folder, episodes=1, **kw)


@pytest.mark.parametrize("kw,match", [({"seeds": [1, -2]}, "seeds must be >= 0, not -2"),
                                      ({"trace_seed": -1}, "trace_seed must be >= 0, not -1")])
def test_experiment_refuses_a_negative_seed_before_any_work(tmp_path, kw, match):
    """A negative training seed failed in NumPy's seeding inside the training workers, after the
    baselines were tuned and tested; a negative trace seed after --out was made."""
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=match):
        run(tmp_path / "out", quick=True, episodes=2, test_episodes=1, workers=1, progress=False,
            alphas=[0.95], **({"seeds": [1]} | kw))
    assert time.perf_counter() - t0 < 5 and not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- training

def test_training_refuses_a_validation_start_after_the_last_episode(tmp_path, capsys):
    """--validate-from beyond --episodes trained the whole run, validated nothing and saved the last
    weights with no validation.csv, as if the flag had been understood."""
    from agents.oversubscription import train

    assert train.main(["--setting", "tiny", "--episodes", "4", "--validate-every", "2", "--validate-from", "9",
                       "--quiet", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err == "error: validate_from (9) is after the last episode (4): nothing would be validated\n"
    assert not (tmp_path / "run" / "metadata.json").exists()


def test_experiment_refuses_validation_with_saved_policies(tmp_path):
    """validate_every with --policies was dropped in silence: the saved weights were tested as they
    were, under a run that asked for checkpoints chosen on the validation week (the other training
    options are refused so)."""
    (tmp_path / "earlier" / "policies").mkdir(parents=True)
    with pytest.raises(ValueError, match="validate_every is how runs are trained; --policies evaluates"):
        run(tmp_path / "out", quick=True, seeds=[1], test_episodes=1, workers=1, progress=False,
            policies=tmp_path / "earlier", validate_every=2)
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- trace seeds

@pytest.mark.parametrize("seed", [-1, 1.5, float("nan"), True, "2"])
def test_a_trace_seed_that_is_no_whole_number_above_zero_is_refused_by_name(seed):
    """-1 failed in NumPy's seeding ("expected non-negative integer"), 1.5 was silently trace 1; the
    Gym env failed so only at its first reset()."""
    from agents.oversubscription.data import generate_trace
    from agents.oversubscription.env import OversubscriptionEnv

    with pytest.raises(ValueError, match="trace seed must be a whole number >= 0, got "):
        generate_trace("tiny", seed)
    with pytest.raises(ValueError, match="trace seed must be a whole number >= 0"):
        OversubscriptionEnv("tiny", trace_seed=seed)


def test_whole_trace_seeds_of_any_numeric_type_give_the_same_trace():
    from agents.oversubscription.data import generate_trace

    a, b = generate_trace("tiny", 3), generate_trace("tiny", np.int64(3))
    assert a.seed == b.seed == 3 and np.array_equal(a.cores, b.cores) and np.array_equal(a.arrive, b.arrive)
    assert np.array_equal(generate_trace("tiny", 3.0).arrive, a.arrive)



@pytest.mark.parametrize("where", ["missing/out.json", "."])
def test_tuning_cli_refuses_a_json_path_it_could_not_write_before_tuning(tmp_path, capsys, where):
    """--json in a folder that does not exist (or naming a folder) failed with a traceback when the
    results were to be written, after every rule was tuned and tested: the whole tuning lost."""
    from agents.oversubscription import tuning

    target = tmp_path / where
    assert tuning.main(["--setting", "tiny", "--rules", "Grid-0.2", "--episodes", "1", "--test-episodes", "1",
                        "--json", str(target)]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err == f"error: --json must name a file in an existing folder, not {target}\n"
    assert tuning.main(["--setting", "tiny", "--rules", "Grid-0.2", "--episodes", "1", "--test-episodes", "1",
                        "--json", str(tmp_path / "out.json")]) == 0
    assert "Grid-0.2" in json.loads((tmp_path / "out.json").read_text())["rules"]


# ----------------------------------------------------------------------------- the shield's prior

def test_a_shield_prior_of_another_width_is_refused_not_reshaped_into_rows():
    """`Shield(spec, n, prior)` (train's `shield_prior`) reshaped any prior to n columns: a 9-subscriber
    history of 4 steps became 12 rows of 3 values, each row mixing three subscribers. The saved form
    (`Shield.from_json`) was already refused so."""
    from agents.oversubscription.shield import Shield, ShieldSpec

    for prior in (np.full((4, 9), 0.3), np.full(6, 0.3)):
        with pytest.raises(ValueError, match=r"the prior must be \[steps, 3\] usage rates, got shape"):
            Shield(ShieldSpec(), 3, prior)
    assert Shield(ShieldSpec(), 3, np.full((4, 3), 0.3)).prior.shape == (4, 3)
    assert Shield(ShieldSpec(), 3, None).prior is None


def test_training_names_an_out_it_cannot_write_in_one_line(tmp_path, capsys):
    """--out naming a file (or a folder under one) was a NotADirectoryError traceback from the
    TensorBoard writer or the first log row."""
    from agents.oversubscription import train

    (tmp_path / "afile").write_text("")
    for out in (tmp_path / "afile", tmp_path / "afile" / "run"):
        assert train.main(["--setting", "tiny", "--episodes", "2", "--quiet", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err == f"error: --out: output folder {out} is a file (or lies under one): choose a folder\n"
    assert train.main(["--setting", "tiny", "--episodes", "2", "--quiet", "--out", str(tmp_path / "new" / "run")]) == 0
    assert (tmp_path / "new" / "run" / "metadata.json").is_file()


@pytest.mark.parametrize("flags,err", [
    (["--shield-headroom", "1.5"], "error: --shield-headroom is the nsigma shield's headroom: it needs --shield nsigma\n"),
    (["--shield-headroom", "1.5", "--action", "headroom"],
     "error: --shield-headroom is the nsigma shield's headroom: it needs --shield nsigma\n"),
    (["--shield", "nsigma", "--shield-headroom", "nan"], "error: --shield-headroom out of range: nan\n"),
    (["--shield", "nsigma", "--shield-headroom", "0"], "error: --shield-headroom out of range: 0.0\n")])
def test_training_refuses_a_shield_headroom_it_would_not_use_or_could_not(capsys, flags, err):
    """Without --shield nsigma the headroom was dropped in silence (the run trained unshielded, as if
    floored); a NaN or zero one failed only after the trace was generated."""
    from agents.oversubscription import train

    assert train.main(["--setting", "tiny", "--episodes", "2", "--quiet", *flags]) == 2
    assert capsys.readouterr().err == err
