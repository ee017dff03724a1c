"""The testbed under faults, second audit pass (regressions): a partial summary that counted the
fleet's stop as re-queues, a second testbed that wiped a live run's directory, a hung worker left
unreaped with its jobs held at stop, the AWS proxy cut off by an upstream that dies mid-answer,
and queue rows with non-finite times or RAM."""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from samm.testbed.aws_proxy import AwsFaultProxy
from samm.testbed.jobqueue import JobQueue
from samm.testbed.reconciler import Reconciler
from samm.testbed import run as tb_run
from samm.testbed.run import TestbedOptions, TestbedOptionsError, run_testbed
from sim_bridge.workloads import Workload


def _long_jobs(n: int) -> Workload:
    """`n` one-core jobs at t=0, far longer than any test run: they are running when it stops."""
    return Workload("audit2-long", np.zeros(n), np.full(n, 100_000 * 4400.0), np.ones(n, dtype=np.int32),
                    np.full(n, 0.5))


def _wait_until(pred, timeout_s: float, what: str) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


# --- partial results ---------------------------------------------------------------------------------
@pytest.mark.graphite
@pytest.mark.testbed
def test_a_partial_summary_keeps_running_jobs_running_not_requeued(tmp_path):
    """Stopping the fleet for the partial summary SIGTERMs the workers, which hand their jobs
    back: the summary then reported every running job as re-queued, and as waiting from the
    stop to the end of the step (mean wait ~64 s for jobs that started at once)."""
    opts = TestbedOptions(agent="noop", workload_obj=_long_jobs(4), compression=60.0, seed=1, timeout_s=4.0,
                          out_dir=str(tmp_path / "tb"))
    with pytest.raises(TimeoutError):
        run_testbed(opts)
    s = json.loads((tmp_path / "tb" / "summary.partial.json").read_text())["summary"]
    assert s["jobs_requeued"] == 0, s
    # the initial fleet (2 + 4 + 8 cores) starts all four at once: their waits are the workers' start-up
    assert s["mean_wait_s"] < 30.0, s
    assert 0.0 < s["busy_core_ratio"] <= 1.0, s


def _try_start(opts: TestbedOptions):
    """Start a second testbed; the error that refused it (None: it started)."""
    second = tb_run.Testbed(opts)
    try:
        second.start()
        return None
    except TestbedOptionsError as exc:
        return exc
    finally:
        second.close()


@pytest.mark.graphite
@pytest.mark.testbed
def test_a_second_testbed_in_a_live_run_directory_or_process_is_refused(tmp_path):
    """A second testbed in the same directory (two `samm testbed` with the default --out) used to
    delete the live run's queue.db and its Graphite directory before starting its own; one in the
    same process, even in another directory, reset moto's (process-global) state: the first
    run's groups vanished and its workers were killed."""
    out = tmp_path / "tb"
    opts = TestbedOptions(agent="noop", workload_obj=_long_jobs(2), compression=60.0, seed=1, timeout_s=5.0,
                          out_dir=str(out))
    seen: dict = {}

    def during(tb):
        seen["same_dir"] = _try_start(TestbedOptions(agent="noop", workload_obj=_long_jobs(1), compression=60.0,
                                                     out_dir=str(out)))
        seen["files_kept"] = (out / "queue.db").exists() and (out / "graphite").exists()
        seen["same_process"] = _try_start(TestbedOptions(agent="noop", workload_obj=_long_jobs(1),
                                                         compression=60.0, out_dir=str(tmp_path / "other")))
        time.sleep(1.0)  # the first run's reconciler polls every 0.2 s
        seen["fleet_kept"] = all(vm.stopped_wall is None for vm in tb.reconciler.vms.values())

    with pytest.raises(TimeoutError):
        run_testbed(opts, during=during)
    err = seen.get("same_dir")
    assert isinstance(err, TestbedOptionsError) and err.option == "out_dir" and "another testbed" in str(err), seen
    assert seen["files_kept"], "the refused testbed deleted the live run's files"
    err = seen.get("same_process")
    assert isinstance(err, TestbedOptionsError) and "in this process" in str(err), seen
    assert seen["fleet_kept"], "the refused testbed terminated the live run's instances"
    # the first run's lock and claim went with it: the directory and the process can be used again
    again = tb_run.Testbed(TestbedOptions(agent="noop", workload_obj=_long_jobs(1), out_dir=str(out)))
    try:
        again._lock_out_dir()
        again._claim_process()
    finally:
        again.close()


# --- a hung worker --------------------------------------------------------------------------------------
def test_stop_kills_reaps_and_releases_a_hung_worker(tmp_path):
    """A stopped (hung) worker ignores SIGTERM: `Reconciler.stop` killed it after 5 s but left it
    unreaped and its leased job held, so the queue still showed it running on a gone instance."""
    from samm.execute.moto_server import MotoServer, create_paper_asgs

    qpath = tmp_path / "queue.db"
    q = JobQueue(qpath)
    t0 = time.time()
    q.set_clock(t0, 10.0)
    q.submit(0, 1, 1e6, 0.0)
    name = "tb-audit2-s"

    def spawn(group, iid, cores):
        return subprocess.Popen([sys.executable, "-m", "samm.testbed.worker", "--queue", str(qpath), "--group", group,
                                 "--instance", iid, "--cores", str(cores), "--compression", "10", "--t0", repr(t0),
                                 "--lease-s", "60", "--log-level", "ERROR"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    with MotoServer() as moto:
        moto.reset()
        create_paper_asgs(endpoint_url=moto.endpoint_url, names=(name,), instance_types=("m5a.large",),
                          min=(1,), max=1, desired=1)
        rec = Reconciler(moto.client("autoscaling"), {name: ("S", 2)}, spawn,
                         on_terminated=lambda iid: q.release_worker(iid), compression=1e4, poll_s=0.05)
        rec.start()
        vm = None
        try:
            _wait_until(lambda: q.counters(0, 0).running == 1, 30, "the worker to lease the job")
            vm = next(iter(rec.vms.values()))
            vm.proc.send_signal(signal.SIGSTOP)
        finally:
            rec.stop()
            if vm is not None and vm.proc.returncode is None:
                vm.proc.kill()
                vm.proc.wait(10)
                pytest.fail("the hung worker was left unreaped")
    try:
        assert vm.proc.returncode == -signal.SIGKILL
        job = q.stats()[0]
        assert job.state == "waiting" and job.requeues == 1, job
    finally:
        q.close()


# --- the AWS proxy --------------------------------------------------------------------------------------
def test_the_aws_proxy_answers_502_when_the_upstream_cuts_its_answer():
    """An upstream that dies mid-answer (moto restarting) raised http.client's BadStatusLine or
    IncompleteRead, not an OSError: the handler thread died with a traceback and the daemon's
    request got its connection dropped instead of a retryable 502."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    stop = threading.Event()

    def garbage():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    conn.recv(65536)
                    conn.sendall(b"this is not HTTP\r\n\r\n")
                except OSError:
                    pass

    t = threading.Thread(target=garbage, daemon=True)
    t.start()
    host, port = srv.getsockname()
    try:
        with AwsFaultProxy(f"http://{host}:{port}") as proxy:
            req = urllib.request.Request(proxy.endpoint_url + "/", data=b"Action=DescribeAutoScalingGroups",
                                         method="POST")
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(req, timeout=20)
            assert err.value.code == 502
            assert proxy.snapshot()["DescribeAutoScalingGroups"]["forwarded"] == 1
    finally:
        stop.set()
        t.join(5)
        srv.close()


# --- the queue ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("row, says", [
    ((0, 1, float("inf"), 0.0), "finite runtime_s"),
    ((0, 1, 10.0, float("nan")), "finite submitted_at"),
    ((0, 1, 10.0, float("inf")), "finite submitted_at"),
    ((0, 1, 10.0, 0.0, float("nan")), "ram_gb"),
    ((0, 1, 10.0, 0.0, -1.0), "ram_gb"),
])
def test_the_queue_refuses_non_finite_times_and_ram(tmp_path, row, says):
    """An infinite runtime held a worker's cores forever; a NaN submission was never counted as
    waiting or billed; a NaN RAM reached Graphite as the instance's RAM. All were stored."""
    q = JobQueue(tmp_path / "q.db")
    try:
        with pytest.raises(ValueError, match=says):
            q.submit_many([row])
        assert q.stats() == []
    finally:
        q.close()


def test_samm_testbed_in_a_directory_another_run_holds_is_one_line(tmp_path):
    """The refusal reached `samm testbed` as a traceback."""
    import fcntl
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "out"
    out.mkdir()
    with open(out / "testbed.lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        r = subprocess.run([str(Path(sys.executable).with_name("samm")), "testbed", "--agent", "noop", "--out",
                            str(out), "--timeout", "60"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"error: --out {out}: " in r.stderr and "another testbed" in r.stderr and "Traceback" not in r.stderr
