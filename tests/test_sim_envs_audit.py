"""Audit of the deferrable-jobs simulator, env and data layer and of the LRA placement env, optimum and
predictor: edge inputs that crashed with an unhelpful error or acted silently on garbage."""
from __future__ import annotations

import gzip

import numpy as np
import pytest

from agents.deferrable_jobs import data as djdata
from agents.deferrable_jobs.env import DeferrableJobsEnv
from agents.deferrable_jobs.episode import Episode
from agents.deferrable_jobs.settings import SETTINGS
from agents.deferrable_jobs.sim import DeferrableSim, run_episode
from agents.lra_placement.cluster import Batch, Cluster, Constraints, Rule
from agents.lra_placement.env import LraPlacementEnv
from agents.lra_placement.optimum import optimum
from agents.lra_placement.predictor import ForestParams, ForestPredictor, SyntheticInterference, default_predictor

SMALL_FOREST = ForestParams(n_estimators=5, max_depth=5, n_jobs=1)


# ----------------------------------------------------------------------------- deferrable: simulator

def _two_jobs() -> Episode:
    # (cores, duration, earliest, latest, submit)
    return Episode.from_rows([(1, 1, 0, 0, 0), (1, 1, 0, 2, 0)], [4, 4, 4])


def test_conservation_and_metrics_by_hand_with_horizon_edges():
    # job 0 runs past the horizon, job 1 never fits (capacity 0 at slot 0, then 3 < 5 cores),
    # job 2's latest start is past the horizon and it is never picked: still waiting at the end
    ep = Episode.from_rows([(2, 20, 1, 1, 0), (5, 1, 0, 2, 0), (1, 1, 2, 9, 1)], [0, 3, 3])
    sim = DeferrableSim(ep)
    sim.step([])
    r1 = sim.step([1])  # row 1 (rows sort by submit, earliest): 2 cores at slot 1, delay 0, 2 x 20
    sim.step([])
    res = sim.result
    assert (r1.utilisation, r1.delay_penalty, r1.violation) == (40.0, 0.0, 0.0)
    waiting = int(((sim.start < 0) & ~sim.dropped).sum())
    assert (res.started, res.missed, waiting) == (1, 1, 1) and res.started + res.missed + waiting == res.jobs
    assert res.total_reward == 40.0


def test_view_and_env_step_after_the_last_slot_say_the_episode_is_over():
    sim = DeferrableSim(_two_jobs())
    for _ in range(3):
        sim.step([])
    with pytest.raises(RuntimeError, match="episode is over"):
        sim.view()
    env = DeferrableJobsEnv("tiny", episode=_two_jobs())
    env.reset(seed=0)
    done = False
    while not done:
        done = env.step(np.zeros(16, np.float32))[2]
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step(np.zeros(16, np.float32))


@pytest.mark.parametrize("rows, says", [([-1], "outside"), ([5], "outside"), ([0.7], "integers"),
                                        (np.array([False, True]), "integers")])
def test_step_refuses_rows_that_are_not_job_indices(rows, says):
    sim = DeferrableSim(_two_jobs())
    with pytest.raises(ValueError, match=says):
        sim.step(rows)
    assert (sim.start == -1).all() and sim.t == 0  # nothing started, the slot not consumed


def test_step_still_takes_plain_lists_and_empty_decisions():
    result = run_episode(_two_jobs(), lambda v: list(v.eligible[:1]))
    assert (result.started, result.missed) == (2, 0)


@pytest.mark.parametrize("field, value, says", [
    ("duration", np.array([np.nan]), "finite whole"),
    ("duration", np.array([1.5]), "finite whole"),
    ("cores", np.array([np.nan]), "finite whole"),
    ("earliest", np.array([np.nan]), "finite whole"),
    ("capacity", np.array([[4, 4]]), "1-D"),
])
def test_episode_refuses_nan_fractional_or_2d_fields(field, value, says):
    fields = dict(cores=np.array([1]), duration=np.array([1]), earliest=np.array([0]), latest=np.array([0]),
                  submit=np.array([0]), capacity=np.array([4]))
    fields[field] = value
    with pytest.raises(ValueError, match=f"{field} must .*{says}|{field} must be a {says}"):
        Episode(**fields)


def test_episode_from_rows_names_a_nan_field_and_keeps_int_columns():
    with pytest.raises(ValueError, match="duration must hold finite whole numbers"):
        Episode.from_rows([(1, np.nan, 0, 0, 0)], [4])
    ep = Episode.from_rows([(2, 3, 1, 2, 0)], [4.0, 4.0])
    assert ep.duration.dtype == np.int64 and ep.capacity.dtype == np.int64 and ep.revenue.tolist() == [6]


@pytest.mark.parametrize("change", [dict(max_future=0), dict(max_eligible=0), dict(slots=0), dict(fleet_cores=0),
                                    dict(lead_max=-1), dict(offered_load=-1.0), dict(offered_load=float("nan")),
                                    dict(core_probs=(0, 0, 0, 0))])
def test_settings_refuse_sizes_that_would_divide_by_zero_or_fail_in_numpy(change):
    name = next(iter(change))
    with pytest.raises(ValueError, match=f"setting 'tiny': {name}"):
        SETTINGS["tiny"].scaled(**change)


def test_env_is_deterministic_per_seed_with_finite_observations():
    def rollout(seed):
        env = DeferrableJobsEnv("tiny")
        obs, _ = env.reset(seed=seed)
        rng = np.random.default_rng(0)
        rewards, done = [], False
        while not done:
            obs, r, done, _, _ = env.step(rng.uniform(-1, 1, 16).astype(np.float32))
            assert all(np.isfinite(v).all() for v in obs.values())
            rewards.append(r)
        return rewards

    assert rollout(3) == rollout(3)


def test_a_negative_episode_seed_is_an_error_naming_the_seed():
    with pytest.raises(ValueError, match="episode seed must be >= 0, got -1"):
        djdata.make_episode("tiny", -1)
    with pytest.raises(ValueError, match="episode seed must be >= 0, got -1"):
        djdata.episodes("tiny", "train", 2, seed=-1)


# ----------------------------------------------------------------------------- deferrable: data files

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


@pytest.mark.parametrize("text, says", [
    ("", "header must name a 'cpu_usage' column"),
    ("timestamp,cpu,assigned_mem\n0,1,2\n", "header must name a 'cpu_usage' column"),
    ("timestamp,cpu_usage,assigned_mem\n", "must be finite and not constant"),
    ("timestamp,cpu_usage,assigned_mem\n0,1,2\n300,,2\n600,3,2\n", r"csv:3: field 2 is not a number"),
    ("timestamp,cpu_usage,assigned_mem\n0,1,2\n300\n600,3,2\n", r"csv:3: the row has no field 2"),
])
def test_capacity_file_problems_name_the_file_and_line(data_dir, text, says):
    name, _ = djdata.CAPACITY_SOURCES["azure_v2"]
    path = data_dir / "datacenter-traces-aggregated" / name
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.raises(ValueError, match=says):
        djdata._cpu_readings("azure_v2")


TASK_HEADER = "task_create_time,task_end_time,job_id,task_id,number_of_instances,status,cpus,mem\n"
GOOD_TASK = "1000,1100,1,1,2,Terminated,50,0.1\n"


def _write_tasks(folder, text):
    path = folder / djdata.BATCH_TASK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as fh:
        fh.write(TASK_HEADER + text)


@pytest.mark.parametrize("bad, says", [
    ("1000,1100,1,1,1,Terminated,nan,0.1\n", r"gz:3: times, instances and CPUs must be finite"),
    ("1000,1100,1,1,1,Terminated,-50,0.1\n", r"gz:3: times, instances and CPUs must be finite"),
    ("nan,1100,1,1,1,Terminated,50,0.1\n", r"gz:3: times, instances and CPUs must be finite"),
    ("1000,1100,1\n", r"gz:3: expected at least 7 fields"),
    ("1000,abc,1,1,1,Terminated,50,0.1\n", r"gz:3: field 2 is not a number"),
])
def test_batch_task_rows_that_would_be_binned_as_garbage_name_the_line(data_dir, bad, says):
    _write_tasks(data_dir, GOOD_TASK + bad)
    with pytest.raises(ValueError, match=says):
        djdata.empirical_probs()


def test_batch_task_file_without_tasks_or_a_whole_slot_is_a_clear_error(data_dir):
    _write_tasks(data_dir, "")
    with pytest.raises(ValueError, match="no Terminated task"):
        djdata.empirical_probs()
    _clear_caches()
    _write_tasks(data_dir, "100,200,1,1,2,Terminated,50,0.1\n")  # inside the first 15-minute slot
    with pytest.raises(ValueError, match="span no whole 15-minute slot"):
        djdata._day_profile(15, 96, 75)
    _clear_caches()
    _write_tasks(data_dir, "-100,200,1,1,2,Terminated,50,0.1\n" + GOOD_TASK)  # none in a whole slot
    with pytest.raises(ValueError, match="no task created inside"):
        djdata._day_profile(15, 96, 75)
    _clear_caches()
    _write_tasks(data_dir, "\n" + GOOD_TASK * 3)  # a blank line is skipped, not an error
    assert djdata.empirical_probs()[0][0] == 1.0


# ----------------------------------------------------------------------------- LRA: env

def _lra_env():
    return LraPlacementEnv(n_nodes=3, slots=2, n_apps=2, batch=Batch(np.array([2, 1])))


@pytest.mark.parametrize("action", [np.float64("nan"), None, "x", 2.7, np.array([0, 1]), np.inf])
def test_env_actions_that_name_no_node_end_as_invalid_without_crashing(action):
    env = _lra_env()
    env.reset(seed=0)
    _, reward, done, _, info = env.step(action)
    assert done and reward == 0.0 and info["invalid_action"] and not info["complete"]
    assert info["placement"].sum() == 0  # 2.7 used to place on node 2


@pytest.mark.parametrize("action", [np.array([1]), np.int64(1), 1.0])
def test_env_still_takes_one_element_and_whole_float_actions(action):
    env = _lra_env()
    env.reset(seed=0)
    _, _, done, _, info = env.step(action)
    assert not done and env.placement[1].sum() == 1 and info["action_mask"].shape == (3,)


def test_env_with_no_feasible_node_from_the_start_reports_infeasible():
    cons = Constraints(2, (Rule(0, 0, "cardinality", 0),))  # app 0 may go nowhere
    env = LraPlacementEnv(cluster=Cluster(1, 2), constraints=cons, predictor=SyntheticInterference(2, slots=2),
                          batch=Batch(np.array([1, 1])))
    _, info = env.reset()
    assert not info["action_mask"].any()
    _, _, done, _, info = env.step(0)
    assert done and info["infeasible"] and not info["invalid_action"]


def test_env_reset_takes_batch_counts_given_as_an_array():
    env = LraPlacementEnv(n_nodes=3, slots=2, n_apps=2)
    obs, info = env.reset(options={"batch": np.array([1, 1])})
    assert obs["remaining"].tolist() == [1.0, 1.0] and env.batch.size == 2
    with pytest.raises(ValueError, match="at least one container"):
        env.reset(options={"batch": [0, 0]})


# ----------------------------------------------------------------------------- LRA: optimum

class _HandPredictor:
    """a alone 1.0, two a 0.9 each, a beside b 0.5; b always 1.0."""
    app_names = ("a", "b")

    def throughput(self, comps):
        c = np.asarray(comps, dtype=float)
        a, b = c[..., 0], c[..., 1]
        tp = np.zeros_like(c)
        tp[..., 0] = np.where(a > 0, np.where(b > 0, 0.5, np.where(a > 1, 0.9, 1.0)), 0.0)
        tp[..., 1] = np.where(b > 0, 1.0, 0.0)
        return tp


def test_optimum_matches_a_hand_solved_case():
    # 2 nodes x 2 slots, 2 a + 2 b: {aa, bb} = 1.8 + 2 = 3.8 beats {ab, ab} = 3.0
    res = optimum(Cluster(2, 2), Batch(np.array([2, 2])), Constraints.none(2), _HandPredictor())
    assert sorted(map(tuple, res.placement.tolist())) == [(0, 2), (2, 0)]
    assert res.value == pytest.approx(3.8) and res.score == pytest.approx(0.95) and res.optimal


def test_optimum_names_a_predictor_that_returns_nan():
    class NanPredictor(_HandPredictor):
        def throughput(self, comps):
            tp = super().throughput(comps)
            tp[..., 1] = np.where(np.asarray(comps)[..., 1] > 0, np.nan, 0.0)
            return tp

    with pytest.raises(ValueError, match="predictor gave a non-finite throughput"):
        optimum(Cluster(2, 2), Batch(np.array([2, 2])), Constraints.none(2), NanPredictor())


# ----------------------------------------------------------------------------- LRA: predictor

@pytest.mark.parametrize("alloc, rps, says", [
    ([[1, 1]], [[0.5]], "rps must have alloc's shape"),
    ([[1, 0], [1, 0]], [[np.nan, np.nan], [1.0, np.nan]], "non-finite throughputs of present apps"),
    ([[1, 0], [1, 0]], [[np.inf, 0.0], [1.0, 0.0]], "non-finite throughputs of present apps"),
    ([[-1, 1], [1, 0]], [[0.5, 0.5], [1.0, 0.0]], "negative counts"),
])
def test_forest_fit_refuses_misshaped_or_non_finite_targets(alloc, rps, says):
    with pytest.raises(ValueError, match=says):
        ForestPredictor(app_names=("a", "b"), slots=2, params=SMALL_FOREST).fit(np.array(alloc), np.array(rps))


def test_forest_fits_a_single_sample_and_constant_targets_with_nan_where_absent():
    one = ForestPredictor(app_names=("a", "b"), slots=2, params=SMALL_FOREST)
    one.fit(np.array([[1, 0]]), np.array([[0.7, np.nan]]))
    np.testing.assert_allclose(one.throughput(np.array([[1, 0], [0, 1]])), [[0.7, 0.0], [0.0, 0.0]])
    const = ForestPredictor(app_names=("a", "b"), slots=2, params=SMALL_FOREST)
    const.fit(np.array([[1, 1], [2, 0], [0, 2]]), np.full((3, 2), 0.8))
    np.testing.assert_allclose(const.throughput(np.array([[1, 1]])), [[0.8, 0.8]])


def test_accuracy_study_on_a_single_row_names_the_problem():
    from agents.lra_placement.data import MetisData
    from agents.lra_placement.validation import accuracy_vs_sampling

    one = MetisData(alloc=np.ones((1, 7), dtype=np.int64), rps=np.full((1, 7), 0.5), app_names=tuple("abcdefg"))
    with pytest.raises(ValueError, match="at least 2 data rows, got 1"):
        accuracy_vs_sampling(one, ratios=(0.5,), params=SMALL_FOREST)


def _saved_table(tmp_path):
    model = ForestPredictor(app_names=("a", "b"), slots=2, params=SMALL_FOREST)
    return model.fit(np.array([[1, 1], [2, 0], [0, 2]]), np.full((3, 2), 0.8)).save(tmp_path / "table.npz")


@pytest.mark.parametrize("damage", ["truncated", "empty", "other_arrays", "wrong_width"])
def test_loading_a_damaged_table_is_a_value_error_naming_the_file(tmp_path, damage):
    path = _saved_table(tmp_path)
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:100])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "other_arrays":
        with open(path, "wb") as fh:
            np.savez(fh, a=np.arange(3))
    else:
        model = ForestPredictor(app_names=("a", "b"), slots=2)
        model.table_keys, model.table = np.array([0, 1, 2]), np.zeros((3, 5))
        model.save(path)
    with pytest.raises(ValueError, match="table.npz"):
        ForestPredictor.load(path)


def _write_metis_like(path, alloc, rps):
    from test_lra_predictor import write_metis_like

    write_metis_like(path, alloc, rps)


def test_default_predictor_rebuilds_a_truncated_cache_file(tmp_path):
    alloc = np.eye(7, dtype=int) + np.roll(np.eye(7, dtype=int), 1, axis=1)
    metis = tmp_path / "metis.npz"
    _write_metis_like(metis, alloc, np.where(alloc > 0, 0.8, np.nan))
    cache = tmp_path / "cache"
    first = default_predictor(cache_dir=cache, path=metis, slots=2)
    (cached,) = cache.glob("forest-*.npz")
    cached.write_bytes(cached.read_bytes()[:64])  # e.g. a copy cut short
    again = default_predictor(cache_dir=cache, path=metis, slots=2)  # raised BadZipFile before
    comps = np.array([[1, 1, 0, 0, 0, 0, 0], [2, 0, 0, 0, 0, 0, 0]])
    np.testing.assert_array_equal(first.throughput(comps), again.throughput(comps))


def test_load_metis_drops_a_row_whose_throughput_is_infinite(tmp_path):
    """An inf throughput of a present app counted as a successful run (only NaN and 0 were failed
    runs): the row reached the predictor's fit."""
    from agents.lra_placement.data import load_metis

    alloc = np.array([[1, 0, 0, 0, 0, 0, 0], [0, 2, 0, 0, 0, 0, 0]])
    rps = np.array([[np.inf] + [np.nan] * 6, [np.nan, 0.5] + [np.nan] * 5])
    _write_metis_like(tmp_path / "m.npz", alloc, rps)
    data = load_metis(tmp_path / "m.npz")
    assert data.n_rows == 1 and data.dropped_failed == 1 and data.rps[0, 1] == 0.5
