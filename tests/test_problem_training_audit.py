"""`samm train` for the problems besides autoscaling (lra-placement, oversubscription, deferrable-jobs,
microservice-cores) under bad input: an --out that holds an earlier run, diverging networks, counts
of zero or less, options the dispatcher dropped. Each run here is seconds long or refused at once."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from click.testing import CliRunner

from samm.cli.main import cli

#: a tiny placement run: the data-free predictor, one update of 16 episodes, no validation
LRA_TINY = ["--predictor", "synthetic", "--episodes", "16", "--validate-every", "0", "--quiet"]


def samm_train(*args: str):
    return CliRunner().invoke(cli, ["train", *args])


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


# --- lra-placement --------------------------------------------------------------------------------
def test_lra_refuses_an_out_holding_a_run_and_is_reproducible_for_a_seed(tmp_path):
    """A second run into the same --out overwrote the first's policy and logs without a word."""
    from agents.lra_placement.train import main

    assert main([*LRA_TINY, "--seed", "3", "--out", str(tmp_path / "a")]) == 0
    before = digests(tmp_path / "a")
    assert {"metadata.json", "policy.pt", "train-log.csv"} <= set(before)
    r = samm_train("--problem", "lra-placement", *LRA_TINY, "--seed", "4", "--out", str(tmp_path / "a"))
    assert r.exit_code == 2 and "already holds a training run" in r.output, r.output
    assert digests(tmp_path / "a") == before
    # the same seed into a fresh folder: the same weights, to the byte
    assert main([*LRA_TINY, "--seed", "3", "--out", str(tmp_path / "b")]) == 0
    assert digests(tmp_path / "b")["policy.pt"] == before["policy.pt"]


def test_lra_stops_on_a_diverged_network_without_saving_it(tmp_path):
    """--lr 1e30 made every weight NaN, and the NaN network was saved as the policy (exit 0)."""
    from agents.lra_placement.train import main

    # exit 1: a failure of the work (TrainingDiverged), not of its usage
    assert main([*LRA_TINY, "--episodes", "48", "--lr", "1e30", "--out", str(tmp_path / "nan")]) == 1
    assert not (tmp_path / "nan" / "policy.pt").exists() and not (tmp_path / "nan" / "metadata.json").exists()


def test_samm_train_hands_lra_its_own_options(tmp_path):
    """`samm train --problem lra-placement` dropped every option of the placement trainer (--lr,
    --nodes, a typo) silently: --lr 1e30 trained at the default rate and said nothing."""
    r = samm_train("--problem", "lra-placement", *LRA_TINY, "--episodes", "48", "--lr", "1e30",
                   "--out", str(tmp_path / "lr"))
    assert r.exit_code == 1 and "not finite" in r.output, r.output  # diverged: a failure of the work
    r = samm_train("--problem", "lra-placement", *LRA_TINY, "--nodez", "9", "--out", str(tmp_path / "typo"))
    assert r.exit_code == 2 and "--nodez" in r.output, r.output


@pytest.mark.parametrize("flags, says", [
    (["--episodes", "-5"], "--episodes must be >= 1"),
    (["--episodes-per-batch", "0"], "--episodes-per-batch must be >= 1"),
    (["--nodes", "9,x"], "--nodes must be positive integers"),
    (["--hidden", "0"], "--hidden must be positive integers"),
    (["--time-limit", "nan"], "--time-limit must be"),
    (["--lr", "nan"], "--lr must be a positive number"),
    (["--predictor", "synthetic:x"], "--predictor 'synthetic:x'"),
    (["--predictor", "bogus"], "--predictor 'bogus'"),
])
def test_lra_refuses_bad_options_by_name(tmp_path, flags, says, capsys):
    """Each of these crashed with a traceback, trained nothing and saved the untrained network, or
    (--episodes-per-batch 0) spun until the time limit."""
    from agents.lra_placement.train import main

    assert main([*LRA_TINY, *flags, "--out", str(tmp_path / "x")]) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_samm_train_passes_a_zero_episode_count_to_lra(tmp_path):
    """`--episodes 0` was dropped by the dispatcher, which then ran the default 200,000 episodes
    (--predictor bogus makes the unfixed dispatcher fail fast instead of training for minutes)."""
    r = samm_train("--problem", "lra-placement", "--episodes", "0", "--predictor", "bogus", "--quiet",
                   "--out", str(tmp_path / "zero"))
    assert r.exit_code == 2 and "--episodes must be >= 1, not 0" in r.output, r.output


# --- oversubscription -----------------------------------------------------------------------------
@pytest.mark.parametrize("marker", ["metadata.json", "checkpoints", "last-policy"])
def test_oversub_refuses_an_out_holding_a_run(tmp_path, marker):
    """A new run replaced the earlier policy and left its checkpoints/ and last-policy/ beside its
    own (`saved_checkpoints` then lists the old run's as this run's)."""
    out = tmp_path / "run"
    out.mkdir()
    (out / marker).mkdir() if "." not in marker else (out / marker).write_text("{}")
    r = samm_train("--problem", "oversubscription", "--setting", "tiny", "--episodes", "1", "--quiet",
                   "--out", str(out))
    assert r.exit_code == 2 and "already holds a training run" in r.output and marker in r.output, r.output
    assert sorted(p.name for p in out.iterdir()) == [marker]


@pytest.mark.parametrize("flags, says", [
    (["--episodes", "-3"], "--episodes must be >= 1"),        # was an IndexError on the empty log
    (["--episodes", "0", "--alpha", "1.5"], "--episodes must be >= 1, not 0"),   # 0 was dropped: 1,800 episodes
    (["--episodes", "1", "--alpha", "nan"], "--alpha must be a safety level in (0, 1)"),
    (["--episodes", "1", "--alpha", "1.5"], "--alpha must be a safety level in (0, 1)"),
    (["--episodes", "1", "--seed", "-1"], "--seed must be >= 0"),
])
def test_oversub_refuses_bad_options_by_name(tmp_path, flags, says):
    r = samm_train("--problem", "oversubscription", "--setting", "tiny", *flags, "--quiet", "--out", str(tmp_path / "x"))
    assert r.exit_code == 2 and says in r.output, r.output
    assert not (tmp_path / "x").exists()


def test_oversub_stops_on_a_diverged_network_without_saving_it(tmp_path):
    """--lr 1e6: the loss was NaN from the first episode and the NaN networks were saved as the policy."""
    from agents.oversubscription.train import main

    out = tmp_path / "nan"
    assert main(["--setting", "tiny", "--episodes", "1", "--updates-per-episode", "3", "--lr", "1e6", "--quiet",
                 "--out", str(out)]) == 1
    assert not (out / "weights.pt").exists() and not (out / "metadata.json").exists()


# --- deferrable-jobs ------------------------------------------------------------------------------
def test_deferrable_refuses_an_out_holding_a_run(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "progress.csv").write_text("iteration\n1\n")
    r = samm_train("--problem", "deferrable-jobs", "--setting", "tiny", "--steps", "2048", "--quiet", "--out", str(out))
    assert r.exit_code == 2 and "progress.csv" in r.output and "already holds a training run" in r.output, r.output
    assert (out / "progress.csv").read_text() == "iteration\n1\n" and not (out / "weights.pt").exists()


@pytest.mark.parametrize("flags, says", [
    # --threads 0 makes the unfixed trainer fail at once; fixed, --steps 0 is named first (it ran 300,000 slots)
    (["--steps", "0", "--threads", "0"], "--steps must be >= 1, not 0"),
    (["--steps", "-5", "--threads", "0"], "--steps must be >= 1, not -5"),
    (["--steps", "2048", "--threads", "0"], "--threads must be >= 1"),
    (["--steps", "2048", "--seed", "-1"], "--seed must be >= 0"),
])
def test_deferrable_refuses_bad_options_by_name(tmp_path, flags, says):
    r = samm_train("--problem", "deferrable-jobs", "--setting", "tiny", *flags, "--quiet", "--out", str(tmp_path / "x"))
    assert r.exit_code == 2 and says in r.output, r.output
    assert not (tmp_path / "x").exists()


def _deferrable_update_that(monkeypatch, on_call: int, act):
    """Replace the PPO update so that its `on_call`-th call ends in `act(model)` (a diverged step
    or an interrupt at an exact point, which no option of the trainer reaches in seconds)."""
    from agents.deferrable_jobs import train as osdec_train

    real, calls = osdec_train._ppo_update, []

    def update(model, *args):
        stats = real(model, *args)
        calls.append(1)
        if len(calls) == on_call:
            act(model)
        return stats

    monkeypatch.setattr(osdec_train, "_ppo_update", update)


def test_deferrable_stops_on_a_diverged_network_without_saving_it(tmp_path, monkeypatch):
    """No NaN check: a diverged OSDEC network was saved as the policy (exit 0)."""
    import torch

    from agents.deferrable_jobs.train import main

    def poison(model):
        with torch.no_grad():
            next(model.parameters()).fill_(float("nan"))

    _deferrable_update_that(monkeypatch, 2, poison)
    out = tmp_path / "nan"
    assert main(["--setting", "tiny", "--steps", "6144", "--quiet", "--out", str(out)]) == 1  # a failure of the work, not of its usage
    assert not (out / "weights.pt").exists() and not (out / "metadata.json").exists()
    rows = (out / "progress.csv").read_text().splitlines()
    assert rows[0].startswith("iteration") and len(rows) == 2  # the one good iteration is logged


def test_deferrable_keeps_its_log_when_interrupted(tmp_path, monkeypatch):
    """progress.csv was written only at the end: Ctrl-C after hours of training left no log."""
    from agents.deferrable_jobs.train import main

    def interrupt(model):
        raise KeyboardInterrupt

    _deferrable_update_that(monkeypatch, 3, interrupt)
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        main(["--setting", "tiny", "--steps", "8192", "--quiet", "--out", str(out)])
    assert len((out / "progress.csv").read_text().splitlines()) == 1 + 2


# --- microservice-cores ---------------------------------------------------------------------------
@pytest.mark.parametrize("marker", ["policy", "best-policy", "seed-3"])
def test_microservice_refuses_an_out_holding_a_run(tmp_path, marker):
    """A new run replaced the earlier policy, appended its TensorBoard events to the earlier ones,
    and left the earlier run's best-policy beside its own policy when it kept none."""
    out = tmp_path / "run"
    (out / marker).mkdir(parents=True)
    r = samm_train("--problem", "microservice-cores", "--app", "chain3", "--steps", "600", "--envs", "2", "--quiet",
                   "--out", str(out))
    assert r.exit_code == 2 and "already holds a training run" in r.output and marker in r.output, r.output
    assert sorted(p.name for p in out.iterdir()) == [marker]


@pytest.mark.parametrize("flags, says", [
    (["--steps", "-5"], "--steps must be >= 1, not -5"),       # was an IndexError on the empty log
    # --seed -1 makes the unfixed trainer fail at once; fixed, --steps 0 is named first (it ran 240,000)
    (["--steps", "0", "--seed", "-1"], "--steps must be >= 1, not 0"),
    (["--episodes", "0", "--seed", "-1"], "--episodes must be >= 1, not 0"),
    (["--steps", "600", "--seed", "-1"], "--seed must be >= 0"),
    (["--steps", "600", "--envs", "-2"], "--envs must be >= 1"),
    (["--steps", "600", "--threads", "0"], "--threads must be >= 1"),
    (["--steps", "600", "--target-entropy", "nan"], "target_entropy must be a finite number"),
])
def test_microservice_refuses_bad_options_by_name(tmp_path, flags, says):
    r = samm_train("--problem", "microservice-cores", "--app", "chain3", *flags, "--quiet", "--out", str(tmp_path / "x"))
    assert r.exit_code == 2 and says in r.output, r.output
    assert not (tmp_path / "x").exists()


def test_microservice_best_policy_survives_an_interrupted_resave(tmp_path, monkeypatch):
    """`best-policy` is rewritten at every better checkpoint; written in place, a Ctrl-C between its
    weights and its metadata left the new weights under the old metadata (or a truncated weights.pt).
    Here the interrupt comes at the metadata write: the earlier best must stay whole."""
    import pathlib
    from dataclasses import replace

    from agents.microservice_cores.train import sim_config, train

    # one episode of the AutoScale fill, then one of SAC, which ends in an evaluation that saves the best
    cfg = sim_config(n_envs=1, hidden=16, classifier_updates=5, replay=20_000, updates_per_step=1,
                     autoscale_steps=300, classifier_steps=0, total_steps=600)
    earlier = tmp_path / "run" / "best-policy"
    earlier.mkdir(parents=True)
    (earlier / "weights.pt").write_bytes(b"the earlier best's weights")
    (earlier / "metadata.json").write_text('{"the earlier best": true}')
    before = digests(earlier)
    write_text = pathlib.Path.write_text

    def interrupted(self, *args, **kwargs):
        if self.name in ("metadata.json", ".metadata.json.tmp") and self.parent.name.startswith("best-policy"):
            raise KeyboardInterrupt     # what SIGINT raises, between the weights and the metadata
        return write_text(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "write_text", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train("chain3", replace(cfg), seed=3, out=tmp_path / "run", progress=False, eval_every=600,
              eval_seeds=(101,), best_max_violation=1.0)
    assert digests(earlier) == before


# --- interrupted runs keep their logs -------------------------------------------------------------
def interrupt_on_call(n: int, fn):
    """`fn`, raising what SIGINT raises on its n-th call."""
    calls = {"n": 0}

    def wrapped(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == n:
            raise KeyboardInterrupt
        return fn(*args, **kwargs)
    return wrapped


def csv_rows(path: Path) -> int:
    return len(path.read_text().splitlines()) - 1


def test_an_interrupted_lra_run_keeps_its_log_and_saves_no_policy(tmp_path, monkeypatch):
    """The per-update log was only written after the last update: Ctrl-C lost all of it."""
    import agents.lra_placement.train as lra

    monkeypatch.setattr(lra, "rollout", interrupt_on_call(3, lra.rollout))
    with pytest.raises(KeyboardInterrupt):
        lra.main([*LRA_TINY, "--episodes", "64", "--out", str(tmp_path / "run")])
    assert csv_rows(tmp_path / "run" / "train-log.csv") == 2
    assert not (tmp_path / "run" / "policy.pt").exists() and not (tmp_path / "run" / "metadata.json").exists()


def test_an_interrupted_oversub_run_keeps_its_log(tmp_path, monkeypatch):
    import agents.oversubscription.train as oversub

    monkeypatch.setattr(oversub, "run_training_episode", interrupt_on_call(3, oversub.run_training_episode))
    with pytest.raises(KeyboardInterrupt):
        oversub.main(["--setting", "tiny", "--episodes", "4", "--updates-per-episode", "2", "--quiet",
                      "--out", str(tmp_path / "run")])
    assert csv_rows(tmp_path / "run" / "train-log.csv") == 2
    assert not (tmp_path / "run" / "weights.pt").exists()


def test_an_interrupted_microservice_run_keeps_its_log(tmp_path, monkeypatch):
    import agents.microservice_cores.train as mc

    monkeypatch.setattr(mc, "write_progress", interrupt_on_call(1, mc.write_progress))
    with pytest.raises(KeyboardInterrupt):   # after the first of two episodes of one copy
        mc.main(["--app", "chain3", "--steps", "600", "--envs", "1", "--quiet", "--out", str(tmp_path / "run")])
    assert csv_rows(tmp_path / "run" / "training.csv") == 1
    assert not (tmp_path / "run" / "policy").exists()


def test_an_interrupted_policy_save_leaves_the_saved_policy_whole(tmp_path, monkeypatch):
    """save_torch_policy wrote over weights.pt in place: a Ctrl-C mid-write left a torn file."""
    import torch

    from agents.oversubscription.policy import OversubPolicy, shipped_policy

    policy = shipped_policy()
    policy.save(tmp_path / "p")
    before = (tmp_path / "p" / "weights.pt").read_bytes()
    real_save = torch.save

    def torn_save(obj, path, *a, **kw):
        Path(path).write_bytes(b"PK\x03\x04 half a file")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", torn_save)
    with pytest.raises(KeyboardInterrupt):
        policy.save(tmp_path / "p")
    monkeypatch.setattr(torch, "save", real_save)
    assert (tmp_path / "p" / "weights.pt").read_bytes() == before
    OversubPolicy.load(tmp_path / "p")  # still loads
