"""The placement MDP as a Gymnasium environment (agents/lra_placement/env.py)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from agents.lra_placement.cluster import Batch, Cluster, Constraints, Rule, check_plan, score
from agents.lra_placement.env import LraPlacementEnv, sample_batch
from agents.lra_placement.predictor import SyntheticInterference


class PairTable:
    """Hand-checkable 2-app predictor: alone 1.0; two of the same app 0.9 each; a and b together 0.5 each."""

    app_names = ("a", "b")

    def throughput(self, compositions):
        c = np.asarray(compositions)
        mixed = (c > 0).all(axis=-1, keepdims=True)
        doubled = c >= 2
        tp = np.where(mixed, 0.5, np.where(doubled, 0.9, 1.0))
        return np.where(c > 0, tp, 0.0)


def random_constraints(rng, n_apps):
    rules = []
    for _ in range(rng.integers(0, 4)):
        a, b = (int(x) for x in rng.integers(0, n_apps, 2))
        if rng.random() < 0.4:
            rules.append(Rule(a, b, "anti-affinity"))
        else:
            rules.append(Rule(a, b, "cardinality", int(rng.integers(1, 4))))
    return Constraints(n_apps, tuple(rules))


def run_random_masked_episode(env, rng, **reset_kwargs):
    obs, info = env.reset(**reset_kwargs)
    rewards = []
    while True:
        assert env.observation_space.contains(obs)
        mask = info["action_mask"]
        assert mask.dtype == np.int8
        np.testing.assert_array_equal(env.action_masks(), mask.astype(bool))
        obs, reward, terminated, truncated, info = env.step(int(rng.choice(np.flatnonzero(mask))))
        rewards.append(reward)
        assert not truncated
        if terminated:
            assert env.observation_space.contains(obs)
            return rewards, info


def test_passes_gymnasium_env_checker():
    env = LraPlacementEnv(seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env)
    # The only acceptable warning: no spec (the lead registers the id later).
    assert [str(w.message) for w in caught if "spec" not in str(w.message)] == []


def test_env_checker_with_constraints_and_a_tight_cluster():
    rules = (Rule(0, 0, "anti-affinity"), Rule(1, 2, "cardinality", 1))
    env = LraPlacementEnv(
        cluster=Cluster(3, 2), constraints=Constraints(3, rules), predictor=SyntheticInterference(3, slots=2), seed=1
    )
    check_env(env, skip_render_check=True)


def test_masked_random_play_never_breaks_slots_or_rules():
    rng = np.random.default_rng(0)
    completed = 0
    for episode in range(40):
        n_apps = int(rng.integers(2, 5))
        cluster = Cluster(int(rng.integers(2, 6)), int(rng.integers(2, 5)))
        constraints = random_constraints(rng, n_apps)
        env = LraPlacementEnv(cluster=cluster, constraints=constraints,
                              predictor=SyntheticInterference(n_apps, seed=episode, slots=cluster.slots))
        batch = sample_batch(rng, n_apps, size_range=(1, cluster.capacity))
        rewards, info = run_random_masked_episode(env, rng, seed=episode, options={"batch": batch})
        placement = info["placement"]
        assert (placement.sum(axis=1) <= cluster.slots).all() and constraints.violations(placement) == 0
        assert not info["invalid_action"]
        if info["complete"]:
            completed += 1
            assert check_plan(placement, batch, cluster, constraints) == []
            assert rewards[-1] == pytest.approx(score(placement, env.predictor)) == info["score"]
        else:
            assert info["infeasible"] and rewards[-1] == 0.0 and info["score"] == 0.0
            assert placement.sum() < batch.size
        assert all(r == 0.0 for r in rewards[:-1])
    assert completed >= 20  # most random cases are feasible: the test exercises complete plans


def test_reward_only_at_the_end_and_remaining_counts_down():
    env = LraPlacementEnv(seed=3)
    obs, info = env.reset(seed=3)
    batch = env.batch
    assert 15 <= batch.size <= 48
    np.testing.assert_array_equal(obs["remaining"], batch.counts)
    assert obs["app"].sum() == 1 and obs["app"][batch.order[0]] == 1 and obs["counts"].sum() == 0
    rng = np.random.default_rng(1)
    for t in range(batch.size):
        obs, reward, terminated, _, info = env.step(int(rng.choice(np.flatnonzero(info["action_mask"]))))
        assert obs["remaining"].sum() == batch.size - t - 1 and obs["counts"].sum() == t + 1
        assert terminated == (t == batch.size - 1)
        if not terminated:
            assert reward == 0.0 and "placement" not in info
    assert reward > 0 and reward == info["score"]
    assert info["per_app"].shape == (7,) and info["complete"]
    with pytest.raises(RuntimeError):
        env.step(0)


def test_tiny_cluster_hand_checked_scores():
    cluster, batch = Cluster(2, 2), Batch(np.array([2, 2]), order=np.array([0, 0, 1, 1]))
    env = LraPlacementEnv(cluster=cluster, predictor=PairTable())

    def play(nodes):
        env.reset(options={"batch": batch})
        for node in nodes:
            _, reward, terminated, _, info = env.step(node)
        assert terminated and info["complete"]
        return reward, info

    reward, info = play([0, 0, 1, 1])  # a,a | b,b
    assert reward == pytest.approx(0.9)
    np.testing.assert_array_equal(info["placement"], [[2, 0], [0, 2]])
    np.testing.assert_allclose(info["per_app"], [0.9, 0.9])
    assert play([0, 1, 0, 1])[0] == pytest.approx(0.5)  # a,b | a,b
    # After a,a on node 0 the node is full: the mask offers node 1 only.
    env.reset(options={"batch": batch})
    env.step(0)
    _, _, _, _, info = env.step(0)
    np.testing.assert_array_equal(info["action_mask"], [0, 1])


def test_invalid_action_ends_the_episode_without_crashing():
    env = LraPlacementEnv(cluster=Cluster(2, 1), predictor=PairTable())
    env.reset(options={"batch": Batch(np.array([1, 1]))})
    env.step(0)
    _, reward, terminated, _, info = env.step(0)  # node 0 is full
    assert terminated and reward == 0.0 and info["invalid_action"] and not info["complete"]
    np.testing.assert_array_equal(info["placement"], [[1, 0], [0, 0]])  # nothing placed by the bad action
    env.reset(options={"batch": Batch(np.array([1, 1]))})
    _, reward, terminated, _, info = env.step(7)  # out of range
    assert terminated and reward == 0.0 and info["invalid_action"]


def test_no_feasible_node_ends_the_episode_as_infeasible():
    constraints = Constraints(2, (Rule(0, 0, "anti-affinity"),))  # at most one app-0 container per node
    env = LraPlacementEnv(cluster=Cluster(2, 4), constraints=constraints, predictor=PairTable())
    env.reset(options={"batch": Batch(np.array([3, 0]))})
    env.step(0)
    _, reward, terminated, _, info = env.step(1)
    assert terminated and reward == 0.0 and info["infeasible"] and not info["invalid_action"]


def test_batches_must_fit_and_match_the_apps():
    env = LraPlacementEnv(cluster=Cluster(2, 2), predictor=PairTable())
    with pytest.raises(ValueError, match="exceeds"):
        env.reset(options={"batch": Batch(np.array([3, 2]))})
    with pytest.raises(ValueError, match="apps"):
        env.reset(options={"batch": Batch(np.array([1, 1, 1]))})
    with pytest.raises(ValueError):
        LraPlacementEnv(constraints=Constraints.none(3))  # default predictor has 7 apps


def test_default_sampler_respects_a_small_cluster():
    env = LraPlacementEnv(n_nodes=2, slots=4, n_apps=3, seed=0)
    sizes = {env.reset()[0]["remaining"].sum() for _ in range(30)}
    assert max(sizes) <= 8


def test_sample_batch_sizes_seeding_and_skew():
    sizes = [sample_batch(np.random.default_rng(s), 7).size for s in range(200)]
    assert min(sizes) >= 15 and max(sizes) <= 48 and len(set(sizes)) > 15
    assert sample_batch(np.random.default_rng(0), 7, capacity=20).size <= 20
    a, b = sample_batch(np.random.default_rng(9), 7), sample_batch(np.random.default_rng(9), 7)
    np.testing.assert_array_equal(a.counts, b.counts)

    def top_share(skew):
        shares = []
        for s in range(200):
            batch = sample_batch(np.random.default_rng(s), 7, size_range=(40, 48), skew=skew)
            shares.append(batch.counts.max() / batch.size)
        return np.mean(shares)

    assert top_share("zipf") > top_share(None) + 0.1
    with pytest.raises(ValueError):
        sample_batch(np.random.default_rng(0), 7, skew="pareto")
