"""The testbed under bad input and faults (audit regressions): options refused before anything
starts, non-finite worker arguments, a reconciler that survives a worker that cannot start and
a locked queue, billing of instances that never ran, and partial results (and no orphaned
processes) when a run times out or `samm testbed` is stopped with SIGTERM."""
from __future__ import annotations

import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner

from samm.cli.main import cli
from samm.testbed.jobqueue import JobQueue
from samm.testbed.reconciler import Reconciler, Vm
from samm.testbed import run as tb_run
from samm.testbed.run import TestbedOptions, TestbedOptionsError, check_options, run_testbed
from samm.testbed.worker import run_worker
from sim_bridge.workloads import Workload

ROOT = Path(__file__).resolve().parents[1]


def strict_json(text: str):
    def no_constants(name):
        raise ValueError(f"invalid JSON constant {name}")

    return json.loads(text, parse_constant=no_constants)


# --- options -------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, says", [
    (["--timeout", "-5"], "--timeout: timeout_s must be a finite number > 0"),
    (["--timeout", "nan"], "--timeout: timeout_s must be a finite number > 0"),
    (["--cooldown", "nan"], "--cooldown: cooldown_s must be a finite number >= 0"),
    (["--cooldown", "-60"], "--cooldown: cooldown_s must be a finite number >= 0"),
    (["--seed", "-1"], "--seed: seed must be an integer >= 0"),
    (["--agent", "threshold", "--params", '{"upper": "x"}'], "agent 'threshold'"),
    (["--agent", "lstm-ppo", "--policy", "{empty}"], "not a saved SAMM policy"),
])
def test_samm_testbed_refuses_bad_options_before_starting_anything(tmp_path, args, says):
    """Each used to start Graphite and moto, then die with a traceback (or, for --timeout -5,
    run the whole set-up to report '12 of 12 jobs unfinished after -5 s')."""
    empty = tmp_path / "empty-policy"
    empty.mkdir()
    swf = tmp_path / "t.swf"
    swf.write_text("1 0 0 60 1 -1 -1 1 -1 -1 1 1 1 1 1 -1 -1 -1\n")
    out = tmp_path / "run"
    args = [a.replace("{empty}", str(empty)) for a in args]
    res = CliRunner().invoke(cli, ["testbed", "--agent", "noop", "--workload", str(swf), "--out", str(out), *args])
    assert res.exit_code == 2, res.output
    assert says in res.output and "Traceback" not in res.output, res.output
    assert not out.exists(), "nothing may start (not even the run directory) for a bad option"


def test_samm_testbed_refuses_an_unwritable_out_dir(tmp_path):
    swf = tmp_path / "t.swf"
    swf.write_text("1 0 0 60 1 -1 -1 1 -1 -1 1 1 1 1 1 -1 -1 -1\n")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    res = CliRunner().invoke(cli, ["testbed", "--agent", "noop", "--workload", str(swf), "--out",
                                   str(blocker / "run")])
    assert res.exit_code == 2 and "--out" in res.output and "cannot write" in res.output, res.output
    assert "Traceback" not in res.output


@pytest.mark.parametrize("args, says", [
    (["--compression", "0"], "--compression must be a finite number > 0"),  # was ZeroDivisionError
    (["--compression", "nan"], "--compression must be a finite number > 0"),  # was a pydantic traceback
    (["--compression", "-1"], "--compression must be a finite number > 0"),
    (["--workload", "bogus"], "--workload: workload 'bogus'"),  # was FileNotFoundError
    (["--sim", "--workload", "bogus"], "--workload: workload 'bogus'"),
    (["--seed", "-1"], "Invalid value for '--seed'"),  # was a ValueError from numpy after start; now click's range
])
def test_samm_demo_refuses_bad_options_before_starting_anything(tmp_path, args, says):
    res = CliRunner().invoke(cli, ["demo", "--out", str(tmp_path / "report"), *args])
    assert res.exit_code == 2, res.output
    assert says in res.output and "Traceback" not in res.output, res.output
    assert not list((tmp_path / "report").glob("testbed-*")), "no testbed run may start"


def test_samm_demo_refuses_an_unwritable_out_dir(tmp_path):
    (tmp_path / "file").write_text("x")
    res = CliRunner().invoke(cli, ["demo", "--out", str(tmp_path / "file" / "report")])
    assert res.exit_code == 2 and "--out" in res.output and "Traceback" not in res.output, res.output


def test_check_options_refuses_what_the_testbed_cannot_run():
    ok = dict(agent="noop")
    assert check_options(TestbedOptions(**ok)) is not None
    for bad in (dict(compression=math.inf), dict(step_s=0.0), dict(report_every_s=math.nan),
                dict(warmup_s=-1.0), dict(initial=(0, 1, 1)), dict(initial=(1, 11, 1)), dict(initial=(1, 1)),
                dict(daemons=2)):
        with pytest.raises(TestbedOptionsError):
            check_options(TestbedOptions(**ok, **bad))


# --- worker ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw", [dict(compression=math.inf), dict(lease_s=math.inf), dict(report_every=math.inf),
                                dict(poll_s=math.inf), dict(slice_s=math.inf), dict(t0=math.nan),
                                dict(compression=math.nan)])
def test_worker_refuses_non_finite_arguments(tmp_path, kw):
    """`not v > 0` let inf through: an infinite lease never expires, so a killed worker's jobs
    would never run again; an infinite compression finishes every job at once."""
    args = dict(compression=10.0, t0=0.0, max_wall_s=0.5)  # accepted by mistake: it stops soon anyway
    args.update(kw)
    with pytest.raises(ValueError, match="finite"):
        run_worker(str(tmp_path / "q.db"), "g", "i", 1, args.pop("compression"), args.pop("t0"), **args)
    assert not (tmp_path / "q.db").exists(), "refused before opening the queue"


def test_worker_cli_refuses_infinite_compression_and_lease(tmp_path):
    for flag, value in (("--compression", "inf"), ("--lease-s", "inf")):
        argv = {"--compression": "10", "--lease-s": "5"}
        argv[flag] = value
        r = subprocess.run([sys.executable, "-m", "samm.testbed.worker", "--queue", str(tmp_path / "q.db"),
                            "--group", "g", "--instance", "i", "--cores", "1", "--t0", "0",
                            *[x for kv in argv.items() for x in kv]],
                           cwd=ROOT, capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and "finite" in r.stderr and "Traceback" not in r.stderr, r.stderr


# --- reconciler --------------------------------------------------------------------------------------
def test_reconciler_survives_a_worker_that_cannot_start_and_a_locked_queue():
    """A spawn that raises (EMFILE, a full disk) or a release that meets a locked queue used to
    end the reconciler's thread silently: the fleet then never changed again."""
    from samm.execute.moto_server import MotoServer, create_paper_asgs

    names = ("tb-audit-s", "tb-audit-m")
    procs: list[subprocess.Popen] = []
    calls = {"spawn": 0, "release": 0}

    def spawn(group, iid, cores):
        calls["spawn"] += 1
        if calls["spawn"] == 1:
            raise OSError(24, "Too many open files")
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        procs.append(p)
        return p

    def release(iid):
        calls["release"] += 1
        raise sqlite3.OperationalError("database is locked")

    with MotoServer() as moto:
        moto.reset()
        create_paper_asgs(endpoint_url=moto.endpoint_url, names=names, instance_types=("m5a.large", "m5a.xlarge"),
                          min=(1, 0), max=3, desired=1)
        asg = moto.client("autoscaling")
        rec = Reconciler(asg, {names[0]: ("S", 2), names[1]: ("M", 4)}, spawn, on_terminated=release,
                         compression=1e4, poll_s=0.05)
        rec.start()
        try:
            deadline = time.time() + 20
            while time.time() < deadline and sum(1 for v in rec.vms.values() if v.proc is not None) < 2:
                time.sleep(0.05)
            assert sum(1 for v in rec.vms.values() if v.proc is not None) == 2, (calls, rec.vms)
            assert rec._thread.is_alive() and rec.errors >= 1
            # scale M to 0 (its release fails: the queue is locked), then back to 1
            asg.set_desired_capacity(AutoScalingGroupName=names[1], DesiredCapacity=0, HonorCooldown=False)
            deadline = time.time() + 20
            while time.time() < deadline and not calls["release"]:
                time.sleep(0.05)
            assert calls["release"] == 1
            asg.set_desired_capacity(AutoScalingGroupName=names[1], DesiredCapacity=1, HonorCooldown=False)
            deadline = time.time() + 20
            while time.time() < deadline and rec.counts()["M"]["running"] < 1:
                time.sleep(0.05)
            assert rec._thread.is_alive(), "the reconciler died"
            assert rec.counts()["M"]["running"] == 1, rec.counts()
        finally:
            rec.stop()
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait(10)


# --- billing ------------------------------------------------------------------------------------------
def test_an_instance_that_never_ran_is_billed_but_not_measured_as_idle(tmp_path):
    """A VM removed (or the run ended) while it was still booting had `ready_wall=None`, i.e.
    "running at once": every step counted it as an idle running instance, halving the CPU
    utilisation here. It is billed, but never running."""
    t0 = 1_000_000.0
    q = JobQueue(tmp_path / "q.db")
    try:
        q.set_clock(t0, 60.0)
        q.submit(0, 2, 60.0, submitted_at=0.0)
        (job,) = q.lease("i-ran", 2, now_wall=t0, lease_s=30.0, clock_now=0.0)
        assert q.complete(0, "i-ran", 60.0, attempt=job.attempt)
        done = subprocess.Popen([sys.executable, "-c", "pass"])
        done.wait(30)
        tb = tb_run.Testbed.__new__(tb_run.Testbed)
        tb.opts = TestbedOptions(compression=60.0, step_s=60.0)
        tb.t0 = t0
        tb.queue = q
        tb.workload = SimpleNamespace(name="audit")
        tb.reconciler = SimpleNamespace(stopped_at=None, vms={
            "i-ran": Vm("S", "i-ran", 2, t0 - 5, t0 - 5, proc=done, stopped_wall=t0 + 1.0, spawns=1),
            "i-never": Vm("M", "i-never", 4, t0, t0 + 0.5, proc=None, stopped_wall=t0 + 1.0, spawns=0),
        })
        s = tb.summary()
    finally:
        q.close()
    assert s["mean_cpu_util"] == pytest.approx(1.0), s
    assert s["vm_seconds"]["M"] == pytest.approx(60.0)  # billed all the same
    assert s["mean_allocated_cores"] == pytest.approx(6.0)


def test_billing_refuses_a_non_positive_horizon():
    from samm.testbed.billing import GroupSpec, summarize

    for end in (0.0, -60.0, math.nan):
        with pytest.raises(ValueError, match="end_s"):
            summarize([], [], [], {"S": GroupSpec(2, 0.2, 10)}, 30.0, 0.0, end_s=end)


# --- interrupted runs ------------------------------------------------------------------------------------
@pytest.mark.graphite
@pytest.mark.testbed
def test_a_timed_out_run_keeps_its_timeline_and_a_partial_summary(tmp_path):
    """Used to raise TimeoutError with nothing written: no timeline.csv, no figures of billing
    for a run that had used VMs for minutes. Zero jobs finish here (a job far longer than the
    timeout): the partial summary is still valid JSON, billed to the current step."""
    n = 4
    wl = Workload("audit-long", np.zeros(n), np.full(n, 100_000 * 4400.0), np.ones(n, dtype=np.int32),
                  np.full(n, 0.5))
    opts = TestbedOptions(agent="noop", workload_obj=wl, compression=60.0, seed=1, timeout_s=4.0,
                          out_dir=str(tmp_path / "tb"))
    seen = {}

    def during(tb):
        seen["tb"] = tb

    with pytest.raises(TimeoutError, match="4 of 4 jobs unfinished"):
        run_testbed(opts, during=during)
    out = tmp_path / "tb"
    assert (out / "timeline.csv").read_text().count("\n") >= 2
    doc = strict_json((out / "summary.partial.json").read_text())
    assert doc["interrupted"].startswith("TimeoutError")
    s = doc["summary"]
    assert s["jobs_finished"] == 0 and s["truncated"] and s["makespan_s"] is None
    assert s["vm_cost"] > 0 and s["horizon_s"] >= 60.0
    vms = seen["tb"].reconciler.vms.values()
    assert vms and all(v.proc is None or v.proc.poll() is not None for v in vms), "a worker outlived the run"


def _pids_mentioning(text: str) -> list[str]:
    out = subprocess.run(["pgrep", "-f", text], capture_output=True, text=True).stdout.split()
    return [p for p in out if p != str(os.getpid())]


@pytest.mark.graphite
@pytest.mark.testbed
def test_sigterm_to_samm_testbed_stops_every_process_and_keeps_partial_results(tmp_path):
    """SIGTERM used to kill `samm testbed` outright: its workers (each in its own session) ran
    on forever, polling the queue, and nothing of the run was written."""
    swf = tmp_path / "long.swf"
    swf.write_text("\n".join(f"{i + 1} {i * 30} 0 600 1 -1 -1 1 -1 -1 1 1 1 1 1 -1 -1 -1" for i in range(40)) + "\n")
    out = tmp_path / "sigterm-run"
    p = subprocess.Popen([sys.executable, "-m", "samm.cli.main", "testbed", "--agent", "noop", "--workload", str(swf),
                          "--compression", "60", "--timeout", "120", "--out", str(out)],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        deadline = time.time() + 60
        while time.time() < deadline and len(list((out / "workers").glob("*.log"))) < 3:
            time.sleep(0.2)
        time.sleep(2.0)
        assert len(_pids_mentioning(str(out / "queue.db"))) >= 3, "the workers did not start"
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    assert p.returncode == 130, err[-2000:]
    assert "interrupted; partial results in" in err and "Traceback" not in err, err[-2000:]
    time.sleep(1.0)
    assert not _pids_mentioning(str(out)), "processes of the run outlived it"
    doc = strict_json((out / "summary.partial.json").read_text())
    assert doc["summary"]["vm_cost"] > 0
    assert (out / "timeline.csv").exists()


@pytest.mark.graphite
@pytest.mark.testbed
def test_sigkill_to_samm_testbed_takes_its_workers_with_it(tmp_path):
    """No handler runs on SIGKILL: the workers must die with their parent (parent-death signal)."""
    swf = tmp_path / "long.swf"
    swf.write_text("\n".join(f"{i + 1} {i * 30} 0 600 1 -1 -1 1 -1 -1 1 1 1 1 1 -1 -1 -1" for i in range(40)) + "\n")
    out = tmp_path / "sigkill-run"
    p = subprocess.Popen([sys.executable, "-m", "samm.cli.main", "testbed", "--agent", "noop", "--workload", str(swf),
                          "--compression", "60", "--timeout", "120", "--out", str(out)],
                         cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 60
        while time.time() < deadline and len(_pids_mentioning(str(out / "queue.db"))) < 3:
            time.sleep(0.2)
        assert len(_pids_mentioning(str(out / "queue.db"))) >= 3, "the workers did not start"
        p.kill()
        p.wait(10)
        deadline = time.time() + 15
        while time.time() < deadline and _pids_mentioning(str(out)):
            time.sleep(0.2)
        left = _pids_mentioning(str(out))
    finally:
        for pid in _pids_mentioning(str(out)):  # only this run's processes: they name its directory
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert not left, "workers outlived a SIGKILLed `samm testbed`"


def test_the_fidelity_table_survives_a_missing_makespan_and_a_zero_simulator_value():
    """`{None:.2f}` raised TypeError (a run where no job finished has no makespan), and a zero
    simulator value printed a `nan %` gap."""
    from samm.testbed.report import fidelity_table

    text = fidelity_table([("p", {"total_cost": 1.0, "makespan_s": None, "mean_allocated_cores": 0.0},
                            {"total_cost": 2.0, "makespan_s": 300.0, "mean_allocated_cores": 4.0})])
    assert "| p | total_cost | 1.00 | 2.00 | +100.0 % |" in text
    assert "| p | makespan_s | - | 300.00 | - |" in text
    assert "nan" not in text
