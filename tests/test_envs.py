"""Gymnasium conformance of the single and the batched environment."""
import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import sim_bridge
from sim_bridge.config import SimConfig
from sim_bridge.envs import CloudSimEnv, CloudSimVectorEnv

pytestmark = pytest.mark.jvm


@pytest.mark.parametrize("mode", ["paper", "per-type"])
def test_check_env_passes(mode):
    env = CloudSimEnv(SimConfig(action_mode=mode, max_steps=50), "seed-1551")
    try:
        check_env(env, skip_render_check=True)
    finally:
        env.close()


def test_registered_ids_make_both_envs():
    env = gym.make(sim_bridge.ENV_ID, config={"max_steps": 10})
    try:
        obs, info = env.reset(seed=1)
        assert obs.shape == (7,) and obs.dtype == np.float32
    finally:
        env.close()
    venv = gym.make_vec(sim_bridge.ENV_ID, num_envs=3, vectorization_mode="vector_entry_point",
                        config={"max_steps": 10})
    try:
        obs, _ = venv.reset(seed=1)
        assert obs.shape == (3, 7)
    finally:
        venv.close()


def test_reset_returns_the_first_real_observation():
    env = CloudSimEnv(SimConfig(), "seed-1551")
    try:
        obs, info = env.reset(seed=0)
        # 1/1/1 running = 14 of 140 cores; nothing submitted yet
        assert obs[0] == pytest.approx(0.1)
        assert info["vm_running"].tolist() == [1, 1, 1] and info["queue_length"] == 0
    finally:
        env.close()


def test_reward_is_minus_cost_minus_penalty_and_truncation():
    cfg = SimConfig(max_steps=40)
    env = CloudSimEnv(cfg, "seed-1551")
    try:
        env.reset(seed=0)
        total = 0.0
        for t in range(40):
            obs, r, term, trunc, info = env.step(0)
            assert r == pytest.approx(-(info["vm_cost"] + info["wait_penalty"]))
            assert info["wait_penalty"] == pytest.approx(1e-5 * info["wait_job_seconds"])
            total += r
        assert trunc and not term
        # the first batch (t = 1800 s, 100 jobs) waits on 14 cores: obs 5 and 6 are positive
        assert obs[5] > 0 and obs[6] == 0.0  # 31st..40th intervals have no new arrivals
        with pytest.raises(RuntimeError):
            env.step(0)
    finally:
        env.close()


def test_vector_env_matches_separate_simulations_and_autoresets_same_step():
    from samm.analyze import compute_metrics
    from sim_bridge.actions import to_deltas
    from sim_bridge.batch import SimBatch

    cfg = SimConfig(max_steps=35)
    venv = CloudSimVectorEnv(3, cfg, "seed-1551")
    singles = [SimBatch(cfg, venv.workload, 1) for _ in range(3)]
    try:
        venv.reset(seed=[10, 11, 12])
        for b, seed in zip(singles, [10, 11, 12]):
            b.reset([0], [seed])
        acts = np.random.default_rng(0).integers(0, 7, size=(35, 3))
        for t in range(35):
            obs, rew, term, trunc, info = venv.step(acts[t])
            for i, b in enumerate(singles):
                s = b.step(to_deltas("paper", [acts[t][i]], 3))
                expect = compute_metrics(s.raw, b.fleet)[0]
                got = info["final_obs"][i] if t == 34 else obs[i]
                np.testing.assert_allclose(got, expect)
                assert rew[i] == pytest.approx(-(s.vm_cost[0] + 1e-5 * s.wait_job_seconds[0]))
        assert trunc.all() and not term.any() and info["_final_obs"].all()
        # the returned observation already starts the next episode: 14 of 140 cores, nothing queued
        np.testing.assert_allclose(obs[:, 0], 0.1)
        assert np.all(obs[:, 5:] == 0)
    finally:
        venv.close()
        for b in singles:
            b.close()
