"""Training, evaluation and experiment lifecycle under faults: interrupted and resumed runs,
unreadable checkpoints and policies, NaN, reused or unusable output folders, failing workers."""
from __future__ import annotations

import csv
import io
import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from agents.base import load_agent
from agents.parallel import WorkerDied, map_runs
from agents.ppo.agent import LstmPpoAgent
from agents.ppo.config import PPOConfig
from agents.ppo.train import train
from samm.cli.main import cli
from sim_bridge.config import SimConfig
from sim_bridge.workloads import Workload

REPO = Path(__file__).resolve().parents[1]
SIM = SimConfig(action_mode="per-type", max_steps=40)
TINY_PPO = dict(num_envs=1, num_steps=32, bptt_chunk=8, num_minibatches=2, max_episode_steps=40, seed=3,
                eval_every=0, checkpoint_every=1)
# the same, as `samm train` flags: four updates of 32 steps in one env
TINY_TRAIN_FLAGS = ["--timesteps", "128", "--envs", "1", "--eval-every", "0", "--quiet", "--ppo",
                    json.dumps({k: TINY_PPO[k] for k in ("num_steps", "bptt_chunk", "num_minibatches",
                                                         "max_episode_steps")})]


def tiny_workload() -> Workload:
    arrivals = np.repeat(60.0 + 300.0 * np.arange(4), 40)
    n = len(arrivals)
    return Workload("tiny", arrivals, np.full(n, 240.0 * 4400), np.ones(n, np.int32), np.full(n, 0.5))


def make_envs(n: int, seed: int):
    from sim_bridge.envs import CloudSimVectorEnv

    return CloudSimVectorEnv(n, SIM, tiny_workload())


def column(path: Path, name: str) -> list[float]:
    with path.open() as f:
        return [float(r[name]) for r in csv.DictReader(f)]


def interrupt_at(update_to_stop: int):
    """An on_update callback that raises what SIGINT raises, at the end of that update."""
    def on_update(update, net, obs_rms):
        if update == update_to_stop:
            raise KeyboardInterrupt
    return on_update


# ---- checkpoints -----------------------------------------------------------------------------

@pytest.mark.jvm
def test_an_interrupted_checkpoint_save_leaves_the_last_checkpoint_whole(tmp_path, monkeypatch):
    """A kill while the checkpoint is written once left a truncated checkpoint.pt: the run could
    not be resumed at all."""
    real_save, calls = torch.save, {"n": 0}

    def save_killed_halfway(obj, f, *a, **kw):
        calls["n"] += 1
        if calls["n"] < 2:
            return real_save(obj, f, *a, **kw)
        buf = io.BytesIO()
        real_save(obj, buf)
        Path(f).write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", save_killed_halfway)
    with pytest.raises(KeyboardInterrupt):
        train(PPOConfig(total_timesteps=128, **TINY_PPO), make_envs, tmp_path, progress=False)
    monkeypatch.setattr(torch, "save", real_save)
    ck = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    assert ck["update"] == 1
    res = train(PPOConfig(total_timesteps=128, **TINY_PPO), make_envs, tmp_path, resume=True, progress=False)
    assert res.global_step == 128 and column(tmp_path / "progress.csv", "update") == [1, 2, 3, 4]


@pytest.mark.jvm
def test_an_unreadable_or_foreign_checkpoint_is_a_clear_error(tmp_path):
    train(PPOConfig(total_timesteps=32, **TINY_PPO), make_envs, tmp_path, progress=False)
    good = (tmp_path / "checkpoint.pt").read_bytes()
    # another network: a run with a smaller LSTM resumed from this folder
    with pytest.raises(ValueError, match=r"checkpoint\.pt: written by a run with another network.*size mismatch"):
        train(PPOConfig(total_timesteps=64, **{**TINY_PPO, "lstm_hidden": 16}), make_envs, tmp_path, resume=True,
              progress=False)
    (tmp_path / "checkpoint.pt").write_bytes(good[: len(good) // 2])
    with pytest.raises(ValueError, match=r"checkpoint\.pt: not a readable training checkpoint"):
        train(PPOConfig(total_timesteps=64, **TINY_PPO), make_envs, tmp_path, resume=True, progress=False)
    torch.save({"weights": torch.zeros(3)}, tmp_path / "checkpoint.pt")
    with pytest.raises(ValueError, match=r"checkpoint\.pt: not a training checkpoint \(no 'model'\)"):
        train(PPOConfig(total_timesteps=64, **TINY_PPO), make_envs, tmp_path, resume=True, progress=False)


# ---- reused run folders and resume -----------------------------------------------------------

@pytest.mark.jvm
def test_a_fresh_run_refuses_a_folder_that_holds_an_earlier_run(tmp_path):
    """It once appended its rows to the earlier run's progress.csv and episodes.csv (the
    experiment's figures read them) and replaced its checkpoint."""
    out = tmp_path / "run"
    r = CliRunner().invoke(cli, ["train", *TINY_TRAIN_FLAGS, "--out", str(out)])
    assert r.exit_code == 0, r.output
    before = (out / "progress.csv").read_text()
    r = CliRunner().invoke(cli, ["train", *TINY_TRAIN_FLAGS, "--out", str(out)])
    assert r.exit_code == 2 and "already holds a training run" in r.output and "--resume" in r.output, r.output
    assert (out / "progress.csv").read_text() == before
    with pytest.raises(ValueError, match="already holds a training run"):
        train(PPOConfig(total_timesteps=32, **TINY_PPO), make_envs, out, progress=False)
    r = CliRunner().invoke(cli, ["train", *TINY_TRAIN_FLAGS, "--out", str(out), "--resume"])
    assert r.exit_code == 0 and column(out / "progress.csv", "update") == [1, 2, 3, 4], r.output


@pytest.mark.jvm
def test_resume_after_an_interruption_logs_each_update_and_episode_once(tmp_path):
    """Rows logged after the last checkpoint were logged again by the resumed run."""
    cfg = dict(TINY_PPO, checkpoint_every=2)
    with pytest.raises(KeyboardInterrupt):
        train(PPOConfig(total_timesteps=160, **cfg), make_envs, tmp_path, progress=False, on_update=interrupt_at(3))
    assert column(tmp_path / "progress.csv", "update") == [1, 2, 3]
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=False)["update"] == 2
    for name in ("progress.csv", "episodes.csv"):  # a kill in the middle of writing a row
        with (tmp_path / name).open("a") as f:
            f.write("96,4")
    res = train(PPOConfig(total_timesteps=160, **cfg), make_envs, tmp_path, resume=True, progress=False)
    assert res.global_step == 160
    assert column(tmp_path / "progress.csv", "update") == [1, 2, 3, 4, 5]
    steps = column(tmp_path / "episodes.csv", "global_step")
    assert steps == sorted(steps) and steps[-1] <= 160


@pytest.mark.jvm
def test_resume_keeps_the_evaluations_and_the_snapshot_that_scored_best(tmp_path):
    """A resumed run once forgot the evaluations made before the interruption (it could save a
    worse snapshot), and resuming a finished run replaced the best snapshot by the last weights."""
    from agents.training import train_lstm_ppo

    ppo = dict(TINY_PPO, eval_every=1)

    def stop_at_3(row):
        if row["update"] == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_lstm_ppo(SIM, tiny_workload(), PPOConfig(total_timesteps=128, **ppo), tmp_path, progress=False,
                       eval_seeds=(7,), on_eval=stop_at_3)
    _, summary = train_lstm_ppo(SIM, tiny_workload(), PPOConfig(total_timesteps=128, **ppo), tmp_path, resume=True,
                                progress=False, eval_seeds=(7,))
    assert [e["update"] for e in summary["evaluations"]] == [1, 2, 3, 4]
    best = min(summary["evaluations"], key=lambda e: e["score"])
    assert summary["selected_update"] == best["update"]
    saved = (tmp_path / "policy" / "policy.pt").read_bytes()
    # resumed again, already complete: the same evaluations and the same policy
    _, again = train_lstm_ppo(SIM, tiny_workload(), PPOConfig(total_timesteps=128, **ppo), tmp_path, resume=True,
                              progress=False, eval_seeds=(7,))
    assert again["evaluations"] == summary["evaluations"] and again["selected_update"] == best["update"]
    first, second = torch.load(io.BytesIO(saved)), torch.load(tmp_path / "policy" / "policy.pt")
    assert all(torch.equal(first[k], second[k]) for k in first)


# ---- NaN -------------------------------------------------------------------------------------

@pytest.mark.jvm
def test_nan_weights_stop_training_with_a_named_error_before_any_checkpoint(tmp_path):
    """Fine-tuning from a policy with a NaN weight once trained on and saved NaN everywhere."""
    start = LstmPpoAgent(("a",) * 7, "per-type", ("S", "M", "L"))
    state = {k: v.clone() for k, v in start.net.state_dict().items()}
    state["policy.bias"][0] = float("nan")
    with pytest.raises(ValueError, match=r"update 1: .* is not finite"):
        train(PPOConfig(total_timesteps=64, **TINY_PPO), make_envs, tmp_path, progress=False, init=(state, None))
    assert not (tmp_path / "checkpoint.pt").exists()


# ---- saved policies --------------------------------------------------------------------------

def test_an_unreadable_or_non_finite_policy_is_a_clear_error(tmp_path):
    """Garbage weights were an UnpicklingError traceback; NaN weights loaded, and their NaN
    probabilities chose action 0 (remove a VM) of every type; a normaliser of another feature
    set failed at the first decision."""
    from sim_bridge.envs import feature_names_of

    sim = SimConfig(action_mode="per-type")
    policy = tmp_path / "policy"
    LstmPpoAgent(feature_names_of("paper", sim), "per-type", ("S", "M", "L")).save(policy)
    weights = (policy / "policy.pt").read_bytes()
    (policy / "policy.pt").write_text("garbage\n")
    with pytest.raises(ValueError, match=r"policy\.pt: not the policy\.pt metadata\.json was saved with"):
        load_agent(policy)
    # the readers themselves, as for a policy saved before saves recorded digests (the shipped ones)
    meta = json.loads((policy / "metadata.json").read_text())
    (policy / "metadata.json").write_text(json.dumps({k: v for k, v in meta.items()
                                                      if k not in ("weights_sha256", "files_sha256")}))
    with pytest.raises(ValueError, match=r"policy\.pt: not a readable PyTorch state dict"):
        load_agent(policy)
    r = CliRunner().invoke(cli, ["evaluate", "--agent", "lstm-ppo", "--policy", str(policy), "--seeds", "1"])
    assert r.exit_code == 2 and "not a readable PyTorch state dict" in r.output and "Traceback" not in r.output

    state = torch.load(io.BytesIO(weights))
    state["lstm.weight_hh_l0"][0, 0] = float("nan")
    torch.save(state, policy / "policy.pt")
    with pytest.raises(ValueError, match=r"lstm\.weight_hh_l0 holds NaN"):
        load_agent(policy)

    (policy / "policy.pt").write_bytes(weights)
    (policy / "obs_rms.json").write_text(json.dumps({"mean": [0.0] * 18, "var": [1.0] * 18, "count": 5}))
    with pytest.raises(ValueError, match="normalises 18 features, the policy reads 7"):
        load_agent(policy)
    (policy / "obs_rms.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"obs_rms\.json: not a saved observation normaliser"):
        load_agent(policy)


# ---- summaries and unusable output folders ---------------------------------------------------

def test_write_summary_replaces_the_file_whole(tmp_path):
    """summary.json was rewritten in place: a reader (or a kill) mid-write saw half a file."""
    from agents.report import Target, experiment_summary, write_summary

    def summary(value):
        return experiment_summary("autoscaling", {"title": "t", "file": "f"}, {}, {"m": {"cost": [value]}}, {},
                                  [Target("t", value, ">= 0", True)])

    write_summary(tmp_path, summary(1.0))
    os.link(tmp_path / "summary.json", tmp_path / "reader-holds-this.json")  # what an open reader sees
    write_summary(tmp_path, summary(2.0))
    assert json.loads((tmp_path / "reader-holds-this.json").read_text())["targets"][0]["value"] == 1.0
    assert json.loads((tmp_path / "summary.json").read_text())["targets"][0]["value"] == 2.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reader-holds-this.json", "summary.json"]


def test_an_unusable_out_is_a_clear_error_before_any_work(tmp_path):
    """An --out under a file was a NotADirectoryError traceback; `samm tune` found out only after
    the whole grid search."""
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    out = str(blocked / "sub")
    for args in (["experiment", "run", "--problem", "lra-placement", "--quick", "--quiet", "--out", out],
                 ["experiment", "paper", "--policy", str(REPO / "agents/policies/lstm-ppo-default"), "--no-swf",
                  "--fast-tuning", "--quiet", "--out", out],
                 ["tune", "--agent", "threshold", "--seeds", "1", "--json", "--out", out],
                 ["train", *TINY_TRAIN_FLAGS, "--out", out]):
        r = CliRunner().invoke(cli, args)
        said = ("Not a directory", "is a file (or lies under one)")  # the OS's words, or prepare_out's
        assert r.exit_code == 2 and any(s in r.output for s in said), (args, r.output, r.exception)
        assert isinstance(r.exception, SystemExit), (args, r.exception)  # _fail's, not a traceback
    r = CliRunner().invoke(cli, ["experiment", "paper", "--out", str(tmp_path / "x"), "--ppo", '{"lerning_rate": 1}'])
    assert r.exit_code == 2 and "invalid PPO settings" in r.output and "lerning_rate" in r.output, r.output
    # a policy of another problem: its metadata named, not a traceback
    r = CliRunner().invoke(cli, ["experiment", "paper", "--out", str(tmp_path / "y"), "--no-swf", "--quiet",
                                 "--policy", str(REPO / "agents/deferrable_jobs/policies/osdec-default")])
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit) and "a policy of the 'deferrable-jobs' problem" \
        in r.output, r.output


# ---- parallel runs ---------------------------------------------------------------------------

def _diverges_on_b(job):
    if job == ("b", 2):
        raise ValueError("diverged")
    return job


def _killed_on_b(job):
    if job == ("b", 2):
        os.kill(os.getpid(), signal.SIGKILL)
    return job


def _first_fails_others_record(job):
    folder, i = job
    if i == 0:
        raise ValueError("diverged")
    time.sleep(0.5)
    (Path(folder) / f"ran-{i}").touch()
    return i


def test_a_failing_or_killed_run_names_its_job_and_ends_the_map(tmp_path):
    """A run that raised gave its bare exception (which cell?) only after every other queued run
    had finished (hours, in an experiment); a killed worker gave BrokenProcessPool, naming nothing."""
    jobs = [("a", 1), ("b", 2), ("c", 3)]
    for workers in (1, 2):
        with pytest.raises(ValueError, match="diverged") as info:
            map_runs(_diverges_on_b, jobs, workers=workers, progress=False, desc="cells")
        assert "cells: in the run of job ('b', 2)" in info.value.__notes__
    with pytest.raises(WorkerDied, match=r"cells: a worker process died .* unfinished, among them .*\('b', 2\)"):
        map_runs(_killed_on_b, jobs, workers=2, progress=False, desc="cells")
    n = 16
    with pytest.raises(ValueError, match="diverged"):
        map_runs(_first_fails_others_record, [(str(tmp_path), i) for i in range(n)], workers=2, progress=False)
    assert len(list(tmp_path.glob("ran-*"))) < n - 1  # the runs not started were dropped


# ---- tuning and the paper experiment ---------------------------------------------------------

@pytest.mark.jvm
def test_tuning_results_are_strict_json_when_episodes_do_not_finish():
    """An episode cut before its last job made the candidate's makespan inf, and `samm tune
    --json` printed `Infinity`, which is not JSON (jq and other strict parsers reject it)."""
    from agents.tune import tune
    from sim_bridge.workloads import seed_1551

    res = tune("threshold", SimConfig(action_mode="per-type", max_steps=20), seed_1551(), [1],
               grid={"upper": [0.8], "lower": [0.2], "cooldown_steps": [0]}, progress=False)
    res.pop("agent")
    row = json.loads(json.dumps(res, allow_nan=False))["results"][0]
    assert row["makespan_s"] is None and row["episodes_unfinished"] == 1


def test_the_paper_experiment_refuses_an_out_that_holds_its_training_run(tmp_path):
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "progress.csv").write_text("global_step,update\n32,1\n")
    r = CliRunner().invoke(cli, ["experiment", "paper", "--out", str(tmp_path), "--timesteps", "32", "--seeds", "1",
                                 "--tune-seeds", "101", "--no-swf", "--fast-tuning", "--quiet", "--ppo",
                                 json.dumps({"num_envs": 1, "num_steps": 32, "bptt_chunk": 8, "num_minibatches": 2})])
    assert r.exit_code == 2 and "already holds a training run" in r.output and "--policy" in r.output, r.output
    assert (tmp_path / "train" / "progress.csv").read_text() == "global_step,update\n32,1\n"


def test_a_baseline_parameter_of_the_wrong_type_is_a_clear_error():
    """`samm evaluate --params '{"upper": "x"}'` was a TypeError traceback."""
    for agent, params in (("threshold", '{"upper": "x"}'), ("queue", '{"jobs_per_core": "x"}')):
        r = CliRunner().invoke(cli, ["evaluate", "--agent", agent, "--params", params, "--seeds", "1"])
        assert r.exit_code == 2 and isinstance(r.exception, SystemExit), (agent, r.output, r.exception)
        assert f"error: --agent {agent}:" in r.output, r.output


def test_a_policy_reading_features_the_simulation_lacks_is_a_clear_error(tmp_path):
    """A policy of another feature set was a ValueError traceback from the episode runner."""
    import shutil

    policy = tmp_path / "policy"
    shutil.copytree(REPO / "agents/policies/lstm-ppo-paper", policy)
    meta = json.loads((policy / "metadata.json").read_text())
    meta["feature_names"][0] = "bogus_metric"
    (policy / "metadata.json").write_text(json.dumps(meta))
    r = CliRunner().invoke(cli, ["evaluate", "--agent", "lstm-ppo", "--policy", str(policy), "--seeds", "1"])
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit), (r.output, r.exception)
    assert "reads feature(s) ['bogus_metric']" in r.output, r.output


def test_tune_refuses_to_save_over_a_policy_of_another_kind(tmp_path):
    """`samm tune --out` into a trained policy's folder replaced its metadata.json by the rule's:
    the LSTM weights stayed, but nothing could load them as lstm-ppo any more."""
    import shutil

    policy = tmp_path / "policy"
    shutil.copytree(REPO / "agents/policies/lstm-ppo-paper", policy)
    before = {p.name: p.read_bytes() for p in policy.iterdir()}
    r = CliRunner().invoke(cli, ["tune", "--agent", "threshold", "--seeds", "1", "--max-steps", "20", "--json",
                                 "--out", str(policy)])
    assert r.exit_code == 2 and "holds a 'lstm-ppo' policy" in r.output, r.output
    assert {p.name: p.read_bytes() for p in policy.iterdir()} == before
