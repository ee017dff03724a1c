"""The generalisation suite: its ratios, geometric mean and worst window on hand-checkable
numbers, the issue's targets, the suite promotion gate, and one small real run."""
import json
import math

import pytest

from agents.generalisation_stats import (check_targets, geometric_mean, ratios_to_best, score_candidates,
                                         summarise_episodes, summarise_suite, worst)
from agents.promote import suite_gate


def eps(costs, done=None, total=10, span=600.0):
    """Episodes of one agent on one window, seeds 1.., all jobs done unless `done` says otherwise."""
    done = done or [total] * len(costs)
    return [{"seed": k + 1, "total_cost": c, "jobs_finished": d, "jobs_total": total,
             "makespan_s": span if d else None} for k, (c, d) in enumerate(zip(costs, done))]


RULES = ["thr", "q"]


def tiny_suite():
    # Hand-computed: A: means thr 11, q 8, ppo 4 -> best q; ratios 1.375, 1, 0.5.
    #                B: means thr 5, q 10, ppo 10 -> best thr; ratios 1, 2, 2 (ppo lost a job).
    #                seed-1551: thr 20, q 10, ppo 8 -> best q; ppo 0.8, kept out of the mean.
    return {
        "A": {"thr": eps([10, 12]), "q": eps([8, 8]), "ppo": eps([4, 4])},
        "B": {"thr": eps([5, 5]), "q": eps([10, 10]), "ppo": eps([10, 10], done=[10, 9])},
        "seed-1551": {"thr": eps([20, 20]), "q": eps([10, 10]), "ppo": eps([8, 8])},
    }


def test_geometric_mean_and_worst_by_hand():
    assert geometric_mean([0.5, 2.0]) == pytest.approx(1.0)
    assert geometric_mean([1.0, 8.0, 1.0]) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        geometric_mean([])
    with pytest.raises(ValueError):
        geometric_mean([1.0, 0.0])
    assert worst({"a": 1.2, "b": 1.5, "c": 1.5}) == ("b", 1.5)


def test_ratios_to_best_skips_rules_that_left_jobs_unless_none_finished():
    best, r = ratios_to_best({"thr": 4.0, "q": 2.0, "ppo": 3.0}, RULES, {"thr": True, "q": False, "ppo": True})
    assert best == "thr" and r == {"thr": 1.0, "q": 0.5, "ppo": 0.75}
    best, r = ratios_to_best({"thr": 4.0, "q": 2.0, "ppo": 3.0}, RULES, {"thr": False, "q": False})
    assert best == "q" and r["ppo"] == 1.5  # none finished: the cheapest rule at all


def test_window_summary_by_hand():
    s = summarise_episodes(eps([10, 12], done=[10, 9]))
    assert s["cost_mean"] == 11.0
    assert s["cost_std"] == pytest.approx(math.sqrt(2))  # sample std of 10, 12
    assert s["jobs_finished_ratio"] == 0.95 and s["all_jobs_finished"] is False
    assert s["makespan_s_mean"] == 600.0 and s["costs"] == [10.0, 12.0] and s["seeds"] == [1, 2]


def test_suite_ratios_geomean_and_worst_window_by_hand():
    res = summarise_suite(tiny_suite(), RULES)
    w = res["windows"]
    assert w["A"]["best_rule"] == "q" and w["B"]["best_rule"] == "thr" and w["seed-1551"]["best_rule"] == "q"
    assert [w["A"]["agents"][a]["ratio"] for a in ("thr", "q", "ppo")] == [1.375, 1.0, 0.5]
    assert [w["B"]["agents"][a]["ratio"] for a in ("thr", "q", "ppo")] == [1.0, 2.0, 2.0]
    assert not w["seed-1551"]["in_geomean"] and w["A"]["in_geomean"]
    ppo, thr, q = (res["overall"][a] for a in ("ppo", "thr", "q"))
    assert ppo["geomean_ratio"] == pytest.approx(1.0)  # sqrt(0.5 * 2); seed-1551's 0.8 left out
    assert (ppo["worst_window"], ppo["worst_ratio"]) == ("B", 2.0)
    assert ppo["separate"] == {"seed-1551": 0.8} and ppo["test_windows"] == 2
    assert ppo["all_jobs_finished"] is False and thr["all_jobs_finished"] is True
    assert thr["geomean_ratio"] == pytest.approx(math.sqrt(1.375)) and thr["worst_window"] == "A"
    assert q["geomean_ratio"] == pytest.approx(math.sqrt(2.0)) and not ppo["rule"] and q["rule"]


def test_tuning_score_is_not_dominated_by_the_heavy_workload():
    # cand0 [1, 100], cand1 [2, 95]: cand1 is cheaper in dollars (48.5 vs 50.5 mean) but twice
    # as dear on the light workload: scores sqrt(1 * 100/95) = 1.026 and sqrt(2 * 1) = 1.414.
    order, scores = score_candidates([[1.0, 100.0], [2.0, 95.0]])
    assert order == [0, 1]
    assert scores == pytest.approx([math.sqrt(100 / 95), math.sqrt(2)])
    order, _ = score_candidates([[1.0, 100.0], [2.0, 95.0]], unfinished=[1, 0])
    assert order == [1, 0]  # a candidate that left jobs behind somewhere ranks after one that did not
    order, _ = score_candidates([[1.0, 100.0], [2.0, 95.0], [9.0, 99.0]], unfinished=[2, 1, 1])
    assert order == [1, 2, 0]  # fewer such workloads first, then the score


def crafted(ppo_a, ppo_b, ppo_ref, thr_ref=10.0, q_ref=8.0, done_b=None):
    """A suite where the rules cost 1.0 on A and B (ppo's ratio = its cost) and thr/q on seed-1551."""
    ep = {"A": {"thr": eps([1.0]), "q": eps([1.5]), "ppo": eps([ppo_a])},
          "B": {"thr": eps([1.0]), "q": eps([1.5]), "ppo": eps([ppo_b], done=done_b)},
          "seed-1551": {"thr": eps([thr_ref]), "q": eps([q_ref]), "ppo": eps([ppo_ref])}}
    res = summarise_suite(ep, RULES)
    res["agents"] = {"thr": {"kind": "threshold", "rule": True}, "q": {"kind": "queue", "rule": True},
                     "ppo": {"kind": "lstm-ppo", "rule": False}}
    return res


def met(res):
    out = check_targets(res, agent="ppo")
    return out["met"], [t["met"] for t in out["targets"]]


def test_targets_pass_on_a_good_policy():
    ok, each = met(crafted(0.9, 0.95, 8.0))  # geo 0.925, worst 0.95, cut 20 %, = queue
    assert ok and all(each)


def test_targets_fail_one_at_a_time():
    assert met(crafted(0.7, 1.2, 8.0)) == (False, [True, False, True, True, True])  # geo 0.917 but B 1.2
    assert met(crafted(1.0, 0.95, 8.0)) == (False, [False, True, True, True, True])  # geo 0.975
    assert met(crafted(0.9, 0.95, 8.0, done_b=[9])) == (False, [True, True, False, True, True])
    assert met(crafted(0.9, 0.95, 8.5)) == (False, [True, True, True, True, False])  # cut 15 % ok, > queue
    assert met(crafted(0.9, 0.95, 8.0, thr_ref=9.0)) == (False, [True, True, True, False, True])  # cut 11 %
    out = check_targets(crafted(0.9, 0.95, 8.0), agent="ppo")
    assert out["threshold"] == "thr" and out["queue"] == "q"
    assert out["targets"][3]["value"] == pytest.approx(0.2)


def pairs(ratios_by_window, seeds=(1, 2), **flags):
    return [{"window": w, "seed": s, "candidate": 10.0 * r, "incumbent": 10.0, **flags}
            for w, r in ratios_by_window.items() for s in seeds]


def test_gate_refuses_a_candidate_worse_on_one_window_though_better_on_average():
    v = suite_gate(pairs({"W1": 0.7, "W2": 0.7, "W3": 1.2}))
    # (0.7^4 * 1.2^2)^(1/6) = 0.8378 <= 1, but W3's 1.2 > 1.05
    assert v["geomean_ratio"] == pytest.approx((0.7**4 * 1.2**2) ** (1 / 6), rel=1e-6)
    assert v["worst_window"] == "W3" and v["worst_window_ratio"] == pytest.approx(1.2)
    assert v["checks"] == {"geomean": True, "windows": False, "jobs": True} and v["promote"] is False


def test_gate_accepts_a_uniformly_better_candidate_and_reports_the_sign_test():
    v = suite_gate(pairs({"W1": 0.9, "W2": 0.95, "W3": 0.98}, seeds=(1, 2)), margin=0.02)
    assert v["promote"] is True and v["wins"] == 6 and v["losses"] == 0
    assert v["sign_test_p"] == pytest.approx(1 / 64, abs=1e-4)
    assert len(v["pairs"]) == 6 and v["pairs"][0]["ratio"] == pytest.approx(0.9)
    assert "1 - margin" not in v["rule"] and "0.98" in v["rule"]
    # the margin bites: geo ~0.942 is not <= 0.90
    assert suite_gate(pairs({"W1": 0.9, "W2": 0.95, "W3": 0.98}), margin=0.10)["promote"] is False


def test_gate_refuses_lost_jobs_only_where_the_incumbent_finished():
    lost = pairs({"W1": 0.8}, candidate_all_jobs=False, incumbent_all_jobs=True)
    v = suite_gate(lost)
    assert v["promote"] is False and v["jobs_lost"] == [{"window": "W1", "seed": 1}, {"window": "W1", "seed": 2}]
    both = pairs({"W1": 0.8}, candidate_all_jobs=False, incumbent_all_jobs=False)
    assert suite_gate(both)["promote"] is True


@pytest.mark.jvm
def test_run_suite_small_real_run(tmp_path):
    from agents.factory import make_agent
    from agents.generalisation import (rules_from_json, run_suite, suite_json, suite_markdown, tune_rules,
                                       write_rules_json)
    from sim_bridge.config import SimConfig
    from sim_bridge.runner import run_episodes
    from sim_bridge.workloads import load_workload
    from sim_bridge.workloads.paper import seed_1551_short

    sim = SimConfig(action_mode="per-type")
    short = load_workload("seed-1551-short")
    agents = {"queue": make_agent("queue", sim), "static": make_agent("static:2,1,1", sim)}
    res = run_suite(agents, sim, [short], seeds=(1, 2), max_steps=150)
    win = res["windows"]["seed-1551-short"]
    assert win["best_rule"] == "queue" and win["agents"]["queue"]["ratio"] == 1.0
    assert res["agents"]["queue"]["rule"] and not res["agents"]["static"]["rule"]
    # stacked in one batch = run alone: the same episodes
    alone = run_episodes(sim, short, agents["static"], [1, 2], max_steps=150)
    assert win["agents"]["static"]["costs"] == pytest.approx([e["total_cost"] for e in alone])
    assert win["agents"]["static"]["ratio"] == pytest.approx(
        win["agents"]["static"]["cost_mean"] / win["agents"]["queue"]["cost_mean"])
    assert json.loads(suite_json(res))["schema"] == "samm.generalisation/1"
    md = suite_markdown(res)
    assert "### seed-1551-short" in md and "| ratio | 1.000 |" in md

    # tuning: a two-candidate grid on two tiny workloads, written and read back
    wls = [short, seed_1551_short(batches=2)]
    grid = {"queue": {"jobs_per_core": [1.0, 4.0], "stabilization_steps": [1]}}
    tuned = tune_rules(sim, wls, seeds=(101,), progress=False, kinds=("queue",), grids=grid, max_steps=150)
    table = tuned["queue"]["table"]
    assert len(table) == 2 and table[0]["params"] == tuned["queue"]["params"]
    assert table[0]["geomean_ratio"] <= table[1]["geomean_ratio"] and table[0]["geomean_ratio"] >= 1.0
    path = write_rules_json(tmp_path / "rules.json", tuned, sim, wls)
    back = rules_from_json(path, sim)
    assert back["queue"].params["jobs_per_core"] == tuned["queue"]["params"]["jobs_per_core"]
    with pytest.raises(ValueError):
        rules_from_json(path, SimConfig(action_mode="per-type", cooldown_s=60.0))
    # the suite gate end to end: saved policies, paired on (window, seed) like run_suite's episodes
    from agents.promote import compare_on_suite

    agents["static"].save(tmp_path / "static")
    agents["queue"].save(tmp_path / "queue")
    v = compare_on_suite(tmp_path / "static", tmp_path / "queue", sim, [short], seeds=(1, 2), max_steps=150)
    assert [(p["window"], p["seed"]) for p in v["pairs"]] == [("seed-1551-short", 1), ("seed-1551-short", 2)]
    assert [p["candidate"] for p in v["pairs"]] == pytest.approx(win["agents"]["static"]["costs"])
    assert [p["incumbent"] for p in v["pairs"]] == pytest.approx(win["agents"]["queue"]["costs"])
    assert v["promote"] == (v["geomean_ratio"] <= 1.0 and v["worst_window_ratio"] <= 1.05 and not v["jobs_lost"])


def test_suite_agents_are_the_shipped_policy_and_the_shipped_tuned_rules():
    import json

    from agents.generalisation_agents import SHIPPED_RULES, suite_agents
    from sim_bridge.config import SimConfig

    sim = SimConfig(action_mode="per-type")
    agents, provenance = suite_agents(sim)
    assert list(agents) == ["lstm-ppo", "threshold", "target-tracking", "queue"]
    doc = json.loads(SHIPPED_RULES.read_text())
    for kind in ("threshold", "target-tracking", "queue"):
        for k, v in doc["rules"][kind]["params"].items():
            assert agents[kind].params[k] == v
    assert provenance["rules"] == str(SHIPPED_RULES)
    assert len(agents["lstm-ppo"].feature_names) == 18
    with pytest.raises(ValueError, match="tuned for sim config"):
        suite_agents(sim.model_copy(update={"cooldown_s": 60.0}))
