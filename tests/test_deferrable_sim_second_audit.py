"""Second audit of the deferrable-jobs problem (simulator, env, data, baselines and the /schedule
route). Each test failed before its fix."""
from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

from agents.deferrable_jobs import data as djdata
from agents.deferrable_jobs.env import DeferrableJobsEnv
from agents.deferrable_jobs.episode import Episode
from agents.deferrable_jobs.policy import shipped_policy
from agents.deferrable_jobs.service import create_app
from agents.deferrable_jobs.settings import SETTINGS


# ----------------------------------------------------------------------------- /schedule sessions

@pytest.fixture(scope="module")
def osdec_client():
    return TestClient(create_app("osdec", shipped_policy()))


def _slot(slot: int, session: str) -> dict:
    # jobs and capacity vary with the slot so that each slot's summary differs
    return {"slot": slot, "capacity": 20 + 3 * (slot % 7), "session": session,
            "eligible": [{"id": f"j{slot}-{i}", "cores": 1 + (slot + i) % 4, "duration": 1 + i,
                          "earliest": slot, "latest": slot + i} for i in range(3)],
            "running": [{"id": f"r{slot}", "cores": 1 + slot % 3, "remaining": 2, "duration": 4}]}


def _scores(client, body: dict) -> dict:
    r = client.post("/v1/agents/osdec/schedule", json=body)
    assert r.status_code == 200, r.text
    return r.json()["scores"]


def test_a_retried_slot_gets_the_answer_the_first_call_got(osdec_client):
    """Each call pushed its slot's summary, so a retry of slot 12 (or a second process deciding it
    through the same session) put slot 12 in the auxiliary window twice and got other scores."""
    for t in (10, 11):
        _scores(osdec_client, _slot(t, "retry"))
    first = _scores(osdec_client, _slot(12, "retry"))
    again = _scores(osdec_client, _slot(12, "retry"))
    assert again == first
    # and the session goes on as if slot 12 had been sent once
    for t in (10, 11, 12):
        _scores(osdec_client, _slot(t, "once"))
    assert _scores(osdec_client, _slot(13, "retry")) == _scores(osdec_client, _slot(13, "once"))


def test_a_session_reused_from_slot_zero_starts_afresh(osdec_client):
    """A caller that ran an episode and starts the next one at slot 0 with the same session (the
    default one) had the last run's slots in its window; the simulator starts a new episode's
    window empty, so the answers differed from a fresh session's."""
    for t in range(20, 26):
        _scores(osdec_client, _slot(t, "reused"))
    assert _scores(osdec_client, _slot(0, "reused")) == _scores(osdec_client, _slot(0, "fresh"))
    assert _scores(osdec_client, _slot(1, "reused")) == _scores(osdec_client, _slot(1, "fresh"))


# ----------------------------------------------------------------------------- capacity files

def _clear_caches():
    for fn in (djdata._cpu_readings, djdata._batch_tasks, djdata._share_series, djdata.empirical_probs,
               djdata._day_profile):
        fn.cache_clear()


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SAMM_DEFERRABLE_DATA", str(tmp_path))
    _clear_caches()
    yield tmp_path
    _clear_caches()


def _azure(folder, times):
    name, _ = djdata.CAPACITY_SOURCES["azure_v2"]
    path = folder / "datacenter-traces-aggregated" / name
    path.parent.mkdir(parents=True)
    path.write_text("timestamp,cpu_usage,assigned_mem\n" + "".join(f"{t},{i + 1},2\n" for i, t in enumerate(times)))


@pytest.mark.parametrize("times, says", [
    ((0, 600, 300, 900), r"csv:4: timestamp 300 is not after the previous reading's 600"),
    ((0, 300, 300, 600), r"csv:4: timestamp 300 is not after the previous reading's 300"),
    ((0, "nan", 600), r"csv:3: timestamp must be a finite number"),
])
def test_capacity_readings_out_of_time_order_name_the_line(data_dir, times, says):
    """The series was read in file order and the timestamps never looked at: an unsorted or
    repeated reading scrambled the capacity days (and which of them train or test) in silence."""
    _azure(data_dir, times)
    with pytest.raises(ValueError, match=says):
        djdata._cpu_readings("azure_v2")


def test_capacity_readings_in_time_order_still_load(data_dir):
    _azure(data_dir, (0, 300, 600, 1200))
    assert djdata._cpu_readings("azure_v2").tolist() == [1.0, 2.0, 3.0, 4.0]


# ----------------------------------------------------------------------------- env actions

def test_an_action_with_too_few_scores_is_refused_in_any_slot_and_consumes_none():
    """A short action was cut to the eligible jobs and worked while a slot had few of them, then
    failed mid-episode with "scores has shape (2,), cores (3,)", naming neither the action nor
    the size the env takes."""
    ep = Episode.from_rows([(1, 1, 0, 0, 0)], [4, 4, 4])          # one eligible job at slot 0
    env = DeferrableJobsEnv("tiny", episode=ep)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="action must hold 16 scores .*got 2"):
        env.step(np.zeros(2, np.float32))
    assert env.sim.t == 0 and (env.sim.start == -1).all()
    _, _, done, _, info = env.step(np.zeros(16, np.float32))     # the full action still works
    assert info["started"] == 1 and not done


# ----------------------------------------------------------------------------- episodes and settings

@pytest.mark.parametrize("rows", [[(1, 1, 1, 1, 1, 1)] * 5,     # a sixth field (an id): 5 jobs read as 6
                                  [(1, 1, 0, 0)],                # a field short: an IndexError
                                  [3]])
def test_episode_rows_without_exactly_five_fields_are_refused(rows):
    with pytest.raises(ValueError, match=r"each row needs the 5 fields \('cores', 'duration'"):
        Episode.from_rows(rows, [4, 4])


def test_a_setting_with_its_on_demand_range_upside_down_is_refused():
    """ondemand_low above ondemand_high mapped the capacity series upside down (the busiest hours
    got the most capacity) without a word."""
    with pytest.raises(ValueError, match="setting 'tiny': ondemand_low 0.9 is above ondemand_high 0.8"):
        SETTINGS["tiny"].scaled(ondemand_low=0.9)
    assert SETTINGS["tiny"].scaled(ondemand_low=0.8).ondemand_low == 0.8


@pytest.mark.parametrize("reading", ["-1", "nan", "inf"])
def test_a_negative_or_nan_cpu_reading_names_its_line(data_dir, reading):
    """A -1 ("no data") reading became the series' minimum and squeezed every slot's capacity in
    silence; a NaN was refused without saying which of the 8,640 lines held it."""
    name, _ = djdata.CAPACITY_SOURCES["google2019"]
    path = data_dir / "datacenter-traces-aggregated" / name
    path.parent.mkdir(parents=True)
    path.write_text("avg_cpu,avg_mem\n0.4,1\n0.5,1\n" + f"{reading},1\n" + "0.45,1\n")
    with pytest.raises(ValueError, match=rf"csv:4: a CPU reading must be a finite number >= 0, got '{reading}'"):
        djdata._cpu_readings("google2019")
