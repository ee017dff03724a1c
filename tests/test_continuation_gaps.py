"""Training continuation and CLI interrupts, the gaps earlier rounds left: a fine-tune without
`norm_obs` dropped the starting normaliser; a continued Reclaimer run restarted Adam at the initial
policy's rate; Ctrl-C in `samm evaluate`, `samm tune` and `samm policy promote` was click's
"Aborted!"; CloudSimVectorEnv's infos after an autoreset and its seeded resets with a sampler."""
from __future__ import annotations

import dataclasses
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch

from agents.ppo.config import PPOConfig
from sim_bridge.config import SimConfig
from sim_bridge.workloads import Workload
from test_cli_second_audit import _interrupt, _long_trace
from test_training_audit import make_envs, tiny_workload

ROOT = Path(__file__).resolve().parents[1]
SIM = SimConfig(action_mode="per-type", max_steps=40)
TINY_PPO = dict(num_envs=1, num_steps=32, bptt_chunk=8, num_minibatches=2, max_episode_steps=40, seed=3,
                eval_every=0, checkpoint_every=1)


# --- 1. fine-tuning a policy with norm_obs false ------------------------------------------------

def _start_policy(tmp_path: Path, with_normaliser: bool) -> Path:
    """An lstm-ppo policy (random weights) whose normaliser is far from the identity."""
    from agents.ppo.agent import LstmPpoAgent
    from agents.ppo.normalize import RunningMeanStd
    from sim_bridge.envs import feature_names_of

    rms = None
    if with_normaliser:
        names = feature_names_of("paper", SIM)
        rms = RunningMeanStd((len(names),))
        rms.mean, rms.var, rms.count = np.full(len(names), 0.3), np.full(len(names), 0.04), 5000.0
    torch.manual_seed(0)
    agent = LstmPpoAgent(feature_names_of("paper", SIM), "per-type", ("S", "M", "L"), obs_rms=rms,
                         params={"lstm_hidden": 128})
    return agent.save(tmp_path / "start")


@pytest.mark.jvm
def test_fine_tuning_with_norm_obs_false_keeps_the_starting_normaliser_frozen(tmp_path):
    """The fine-tuned policy was saved without any normaliser: it read raw observations its weights
    never learned on (the starting policy's every decision changed before a single update)."""
    from agents.base import load_agent
    from agents.training import train_lstm_ppo

    start = _start_policy(tmp_path, with_normaliser=True)
    ppo = PPOConfig(total_timesteps=64, **{**TINY_PPO, "norm_obs": False, "learning_rate": 0.0, "anneal_lr": False})
    train_lstm_ppo(SIM, tiny_workload(), ppo, tmp_path / "run", progress=False, init_policy=start)
    tuned, before = load_agent(tmp_path / "run" / "policy"), load_agent(start)
    assert tuned.obs_rms is not None, "the starting normaliser was dropped"
    # frozen: not refitted to the fine-tuning's observations
    np.testing.assert_array_equal(tuned.obs_rms.mean, before.obs_rms.mean)
    np.testing.assert_array_equal(tuned.obs_rms.var, before.obs_rms.var)
    assert tuned.obs_rms.count == before.obs_rms.count


@pytest.mark.jvm
def test_fine_tuning_a_policy_trained_without_a_normaliser_keeps_raw_observations(tmp_path):
    """With norm_obs true (the default) a fresh normaliser was fitted under weights that learned on
    raw observations: every input moved at once."""
    from agents.base import load_agent
    from agents.ppo.train import train

    start = load_agent(_start_policy(tmp_path, with_normaliser=False))
    res = train(PPOConfig(total_timesteps=32, **TINY_PPO), make_envs, None, progress=False,
                init=(start.net.state_dict(), None))
    assert res.obs_rms is None


# --- 2. a continued Reclaimer run: Adam's state and the config's rate ---------------------------

def _tiny_sac(**overrides):
    from agents.microservice_cores.train import sim_config

    return sim_config(**{**dict(n_envs=2, hidden=16, classifier_updates=5, replay=20_000, updates_per_step=1,
                                autoscale_steps=600, classifier_steps=0, total_steps=1200), **overrides})


@pytest.fixture(scope="module")
def sac_run(tmp_path_factory):
    from agents.microservice_cores.train import train

    out = tmp_path_factory.mktemp("sac") / "run"
    train("chain3", _tiny_sac(), seed=1, out=out, progress=False)
    return out


def _actor_steps(agent) -> int:
    return int(max(s["step"] for s in agent.opt_actor.state.values()))


def _continue(policy_dir: Path, cfg, caplog):
    from agents.microservice_cores.policy import ReclaimerPolicy
    from agents.microservice_cores.train import train

    caplog.clear()
    with caplog.at_level(logging.WARNING):
        return train("chain3", cfg, seed=2, progress=False, init=ReclaimerPolicy.load(policy_dir).agent,
                     init_from=str(policy_dir), keep_norm=True)


def test_a_continued_reclaimer_run_resumes_adam_at_the_configs_rate(sac_run, tmp_path, caplog):
    """--continue built fresh Adam optimisers (moments and step counts from zero) at the initial
    policy's learning rate, whatever the run's config said. A policy saved without the state (the
    shipped ones, saved before it was kept) still continues, with Adam fresh and a line saying so."""
    import shutil

    from agents.microservice_cores.policy import ReclaimerPolicy
    from agents.microservice_cores.train import OPTIMISER_FILE

    policy_dir = sac_run / "policy"
    saved = torch.load(policy_dir / OPTIMISER_FILE, weights_only=False)["optimizers"]["actor"]["state"]
    saved_steps = int(max(s["step"] for s in saved.values()))
    assert saved_steps > 0
    assert ReclaimerPolicy.load(policy_dir).agent.opt_actor.param_groups[0]["lr"] == 3e-4
    # two episodes: a continued run learns once its fresh replay holds one episode of every copy
    cfg = _tiny_sac(lr=1e-4, alpha_lr=2e-3, autoscale_steps=0, total_steps=1200)
    resumed = _continue(policy_dir, cfg, caplog)
    assert "Adam starts fresh" not in caplog.text
    assert [g["lr"] for g in resumed.agent.opt_actor.param_groups] == [1e-4]
    assert [g["lr"] for g in resumed.agent.opt_critic.param_groups] == [1e-4]
    assert [g["lr"] for g in resumed.agent.opt_alpha.param_groups] == [2e-3]
    assert resumed.agent.cfg.lr == 1e-4

    older = tmp_path / "older"
    shutil.copytree(policy_dir, older)
    (older / OPTIMISER_FILE).unlink()
    fresh = _continue(older, cfg, caplog)
    assert "no optimiser state saved with it" in caplog.text and "Adam starts fresh" in caplog.text
    # the same updates on top of the saved ones
    assert 0 < _actor_steps(fresh.agent) and _actor_steps(resumed.agent) == saved_steps + _actor_steps(fresh.agent)

    # an optimizer.pt beside other weights (a folder overwritten by hand) is not resumed
    other = tmp_path / "other"
    fresh.save(other)
    shutil.copy(policy_dir / OPTIMISER_FILE, other / OPTIMISER_FILE)
    _continue(other, _tiny_sac(autoscale_steps=0, total_steps=600), caplog)
    assert "saved with other weights" in caplog.text and "Adam starts fresh" in caplog.text


def test_the_cli_continue_resumes_and_saves_the_optimiser_state(sac_run, tmp_path, capsys):
    from agents.microservice_cores.train import OPTIMISER_FILE, main

    out = tmp_path / "cont"
    assert main(["--app", "chain3", "--envs", "2", "--quiet", "--steps", "600", "--init-policy",
                 str(sac_run / "policy"), "--continue", "--out", str(out)]) == 0
    assert "Adam starts fresh" not in capsys.readouterr().err
    assert (out / "policy" / OPTIMISER_FILE).is_file()


# --- 3. Ctrl-C in evaluate, tune and policy promote ----------------------------------------------

def _simulating(pid: int) -> bool:
    """The verb's gateway JVM is up: it is simulating, past its imports and option checks."""
    try:
        return any("samm-gateway" in " ".join(c.cmdline()) for c in psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return False


def _interrupt_while_simulating(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    return _interrupt(args, started=lambda p: _simulating(p.pid), timeout=timeout, settle_s=2.0)


@pytest.mark.slow  # a real 20,000-job simulation, timed against a signal: tens of seconds each
@pytest.mark.jvm
@pytest.mark.parametrize("verb", ["evaluate", "tune", "promote"])
def test_interrupted_evaluate_tune_and_promote_exit_130_naming_what_they_kept(tmp_path, verb):
    """Each was click's bare "Aborted!" (exit 1), naming neither what was written nor (promote)
    whether the installed policy was replaced."""
    from agents.factory import make_agent

    trace = str(_long_trace(tmp_path / "long.swf"))
    if verb == "evaluate":
        args, says = ["evaluate", "--agent", "queue", "--workload", trace, "--seeds", "1-3"], "nothing written"
    elif verb == "tune":
        args, says = ["tune", "--agent", "queue", "--workload", trace, "--seeds", "1", "--out",
                      str(tmp_path / "tuned")], f"nothing saved to {tmp_path / 'tuned'}"
    else:
        for name in ("cand", "live"):
            make_agent("threshold", SimConfig(), {"upper": 0.75, "lower": 0.25}).save(tmp_path / name)
        before = (tmp_path / "live" / "metadata.json").read_text()
        args = ["policy", "promote", "--candidate", str(tmp_path / "cand"), "--incumbent", str(tmp_path / "live"),
                "--workload", trace, "--seeds", "1-2", "--install", str(tmp_path / "live")]
        says = f"not promoted; {tmp_path / 'live'} left as it was"
    r = _interrupt_while_simulating(args)
    assert r.returncode == 130, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and "Aborted" not in r.stderr, r.stderr[-2000:]
    line = r.stderr.strip().splitlines()[-1]
    name = "policy promote" if verb == "promote" else verb
    assert line == f"error: {name}: interrupted; {says}", r.stderr[-2000:]
    if verb == "tune":
        assert not (tmp_path / "tuned").exists()   # the folder it made for the result, not left empty
    if verb == "promote":
        assert (tmp_path / "live" / "metadata.json").read_text() == before
        assert not (tmp_path / "live.previous").exists()


# --- 4. CloudSimVectorEnv: infos after an autoreset, seeded resets with a sampler -------------------

@pytest.mark.jvm
def test_vector_env_infos_after_an_autoreset_are_the_new_episodes_and_final_info_the_ended_ones():
    """In SAME_STEP mode the info beside the new episode's first observation is its reset info; it
    kept the ended step's (step count at max_steps, the last fleet and queue) but for the mask."""
    from sim_bridge.envs import CloudSimVectorEnv

    cfg = SimConfig(max_steps=5)
    venv = CloudSimVectorEnv(2, cfg, "seed-1551")
    try:
        _, first = venv.reset(seed=[1, 2])
        add = np.array([1, 3])     # paper mode: add a VM of type S (1) and of type L (3)
        for t in range(5):
            obs, _, term, trunc, info = venv.step(add if t == 0 else np.zeros(2, dtype=np.int64))
        assert trunc.all() and info["_final_obs"].all() and info["_final_info"].all()
        fin = info["final_info"]
        assert fin["step"].tolist() == [5, 5] and fin["_step"].all()
        assert fin["vm_running"].sum() + fin["vm_booting"].sum() > first["vm_running"].sum() + first["vm_booting"].sum()
        # the new episodes' first infos: as a reset gives them
        assert info["step"].tolist() == first["step"].tolist()
        np.testing.assert_array_equal(info["vm_running"], first["vm_running"])
        np.testing.assert_array_equal(info["vm_booting"], first["vm_booting"])
        assert info["jobs_finished"].tolist() == first["jobs_finished"].tolist()
        np.testing.assert_array_equal(info["action_mask"], first["action_mask"])
    finally:
        venv.close()


@pytest.mark.jvm
def test_ppo_episode_logs_keep_the_ended_steps_costs():
    """The episode rows add the ended step's VM cost and waiting from final_info: with the paper's
    cost reward an episode's return is minus their sum."""
    from agents.ppo.train import train

    res = train(PPOConfig(total_timesteps=96, **TINY_PPO), make_envs, None, progress=False)
    assert res.episodes
    for e in res.episodes:
        assert e["return"] == pytest.approx(-(e["vm_cost"] + e["wait_penalty"]), rel=1e-9)


def _windows_env(seed: int):
    from sim_bridge.envs import CloudSimVectorEnv
    from sim_bridge.workloads import seed_1551
    from sim_bridge.workloads.mix import WorkloadWindows

    wl = seed_1551()
    return CloudSimVectorEnv(2, SimConfig(max_steps=3), wl, sampler=WorkloadWindows(wl, seed, hours=(1.0, 2.0)))


@pytest.mark.jvm
def test_a_seeded_vector_reset_replays_a_fresh_envs_workloads():
    """reset(seed=s) drew the sampler's next workloads: the same seed gave other episodes than a
    fresh env reset with it."""
    used, fresh = _windows_env(7), _windows_env(7)
    try:
        obs_fresh, _ = fresh.reset(seed=3)
        names = fresh.workload_names
        used.reset(seed=11)
        for _ in range(7):     # autoresets draw more windows
            used.step(np.zeros(2, dtype=np.int64))
        obs, _ = used.reset(seed=3)
        assert used.workload_names == names
        np.testing.assert_array_equal(obs, obs_fresh)
        for _ in range(4):     # and the episodes (and autoresets) that follow
            a = fresh.step(np.zeros(2, dtype=np.int64))
            b = used.step(np.zeros(2, dtype=np.int64))
            np.testing.assert_array_equal(a[0], b[0])
            np.testing.assert_array_equal(a[1], b[1])
        assert used.workload_names == fresh.workload_names
        # an unseeded reset goes on drawing
        used.reset()
        assert used.workload_names != names
    finally:
        used.close()
        fresh.close()


class _NamedDraws:
    """A workload sampler with a generator (as the mix's and the windows' samplers): the tiny
    workload under a name drawn from its stream, every draw listed in `drawn`."""

    drawn: list[str] = []

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def sample(self) -> Workload:
        w = dataclasses.replace(tiny_workload(), name=f"w{int(self.rng.integers(1 << 40))}")
        _NamedDraws.drawn.append(w.name)
        return w


@pytest.mark.jvm
def test_a_resumed_run_draws_the_workloads_the_interrupted_one_had_not_reached(tmp_path):
    """A resumed run's envs started from the sampler's first workloads (a fresh env keeps its
    construction's draw and a seeded reset rewinds to it): it trained on the run's first workloads
    again. The checkpoint keeps where the sampler stood; the resumed run goes on from there."""
    from agents.ppo.train import train
    from sim_bridge.envs import CloudSimVectorEnv
    from test_training_audit import interrupt_at

    cfg = PPOConfig(total_timesteps=2 * 32 * 4, **{**TINY_PPO, "num_envs": 2})
    make = lambda n, seed: CloudSimVectorEnv(n, SIM, sampler=_NamedDraws(seed))  # noqa: E731
    at_checkpoint = {}

    def on_update(update, net, obs_rms):
        at_checkpoint[update] = len(_NamedDraws.drawn)  # the checkpoint of this update is saved next
        return interrupt_at(2)(update, net, obs_rms)

    _NamedDraws.drawn = []
    with pytest.raises(KeyboardInterrupt):
        train(cfg, make, tmp_path, progress=False, on_update=on_update)
    first, _NamedDraws.drawn = _NamedDraws.drawn, []
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=False)["update"] == 1
    train(cfg, make, tmp_path, resume=True, progress=False)
    resumed = _NamedDraws.drawn[1:]      # [0]: the new env's construction draw, the run's first, not used
    done, redone = first[:at_checkpoint[1]], first[at_checkpoint[1]:]
    assert resumed and not set(resumed) & set(done), (done, resumed)
    assert resumed[:len(redone)] == redone[:len(resumed)]   # the same stream, from where it stood


@pytest.mark.jvm
def test_ctrl_c_during_a_gateway_call_is_a_keyboard_interrupt_after_its_answer():
    """Py4J's own handling of a Ctrl-C inside a call logged a traceback, then failed on itself
    (AttributeError: 'GatewayConnection' object has no attribute 'shutdown_socket') and left the
    connection cut: `samm policy promote` interrupted so ended with a traceback, exit 1."""
    import threading

    from sim_bridge.gateway import Gateway
    from sim_bridge.workloads import seed_1551

    # Python's own Ctrl-C handler, as in `samm`: a pytest-xdist worker runs with another (it
    # ignores SIGINT), under which the gateway leaves the call alone and the signal is dropped
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    gw = Gateway()
    try:
        wid = gw.call("loadWorkload", bytearray(seed_1551().pack()))
        steps = 10000     # seconds of simulation in one call
        actions = np.zeros(steps * 8 * 3, dtype=np.int8)
        timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            gw.call("benchJavaLoop", SimConfig().java_json(), wid, 8, steps, bytearray(actions.tobytes()), 1)
            timer.join()     # the call returned before the signal: wait for it here
        assert not timer.is_alive()
        assert gw.call("ping")                    # and the connection still answers
        gw.call("closeWorkload", wid)
    finally:
        gw.close()
        signal.signal(signal.SIGINT, before)


# --- more: promote's one-workload gate ------------------------------------------------------------

@pytest.mark.jvm
def test_promote_refuses_a_candidate_that_leaves_jobs_unfinished_where_the_incumbent_finished(tmp_path):
    """A candidate cut at the step cap with jobs queued stops paying when it stops: the do-nothing
    policy, 12 of 40 jobs done, was 39 % "cheaper" than target tracking (every job done) and was
    promoted (--suite refused it; the one-workload gate did not look)."""
    from agents.factory import make_agent
    from agents.promote import compare

    cfg = SimConfig(max_steps=600)
    n = 40
    wl = Workload("long-jobs", np.full(n, 60.0), np.full(n, 2 * 3600 * cfg.host_mips), np.full(n, 4, np.int32),
                  np.full(n, 1.0))
    make_agent("noop", cfg, {}).save(tmp_path / "cand")
    make_agent("target-tracking", cfg, {}).save(tmp_path / "inc")
    res = compare(tmp_path / "cand", tmp_path / "inc", cfg, wl, [1, 2, 3], margin=0.02, max_p=0.2)
    assert res["mean_saving"] > 0.3 and res["wins"] == 3 and res["sign_test_p"] <= 0.2   # cheaper on paper
    assert not res["promote"] and res["jobs_lost"] == [{"seed": 1}, {"seed": 2}, {"seed": 3}]
    assert "finishes every job" in res["rule"]


@pytest.mark.parametrize("args", [["evaluate", "--agent", "queue", "--seeds", "1"],
                                  ["tune", "--agent", "queue", "--seeds", "1"],
                                  ["policy", "promote", "--candidate", "agents/policies/lstm-ppo-default",
                                   "--incumbent", "agents/policies/lstm-ppo-default", "--seeds", "1"]])
def test_a_simulator_that_cannot_start_is_one_line_in_evaluate_tune_and_promote(args):
    """A SAMM_GATEWAY_JAR typo (or a JVM that died) was a GatewayError traceback in these verbs;
    `samm train` says it in one line."""
    r = subprocess.run([sys.executable, "-m", "samm.cli.main", *args], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1", "SAMM_GATEWAY_JAR": "/nonexistent/samm.jar"},
                       timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]   # after tune's progress bar
    assert last.startswith(f"error: {' '.join(args[:2]) if args[0] == 'policy' else args[0]}: the simulator: "
                           "SAMM_GATEWAY_JAR names /nonexistent/samm.jar"), r.stderr
