"""Carried items of the scripts' audit: the oversubscription scripts check every input before the
first seed's work and answer --help without torch, the LRA optimum's time limit bounds its wall time,
a PPO rollout retried after a lost Ray worker goes on with new workloads, and a job lease taken after
a long wait for the queue's lock starts when the lock is held."""
from __future__ import annotations

import dataclasses
import json
import sqlite3
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from test_docs_commands import BENCHMARKS, PROBE, ROOT

OVERSUB_SCRIPTS = sorted(BENCHMARKS.glob("oversub_*.py"))

# Each script run in one process, as `python benchmarks/X.py ARGS` runs it; torch is made
# unimportable, so a script that imports it before its arguments are parsed fails loudly.
_NO_TORCH = r"""
import sys

class _Refuse:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch imported before the arguments were parsed")
        return None

sys.meta_path.insert(0, _Refuse())
""" + PROBE


def _run_without_torch(cases: list[list[str]]) -> dict:
    r = subprocess.run([sys.executable, "-c", _NO_TORCH, str(BENCHMARKS), json.dumps(cases)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


# ---- 2. --help and usage errors load no torch ---------------------------------------------------
def test_every_oversub_script_answers_help_and_usage_errors_without_torch():
    # about 5 s each before: torch and the simulator were imported at module import or before parsing
    helps = [[str(s), "--help"] for s in OVERSUB_SCRIPTS]
    unknown = [[str(s), "--no-such-option"] for s in OVERSUB_SCRIPTS]
    res = _run_without_torch(helps + unknown)
    bad = {c[0]: res[" ".join(c)]["code"] for c in helps if res[" ".join(c)]["code"] != 0
           or "usage:" not in res[" ".join(c)]["stdout"]}
    bad.update({c[0]: res[" ".join(c)]["code"] for c in unknown if res[" ".join(c)]["code"] != 2})
    assert not bad, bad


def test_a_case_or_rule_checked_after_parsing_is_still_a_one_line_choice_error():
    cases = [[str(BENCHMARKS / "oversub_per_seed.py"), "--policies", "/nonexistent", "--case", "nope"],
             [str(BENCHMARKS / "oversub_rate_grid.py"), "--case", "tiny-cold", "--rule", "nope"],
             [str(BENCHMARKS / "oversub_baselines_at.py"), "--case", "nope", "--tune-alpha", "0.9"],
             [str(BENCHMARKS / "oversub_choose_anchor.py"), "--case", "nope", "--candidate", "a=/x",
              "--candidate", "b=/y"]]
    from test_docs_commands import probe

    res = probe(cases, ROOT)
    for case in cases:
        r = res[" ".join(case)]
        assert r["code"] == 2 and "Traceback" not in r["stderr"], (case, r)
        line = r["stderr"].strip().splitlines()[-1]
        assert "invalid choice: 'nope' (choose from " in line and ("tiny-cold" in line or "NSigma" in line), line


def test_the_experiment_defaults_the_help_names_are_the_experiments():
    from agents.oversubscription.experiment import FULL

    assert (FULL.test_episodes, FULL.tune_episodes) == (300, 20)   # as oversub_baselines_at/rate_grid's help say


# ---- 1. every seed's policy checked before the first is tested ----------------------------------
def _tiny_policy(out) -> None:
    from agents.oversubscription.train import main

    assert main(["--setting", "tiny", "--episodes", "3", "--seed", "1", "--updates-per-episode", "2", "--quiet",
                 "--out", str(out)]) == 0


@pytest.fixture(scope="module")
def tiny_policies(tmp_path_factory):
    """One tiny seed-1 policy in loose/ and strict/ (policies of `samm experiment c2marl`'s names)."""
    from agents.oversubscription import data

    if not (data.data_dir() / "azure-v2-2019-summary-distributions" / "cpu.txt").exists():
        pytest.skip(f"Azure summary files not under {data.data_dir()}")
    root = tmp_path_factory.mktemp("policies")
    for name in ("loose", "strict"):
        _tiny_policy(root / name / "tiny-cold-a0.95-s1")
    return root


def _bench(name: str):
    from benchmark_script import load_benchmark

    return load_benchmark(name)


def test_per_seed_refuses_a_missing_last_seed_before_testing_the_first(tiny_policies, capsys):
    # seed 1's row was computed and printed first (minutes at 300 episodes), then seed 2 failed
    mod = _bench("oversub_per_seed")
    with pytest.raises(SystemExit) as exc:
        mod.main(["--policies", str(tiny_policies / "loose"), "--case", "tiny-cold", "--seeds", "1,2",
                  "--test-episodes", "2"])
    out, err = capsys.readouterr()
    assert exc.value.code == 2 and out == ""
    assert "tiny-cold-a0.95-s2: no metadata.json" in err.strip().splitlines()[-1]
    with pytest.raises(SystemExit):     # a bad vote of the last seed, also before any row
        mod.main(["--policies", str(tiny_policies / "loose"), "--case", "tiny-cold", "--seeds", "1",
                  "--test-episodes", "2", "--votes", "max"])
    out, err = capsys.readouterr()
    assert out == "" and "single net" in err
    assert mod.main(["--policies", str(tiny_policies / "loose"), "--case", "tiny-cold", "--seeds", "1",
                     "--test-episodes", "2"]) == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (row["seed"], row["kept"]) == (1, True)


def test_choose_anchor_refuses_a_missing_candidate_of_a_later_seed_before_any_row(tiny_policies, capsys):
    # (0.95, seed 1) was measured and printed, then seed 2's missing candidate failed
    mod = _bench("oversub_choose_anchor")
    base = ["--case", "tiny-cold", "--alphas", "0.95", "--validation-episodes", "2", "--test-episodes", "2",
            "--candidate", f"loose={tiny_policies / 'loose'}", "--candidate", f"strict={tiny_policies / 'strict'}"]
    with pytest.raises(SystemExit) as exc:
        mod.main(base + ["--seeds", "1,2"])
    out, err = capsys.readouterr()
    assert exc.value.code == 2 and out == ""
    assert "candidate loose: no policy" in err and "tiny-cold-a0.95-s2" in err
    with pytest.raises(SystemExit):     # an alpha with no policy, after one that has them
        mod.main(base + ["--seeds", "1", "--alphas", "0.95,0.85"])
    out, err = capsys.readouterr()
    assert out == "" and "candidate loose: no policy" in err and "a0.85" in err
    with pytest.raises(SystemExit):
        mod.main(base + ["--seeds", "1", "--alphas", "x"])
    assert "--alphas / --seeds: could not convert" in capsys.readouterr().err
    assert mod.main(base + ["--seeds", "1"]) == 0
    row, _summary = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert row["seed"] == 1 and {c["candidate"] for c in row["candidates"]} == {"loose", "strict"}


@pytest.fixture(scope="module")
def validated_run(tiny_policies):
    """A tiny run with a checkpoint saved at each of its 2 episodes."""
    from agents.oversubscription.train import main

    good = tiny_policies / "validated"
    assert main(["--setting", "tiny", "--episodes", "2", "--seed", "1", "--updates-per-episode", "2", "--quiet",
                 "--validate-every", "1", "--validate-episodes", "1", "--out", str(good)]) == 0
    return good


def test_snapshot_ensemble_refuses_a_later_run_before_testing_the_first(tiny_policies, validated_run, capsys):
    # the first run's rows were computed and printed, then the second run had too few checkpoints
    good = validated_run
    capsys.readouterr()
    mod = _bench("oversub_snapshot_ensemble")
    assert mod.main(["--runs", str(good), str(tiny_policies / "loose"), "--last", "1", "--how", "max",
                     "--test-episodes", "2"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "fewer than --last 1" in err
    assert mod.main(["--runs", str(good), "--last", "1", "--how", "max", "--test-episodes", "2"]) == 0
    assert [json.loads(line)["how"] for line in capsys.readouterr().out.splitlines()] == ["last", "max"]


def test_validation_size_refuses_a_run_without_checkpoints_before_measuring_the_first(
        tiny_policies, validated_run, tmp_path, capsys):
    # the first run's checkpoints were measured (minutes each) and printed, then the second had none
    mod = _bench("oversub_validation_size")
    capsys.readouterr()
    args = ["--cache", str(tmp_path / "cache"), "--validation-episodes", "2", "--test-episodes", "2",
            "--sizes", "1,2"]
    assert mod.main(["--runs", str(validated_run), str(tiny_policies / "loose")] + args) == 2
    out, err = capsys.readouterr()
    assert out == "" and f"{tiny_policies / 'loose'} has no checkpoints" in err
    assert not list((tmp_path / "cache").glob("*.npz"))
    assert mod.main(["--runs", str(validated_run)] + args) == 0
    assert [json.loads(line)["checkpoint"]["episode"] for line in capsys.readouterr().out.splitlines()[:2]] == [1, 2]


# ---- 3. the optimum's time limit bounds its wall time -------------------------------------------
def test_a_short_optimum_time_limit_bounds_the_wall_time():
    # HiGHS's presolve does not look at the clock: a 0.05 s limit ran 5-7 s on 9 nodes x 8 slots
    from agents.lra_placement.cluster import Batch, Cluster, Constraints
    from agents.lra_placement.optimum import optimum
    from agents.lra_placement.predictor import SyntheticInterference

    t0 = time.perf_counter()
    try:
        optimum(Cluster(9, 8), Batch(np.full(7, 8)), Constraints.none(7), SyntheticInterference(7, seed=1),
                time_limit_s=0.05)
    except TimeoutError as exc:
        assert "within 0.05 s" in str(exc)
    assert time.perf_counter() - t0 < 2.0


def test_a_short_limit_finds_the_same_optimum_and_the_default_limit_solves_as_recorded():
    from agents.lra_placement.cluster import Batch, Cluster, Constraints
    from agents.lra_placement.optimum import OptimumParams, _presolve_fits, optimum
    from agents.lra_placement.predictor import SyntheticInterference

    # the recorded figures used the default limit (120 s, `samm experiment lra`): presolve as before
    assert _presolve_fits(OptimumParams.time_limit_s)
    args = (Cluster(27, 8), Batch(np.full(7, 20)), Constraints.none(7), SyntheticInterference(7, seed=1))
    full, short = optimum(*args), optimum(*args, time_limit_s=20.0)
    assert full.optimal and short.optimal
    assert short.value == pytest.approx(full.value, rel=1e-9)


# ---- 4. a rollout retried after a lost Ray worker draws new workloads ---------------------------
class _Numbered:
    """A workload sampler: seed-1551 named w0, w1, ... in draw order. `drawn` is the class's, so it
    also sees the draws of a copy the env rewinds to."""

    drawn: list[str] = []

    def __init__(self):
        self.n = 0

    def sample(self):
        from sim_bridge.workloads import seed_1551

        w = dataclasses.replace(seed_1551(), name=f"w{self.n}")
        self.n += 1
        _Numbered.drawn.append(w.name)
        return w


def test_a_rollout_retried_after_a_lost_ray_worker_goes_on_with_new_workloads():
    # the retry's seeded reset rewound the workload sampler: the run trained on w0, w1 again
    ray = pytest.importorskip("ray", reason="the ray extra is not installed")
    from agents.ppo.config import PPOConfig
    from agents.ppo.train import train
    from sim_bridge.config import SimConfig
    from sim_bridge.envs import CloudSimVectorEnv
    from sim_bridge.ray_batch import connect
    from test_ray_rollouts import killing_factory

    made = []
    factory = killing_factory(made)
    sim = SimConfig().model_copy(update={"max_steps": 40})
    ppo = PPOConfig(num_envs=2, num_steps=16, bptt_chunk=8, num_minibatches=2, update_epochs=2,
                    total_timesteps=2 * 16 * 3, max_episode_steps=40, lstm_hidden=16, device="cpu", seed=3,
                    checkpoint_every=1000).validate()
    _Numbered.drawn = []
    connect("local", num_cpus=2)
    try:
        result = train(ppo, lambda n, seed: CloudSimVectorEnv(n, sim, sampler=_Numbered(), batch_factory=factory),
                       progress=False)
    finally:
        ray.shutdown()
    assert made[0].replaced == 1 and result.history[-1]["rollouts_discarded"] == 1
    assert len(_Numbered.drawn) >= 4                      # construction, first reset, the retry's reset
    assert len(set(_Numbered.drawn)) == len(_Numbered.drawn), _Numbered.drawn


# ---- 5. a job lease starts when the queue's lock is held ----------------------------------------
def _hold_lock(path, seconds: float) -> threading.Thread:
    """Another process's writer: holds the database's write lock for `seconds`."""
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("BEGIN IMMEDIATE")

    def release():
        time.sleep(seconds)
        db.execute("COMMIT")
        db.close()

    t = threading.Thread(target=release)
    t.start()
    return t


def _expires(path, job_id: int) -> float:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT lease_expires FROM jobs WHERE id = ?", (job_id,)).fetchone()[0]


def test_a_lease_taken_after_a_long_lock_wait_is_not_born_expired(tmp_path):
    # dated from the caller's time before a 2 s wait, a 1.5 s lease had expired when it was handed
    # out, and the next worker's lease call re-queued the job its holder had just started
    from samm.testbed.jobqueue import JobQueue

    path = tmp_path / "queue.sqlite"
    with JobQueue(path) as q, JobQueue(path) as other:
        q.submit(1, 1, 50.0, submitted_at=0.0)
        holder = _hold_lock(path, 2.0)
        now = time.time()
        (job,) = q.lease("A", 1, now_wall=now, lease_s=1.5, clock_now=0.0)
        handed = time.time()
        holder.join()
        assert handed - now >= 1.8
        assert _expires(path, 1) >= handed + 1.0
        assert other.requeue_expired(time.time()) == 0
        # a heartbeat after a long wait renews from when it is written, too
        holder = _hold_lock(path, 2.0)
        now = time.time()
        assert q.heartbeat("A", now, 1.5) == 1
        written = time.time()
        holder.join()
        assert _expires(path, 1) >= written + 1.0
        assert q.complete(1, "A", 5.0, attempt=job.attempt)


def test_a_lease_without_a_lock_wait_keeps_the_callers_time(tmp_path):
    from samm.testbed.jobqueue import JobQueue

    path = tmp_path / "queue.sqlite"
    with JobQueue(path) as q:
        q.submit(1, 1, 50.0, submitted_at=0.0)
        q.lease("A", 1, now_wall=1000.0, lease_s=2.0, clock_now=0.0)
        assert _expires(path, 1) == 1002.0


def test_ray_rollouts_refuses_more_workers_than_envs_before_the_first_case():
    """`--workers 0,1,16 --envs 8` ran cases 0 and 1 (minutes) before case 16 failed with a
    traceback: every case is checked against --envs first."""
    r = subprocess.run([sys.executable, str(BENCHMARKS / "ray_rollouts.py"), "--workers", "0,1,16", "--envs", "8"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "--workers must be <= --envs (8)" in r.stderr and "got 16" in r.stderr
