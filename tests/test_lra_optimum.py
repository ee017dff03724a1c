"""The exact optimum (composition integer program) against hand-computed and brute-force answers."""
from __future__ import annotations

import itertools
from math import comb

import numpy as np
import pytest

from agents.lra_placement.cluster import Batch, Cluster, Constraints, Rule, check_plan, score
from agents.lra_placement.errors import Infeasible
from agents.lra_placement.optimum import (
    count_compositions,
    enumerate_compositions,
    feasible_placement,
    node_values,
    optimum,
    plan_optimum,
    repair_placement,
)
from agents.lra_placement.predictor import SyntheticInterference


class ClashPredictor:
    """Two apps: each extra container of the same app costs 0.1, any container of the other app 0.5."""

    app_names = ("a", "b")

    def throughput(self, compositions):
        c = np.asarray(compositions, dtype=float)
        own = c - 1
        other = c[:, ::-1] > 0
        return np.where(c > 0, 1.0 - 0.1 * own - 0.5 * other, 0.0)


def random_rules(rng, n_apps, slots, n_rules):
    rules = []
    for _ in range(n_rules):
        a, b = (int(x) for x in rng.integers(0, n_apps, 2))
        if rng.random() < 0.5:
            rules.append(Rule(a, b, "anti-affinity"))
        else:
            rules.append(Rule(a, b, "cardinality", int(rng.integers(1, slots + 1))))
    return Constraints(n_apps, tuple(rules))


def brute_force(cluster, batch, constraints, predictor):
    """Best total value over every placement (None when none is valid)."""
    comps = enumerate_compositions(len(batch.counts), cluster.slots)
    comps = comps[constraints.composition_ok(comps)]
    values = node_values(comps, predictor)
    best = None
    for pick in itertools.product(range(len(comps)), repeat=cluster.n_nodes):
        if comps[list(pick)].sum(axis=0).tolist() == batch.counts.tolist():
            total = values[list(pick)].sum()
            best = total if best is None else max(best, total)
    return best


def test_enumeration_counts_every_composition_once():
    comps = enumerate_compositions(7, 8)
    assert len(comps) == comb(15, 7) == 6435
    assert len(np.unique(comps, axis=0)) == 6435
    assert comps.sum(axis=1).max() == 8 and comps.min() == 0
    assert count_compositions(8, np.full(7, 8)) == 6435
    rng = np.random.default_rng(0)
    for _ in range(20):
        caps = rng.integers(0, 5, size=4)
        assert count_compositions(4, caps) == len(enumerate_compositions(4, 4, caps))


def test_hand_case_separates_the_clashing_apps():
    # 2 nodes x 2 slots, 2 a + 2 b. Apart: every container runs at 1 - 0.1 = 0.9, total 3.6.
    # Mixed ([1, 1] on both nodes): every container at 1 - 0.5 = 0.5, total 2.0. Nothing else fits.
    result = optimum(Cluster(2, 2), Batch(np.array([2, 2])), Constraints.none(2), ClashPredictor())
    assert result.optimal
    assert result.value == pytest.approx(3.6, abs=1e-12)
    assert result.score == pytest.approx(0.9, abs=1e-12)
    assert sorted(map(tuple, result.placement.tolist())) == [(0, 2), (2, 0)]


def test_hand_case_prefers_empty_slots_to_sharing():
    # 1 a + 1 b on 2 nodes x 2 slots: one per node (1.0 each) beats sharing a node (0.5 each).
    plan = plan_optimum(Cluster(2, 2), Batch(np.array([1, 1])), Constraints.none(2), ClashPredictor(), None)
    assert sorted(map(tuple, plan.tolist())) == [(0, 1), (1, 0)]
    assert score(plan, ClashPredictor()) == pytest.approx(1.0)


@pytest.mark.parametrize("seed", range(12))
def test_agrees_with_brute_force_on_tiny_cases(seed):
    rng = np.random.default_rng(seed)
    n_apps, slots, n_nodes = int(rng.integers(2, 4)), int(rng.integers(1, 4)), int(rng.integers(1, 4))
    cluster = Cluster(n_nodes, slots)
    batch = Batch(rng.multinomial(int(rng.integers(1, cluster.capacity + 1)), np.ones(n_apps) / n_apps))
    constraints = random_rules(rng, n_apps, slots, int(rng.integers(0, 3)))
    predictor = SyntheticInterference(n_apps, seed=seed, slots=slots)
    expected = brute_force(cluster, batch, constraints, predictor)
    if expected is None:
        with pytest.raises(Infeasible):
            optimum(cluster, batch, constraints, predictor)
        return
    result = optimum(cluster, batch, constraints, predictor)
    assert result.optimal
    assert check_plan(result.placement, batch, cluster, constraints) == []
    assert result.value == pytest.approx(expected, abs=1e-9)
    assert result.score == pytest.approx(score(result.placement, predictor), abs=1e-12)


def test_impossible_rules_raise_infeasible():
    # anti-affinity(a, b): a node with the b cannot take any a, so 3 a need 3 slots on the other node.
    cluster, batch = Cluster(2, 2), Batch(np.array([3, 1]))
    constraints = Constraints(2, (Rule(0, 1, "anti-affinity"),))
    with pytest.raises(Infeasible):
        optimum(cluster, batch, constraints, ClashPredictor())
    with pytest.raises(Infeasible):
        feasible_placement(cluster, batch, constraints)
    with pytest.raises(Infeasible):  # more containers than slots
        optimum(Cluster(1, 2), Batch(np.array([2, 1])), Constraints.none(2), ClashPredictor())


def test_rules_are_obeyed_even_when_they_cost_throughput():
    # Separating the apps is best, but a cardinality limit of 1 per app forces sharing.
    constraints = Constraints(2, (Rule(0, 0, "cardinality", 1), Rule(1, 1, "cardinality", 1)))
    result = optimum(Cluster(2, 2), Batch(np.array([2, 2])), constraints, ClashPredictor())
    assert result.placement.tolist() == [[1, 1], [1, 1]]
    assert result.value == pytest.approx(2.0)


def test_unsupported_inputs_raise_value_error():
    with pytest.raises(ValueError, match="predictor"):
        optimum(Cluster(2, 2), Batch(np.array([1, 1, 1])), Constraints.none(3), ClashPredictor())
    with pytest.raises(ValueError, match="constraints"):
        optimum(Cluster(2, 2), Batch(np.array([1, 1])), Constraints.none(3), ClashPredictor())
    with pytest.raises(ValueError, match="max_compositions"):
        optimum(Cluster(9, 8), Batch(np.full(7, 5)), Constraints.none(7), SyntheticInterference(7),
                max_compositions=1000)


def test_result_reports_solver_details():
    predictor = SyntheticInterference(7, seed=1)
    batch = Batch(np.full(7, 20))  # 140 containers on 27 x 8 (few-node cases take HiGHS longer)
    result = optimum(Cluster(27, 8), batch, Constraints.none(7), predictor, time_limit_s=60)
    assert result.optimal and result.status == 0
    assert result.gap is not None and result.gap <= 1e-6
    assert result.dual_bound == pytest.approx(result.value, rel=1e-6)
    assert 0 < result.solve_seconds <= result.seconds
    assert result.n_compositions <= 6435
    assert result.score == pytest.approx(score(result.placement, predictor), abs=1e-12)
    # Nodes are filled fullest first, so any empty node comes last.
    loads = result.placement.sum(axis=1)
    assert (np.diff(loads) <= 0).all()


def test_repair_keeps_what_it_can():
    # a, a were put on separate nodes; with anti-affinity(a, b) the two b then fit nowhere.
    cluster, batch = Cluster(2, 2), Batch(np.array([2, 2]), order=np.array([0, 0, 1, 1]))
    constraints = Constraints(2, (Rule(0, 1, "anti-affinity"),))
    partial = np.array([[1, 0], [1, 0]])
    plan = repair_placement(partial, batch, cluster, constraints)
    assert check_plan(plan, batch, cluster, constraints) == []
    assert np.minimum(plan, partial).sum() == 1  # one a had to move; the other stayed
    # A partial that can simply be completed is kept whole.
    plan = repair_placement(np.array([[1, 0], [0, 0]]), batch, cluster, constraints)
    assert plan[0, 0] >= 1 and check_plan(plan, batch, cluster, constraints) == []
