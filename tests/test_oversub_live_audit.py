"""Bad input on the oversubscription live path, with real components: the admit routes' upper
bounds, an agent that answers garbage or hangs (a real HTTP server), a Knowledge store locked by
another connection (real SQLite), a VM worker killed mid-run (real processes in real cgroups),
a non-finite point in a real Graphite, and the CLI's refusals. Each test failed before its fix
(session 95's audit of the live path)."""
from __future__ import annotations

import json
import math
import os
import signal
import sqlite3
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from fastapi.testclient import TestClient

from agents.oversubscription.service import MAX_USAGE_RATE, MAX_VM, create_app
from agents.oversubscription.settings import SETTINGS
from agents.oversubscription.workload import Workload
from samm.knowledge.store import KnowledgeStore
from samm.monitor.graphite_client import GraphiteSender, RenderClient
from samm.testbed.oversub.admission import AdmissionExecutor, LiveParams, StepRecord
from samm.testbed.oversub.cgroups import PmCgroups
from samm.testbed.oversub.collector import pm_metric
from test_oversub_live import cgroups_or_skip  # noqa: E402  (the live tests' skip rule)

pytestmark = [pytest.mark.graphite, pytest.mark.testbed]

PMS = 2
SETTING = SETTINGS["tiny"].scaled(n_pms=PMS)
SCALE = 0.6 / (PMS * SETTING.pm_cores)


# --------------------------------------------------------------------------- the admit routes
class Half:
    setting = SETTINGS["tiny"]

    def rates(self, view):
        return np.full(self.setting.n_subscribers, 0.5)

    def metadata(self):
        return {"version": "half-1"}


def admit_body(**changes):
    b = {"subscriber": 0, "cores": 8.0, "mem_gb": 32.0, "net_gbps": 2.0, "hour": 13,
         "allocated": [[4.0, 16.0, 1.0], [0.0, 0.0, 0.0], [10.0, 40.0, 2.5]], "requested_live": [8.0, 0.0, 10.0]}
    b.update(changes)
    return b


@pytest.mark.parametrize("changes, field", [
    ({"cores": 1e300}, "cores"),                       # was answered with 5e299 reserved cores
    ({"cores": MAX_VM * 2}, "cores"),
    ({"mem_gb": 1e300}, "mem_gb"),
    ({"net_gbps": 1e300}, "net_gbps"),
    ({"allocated": [[1e300, 0, 0], [0, 0, 0], [0, 0, 0]]}, "allocated"),
    ({"requested_live": [1e308, 0, 0]}, "requested_live"),
    ({"usage_history": [[0.5, 1e300, None]]}, "usage_history"),
    ({"usage_history": [[MAX_USAGE_RATE + 1, 0.1, 0.1]]}, "usage_history"),
    ({"subscriber": True}, "subscriber"),              # was read as subscriber 1
    ({"subscriber": "0"}, "subscriber"),
    ({"hour": "13"}, "hour"),
])
def test_admit_refuses_values_past_their_bounds_naming_the_field(changes, field):
    c = TestClient(create_app("half", Half()))
    r = c.post("/v1/agents/half/admit", json=admit_body(**changes))
    assert r.status_code == 422, r.text
    assert field in r.json()["detail"]


def test_batch_refuses_a_huge_request_and_the_bounds_admit_real_ones():
    c = TestClient(create_app("half", Half()))
    state = {k: v for k, v in admit_body().items() if k in ("hour", "allocated", "requested_live")}
    r = c.post("/v1/agents/half/admit/batch", json=state | {"requests": [{"subscriber": 0, "cores": 1.7e308}] * 2})
    assert r.status_code == 422 and "requests.0.cores" in r.json()["detail"]
    # the largest real VMs and a measured rate a little over 1 stay accepted
    r = c.post("/v1/agents/half/admit", json=admit_body(cores=416.0, mem_gb=12_288.0, net_gbps=200.0,
                                                         usage_history=[[1.05, None, 0.0]]))
    assert r.status_code == 200 and r.json()["reserved_cores"] == 208.0


# --------------------------------------------------------------------------- a misbehaving agent
class Agent:
    """A real HTTP server answering the admit routes with rate 0.5, as told: "ok", "version-object"
    (a JSON object as policy_version), "hang" (answers after 30 s)."""

    def __init__(self, mode: str):
        self.mode = mode
        self.calls = 0
        agent = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                agent.calls += 1
                if agent.mode == "hang":
                    time.sleep(30)
                n = len(body.get("requests", [0]))
                version = {"nested": [1, 2]} if agent.mode == "version-object" else "ok-1"
                out = json.dumps({"decisions": [{"rate": 0.5}] * n, "rate": 0.5, "policy_version": version}).encode()
                try:
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.end_headers()
                    self.wfile.write(out)
                except OSError:
                    pass  # the executor gave up on us

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def two_vm_workload(steps: int = 2) -> Workload:
    """Subscriber 0: one 16-core VM at step 0 and one at step 1, both at 0.5, to the end."""
    return Workload(n_subscribers=3, steps=steps, sub=[0, 0], arrive=[0, 1], depart=[steps, steps],
                    cores=[16.0, 16.0], mem=[64.0, 64.0], net=[4.0, 4.0], usage=np.full((2, steps), 0.5), name="audit")


def executor(graphite, store, url: str, cg: PmCgroups, run: str, workload: Workload, **params) -> AdmissionExecutor:
    return AdmissionExecutor(SETTING, workload, agent="probe", service_url=url, store=store, run=run, cgroups=cg,
                             sender=GraphiteSender(graphite.carbon_host, graphite.carbon_port),
                             render=RenderClient(graphite.render_url, timeout_s=2.0),
                             params=LiveParams(seconds_per_step=1, host_cores_per_pm_core=SCALE, reread_s=0.5,
                                               read_deadline_s=1.0, post_events=False, **params))


def test_a_non_string_policy_version_is_stored_as_text_not_a_crash(graphite, tmp_path):
    """Before: the reply's JSON object went to the store as is, the write failed and the
    KnowledgeError ended the run at its first step."""
    cgroups_or_skip()
    agent = Agent("version-object")
    store = KnowledgeStore(f"sqlite:///{tmp_path / 'k.db'}")
    try:
        with PmCgroups(PMS, quota_host_cores=SETTING.pm_cores * SCALE) as cg:
            ex = executor(graphite, store, agent.url, cg, "pv", two_vm_workload())
            ex.run(2, float(math.ceil(time.time() + 1.0)))
        d = store.decision("step0:vm0", loop="oversub-pv")
        assert d.source == "agent" and d.action["rate"] == 0.5 and d.policy_version == str({"nested": [1, 2]})
        assert ex.decisions_created == 2 and not ex.unrecorded
    finally:
        store.close()
        agent.close()


@pytest.mark.parametrize("mode", ["batch", "per-vm"])
def test_a_hung_agent_costs_the_step_its_oversubscription_not_the_run_its_timing(graphite, tmp_path, mode):
    """The agent never answers in time: each step's calls wait at most until the step starts
    (before: the 2-s timeout, past a 0.6-s lead, so every step began later than the last), and
    the requests are admitted at rate 1.0 with the reason recorded."""
    cgroups_or_skip()
    agent = Agent("hang")
    store = KnowledgeStore(f"sqlite:///{tmp_path / 'k.db'}")
    try:
        with PmCgroups(PMS, quota_host_cores=SETTING.pm_cores * SCALE) as cg:
            ex = executor(graphite, store, agent.url, cg, f"hang-{mode}", two_vm_workload(), admit_mode=mode,
                          request_timeout_s=2.0)
            records = ex.run(2, float(math.ceil(time.time() + 1.0)))
        assert ex.p.lead_s == pytest.approx(0.6)
        for r in records:
            assert r.fallbacks == r.requests == 1 and r.rates == [1.0]
            assert r.admit_ms < 1000 * (ex.p.lead_s + 0.3), [x.admit_ms for x in records]
        d = store.decision("step1:vm1", loop=f"oversub-hang-{mode}")
        assert d.source == "fallback" and d.action["rate"] == 1.0 and "Timeout" in d.reason
    finally:
        store.close()
        agent.close()


def test_per_vm_requests_left_without_time_are_admitted_without_a_call(graphite, tmp_path):
    cgroups_or_skip()
    agent = Agent("hang")
    store = KnowledgeStore(f"sqlite:///{tmp_path / 'k.db'}")
    w = Workload(n_subscribers=3, steps=1, sub=[0, 1, 2], arrive=[0, 0, 0], depart=[1, 1, 1], cores=[2.0, 2.0, 2.0],
                 mem=[8.0] * 3, net=[1.0] * 3, usage=np.full((3, 1), 0.5), name="three")
    try:
        with PmCgroups(PMS, quota_host_cores=SETTING.pm_cores * SCALE) as cg:
            ex = executor(graphite, store, agent.url, cg, "left", w, admit_mode="per-vm")
            (rec,) = ex.run(1, float(math.ceil(time.time() + 1.0)))
        assert agent.calls == 1 and rec.fallbacks == 3 and rec.admit_ms < 1000 * (ex.p.lead_s + 0.3)
        assert "no time left" in store.decision("step0:vm2", loop="oversub-left").reason
    finally:
        store.close()
        agent.close()


# --------------------------------------------------------------------------- the Knowledge store
def test_a_locked_store_loses_no_decision_and_stops_no_run(graphite, tmp_path):
    """Another connection holds SQLite's write lock for the whole run: the run finishes, every
    decision is kept (and saved by run.py as JSON lines), and written once the lock is gone.
    Before: the first refused write raised KnowledgeError out of the run."""
    cgroups_or_skip()
    path = tmp_path / "k.db"
    store = KnowledgeStore(f"sqlite:///{path}", busy_timeout_s=0.2)
    agent = Agent("ok")
    lock = sqlite3.connect(path, isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")
    try:
        with PmCgroups(PMS, quota_host_cores=SETTING.pm_cores * SCALE) as cg:
            ex = executor(graphite, store, agent.url, cg, "locked", two_vm_workload())
            ex.run(2, float(math.ceil(time.time() + 1.0)))
        assert [u["decision"]["iteration_key"] for u in ex.unrecorded] == ["step0:vm0", "step1:vm1"]
        assert ex.store_errors >= 1 and "locked" in ex.unrecorded[0]["error"]
        from samm.testbed.oversub.run import write_unrecorded

        saved = write_unrecorded(tmp_path / "unrecorded.jsonl", ex.unrecorded)
        lines = [json.loads(x) for x in saved.read_text().splitlines()]
        assert [x["iteration_key"] for x in lines] == ["step0:vm0", "step1:vm1"] and lines[0]["action"]["rate"] == 0.5
        lock.execute("ROLLBACK")
        assert ex.flush_unrecorded(force=True) == 2 and not ex.unrecorded and ex.decisions_created == 2
        assert store.decision("step1:vm1", loop="oversub-locked").action["rate"] == 0.5
    finally:
        lock.close()
        store.close()
        agent.close()


# --------------------------------------------------------------------------- a VM that dies
def test_a_killed_vm_worker_is_detected_counted_and_recorded(graphite, tmp_path):
    """Before: nothing noticed; the PM's usage fell below the simulator's without a word."""
    cgroups_or_skip()
    agent = Agent("ok")
    store = KnowledgeStore(f"sqlite:///{tmp_path / 'k.db'}")
    try:
        with PmCgroups(PMS, quota_host_cores=SETTING.pm_cores * SCALE) as cg:
            ex = executor(graphite, store, agent.url, cg, "kill", two_vm_workload(3))
            t0 = float(math.ceil(time.time() + 1.0))

            def kill():  # VM 0's worker, in the middle of step 1
                time.sleep(max(0.0, t0 + 1.5 - time.time()))
                os.kill(ex.procs[0].proc.pid, signal.SIGKILL)

            killer = threading.Thread(target=kill, daemon=True)
            killer.start()
            ex.run(3, t0)
            killer.join(5)
        assert ex.worker_exits == 1
        d = store.decision("step2:exit:vm0", loop="oversub-kill")
        assert d.action_name == "vm-exit" and d.source == "none" and d.action["exit_code"] == -signal.SIGKILL
        assert ex.decisions_created == 2  # the exit is a record, not an admission decision
    finally:
        store.close()
        agent.close()


# --------------------------------------------------------------------------- Graphite
def test_an_infinite_point_in_graphite_is_no_measurement_and_no_hot_pm(graphite, graphite_prefix, tmp_path):
    """Graphite stores and renders an inf it is sent: before, that PM-step read inf cores,
    hot, with status "ok"."""
    from fixtures_graphite import send_plaintext, wait_for_points

    store = KnowledgeStore(f"sqlite:///{tmp_path / 'k.db'}")
    try:
        ex = AdmissionExecutor(SETTING, two_vm_workload(), agent="probe", service_url="http://127.0.0.1:9",
                               store=store, run="inf", cgroups=PmCgroups(PMS, quota_host_cores=1.0),
                               sender=GraphiteSender(graphite.carbon_host, graphite.carbon_port),
                               render=RenderClient(graphite.render_url, timeout_s=2.0),
                               params=LiveParams(seconds_per_step=1, prefix=graphite_prefix, post_events=False))
        start = int(time.time()) - 30
        send_plaintext(graphite, [f"{pm_metric(graphite_prefix, 'inf', 0)} inf {start}"])  # SAMM's sender skips inf
        ex.sender.send(pm_metric(graphite_prefix, "inf", 1), 12.0, start)
        ex.sender.flush()
        wait_for_points(graphite.render_url, pm_metric(graphite_prefix, "inf", "*"), start - 1, start,
                        expect_series=2)
        rec = StepRecord(step=0, hour=0, start=float(start), pm_reserved=[0.0] * PMS, pm_sim=[0.0] * PMS)
        ex.records.append(rec)
        assert ex._read_step(rec, give_up=True)
        assert rec.pm_points == [0, 1] and math.isnan(rec.pm_used[0]) and rec.pm_used[1] == 12.0
        assert rec.pm_hot == [False, False] and rec.graphite_status == "partial" and ex.hot_events == 0
    finally:
        store.close()


# --------------------------------------------------------------------------- what the executor sends
def test_a_measured_rate_past_the_service_bound_is_sent_as_unknown(tmp_path):
    """One wild measurement (a worker measured over a sliver of time) would make the agent
    refuse the whole step (422): it goes as null, with NaN."""
    store = KnowledgeStore(f"sqlite:///{tmp_path / 'k.db'}")
    try:
        ex = AdmissionExecutor(SETTING, two_vm_workload(), agent="probe", service_url="http://127.0.0.1:9",
                               store=store, run="rates", cgroups=PmCgroups(PMS, quota_host_cores=1.0),
                               sender=GraphiteSender("127.0.0.1", 9), render=RenderClient("http://127.0.0.1:9"))
        ex.history = [np.array([0.5, MAX_USAGE_RATE * 5, np.nan]), np.array([1.02, -0.1, 0.0])]
        assert ex._state(3)["usage_history"] == [[0.5, None, None], [1.02, None, 0.0]]
    finally:
        store.close()


# --------------------------------------------------------------------------- sizes and the CLI
def test_pms_too_many_for_the_host_budget_are_refused_not_given_more_cpu(tmp_path):
    """200 PMs in 1.2 host cores is 0.006 host cores a PM, below the kernel's 1-ms quota: the
    quota was raised to 0.01 in silence, 2 host cores in all."""
    from samm.testbed.oversub.run import OversubRunOptions, run_oversub

    with pytest.raises(ValueError, match="kernel's minimum"):
        PmCgroups(200, quota_host_cores=64 * 1.2 / (200 * 64))
    with pytest.raises(ValueError, match="--pms"):
        run_oversub(OversubRunOptions(agent="grid-0.5", pms=200, steps=1, out_dir=str(tmp_path / "o")))


@pytest.mark.parametrize("args, text", [
    (["--seed", "-1"], "--seed"),
    (["--out", "/proc/samm-audit/x"], "--out"),
    (["--out", "/dev/null/x"], "--out"),
])
def test_cli_bad_values_are_a_clear_error_not_a_traceback(args, text, tmp_path):
    cgroups_or_skip()
    from click.testing import CliRunner

    from samm.cli.main import cli

    r = CliRunner().invoke(cli, ["testbed-oversub", "--agent", "grid-0.5", "--out", str(tmp_path / "o"), *args])
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit), r.output
    assert text in r.output and "Traceback" not in r.output


def test_cli_bad_knowledge_url_is_a_clear_error(tmp_path):
    cgroups_or_skip()
    from click.testing import CliRunner

    from samm.cli.main import cli
    from samm.monitor.local_graphite import missing_packages

    if missing_packages():
        pytest.skip("Graphite not installed")
    r = CliRunner().invoke(cli, ["testbed-oversub", "--agent", "grid-0.5", "--steps", "1", "--pms", "1",
                                 "--out", str(tmp_path / "o"), "--knowledge-url", "bogus://x"])
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit), r.output
    assert "unsupported database 'bogus'" in r.output


def test_cli_c2marl_without_a_setting_runs_on_its_own(tmp_path):
    """README's `samm testbed-oversub --agent c2marl --out DIR` stopped at "agent 'c2marl'
    decides for 9 subscribers, setting 'tiny' has 3": the default setting is the policy's own."""
    cgroups_or_skip()
    from click.testing import CliRunner

    from samm.cli.main import cli
    from samm.monitor.local_graphite import missing_packages

    if missing_packages():
        pytest.skip("Graphite not installed")
    r = CliRunner().invoke(cli, ["testbed-oversub", "--agent", "c2marl", "--pms", "2", "--steps", "1",
                                 "--max-vms", "3", "--seed", "1", "--out", str(tmp_path / "o"), "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.output.strip().splitlines()[-1])
    assert s["setting"] == "azure" and s["fallbacks"] == 0 and s["decisions_unrecorded"] == 0


# --------------------------------------------------------------------------- re-runs
def test_a_rerun_that_decides_otherwise_is_counted_not_passed_off_as_the_same(graphite, tmp_path):
    """The same run name again (same keys), the agent down this time: the earlier records stand
    (nothing recorded twice) and the 2 decisions this run made otherwise are counted and logged.
    Before: only `decisions_existing` = 2, as if the store held what this run did."""
    cgroups_or_skip()
    from samm.localproc import free_port

    agent = Agent("ok")
    store = KnowledgeStore(f"sqlite:///{tmp_path / 'k.db'}")
    try:
        with PmCgroups(PMS, quota_host_cores=SETTING.pm_cores * SCALE) as cg:
            first = executor(graphite, store, agent.url, cg, "again", two_vm_workload())
            first.run(2, float(math.ceil(time.time() + 1.0)))
            same = executor(graphite, store, agent.url, cg, "again", two_vm_workload())
            same.run(2, float(math.ceil(time.time() + 1.0)))
            down = executor(graphite, store, f"http://127.0.0.1:{free_port()}", cg, "again", two_vm_workload())
            down.run(2, float(math.ceil(time.time() + 1.0)))
        assert first.decisions_created == 2 and first.decisions_conflicting == 0
        assert same.decisions_existing == 2 and same.decisions_conflicting == 0
        assert down.decisions_existing == 2 and down.decisions_conflicting == 2 and down.decisions_created == 0
        assert store.decision("step0:vm0", loop="oversub-again").action["rate"] == 0.5  # the first run's
    finally:
        store.close()
        agent.close()


@pytest.mark.parametrize("changes, field", [
    ({"steps": 0}, "steps"),            # ran a whole run, then failed in its summary (numpy broadcast)
    ({"pms": 0}, "pms"),                # ZeroDivisionError
    ({"max_vms": -1}, "max_vms"),
    ({"seed": -1}, "seed"),
    ({"host_cores": float("nan")}, "host_cores"),
    ({"start_delay_s": float("nan")}, "start_delay_s"),  # "cannot convert float NaN to integer"
])
def test_run_options_are_checked_before_anything_starts(changes, field, tmp_path):
    from samm.testbed.oversub.run import OversubRunOptions, run_oversub

    with pytest.raises(ValueError, match=f"^{field} must be"):
        run_oversub(OversubRunOptions(agent="grid-0.5", out_dir=str(tmp_path / "o"), **changes))
    assert not (tmp_path / "o" / "graphite").exists()


@pytest.mark.parametrize("params, key", [
    ({"headroom": "nan"}, "headroom"),   # every admit was a 500
    ({"headroom": "inf"}, "headroom"),   # rate 1.0 to every request, in silence
    ({"n": "nan"}, "n"),
    ({"window": "0"}, "window"),
    ({"window": "-5"}, "window"),
    ({"window": "2.5"}, "window"),
])
def test_a_hosted_rule_refuses_bad_parameters_at_start_up(params, key):
    from agents.oversubscription.hosting import make_policy

    with pytest.raises(ValueError, match=f"{key} must be"):
        make_policy("nsigma", None, setting="tiny", prior="none", **params)
    assert make_policy("nsigma", None, setting="tiny", prior="none", headroom="2.5", window="12").version \
        == "nsigma(headroom=2.5, n=2, window=12)"


def test_a_hung_graphite_does_not_make_the_steps_late(tmp_path):
    """graphite-web accepts the connection and never answers: each read used its whole timeout
    past the next admission, and every step began later than the one before (1 s, then 2 s
    late in a probe); now no read runs past the next admission."""
    cgroups_or_skip()

    class Hang(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            time.sleep(30)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Hang)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    agent = Agent("ok")
    store = KnowledgeStore(f"sqlite:///{tmp_path / 'k.db'}")
    try:
        with PmCgroups(PMS, quota_host_cores=SETTING.pm_cores * SCALE) as cg:
            ex = AdmissionExecutor(SETTING, two_vm_workload(5), agent="probe", service_url=agent.url, store=store,
                                   run="ghang", cgroups=cg, sender=GraphiteSender("127.0.0.1", 9),
                                   render=RenderClient(f"http://127.0.0.1:{srv.server_address[1]}", timeout_s=1.0),
                                   params=LiveParams(seconds_per_step=1, host_cores_per_pm_core=SCALE, reread_s=0.0,
                                                     read_deadline_s=0.5, post_events=False))
            records = ex.run(5, float(math.ceil(time.time() + 1.0)))
        assert max(r.late_s for r in records) < 0.3, [r.late_s for r in records]
        assert all(r.graphite_status == "stale" and r.pm_hot == [False, False] for r in records)
        assert ex.render.timeout_s == 1.0
    finally:
        store.close()
        agent.close()
        srv.shutdown()
        srv.server_close()


def test_an_interrupted_cli_run_keeps_the_steps_it_ran_and_cleans_up(tmp_path):
    """SIGTERM in the middle of `samm testbed-oversub`: exit 143 as before, the workers, cgroups
    and Graphite stopped as before, and now the steps run so far written (steps.csv,
    summary.json with "interrupted": true). Before: nothing but knowledge.db and the logs."""
    cgroups_or_skip()
    import subprocess
    import sys
    from pathlib import Path

    from samm.monitor.local_graphite import missing_packages
    from samm.testbed.oversub.cgroups import CPU_ROOT

    if missing_packages():
        pytest.skip("Graphite not installed")
    out = tmp_path / "o"
    samm = Path(sys.executable).parent / "samm"
    p = subprocess.Popen([str(samm), "testbed-oversub", "--agent", "grid-0.5", "--pms", "2", "--steps", "30",
                          "--max-vms", "6", "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the cgroups exist: step 0 starts ~2 s later
            log = out / "testbed.log"
            if log.exists() and "PM cgroups" in log.read_text():
                break
            time.sleep(0.2)
        time.sleep(5.0)
        p.send_signal(signal.SIGTERM)
        output, _ = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 143, output
    assert (out / "summary.json").exists(), sorted(x.name for x in out.iterdir())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True and 1 <= summary["steps"] < 30
    assert (out / "steps.csv").read_text().count("\n") == summary["steps"] + 1
    assert "interrupted" in output and "Traceback" not in output
    assert not [g for g in CPU_ROOT.iterdir() if g.name.startswith(f"samm-oversub-{p.pid}")]


def test_a_worker_that_cannot_be_spawned_fails_its_vm_not_the_run(graphite, tmp_path):
    """Out of file descriptors (RLIMIT_NOFILE, real): the VMs whose workers could not be
    spawned are recorded as not placed, their reservations released, and the run goes on.
    Before: the OSError ("Too many open files") ended the run at that step."""
    cgroups_or_skip()
    import resource

    v = 16
    w = Workload(n_subscribers=3, steps=1, sub=[0] * v, arrive=[0] * v, depart=[1] * v, cores=[1.0] * v,
                 mem=[1.0] * v, net=[0.1] * v, usage=np.full((v, 1), 0.3), name="fds")
    agent = Agent("ok")
    store = KnowledgeStore(f"sqlite:///{tmp_path / 'k.db'}")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        with PmCgroups(PMS, quota_host_cores=SETTING.pm_cores * SCALE) as cg:
            ex = executor(graphite, store, agent.url, cg, "fds", w)
            resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 16, hard))
            try:
                (rec,) = ex.run(1, float(math.ceil(time.time() + 1.5)))
            finally:
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert 1 <= ex.worker_failures < v and rec.placed + ex.worker_failures == v and rec.rejected == ex.worker_failures
        assert ex.decisions_created == v
        failed = min(ex.failed_rows)
        d = store.decision(f"step0:vm{failed}", loop="oversub-fds")
        assert d.action_name == "reject" and "did not start" in d.reason
        assert rec.pm_reserved[0] == pytest.approx(0.5 * rec.placed)  # the failed VMs' reservations released
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        store.close()
        agent.close()
