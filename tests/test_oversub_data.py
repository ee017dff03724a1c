"""The oversubscription data layer: the Azure-schema loader and the calibrated trace generator."""
import gzip

import numpy as np
import pytest

from agents.oversubscription import data
from agents.oversubscription.data import (block_starts, calibration_report, clipped_normal_moments,
                                          generate_trace, load_azure_trace, match_clipped_normal, usage_quantile)
from agents.oversubscription.settings import get_setting
from agents.oversubscription.sim import OversubSim

HAVE_DATA = (data.data_dir() / "azure-v2-2019-summary-distributions" / "cpu.txt").exists() and \
    (data.data_dir() / "azure-v1-100vm-cpu" / "microsoft_max_100.csv.gz").exists()
needs_data = pytest.mark.skipif(not HAVE_DATA, reason=f"Azure summary files not under {data.data_dir()}")


@pytest.fixture(scope="module")
def tiny():
    return generate_trace("tiny", 7)


@pytest.fixture(scope="module")
def azure():
    return generate_trace("azure", 0)


# ----------------------------------------------------------------------------- determinism

@needs_data
def test_same_seed_gives_identical_arrays(tiny):
    again = generate_trace("tiny", 7)
    for name in ("sub", "arrive", "depart", "cores", "mem", "net", "usage_mean", "usage_p95", "series", "offset"):
        np.testing.assert_array_equal(getattr(tiny, name), getattr(again, name), err_msg=name)
    np.testing.assert_array_equal(tiny.train_workload(warm=True).usage, again.train_workload(warm=True).usage)
    np.testing.assert_array_equal(tiny.test_workload(1, 5).usage, again.test_workload(1, 5).usage)
    np.testing.assert_array_equal(tiny.train_redrawn(3).usage, again.train_redrawn(3).usage)


@needs_data
def test_different_seeds_differ(tiny):
    other = generate_trace("tiny", 8)
    assert len(other.arrive) != len(tiny.arrive) or np.any(other.arrive != tiny.arrive)
    a, b = tiny.test_workload(0, 5), tiny.test_workload(0, 6)
    np.testing.assert_array_equal(a.arrive, b.arrive)            # same requests ...
    assert np.abs(a.usage - b.usage).max() > 0.1                 # ... usage redrawn


# ----------------------------------------------------------------------------- loader

START = 2 * 86400 + 5 * 3600          # day 2, 05:00


def _vmtable_rows():
    # vm id, subscription, deployment, created, deleted, max, avg, p95max, category, cores bucket, memory bucket
    s = START
    return [
        ["vm1", "A", "d1", s - 7200, s + 5400, 90, 20, 50, "Interactive", "2", "4"],
        ["vm2", "A", "d2", s + 3600, s + 3 * 3600 + 1, 95, 30, 80, "Unknown", ">24", ">64"],
        ["vm3", "B", "d3", s + 600, s + 1200, 40, 10, 20, "Delay-insensitive", "8", "32"],
        ["vm4", "A", "d4", s + 5 * 3600, s + 6 * 3600, 10, 5, 9, "Interactive", "4", "8"],   # after the window
        ["vm5", "B", "d5", s - 10000, s - 100, 10, 5, 9, "Interactive", "4", "8"],           # gone before it
        ["vm6", "C", "d6", s, s + 3600, 10, 5, 9, "Interactive", "4", "8"],                  # third subscription
    ]


def _readings_rows():
    s = START
    return [[s, "vm1", 1, 30, 10], [s + 300, "vm1", 2, 60, 20], [s + 3600, "vm1", 1, 10, 5],
            [s + 3600, "vm2", 5, 40, 20], [s + 7200, "vm2", 5, 20, 10], [s + 7500, "vm2", 5, 90, 50],
            [s - 300, "vm2", 5, 99, 50],                      # before the window: ignored
            [s + 600, "vm6", 1, 100, 50]]                     # not a chosen subscription


def _write(path, rows, header=None, gz=False):
    text = "".join(",".join(str(x) for x in r) + "\n" for r in ([header] if header else []) + rows)
    if gz:
        with gzip.open(path, "wt") as fh:
            fh.write(text)
    else:
        path.write_text(text)
    return path


LOADER_SETTING = get_setting("tiny").scaled(n_subscribers=2, episode_steps=4)


def test_loader_headerless_gzip_with_readings(tmp_path):
    vmt = _write(tmp_path / "vmtable.csv.gz", _vmtable_rows(), gz=True)
    rd = _write(tmp_path / "vm_cpu_readings-file-1-of-195.csv.gz", _readings_rows(), gz=True)
    w = load_azure_trace(vmt, [rd], setting=LOADER_SETTING, start_s=START)
    assert w.meta["subscriptions"] == ["A", "B"] and w.meta["vm_ids"] == ["vm1", "vm3", "vm2"]
    np.testing.assert_array_equal(w.sub, [0, 1, 0])
    np.testing.assert_array_equal(w.arrive, [-2, 0, 1])
    np.testing.assert_array_equal(w.depart, [2, 1, 4])
    np.testing.assert_array_equal(w.cores, [2, 8, 30])
    np.testing.assert_array_equal(w.mem, [4, 32, 70])
    np.testing.assert_allclose(w.net, w.cores * 0.5)
    assert w.start_hour == 5 and w.steps == 4
    np.testing.assert_allclose(w.usage, [[0.6, 0.1, 0.0, 0.0],     # max of the 5-min maxima per hour
                                         [0.2, 0.0, 0.0, 0.0],     # no readings: its p95 max cpu
                                         [0.0, 0.4, 0.9, 0.8]],    # a live hour without reading: p95
                               atol=1e-6)


def test_loader_plain_with_header_and_no_readings(tmp_path):
    vmt = _write(tmp_path / "vmtable.csv", _vmtable_rows(), header=list(data.VMTABLE_COLUMNS))
    w = load_azure_trace(vmt, setting=LOADER_SETTING, start_s=START, top_subscribers=["B", "A"])
    np.testing.assert_array_equal(w.sub, [1, 0, 1])   # B is subscriber 0 now
    np.testing.assert_allclose(w.usage, [[0.5, 0.5, 0.0, 0.0], [0.2, 0, 0, 0], [0.0, 0.8, 0.8, 0.8]], atol=1e-6)
    # a cold episode ignores the VM running before start_s; the simulator takes the rest
    sim = OversubSim(LOADER_SETTING, w)
    assert sim.reset().requested_live.sum() == 0


def test_loader_needs_enough_subscriptions(tmp_path):
    vmt = _write(tmp_path / "vmtable.csv", _vmtable_rows())
    with pytest.raises(ValueError, match="subscriptions"):
        load_azure_trace(vmt, setting=get_setting("tiny").scaled(n_subscribers=4), start_s=START)
    assert data.bucket_value(">24", "cores") == 30 and data.bucket_value(">64", "mem") == 70
    assert data.bucket_value("12", "cores") == 12


# ----------------------------------------------------------------------------- splits

@needs_data
def test_test_blocks_share_no_request_day_with_training(tiny, azure):
    for trace in (tiny, azure):
        T = trace.setting.episode_steps
        train = trace.train_workload()
        train_days = {(train.meta["start_abs_hour"] + t) // 24 for t in range(T)}
        assert trace.n_test_blocks >= 2
        for i in range(trace.n_test_blocks):
            w = trace.test_workload(i, seed=1)
            days = {(w.meta["start_abs_hour"] + t) // 24 for t in range(T)}
            assert not days & train_days
            req_days = set(((w.meta["start_abs_hour"] + w.arrive[w.arrive >= 0]) // 24).tolist())
            assert req_days and not req_days & train_days
            # weekdays of weeks 2.. only
            for d in days:
                rel = d - trace.lead_hours // 24
                assert rel >= 7 and rel % 7 < 5
        assert train.start_hour == 0 and (train.meta["start_abs_hour"] - trace.lead_hours) == 0
        # any episode number picks a block
        assert trace.test_start(trace.n_test_blocks + 1) == trace.test_start(1)
    assert block_starts(0, 3, 120) == [[0], [168], [336]]
    assert block_starts(0, 2, 48) == [[0, 48], [168, 216]]


# ----------------------------------------------------------------------------- redraws

@needs_data
def test_redrawn_usage_keeps_training_means_per_subscriber_hour(tiny):
    mean, std = tiny.usage_stats()
    n = tiny.setting.n_subscribers
    s1, s2, cnt = np.zeros((n, 24)), np.zeros((n, 24)), np.zeros((n, 24))
    for k in range(40):
        w = tiny.test_workload(k % tiny.n_test_blocks, seed=k, warm=True)
        t = np.arange(w.steps)
        live = (t[None, :] >= w.arrive[:, None]) & (t[None, :] < w.depart[:, None])
        key = (w.sub[:, None] * 24 + (w.start_hour + t[None, :]) % 24)[live]
        x = w.usage[live].astype(float)
        cnt += np.bincount(key, minlength=n * 24).reshape(n, 24)
        s1 += np.bincount(key, weights=x, minlength=n * 24).reshape(n, 24)
        s2 += np.bincount(key, weights=x * x, minlength=n * 24).reshape(n, 24)
    ok = cnt >= 500
    assert ok.sum() > 0.8 * n * 24
    got_mean = s1[ok] / cnt[ok]
    got_std = np.sqrt(s2[ok] / cnt[ok] - got_mean ** 2)
    assert np.abs(got_mean - mean[ok]).max() < 0.03
    assert np.abs(got_std - std[ok]).max() < 0.04
    # subscribers differ and so do their daily profiles
    assert mean.mean(1).max() - mean.mean(1).min() > 0.02
    assert len(set(np.argmax(mean, axis=1).tolist())) > 1


@needs_data
@pytest.mark.parametrize("warm", [False, True])
def test_resampled_week_is_made_of_training_deployments_moved_by_whole_days(tiny, warm):
    w = tiny.train_resampled(3, warm=warm)
    again = tiny.train_resampled(3, warm=warm)
    for name in ("sub", "arrive", "depart", "cores", "usage"):
        np.testing.assert_array_equal(getattr(w, name), getattr(again, name), err_msg=name)
    assert not np.array_equal(w.arrive, tiny.train_resampled(4, warm=warm).arrive)
    start, T = tiny.train_start(), tiny.setting.episode_steps
    train_rows = tiny.window_rows(start, warm)
    new = w.arrive >= 0
    # every VM that arrives in the episode arrives inside it, at an hour of day its original had:
    # whole-day moves keep each subscriber's diurnal profile
    assert (w.arrive[new] < T).all() and (w.depart > w.arrive).all()
    orig = tiny.arrive[train_rows] - start
    hours_by_sub = {(int(s), int(h)) for s, h in zip(tiny.sub[train_rows][orig >= 0], orig[orig >= 0] % 24)}
    assert {(int(s), int(h)) for s, h in zip(w.sub[new], w.arrive[new] % 24)} <= hours_by_sub
    # lifetimes are kept: the multiset of (cores, life) pairs comes from the training days
    lives = set(zip(tiny.cores[train_rows].tolist(), (tiny.depart - tiny.arrive)[train_rows].tolist()))
    assert set(zip(w.cores.tolist(), (w.depart - w.arrive).tolist())) <= lives
    # the pre-existing VMs of a warm start are kept as they are
    assert (w.arrive < 0).sum() == (orig < 0).sum()
    # the days are shuffled: some deployments moved
    fixed = tiny.train_resampled(3, warm=warm, shuffle_days=False)
    assert not np.array_equal(np.sort(w.arrive), np.sort(fixed.arrive))


@needs_data
def test_resampled_mix_moves_each_subscribers_share(azure):
    n = azure.setting.n_subscribers
    rows = azure.window_rows(azure.train_start(), False)
    ratios = []
    for seed in range(3):
        w = azure.train_resampled(seed, mix=(0.5, 2.0))
        again = azure.train_resampled(seed, mix=(0.5, 2.0))
        np.testing.assert_array_equal(w.arrive, again.arrive)
        ratios.append(np.bincount(w.sub, minlength=n) / np.maximum(1, np.bincount(azure.sub[rows], minlength=n)))
    r = np.concatenate(ratios)
    # per-subscriber volumes spread over the range instead of all staying near 1
    assert r.min() < 0.8 and r.max() > 1.3
    assert ((r > 0.35) & (r < 2.8)).all()


@needs_data
def test_resampled_copies_of_a_vm_get_their_own_usage(azure):
    w = azure.train_resampled(1)
    key = np.stack([w.sub, w.arrive, w.depart, w.cores], axis=1)
    _, first, counts = np.unique(key, axis=0, return_index=True, return_counts=True)
    # find two rows with the same request (a deployment drawn twice or one of identical VMs)
    dups = first[counts > 1]
    dup = dups[np.argmax(np.minimum(w.depart[dups], w.steps) - w.arrive[dups])]
    same = np.flatnonzero((key == key[dup]).all(axis=1))
    a, b = w.usage[same[0]], w.usage[same[1]]
    live = (a > 0) | (b > 0)
    assert live.sum() > 5 and not np.allclose(a[live], b[live])


def test_clipped_normal_matching_round_trips():
    m = np.array([0.02, 0.15, 0.5, 0.9, 0.3])
    s = np.array([0.05, 0.25, 0.3, 0.2, 0.45])
    mu, sigma = match_clipped_normal(m, s)
    got_m, got_s = clipped_normal_moments(mu, sigma)
    np.testing.assert_allclose(got_m, m, atol=1e-4)
    np.testing.assert_allclose(got_s, s, atol=1e-4)
    rng = np.random.default_rng(0)
    x = np.clip(mu[:, None] + sigma[:, None] * rng.standard_normal((5, 200_000)), 0, 1)
    np.testing.assert_allclose(x.mean(1), m, atol=0.005)


def test_usage_quantile_has_its_mean_and_p95():
    p = (np.arange(200_000) + 0.5) / 200_000
    p95, top = 0.48, 0.72
    mean = 0.046
    below = (mean - 0.05 * (p95 + top) / 2) / (0.95 * p95)
    q = usage_quantile(p, p95, top, 1.0 / below - 1.0)
    assert q.mean() == pytest.approx(mean, abs=1e-3)
    assert np.percentile(q, 95) == pytest.approx(p95, abs=1e-3)
    assert q.max() == pytest.approx(top, abs=1e-3) and q.min() >= 0


# ----------------------------------------------------------------------------- sizing and warm start

def _grid_one_peak(setting, workload):
    sim = OversubSim(setting, workload)
    sim.reset()
    peak, rejected = 0.0, 0
    while not sim.done:
        _, res = sim.step(np.ones(setting.n_subscribers))
        peak = max(peak, res.reserved_cores)     # all rates 1: reserved = live requested cores
        rejected += res.rejected
    return peak / (setting.n_pms * setting.pm_cores), rejected


@needs_data
def test_azure_grid_one_cold_peak_is_in_the_sizing_band(azure):
    s = azure.setting
    peaks = []
    for w in [azure.train_workload()] + [azure.test_workload(i, seed=0) for i in range(azure.n_test_blocks)]:
        peak, rejected = _grid_one_peak(s, w)
        assert rejected == 0
        peaks.append(peak)
    # documented band: blocks average target_peak (0.67); single blocks vary (sd ~0.05)
    assert 0.60 <= peaks[0] <= 0.75
    assert np.mean(peaks) == pytest.approx(azure.params.target_peak, abs=0.03)
    assert all(0.55 <= p <= 0.80 for p in peaks)


@needs_data
def test_warm_start_has_vms_running_at_step_zero(tiny):
    cold, warm = tiny.train_workload(), tiny.train_workload(warm=True)
    assert not np.any(cold.arrive < 0)
    pre = (warm.arrive < 0) & (warm.depart > 0)
    assert pre.sum() > 10 and warm.n_vms == cold.n_vms + pre.sum()
    assert np.all(warm.usage[pre, 0] >= 0) and warm.usage[pre, 0].max() > 0
    view = OversubSim(tiny.setting, warm, warm_start=True).reset()
    assert view.requested_live.sum() > 0
    assert OversubSim(tiny.setting, warm).reset().requested_live.sum() == 0
    assert tiny.test_workload(0, seed=2, warm=True).arrive.min() < 0


# ----------------------------------------------------------------------------- calibration

@needs_data
def test_generated_vms_follow_the_official_distributions(azure):
    r = calibration_report(azure)
    assert r["cores_gap"] < 0.03 and r["memory_gap"] < 0.03 and r["lifetime_gap"] < 0.03
    assert r["deployment_size_gap"] < 0.08
    assert r["target_mean_vs_cpu_avg"] < 0.12 and r["target_p95_vs_cpu_p95"] < 0.12
    assert r["life_mean_vs_cpu_avg_24h"] < 0.15 and r["life_p95_vs_cpu_p95_24h"] < 0.2
    # the internal setting is synthetic with lower usage
    internal = generate_trace("internal", 0)
    assert internal.usage_stats()[0].mean() < 0.7 * azure.usage_stats()[0].mean()


@needs_data
@pytest.mark.parametrize("usage", ["resampled", "resampled-mix", "generated"])
def test_training_on_each_episode_source_is_seeded(usage):
    from agents.oversubscription.c2marl import C2MarlConfig
    from agents.oversubscription.train import train

    cfg = C2MarlConfig(episodes=3, seed=2, updates_per_episode=2, dual_estimate="pm-max", dual_window=2)
    p1, l1 = train("tiny", cfg, trace_seed=7, train_usage=usage, progress=False)
    _, l2 = train("tiny", cfg, trace_seed=7, train_usage=usage, progress=False)
    assert [x.reward for x in l1] == [x.reward for x in l2] and [x.lam for x in l1] == [x.lam for x in l2]
    assert p1.training["train_usage"] == usage
    with pytest.raises(ValueError, match="train_usage"):
        train("tiny", cfg, trace_seed=7, train_usage="nope", progress=False)
