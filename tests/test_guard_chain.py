"""The guard chain's shared steps and a per-problem step (placement), pure and hand-checked."""
import numpy as np

from agents.lra_placement.cluster import Cluster, Constraints, Rule
from agents.lra_placement.guard import fits_node
from samm.execute.chain import (GuardContext, Skip, Wish, cooldown, dry_run, idempotency, one_per_target,
                                run_chain)


def test_shared_steps_skip_with_reasons_and_key_what_they_keep():
    ctx = GuardContext(now=100.0, decision_key="160", dry_run=True, cooldown_until={"b": 150.0, "c": 100.0})
    res = run_chain([Wish("a", 1), Wish("b", 1), Wish("c", -1), Wish("a", 2)],
                    [one_per_target(), cooldown, idempotency, dry_run], ctx)
    assert [w.target for w in res.kept] == ["a", "c"]  # c's cool-down ended exactly now: allowed
    assert all(not w.execute and w.key == f"160:{w.target}" for w in res.kept)
    assert {(s.target, s.reason) for s in res.skipped} == {("b", "cooldown"), ("a", "duplicate_target")}
    assert res.reasons()["b"].startswith("cooldown: cool-down until 150")


def test_placement_step_keeps_slots_and_rules_within_one_decision():
    cluster = Cluster(2, 3, ("n0", "n1"))
    rules = Constraints(2, (Rule(0, 1, "anti-affinity"),))
    start = np.array([[1, 0], [0, 0]])
    step = fits_node(cluster, rules, start)
    res = run_chain([Wish("n0", {0: 2}), Wish("n0", {0: 1}), Wish("n0", {1: 1}), Wish("n1", {1: 2}),
                     Wish("nx", {0: 1})], [step], GuardContext(0.0, "k"))
    assert [(w.target, w.data["composition"]) for w in res.kept] == [("n0", [3, 0]), ("n1", [0, 2])]
    reasons = [(s.target, s.reason) for s in res.skipped]
    assert reasons == [("n0", "node_full"), ("n0", "node_full"), ("nx", "unknown_node")]
    # the rule: app 1 next to app 0 is refused even with room
    res = run_chain([Wish("n0", {1: 1})], [fits_node(cluster, rules, start)], GuardContext(0.0, "k"))
    assert isinstance(res.skipped[0], Skip) and res.skipped[0].reason == "constraint"
