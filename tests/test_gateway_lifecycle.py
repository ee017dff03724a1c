"""The JVM is started by Python on a loopback port and never outlives it."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import psutil
import pytest

from sim_bridge.gateway import Gateway
from sim_bridge.batch import HEADER

pytestmark = pytest.mark.jvm


def wait_gone(pid: int, timeout: float = 15.0) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.1)
    return False


def test_binds_loopback_on_a_free_port_and_stops_on_close():
    with Gateway() as gw:
        assert gw.version.startswith("samm-gateway") and "cloudsimplus 8.5.7" in gw.version
        conns = [c for c in psutil.Process(gw.pid).net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN]
        assert conns and all(c.laddr.ip == "127.0.0.1" for c in conns)
        assert gw.port in {c.laddr.port for c in conns} and gw.port != 25333
        pid = gw.pid
    assert wait_gone(pid)


def test_two_gateways_get_different_ports():
    with Gateway() as a, Gateway() as b:
        assert a.port != b.port


def test_jvm_dies_when_python_is_killed_hard():
    code = textwrap.dedent("""
        import sys, time
        from sim_bridge.gateway import Gateway
        gw = Gateway()
        print(gw.pid, flush=True)
        time.sleep(600)
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        jvm_pid = int(child.stdout.readline())
        assert psutil.pid_exists(jvm_pid)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
        assert wait_gone(jvm_pid), "the JVM outlived its killed Python parent"
    finally:
        if child.poll() is None:
            child.kill()


def test_jvm_stops_at_interpreter_exit():
    code = "from sim_bridge.gateway import shared_gateway; print(shared_gateway().pid, flush=True)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    jvm_pid = int(out.stdout.strip())
    assert wait_gone(jvm_pid)


def test_java_errors_surface_as_simulator_errors():
    from sim_bridge.errors import SimulatorError

    with Gateway() as gw:
        with pytest.raises(SimulatorError):
            gw.call("step", 12345, bytearray(b"\\x00"))
        assert gw.call("ping")  # still healthy after an error


def test_step_channel_matches_py4j_step_and_rejects_strangers():
    import socket

    from sim_bridge.batch import SimBatch
    from sim_bridge.config import SimConfig
    from sim_bridge.workloads import seed_1551

    cfg = SimConfig(action_mode="per-type")
    with Gateway() as gw:
        fast = SimBatch(cfg, seed_1551(), 3, gateway=gw, fast=True)
        slow = SimBatch(cfg, seed_1551(), 3, gateway=gw, fast=False)
        fast.reset([0, 1, 2], [4, 5, 6])
        slow.reset([0, 1, 2], [4, 5, 6])
        rng = np.random.default_rng(1)
        for _ in range(60):
            a = rng.integers(-1, 2, size=(3, 3))
            np.testing.assert_array_equal(fast.step(a).header, slow.step(a).header)
        # the channel listens on loopback and drops a client without the token
        port = gw.step_channel().sock.getpeername()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"0" * 32 + b"\x00\x00\x00\x01\x00\x00\x00\x09" + b"\x00" * 9)
            assert s.recv(1) == b""  # closed without a reply
        # a bad batch id is an error message, not a dead channel
        from sim_bridge.errors import SimulatorError

        with pytest.raises(SimulatorError, match="unknown batch"):
            gw.step_channel().step(9999, b"\x00" * 9)
        assert fast.step(np.zeros((3, 3))).header.shape == (3, HEADER)
        # resets travel over the channel too, byte-identical to Py4J's
        assert fast.reset_records([2, 0, 1], [11, 12, 13]) == slow.reset_records([2, 0, 1], [11, 12, 13])
        np.testing.assert_array_equal(fast.step(np.ones((3, 3))).header, slow.step(np.ones((3, 3))).header)
        ch = gw.step_channel()
        with pytest.raises(SimulatorError, match="reset request"):
            ch.reset(fast._id, b"\x01\x00")
        with pytest.raises(SimulatorError, match="unknown step-channel op 7"):
            ch._call(7, fast._id, b"")
        # a frame larger than the JVM's first read buffer (64 KiB) is read whole, then answered
        with pytest.raises(SimulatorError, match="actions: expected 9 bytes"):
            ch.step(fast._id, b"\x00" * 200_000)
        assert fast.step(np.zeros((3, 3))).header.shape == (3, HEADER)


def test_step_channel_reads_replies_larger_than_its_buffer_and_one_socket_read():
    from sim_bridge.batch import SimBatch, record_width
    from sim_bridge.config import SimConfig
    from sim_bridge.workloads import seed_1551

    cfg = SimConfig(action_mode="per-type")
    n = 48  # 48 records of ~1.6 KB: more than the client's first 64 KiB buffer, several TCP reads
    assert n * record_width(cfg.n_types, cfg.vm_slots) * 8 > 1 << 16
    with Gateway() as gw:
        fast = SimBatch(cfg, seed_1551(), n, gateway=gw, fast=True)
        slow = SimBatch(cfg, seed_1551(), n, gateway=gw, fast=False)
        fast.reset(np.arange(n), np.arange(n))
        slow.reset(np.arange(n), np.arange(n))
        rng = np.random.default_rng(2)
        for _ in range(20):
            a = rng.integers(-1, 2, size=(n, cfg.n_types))
            assert fast.step_records(a) == slow.step_records(a)
        small = SimBatch(cfg, seed_1551(), 2, gateway=gw, fast=True)  # after growing, a small reply again
        small.reset([0, 1], [3, 4])
        assert len(small.step_records(np.zeros((2, cfg.n_types)))) == 2 * record_width(cfg.n_types, cfg.vm_slots) * 8
