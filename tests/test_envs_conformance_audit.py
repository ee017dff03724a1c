"""Audit of the five Gymnasium environments' conformance: API (render_mode, spaces, dtypes),
seeding, vector envs and wrappers, and edge inputs that crashed unhelpfully or corrupted an episode."""
from __future__ import annotations

import copy
import pickle
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.wrappers import FlattenObservation, RecordEpisodeStatistics, TimeLimit

import agents.registry as registry
from agents.deferrable_jobs.env import DeferrableJobsEnv
from agents.lra_placement.env import LraPlacementEnv
from agents.microservice_cores.env import MicroserviceCoresEnv
from agents.oversubscription.env import OversubscriptionEnv

registry.problem_names()  # registers every problem's env id

PURE_PYTHON_IDS = ("samm/Oversubscription-v0", "samm/DeferrableJobs-v0", "samm/LraPlacement-v0",
                   "samm/MicroserviceCores-v0")
# gym.make's keyword arguments for small, fast instances (the default oversubscription setting
# builds an Azure-sized trace on every reset)
MAKE_KWARGS = {"samm/Oversubscription-v0": {"setting": "tiny"}, "samm/MicroserviceCores-v0": {"warmup": 3}}


def _make(env_id: str, **kwargs):
    return gym.make(env_id, **{**MAKE_KWARGS.get(env_id, {}), **kwargs})
# unbounded features (counts, latencies, token values) and OSDEC's ±5 score range: by design
EXPLAINED_WARNINGS = ("infinity", "symmetric and normalized")


def _flat(obs) -> np.ndarray:
    if isinstance(obs, dict):
        return np.concatenate([np.ravel(obs[k]).astype(np.float64) for k in sorted(obs)])
    return np.ravel(obs).astype(np.float64)


def _episode(env, seed: int, steps: int = 400) -> list[tuple[np.ndarray, float]]:
    obs, _ = env.reset(seed=seed)
    env.action_space.seed(seed)
    out = [(_flat(obs), 0.0)]
    for _ in range(steps):
        obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        assert env.observation_space.contains(obs)
        out.append((_flat(obs), reward))
        if terminated or truncated:
            break
    return out


def _same(a, b) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) and r == s for (x, r), (y, s) in zip(a, b))


# ----------------------------------------------------------------------------- all four pure-Python envs

@pytest.mark.parametrize("env_id", PURE_PYTHON_IDS)
def test_check_env_passes_with_only_explained_warnings(env_id):
    env = _make(env_id).unwrapped
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env, skip_render_check=True)
    unexplained = [str(w.message) for w in caught if not any(k in str(w.message) for k in EXPLAINED_WARNINGS)]
    assert unexplained == []
    env.close()
    env.close()


@pytest.mark.parametrize("env_id", PURE_PYTHON_IDS)
def test_gym_make_accepts_render_mode_none_and_names_an_unsupported_mode(env_id):
    env = _make(env_id, render_mode=None)
    assert env.render_mode is None
    env.reset(seed=0)
    env.close()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gym.make's own warning that "human" is not a listed mode
        with pytest.raises(ValueError, match="render_mode 'human' is not supported"):
            _make(env_id, render_mode="human")


@pytest.mark.parametrize("env_id", PURE_PYTHON_IDS)
def test_seeded_episodes_repeat_and_an_unseeded_reset_continues_the_stream(env_id):
    env = _make(env_id)
    first, again = _episode(env, 3, 60), _episode(env, 3, 60)
    assert _same(first, again)
    env.reset(seed=5)
    a = _flat(env.reset()[0])
    env.reset(seed=5)
    assert np.array_equal(a, _flat(env.reset()[0]))
    env.close()


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
@pytest.mark.parametrize("env_id", ["samm/DeferrableJobs-v0", "samm/LraPlacement-v0"])
def test_sync_vector_env_autoresets_with_observations_in_space(env_id, mode):
    venv = SyncVectorEnv([lambda: _make(env_id) for _ in range(2)], autoreset_mode=mode)
    venv.reset(seed=1)
    venv.action_space.seed(0)
    ends = 0
    for _ in range(60):
        obs, _, terminated, truncated, info = venv.step(venv.action_space.sample())
        assert venv.observation_space.contains(obs)
        for i in np.nonzero(info.get("_final_obs", np.zeros(2, bool)))[0]:
            assert venv.single_observation_space.contains(info["final_obs"][i])
        ends += int(np.sum(terminated | truncated))
    assert ends > 0
    venv.close()
    venv.close()


@pytest.mark.parametrize("env_id", PURE_PYTHON_IDS)
def test_wrapper_stack_runs_to_its_time_limit(env_id):
    env = FlattenObservation(RecordEpisodeStatistics(TimeLimit(_make(env_id), 5)))
    obs, _ = env.reset(seed=0)
    env.action_space.seed(0)
    assert env.observation_space.contains(obs)
    for _ in range(5):
        obs, _, terminated, truncated, info = env.step(env.action_space.sample())
        assert env.observation_space.contains(obs)
        if terminated or truncated:
            break
    assert "episode" in info
    env.close()


# ----------------------------------------------------------------------------- per-env defects

def test_lra_env_pickles_and_the_copy_replays_the_same_episodes():
    env = LraPlacementEnv()
    clone = pickle.loads(pickle.dumps(env))  # the default batch sampler was a lambda: unpicklable
    assert _same(_episode(env, 4), _episode(clone, 4))


def test_microservice_env_refuses_a_misshaped_action_before_the_simulator_moves():
    env = MicroserviceCoresEnv("chain3", episode_steps=5, warmup=3)
    env.reset(seed=0)
    twin = copy.deepcopy(env)
    for bad in (np.ones((1, env.M)), np.ones((env.M, 1)), np.ones(env.M + 1)):
        with pytest.raises(ValueError, match=f"action must hold {env.M} values"):
            env.step(bad.astype(np.float32))
    # the refused actions left the episode where it was: it goes on exactly as its untouched twin
    action = np.full(env.M, 0.5, np.float32)
    got, want = env.step(action), twin.step(action)
    assert np.array_equal(got[0], want[0]) and got[1:4] == want[1:4]
    # a scalar still sets every service alike
    assert env.step(0.5)[4]["cores"] == twin.step(action)[4]["cores"]


@pytest.mark.parametrize("steps", [0, -1, 2.5, True])
def test_microservice_env_refuses_episode_steps_below_one(steps):
    with pytest.raises(ValueError, match="episode_steps must be a whole number"):
        MicroserviceCoresEnv("chain3", episode_steps=steps, warmup=3)


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), "1"])
def test_oversub_env_refuses_a_reward_scale_that_is_not_a_finite_number(scale):
    with pytest.raises(ValueError, match="reward_scale must be a finite number"):
        OversubscriptionEnv("tiny", reward_scale=scale)


def test_oversub_env_keeps_a_given_finite_reward_scale():
    env = OversubscriptionEnv("tiny", reward_scale=0.5)
    env.reset(seed=0)
    _, reward, _, _, info = env.step(np.zeros(env.setting.n_subscribers, np.int64))
    assert reward == pytest.approx(info["saved_cores"] * 0.5)


def test_deferrable_env_refuses_an_unknown_mapping_when_built():
    with pytest.raises(ValueError, match="unknown action mapping 'bogus'"):
        DeferrableJobsEnv("tiny", mapping="bogus")


# ----------------------------------------------------------------------------- CloudSim envs (JVM)

def _small_workload():
    from sim_bridge.workloads import Workload

    n = 20
    return Workload("small", np.arange(n, dtype=float) * 30.0, np.full(n, 4400.0 * 120), np.ones(n, np.int32),
                    np.full(n, 0.5))


def test_cloudsim_vector_env_refuses_num_envs_below_one_by_name():
    from sim_bridge.envs import CloudSimVectorEnv

    for n in (0, -1, 2.5):
        with pytest.raises(ValueError, match="num_envs must be a whole number >= 1"):
            CloudSimVectorEnv(n)


@pytest.mark.jvm
def test_cloudsim_envs_take_render_mode_none_from_gym_make():
    import sim_bridge

    env = gym.make(sim_bridge.ENV_ID, config={"max_steps": 5}, render_mode=None)
    try:
        env.reset(seed=0)
    finally:
        env.close()
    venv = gym.make_vec(sim_bridge.ENV_ID, num_envs=2, vectorization_mode="vector_entry_point",
                        config={"max_steps": 5}, render_mode=None)
    try:
        assert venv.reset(seed=0)[0].shape == (2, 7)
    finally:
        venv.close()
    with pytest.raises(ValueError, match="render_mode 'rgb_array' is not supported"):
        from sim_bridge.envs import CloudSimEnv

        CloudSimEnv(render_mode="rgb_array")


@pytest.mark.jvm
def test_cloudsim_vector_env_seeds_are_checked_and_name_the_bad_seed():
    from sim_bridge.config import SimConfig
    from sim_bridge.envs import CloudSimVectorEnv

    venv = CloudSimVectorEnv(2, SimConfig(action_mode="per-type", max_steps=6), _small_workload())
    try:
        for bad in (-5, [1, -1], [2**63, 1], [1.5, 2], 2.0):
            with pytest.raises(ValueError, match="a seed must be a whole number"):
                venv.reset(seed=bad)

        def run(seed):
            obs, _ = venv.reset(seed=seed)
            seen = [obs]
            for _ in range(8):  # past max_steps: the autoreset's seeds come from the same stream
                seen.append(venv.step(np.ones((2, 3), np.int64))[0])
            return seen

        # a 0-d array seed (len() of it raised TypeError) is the same seed as the int
        assert all(np.array_equal(a, b) for a, b in zip(run(3), run(np.array(3))))
        assert all(np.array_equal(a, b) for a, b in zip(run([4, 5]), run(np.array([4, 5]))))
        assert all(np.array_equal(a, b) for a, b in zip(run(2**70), run(2**70)))  # a big int seed still works
    finally:
        venv.close()
        venv.close()
