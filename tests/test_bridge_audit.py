"""Audit of the simulator bridge: faults and bad inputs reaching the JVM gateway, its step channel,
the workload readers, the environments and `samm sim run|bench` give one clear error, never a
hang, a stale answer or a traceback."""
from __future__ import annotations

import gzip
import os
import signal
import stat
import struct
import time

import numpy as np
import pytest

from sim_bridge.batch import H_STEP, SimBatch
from sim_bridge.config import SimConfig
from sim_bridge.errors import GatewayError
from sim_bridge.gateway import Gateway
from sim_bridge.workloads import seed_1551


# ------------------------------------------------------------------------------- the gateway
@pytest.mark.jvm
def test_a_jvm_killed_mid_episode_is_a_gateway_error_naming_it_and_a_new_env_starts():
    from sim_bridge.envs import CloudSimEnv

    with Gateway() as gw:
        env = CloudSimEnv(SimConfig(max_steps=50), gateway=gw)
        env.reset(seed=1)
        env.step(0)
        os.kill(gw.pid, signal.SIGKILL)
        with pytest.raises(GatewayError, match="JVM|Java gateway"):
            env.step(0)
        # not a bare BrokenPipeError from the dead socket
        with pytest.raises(GatewayError, match=r"not running \(the JVM, pid \d+, exited with code -9\)"):
            env.reset(seed=1)
        env.close()
        env.close()
    with Gateway() as fresh:
        env = CloudSimEnv(SimConfig(max_steps=50), gateway=fresh)
        obs, _ = env.reset(seed=1)
        assert obs.shape == (7,)
        env.close()


def _proc_state(pid: int) -> str:
    """"T" once every thread of the process is stopped, else the first other state letter (/proc)."""
    states = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                states.add(f.read().rsplit(")", 1)[1].split()[0])
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
    return "T" if states <= {"T", "t"} else sorted(states - {"T", "t"})[0]


@pytest.mark.jvm
def test_a_stopped_jvm_fails_a_control_call_after_its_timeout_naming_it():
    """Py4J calls had no read timeout: a SIGSTOPped JVM hung `reset` (and everything after it) for ever."""
    with Gateway(call_timeout_s=2) as gw:
        os.kill(gw.pid, signal.SIGSTOP)
        # the stop is delivered asynchronously: on a loaded machine a call sent at once was answered
        deadline = time.monotonic() + 30
        while _proc_state(gw.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            with pytest.raises(GatewayError, match=rf"pid {gw.pid}\) did not answer ping within 2 s"):
                gw.call("ping")
        finally:
            os.kill(gw.pid, signal.SIGCONT)
        assert gw.call("ping").startswith("samm-gateway")  # answers again once resumed


def _read_frame(sock) -> bytes:
    def exactly(n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = sock.recv(n - len(out))
            assert chunk, "the JVM closed the connection"
            out += chunk
        return out

    status, length = struct.unpack(">ii", exactly(8))
    assert status == 0
    return exactly(length)


@pytest.mark.jvm
def test_a_step_channel_call_cut_short_does_not_hand_its_reply_to_the_next_call():
    cfg = SimConfig(action_mode="per-type")
    n = 64
    envs, seeds = np.arange(n), np.arange(n) + 1
    with Gateway() as gw:
        fast = SimBatch(cfg, seed_1551(), n, gateway=gw, fast=True)
        slow = SimBatch(cfg, seed_1551(), n, gateway=gw, fast=False)
        ch = gw.step_channel()
        spy = ch.sock.dup()  # keeps the connection open once the client drops it, to await the late reply
        try:
            # resetting 64 envs takes the JVM milliseconds at the very least: the call is cut after sending
            ch.sock.settimeout(1e-6)
            with pytest.raises(GatewayError, match="no reply on the step channel"):
                fast.reset(envs, seeds)
            spy.settimeout(60)
            late = _read_frame(spy)  # the JVM did reset: its answer went to the dropped connection
        finally:
            spy.close()
        assert late == slow.reset_records(envs, seeds)
        zeros = np.zeros((n, cfg.n_types))
        for _ in range(3):  # the next calls get their own answers, not the one left in the socket
            a, b = fast.step(zeros), slow.step(zeros)
            np.testing.assert_array_equal(a.header, b.header)
        assert int(a.header[0, H_STEP]) == 3


@pytest.mark.jvm
def test_a_gateway_that_exits_at_start_is_one_line_saying_so(tmp_path):
    bad = tmp_path / "bad.jar"
    bad.write_bytes(b"not a jar")
    with pytest.raises(GatewayError) as err:
        Gateway(jar=bad, start_timeout_s=60)
    msg = str(err.value)
    assert "exited with code 1 before reporting its port" in msg and "corrupt jarfile" in msg
    assert "\n" not in msg and "within 60 s" not in msg


# --------------------------------------------------------------------------- SWF workloads
GOOD_SWF = ("1 0 5 100 2 -1 -1 2 100 -1 1 1 1 1 1 -1 -1 -1\n"
            "2 10 5 50 1 -1 -1 1 100 -1 1 1 1 1 1 -1 -1 -1\n")


@pytest.mark.parametrize("third_record, expected", [
    ("3 20 5 50 1", r"line 4: an SWF record needs 18 fields, found 5"),
    ("3 abc 5 50 1 -1 -1 1 100 -1 1 1 1 1 1 -1 -1 -1", r"line 4: field 2 \(submit time\) is not a number: 'abc'"),
    ("3 20 5 nan 1 -1 -1 1 100 -1 1 1 1 1 1 -1 -1 -1", r"line 4: field 4 \(run time\) is nan, not a finite"),
    ("3 nan 5 50 1 -1 -1 1 100 -1 1 1 1 1 1 -1 -1 -1", r"line 4: field 2 \(submit time\) is nan, not a finite"),
    ("3 20 5 inf 1 -1 -1 1 100 -1 1 1 1 1 1 -1 -1 -1", r"line 4: field 4 \(run time\) is inf, not a finite"),
    ("3 20 5 50 1 -1 -1 1e12 100 -1 1 1 1 1 1 -1 -1 -1", r"line 4: field 8 \(requested processors\) is 1e\+12, out of range"),
])
def test_a_malformed_swf_record_is_an_error_naming_file_line_and_field(tmp_path, third_record, expected):
    from sim_bridge.workloads import load_workload

    path = tmp_path / "bad.swf"
    path.write_text("; a header line\n" + GOOD_SWF + third_record + "\n")
    with pytest.raises(ValueError, match="bad.swf " + expected):
        load_workload(path, core_cap=8)


def test_a_binary_or_truncated_gzip_workload_is_an_error_naming_the_file(tmp_path):
    from sim_bridge.workloads import load_workload

    full = gzip.compress(GOOD_SWF.encode() * 200)
    (tmp_path / "cut.swf.gz").write_bytes(full[: len(full) // 2])
    with pytest.raises(ValueError, match=r"cut\.swf\.gz: not a readable gzip file"):
        load_workload(tmp_path / "cut.swf.gz")
    (tmp_path / "noise.swf").write_bytes(bytes(range(256)) * 20)
    with pytest.raises(ValueError, match=r"noise\.swf line \d+: "):
        load_workload(tmp_path / "noise.swf")


def test_valid_swf_records_parse_as_before(tmp_path):
    from sim_bridge.workloads import read_swf_table

    path = tmp_path / "ok.swf"
    path.write_text("; header\n\n" + GOOD_SWF + "# a comment line\n")
    table = read_swf_table(path)
    assert table.shape == (2, 18) and table[1, 3] == 50.0


def test_sim_run_names_a_truncated_gzip_trace_in_one_line(tmp_path):
    from click.testing import CliRunner

    from samm.cli.main import cli

    full = gzip.compress(GOOD_SWF.encode() * 200)
    (tmp_path / "cut.swf.gz").write_bytes(full[: len(full) // 2])
    r = CliRunner().invoke(cli, ["sim", "run", "--workload", str(tmp_path / "cut.swf.gz"), "--max-steps", "2"])
    assert r.exit_code == 2, r.output
    assert "not a readable gzip file" in r.output and "Aborted" not in r.output


# ------------------------------------------------------------------------------- actions
@pytest.mark.parametrize("mode, bad", [("paper", 1.5), ("paper", float("nan")), ("paper", "1"),
                                       ("per-type", [0.5, 1, 1])])
def test_actions_that_are_not_whole_numbers_are_rejected_not_truncated(mode, bad):
    from sim_bridge.actions import to_deltas

    with pytest.raises(ValueError, match="whole numbers"):
        to_deltas(mode, np.asarray([bad]) if mode == "paper" else np.asarray([bad], dtype=object), 3)
    # whole numbers of any dtype keep working
    assert to_deltas("paper", np.array([1.0, 2, 0]), 3).tolist() == [[1, 0, 0], [-1, 0, 0], [0, 0, 0]]
    assert to_deltas("per-type", np.array([[2, 1, 0]], dtype=np.uint8), 3).tolist() == [[1, 0, -1]]


@pytest.mark.jvm
def test_env_step_with_an_action_outside_the_space_is_a_value_error_and_the_episode_goes_on():
    from sim_bridge.envs import CloudSimEnv

    with Gateway() as gw:
        env = CloudSimEnv(SimConfig(max_steps=50), gateway=gw)
        try:
            env.reset(seed=3)
            for bad in (1.5, 7, -1, np.nan):
                with pytest.raises(ValueError):
                    env.step(bad)
            _, _, _, _, info = env.step(0)
            assert info["step"] == 1 and info["vm_running"].tolist() == [1, 1, 1]
        finally:
            env.close()


# --------------------------------------------------------------------------- closed envs
@pytest.mark.jvm
def test_closing_twice_is_fine_and_a_step_after_close_is_a_clear_error():
    from sim_bridge.envs import CloudSimEnv, CloudSimVectorEnv
    from sim_bridge.errors import BridgeError

    with Gateway() as gw:
        env = CloudSimEnv(SimConfig(max_steps=50), gateway=gw)
        env.reset(seed=0)
        env.step(0)
        env.close()
        env.close()
        with pytest.raises(RuntimeError, match=r"call reset\(\) before step\(\)"):
            env.step(0)
        venv = CloudSimVectorEnv(2, SimConfig(max_steps=50), gateway=gw)
        venv.reset(seed=0)
        venv.close()
        venv.close()
        with pytest.raises(BridgeError, match="batch is closed"):
            venv.step(np.zeros(2, dtype=np.int64))
        with pytest.raises(BridgeError, match="batch is closed"):
            venv.reset(seed=0)
        with pytest.raises(BridgeError, match="batch is closed"):
            venv.batch.job_stats(0)
        assert gw.call("ping")


# ------------------------------------------------------------------------- samm sim run|bench
@pytest.mark.parametrize("args, named", [
    (["--seed", "-1", "--policy", "random"], "--seed"),
    (["--seed", str(2**64)], "--seed"),
    (["--time-compression", "0"], "--time-compression must be positive"),
    (["--mips-per-core", "0"], "--mips-per-core must be positive"),
    (["--max-jobs", "0"], "--max-jobs must be positive"),
    (["--max-steps", "0"], "--max-steps must be positive"),
])
def test_sim_run_bad_numbers_are_one_line_naming_the_option(args, named):
    from click.testing import CliRunner

    from samm.cli.main import cli

    r = CliRunner().invoke(cli, ["sim", "run", *args])
    assert r.exit_code == 2, r.output
    assert named in r.output and "Traceback" not in r.output
    assert len([ln for ln in r.output.splitlines() if ln.startswith(("error", "Error"))]) == 1


def test_sim_bench_names_a_gateway_that_cannot_start_in_one_line(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from samm.cli.main import cli
    from sim_bridge.gateway import close_shared_gateway

    fake = tmp_path / "jdk" / "bin" / "java"
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\necho 'no JVM here' >&2\nexit 3\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    close_shared_gateway()  # the bench must start its own (failing) JVM
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    r = CliRunner().invoke(cli, ["sim", "bench", "--steps", "1", "--repeats", "1"])
    assert r.exit_code == 2, r.output
    assert r.output.startswith("error: the Java gateway") and "exited with code 3" in r.output
    assert "no JVM here" in r.output and len(r.output.strip().splitlines()) == 1


# ------------------------------------------------------------------------- Ray rollout workers
@pytest.mark.jvm
@pytest.mark.slow  # starting a Ray cluster takes 10-20 s on a loaded 2-core machine
def test_a_rollout_worker_whose_jvm_dies_is_replaced_like_a_dead_worker():
    ray = pytest.importorskip("ray", reason="the ray extra is not installed")
    import psutil

    from sim_bridge.ray_batch import RaySimBatch, RolloutWorkerLost, connect

    started_here = not ray.is_initialized()
    connect("local", num_cpus=2)
    b = RaySimBatch(SimConfig(), seed_1551(), 2, workers=2)
    try:
        b.reset([0, 1], [1, 2])
        worker = psutil.Process(ray.get(b.actors[1].pid.remote()))
        jvm = next(c for c in worker.children(recursive=True) if "samm-gateway" in " ".join(c.cmdline()))
        jvm.kill()  # the worker process reaps it only when it next looks: wait for the zombie
        deadline = time.monotonic() + 30
        while jvm.is_running() and jvm.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(RolloutWorkerLost, match="worker"):
            b.step(np.zeros((2, b.n_types)))
        assert b.replaced == 1
        b.reset([0, 1], [1, 2])  # the replacement's envs start afresh
        assert b.step(np.zeros((2, b.n_types))).header.shape[0] == 2
    finally:
        b.close()
        if started_here:
            ray.shutdown()


@pytest.mark.jvm
def test_a_jvm_out_of_memory_is_a_simulator_error_and_the_channel_stays_usable():
    from sim_bridge.errors import SimulatorError

    cfg = SimConfig(action_mode="per-type")
    with Gateway() as gw:  # 1 GiB heap: a million-env reply (1.5 GB) cannot be allocated
        batch = SimBatch(cfg, seed_1551(), 2, gateway=gw)
        batch.reset([0, 1], [1, 2])
        huge = np.zeros(1_000_000, dtype=np.int64)
        with pytest.raises(SimulatorError, match="OutOfMemoryError"):
            batch.reset(huge, huge)  # over the step channel
        assert batch.step(np.zeros((2, cfg.n_types))).header.shape[0] == 2
        # a request over the channel's frame limit: the JVM would drop the connection unanswered
        over = np.zeros(1_500_000, dtype=np.int64)
        with pytest.raises(SimulatorError, match="over its limit"):
            batch.reset(over, over)
        assert batch.step(np.zeros((2, cfg.n_types))).header.shape[0] == 2


def test_a_workload_mix_that_is_not_yaml_is_a_value_error_naming_the_file(tmp_path):
    from sim_bridge.workloads.mix import load_mix

    (tmp_path / "broken.yaml").write_text("name: [unclosed\n")
    with pytest.raises(ValueError, match=r"broken\.yaml: not a valid YAML file"):
        load_mix(tmp_path / "broken.yaml")
    (tmp_path / "binary.yaml").write_bytes(b"\x8b\xff\x00" * 100)
    with pytest.raises(ValueError, match=r"binary\.yaml: not a valid YAML file"):
        load_mix(tmp_path / "binary.yaml")


def test_a_java_that_cannot_be_executed_is_a_gateway_error(tmp_path, monkeypatch):
    fake = tmp_path / "jdk" / "bin" / "java"
    fake.parent.mkdir(parents=True)
    fake.write_text("not a program")  # not executable
    fake.chmod(0o644)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    with pytest.raises(GatewayError, match=r"cannot start the Java gateway with .*jdk/bin/java"):
        Gateway()
