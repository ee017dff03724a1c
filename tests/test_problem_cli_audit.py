"""The problem verbs' bad input (samm/cli/{microservices,oversub,deferrable}.py): a typo ends in one
line naming the option and exit status 2, never a run of hours, a fork of thousands of workers, a
ceiling chosen on the experiment's own seeds or a report of twenty lines; SIGTERM on the microservice
testbed unwinds and writes what was measured, like Ctrl-C."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from fixtures_reclaimer import tiny_reclaimer_policy
from samm.cli.main import cli

REPO = Path(__file__).resolve().parents[1]
#: a run the fix refuses would otherwise sleep for hours: the test fails on this instead of hanging
REFUSAL_TIMEOUT_S = 60


def _samm(*args: str) -> subprocess.CompletedProcess:
    """The verb in its own process; one still running after REFUSAL_TIMEOUT_S gets Ctrl-C (so a
    testbed cleans up its cgroups and workers) and fails the test."""
    p = subprocess.Popen([sys.executable, "-m", "samm.cli.main", *args], cwd=REPO, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        out, err = p.communicate(timeout=REFUSAL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGINT)
        try:
            p.communicate(timeout=REFUSAL_TIMEOUT_S)
        finally:
            if p.poll() is None:
                p.kill()
                p.communicate()
        pytest.fail(f"samm {' '.join(args)} was still running after {REFUSAL_TIMEOUT_S} s")
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def _policy_dir(tmp_path: Path) -> Path:
    return tiny_reclaimer_policy(tmp_path)


def test_deferrable_refuses_more_workers_than_the_fleet_has_cores(tmp_path):
    # each worker is a process started before slot 0: --workers 100000 forked until the machine gave out
    r = CliRunner().invoke(cli, ["testbed-deferrable", "--slots", "1", "--slot-seconds", "0.1", "--agent", "tetris",
                                 "--workers", "25", "--out", str(tmp_path / "run")])
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit), r.output
    assert "--workers 25" in r.output and "24 cores" in r.output
    assert not (tmp_path / "run").exists()


def test_deferrable_refuses_a_slot_slower_than_real_time(tmp_path):
    r = _samm("testbed-deferrable", "--slots", "1", "--slot-seconds", "1e9", "--agent", "tetris",
              "--out", str(tmp_path / "run"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--slot-seconds" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "run").exists()


def test_oversub_refuses_a_step_slower_than_real_time(tmp_path):
    from samm.testbed.oversub.cgroups import unavailable_reason

    if unavailable_reason():
        pytest.skip(f"PM cgroups cannot be made here: {unavailable_reason()}")
    r = _samm("testbed-oversub", "--agent", "grid-0.5", "--pms", "1", "--steps", "1", "--seconds-per-step",
              "100000000", "--out", str(tmp_path / "run"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--seconds-per-step" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("seeds", ["1-5", "9,101"])
def test_reclaimer_ceiling_refuses_the_experiments_seeds_as_validation_seeds(tmp_path, seeds):
    policy = _policy_dir(tmp_path)
    r = CliRunner().invoke(cli, ["reclaimer-ceiling", "--policy", str(policy), "--out", str(tmp_path / "q"),
                                 "--eval-seeds", seeds, "--grid", "3"])
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit), r.output
    assert "--eval-seeds" in r.output and not (tmp_path / "q").exists()


@pytest.mark.parametrize("grid", ["a,b", "3,nan", "inf"])
def test_reclaimer_ceiling_names_a_grid_value_that_is_not_a_number(tmp_path, grid):
    policy = _policy_dir(tmp_path)
    r = CliRunner().invoke(cli, ["reclaimer-ceiling", "--policy", str(policy), "--out", str(tmp_path / "q"),
                                 "--eval-seeds", "101", "--grid", grid])
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit), r.output
    assert "--grid" in r.output and not (tmp_path / "q").exists()


@pytest.mark.parametrize("text", ["services: [\n", "foo: 1\n"], ids=["yaml", "schema"])
def test_microservices_names_a_malformed_topology_file_in_one_line(tmp_path, text):
    topo = tmp_path / "app.yaml"
    topo.write_text(text)
    # a dead engine socket: should the topology pass, the run fails at once instead of starting Docker
    r = CliRunner().invoke(cli, ["testbed-microservices", "--topology", str(topo), "--seconds", "2", "--warmup",
                                 "0", "--docker-host", f"unix://{tmp_path}/none.sock", "--out", str(tmp_path / "run")])
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit), r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and "--topology" in lines[0] and str(topo) in lines[0], r.output


class _SilentEngine:
    """A unix socket that accepts the Docker client and never answers: the run blocks in its first
    engine call, where a signal finds it."""

    def __init__(self, path: Path):
        self.server = socket.socket(socket.AF_UNIX)
        self.server.bind(str(path))
        self.server.listen(8)
        self.connected = threading.Event()
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.conns.append(conn)
            self.connected.set()

    def close(self):
        for c in self.conns:
            c.close()
        self.server.close()


def test_microservices_sigterm_unwinds_and_writes_the_seconds_run_so_far(tmp_path):
    sock = Path("/tmp") / f"samm-audit-{os.getpid()}.sock"   # AF_UNIX paths are short; tmp_path may not be
    sock.unlink(missing_ok=True)
    engine = _SilentEngine(sock)
    out = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-m", "samm.cli.main", "testbed-microservices", "--docker-host",
                          f"unix://{sock}", "--seconds", "2", "--warmup", "0", "--out", str(out)], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        assert engine.connected.wait(REFUSAL_TIMEOUT_S), "the run never called the engine"
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=REFUSAL_TIMEOUT_S)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
        engine.close()
        sock.unlink(missing_ok=True)
    assert p.returncode == 143, err
    assert "interrupted" in err and "Traceback" not in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] is False and "143" in summary["error"]


@pytest.mark.parametrize("url", ["notaurl", "http://", "http://[::1"])
def test_deferrable_refuses_a_service_url_no_call_can_use(tmp_path, url):
    # it ran the whole episode with every call failed (agent errors), then ended 0
    r = CliRunner().invoke(cli, ["testbed-deferrable", "--slots", "1", "--slot-seconds", "0.1", "--agent", "tetris",
                                 "--service-url", url, "--out", str(tmp_path / "run")])
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit), r.output
    assert "--service-url" in r.output and not (tmp_path / "run").exists()


def test_oversub_refuses_a_service_url_no_call_can_use(tmp_path):
    from samm.testbed.oversub.cgroups import unavailable_reason

    if unavailable_reason():
        pytest.skip(f"PM cgroups cannot be made here: {unavailable_reason()}")
    # it admitted every request without oversubscription after a failed call, then ended 0
    r = CliRunner().invoke(cli, ["testbed-oversub", "--agent", "grid-0.5", "--pms", "1", "--steps", "1",
                                 "--service-url", "notaurl", "--out", str(tmp_path / "run")])
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit), r.output
    assert "--service-url" in r.output and not (tmp_path / "run").exists()


def test_deferrable_refuses_a_run_name_its_graphite_counters_cannot_carry(tmp_path):
    # a carbon stand-in that records what arrives: "a b" had every counter refused, the run ending 0
    carbon = socket.create_server(("127.0.0.1", 0))
    received: list[bytes] = []

    def collect():
        while True:
            try:
                conn, _ = carbon.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(65536):
                    received.append(data)

    threading.Thread(target=collect, daemon=True).start()
    try:
        r = CliRunner().invoke(cli, ["testbed-deferrable", "--slots", "1", "--slot-seconds", "0.1", "--agent",
                                     "tetris", "--graphite", f"127.0.0.1:{carbon.getsockname()[1]}", "--run-name",
                                     "a b", "--out", str(tmp_path / "run")])
    finally:
        carbon.close()
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit), (r.output, received)
    assert "--run-name" in r.output and not (tmp_path / "run").exists()


def test_microservices_refuses_a_warmup_of_years(tmp_path):
    # the engine, containers and Locust started, then step 0 waited for --warmup 1e9 seconds
    r = CliRunner().invoke(cli, ["testbed-microservices", "--seconds", "2", "--warmup", "1e9", "--docker-host",
                                 f"unix://{tmp_path}/none.sock", "--out", str(tmp_path / "run")])
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit), r.output
    assert "--warmup" in r.output and not (tmp_path / "run").exists()


def test_microservices_refuses_users_far_beyond_the_topologys_range(tmp_path):
    """--users had no bound: Locust spawns every user in the first second (10**6 exhausted memory
    after the engine and the containers had started). 4x the declared range is still taken."""
    r = CliRunner().invoke(cli, ["testbed-microservices", "--seconds", "2", "--users", "65", "--docker-host",
                                 f"unix://{tmp_path}/none.sock", "--out", str(tmp_path / "run")])
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit), r.output
    assert "--users 65 is more than 4x the 16 users" in r.output and not (tmp_path / "run").exists()
