"""PM usage that reaches Graphite late or after a stalled collector still lands in the live
run's record: the collector fills the seconds a stall spans, and the executor reads again, at
the end of the run, the steps it had given up on. Real Graphite, real Knowledge store (SQLite).

A CI run once recorded 21 of 24 PM-steps in tests/test_oversub_live.py's second replay (one
whole step without a point) on a loaded host; these tests pin down both defences."""
from __future__ import annotations

import math
import threading
import time

import numpy as np
import pytest

from agents.oversubscription.settings import SETTINGS
from agents.oversubscription.workload import Workload
from samm.knowledge.store import KnowledgeStore
from samm.monitor.graphite_client import GraphiteSender, RenderClient
from samm.testbed.oversub.admission import AdmissionExecutor, LiveParams, StepRecord
from samm.testbed.oversub.cgroups import PmCgroups
from samm.testbed.oversub.collector import MAX_FILL_S, PmCollector, pm_metric, slots_measured

pytestmark = pytest.mark.graphite

PMS = 3
SETTING = SETTINGS["tiny"].scaled(n_pms=PMS)
S = 2  # seconds per step


def test_a_sample_stands_for_every_second_since_the_previous_one():
    assert list(slots_measured(None, 100)) == [100]
    assert list(slots_measured(99, 100)) == [100]
    assert list(slots_measured(97, 100)) == [98, 99, 100]  # woke two seconds late
    assert list(slots_measured(100, 100)) == [100]  # two samples in one second: the later one wins
    assert len(slots_measured(0, 10_000)) == MAX_FILL_S  # a suspended host: no flood of points


def test_a_stalled_collector_leaves_no_second_empty(graphite, graphite_prefix):
    """The read stalls 2.5 s once: the sample after it spans three seconds, each gets a point."""
    calls = {"n": 0}
    t_start = time.time()

    def read_ns():
        calls["n"] += 1
        if calls["n"] == 3:
            time.sleep(2.5)
        return [int((time.time() - t_start) * 1e9 * 0.5)]  # half a host core, steadily

    sender = GraphiteSender(graphite.carbon_host, graphite.carbon_port)
    col = PmCollector(read_ns, sender, "stall", host_cores_per_pm_core=0.5, prefix=graphite_prefix).start()
    time.sleep(7.5)
    col.stop()
    assert col.filled >= 2 and col.errors == 0
    first, last = math.floor(t_start) + 1, math.floor(time.time()) - 2
    render = RenderClient(graphite.render_url)
    target = pm_metric(graphite_prefix, "stall", 0)
    values: dict[int, float] = {}
    for _ in range(50):
        series = render.render(target, first - 1, last)
        values = {ts: v for sr in series for v, ts in sr.values() if v is not None and first <= ts <= last}
        if len(values) == last - first + 1:
            break
        time.sleep(0.2)
    assert sorted(values) == list(range(first, last + 1))
    assert all(v == pytest.approx(1.0, abs=0.15) for v in values.values()), values


def one_vm_workload() -> Workload:
    return Workload(n_subscribers=SETTING.n_subscribers, steps=2, sub=[0], arrive=[0], depart=[2], cores=[4.0],
                    mem=[16.0], net=[1.0], usage=np.full((1, 2), 0.5), name="late")


@pytest.fixture
def executor(graphite, graphite_prefix, tmp_path):
    store = KnowledgeStore(f"sqlite:///{tmp_path / 'k.db'}")
    ex = AdmissionExecutor(SETTING, one_vm_workload(), agent="late", service_url="http://127.0.0.1:9", store=store,
                           run="late", cgroups=PmCgroups(PMS, quota_host_cores=1.0),
                           sender=GraphiteSender(graphite.carbon_host, graphite.carbon_port),
                           render=RenderClient(graphite.render_url, timeout_s=2.0),
                           params=LiveParams(seconds_per_step=S, prefix=graphite_prefix, post_events=False))
    yield ex
    store.close()


def send_step(ex: AdmissionExecutor, start: int, cores_per_pm: dict[int, float]) -> None:
    for pm, cores in cores_per_pm.items():
        for ts in range(start, start + S):
            ex.sender.send(pm_metric(ex.p.prefix, ex.run_name, pm), cores, ts)
    ex.sender.flush()


def test_steps_given_up_on_are_read_again_and_hot_events_recorded_once(executor):
    ex = executor
    start = int(time.time()) - 60
    hot_cores = SETTING.beta * SETTING.pm_cores + 5
    rec = StepRecord(step=0, hour=0, start=float(start), pm_reserved=[0.0] * PMS, pm_sim=[0.0] * PMS)
    ex.records.append(rec)
    send_step(ex, start, {0: 10.0, 1: hot_cores})  # PM 2's points are late
    # give up on the step as the run's deadline would: PMs 0-1 whole, PM 2 missing
    for _ in range(75):
        ex._read_step(rec, give_up=True)
        if rec.pm_points[:2] == [S, S]:
            break
        time.sleep(0.2)
    assert rec.graphite_status == "partial" and rec.pm_points[:2] == [S, S] and rec.pm_points[2] == 0
    assert rec.pm_hot == [False, True, False] and ex.hot_events == 1

    # PM 2's points arrive late, hot too: the end-of-run read completes the step
    threading.Timer(1.0, send_step, args=(ex, start, {2: hot_cores})).start()
    assert ex.reread_incomplete(for_s=15.0) == 1
    assert rec.graphite_status == "ok" and rec.pm_points == [S, S, S] and ex.late_reads == 1
    assert rec.pm_used == pytest.approx([10.0, hot_cores, hot_cores])
    assert rec.pm_hot == [False, True, True] and ex.hot_events == 2
    keys = sorted(d.iteration_key for d in ex.store.decisions(loop=ex.loop) if d.action_name == "hot-event")
    assert keys == ["step0:hot:pm1", "step0:hot:pm2"]
    # nothing left to read: a second pass changes nothing and records nothing
    assert ex.reread_incomplete(for_s=1.0) == 0 and ex.hot_events == 2


def test_a_step_whose_points_never_come_stays_marked_missing(executor, caplog):
    ex = executor
    start = int(time.time()) - 120
    rec = StepRecord(step=3, hour=3, start=float(start), pm_reserved=[0.0] * PMS, pm_sim=[0.0] * PMS)
    ex.records.append(rec)
    assert ex._read_step(rec, give_up=True) and rec.graphite_status == "stale"
    t = time.time()
    assert ex.reread_incomplete(for_s=1.0) == 0
    assert time.time() - t < 8  # bounded by for_s (plus the final read)
    assert rec.graphite_status == "stale" and all(math.isnan(v) for v in rec.pm_used)
    assert "step 3: Graphite has [0, 0, 0] of 2 points per PM" in caplog.text
