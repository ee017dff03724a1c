"""The deferrable-jobs data layer: capacity windows from the aggregated traces, Alibaba-shaped
job streams, Table 4's distributions, the train/test day split and the file-free `tiny` setting."""
import time

import numpy as np
import pytest

from agents.deferrable_jobs import data
from agents.deferrable_jobs.data import (CAPACITY_SOURCES, capacity_start, empirical_probs, episodes, job_probs,
                                         make_episode, share_series, split_slots)
from agents.deferrable_jobs.settings import CORE_CASES, CORE_CATEGORIES, DURATION_CASES, DURATION_CATEGORIES, SETTINGS

HAVE_DATA = all((data.data_dir() / "datacenter-traces-aggregated" / f).is_file() for f, _ in CAPACITY_SOURCES.values()) \
    and (data.data_dir() / data.BATCH_TASK_FILE).is_file()
needs_data = pytest.mark.skipif(not HAVE_DATA, reason=f"trace files not under {data.data_dir()}")

FIELDS = ("cores", "duration", "earliest", "latest", "submit", "capacity")


def _clear_caches():
    for fn in (data._cpu_readings, data._batch_tasks, data._share_series, data.empirical_probs, data._day_profile):
        fn.cache_clear()


def _same(a, b) -> bool:
    return all(np.array_equal(getattr(a, f), getattr(b, f)) for f in FIELDS)


def _category_freq(eps, attr, categories):
    values = np.concatenate([getattr(e, attr) for e in eps])
    return np.array([(values == c).mean() for c in categories]), len(values)


# ----------------------------------------------------------------------------- determinism

@needs_data
@pytest.mark.parametrize("name", ["default", "tiny"])
def test_same_seed_same_episode_and_different_seeds_differ(name):
    a, b = make_episode(name, 3), make_episode(name, 3)
    assert _same(a, b)
    c = make_episode(name, 4)
    assert not np.array_equal(a.capacity, c.capacity)
    assert a.n_jobs != c.n_jobs or not np.array_equal(a.cores, c.cores)
    assert not _same(a, make_episode(name, 3, "test"))


@needs_data
def test_episodes_is_a_list_of_make_episode():
    eps = episodes("default", "test", 3, seed=2)
    assert len(eps) == 3 and _same(eps[1], make_episode("default", 2 * 100_003 + 1, "test"))


def test_unknown_split_is_refused():
    with pytest.raises(ValueError, match="split"):
        make_episode("tiny", 0, "validation")


# ----------------------------------------------------------------------------- capacity and split

@needs_data
@pytest.mark.parametrize("source", sorted(CAPACITY_SOURCES))
def test_train_and_test_windows_use_disjoint_whole_days(source):
    s = SETTINGS["default"].scaled(capacity_source=source)
    n = len(share_series(s))
    train, test = split_slots(s, "train"), split_slots(s, "test")
    assert train[0] == 0 and train[1] == test[0] and test[1] == n
    assert train[1] % 96 == 0 and 0.6 < train[1] / n < 0.75
    train_days = {d for seed in range(200) for d in range(capacity_start(s, seed, "train") // 96,
                                                          (capacity_start(s, seed, "train") + s.slots - 1) // 96 + 1)}
    test_days = {d for seed in range(200) for d in range(capacity_start(s, seed, "test") // 96,
                                                         (capacity_start(s, seed, "test") + s.slots - 1) // 96 + 1)}
    assert train_days and test_days and not train_days & test_days
    assert max(train_days) < train[1] // 96 <= min(test_days)
    assert len(train_days) > 3  # the starts spread over the split, not one day


@needs_data
def test_episode_capacity_is_the_window_of_the_series():
    s = SETTINGS["default"].scaled(capacity_noise=0.0)
    start = capacity_start(s, 5, "test")
    want = np.floor(s.fleet_cores * (1 - share_series(s)[start:start + s.slots])).astype(np.int64)
    assert np.array_equal(make_episode(s, 5, "test").capacity, want)


@needs_data
@pytest.mark.parametrize("source", sorted(CAPACITY_SOURCES))
def test_share_series_is_min_max_normalised_to_the_ondemand_range(source):
    s = SETTINGS["default"].scaled(capacity_source=source)
    share = share_series(s)
    assert share.min() >= s.ondemand_low - 1e-12 and share.max() <= s.ondemand_high + 1e-12
    # slot means of a min-max normalised series come close to both ends
    assert share.min() < s.ondemand_low + 0.1 and share.max() > s.ondemand_high - 0.15


@needs_data
@pytest.mark.parametrize("name", ["default", "tiny"])
def test_capacity_is_integer_and_within_the_fleet_band(name):
    s = SETTINGS[name]
    margin = 5 * s.capacity_noise * s.fleet_cores + 1
    caps = np.concatenate([e.capacity for e in episodes(s, "train", 20) + episodes(s, "test", 10)])
    assert caps.dtype.kind == "i"
    assert caps.min() >= s.fleet_cores * (1 - s.ondemand_high) - margin
    assert caps.max() <= s.fleet_cores * (1 - s.ondemand_low) + margin
    assert caps.std() > 2  # it varies over the day


@needs_data
def test_capacity_noise_has_the_given_std():
    s = SETTINGS["default"]
    quiet = s.scaled(capacity_noise=0.0)
    diff = np.concatenate([make_episode(s, k).capacity - make_episode(quiet, k).capacity for k in range(30)])
    assert 0.6 < diff.std() / (s.capacity_noise * s.fleet_cores) < 1.4


# ----------------------------------------------------------------------------- jobs

@needs_data
def test_empirical_distributions_are_not_degenerate():
    cp, dp = empirical_probs()
    assert len(cp) == 4 and len(dp) == 6
    assert abs(sum(cp) - 1) < 1e-9 and abs(sum(dp) - 1) < 1e-9
    assert min(cp) > 0.05 and min(dp) > 0.03 and max(cp) < 0.6 and max(dp) < 0.6
    # the values printed in the module docstring
    assert np.allclose(cp, (0.503, 0.141, 0.163, 0.193), atol=6e-4)
    assert np.allclose(dp, (0.558, 0.099, 0.085, 0.061, 0.049, 0.148), atol=6e-4)


@needs_data
def test_table4_core_case_2_is_honoured():
    freq, n = _category_freq(episodes("core2", "train", 15), "cores", CORE_CATEGORIES)
    assert n > 3000 and np.allclose(freq, 0.25, atol=0.03)
    # the other attribute stays empirical
    dfreq, _ = _category_freq(episodes("core2", "train", 15), "duration", DURATION_CATEGORIES)
    assert np.allclose(dfreq, empirical_probs()[1], atol=0.03)


@needs_data
def test_table4_duration_case_3_is_honoured():
    freq, n = _category_freq(episodes("dur3", "train", 10), "duration", DURATION_CATEGORIES)
    assert np.allclose(freq, DURATION_CASES[3], atol=0.03)
    assert freq[4] == 0 and freq[5] == 0
    assert np.allclose(job_probs("core1")[0], CORE_CASES[1])


@needs_data
def test_default_jobs_follow_the_empirical_distributions():
    eps = episodes("default", "train", 15)
    cfreq, _ = _category_freq(eps, "cores", CORE_CATEGORIES)
    dfreq, _ = _category_freq(eps, "duration", DURATION_CATEGORIES)
    cp, dp = empirical_probs()
    assert np.allclose(cfreq, cp, atol=0.03) and np.allclose(dfreq, dp, atol=0.03)


@needs_data
@pytest.mark.parametrize("name", ["default", "core2", "dur1", "tiny"])
def test_offered_load_matches_the_setting(name):
    s = SETTINGS[name]
    eps = episodes(s, "train", 30)
    offered = sum(int(e.revenue.sum()) for e in eps)
    capacity = sum(int(e.capacity.sum()) for e in eps)
    # floor() takes about half a core per slot off the capacity, so allow a few per cent
    assert 0.9 < offered / capacity / s.offered_load < 1.15
    heavier = episodes(s.scaled(offered_load=2 * s.offered_load), "train", 30)
    assert 1.8 < sum(e.n_jobs for e in heavier) / sum(e.n_jobs for e in eps) < 2.2


@needs_data
def test_leads_and_windows_stay_in_their_ranges():
    s = SETTINGS["default"]
    for e in episodes(s, "train", 10):
        lead, window = e.earliest - e.submit, e.latest - e.earliest
        assert lead.min() == 0 and lead.max() == s.lead_max
        assert window.min() == 0 and window.max() == s.window_max
        assert e.earliest.max() <= s.slots - 1 and e.submit.max() <= s.slots - 1
        assert (np.diff(e.submit) >= 0).all()


@needs_data
def test_realtime_jobs_start_when_submitted_and_match_default():
    for k in range(5):
        rt, de = make_episode("realtime", k), make_episode("default", k)
        assert (rt.earliest == rt.submit).all() and (rt.latest == rt.submit).all()
        # same capacity and the same jobs, only without lead and window
        assert np.array_equal(rt.capacity, de.capacity)
        key = lambda e: sorted(zip(e.submit.tolist(), e.cores.tolist(), e.duration.tolist()))
        assert key(rt) == key(de)


@needs_data
def test_arrivals_follow_the_daily_profile():
    profile = data.arrival_profile("default")
    assert len(profile) == 96 and abs(profile.mean() - 1) < 1e-9 and profile.max() > 1.5 * profile.min()


# ----------------------------------------------------------------------------- no files, speed

def test_tiny_needs_no_data_files(tmp_path, monkeypatch):
    monkeypatch.setenv("SAMM_DEFERRABLE_DATA", str(tmp_path))
    _clear_caches()
    try:
        e = make_episode("tiny", 0)
        assert e.slots == SETTINGS["tiny"].slots and e.n_jobs > 0
        assert set(np.unique(e.cores)) <= set(CORE_CATEGORIES)
        with pytest.raises(FileNotFoundError, match="SAMM_DEFERRABLE_DATA"):
            make_episode("default", 0)
    finally:
        _clear_caches()


@needs_data
def test_parsing_and_episodes_are_fast():
    _clear_caches()
    t0 = time.perf_counter()
    make_episode("default", 0)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    episodes("default", "train", 20)
    assert first < 3.0 and (time.perf_counter() - t0) / 20 < 0.05
