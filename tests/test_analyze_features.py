"""The `paper` and `extended` feature sets on hand-made snapshots (no simulator), and the
simulator's raw counters behind them on a tiny workload computed by hand."""
import numpy as np
import pytest

from samm.analyze import OBSERVATION_NAMES, FleetSpec, RawSnapshot
from samm.analyze.features import SINCE_CAP, WAITING_CAP, compute_features, feature_bounds, feature_set
from sim_bridge.config import PAPER_VM_TYPES

FLEET = FleetSpec.from_vm_types(PAPER_VM_TYPES)  # S/M/L = 2/4/8 cores, max 10 each: 140 cores


def snap(**queue):
    # S running, M running, L booting, S booting, one empty slot
    base = dict(
        vm_type=np.array([0, 1, 2, 0, -1]), vm_state=np.array([1, 1, 0, 0, 0]),
        vm_cpu_busy=np.array([1.0, 0.25, 0.0, 0.0, 0.0]), vm_ram_used_gb=np.array([1.0, 0.5, 0.0, 0.0, 0.0]),
        vm_running_for_s=np.array([600.0, 600.0, -1.0, -1.0, 0.0]),
        jobs_submitted_total=np.array(10.0), jobs_submitted_interval=np.array(2.0),
        jobs_waiting_now=np.array(4.0), jobs_waiting_interval=np.array(1.0), jobs_running=np.array(3.0),
        jobs_waiting_cores=np.array(14.0), jobs_running_cores=np.array(3.0), head_job_cores=np.array(8.0),
        since_action_s=np.array(150.0))
    base.update({k: (None if v is None else np.array(float(v))) for k, v in queue.items()})
    return RawSnapshot(**base)


def extended(s, **kw):
    names = feature_set("extended", FLEET)
    return dict(zip(names, compute_features(s, FLEET, names, **kw).tolist()))


def test_paper_set_is_the_seven_metrics():
    assert feature_set("paper", FLEET) == OBSERVATION_NAMES
    with pytest.raises(ValueError, match="unknown feature set"):
        feature_set("fancy", FLEET)


def test_extended_features_by_hand():
    f = extended(snap())
    assert len(f) == 7 + 4 + 6 + 1
    assert f["waiting_cores_ratio"] == pytest.approx(14 / 140)
    assert f["running_cores_ratio"] == pytest.approx(3 / 140)
    assert f["head_job_cores_ratio"] == pytest.approx(8 / 8)
    # idle cores: S 2 x (1 - 1.0) = 0, M 4 x (1 - 0.25) = 3; booting VMs have none
    assert f["largest_free_slot_ratio"] == pytest.approx(3 / 8)
    assert f["vm_running_frac:S"] == pytest.approx(1 / 10)
    assert f["vm_running_frac:M"] == pytest.approx(1 / 10)
    assert f["vm_running_frac:L"] == 0.0
    assert f["vm_booting_frac:S"] == pytest.approx(1 / 10)
    assert f["vm_booting_frac:L"] == pytest.approx(1 / 10)
    assert f["vm_booting_frac:M"] == 0.0
    # 150 s at 60 s per step: two whole intervals since the last applied action
    assert f["steps_since_action"] == pytest.approx(2 / SINCE_CAP)
    # the seven come first, unchanged: 2 + 4 + 8 + 2 allocated cores of 140
    assert f["allocated_cores_ratio"] == pytest.approx(16 / 140)


def test_caps_and_no_action_yet():
    f = extended(snap(jobs_waiting_cores=140 * 25, since_action_s=-1, head_job_cores=0))
    assert f["waiting_cores_ratio"] == WAITING_CAP
    assert f["steps_since_action"] == 1.0
    assert f["head_job_cores_ratio"] == 0.0
    assert extended(snap(since_action_s=60 * 1000))["steps_since_action"] == 1.0
    assert extended(snap(since_action_s=120), step_seconds=30.0)["steps_since_action"] == pytest.approx(4 / SINCE_CAP)


def test_unknown_counters_are_nan_not_guesses():
    f = extended(snap(jobs_waiting_cores=None, head_job_cores=None))
    assert np.isnan(f["waiting_cores_ratio"]) and np.isnan(f["head_job_cores_ratio"])
    assert f["running_cores_ratio"] == pytest.approx(3 / 140)


def test_bounds_cover_the_values():
    names = feature_set("extended", FLEET)
    values = compute_features(snap(), FLEET, names)
    for n, v in zip(names, values):
        lo, hi = feature_bounds(n)
        assert lo <= v <= hi, n
    assert feature_bounds("waiting_cores_ratio") == (0.0, WAITING_CAP)


def test_batched_equals_row_by_row():
    rows = [snap(), snap(jobs_waiting_cores=0, head_job_cores=0, since_action_s=-1)]
    batch = RawSnapshot(**{f: np.stack([getattr(r, f) for r in rows]) for f in RawSnapshot.__dataclass_fields__})
    names = feature_set("extended", FLEET)
    together = compute_features(batch, FLEET, names)
    for i, r in enumerate(rows):
        np.testing.assert_allclose(together[i], compute_features(batch.select(i), FLEET, names))
        np.testing.assert_allclose(together[i], compute_features(r, FLEET, names))


@pytest.mark.jvm
def test_simulator_counters_on_a_hand_made_workload():
    """One 4-core job at t=0 and a 1-core job at 30 s on a fleet of one S VM (2 cores): the wide
    head blocks the queue (strict FIFO), so both wait; adding an M VM lets both start."""
    from sim_bridge.batch import H_MAX_FREE_CORES, SimBatch
    from sim_bridge.config import SimConfig
    from sim_bridge.workloads import Workload

    cfg = SimConfig(action_mode="per-type", boot_delay_min_s=45, boot_delay_max_s=45).with_initial([1, 0, 0])
    w = Workload("tiny", np.array([0.0, 30.0]), np.array([4400.0 * 600, 4400.0 * 600]), np.array([4, 1], np.int32),
                 np.array([1.0, 0.5]))
    batch = SimBatch(cfg, w, 1)
    try:
        batch.reset([0], [1])
        s = batch.step(np.zeros((1, 3), int))
        r = s.raw
        assert (float(r.jobs_waiting_cores[0]), float(r.head_job_cores[0]), float(s.header[0, H_MAX_FREE_CORES])) == (5, 4, 2)
        assert float(r.since_action_s[0]) == -1.0
        s = batch.step(np.array([[0, 1, 0]]))  # add an M at t=60; it boots in 45 s
        s = batch.step(np.zeros((1, 3), int))  # t=180: both jobs run, on the M (4) and the S (1)
        r = s.raw
        assert (float(r.jobs_waiting_cores[0]), float(r.jobs_running_cores[0]), float(r.head_job_cores[0])) == (0, 5, 0)
        assert float(s.header[0, H_MAX_FREE_CORES]) == 1.0
        assert float(r.since_action_s[0]) == 120.0
    finally:
        batch.close()
