"""Deferrable-jobs problem (OSDEC): the prefix rule, the simulator's windows, runs and reward on
hand-made calendars, the features, the env, training determinism, the saved policy and the
REST schedule operation."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from gymnasium.utils.env_checker import check_env

from agents.deferrable_jobs.env import DeferrableJobsEnv
from agents.deferrable_jobs.episode import Episode
from agents.deferrable_jobs.features import SummaryHistory, job_tokens, slot_summary
from agents.deferrable_jobs.osdec import OsdecConfig, OsdecModel, VARIANTS
from agents.deferrable_jobs.policy import OsdecPolicy, RulePolicy
from agents.deferrable_jobs.rules import order_select, prefix_select, slot_reward
from agents.deferrable_jobs.service import ScheduleRequest, build_view, create_app
from agents.deferrable_jobs.settings import SETTINGS, get_setting
from agents.deferrable_jobs.sim import DeferrableSim, run_episode
from agents.deferrable_jobs.train import run_greedy, train


# ----------------------------------------------------------------------------- the prefix rule

def test_prefix_rule_takes_the_longest_fitting_prefix_highest_score_first():
    scores = np.array([0.1, 0.9, 0.5, 0.7])
    cores = np.array([1, 4, 2, 3])
    # order by score: job1 (4), job3 (3), job2 (2), job0 (1); free 8: 4+3 = 7 fits, +2 = 9 does not
    assert prefix_select(scores, cores, 8).tolist() == [1, 3]
    # the first misfit stops it even though job0 (1 core) would still fit
    assert prefix_select(scores, cores, 7.5).tolist() == [1, 3]
    assert prefix_select(scores, cores, 3).tolist() == []          # the top job does not fit: nothing
    assert prefix_select(scores, cores, 100).tolist() == [1, 3, 2, 0]
    assert prefix_select(np.array([]), np.array([]), 5).tolist() == []
    # ties keep the given order, NaN ranks last
    assert prefix_select(np.array([1.0, 1.0, math.nan]), np.array([1, 1, 1]), 3).tolist() == [0, 1, 2]
    with pytest.raises(ValueError):
        prefix_select(np.zeros(2), np.zeros(3), 1)


def test_skip_mapping_packs_past_misfits_and_lets_negative_scores_wait():
    from agents.deferrable_jobs.rules import select_by_scores

    scores = np.array([0.1, 0.9, 0.5, -0.2])
    cores = np.array([1, 4, 5, 1])
    # highest first: job1 (4) fits 6, job2 (5) does not -> skipped, job0 (1) fits; job3 waits (score < 0)
    assert select_by_scores(scores, cores, 6, "skip").tolist() == [1, 0]
    assert select_by_scores(scores, cores, 6, "prefix").tolist() == [1]
    with pytest.raises(ValueError, match="mapping"):
        select_by_scores(scores, cores, 6, "bogus")


def test_order_select_stops_or_skips_misfits():
    cores = np.array([2, 5, 1])
    assert order_select(np.array([0, 1, 2]), cores, 4).tolist() == [0]
    assert order_select(np.array([0, 1, 2]), cores, 4, skip_misfits=True).tolist() == [0, 2]


def test_slot_reward_is_eq6_by_hand():
    # two jobs started: (2 cores x 3 slots, delay 1) and (1 x 4, delay 0); violation 1.5 cores
    util, dpen, vpen = slot_reward(np.array([2, 1]), np.array([3, 4]), np.array([1, 0]), 1.5)
    assert (util, dpen, vpen) == (10.0, -2.0, -15.0)


# ----------------------------------------------------------------------------- the simulator

def calendar():
    # rows: (cores, duration, earliest, latest, submit)
    rows = [(2, 3, 0, 1, 0),     # job 0: eligible slots 0-1
            (3, 1, 1, 1, 0),     # job 1: must start at slot 1 exactly
            (1, 2, 2, 4, 1)]     # job 2: submitted at 1, eligible from 2
    return Episode.from_rows(rows, capacity=[4, 4, 1, 4, 4])


def test_windows_and_uninterrupted_runs_on_a_hand_made_calendar():
    sim = DeferrableSim(calendar())
    v = sim.view()
    assert v.eligible.tolist() == [0] and v.future.tolist() == [1] and v.free == 4
    with pytest.raises(ValueError, match="not eligible"):
        sim.step([1])                         # job 1's window opens at slot 1
    r0 = sim.step([])                         # wait at slot 0
    assert r0.reward == 0
    v = sim.view()
    assert v.eligible.tolist() == [0, 1]      # EDF order: both latest 1, then submission
    assert v.future.tolist() == [2]
    with pytest.raises(ValueError, match="cores"):
        sim.step([0, 1])                      # 5 cores > 4 free
    r1 = sim.step([0])                        # job 0 starts at 1 (delay 1); job 1 expires unstarted
    assert (r1.utilisation, r1.delay_penalty, r1.missed) == (6.0, -2.0, 1)
    # slot 2: capacity drops to 1 while job 0 (2 cores) runs: v = 1 core, -10
    v = sim.view()
    assert v.running.tolist() == [0] and v.free == -1
    r2 = sim.step([])
    assert r2.violation == 1.0 and r2.violation_penalty == -10.0
    v = sim.view()                            # slot 3: job 0 runs slots 1-3, still running
    assert v.running.tolist() == [0] and v.eligible.tolist() == [2] and v.free == 2
    r3 = sim.step([2])                        # job 2 starts at 3, delay 1
    assert r3.reward == 2.0 - 2.0
    with pytest.raises(ValueError, match="not eligible"):
        sim.step([2])                         # never twice
    res = sim.result
    assert sim.done is False and res.started == 2 and res.missed == 1 and res.violation_slots == 1
    sim.step([])
    assert sim.done and res.total_reward == 6 - 2 - 10 + 2 - 2


def test_episode_rejects_inconsistent_jobs():
    with pytest.raises(ValueError, match="submit <= earliest <= latest"):
        Episode.from_rows([(1, 1, 3, 2, 0)], [4, 4, 4, 4])
    with pytest.raises(ValueError, match="at least one core"):
        Episode.from_rows([(0, 1, 0, 0, 0)], [4])
    with pytest.raises(ValueError, match="capacity"):
        Episode.from_rows([(1, 1, 0, 0, 0)], [4, float("nan")])


def test_realtime_variant_removes_the_windows():
    ep = calendar().realtime()
    assert (ep.earliest == ep.submit).all() and (ep.latest == ep.submit).all()


# ----------------------------------------------------------------------------- features and env

def test_tokens_put_eligible_jobs_first_and_pack_the_rest():
    setting = get_setting("tiny")
    sim = DeferrableSim(calendar())
    sim.step([])
    sim.step([0])
    sim.step([])
    v = sim.view()                            # slot 3: eligible [2], running [0]
    tok, mask, shown = job_tokens(v, setting)
    assert shown.tolist() == [2]
    assert mask[:2].all() and not mask[2:].any()
    assert tok[0, 0] == 1 and tok[1, 1] == 1           # kind one-hots
    assert tok[0, 3] == pytest.approx(1 / 8) and tok[0, 4] == pytest.approx(2 / 12)
    assert tok[1, 9] == pytest.approx(1 / 12)          # job 0 has one slot left (runs 1..3)
    assert tok[0, 10] == pytest.approx(4 / setting.fleet_cores)
    s = slot_summary(v, setting)
    assert s[0] == pytest.approx(4 / setting.fleet_cores) and s[2] == 0.0 and s[4] == pytest.approx(1 / 8)
    h = SummaryHistory(3)
    h.push(s)
    assert (h.push(s * 0 + 1)[-2:] == np.stack([s, s * 0 + 1])).all()


def test_env_passes_gymnasium_checks_and_maps_scores_through_the_prefix_rule():
    env = DeferrableJobsEnv("tiny")
    check_env(env, skip_render_check=True)
    env = DeferrableJobsEnv("tiny", episode=Episode.from_rows([(2, 1, 0, 0, 0), (3, 1, 0, 0, 0)], [4, 4]))
    env.reset(seed=0)
    obs, r, *_ , info = env.step(np.array([-1.0, 1.0] + [0.0] * 14, dtype=np.float32))
    # scores rank job 1 (3 cores) before job 0: 3 fits 4 free, then 2 does not -> only job 1 starts
    assert info["started"] == 1 and info["utilisation"] == 3.0


# ----------------------------------------------------------------------------- training and the policy

def test_training_is_deterministic_for_a_seed_and_every_variant_builds():
    cfg = OsdecConfig(variant="osdec", seed=3, total_steps=2048, eval_every=1, eval_episodes=1)
    _, a = train("tiny", cfg, progress=False)
    _, b = train("tiny", cfg, progress=False)
    assert a[-1]["eval_reward"] == b[-1]["eval_reward"] and a[-1]["policy_loss"] == b[-1]["policy_loss"]
    setting = get_setting("tiny")
    for v in VARIANTS:
        model = OsdecModel.build(OsdecConfig(variant=v), setting)
        env = DeferrableJobsEnv(setting)
        o, _ = env.reset(seed=1)
        mu, sigma, value = model(torch.as_tensor(o["tokens"])[None], torch.as_tensor(o["mask"].astype(bool))[None],
                                 model.aux_features(torch.as_tensor(o["history"])[None]))
        assert mu.shape == (1, setting.max_eligible) and (sigma > 0).all() and value.shape == (1,)


def test_saved_policy_round_trips_and_schedules_only_what_fits(tmp_path):
    setting = get_setting("tiny")
    cfg = OsdecConfig(variant="osdec", seed=1)
    model = OsdecModel.build(cfg, setting)
    pol = OsdecPolicy(model, cfg, setting, version="t1")
    pol.save(tmp_path / "p")
    back = OsdecPolicy.load(tmp_path / "p")
    from agents.deferrable_jobs.data import make_episode

    ep = make_episode("tiny", 5, "test")
    a = run_greedy(pol.model, setting, [ep])[0]
    b = run_greedy(back.model, setting, [ep])[0]
    assert a.as_dict() == b.as_dict()
    hist = SummaryHistory()
    res = run_episode(ep, lambda v: back.schedule(v, hist))
    assert res.total_reward == a.total_reward
    (tmp_path / "p" / "metadata.json").write_text('{"kind": "osdec", "problem": "deferrable-jobs", "format": 9}')
    with pytest.raises(ValueError, match="format"):
        OsdecPolicy.load(tmp_path / "p")


# ----------------------------------------------------------------------------- REST

@pytest.fixture
def client():
    return TestClient(create_app("tetris", RulePolicy("tetris", "tiny", eps=1.0)))


def body(**kw):
    b = {"slot": 5, "capacity": 6,
         "eligible": [{"id": "a", "cores": 4, "duration": 2, "earliest": 4, "latest": 6},
                      {"id": "b", "cores": 2, "duration": 1, "earliest": 5, "latest": 9, "submitted": 3},
                      {"id": "c", "cores": 2, "duration": 12, "earliest": 5, "latest": 5}],
         "running": [{"id": "r", "cores": 2, "remaining": 1, "duration": 3}],
         "future": [{"id": "f", "cores": 1, "duration": 2, "earliest": 7, "latest": 8, "submitted": 4}]}
    b.update(kw)
    return b


def test_schedule_route_answers_eligible_jobs_that_fit(client):
    r = client.post("/v1/agents/tetris/schedule", json=body())
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["free"] == 4.0
    cores = {"a": 4, "b": 2, "c": 2}
    assert set(out["start"]) <= set(cores) and sum(cores[j] for j in out["start"]) <= 4 and out["start"]


def test_schedule_view_matches_the_simulators():
    view, ids = build_view(ScheduleRequest(**body()), slots=24)
    assert ids == ["a", "b", "c", "r", "f"]
    assert view.running_cores == 2 and view.free == 4
    assert view.eligible.tolist() == [2, 0, 1]          # EDF: latest 5, 6, 9
    assert view.start[3] == view.t - 2                   # ran 2 of its 3 slots


@pytest.mark.parametrize("change, words", [
    ({"capacity": "NaN"}, "capacity"),
    ({"capacity": -1}, "capacity"),
    ({"eligible": [{"id": "a", "cores": 1, "duration": 1, "earliest": 6, "latest": 7}]}, "eligible[0]"),
    ({"eligible": [{"id": "a", "cores": 1, "duration": 1, "earliest": 5, "latest": 5}],
      "future": [{"id": "a", "cores": 1, "duration": 1, "earliest": 7, "latest": 8}]}, "duplicate"),
    ({"running": [{"id": "r", "cores": 1, "remaining": 4, "duration": 2}]}, "running[0]"),
    ({"eligible": [{"id": "a", "cores": 0, "duration": 1, "earliest": 5, "latest": 5}]}, "cores"),
    ({"extra": 1}, "extra"),
    ({"capacity": 1e300}, "capacity"),                                   # past int64: was a 500 blaming the agent
    ({"slot": 2**63, "eligible": [], "future": []}, "slot"),
    ({"future": [{"id": "f", "cores": 1, "duration": 1, "earliest": 7, "latest": 10**40}]}, "future.0.latest"),
])
def test_schedule_rejects_bad_input_naming_the_field(client, change, words):
    r = client.post("/v1/agents/tetris/schedule", json=body(**change))
    assert r.status_code == 422 and words in r.text, r.text


def test_schedule_names_the_body_when_it_is_not_json(client):
    r = client.post("/v1/agents/tetris/schedule", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["detail"].startswith("body: Invalid JSON"), r.text


def test_every_setting_is_well_formed():
    for name, s in SETTINGS.items():
        assert s.name == name
        for probs in (s.core_probs, s.duration_probs):
            assert probs is None or abs(sum(probs) - 1) < 1e-9


def test_generic_decide_route_says_a_heuristic_answers_only_its_schedule_route(tmp_path):
    from samm.plan.registry import PolicyRegistry
    from samm.plan.service import create_app as create_service

    reg = PolicyRegistry(tmp_path / "store")
    reg.host("tetris", RulePolicy("tetris", "tiny", eps=16))
    c = TestClient(create_service(reg))
    s = get_setting("tiny")
    from agents.deferrable_jobs.features import HISTORY, SUMMARY_FEATURES, TOKEN_FEATURES, n_tokens

    obs = {"tokens": [[0.0] * len(TOKEN_FEATURES)] * n_tokens(s), "mask": [0] * n_tokens(s),
           "history": [[0.0] * len(SUMMARY_FEATURES)] * HISTORY}
    r = c.post("/v1/agents/tetris/decide", json={"session_id": "s", "observation": obs})
    assert r.status_code == 501 and "/schedule" in r.text
    r = c.post("/v1/agents/tetris/schedule", json=body())
    assert r.status_code == 200 and r.json()["start"]
