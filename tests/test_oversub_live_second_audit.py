"""Second audit of the oversubscription live path, with real components: a run named "pm" read
back from a real Graphite, a run whose Graphite is unreachable summarised (real cgroups, real
workers), per-VM admission decisions in a real Knowledge store, an external admission service on
real uvicorn that cannot serve the run, and the executor's and cgroups' parameter checks. Each
test failed before its fix (session 99)."""
from __future__ import annotations

import csv
import math
import time

import numpy as np
import pytest

from agents.oversubscription.service import create_app
from agents.oversubscription.workload import Workload
from samm.knowledge.store import KnowledgeStore
from samm.monitor.graphite_client import GraphiteSender, RenderClient
from samm.testbed.oversub.admission import AdmissionExecutor, LiveParams, StepRecord
from samm.testbed.oversub.cgroups import PmCgroups
from samm.testbed.oversub.collector import pm_metric
from test_oversub_live import cgroups_or_skip  # noqa: E402  (the live tests' skip rule)
from test_oversub_live_audit import PMS, SCALE, SETTING, Agent, Half, executor, two_vm_workload  # noqa: E402

pytestmark = [pytest.mark.graphite, pytest.mark.testbed]


# --------------------------------------------------------------------------- Graphite's series names
def test_a_run_named_pm_reads_its_pm_usage_and_finds_the_hot_pm(graphite, graphite_prefix, tmp_path):
    """The PM index was the component after the first "pm" of the series name: in a run named
    "pm" that is the run's own component, every series was skipped, and each step read
    "stale", its hot PM taken for cold."""
    from fixtures_graphite import wait_for_points

    store = KnowledgeStore(f"sqlite:///{tmp_path / 'k.db'}")
    try:
        ex = AdmissionExecutor(SETTING, two_vm_workload(), agent="probe", service_url="http://127.0.0.1:9",
                               store=store, run="pm", cgroups=PmCgroups(PMS, quota_host_cores=1.0),
                               sender=GraphiteSender(graphite.carbon_host, graphite.carbon_port),
                               render=RenderClient(graphite.render_url, timeout_s=2.0),
                               params=LiveParams(seconds_per_step=1, prefix=graphite_prefix, post_events=False))
        start = int(time.time()) - 30
        hot_cores = SETTING.beta * SETTING.pm_cores + 5.0
        ex.sender.send(pm_metric(graphite_prefix, "pm", 0), hot_cores, start)
        ex.sender.send(pm_metric(graphite_prefix, "pm", 1), 3.0, start)
        ex.sender.flush()
        wait_for_points(graphite.render_url, pm_metric(graphite_prefix, "pm", "*"), start - 1, start,
                        expect_series=2)
        rec = StepRecord(step=0, hour=0, start=float(start), pm_reserved=[0.0] * PMS, pm_sim=[0.0] * PMS)
        ex.records.append(rec)
        assert ex._read_step(rec, give_up=True)
        assert rec.graphite_status == "ok" and rec.pm_points == [1, 1]
        assert rec.pm_used == pytest.approx([hot_cores, 3.0])
        assert rec.pm_hot == [True, False] and ex.hot_events == 1
        assert store.decision("step0:hot:pm0", loop="oversub-pm").action_name == "hot-event"
    finally:
        store.close()


# --------------------------------------------------------------------------- unmeasured is not cold
def test_pm_steps_graphite_never_measured_are_not_reported_cold(tmp_path):
    """Graphite unreachable for the whole run: summary.json said the live run agreed with the
    simulator on every cold PM-step (hot_agreement 1.0) and steps.csv wrote each PM as not hot
    (0), though nothing was measured. Now: no agreement figure, and the hot column left empty."""
    cgroups_or_skip()
    from samm.localproc import free_port
    from samm.testbed.oversub.run import summarise, write_outputs

    agent = Agent("ok")
    store = KnowledgeStore(f"sqlite:///{tmp_path / 'k.db'}")
    try:
        with PmCgroups(PMS, quota_host_cores=SETTING.pm_cores * SCALE) as cg:
            ex = AdmissionExecutor(SETTING, two_vm_workload(), agent="probe", service_url=agent.url, store=store,
                                   run="nographite", cgroups=cg, sender=GraphiteSender("127.0.0.1", free_port()),
                                   render=RenderClient(f"http://127.0.0.1:{free_port()}", timeout_s=0.5),
                                   params=LiveParams(seconds_per_step=1, host_cores_per_pm_core=SCALE, reread_s=0.0,
                                                     read_deadline_s=0.5, post_events=False))
            records = ex.run(2, float(math.ceil(time.time() + 1.0)))
        assert [r.graphite_status for r in records] == ["stale", "stale"]
        summary = summarise(SETTING, ex.w, records, ex)
        assert summary["gap"]["pm_steps_missing"] == 2 * PMS
        assert summary["hot_agreement"] is None, summary["hot_agreement"]
        out = tmp_path / "o"
        out.mkdir()
        write_outputs(out, SETTING, records, summary)
        rows = list(csv.DictReader((out / "steps.csv").open()))
        assert [(r["pm0_hot"], r["pm1_hot"], r["pm0_points"]) for r in rows] == [("", "", "0")] * 2
    finally:
        store.close()
        agent.close()


def test_a_measured_run_keeps_its_hot_agreement_and_hot_column():
    """The other side: a step Graphite measured keeps its 0/1 and counts in the agreement."""
    from types import SimpleNamespace

    from samm.testbed.oversub.run import summarise

    w = two_vm_workload()
    hot_cores = SETTING.beta * SETTING.pm_cores + 1.0
    recs = [StepRecord(step=0, hour=0, start=0.0, pm_reserved=[8.0, 0.0], pm_sim=[hot_cores, 0.0],
                       pm_used=[hot_cores, 0.1], pm_points=[1, 1], pm_hot=[True, False], graphite_status="ok"),
            StepRecord(step=1, hour=1, start=1.0, pm_reserved=[8.0, 0.0], pm_sim=[hot_cores, 0.0],
                       pm_used=[math.nan, 0.2], pm_points=[0, 1], pm_hot=[False, False], graphite_status="partial")]
    counts = dict(worker_failures=0, worker_exits=0, decisions_created=0, decisions_existing=0,
                  decisions_conflicting=0, unrecorded=[], store_errors=0, hot_events=1, hot_events_created=1)
    s = summarise(SETTING, w, recs, SimpleNamespace(**counts))
    # 3 measured PM-steps, all agreeing; the unmeasured hot one in the simulator is not a disagreement
    assert s["hot_agreement"] == 1.0 and s["gap"]["pm_steps_missing"] == 1


# --------------------------------------------------------------------------- per-VM decisions
def test_per_vm_decisions_are_recorded_with_the_state_their_call_was_sent(graphite, tmp_path):
    """Per-vm mode: the second request's call carries the first VM's reservation and only its own
    request; before, both were recorded with the step's batch view (no reservation, both
    requests summed), an observation no call had seen."""
    cgroups_or_skip()
    from agents.oversubscription.features import observation
    from agents.oversubscription.sim import View

    agent = Agent("ok")
    store = KnowledgeStore(f"sqlite:///{tmp_path / 'k.db'}")
    w = Workload(n_subscribers=3, steps=1, sub=[0, 0], arrive=[0, 0], depart=[1, 1], cores=[16.0, 8.0],
                 mem=[64.0, 32.0], net=[4.0, 2.0], usage=np.full((2, 1), 0.5), name="two-at-once")
    try:
        with PmCgroups(PMS, quota_host_cores=SETTING.pm_cores * SCALE) as cg:
            ex = executor(graphite, store, agent.url, cg, "pervm", w, admit_mode="per-vm")
            (rec,) = ex.run(1, float(math.ceil(time.time() + 1.0)))
        assert rec.fallbacks == 0 and rec.placed == 2
        n = SETTING.n_subscribers

        def features(alloc0, request0):
            alloc = np.zeros((n, 3))
            alloc[0] = alloc0
            req = np.zeros((n, 3))
            req[0] = request0
            rl = np.array([alloc0[0] / 0.5 if alloc0[0] else 0.0, 0.0, 0.0])
            view = View(t=0, hour=rec.hour, request=req, has_request=req[:, 0] > 0, allocated=alloc,
                        requested_live=rl, usage_history=np.zeros((0, n)), vm_rows=np.arange(1))
            return pytest.approx(observation(view, SETTING).tolist())

        first = store.decision("step0:vm0", loop="oversub-pervm").observation["features"]
        second = store.decision("step0:vm1", loop="oversub-pervm").observation["features"]
        assert first == features([0.0, 0.0, 0.0], [16.0, 64.0, 4.0])
        assert second == features([8.0, 64.0, 4.0], [8.0, 32.0, 2.0])
    finally:
        store.close()
        agent.close()


# --------------------------------------------------------------------------- an external service
@pytest.mark.parametrize("agent, text", [
    ("nsigma", "hosts no oversubscription agent 'nsigma'"),     # a typo or another agent: 404 on every call
    ("half", "refuses setting 'azure'"),                         # 3 subscribers hosted, the run has 9: 422s
])
def test_an_external_service_that_cannot_serve_the_run_is_refused_before_it_starts(graphite, tmp_path, agent, text):
    """`--service-url` at a real service that answers 404 (agent not hosted) or 422 (another
    number of subscribers) to every call: before, the run replayed every step admitting at rate
    1 after a failed call, recorded each as a fallback, and ended 0."""
    from samm.localproc import AppInThread
    from samm.testbed.oversub.run import OversubRunOptions, run_oversub

    with AppInThread(create_app("half", Half())) as svc:
        with pytest.raises(ValueError, match=text):
            run_oversub(OversubRunOptions(agent=agent, setting="azure", pms=2, steps=1, max_vms=2,
                                          out_dir=str(tmp_path / "o"), service_url=svc.url,
                                          knowledge_url=f"sqlite:///{tmp_path / 'k.db'}"), graphite=graphite)
    assert not (tmp_path / "k.db").exists()  # nothing started: no store, no cgroups, no workers


def test_an_external_service_that_serves_the_run_is_used(graphite, tmp_path):
    cgroups_or_skip()
    from samm.localproc import AppInThread
    from samm.testbed.oversub.run import OversubRunOptions, run_oversub

    with AppInThread(create_app("half", Half())) as svc:
        res = run_oversub(OversubRunOptions(agent="half", setting="tiny", pms=2, steps=1, max_vms=2,
                                            out_dir=str(tmp_path / "o"), service_url=svc.url),
                          workload=two_vm_workload(2), graphite=graphite)
    assert res.summary["fallbacks"] == 0 and res.summary["placed"] == 1 and res.summary["s_cores"] == 0.5


# --------------------------------------------------------------------------- parameter checks
@pytest.mark.parametrize("changes, name", [
    ({"read_deadline_s": math.nan}, "read_deadline_s"),  # the end-of-run read of a missing step never gave up
    ({"reread_s": math.inf}, "reread_s"),
    ({"slice_s": 0.0}, "slice_s"),                      # every worker exited at its first step (code 2)
    ({"slice_s": math.nan}, "slice_s"),
    ({"worker_start_timeout_s": -1.0}, "worker_start_timeout_s"),
    ({"min_call_s": math.nan}, "min_call_s"),
])
def test_live_params_refuse_values_no_run_can_use(changes, name):
    with pytest.raises(ValueError, match=f"^{name} must be"):
        LiveParams(**changes)
    assert LiveParams(read_deadline_s=0.0, reread_s=0.0, slice_s=0.01).slice_s == 0.01


@pytest.mark.parametrize("kw, text", [
    ({"quota_host_cores": math.inf}, "quota_host_cores"),   # OverflowError from round()
    ({"quota_host_cores": 0.5, "period_us": 500}, "period_us"),        # the kernel's EINVAL at create()
    ({"quota_host_cores": 0.5, "period_us": 2_000_000}, "period_us"),
])
def test_pm_cgroups_refuse_a_quota_or_period_the_kernel_cannot_take(kw, text):
    with pytest.raises(ValueError, match=text):
        PmCgroups(2, **kw)


# --------------------------------------------------------------------------- a dead worker's pid
def _spawn_with_pid(pid: int):
    """An unrelated process (`sleep`) given exactly `pid` (ns_last_pid, root), or None."""
    import subprocess

    for _ in range(50):
        try:
            with open("/proc/sys/kernel/ns_last_pid", "w") as f:
                f.write(str(pid - 1))
        except OSError:
            return None
        p = subprocess.Popen(["sleep", "30"])
        if p.pid == pid:
            return p
        p.kill()
        p.wait()
    return None


def _cpu_cgroup(pid: int) -> str:
    for line in open(f"/proc/{pid}/cgroup").read().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return path
    return ""


def test_a_dead_workers_pid_taken_by_another_process_is_left_alone(graphite, tmp_path):
    """VM 0's worker is killed and reaped at the next step's start; its pid goes to an unrelated
    process (pid_max is 32768 here, so a busy host reuses pids within minutes). Before, the
    end of the run moved that process into the emulated cluster's cgroup (and its CPU time was
    read as the VM's); now a reaped worker's pid is never touched."""
    import os
    import signal
    import threading

    cgroups_or_skip()
    agent = Agent("ok")
    store = KnowledgeStore(f"sqlite:///{tmp_path / 'k.db'}")
    impostor: dict = {}
    try:
        with PmCgroups(PMS, quota_host_cores=SETTING.pm_cores * SCALE) as cg:
            ex = executor(graphite, store, agent.url, cg, "pidreuse", two_vm_workload(3))
            t0 = float(math.ceil(time.time() + 1.0))

            def kill_then_reuse():
                time.sleep(max(0.0, t0 + 1.5 - time.time()))
                worker = ex.procs[0].proc
                os.kill(worker.pid, signal.SIGKILL)
                time.sleep(max(0.0, t0 + 2.4 - time.time()))  # step 2 began: the executor reaped it
                impostor["reaped"] = worker.returncode is not None
                impostor["before"] = None
                p = _spawn_with_pid(worker.pid)
                if p is not None:
                    impostor["p"], impostor["before"] = p, _cpu_cgroup(p.pid)

            t = threading.Thread(target=kill_then_reuse, daemon=True)
            t.start()
            ex.run(3, t0)
            t.join(5)
            p = impostor.get("p")
            if p is None:
                pytest.skip("could not give a new process the dead worker's pid (ns_last_pid)")
            assert impostor["reaped"] and ex.worker_exits == 1
            assert _cpu_cgroup(p.pid) == impostor["before"], "an unrelated process was moved into the PM cgroups"
            assert cg.name not in _cpu_cgroup(p.pid)
    finally:
        if impostor.get("p") is not None:
            impostor["p"].kill()
            impostor["p"].wait()
        store.close()
        agent.close()


def test_cli_c2marl_at_an_external_service_without_a_setting_is_a_clear_error(tmp_path):
    """`samm testbed-oversub --agent c2marl --service-url URL` (no --setting): the run's setting
    is tiny's 3 subscribers, the served policy's 9, and every call was a 422 admitted at rate 1;
    the run ended 0. Now exit 2 before anything starts, naming --setting."""
    cgroups_or_skip()
    from click.testing import CliRunner

    from agents.oversubscription.settings import SETTINGS
    from samm.cli.main import cli
    from samm.localproc import AppInThread

    class AzureHalf(Half):
        setting = SETTINGS["azure"]

    with AppInThread(create_app("c2marl", AzureHalf())) as svc:
        r = CliRunner().invoke(cli, ["testbed-oversub", "--agent", "c2marl", "--service-url", svc.url, "--pms", "1",
                                     "--steps", "1", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit), r.output
    assert "--setting" in r.output and "9 rows" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "o" / "graphite").exists()


def test_a_cli_run_interrupted_before_its_first_step_exits_as_interrupted(tmp_path):
    """SIGTERM while the run waits for step 0 (its 2-s start delay): the summary of no steps
    broadcast (0,) against (0, PMs), and the CLI printed "error: testbed-oversub: operands could
    not be broadcast ..." and exited 2. Now: 143, "interrupted", a summary of 0 steps."""
    cgroups_or_skip()
    import json
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from samm.monitor.local_graphite import missing_packages

    if missing_packages():
        pytest.skip("Graphite not installed")
    out = tmp_path / "o"
    samm = Path(sys.executable).parent / "samm"
    p = subprocess.Popen([str(samm), "testbed-oversub", "--agent", "grid-0.5", "--pms", "2", "--steps", "3",
                          "--max-vms", "4", "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the cgroups exist: step 0's admission is >= 1.4 s away
            log = out / "testbed.log"
            if log.exists() and "PM cgroups" in log.read_text():
                break
            time.sleep(0.05)
        time.sleep(0.3)
        p.send_signal(signal.SIGTERM)
        output, _ = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 143, output
    assert "interrupted" in output and "Traceback" not in output and "broadcast" not in output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["steps"] == 0 and summary["hot_steps_per_pm"] == [0, 0]


@pytest.mark.parametrize("window", ["24.0", "1e2"])
def test_a_hosted_rule_takes_a_whole_window_written_as_a_float(window):
    """`--agent-param nsigma:window=24.0`: the check passed it as a whole number, then int("24.0")
    stopped `samm serve` with "nsigma: parameters must be numbers"."""
    from fastapi.testclient import TestClient

    from agents.oversubscription.hosting import make_policy
    from test_oversub_live_audit import admit_body

    policy = make_policy("nsigma", None, setting="tiny", prior="none", window=window)
    assert policy.version == f"nsigma(headroom=3, n=2, window={int(float(window))})"
    r = TestClient(create_app("nsigma", policy)).post("/v1/agents/nsigma/admit", json=admit_body())
    assert r.status_code == 200 and r.json()["rate"] == 1.0  # no history: no oversubscription
    with pytest.raises(ValueError, match="parameters must be numbers"):
        make_policy("nsigma", None, setting="tiny", prior="none", window="abc")


def test_cli_more_steps_than_the_workload_has_is_a_clear_error(tmp_path):
    """`--steps 100` on tiny (a 48-step workload) replayed 48 steps and reported them as the
    run, without a word; now exit 2 naming --steps' bound, before anything starts."""
    cgroups_or_skip()
    from click.testing import CliRunner

    from samm.cli.main import cli

    r = CliRunner().invoke(cli, ["testbed-oversub", "--agent", "grid-0.5", "--setting", "tiny", "--pms", "1",
                                 "--steps", "100", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit), r.output
    assert "steps must be at most 48" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "o" / "graphite").exists()


def test_a_collector_whose_first_reading_fails_keeps_collecting(graphite, graphite_prefix):
    """The very first reading raised outside the loop's guard: the thread died, no error counted,
    and every PM read as unmeasured for the whole run."""
    import time as _time

    from samm.monitor.graphite_client import GraphiteSender
    from samm.testbed.oversub.collector import PmCollector

    calls = {"n": 0}

    def read_ns():
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError("cgroup not there yet")
        return [calls["n"] * 10**8]

    col = PmCollector(read_ns, GraphiteSender(graphite.carbon_host, graphite.carbon_port), "first",
                      host_cores_per_pm_core=0.5, prefix=graphite_prefix).start()
    _time.sleep(3.3)
    col.stop()
    assert col.errors == 1 and col.reports >= 1 and col._thread is not None and not col._thread.is_alive()
