"""The emulated cloud end to end: the SAMM daemon (production code) scales moto's ASGs, the
reconciler turns instances into worker processes, workers run a short workload from the
durable queue and report to a real Graphite. Then the same harness with faults."""
import threading
import time

import numpy as np
import pytest
import requests

from samm.knowledge.store import KnowledgeStore
from samm.monitor.graphite_client import RenderClient
from samm.testbed.run import PAPER_GROUPS, TestbedOptions, run_testbed
from sim_bridge.workloads import Workload

pytestmark = [pytest.mark.graphite, pytest.mark.testbed]
BOUNDS = {g[0]: (g[4], g[5]) for g in PAPER_GROUPS}
COMPRESSION = 30.0
COOLDOWN_S = 120.0  # workload seconds


def small_workload(batches=3, per_batch=40, every_s=240.0, first_s=60.0) -> Workload:
    arrivals = np.repeat(first_s + every_s * np.arange(batches), per_batch).astype(float)
    n = len(arrivals)
    return Workload("e2e-small", arrivals, np.full(n, 360 * 4400.0), np.ones(n, dtype=np.int32), np.full(n, 0.5))


def options(tmp_path, **kw):
    base = dict(agent="threshold", params={"upper": 0.6, "lower": 0.3, "cooldown_steps": 0},
                workload_obj=small_workload(), compression=COMPRESSION, cooldown_s=COOLDOWN_S, seed=3,
                out_dir=str(tmp_path / "tb"), timeout_s=240)
    base.update(kw)
    return TestbedOptions(**base)


def check_invariants(res, interval_wall):
    s = res.summary
    # every job completed exactly once
    assert s["jobs_finished"] == s["jobs_total"] == 120, s
    # instance counts never left [min, max]
    for row in res.timeline:
        for g, (lo, hi) in BOUNDS.items():
            assert lo <= row[f"{g}_vms"] <= hi, row
    store = KnowledgeStore(res.knowledge_url)
    try:
        decisions = store.decisions()
        actions = store.actions()
    finally:
        store.close()
    keys = [int(d.iteration_key) for d in decisions]
    assert len(keys) == len(set(keys)), "one decision per interval"
    assert all((b - a) % round(interval_wall) == 0 or abs(((b - a) / interval_wall) - round((b - a) / interval_wall)) < 1e-6
               for a, b in zip(keys, keys[1:]))
    by_decision = {}
    for a in actions:
        by_decision.setdefault(a.decision_id, []).append(a)
    for d in decisions:
        mine = by_decision.get(d.id, [])
        assert len({a.group_name for a in mine}) == len(mine), "at most one action per group per decision"
        if d.source != "agent":
            assert not mine, "no action without an agent decision (stale snapshot or fallback)"
    # cool-downs honoured: succeeded actions of one group are at least the cool-down apart
    at = {d.id: int(d.iteration_key) for d in decisions}
    for g in BOUNDS:
        times = sorted(at[a.decision_id] for a in actions if a.group_name == g and a.status == "succeeded")
        gaps = [b - a for a, b in zip(times, times[1:])]
        assert all(gap >= COOLDOWN_S / COMPRESSION - 1e-6 for gap in gaps), (g, gaps)
    assert any(a.status == "succeeded" for a in actions), "the threshold agent should have scaled"
    return decisions, actions


def test_testbed_end_to_end(tmp_path):
    seen = {}

    def dashboards_series(tb):
        render = RenderClient(tb.graphite.render_url)
        for target in ("samm.queue.waiting", "samm.daemon.metrics.cpu_mean", "samm.daemon.groups.*.live",
                       "samm.daemon.decision.action", "samm.daemon.iteration_ms", "samm.groups.*.instances.*.cpu_percent",
                       "samm.daemon.actions.*.succeeded"):
            seen[target] = [x for x in render.render(target, "-1h", "now") if x.values()]
        seen["events"] = requests.get(f"{tb.graphite.render_url}/events/get_data",
                                      params={"tags": "scaling", "from": "-1h"}, timeout=5).json()

    res = run_testbed(options(tmp_path), before_close=dashboards_series)
    check_invariants(res, 60 / COMPRESSION)
    assert res.summary["jobs_requeued"] >= 0
    for target, series in seen.items():
        assert series, f"Graphite has no data for {target}"


@pytest.mark.slow
def test_testbed_faults(tmp_path):
    """Kill a worker mid-job, stop Graphite for two intervals, throttle the ASG API, kill -9
    the daemon and restart it: every job still finishes exactly once, nothing acts on stale
    data, nothing acts twice."""
    notes = {}

    def faults(tb):
        interval = tb.interval_wall
        # 1. a worker dies mid-job: its job is re-queued (lease expiry) and finishes elsewhere
        deadline = time.time() + 60
        while time.time() < deadline:
            busy = [vm for vm in list(tb.reconciler.vms.values()) if vm.proc is not None and vm.stopped_wall is None
                    and tb.queue.held(vm.instance_id)]
            if busy:
                notes["killed_worker"] = tb.reconciler.kill_worker(busy[0].instance_id)
                break
            time.sleep(0.1)
        # 2. Graphite down for two intervals
        stop_at = time.time()
        tb.graphite.stop()
        time.sleep(2 * interval + 0.5)
        tb.graphite.start()
        notes["graphite_down"] = (stop_at, time.time())
        # 3. kill -9 the daemon, restart it
        time.sleep(interval)
        tb.daemon_proc.kill()
        tb.daemon_proc.wait(10)
        notes["daemon_killed_at"] = time.time()
        tb.start_daemon_process()

    res = run_testbed(options(tmp_path, daemon_process=True, timeout_s=300), during=faults)
    assert not [f for f in res.faults if f.startswith("error")], res.faults
    decisions, actions = check_invariants(res, 60 / COMPRESSION)
    assert notes.get("killed_worker"), "no worker was busy to kill"
    assert res.summary["jobs_requeued"] >= 1
    down_from, down_to = notes["graphite_down"]
    stale = [d for d in decisions if d.source == "none"]
    assert any(down_from <= int(d.iteration_key) <= down_to + 2 for d in stale), "stale intervals were recorded"
    assert "daemon_killed_at" in notes
