"""Second audit of the collectors, the snapshot assembly and the Analyze stage: snapshots that
do not fit their fleet, a zero step, and instance names that Graphite cannot tell apart (real
Graphite where the defect needs one)."""
from __future__ import annotations

import numpy as np
import pytest

from fixtures_graphite import last_boundary, publish_window, wait_for_points
from samm.analyze import FleetSpec, RawSnapshot, compute_metrics
from samm.analyze.features import compute_features, feature_set
from samm.analyze.snapshot import VM_RUNNING
from samm.execute.base import GroupStatus, Instance
from samm.monitor.assemble import assemble_snapshot
from samm.monitor.graphite_client import GraphiteSender, RenderClient
from samm.monitor.graphite_source import GraphiteSource
from sim_bridge.config import PAPER_VM_TYPES

PAPER = FleetSpec.from_vm_types(PAPER_VM_TYPES)  # S/M/L = 2/4/8 cores, 8/16/32 GB, max 10 each
SMALL = FleetSpec(("small",), np.array([2]), np.array([4.0]), np.array([10]), np.array([0]), np.array([0.1]))
QUEUE = dict(submitted_total=70, waiting=5, running=3, completed_total=60, waiting_submitted_this_minute=2)
QUEUE_BEFORE = dict(submitted_total=40, waiting=9, running=3, completed_total=30, waiting_submitted_this_minute=0)


def snap(types, cpu=0.5, ram=2.0, since=150.0) -> RawSnapshot:
    n = len(types)
    return RawSnapshot(
        vm_type=np.array(types), vm_state=np.full(n, VM_RUNNING), vm_cpu_busy=np.full(n, cpu),
        vm_ram_used_gb=np.full(n, ram), vm_running_for_s=np.full(n, 600.0),
        jobs_submitted_total=np.array(10.0), jobs_submitted_interval=np.array(2.0), jobs_waiting_now=np.array(1.0),
        jobs_waiting_interval=np.array(1.0), jobs_running=np.array(3.0), jobs_waiting_cores=np.array(2.0),
        jobs_running_cores=np.array(3.0), head_job_cores=np.array(1.0), since_action_s=np.array(since))


def test_a_snapshot_of_another_fleet_is_named_not_read_past_the_fleets_arrays():
    """The compiled kernel does not check indices: a `vm_type` beyond the fleet's types (a
    snapshot of a larger fleet, a config edited between runs) read whatever memory followed the
    fleet's arrays and returned made-up metrics."""
    with pytest.raises(ValueError, match=r"vm_type 4 but the fleet has 3 type\(s\)"):
        compute_metrics(snap([0, 4]), PAPER)
    names = feature_set("extended", PAPER)
    with pytest.raises(ValueError, match="vm_type 4"):
        compute_features(snap([0, 4, -1]), PAPER, names)
    # a snapshot that fits gives the values it always gave
    np.testing.assert_allclose(compute_metrics(snap([0, 2, -1]), PAPER),
                               [10 / 140, 0.5, 0.5, (0.25 + 2 / 32) / 2, 2 / 32 + 0.9 * (0.25 - 2 / 32),
                                0.1, 0.5], rtol=1e-6)


@pytest.mark.parametrize("fleet, says", [
    (FleetSpec(("a",), np.array([2]), np.array([4.0]), np.array([0]), np.array([0]), np.array([0.1])), "no capacity"),
    (FleetSpec(("a",), np.array([2]), np.array([0.0]), np.array([5]), np.array([0]), np.array([0.1])), "no RAM"),
])
def test_a_fleet_with_a_zero_capacity_gives_a_clear_error_not_a_zero_division(fleet, says):
    with pytest.raises(ValueError, match=says):
        compute_metrics(snap([0]), fleet)


@pytest.mark.parametrize("step", [0, -60.0, float("nan"), float("inf")])
def test_features_refuse_a_step_that_is_not_a_positive_duration(step):
    """steps_since_action divides by the step: 0 gave NaN (or 1.0 from inf) under a numpy warning."""
    with pytest.raises(ValueError, match="step_seconds must be positive and finite"):
        compute_features(snap([0]), PAPER, feature_set("extended", PAPER), step_seconds=step)


def test_one_vm_percentiles_are_its_own_values():
    m = compute_metrics(snap([1], cpu=0.3, ram=4.0), PAPER)
    assert m[2] == pytest.approx(0.3) and m[4] == pytest.approx(0.25)


@pytest.mark.graphite
def test_instances_whose_names_sanitise_alike_make_the_snapshot_partial(graphite, graphite_prefix):
    """Docker allows `web.1` and `web_1` side by side; both report to the one series `web_1`, so
    both counted as running with the same load, and the other instance's load was never seen."""
    E = last_boundary()
    sender = GraphiteSender(graphite.carbon_host, graphite.carbon_port)
    publish_window(sender, graphite_prefix, E, [("small", "web.1", 80.0, 1.0, E - 400)], QUEUE, QUEUE_BEFORE)
    wait_for_points(graphite.render_url, f"{graphite_prefix}.groups.small.instances.*.cpu_percent", E - 61, E - 1, 1, 2)
    wait_for_points(graphite.render_url, f"{graphite_prefix}.queue.*", E - 181, E - 1, 5)
    reading = GraphiteSource(RenderClient(graphite.render_url), graphite_prefix, ["small"], interval_s=60,
                             lateness_s=5, now=lambda: E + 6).read()
    assert reading.status == "ok", reading.reasons
    assert list(reading.instances) == [("small", "web_1")]

    clash = {"small": GroupStatus("small", 2, 0, 10, (Instance("small", "web.1", "running", launched_at=E - 400),
                                                      Instance("small", "web_1", "running", launched_at=E - 300)))}
    out = assemble_snapshot(reading, clash, SMALL, ["small"])
    assert out.status == "partial"
    assert any("web.1 and web_1 as web_1" in r and "share one Graphite series" in r for r in out.reasons), out.reasons

    # one instance under a name with a dot is found under its sanitised series, as before
    alone = {"small": GroupStatus("small", 1, 0, 10, (Instance("small", "web.1", "running", launched_at=E - 400),))}
    out = assemble_snapshot(reading, alone, SMALL, ["small"])
    assert out.status == "ok", out.reasons
    np.testing.assert_allclose(out.snapshot.vm_cpu_busy, [0.8])
