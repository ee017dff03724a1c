"""The seven derived metrics on hand-computed cases (no simulator needed)."""
import numpy as np
import pytest

from samm.analyze import OBSERVATION_NAMES, FleetSpec, RawSnapshot, compute_metrics
from sim_bridge.config import PAPER_VM_TYPES

FLEET = FleetSpec.from_vm_types(PAPER_VM_TYPES)  # S/M/L = 2/4/8 cores, 8/16/32 GB, max 10 each: 140 cores


def snap(types, states, cpu, ram, running_for=None, submitted=0, submitted_int=0, waiting=0, waiting_int=0):
    n = len(types)
    running_for = running_for if running_for is not None else [600.0 if s == 1 else -1.0 for s in states]
    return RawSnapshot(
        vm_type=np.array(types), vm_state=np.array(states), vm_cpu_busy=np.array(cpu, dtype=float),
        vm_ram_used_gb=np.array(ram, dtype=float), vm_running_for_s=np.array(running_for, dtype=float),
        jobs_submitted_total=np.array(float(submitted)), jobs_submitted_interval=np.array(float(submitted_int)),
        jobs_waiting_now=np.array(float(waiting)), jobs_waiting_interval=np.array(float(waiting_int)),
        jobs_running=np.array(0.0),
    ) if n else None


def test_names_are_the_papers_seven_in_order():
    assert OBSERVATION_NAMES == ("allocated_cores_ratio", "cpu_mean", "cpu_p90", "ram_mean", "ram_p90",
                                 "waiting_ratio_total", "waiting_ratio_interval")


def test_hand_computed_case():
    # S running (cpu .5, 2 GB of 8), M running (cpu 1.0, 4 GB of 16), L running (cpu .2, 16 GB of 32),
    # M booting, one empty slot.
    s = snap(types=[0, 1, 2, 1, -1], states=[1, 1, 1, 0, 0], cpu=[0.5, 1.0, 0.2, 0.0, 0.0],
             ram=[2.0, 4.0, 16.0, 0.0, 0.0], submitted=100, submitted_int=20, waiting=30, waiting_int=5)
    m = compute_metrics(s, FLEET)
    assert m.dtype == np.float32 and m.shape == (7,)
    # allocated: 2 + 4 + 8 + 4 (booting counts) = 18 of 140
    assert m[0] == pytest.approx(18 / 140)
    assert m[1] == pytest.approx((0.5 + 1.0 + 0.2) / 3)
    # p90 of [0.2, 0.5, 1.0], linear: position 0.9 * 2 = 1.8 -> 0.5 + 0.8 * 0.5 = 0.9
    assert m[2] == pytest.approx(0.9)
    # RAM fractions [0.25, 0.25, 0.5]: mean 1/3; p90 position 1.8 -> 0.25 + 0.8 * 0.25 = 0.45
    assert m[3] == pytest.approx(1 / 3)
    assert m[4] == pytest.approx(0.45)
    assert m[5] == pytest.approx(0.3)
    assert m[6] == pytest.approx(0.25)


def masked_percentile(values, mask, q=90.0):
    """cpu_p90 of one snapshot row per row of `values`: the masked-in entries are running VMs'
    CPU, the rest booting VMs (which the metric leaves out)."""
    assert q == 90.0
    e, v = values.shape
    z = np.zeros(e)
    batch = RawSnapshot(np.zeros((e, v), dtype=np.int64), mask.astype(np.int64), values, np.zeros((e, v)),
                        np.full((e, v), 600.0), z, z, z, z, z)
    return compute_metrics(batch, FLEET)[:, 2].astype(np.float64)


def test_p90_is_a_real_percentile_not_a_minimum():
    values = np.array([[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]])
    mask = np.ones_like(values, dtype=bool)
    got = masked_percentile(values, mask, 90.0)
    assert got[0] == pytest.approx(np.percentile(values[0], 90))  # 0.91
    assert got[0] > 0.9


def test_masked_percentile_matches_numpy_row_by_row():
    rng = np.random.default_rng(3)
    values = rng.random((50, 12))
    mask = rng.random((50, 12)) < 0.6
    got = masked_percentile(values, mask, 90.0)
    for row in range(50):
        expect = np.percentile(values[row][mask[row]], 90) if mask[row].any() else 0.0
        assert got[row] == pytest.approx(expect)


def test_no_running_vm_and_no_jobs_gives_zeros_not_nan():
    s = snap(types=[0, -1], states=[0, 0], cpu=[0, 0], ram=[0, 0])
    m = compute_metrics(s, FLEET)
    assert np.all(np.isfinite(m))
    assert m[0] == pytest.approx(2 / 140)
    assert np.all(m[1:] == 0.0)


def test_interval_ratio_uses_the_interval_cohort():
    # 10 waiting overall but none of this interval's 4 arrivals is still waiting: 0, not 10/4.
    s = snap(types=[0], states=[1], cpu=[1.0], ram=[1.0], submitted=50, submitted_int=4, waiting=10, waiting_int=0)
    m = compute_metrics(s, FLEET)
    assert m[6] == 0.0 and m[5] == pytest.approx(0.2)


def test_warming_vms_are_left_out_of_cpu_and_ram_but_count_as_allocated():
    s = snap(types=[0, 0], states=[1, 1], cpu=[1.0, 0.0], ram=[8.0, 0.0], running_for=[600.0, 30.0])
    m = compute_metrics(s, FLEET, warmup_s=120.0)
    assert m[0] == pytest.approx(4 / 140)
    assert m[1] == pytest.approx(1.0) and m[3] == pytest.approx(1.0)


def test_nan_and_absurd_values_stay_inside_bounds():
    s = snap(types=[0, 1], states=[1, 1], cpu=[np.nan, 7.0], ram=[np.inf, -3.0], submitted=5, waiting=9)
    m = compute_metrics(s, FLEET)
    assert np.all(np.isfinite(m)) and np.all((m >= 0) & (m <= 1))


def test_vectorised_over_a_batch_equals_one_by_one():
    rng = np.random.default_rng(0)
    e, v = 6, 30
    types = rng.integers(-1, 3, size=(e, v))
    states = rng.integers(0, 2, size=(e, v))
    batch = RawSnapshot(types, states, rng.random((e, v)), rng.random((e, v)) * 8, rng.random((e, v)) * 600,
                        rng.integers(1, 100, e).astype(float), rng.integers(0, 10, e).astype(float),
                        rng.integers(0, 50, e).astype(float), rng.integers(0, 5, e).astype(float),
                        rng.integers(0, 50, e).astype(float))
    together = compute_metrics(batch, FLEET)
    for i in range(e):
        one = batch.select(i)
        np.testing.assert_allclose(compute_metrics(one, FLEET), together[i], rtol=1e-6)


def _by_definition(types, states, cpu, ram, age, waiting, submitted, waiting_int, submitted_int, warmup_s):
    """The module docstring's definitions for one snapshot, written plainly (the test oracle)."""
    present = types >= 0
    measured = present & (states == 1) & (age >= warmup_s)
    idx = np.maximum(types, 0)
    # a NaN sample is missing: left out; every measured VM's missing: the metric is NaN
    c, r = cpu[measured], ram[measured] / FLEET.ram_gb[idx[measured]]
    c, r = np.clip(c[~np.isnan(c)], 0, 1), np.clip(r[~np.isnan(r)], 0, 1)

    def stats(v):
        if not len(v):
            return (np.nan, np.nan) if measured.any() else (0.0, 0.0)
        return v.mean(), np.percentile(v, 90)

    def ratio(num, den):  # a missing count: unknown (NaN), not an empty queue
        return np.nan if np.isnan(num) or np.isnan(den) else (num / den if den > 0 else 0.0)

    out = np.array([FLEET.cores[idx[present]].sum() / 140, *stats(c), *stats(r),
                    ratio(waiting, submitted), ratio(waiting_int, submitted_int)], dtype=float)
    counters = [0, 5, 6]
    out[counters] = np.clip(out[counters], 0, 1)
    return out


def test_compiled_metrics_match_the_definitions_on_random_batches_with_bad_values():
    rng = np.random.default_rng(11)
    for trial in range(40):
        e, v = int(rng.integers(1, 9)), int(rng.integers(1, 40))
        types, states = rng.integers(-1, 3, size=(e, v)), rng.integers(0, 2, size=(e, v))
        cpu, ram = rng.random((e, v)) * 1.4 - 0.2, rng.random((e, v)) * 40
        cpu[rng.random((e, v)) < 0.1], ram[rng.random((e, v)) < 0.1] = np.nan, np.inf
        age = rng.random((e, v)) * 600 - 100
        q = [rng.integers(0, 60, e).astype(float) for _ in range(5)]
        q[1][0], q[3][-1] = 0.0, np.nan  # nothing submitted; an unknown interval count
        batch = RawSnapshot(types, states, cpu, ram, age, q[1], q[3], q[0], q[2], q[4])
        got = compute_metrics(batch, FLEET, warmup_s=120.0)
        for i in range(e):
            want = _by_definition(types[i], states[i], cpu[i], ram[i], age[i], q[0][i], q[1][i], q[2][i], q[3][i], 120.0)
            np.testing.assert_allclose(got[i], want, rtol=1e-6, atol=1e-7)


def test_strided_views_and_a_scalar_batch_give_the_same_metrics():
    rng = np.random.default_rng(5)
    wide = rng.random((4, 30, 5))  # like the bridge's records: per-VM fields interleaved
    types = rng.integers(-1, 3, size=(4, 30))
    snap_views = RawSnapshot(types, np.ones((4, 30), dtype=np.int64), wide[:, :, 2], wide[:, :, 3] * 8,
                             wide[:, :, 4] * 600, *(np.full(4, 10.0) for _ in range(5)))
    copies = RawSnapshot(*(np.ascontiguousarray(getattr(snap_views, f)) for f in snap_views.__dataclass_fields__
                           if getattr(snap_views, f) is not None))
    np.testing.assert_array_equal(compute_metrics(snap_views, FLEET), compute_metrics(copies, FLEET))
    one = snap_views.select(2)
    assert compute_metrics(one, FLEET).shape == (7,)
    np.testing.assert_array_equal(compute_metrics(one, FLEET), compute_metrics(snap_views, FLEET)[2])
