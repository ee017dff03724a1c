"""Audit of the Java gateway (java/) and its Python framing (sim_bridge/gateway.py, batch.py): the
launcher's arguments, degenerate configs that Python's own checks let through to the JVM, step
deltas, and what a gateway leaves behind. Real JVMs only (see also GatewayTest.java)."""
import gc
import logging
import re
import socket
import subprocess

import numpy as np
import pytest

from sim_bridge.batch import SimBatch
from sim_bridge.config import SimConfig, VmType
from sim_bridge.errors import SimulatorError
from sim_bridge.gateway import Gateway, find_java
from sim_bridge.workloads import seed_1551

pytestmark = pytest.mark.jvm


def _launch(jar, *args: str) -> subprocess.Popen:
    # stdin stays open, as under the Python parent: the JVM cannot count on its EOF to exit
    return subprocess.Popen([find_java(), "-Xmx128m", "-jar", str(jar), *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen, timeout_s: float = 30.0) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"the gateway JVM did not exit within {timeout_s:g} s")
    return proc.returncode, out, err


@pytest.mark.parametrize("flag", ["--port", "--parent-pid"])
def test_a_non_numeric_launcher_flag_is_one_line_not_a_stack_trace(gateway_jar, flag):
    code, out, err = _finish(_launch(gateway_jar, flag, "abc"))
    assert code == 2
    assert err.strip() == f"samm-gateway: {flag} must be an integer, got 'abc'"
    assert "SAMM_GATEWAY_PORT" not in out


def test_a_port_already_in_use_exits_naming_it_instead_of_living_on(gateway_jar):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out, err = _finish(_launch(gateway_jar, "--address", "127.0.0.1", "--port", str(port)))
    assert code == 2
    assert err.strip().startswith(f"samm-gateway: cannot listen on 127.0.0.1:{port} (")
    assert "Address already in use" in err and "\tat " not in err


@pytest.fixture(scope="module")
def gw():
    with Gateway(heap="256m") as g:
        yield g


def _s_type(**kw) -> VmType:
    fields = dict(name="S", cores=2, ram_gb=8, price_per_hour=0.2, min=0, max=4, initial=1)
    fields.update(kw)
    return VmType(**fields)


@pytest.mark.parametrize("vm_type, named", [
    (_s_type(max=2_000_000_000), "the sum of max (VM slots) must be <= 100000, got 2000000000"),
    (_s_type(cores=100_000_000, max=1), "VM slots x largest cores must be <= 4194304"),
])
def test_a_fleet_too_large_to_simulate_is_an_error_naming_vm_types(gw, vm_type, named):
    # was "Java heap space" (or a bare negative number once the slot count overflowed an int)
    with pytest.raises(SimulatorError, match="^vm_types: .*" + re.escape(named)):
        SimBatch(SimConfig(vm_types=(vm_type,)), seed_1551(), 1, gateway=gw)
    assert gw.call("ping").startswith("samm-gateway")


def test_host_mips_below_one_is_rejected_when_the_batch_is_created(gw):
    # was accepted, then every reset failed with "initial VMs still waiting for creation in the broker"
    with pytest.raises(SimulatorError, match=r"^host_mips must be >= 1, got 0\.5$"):
        SimBatch(SimConfig(host_mips=0.5), seed_1551(), 1, gateway=gw)
    batch = SimBatch(SimConfig(host_mips=1.5), seed_1551(), 1, gateway=gw)
    try:
        assert batch.reset([0], [1]).clock_s[0] == 0.0
    finally:
        batch.close()


@pytest.mark.parametrize("bad", [1.7, float("nan"), float("inf")])
def test_step_deltas_that_are_not_whole_numbers_are_rejected_not_truncated(gw, bad):
    # the int8 cast made 1.7 a 1 and NaN a 0, silently
    batch = SimBatch(SimConfig(), seed_1551(), 1, gateway=gw)
    try:
        before = batch.reset([0], [1])
        deltas = np.zeros((1, batch.n_types))
        deltas[0, 1] = bad
        with pytest.raises(ValueError, match="deltas must be whole numbers"):
            batch.step(deltas)
        after = batch.step(np.array([[0.0, 1.0, 0.0]]))  # integral floats still step
        assert after.counts[0, 1] == before.counts[0, 1] + 1
    finally:
        batch.close()


def test_a_batch_the_jvm_rejects_does_not_leave_its_workload_loaded(gw):
    with pytest.raises(SimulatorError, match="host_mips"):
        SimBatch(SimConfig(host_mips=0.5), seed_1551(), 1, gateway=gw)
    probe = gw.call("loadWorkload", bytearray(seed_1551().pack()))
    try:
        # ids are handed out in order: the rejected batch's workload was the one before
        with pytest.raises(SimulatorError, match=f"unknown workload id {probe - 1}"):
            gw.call("closeWorkload", probe - 1)
    finally:
        gw.call("closeWorkload", probe)


def test_a_java_error_leaves_no_jvm_object_that_dials_the_closed_gateway_later(caplog):
    # the Java exception sat in a reference cycle: a GC after close() ran its Py4J finalizer, which
    # dialled the dead JVM's port and logged an ERROR traceback (formatting it inside an unrelated
    # ast.parse even crashed pytest on Python 3.11.7: "AST constructor recursion depth mismatch")
    with Gateway(heap="128m") as g:
        with pytest.raises(SimulatorError, match="unknown workload id 12345"):
            g.call("closeWorkload", 12345)
    caplog.set_level(logging.DEBUG, logger="py4j")
    gc.collect()
    late = [r.getMessage() for r in caplog.records if r.name.startswith("py4j")]
    assert not [m for m in late if "connect" in m or "garbage collecting" in m], late


def test_close_releases_the_pipes_of_the_jvm():
    # they stayed open until GC: two descriptors per gateway and a ResourceWarning at a random moment
    g = Gateway(heap="128m")
    g.close()
    assert g.proc.stdout.closed and g.proc.stderr.closed and g.proc.stdin.closed
