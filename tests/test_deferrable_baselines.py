"""The deferrable-jobs heuristics on hand-made episodes whose starts we can state slot by slot, the
margin, the tuning's determinism, and the feasibility of every rule on random tiny episodes."""
from __future__ import annotations

import numpy as np
import pytest

from agents.deferrable_jobs import data
from agents.deferrable_jobs.baselines import RULES, make_rule, usable_cores
from agents.deferrable_jobs.episode import Episode
from agents.deferrable_jobs.sim import DeferrableSim
from agents.deferrable_jobs.tuning import GRIDS, candidates, evaluate_rule, tune_all, tune_rule


def starts_per_slot(episode: Episode, rule) -> list[list[int]]:
    """Run the rule and return the sorted job rows it started in each slot."""
    sim = DeferrableSim(episode)
    out = []
    while not sim.done:
        rows = rule(sim.view())
        out.append(sorted(int(r) for r in rows))
        sim.step(rows)
    return out


def first_slot(rows, capacity, name, **params) -> list[int]:
    return starts_per_slot(Episode.from_rows(rows, capacity), make_rule(name, **params))[0]


# rows are (cores, duration, earliest, latest, submit); from_rows keeps this order on ties,
# so row i below is job i.

def test_fifo_blocks_at_the_first_misfit():
    rows = [(4, 1, 0, 0, 0), (8, 1, 0, 0, 0), (2, 1, 0, 0, 0)]
    assert first_slot(rows, [10], "fifo") == [0]          # job 2 would fit but waits behind job 1


def test_fifo_orders_by_submission_then_earliest_start():
    # job 0 submitted at 0, eligible from 1; job 1 submitted at 1: job 0 goes first at slot 1
    rows = [(4, 1, 1, 1, 0), (4, 1, 1, 1, 1)]
    assert starts_per_slot(Episode.from_rows(rows, [4, 4]), make_rule("fifo")) == [[], [0]]


def test_sjf_starts_the_shortest_first():
    rows = [(4, 6, 0, 0, 0), (2, 1, 0, 0, 0), (2, 2, 0, 0, 0)]
    assert first_slot(rows, [4], "fifo") == [0]
    assert first_slot(rows, [4], "sjf") == [1, 2]
    # SJF is a prefix rule too: a short misfit blocks the longer jobs behind it
    assert first_slot([(2, 6, 0, 0, 0), (8, 1, 0, 0, 0)], [4], "sjf") == []


def test_edf_starts_the_earliest_latest_start_first():
    rows = [(4, 1, 0, 5, 0), (2, 1, 0, 0, 0), (2, 1, 0, 2, 0)]
    assert first_slot(rows, [4], "fifo") == [0]
    assert first_slot(rows, [4], "edf") == [1, 2]


def test_least_slack_breaks_edf_ties_by_longest_duration():
    rows = [(2, 1, 0, 3, 0), (2, 4, 0, 3, 0), (2, 1, 0, 1, 0)]
    # job 2 has the least slack (1) for both; jobs 0 and 1 tie on slack 3
    assert first_slot(rows, [4], "edf") == [0, 2]          # tie kept in submission order
    assert first_slot(rows, [4], "least-slack") == [1, 2]  # tie: the longer job first


def test_tetris_packs_past_a_misfit():
    rows = [(12, 1, 0, 0, 0), (4, 1, 0, 0, 0), (2, 1, 0, 0, 0)]
    assert first_slot(rows, [10], "fifo") == []
    assert first_slot(rows, [10], "tetris") == [1, 2]


def test_tetris_alignment_prefers_more_cores_and_eps_prefers_short():
    rows = [(2, 1, 0, 0, 0), (4, 1, 0, 0, 0)]
    assert first_slot(rows, [4], "tetris", eps=0.0) == [1]   # alignment c * free: 4 cores beat 2
    long_first = [(4, 6, 0, 0, 0), (4, 1, 0, 0, 0)]
    assert first_slot(long_first, [4], "tetris", eps=0.0) == [0]   # tie on alignment: submission
    assert first_slot(long_first, [4], "tetris", eps=1.0) == [1]   # remaining-work term: short one


def test_tetris_recomputes_free_cores_after_each_start():
    # 8 cores first (best alignment), then only the 2-core job still fits in the 2 left
    rows = [(4, 1, 0, 0, 0), (8, 1, 0, 0, 0), (2, 1, 0, 0, 0)]
    assert first_slot(rows, [10], "tetris", eps=0.0) == [1, 2]


def test_easy_backfills_a_short_job_but_not_one_that_delays_the_reservation():
    capacity = [10] * 6
    rows = [
        (6, 3, 0, 0, 0),   # 0: runs slots 0-2, the head's reservation is slot 3 (4 + 6 = 10 free)
        (8, 1, 1, 5, 0),   # 1: head at slot 1, does not fit in the 4 free cores
        (4, 5, 1, 2, 0),   # 2: fits now but would still run at slot 3 with 4 > 2 spare cores
        (4, 1, 1, 5, 0),   # 3: fits now and ends before slot 3: backfilled
    ]
    ep = Episode.from_rows(rows, capacity)
    assert starts_per_slot(ep, make_rule("easy-backfill")) == [[0], [3], [], [1], [], []]
    # FIFO waits behind the head: job 2 expires, job 3 starts only after the head
    assert starts_per_slot(ep, make_rule("fifo")) == [[0], [], [], [1], [3], []]


def test_easy_backfills_into_the_spare_cores_at_the_reservation():
    rows = [
        (6, 3, 0, 0, 0),   # 0: running until slot 3
        (8, 1, 1, 1, 0),   # 1: head; at slot 3, 10 - 8 = 2 cores are spare
        (2, 5, 1, 1, 0),   # 2: outlives the reservation but fits in the 2 spare cores
        (2, 5, 1, 1, 0),   # 3: same, but the spare cores are gone
    ]
    ep = Episode.from_rows(rows, [10] * 4)
    assert starts_per_slot(ep, make_rule("easy-backfill"))[1] == [2]


def test_easy_counts_every_job_ending_at_the_reserved_slot():
    rows = [
        (3, 3, 0, 0, 0),   # 0 and 1: both run slots 0-2
        (3, 3, 0, 0, 0),
        (6, 1, 1, 1, 0),   # 2: head at slot 1; job 0 ending would be enough, but job 1 ends too,
        (3, 5, 1, 1, 0),   # 3: so 4 + 6 - 6 = 4 cores are spare at slot 3 and this one fits in them
    ]
    ep = Episode.from_rows(rows, [10] * 4)
    assert starts_per_slot(ep, make_rule("easy-backfill"))[:2] == [[0, 1], [3]]


def test_easy_passes_over_a_head_that_cannot_fit_under_the_current_capacity():
    rows = [(12, 1, 0, 0, 0), (4, 1, 0, 0, 0)]
    assert first_slot(rows, [10], "easy-backfill") == [1]


def test_margin_holds_back_cores():
    rows = [(4, 1, 0, 0, 0), (4, 1, 0, 0, 0), (2, 1, 0, 0, 0)]
    for name in RULES:
        assert sorted(first_slot(rows, [10], name)) == [0, 1, 2], name
        # 0.2 * 10 = 2 cores held back: only 8 usable
        assert sum(r[0] for r in (rows[i] for i in first_slot(rows, [10], name, margin=0.2))) <= 8, name
    assert first_slot(rows, [10], "fifo", margin=0.2) == [0, 1]
    assert first_slot(rows, [10], "fifo", margin=0.5) == [0]


def test_make_rule_rejects_bad_names_and_parameters():
    with pytest.raises(ValueError):
        make_rule("hrrn")
    with pytest.raises(ValueError):
        make_rule("fifo", eps=1.0)          # eps belongs to tetris only
    with pytest.raises(ValueError):
        make_rule("sjf", margin=0.6)
    assert make_rule("tetris", margin=0.1, eps=0.5).params == {"margin": 0.1, "eps": 0.5}


@pytest.mark.parametrize("name", RULES)
def test_rules_start_only_eligible_jobs_within_the_usable_cores(name):
    params_list = candidates(GRIDS[name])[::3]
    for seed in range(3):
        ep = data.make_episode("tiny", seed, "train")
        for params in params_list:
            rule = make_rule(name, **params)
            sim = DeferrableSim(ep)
            started = 0
            while not sim.done:
                view = sim.view()
                rows = np.asarray(rule(view), dtype=np.int64)
                assert len(set(rows.tolist())) == len(rows)
                assert set(rows.tolist()) <= set(view.eligible.tolist())
                if len(rows):
                    assert ep.cores[rows].sum() <= usable_cores(view, rule.margin) + 1e-9
                sim.step(rows)
                started += len(rows)
            assert started > 0 and sim.result.started == started


def test_rules_are_pure_functions_of_the_view():
    ep = data.make_episode("tiny", 0, "test")
    for name in RULES:
        a, b = evaluate_rule(name, {}, [ep, ep])
        assert a.as_dict() == b.as_dict()


def test_tuning_is_deterministic_and_picks_the_best_grid_point():
    grid = {"margin": [0.0, 0.1, 0.3], "eps": [0.0, 1.0]}
    best, table = tune_rule("tetris", "tiny", episodes=3, seed=1, grid=grid)
    again, table2 = tune_rule("tetris", "tiny", episodes=3, seed=1, grid=grid)
    assert best == again and table == table2
    assert len(table) == 6 and best in candidates(grid)
    top = max(row["mean_total_reward"] for row in table)
    assert next(r for r in table if r["params"] == best)["mean_total_reward"] == top
    # the table's figures are the rule's mean reward on exactly those training episodes
    train = data.episodes("tiny", "train", 3, 1)
    rewards = [r.total_reward for r in evaluate_rule("tetris", best, train)]
    assert np.isclose(np.mean(rewards), top)


def test_tune_all_returns_grid_params_for_every_rule():
    best = tune_all("tiny", episodes=2, seed=0)
    assert set(best) == set(RULES)
    for name, params in best.items():
        assert params in candidates(GRIDS[name])
