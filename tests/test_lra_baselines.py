"""Baseline planners: always valid plans, Infeasible only when no plan exists, and the
interference-aware ones actually use the predictor (greedy <= greedy-ls <= optimum)."""
from __future__ import annotations

import logging
import time

import numpy as np
import pytest

from agents.lra_placement.baselines import (
    PLANNERS,
    CompositionValues,
    local_search,
    plan_greedy,
    plan_greedy_local_search,
    plan_k8s_default,
    plan_least_loaded,
    plan_round_robin,
)
from agents.lra_placement.cluster import Batch, Cluster, Constraints, Rule, check_plan, score
from agents.lra_placement.errors import Infeasible
from agents.lra_placement.optimum import feasible_placement
from agents.lra_placement.predictor import SyntheticInterference

HEURISTICS = [name for name in PLANNERS if name != "optimum"]


class ClashPredictor:
    """Two apps: each extra container of the same app costs 0.1, any container of the other app 0.5."""

    app_names = ("a", "b")

    def throughput(self, compositions):
        c = np.asarray(compositions, dtype=float)
        return np.where(c > 0, 1.0 - 0.1 * (c - 1) - 0.5 * (c[:, ::-1] > 0), 0.0)


class CountingPredictor:
    def __init__(self, inner):
        self.inner, self.app_names, self.calls = inner, inner.app_names, 0

    def throughput(self, compositions):
        self.calls += 1
        return self.inner.throughput(compositions)


def random_case(seed):
    rng = np.random.default_rng(seed)
    n_apps, slots, n_nodes = int(rng.integers(2, 5)), int(rng.integers(2, 5)), int(rng.integers(2, 6))
    cluster = Cluster(n_nodes, slots)
    size = int(rng.integers(1, cluster.capacity + 1))
    batch = Batch(rng.multinomial(size, np.ones(n_apps) / n_apps))
    batch = Batch(batch.counts, order=rng.permutation(np.repeat(np.arange(n_apps), batch.counts)))
    rules = []
    for _ in range(int(rng.integers(0, 4))):
        a, b = (int(x) for x in rng.integers(0, n_apps, 2))
        if rng.random() < 0.5:
            rules.append(Rule(a, b, "anti-affinity"))
        else:
            rules.append(Rule(a, b, "cardinality", int(rng.integers(1, slots + 1))))
    return cluster, batch, Constraints(n_apps, tuple(rules)), SyntheticInterference(n_apps, seed=seed, slots=slots)


@pytest.mark.parametrize("seed", range(25))
def test_every_planner_is_valid_or_rightly_infeasible(seed):
    cluster, batch, constraints, predictor = random_case(seed)
    try:
        feasible_placement(cluster, batch, constraints)
        exists = True
    except Infeasible:
        exists = False
    for name, planner in PLANNERS.items():
        if not exists:
            with pytest.raises(Infeasible):
                planner(cluster, batch, constraints, predictor, np.random.default_rng(seed))
            continue
        plan = planner(cluster, batch, constraints, predictor, np.random.default_rng(seed))
        assert check_plan(plan, batch, cluster, constraints) == [], name
        assert constraints.violations(plan) == 0, name


def test_impossible_case_raises_for_every_planner():
    # anti-affinity(a, b) on 2 nodes x 2 slots: the node holding the b takes no a, so 3 a cannot fit.
    cluster, batch = Cluster(2, 2), Batch(np.array([3, 1]))
    constraints = Constraints(2, (Rule(0, 1, "anti-affinity"),))
    for name, planner in PLANNERS.items():
        with pytest.raises(Infeasible):
            planner(cluster, batch, constraints, ClashPredictor(), np.random.default_rng(0))


def test_stuck_sequential_rule_is_repaired(caplog):
    # Round-robin puts a, a on nodes 0 and 1; anti-affinity(a, b) then leaves no node for a b,
    # although a | a on one node and b | b on the other is valid.
    cluster, batch = Cluster(2, 2), Batch(np.array([2, 2]), order=np.array([0, 0, 1, 1]))
    constraints = Constraints(2, (Rule(0, 1, "anti-affinity"),))
    with caplog.at_level(logging.WARNING, logger="agents.lra_placement.baselines"):
        plan = plan_round_robin(cluster, batch, constraints, ClashPredictor(), np.random.default_rng(0))
    assert check_plan(plan, batch, cluster, constraints) == []
    assert sorted(map(tuple, plan.tolist())) == [(0, 2), (2, 0)]
    assert "round-robin got stuck" in caplog.text


def test_simple_rules_spread_as_documented():
    cluster, batch = Cluster(4, 3), Batch(np.array([3, 3, 3]))
    none = Constraints.none(3)
    rr = plan_round_robin(cluster, batch, none, ClashPredictor(), None)
    # default order a, b, c, a, b, c, ...: container k lands on node k % 4.
    expected = np.zeros((4, 3), dtype=int)
    for k, app in enumerate(batch.order):
        expected[k % 4, app] += 1
    assert rr.tolist() == expected.tolist()
    ll = plan_least_loaded(cluster, batch, none, ClashPredictor(), None)
    assert ll.sum(axis=1).max() - ll.sum(axis=1).min() <= 1
    k8s_a = plan_k8s_default(cluster, batch, none, ClashPredictor(), np.random.default_rng(3))
    k8s_b = plan_k8s_default(cluster, batch, none, ClashPredictor(), np.random.default_rng(3))
    assert k8s_a.tolist() == k8s_b.tolist()  # seeded
    # Spreading: no node gets two of an app while another node has none of it.
    assert (k8s_a.max(axis=0) - k8s_a.min(axis=0) <= 1).all()
    # Round-robin skips a node that cannot take the container (anti-affinity(a, a) allows one a per node).
    one_a = Constraints(3, (Rule(0, 0, "anti-affinity"),))
    plan = plan_round_robin(Cluster(4, 3), Batch(np.array([4, 1, 1])), one_a, ClashPredictor(), None)
    assert plan[:, 0].tolist() == [1, 1, 1, 1]


def test_greedy_avoids_interference_with_one_predictor_call_per_container():
    cluster, batch = Cluster(2, 2), Batch(np.array([2, 2]))  # order a, b, a, b
    predictor = CountingPredictor(ClashPredictor())
    plan = plan_greedy(cluster, batch, Constraints.none(2), predictor, None)
    assert sorted(map(tuple, plan.tolist())) == [(0, 2), (2, 0)]
    assert predictor.calls <= batch.size
    big = CountingPredictor(SyntheticInterference(7, seed=2))
    batch = Batch(np.full(7, 10))
    plan_greedy(Cluster(27, 8), batch, Constraints.none(7), big, None)
    assert big.calls <= batch.size


def test_local_search_escapes_a_bad_start():
    # Mixed nodes score 0.5; one swap (a on node 0 for b on node 1) separates them (0.9).
    cluster, constraints, predictor = Cluster(2, 2), Constraints.none(2), ClashPredictor()
    start = np.array([[1, 1], [1, 1]])
    plan, moves = local_search(start, cluster, constraints, CompositionValues(predictor))
    assert moves >= 1
    assert score(plan, predictor) == pytest.approx(0.9)
    assert plan.sum(axis=0).tolist() == [2, 2]
    # A rule that forbids the better plan keeps the search where it is.
    forbid = Constraints(2, (Rule(0, 0, "cardinality", 1), Rule(1, 1, "cardinality", 1)))
    plan, moves = local_search(start, cluster, forbid, CompositionValues(predictor))
    assert moves == 0 and plan.tolist() == start.tolist()


@pytest.mark.parametrize("seed", range(15))
def test_optimum_bounds_every_heuristic_and_local_search_never_hurts(seed):
    cluster, batch, constraints, predictor = random_case(100 + seed)
    try:
        best = score(PLANNERS["optimum"](cluster, batch, constraints, predictor, None), predictor)
    except Infeasible:
        return
    scores = {}
    for name in HEURISTICS:
        scores[name] = score(PLANNERS[name](cluster, batch, constraints, predictor, np.random.default_rng(seed)), predictor)
        assert scores[name] <= best + 1e-9, name
    assert scores["greedy-ls"] >= scores["greedy"] - 1e-12


def test_greedy_ls_is_fast_at_full_scale():
    # 400 containers of 7 apps on 81 nodes x 8 slots, with rules, in a few seconds.
    rng = np.random.default_rng(0)
    batch = Batch(rng.multinomial(400, np.ones(7) / 7))
    constraints = Constraints(7, (Rule(0, 0, "cardinality", 3), Rule(1, 2, "anti-affinity")))
    predictor = SyntheticInterference(7, seed=0)
    t0 = time.perf_counter()
    greedy = plan_greedy(Cluster(81, 8), batch, constraints, predictor, None)
    ls = plan_greedy_local_search(Cluster(81, 8), batch, constraints, predictor, None)
    assert time.perf_counter() - t0 < 20
    assert check_plan(ls, batch, Cluster(81, 8), constraints) == []
    assert score(ls, predictor) >= score(greedy, predictor)


def test_planner_table_names_every_baseline():
    assert set(PLANNERS) == {"random", "round-robin", "least-loaded", "k8s-default", "greedy", "greedy-ls", "optimum"}


@pytest.mark.parametrize("seed", range(6))
def test_local_search_ends_where_no_single_move_or_swap_helps(seed):
    """Checks the vectorised move tables against a plain enumeration of every move and swap."""
    cluster, batch, constraints, predictor = random_case(200 + seed)
    try:
        plan = plan_greedy_local_search(cluster, batch, constraints, predictor, None)
    except Infeasible:
        return
    base = score(plan, predictor) * batch.size
    n, a_count = plan.shape
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            for a in range(a_count):
                if plan[i, a] == 0:
                    continue
                candidates = []
                moved = plan.copy()
                moved[i, a] -= 1
                moved[j, a] += 1
                candidates.append(moved)
                for b in range(a_count):
                    if b != a and plan[j, b] > 0:
                        swapped = plan.copy()
                        swapped[i, a] -= 1
                        swapped[j, a] += 1
                        swapped[j, b] -= 1
                        swapped[i, b] += 1
                        candidates.append(swapped)
                for other in candidates:
                    if check_plan(other, batch, cluster, constraints) == []:
                        assert score(other, predictor) * batch.size <= base + 1e-9


def test_repair_without_the_composition_model(monkeypatch):
    """When the composition model is refused as too large, the per-node model alone repairs or proves infeasibility."""
    import agents.lra_placement.optimum as opt

    def too_large(*args, **kwargs):
        raise ValueError("too many compositions")

    monkeypatch.setattr(opt, "_usable_compositions", too_large)
    cluster, batch = Cluster(2, 2), Batch(np.array([2, 2]), order=np.array([0, 0, 1, 1]))
    constraints = Constraints(2, (Rule(0, 1, "anti-affinity"),))
    plan = plan_round_robin(cluster, batch, constraints, ClashPredictor(), None)
    assert check_plan(plan, batch, cluster, constraints) == []
    with pytest.raises(Infeasible):
        opt.repair_placement(np.array([[1, 0], [1, 0]]), Batch(np.array([3, 1])), cluster, constraints)
