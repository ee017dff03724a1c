"""The paper's per-batch REINFORCE agent and the policy trained across batches (fast checks)."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch

from agents.lra_placement.cluster import Batch, Cluster, Constraints, Rule, check_plan, place_mask, score
from agents.lra_placement.errors import Infeasible
from agents.lra_placement.network import CompositionTable, ScorerConfig
from agents.lra_placement.policy import PlacementPolicy, placement_spaces
from agents.lra_placement.predictor import SyntheticInterference
from agents.lra_placement.reinforce import (
    PlacementProblem,
    ReinforceConfig,
    accumulate_policy_gradient,
    new_scorer,
    plan_reinforce,
    reinforce,
    rollout,
)
from agents.lra_placement.train import TrainConfig, random_constraints, train_generalist

FAST = dict(time_limit_s=20.0)


def random_case(rng, n_apps=4, slots=4):
    n_nodes = int(rng.integers(2, 6))
    size = int(rng.integers(3, n_nodes * slots + 1))
    batch = Batch(rng.multinomial(size, np.ones(n_apps) / n_apps))
    return Cluster(n_nodes, slots), batch, random_constraints(rng, n_apps, slots)


def test_composition_table_matches_the_predictor():
    pred = SyntheticInterference(n_apps=3, seed=1, slots=4)
    table = CompositionTable(pred, 3, 4)
    assert len(table) == 35  # C(4 + 3, 3)
    np.testing.assert_allclose(table.throughput, pred.throughput(table.comps))
    for c in range(len(table)):
        for a in range(3):
            nxt = table.add[c, a]
            if table.comps[c].sum() == 4:
                assert nxt == table.sentinel
            else:
                assert (table.comps[nxt] - table.comps[c]).tolist() == np.eye(3, dtype=int)[a].tolist()
    assert table.ids(table.comps).tolist() == list(range(len(table)))


@pytest.mark.parametrize("features", [False, True])
def test_rollouts_honour_the_mask_and_rewards_are_scores(features):
    rng = np.random.default_rng(0)
    pred = SyntheticInterference(n_apps=4, seed=0, slots=4)
    for _ in range(15):
        cluster, batch, constraints = random_case(rng)
        problem = PlacementProblem(cluster, batch, constraints, pred, ScorerConfig(4, features))
        eps = rollout(problem, new_scorer(problem_config(features), 0).numpy_weights(), rng, 6)
        for k in range(6):
            placement = np.zeros((cluster.n_nodes, 4), dtype=np.int64)
            for t, app in enumerate(batch.order):
                mask = place_mask(placement, int(app), cluster, constraints)
                node = eps.actions[t, k]
                if node < 0:  # dead end: only when no node could take the container
                    assert not mask.any() and not eps.alive[k] and eps.rewards[k] == 0
                    break
                assert mask[node] == 1, "a full or forbidden node was chosen"
                placement[node, app] += 1
            else:
                assert eps.alive[k]
                assert check_plan(placement, batch, cluster, constraints) == []
                assert eps.rewards[k] == pytest.approx(score(placement, pred), abs=1e-9)


def problem_config(features):
    return ScorerConfig(4, features)


def brute_force_best(cluster, batch, constraints, pred):
    best = -1.0
    for nodes in itertools.product(range(cluster.n_nodes), repeat=batch.size):
        p = np.zeros((cluster.n_nodes, len(batch.counts)), dtype=np.int64)
        np.add.at(p, (np.array(nodes), batch.order), 1)
        if not check_plan(p, batch, cluster, constraints):
            best = max(best, score(p, pred))
    return best


def test_plan_reinforce_finds_the_brute_force_optimum_and_is_seeded():
    pred = SyntheticInterference(n_apps=3, seed=3, slots=3)
    cluster = Cluster(3, 3)
    batch = Batch(np.array([3, 2, 2]))
    constraints = Constraints(3, (Rule(1, 2, "anti-affinity"),))
    best = brute_force_best(cluster, batch, constraints, pred)
    plan = plan_reinforce(cluster, batch, constraints, pred, np.random.default_rng(0), episodes=1500, **FAST)
    assert check_plan(plan, batch, cluster, constraints) == []
    assert score(plan, pred) == pytest.approx(best, abs=1e-9)
    a = reinforce(cluster, batch, constraints, pred, np.random.default_rng(5), ReinforceConfig(episodes=300, **FAST))
    b = reinforce(cluster, batch, constraints, pred, np.random.default_rng(5), ReinforceConfig(episodes=300, **FAST))
    assert np.array_equal(a.placement, b.placement)
    assert [c["mean"] for c in a.curve] == [c["mean"] for c in b.curve]
    assert [c["best"] for c in a.curve] == [c["best"] for c in b.curve]


def test_dead_ends_are_learned_around_and_never_returned():
    # 2 nodes x 2 slots; two b's then two a's, at most one a per node: putting both b's on one node
    # leaves no node for the second a (reward 0, not stored)
    pred = SyntheticInterference(n_apps=2, seed=0, slots=2)
    cluster = Cluster(2, 2)
    batch = Batch(np.array([2, 2]), order=np.array([1, 1, 0, 0]))
    constraints = Constraints(2, (Rule(0, 0, "anti-affinity"),))
    result = reinforce(cluster, batch, constraints, pred, np.random.default_rng(0), ReinforceConfig(episodes=256, **FAST))
    assert result.dead_ends > 0
    assert check_plan(result.placement, batch, cluster, constraints) == []
    assert result.placement.tolist() == [[1, 1], [1, 1]]


def test_impossible_batch_raises_infeasible():
    pred = SyntheticInterference(n_apps=2, seed=0, slots=2)
    cluster = Cluster(2, 2)
    constraints = Constraints(2, (Rule(0, 0, "anti-affinity"),))  # at most one app-0 per node
    with pytest.raises(Infeasible):
        plan_reinforce(cluster, Batch(np.array([3, 0])), constraints, pred, np.random.default_rng(0), episodes=64)
    with pytest.raises(Infeasible):
        plan_reinforce(cluster, Batch(np.array([3, 2])), Constraints.none(2), pred, np.random.default_rng(0))


def test_chunked_deduplicated_gradient_equals_the_plain_one():
    pred = SyntheticInterference(n_apps=3, seed=2, slots=4)
    cluster, batch = Cluster(4, 4), Batch(np.array([4, 3, 3]))
    config = ScorerConfig(3, True, (16, 16))
    problem = PlacementProblem(cluster, batch, Constraints.none(3), pred, config)
    eps = rollout(problem, new_scorer(config, 0).numpy_weights(), np.random.default_rng(0), 5)
    adv = np.linspace(-1, 1, 5)

    def grads(max_rows):
        scorer = new_scorer(config, 1)
        accumulate_policy_gradient(scorer, problem, eps.comp_hist, eps.actions, adv, 0.01, max_rows)
        return [p.grad.clone() for p in scorer.parameters()]

    # plain: every node of every step through the network, no deduplication
    scorer = new_scorer(config, 1)
    node_x, glob = problem.torch_inputs()
    total = 0.0
    T = problem.T
    for t in range(T):
        comps = eps.comp_hist[t].astype(np.int64)
        a = int(batch.order[t])
        mask = torch.as_tensor(problem.allowed[problem.table.add[comps, a]])
        logits = scorer(node_x[a][torch.as_tensor(comps)], glob[t].expand(5, -1))
        logp = torch.log_softmax(logits.masked_fill(~mask, float("-inf")), -1)
        lp = logp.gather(1, torch.as_tensor(eps.actions[t])[:, None]).squeeze(1)
        safe = logp.masked_fill(~mask, 0.0)
        ent = -(safe.exp() * safe).sum(-1)
        total = total + (lp * torch.as_tensor(adv, dtype=torch.float32)).sum() + 0.01 * ent.sum()
    (-total / (5 * T)).backward()
    plain = [p.grad.clone() for p in scorer.parameters()]
    for max_rows in (10, 10_000):
        for g, ref in zip(grads(max_rows), plain):
            torch.testing.assert_close(g, ref, rtol=1e-4, atol=1e-6)


# --- the policy trained across batches ----------------------------------------------------------
@pytest.fixture(scope="module")
def small_policy(tmp_path_factory):
    pred = SyntheticInterference(n_apps=4, seed=0, slots=4)
    config = TrainConfig(slots=4, n_nodes_choices=(3, 5), paper_sizes=(4, 12), hidden=(16, 16), time_limit_s=20)
    out = tmp_path_factory.mktemp("policy")
    result = train_generalist(config, pred, seed=0, total_episodes=160, out=out, progress=False)
    return result, out, pred


def test_training_writes_a_policy_and_a_log(small_policy):
    result, out, _ = small_policy
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["kind"] == "lra-reinforce" and meta["problem"] == "lra-placement"
    assert (out / "policy.pt").stat().st_size < 300_000
    lines = (out / "train-log.csv").read_text().splitlines()
    assert lines[0].startswith("update,episodes") and len(lines) == len(result.log) + 1 > 1


def test_spaces_are_the_environments():
    from agents.lra_placement.env import LraPlacementEnv
    from agents.spaces import same_space

    env = LraPlacementEnv(n_nodes=5, slots=4, n_apps=4, predictor=SyntheticInterference(4, slots=4))
    obs, act = placement_spaces(5, 4, 4)
    assert same_space(obs, env.observation_space) and same_space(act, env.action_space)


def test_save_load_round_trip_gives_identical_decisions(small_policy, tmp_path):
    result, out, pred = small_policy
    loaded = PlacementPolicy.load(out)
    rng = np.random.default_rng(0)
    for _ in range(20):
        counts = np.zeros((3, 4), np.float32)
        for _ in range(int(rng.integers(0, 8))):
            counts[rng.integers(3), rng.integers(4)] += 1
        counts = np.minimum(counts, 1)
        obs = {"app": np.eye(4, dtype=np.float32)[rng.integers(4)], "counts": counts,
               "remaining": rng.integers(0, 3, 4).astype(np.float32)}
        assert result.policy.decide_node(obs) == loaded.decide_node(obs)
        np.testing.assert_allclose(result.policy.node_logits(obs)[0], loaded.node_logits(obs)[0], rtol=1e-5, atol=1e-6)
    # saving the loaded one again reproduces the file contents
    loaded.save(tmp_path / "again")
    assert (json.loads((tmp_path / "again" / "metadata.json").read_text())["network"]
            == json.loads((out / "metadata.json").read_text())["network"])


def test_loading_with_other_spaces_raises(small_policy, tmp_path):
    _, out, _ = small_policy
    obs, act = placement_spaces(3, 4, 4)
    PlacementPolicy.load(out, observation_space=obs, action_space=act)  # matches: fine
    with pytest.raises(ValueError):
        PlacementPolicy.load(out, action_space=placement_spaces(7, 4, 4)[1])
    with pytest.raises(ValueError):
        PlacementPolicy.load(out, observation_space=placement_spaces(3, 8, 4)[0])
    with pytest.raises(ValueError):
        PlacementPolicy.load(out, observation_space=placement_spaces(3, 4, 5)[0])
    assert PlacementPolicy.load(out, n_nodes=7).action_space.n == 7
    # a metadata file whose spaces do not fit its network
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "policy.pt").write_bytes((out / "policy.pt").read_bytes())
    meta = json.loads((out / "metadata.json").read_text())
    from agents.spaces import space_to_json
    meta["observation_space"] = space_to_json(placement_spaces(3, 4, 5)[0])
    (bad / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError):
        PlacementPolicy.load(bad)


def test_policy_plans_are_valid_and_decide_follows_the_env_mask(small_policy):
    result, _, pred = small_policy
    policy = result.policy
    rng = np.random.default_rng(1)
    for _ in range(8):
        cluster, batch, constraints = random_case(rng)
        try:
            plan, details = policy.plan(cluster, batch, constraints, pred, rng, samples=8, return_details=True)
        except Infeasible:
            continue
        assert check_plan(plan, batch, cluster, constraints) == []
        assert details["score"] == pytest.approx(score(plan, pred))
    from agents.lra_placement.env import LraPlacementEnv

    env = LraPlacementEnv(n_nodes=3, slots=4, predictor=pred,
                          constraints=Constraints(4, (Rule(0, 1, "anti-affinity"), Rule(2, 2, "cardinality", 2))),
                          batch=Batch(np.array([2, 2, 3, 3])))
    for seed in range(5):
        obs, info = env.reset(seed=seed)
        done = False
        while not done:
            node = policy.for_nodes(3).decide_node(obs, info["action_mask"], deterministic=False,
                                                   rng=np.random.default_rng(seed))
            assert info["action_mask"][node] == 1
            obs, reward, done, _, info = env.step(node)
        assert not info["invalid_action"]


def test_fine_tuning_starts_from_the_policy(small_policy):
    result, _, pred = small_policy
    cluster, batch = Cluster(3, 4), Batch(np.array([2, 3, 2, 2]))
    plan, details = result.policy.plan(cluster, batch, Constraints.none(4), pred, np.random.default_rng(0),
                                       samples=4, fine_tune_s=0.5, return_details=True)
    assert details["fine_tune_episodes"] > 0
    assert check_plan(plan, batch, cluster, Constraints.none(4)) == []


def test_the_shipped_policy_loads_and_plans():
    from agents.lra_placement.policy import SHIPPED_DIR, plan_policy

    if not (SHIPPED_DIR / "metadata.json").is_file():
        pytest.skip("no shipped policy")
    policy = PlacementPolicy.load(SHIPPED_DIR)
    assert policy.n_apps == 7 and policy.predictor is not None
    assert (SHIPPED_DIR / "policy.pt").stat().st_size < 400_000
    pred = SyntheticInterference(n_apps=7, seed=0, slots=8)  # any predictor of 7 apps
    cluster, batch = Cluster(9, 8), Batch(np.array([6, 5, 5, 5, 5, 5, 5]))
    constraints = Constraints(7, (Rule(0, 1, "anti-affinity"),))
    plan = plan_policy(cluster, batch, constraints, pred, np.random.default_rng(0), samples=8)
    assert check_plan(plan, batch, cluster, constraints) == []
