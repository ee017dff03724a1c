"""Tenth audit of the Java gateway (java/src, docs/bridge-protocol.md): an env whose reset failed
half-way kept stepping a fleet that no longer existed, the launcher bound Py4J to any local address
although it says it only binds loopback and could not require a token, and a config key given twice
silently lost one of its values. Real JVMs only."""
import os
import re
import socket
import subprocess

import numpy as np
import pytest

from sim_bridge.batch import SimBatch
from sim_bridge.config import SimConfig, VmType
from sim_bridge.errors import SimulatorError
from sim_bridge.gateway import Gateway, find_jar, find_java
from sim_bridge.workloads import seed_1551

pytestmark = pytest.mark.jvm

# one simulated host per VM slot, each with 40 PEs: one env of it can be reset in a 640 MB heap (here: in
# 512 MB too) but not reset again (up to 768 MB), as a reset builds the new world while the old one is held
_BIG_FLEET = SimConfig(vm_types=[VmType(name="S", cores=40, ram_gb=8, price_per_hour=0.2, min=0, max=100_000,
                                        initial=1)], threads=1)


def test_an_env_whose_reset_failed_is_refused_a_step_not_stepped_with_its_fleet_gone():
    """The reset had already cleared the fleet, the queue and the job records when it ran out of
    memory, but the env still counted as reset: the next step answered normally, with no VM running
    and no job started, a silent wrong result for a caller that caught the error and went on."""
    for heap in ("640m", "576m", "704m"):  # another JDK may need a little more or less
        with Gateway(heap=heap) as gw:
            batch = SimBatch(_BIG_FLEET, seed_1551(), 1, gateway=gw)
            try:
                first = batch.reset([0], [1])
            except SimulatorError:
                continue  # not even one world fits
            assert first.running[0].sum() == 1
            try:
                batch.reset([0], [2])
            except SimulatorError as exc:
                assert re.search("OutOfMemoryError|Java heap space", str(exc)), exc
            else:
                continue  # two worlds fit
            with pytest.raises(SimulatorError, match=r"env 0 of the batch was never reset \(or its last reset or "
                                                     r"step failed\): reset it first"):
                batch.step(np.zeros((1, 1)))
            with pytest.raises(SimulatorError, match=r"env 0 was never reset \(or its last reset or step failed\)"):
                batch.job_stats(0)
            batch.close()
            return
    pytest.skip("no heap tried fits one reset of the fleet but not a second")


def test_an_env_reset_again_after_a_normal_episode_still_steps_as_before():
    """The fix only marks a reset as not done while it runs: a valid run is unchanged."""
    cfg = SimConfig(action_mode="per-type")
    with Gateway(heap="256m") as gw:
        batch = SimBatch(cfg, seed_1551(), 2, gateway=gw)
        batch.reset([0, 1], [7, 7])
        a = [batch.step(np.ones((2, cfg.n_types))).header for _ in range(3)]
        batch.reset([0], [7])
        b = batch.step(np.ones((2, cfg.n_types))).header
        assert np.array_equal(b[0], a[0][1])  # env 0 replays env 1's first step
        batch.close()


def _non_loopback_address() -> str | None:
    """An address of this machine that other hosts could reach (None when it has none)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
            addr = s.getsockname()[0]
    except OSError:
        return None
    return None if addr.startswith("127.") or addr == "0.0.0.0" else addr


def test_the_launcher_refuses_a_non_loopback_address_in_one_line():
    """Py4J lets whoever reaches its port call into the JVM, so the protocol promises a loopback
    address and the launcher refused the wildcard; a LAN address was bound and served, opening the
    gateway to the network."""
    addr = _non_loopback_address()
    if addr is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    proc = subprocess.Popen([find_java(), "-Xmx128m", "-jar", str(find_jar()),
                             "--address", addr, "--port", "0"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"the gateway served on the non-loopback address {addr}")
    assert "SAMM_GATEWAY_PORT" not in out, f"the gateway served on the non-loopback address {addr}"
    assert proc.returncode == 2
    assert err.strip() == f"samm-gateway: refusing to bind to the non-loopback address {addr}; use a loopback address"


@pytest.mark.parametrize("addr", ["127.0.0.1", "localhost"])
def test_loopback_addresses_are_still_served(addr):
    proc = subprocess.Popen([find_java(), "-Xmx128m", "-jar", str(find_jar()),
                             "--address", addr, "--port", "0", "--quiet"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("SAMM_GATEWAY_PORT="), (line, proc.stderr.read() if proc.poll() is not None else "")
    finally:
        proc.stdin.close()  # EOF on stdin: the JVM exits
        proc.wait(timeout=30)


_S = '{"name": "S", "cores": 2, "ram_gb": 8, "price_per_hour": 0.2, "min": 0, "max": 3, "initial": 1'


@pytest.mark.parametrize("config, key", [
    ('{"vm_types": [' + _S + '}], "step_seconds": 60, "step_seconds": 6}', "step_seconds"),
    ('{"vm_types": [' + _S + '}, ' + _S + ', "max": 30}]}', "vm_types[1].max"),
    ('{"vm_types": [' + _S + '}], "vm_types": []}', "vm_types"),
])
def test_a_config_key_given_twice_is_refused_naming_it(config, key):
    """Gson's tree keeps the last of two equal keys: the batch ran with one of the two values and
    nobody was told (Python's config files already refuse a repeated key)."""
    with Gateway(heap="128m") as gw:
        wid = gw.call("loadWorkload", bytearray(seed_1551().pack()))
        with pytest.raises(SimulatorError, match=rf"config key '{re.escape(key)}' is given twice"):
            gw.call("createBatch", config, wid, 1)
        # the same objects without the repeat are accepted, and so are equal keys in different objects
        bid = gw.call("createBatch", '{"vm_types": [' + _S + '}, ' + _S + '}], "step_seconds": 60}', wid, 1)
        gw.call("closeBatch", bid)
        gw.call("closeWorkload", wid)


def _start_with_token(token: str) -> tuple[subprocess.Popen, int]:
    env = dict(os.environ, SAMM_GATEWAY_AUTH_TOKEN=token)
    proc = subprocess.Popen([find_java(), "-Xmx128m", "-jar", str(find_jar()), "--address", "127.0.0.1",
                             "--port", "0", "--quiet"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env)
    line = proc.stdout.readline()
    assert line.startswith("SAMM_GATEWAY_PORT="), line
    return proc, int(line.split("=", 1)[1])


def _ping(port: int, token: str | None) -> str:
    from py4j.java_gateway import GatewayParameters, JavaGateway

    gw = JavaGateway(gateway_parameters=GatewayParameters(address="127.0.0.1", port=port, auth_token=token))
    try:
        return gw.entry_point.ping()
    finally:
        gw.close()


def test_a_gateway_started_with_a_token_answers_only_clients_that_present_it():
    """Py4J's reflection reaches the whole JVM (it can start any program as the user who runs it) and
    any local user can reach a loopback port: the launcher had no way to require a secret, as the step
    channel already does."""
    from py4j.protocol import Py4JError

    proc, port = _start_with_token("s3cret-token")
    try:
        with pytest.raises(Py4JError):
            _ping(port, None)
        with pytest.raises(Py4JError):
            _ping(port, "wrong-token")
        assert _ping(port, "s3cret-token").startswith("samm-gateway ")
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
