"""The two-path identity: a raw state recorded from the simulator, published into a real
Graphite as the collectors and the queue would, read back by the live Monitor path
(GraphiteSource + build_raw_snapshot), gives the analyzer exactly the same features."""
from __future__ import annotations


import dataclasses

import numpy as np
import pytest

from fixtures_graphite import last_boundary, publish_window, wait_for_points
from samm.analyze.features import compute_features, known_features
from samm.analyze.snapshot import VM_RUNNING, RawSnapshot
from samm.execute.base import GroupStatus, Instance
from samm.monitor.assemble import assemble_snapshot
from samm.monitor.graphite_client import GraphiteSender, RenderClient
from samm.monitor.graphite_source import GraphiteSource
from sim_bridge.batch import SimBatch
from sim_bridge.config import SimConfig
from sim_bridge.workloads import seed_1551

pytestmark = [pytest.mark.jvm, pytest.mark.graphite]


def _row(raw: RawSnapshot) -> RawSnapshot:
    return raw.select(0)


@pytest.fixture(scope="module")
def recorded():
    """Steps 29..31 of seed-1551 with one VM of every type added at steps 29 and 30: the first
    batch of 100 jobs arrives, VMs are booting and running, CPUs are busy."""
    cfg = SimConfig(action_mode="per-type")
    batch = SimBatch(cfg, seed_1551(), 1)
    try:
        batch.reset([0], [3])
        rows = []
        for k in range(32):
            s = batch.step(np.ones((1, 3), dtype=int) if k in (29, 30) else np.zeros((1, 3), dtype=int))
            if k >= 29:
                rows.append(_row(s.raw))
        return batch.fleet, rows
    finally:
        batch.close()


def _publish_and_read(graphite, prefix, fleet, before: RawSnapshot, snap: RawSnapshot, E: int):
    names = fleet.names
    inventory = {g: [] for g in names}
    instances = []
    for slot in np.flatnonzero(snap.vm_type >= 0):
        group, iid = names[snap.vm_type[slot]], f"vm{slot}"
        running = snap.vm_state[slot] == VM_RUNNING
        inventory[group].append(Instance(group, iid, "running" if running else "pending"))
        if running:  # a booting VM's collector is not up yet: it sends nothing
            instances.append((group, iid, float(snap.vm_cpu_busy[slot]) * 100.0, float(snap.vm_ram_used_gb[slot]),
                              E - float(snap.vm_running_for_s[slot])))

    def queue(s):
        return dict(submitted_total=float(s.jobs_submitted_total), waiting=float(s.jobs_waiting_now),
                    running=float(s.jobs_running), completed_total=0.0,
                    waiting_submitted_this_minute=float(s.jobs_waiting_interval),
                    waiting_cores=float(s.jobs_waiting_cores), running_cores=float(s.jobs_running_cores),
                    head_job_cores=float(s.head_job_cores))

    sender = GraphiteSender(graphite.carbon_host, graphite.carbon_port)
    n = publish_window(sender, prefix, E, instances, queue(snap), queue(before))
    assert sender.dropped == 0
    wait_for_points(graphite.render_url, [f"{prefix}.groups.*.instances.*.*", f"{prefix}.queue.*"], E - 181, E - 1, n)
    src = GraphiteSource(RenderClient(graphite.render_url), prefix, names, interval_s=60, lateness_s=5,
                         now=lambda: E + 6, first_seen_lookback_s=3600)
    reading = src.read()
    inv = {g: GroupStatus(g, len(v), 0, 10, tuple(v)) for g, v in inventory.items()}
    return assemble_snapshot(reading, inv, fleet, names)


@pytest.mark.parametrize("step", [1, 2])
def test_simulated_state_through_real_graphite_gives_identical_features(graphite, graphite_prefix, recorded, step):
    fleet, rows = recorded
    before, sim = rows[step - 1], rows[step]
    E = last_boundary()
    live = _publish_and_read(graphite, graphite_prefix, fleet, before, sim, E)
    assert live.status == "ok", live.reasons
    snap = live.snapshot

    # the same fleet, slot order aside; ages to the second (heartbeats are whole seconds)
    present = sim.vm_type >= 0
    assert int(present.sum()) == len(live.slots)
    sim_rows = sorted(zip(sim.vm_type[present], sim.vm_state[present], sim.vm_cpu_busy[present],
                          sim.vm_ram_used_gb[present], np.floor(sim.vm_running_for_s[present])))
    live_rows = sorted(zip(snap.vm_type, snap.vm_state, snap.vm_cpu_busy, snap.vm_ram_used_gb, snap.vm_running_for_s))
    np.testing.assert_allclose(np.array(live_rows, dtype=float), np.array(sim_rows, dtype=float), rtol=1e-12, atol=0)
    for f in ("jobs_submitted_total", "jobs_submitted_interval", "jobs_waiting_now", "jobs_waiting_interval", "jobs_running",
              "jobs_waiting_cores", "jobs_running_cores", "head_job_cores"):
        assert float(getattr(snap, f)) == float(getattr(sim, f)), f
    # non-trivial states: jobs waiting, VMs both inside and past the warm-up, booting VMs at step 1
    assert float(sim.jobs_waiting_now) > 0 and (sim.vm_running_for_s[present] > 120).any()
    assert (sim.vm_running_for_s[present] < 60).any() and (step != 1 or (sim.vm_state[present] != VM_RUNNING).any())

    names = known_features(fleet)
    # the seconds since the last action come from the knowledge store on the live path (the
    # loop adds them), from the simulator here: give the live snapshot the simulator's
    snap = dataclasses.replace(snap, since_action_s=sim.since_action_s)
    for warmup in (0.0, 60.0, 120.0):
        np.testing.assert_allclose(compute_features(snap, fleet, names, warmup_s=warmup),
                                   compute_features(sim, fleet, names, warmup_s=warmup), rtol=1e-6, atol=0)
