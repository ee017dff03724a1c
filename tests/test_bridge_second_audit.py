"""Second audit of the simulator bridge (sim_bridge/): configs the simulator cannot run named when
they are loaded, Ray rollout workers that cannot start or are used after close, the gateway's
timeout on the step channel, a dead shared gateway, and episode seeds. Real JVMs and a real Ray
cluster where those are involved (markers `jvm`, `slow`)."""
from __future__ import annotations

import math
import os
import signal
import time

import numpy as np
import pytest
from pydantic import ValidationError

from sim_bridge.batch import SimBatch
from sim_bridge.config import SimConfig, VmType, load_sim_config
from sim_bridge.errors import BridgeError, GatewayError, SimulatorError
from sim_bridge.gateway import Gateway
from sim_bridge.workloads import seed_1551


def _s_type(**kw) -> VmType:
    fields = dict(name="S", cores=2, ram_gb=8, price_per_hour=0.2, min=0, max=4, initial=1)
    fields.update(kw)
    return VmType(**fields)


# --------------------------------------------------------------------------------- the config
@pytest.mark.parametrize("model, field, value", [
    (SimConfig, "penalty_per_job_second", math.inf),  # every reward was NaN (inf x 0 waiting seconds)
    (SimConfig, "host_mips", math.inf),  # reached the JVM as the JSON-invalid token `Infinity`
    (SimConfig, "step_seconds", math.inf),
    (SimConfig, "cooldown_s", math.inf),
    (SimConfig, "warmup_s", math.inf),
    (VmType, "price_per_hour", math.inf),
    (VmType, "ram_gb", -math.inf),
])
def test_an_infinite_number_in_the_config_is_rejected_naming_its_field(model, field, value):
    base = {} if model is SimConfig else dict(name="S", cores=2, ram_gb=8, price_per_hour=0.2, min=0, max=4,
                                               initial=1)
    with pytest.raises(ValidationError, match=rf"{field}\n.*finite number"):
        model(**{**base, field: value})


def test_an_infinite_penalty_in_a_config_file_is_one_line_naming_file_and_field(tmp_path):
    from click.testing import CliRunner

    from samm.cli.main import cli

    path = tmp_path / "sim.yaml"
    path.write_text("penalty_per_job_second: .inf\n")
    r = CliRunner().invoke(cli, ["sim", "run", "--config", str(path), "--max-steps", "2"])
    assert r.exit_code == 2, r.output
    assert "sim.yaml: penalty_per_job_second: Input should be a finite number" in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_a_key_given_twice_in_a_config_file_is_an_error_naming_it(tmp_path):
    # plain YAML kept the last `cooldown_s` silently (every other config of SAMM rejects it)
    path = tmp_path / "sim.yaml"
    path.write_text("cooldown_s: 300\nhost_mips: 4400\ncooldown_s: 0\n")
    with pytest.raises(ValueError, match=r"sim\.yaml: not a valid YAML/JSON file \(duplicate key 'cooldown_s'"):
        load_sim_config(path)
    path.write_text("cooldown_s: 300\nhost_mips: 4400\n")
    assert load_sim_config(path).cooldown_s == 300


def test_threads_beyond_a_java_int_are_rejected_by_the_config():
    # was "config key 'threads' must be an integer" from the JVM, for a whole number
    with pytest.raises(ValidationError, match="threads"):
        SimConfig(threads=2**31)
    assert SimConfig(threads=2**31 - 1).threads == 2**31 - 1


REJECTED_BY_THE_SIMULATOR = [
    ({"host_mips": 0.5}, "host_mips must be >= 1, got 0.5"),
    ({"vm_types": [_s_type(max=200_000).model_dump()]},
     "vm_types: the sum of max (VM slots) must be <= 100000, got 200000"),
    ({"vm_types": [_s_type(cores=100_000_000, max=1, initial=1).model_dump()]},
     "vm_types: VM slots x largest cores must be <= 4194304 simulated PEs, got 1 x 100000000"),
]


@pytest.mark.parametrize("fields, named", REJECTED_BY_THE_SIMULATOR)
def test_a_config_file_the_simulator_would_reject_is_named_when_it_is_loaded(tmp_path, fields, named):
    import yaml

    path = tmp_path / "sim.yaml"
    path.write_text(yaml.safe_dump(fields))
    with pytest.raises(ValueError) as err:
        load_sim_config(path)
    assert str(err.value) == f"{path}: {named}"


def test_the_paper_config_and_its_presets_have_no_simulator_problem():
    assert SimConfig().simulator_problem() is None
    assert load_sim_config(preset="realistic").simulator_problem() is None
    assert SimConfig(host_mips=1.0).simulator_problem() is None


@pytest.mark.jvm
def test_the_config_names_each_problem_in_the_words_of_the_jvm():
    # the two checks must not drift apart: Config.java's message is the one to match
    with Gateway(heap="256m") as gw:
        for fields, named in REJECTED_BY_THE_SIMULATOR:
            cfg = SimConfig.model_validate(fields)
            assert cfg.simulator_problem() == named
            with pytest.raises(SimulatorError) as err:
                SimBatch(cfg, seed_1551(), 1, gateway=gw)
            assert str(err.value).startswith(named), str(err.value)


# --------------------------------------------------------------------------------- the gateway
def _wait_stopped(pid: int, timeout_s: float = 30.0) -> None:
    """Until every thread of the process is stopped (SIGSTOP is delivered asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = set()
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/stat") as f:
                    states.add(f.read().rsplit(")", 1)[1].split()[0])
            except FileNotFoundError:
                continue
        if states <= {"T", "t"}:
            return
        time.sleep(0.01)


@pytest.mark.jvm
def test_a_stopped_jvm_fails_a_step_after_the_gateways_call_timeout_not_after_60_s():
    # the step channel kept its own 60 s timeout: call_timeout_s bounded only the control calls
    with Gateway(call_timeout_s=2) as gw:
        batch = SimBatch(SimConfig(), seed_1551(), 1, gateway=gw)
        batch.reset([0], [1])
        os.kill(gw.pid, signal.SIGSTOP)
        _wait_stopped(gw.pid)
        try:
            with pytest.raises(GatewayError, match=r"no reply on the step channel within 2 s"):
                batch.step(np.zeros((1, batch.n_types)))
        finally:
            os.kill(gw.pid, signal.SIGCONT)
        assert batch.reset([0], [1]).clock_s[0] == 0.0  # a new channel serves the next call
        batch.close()


@pytest.mark.jvm
def test_a_dead_shared_gateway_is_closed_when_it_is_replaced():
    import psutil

    from sim_bridge.gateway import close_shared_gateway, shared_gateway

    close_shared_gateway()
    try:
        dead = shared_gateway()
        os.kill(dead.pid, signal.SIGKILL)
        psutil.Process(dead.pid).wait(timeout=30)
        fresh = shared_gateway()
        assert fresh is not dead and fresh.call("ping").startswith("samm-gateway")
        # its pipes were left open until the interpreter exited
        assert dead.proc.stdin.closed and dead.proc.stdout.closed and dead.proc.stderr.closed
    finally:
        close_shared_gateway()


def _child_exit_code(pid: int, timeout_s: float = 60.0) -> int | None:
    """The forked child's exit code; None (and the child killed) if it hangs."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


@pytest.mark.jvm
def test_closing_the_parents_gateway_in_a_forked_child_leaves_the_parents_working():
    # the child shut the parent's Py4J sockets down, then hung for ever closing the JVM's pipes (on a
    # lock a reader thread held at the fork); a fork-started process pool's worker does this
    from sim_bridge.gateway import close_shared_gateway, shared_gateway

    close_shared_gateway()
    try:
        parent = shared_gateway()
        batch = SimBatch(SimConfig(), seed_1551(), 1)
        batch.reset([0], [1])
        pid = os.fork()
        if pid == 0:  # the child: never back into pytest
            code = 1
            try:
                close_shared_gateway()  # the parent's gateway, as the child sees it
                own = shared_gateway()
                code = 0 if own is not parent and own.call("ping").startswith("samm-gateway") else 2
                close_shared_gateway()
            finally:
                os._exit(code)
        assert _child_exit_code(pid) == 0
        assert parent.alive() and parent.call("ping").startswith("samm-gateway")
        assert int(batch.step(np.zeros((1, batch.n_types))).header[0, 1]) == 1
        batch.close()
    finally:
        close_shared_gateway()


# --------------------------------------------------------------------------------- the runner
@pytest.mark.parametrize("seed", [1.5, float("nan"), 2**63, True, "3"])
def test_run_episodes_rejects_a_seed_that_is_not_a_java_long_naming_it(seed):
    from agents.factory import make_agent
    from sim_bridge.runner import run_episodes

    cfg = SimConfig(max_steps=2)
    # 1.5 ran the episode of seed 1 (and reported seed 1); 2**63 was NumPy's OverflowError
    with pytest.raises(ValueError, match=r"an episode seed must be a whole number in \[-2\*\*63, 2\*\*63\), got "):
        run_episodes(cfg, seed_1551(), make_agent("noop", cfg), [1, seed])


@pytest.mark.jvm
def test_run_episodes_keeps_whole_seeds_of_any_type():
    from agents.factory import make_agent
    from sim_bridge.runner import run_episodes

    cfg = SimConfig(max_steps=2)
    eps = run_episodes(cfg, seed_1551(), make_agent("noop", cfg), [np.int64(4), 4.0, -1])
    assert [e["seed"] for e in eps] == [4, 4, -1] and eps[0]["total_cost"] == eps[1]["total_cost"]


# ----------------------------------------------------------------------- Ray rollout workers
def _sim_workers() -> list[int]:
    """Pids of live Ray actor processes of `SimWorker` (Ray titles them `ray::SimWorker`)."""
    import psutil

    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if cmd.startswith("ray::SimWorker") and p.info["status"] != psutil.STATUS_ZOMBIE:
            out.append(p.pid)
    return out


def _await_no_sim_workers(timeout_s: float = 60.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while _sim_workers() and time.monotonic() < deadline:
        time.sleep(0.2)
    return _sim_workers()


@pytest.mark.jvm
@pytest.mark.slow  # starting a Ray cluster takes 10-20 s on a loaded 2-core machine
def test_ray_workers_that_cannot_start_raise_the_one_line_error_and_none_is_left():
    ray = pytest.importorskip("ray", reason="the ray extra is not installed")
    from sim_bridge.ray_batch import RaySimBatch, connect
    from sim_bridge.workloads import Workload

    started_here = not ray.is_initialized()
    connect("local", num_cpus=2)
    try:
        assert not _await_no_sim_workers()
        # rejected by the JVM of each worker: was Ray's ActorDiedError, a 12-line traceback
        with pytest.raises(SimulatorError) as err:
            RaySimBatch(SimConfig(host_mips=0.5), seed_1551(), 2, workers=2)
        assert str(err.value) == "host_mips must be >= 1, got 0.5"
        one = np.ones(1)
        wide = Workload("wide", np.zeros(1), one * 1e6, np.array([64], dtype=np.int32), one)
        with pytest.raises(ValueError, match=r"^workload 'wide' has a 64-core job"):
            RaySimBatch(SimConfig(), wide, 2, workers=2)
        # more workers than the cluster's CPUs can hold: Ray kept the last one pending, and this waited for ever
        cpus = int(ray.cluster_resources()["CPU"])
        with pytest.raises(BridgeError, match=rf"^\d+ of {cpus + 1} rollout workers did not start within 5 s "
                                              rf"\(each needs 1 CPU, the cluster has {cpus} CPUs\)"):
            RaySimBatch(SimConfig(), seed_1551(), cpus + 1, workers=cpus + 1, start_timeout_s=5)
        # the workers that did start are stopped with the failed batch, not left to Ray's GC
        assert not _await_no_sim_workers()

        b = RaySimBatch(SimConfig(), seed_1551(), 2, workers=2)
        b.reset([0, 1], [1, 2])
        # was Ray's RayTaskError(ValueError), a traceback from the worker
        with pytest.raises(ValueError, match=r"^workload 'wide' has a 64-core job"):
            b.set_workload(1, wide)
        assert b.step(np.zeros((2, b.n_types))).header.shape[0] == 2
        b.close()
        # was RolloutWorkerLost, after starting two new workers (and JVMs) that nothing closed
        with pytest.raises(BridgeError, match="batch is closed"):
            b.step(np.zeros((2, b.n_types)))
        with pytest.raises(BridgeError, match="batch is closed"):
            b.reset([0], [1])
        with pytest.raises(BridgeError, match="batch is closed"):
            b.job_stats(0)
        assert b.replaced == 0
        assert not _await_no_sim_workers()
    finally:
        if started_here:
            ray.shutdown()
