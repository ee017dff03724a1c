"""The daemon's MAPE-K loop with a CloudSim Plus simulation as the managed system: the loop
must act exactly as the evaluator does, record one decision per interval and one action row
per non-noop wish, honour cool-downs and dry-run, and `samm run` must stop cleanly on SIGTERM."""
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from agents.factory import make_agent
from samm.config import SammConfig
from samm.daemon.build import build_daemon
from samm.execute.sim_exec import sim_config_for_groups
from samm.knowledge.store import KnowledgeStore
from sim_bridge.config import SimConfig
from sim_bridge.runner import run_episodes
from sim_bridge.workloads import load_workload

pytestmark = pytest.mark.jvm

GROUPS = [
    {"name": "S", "cores": 2, "ram_gb": 8, "price_per_hour": 0.2, "min": 1, "max": 10},
    {"name": "M", "cores": 4, "ram_gb": 16, "price_per_hour": 0.4, "min": 0, "max": 10},
    {"name": "L", "cores": 8, "ram_gb": 32, "price_per_hour": 0.8, "min": 0, "max": 10},
]


def config(tmp_path, **over) -> SammConfig:
    data = {"groups": GROUPS, "agent": {"name": "lstm-ppo"}, "executor": {"kind": "sim"},
            "timing": {"interval_s": 0.05, "warmup_s": 0, "cooldown_s": 0},
            "knowledge": {"url": f"sqlite:///{tmp_path}/k.db"}, "simulation": {"seed": 1}}
    for k, v in over.items():
        data[k] = {**data.get(k, {}), **v} if isinstance(v, dict) else v
    return SammConfig.model_validate(data)


def run_until_finished(daemon, cap=400):
    reports = []
    while len(reports) < cap:
        rep = daemon.loop.run_once()
        reports.append(rep)
        if rep.finished:
            break
    return reports


def test_sim_daemon_reproduces_the_evaluator(tmp_path):
    cfg = config(tmp_path)
    daemon = build_daemon(cfg)
    try:
        reports = run_until_finished(daemon)
        totals = daemon.system.totals()
        store = daemon.store
        decisions = store.decisions()
        actions = store.actions()
    finally:
        daemon.close()
    sim = sim_config_for_groups(cfg.groups, SimConfig())
    ref = run_episodes(sim, load_workload("seed-1551"), make_agent("lstm-ppo", sim), [1])[0]
    assert reports[-1].finished and totals["jobs_finished"] == 1551
    assert totals["total_cost"] == pytest.approx(ref["total_cost"], abs=1e-6)
    assert totals["steps"] == ref["steps"]
    # one decision per interval, keyed by the window end
    assert len(decisions) == len(reports) == len({d.iteration_key for d in decisions})
    # one action row per group the agent wanted to change, none for do-nothing decisions
    by_decision = {}
    for a in actions:
        by_decision.setdefault(a.decision_id, []).append(a)
    for rep in reports:
        wanted = {g for g, d in rep.plan.deltas.items() if d}
        assert {a.group_name for a in by_decision.get(rep.decision_id, [])} == wanted
    assert {a.status for a in actions} <= {"succeeded", "blocked"}
    assert any(a.status == "succeeded" for a in actions)


def test_cooldown_blocks_a_group_for_its_duration_in_simulated_time(tmp_path):
    cfg = config(tmp_path, agent={"name": "threshold", "params": {"upper": 0.6, "lower": 0.3, "cooldown_steps": 0}},
                 timing={"cooldown_s": 300})
    daemon = build_daemon(cfg)
    try:
        run_until_finished(daemon, cap=120)
        actions = daemon.store.actions()
        decisions = {d.id: d for d in daemon.store.decisions()}
    finally:
        daemon.close()
    acted = {}
    for a in actions:
        if a.status == "succeeded":
            acted.setdefault(a.group_name, []).append(float(decisions[a.decision_id].iteration_key))
    assert acted, "the threshold agent should have scaled at least once"
    for group, times in acted.items():
        gaps = [b - a for a, b in zip(times, times[1:])]
        assert all(g >= 300 for g in gaps), (group, gaps)
    blocked = [a for a in actions if a.status == "blocked"]
    assert any("cooldown" in (a.request or {}).get("reason", "") for a in blocked)


def test_dry_run_records_but_never_acts(tmp_path):
    cfg = config(tmp_path, executor={"kind": "sim", "dry_run": True}, agent={"name": "static:5,5,5"})
    daemon = build_daemon(cfg)
    try:
        for _ in range(5):
            rep = daemon.loop.run_once()
        counts = daemon.system.counts().tolist()
        actions = daemon.store.actions()
    finally:
        daemon.close()
    assert counts == [1, 1, 1]
    assert actions and {a.status for a in actions} == {"dry_run"}
    assert rep.inventory == {g: {"desired": 1, "live": 1} for g in ("S", "M", "L")}


def test_samm_run_stops_cleanly_on_sigterm(tmp_path):
    cfg_path = tmp_path / "samm.yaml"
    cfg_path.write_text(yaml.safe_dump({
        "groups": GROUPS, "agent": {"name": "lstm-ppo"}, "executor": {"kind": "sim"},
        "timing": {"interval_s": 0.2, "warmup_s": 0, "cooldown_s": 0},
        "knowledge": {"url": f"sqlite:///{tmp_path}/k.db"}}))
    proc = subprocess.Popen([sys.executable, "-m", "samm.cli.main", "run", "--config", str(cfg_path), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 90
        lines = []
        while time.time() < deadline and len(lines) < 3:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
        assert len(lines) == 3, proc.stderr.read()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    store = KnowledgeStore(f"sqlite:///{tmp_path}/k.db")
    try:
        assert store.counts()["decisions"] >= 3
        assert store.in_flight_actions() == []
    finally:
        store.close()


def test_samm_run_rejects_a_bad_config_with_its_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("groups:\n  - {name: S, cores: 2, ram_gb: 8, price_per_hour: 0.2, min: 1, max: 10}\nexecutor:\n  kind: sim\n  colour: red\n")
    r = subprocess.run([sys.executable, "-m", "samm.cli.main", "run", "--config", str(bad)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2
    assert "bad.yaml:5" in r.stderr and "colour" in r.stderr


def test_a_bad_loop_entry_names_its_index_and_line(tmp_path):
    from samm.config import ConfigError, load_config

    group = "{name: S, cores: 2, ram_gb: 8, price_per_hour: 0.2, min: 1, max: 10}"
    bad = tmp_path / "loops.yaml"
    bad.write_text(f"loops:\n  - name: a\n    groups: [{group}]\n    executor: {{kind: sim}}\n"
                   f"  - name: b\n    groups: [{group}]\n    executor: {{kind: sim, colour: red}}\n"
                   f"    timing: {{interval_s: -1}}\n")
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    assert "loops.yaml:7: unknown key 'loops.1.executor.colour'" in str(err.value)
    assert "loops.yaml:8: loops.1.timing.interval_s" in str(err.value)


def test_policy_for_other_vm_types_is_refused(tmp_path):
    from samm.daemon.build import ConfigurationProblem

    groups = [dict(g, name=n) for g, n in zip(GROUPS, ("small", "medium", "large"))]
    cfg = SammConfig.model_validate({"groups": groups, "executor": {"kind": "sim"},
                                     "knowledge": {"url": f"sqlite:///{tmp_path}/k.db"}})
    with pytest.raises(ConfigurationProblem, match="name the groups like the policy's types"):
        build_daemon(cfg)


def test_two_loops_deciding_in_the_same_minute_both_act(tmp_path):
    """Two loops, each with its own simulated fleet, share the knowledge store. Their simulation
    clocks are in step, so every iteration of one has the same key as the other's: both must
    decide and act, each under its own cool-downs."""
    loop = {"groups": GROUPS, "executor": {"kind": "sim"},
            "timing": {"interval_s": 0.05, "warmup_s": 0, "cooldown_s": 90}, "simulation": {"seed": 1}}
    cfg = SammConfig.model_validate({
        "knowledge": {"url": f"sqlite:///{tmp_path}/k.db"},
        "loops": [{"name": "web", "agent": {"name": "static:4,1,1"}, **loop},
                  {"name": "batch", "agent": {"name": "static:1,1,4"}, **loop}]})
    from samm.daemon.runner import DaemonRunner

    daemon = build_daemon(cfg)
    runner = DaemonRunner(daemon, max_iterations=6)
    assert [lp.name for lp in daemon.loops] == ["web", "batch"]
    assert runner.run(install_signals=False) == 0  # closes the daemon
    assert {r.loop for r in runner.reports} == {"web", "batch"}
    assert all({"monitor", "analyze", "plan"} <= set(r.stage_ms) for r in runner.reports)
    assert any("execute" in r.stage_ms for r in runner.reports)
    store = KnowledgeStore(f"sqlite:///{tmp_path}/k.db")
    try:
        web = {d.iteration_key: d for d in store.decisions(loop="web")}
        batch = {d.iteration_key: d for d in store.decisions(loop="batch")}
        assert len(web) == 6 and len(batch) == 6
        assert set(web) == set(batch)  # the same minutes, decided by both
        acted = {lp: [a for a in store.actions() if a.loop == lp and a.status == "succeeded"]
                 for lp in ("web", "batch")}
        assert acted["web"] and acted["batch"]
        def minutes(acts):
            return {a.idempotency_key.split("/", 1)[1].split(":")[0] for a in acts}

        same_minute = minutes(acted["web"]) & minutes(acted["batch"])
        assert same_minute, "no minute in which both loops acted"
        assert all(a.idempotency_key.startswith("batch/") for a in acted["batch"])
        assert all(a.idempotency_key.startswith("web/") for a in acted["web"])
        assert store.cooldowns("web") and store.cooldowns("batch")
    finally:
        store.close()


def test_loops_and_top_level_loop_keys_do_not_mix(tmp_path):
    with pytest.raises(Exception, match="inside each loop"):
        SammConfig.model_validate({"groups": GROUPS, "loops": [{"name": "a", "groups": GROUPS}]})
    with pytest.raises(Exception, match="loop names must be unique"):
        SammConfig.model_validate({"loops": [{"name": "a", "groups": GROUPS}, {"name": "a", "groups": GROUPS}]})
    with pytest.raises(Exception, match="groups"):
        SammConfig.model_validate({})
    one = config(tmp_path).control_loops()
    assert [lp.name for lp in one] == ["default"] and one[0].agent.name == "lstm-ppo"


def test_a_request_refused_before_any_call_does_not_cool_the_group_down(tmp_path):
    """The executor refused the request before touching the back-end (here: as if an operator
    had lowered the group's max between the guard's read and the call): nothing was applied, so
    the group must be free to act at the next interval instead of waiting out its 300-s cool-down.
    The executor's own refusals are tested for real in test_execute_live_gaps.py."""
    from samm.execute.base import refused

    cfg = config(tmp_path, agent={"name": "threshold", "params": {"upper": 0.6, "lower": 0.3, "cooldown_steps": 0}},
                 timing={"cooldown_s": 300})
    daemon = build_daemon(cfg)
    real_apply = daemon.loop.executor.apply
    refusals = []

    def refuse_the_first(req):
        if not refusals:
            refusals.append(req)
            return refused({}, f"target {req.target} outside the group's bounds (lowered by an operator)")
        return real_apply(req)

    daemon.loop.executor.apply = refuse_the_first
    try:
        reports = run_until_finished(daemon, cap=120)
        actions = daemon.store.actions()
        decisions = {d.id: d for d in daemon.store.decisions()}
    finally:
        daemon.close()
    assert refusals, "the threshold agent should have asked to scale"
    group = refusals[0].group
    mine = sorted((float(decisions[a.decision_id].iteration_key), a) for a in actions if a.group_name == group)
    failed_at = next(t for t, a in mine if a.status == "failed")
    after = [(t, a.status) for t, a in mine if t > failed_at]
    assert after and after[0][1] == "succeeded", after        # not "blocked" by a cool-down
    assert after[0][0] - failed_at < 300, after
    assert len(reports) > 1
