"""The emulated cloud end to end: the SAMM daemon (production code) scales moto's ASGs, the
reconciler turns instances into worker processes, workers run a short workload from the
durable queue and report to a real Graphite. Then the same harness with faults."""
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


def check_invariants(res, interval_wall, n_jobs=120):
    s = res.summary
    # every job completed exactly once
    assert s["jobs_finished"] == s["jobs_total"] == n_jobs, s
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

    # two batches of 20 (was three of 40): 20 one-core jobs still overload the initial 14 cores, so
    # the agent scales and every dashboard series gets its points
    res = run_testbed(options(tmp_path, workload_obj=small_workload(batches=2, per_batch=20)),
                      before_close=dashboards_series)
    check_invariants(res, 60 / COMPRESSION, n_jobs=40)
    assert res.summary["jobs_requeued"] >= 0
    for target, series in seen.items():
        assert series, f"Graphite has no data for {target}"


def test_testbed_faults(tmp_path):
    """Throttle the ASG API, kill a worker mid-job, stop Graphite for two intervals, kill -9
    the daemon and restart it: every job still finishes exactly once, nothing acts on stale
    data, nothing acts twice, nothing recorded is lost."""
    notes = {}

    def store_rows(tb):
        store = KnowledgeStore(tb.knowledge_url)
        try:
            return ({(d.id, d.iteration_key) for d in store.decisions()},
                    {(a.id, a.idempotency_key) for a in store.actions()})
        finally:
            store.close()

    def wait_decisions(tb, n, since, timeout=60.0):
        """Until the daemon has recorded `n` decisions for windows ending after `since`: a
        loaded machine starts `samm run` (torch, the policy) in seconds, and a fault injected
        before the daemon runs would test nothing."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if sum(1 for _, key in store_rows(tb)[0] if int(key) > since) >= n:
                return
            time.sleep(0.2)
        raise TimeoutError(f"the daemon recorded fewer than {n} decisions after {since:.0f} in {timeout:.0f} s")

    def faults(tb):
        interval = tb.interval_wall
        # 1. the ASG API throttles: the daemon's first scaling calls meet `Throttling` twice each
        #    (through the proxy: the daemon is another process) and botocore retries them
        tb.aws_proxy.fail_next("SetDesiredCapacity", 2)
        tb.aws_proxy.fail_next("TerminateInstanceInAutoScalingGroup", 2)
        # 2. a worker dies mid-job: its job is re-queued (lease expiry) and finishes elsewhere
        deadline = time.time() + 60
        while time.time() < deadline:
            busy = [vm for vm in list(tb.reconciler.vms.values()) if vm.proc is not None and vm.stopped_wall is None
                    and tb.queue.held(vm.instance_id)]
            if busy:
                notes["killed_worker"] = tb.reconciler.kill_worker(busy[0].instance_id)
                break
            time.sleep(0.1)
        # 3. Graphite down for two intervals (restarted from this short-lived thread)
        wait_decisions(tb, 2, time.time() - interval)
        stop_at = time.time()
        tb.graphite.stop()
        time.sleep(2 * interval + 0.5)
        tb.graphite.start()
        notes["graphite_down"] = (stop_at, time.time())
        # 4. kill -9 the daemon, restart it
        wait_decisions(tb, 2, notes["graphite_down"][1])
        tb.daemon_proc.kill()
        tb.daemon_proc.wait(10)
        notes["daemon_killed_at"] = time.time()
        notes["rows_at_kill"] = store_rows(tb)
        tb.start_daemon_process()

    def after(tb):
        notes["proxy"] = tb.aws_proxy.snapshot()
        notes["pending"] = {a: tb.aws_proxy.pending(a) for a in ("SetDesiredCapacity",
                                                                   "TerminateInstanceInAutoScalingGroup")}
        notes["daemon_exit"] = tb.daemon_proc.returncode

    # five batches (about 40 s wall): room for the faults, one after another, and recovery
    res = run_testbed(options(tmp_path, daemon_process=True, aws_fault_proxy=True, timeout_s=300,
                              workload_obj=small_workload(batches=5)), during=faults, before_close=after)
    assert not [f for f in res.faults if f.startswith("error")], res.faults
    decisions, actions = check_invariants(res, 60 / COMPRESSION, n_jobs=200)

    # throttling: retried inside one action, never a second action for it
    throttled = [op for op in ("SetDesiredCapacity", "TerminateInstanceInAutoScalingGroup")
                 if notes["proxy"].get(op, {}).get("failed")]
    assert throttled, f"no scaling call met the injected throttling: {notes['proxy']}"
    for op in throttled:
        assert notes["proxy"][op]["failed"] == 2 and notes["proxy"][op]["forwarded"] >= 1, notes["proxy"]
    retried = [a for a in actions if a.status == "succeeded" and (a.result or {}).get("attempts", 1) >= 3]
    assert retried, "the throttled call was recorded as one action with its retries"
    keys = [a.idempotency_key for a in actions]
    assert len(keys) == len(set(keys))

    # a worker killed mid-job: its job was re-queued and still finished exactly once
    assert notes.get("killed_worker"), "no worker was busy to kill"
    assert res.summary["jobs_requeued"] >= 1

    # Graphite down: those intervals were recorded as stale and acted on nothing; then recovery
    down_from, down_to = notes["graphite_down"]
    during = [d for d in decisions if down_from + 1 <= int(d.iteration_key) <= down_to - 1]
    assert during and all(d.source == "none" for d in during), [(d.iteration_key, d.source) for d in during]
    assert any(d.source == "agent" for d in decisions if int(d.iteration_key) > down_to + 2), "no recovery"

    # kill -9: nothing committed before the kill is lost, nothing is duplicated, the restarted
    # daemon went on deciding, and no action was left open
    dec_rows = {(d.id, d.iteration_key) for d in decisions}
    act_rows = {(a.id, a.idempotency_key) for a in actions}
    before_dec, before_act = notes["rows_at_kill"]
    assert before_dec <= dec_rows and before_act <= act_rows
    assert any(int(d.iteration_key) > notes["daemon_killed_at"] for d in decisions), "the restarted daemon decided"
    assert any(d.source == "agent" and int(d.iteration_key) > notes["daemon_killed_at"] for d in decisions)
    assert not [a for a in actions if a.status in ("planned", "in_flight")]
    assert notes["daemon_exit"] == 0  # the restarted daemon stopped cleanly on SIGTERM


def test_samm_testbed_verb_runs_one_policy_on_an_swf_trace(tmp_path):
    """`samm testbed` as a user runs it: a (tiny) SWF trace, a baseline, JSON out, files written."""
    import json
    import subprocess
    import sys

    swf = tmp_path / "tiny.swf"
    rows = [f"{i + 1} {0 if i < 12 else 120} 0 180 1 -1 -1 1 -1 -1 1 1 1 1 1 -1 -1 -1" for i in range(24)]
    swf.write_text("; a tiny trace\n" + "\n".join(rows) + "\n")
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "samm.cli.main", "testbed", "--agent", "threshold", "--params",
         '{"upper": 0.6, "lower": 0.3, "cooldown_steps": 0}', "--workload", str(swf), "--compression", "60",
         "--timeout", "180", "--out", str(out), "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["summary"]["jobs_finished"] == summary["summary"]["jobs_total"] == 24
    assert summary["daemon_iterations"] >= 3 and summary["summary"]["total_cost"] > 0
    for name in ("summary.json", "timeline.csv", "vms_vs_waiting.png", "knowledge.db", "testbed.log"):
        assert (out / name).exists(), name


def test_samm_testbed_verb_rejects_bad_input(tmp_path):
    from click.testing import CliRunner

    from samm.cli.main import cli

    res = CliRunner().invoke(cli, ["testbed", "--workload", str(tmp_path / "nope.swf"), "--out", str(tmp_path)])
    assert res.exit_code == 2 and "nope.swf" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(cli, ["testbed", "--params", "[1]", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "--params must be a JSON object" in res.output


@pytest.mark.postgres
@pytest.mark.slow
def test_testbed_ha_failover(tmp_path, pg_url):
    """Two `samm run` processes on one real PostgreSQL, Graphite and moto: the leader is killed
    with -9 five times (a fresh standby started after each kill). Every kill: a standby leads and
    decides within two intervals; nothing committed is lost; no window is decided twice; no
    action is duplicated; the cool-downs the dead leader wrote hold."""
    import os
    import signal

    kills, stores = [], {}

    def lease(tb):
        # one store for the whole run: the fault thread polls it every 0.2 s
        if "s" not in stores:
            stores["s"] = KnowledgeStore(tb.knowledge_url)
        store = stores["s"]
        return store.lease("daemon"), ({(d.id, d.iteration_key) for d in store.decisions()},
                                       {(a.id, a.idempotency_key) for a in store.actions()})

    def faults(tb):
        interval = tb.interval_wall
        for _ in range(5):
            # a leader that has decided twice since it took over, and a standby alive for a while
            deadline = time.time() + 90
            while time.time() < deadline:
                rec, (decs, _) = lease(tb)
                took = kills[-1]["at"] if kills else 0.0
                if rec is not None and sum(1 for _, k in decs if int(k) > took + interval) >= 2:
                    break
                time.sleep(0.2)
            else:
                raise TimeoutError("no leader deciding")
            time.sleep(max(0.0, 8.0 - (time.time() - tb.daemon_proc_started)))  # the standby is up
            pid = int(rec.holder.rpartition(":")[2])
            victim = next(p for p in tb.daemon_procs if p.pid == pid)
            os.kill(pid, signal.SIGKILL)
            victim.wait(10)
            at = time.time()
            _, rows = lease(tb)
            kills.append({"at": at, "token": rec.token, "rows": rows})
            tb.start_daemon_process()

    def after(tb):
        kills.append({"final": lease(tb), "exits": [p.returncode for p in tb.daemon_procs]})
        stores.pop("s").close()

    opts = options(tmp_path, daemon_process=True, daemons=2, ha=True, knowledge_url=pg_url, timeout_s=400,
                   workload_obj=small_workload(batches=12, per_batch=10))
    res = run_testbed(opts, during=faults, before_close=after)
    assert not [f for f in res.faults if f.startswith("error")], res.faults
    final_lease, (dec_rows, act_rows) = kills[-1]["final"]
    kills = kills[:-1]
    assert len(kills) == 5
    decisions, actions = check_invariants(res, 60 / COMPRESSION, n_jobs=120)
    interval = 60 / COMPRESSION
    assert final_lease.token >= kills[-1]["token"] + 1
    for k in kills:
        assert k["rows"][0] <= dec_rows and k["rows"][1] <= act_rows, "a committed record was lost"
        first = min(d.created_at for d in decisions if d.created_at > k["at"])
        assert first - k["at"] <= 2 * interval + 1.0, ("takeover took", first - k["at"])
    keys = [a.idempotency_key for a in actions]
    assert len(keys) == len(set(keys))
    assert not [a for a in actions if a.status in ("planned", "in_flight")]
    windows = sorted(int(d.iteration_key) for d in decisions)
    span = range(windows[0], windows[-1] + 1, round(interval))
    takeovers = [round(min(d.created_at for d in decisions if d.created_at > k["at"]) - k["at"], 2) for k in kills]
    print(f"\nHA failover: {len(kills)} kills, takeover (s) {takeovers} at interval {interval:g} s; "
          f"{len(windows)} decisions in {len(span)} windows ({len(span) - len(set(windows))} without one, "
          f"{len(windows) - len(set(windows))} with two); {len(actions)} actions, "
          f"{len(keys) - len(set(keys))} duplicate; lease token {final_lease.token}")
