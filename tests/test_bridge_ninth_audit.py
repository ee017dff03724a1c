"""Ninth audit of the simulator bridge: a Ctrl-C during a slow gateway start, batches of actions
that do not match the vector env, feature names checked before a batch exists, and env indices,
batch sizes and deltas that are not whole numbers reaching `SimBatch`."""
from __future__ import annotations

import os
import signal
import time
from types import SimpleNamespace

import numpy as np
import pytest

from sim_bridge.batch import SimBatch
from sim_bridge.config import SimConfig
from sim_bridge.gateway import Gateway
from sim_bridge.workloads import seed_1551_short


@pytest.fixture(scope="module")
def gw():
    with Gateway(heap="256m") as g:
        yield g


# ------------------------------------------------------------------------------- the gateway
def _gone(pid: int, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not os.path.exists(f"/proc/{pid}"):
            return True
        time.sleep(0.05)
    return False


def test_a_ctrl_c_during_a_slow_gateway_start_leaves_no_jvm_behind(tmp_path, monkeypatch):
    # a `java` that starts slowly: it never prints its port and lives until its stdin closes
    pid_file = tmp_path / "pid"
    java = tmp_path / "bin" / "java"
    java.parent.mkdir()
    java.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nwhile read -r x; do :; done\n")
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    pid = None
    try:
        signal.setitimer(signal.ITIMER_REAL, 1.0)
        with pytest.raises(KeyboardInterrupt):
            Gateway(start_timeout_s=60)
        pid = int(pid_file.read_text())
        # it leads a session of its own, so the Ctrl-C never reached it: it lived until Python exited
        assert _gone(pid), "the interrupted gateway's process is still running"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if pid is not None and os.path.exists(f"/proc/{pid}"):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.jvm
def test_a_jvm_that_logs_to_stdout_after_its_port_line_keeps_stepping(monkeypatch):
    # an operator's JVM diagnostics (-Xlog writes to stdout): once the port line was read nobody
    # drained stdout, the pipe filled as CloudSim Plus's classes loaded and the JVM hung for good
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-Xlog:class+load=info")
    with Gateway(heap="256m", call_timeout_s=15) as g:
        batch = SimBatch(SimConfig(), seed_1551_short(), 2, gateway=g)
        try:
            batch.reset(np.arange(2), [1, 2])
            for _ in range(50):
                s = batch.step(np.zeros((2, 3), dtype=np.int64))
            assert s.clock_s.tolist() == [3000.0, 3000.0]
        finally:
            batch.close()


# ------------------------------------------------------------------------------- the vector env
@pytest.mark.jvm
def test_the_vector_env_names_a_batch_of_actions_of_the_wrong_size_and_goes_on(gw):
    from sim_bridge.envs import CloudSimVectorEnv

    env = CloudSimVectorEnv(4, SimConfig(max_steps=200), workload="seed-1551-short", gateway=gw)
    try:
        env.reset(seed=1)
        queued = False
        for _ in range(60):  # until jobs queue: the liveness guard then reads every row
            *_, info = env.step(np.zeros(4, dtype=np.int64))
            if info["queue_length"].any():
                queued = True
                break
        assert queued
        step = info["step"].copy()
        # 3 or 5 actions met the guard as NumPy's "operands could not be broadcast together";
        # a (2, 2) array was flattened into 4 actions
        for bad in (np.zeros(3, dtype=np.int64), np.zeros(5, dtype=np.int64), np.zeros((2, 2), dtype=np.int64), 0):
            with pytest.raises(ValueError, match=r"one action per environment \(4\)"):
                env.step(bad)
        *_, info = env.step(np.array([[1], [0], [0], [2]]))  # (E, 1) still reads as E actions
        assert info["step"].tolist() == (step + 1).tolist()
    finally:
        env.close()


def test_to_deltas_checks_the_batch_size_only_when_asked():
    from sim_bridge.actions import to_deltas

    assert to_deltas("paper", np.array([0, 1]), 3, n_envs=2).tolist() == [[0, 0, 0], [1, 0, 0]]
    assert to_deltas("per-type", np.array([[1, 2, 0]]), 3, n_envs=1).tolist() == [[0, 1, -1]]
    with pytest.raises(ValueError, match=r"one action per environment \(2\), got actions of shape \[3\]"):
        to_deltas("paper", np.array([0, 1, 2]), 3, n_envs=2)
    with pytest.raises(ValueError, match=r"one action per environment \(2\)"):
        to_deltas("per-type", np.array([1, 1, 1]), 3, n_envs=2)
    assert to_deltas("paper", np.array([0, 1, 2]), 3).shape == (3, 3)  # unchanged without n_envs


@pytest.mark.jvm
def test_run_episodes_names_an_agent_that_answers_for_the_wrong_number_of_episodes(gw):
    from sim_bridge.runner import run_episodes

    agent = SimpleNamespace(feature_names=(), action_mode="paper", initial_state=lambda n: None,
                            act=lambda feats, state, det: (SimpleNamespace(actions=np.zeros(1, dtype=np.int64)), state))
    with pytest.raises(ValueError, match=r"one action per environment \(2\)"):
        run_episodes(SimConfig(max_steps=5), seed_1551_short(), agent, [1, 2], gateway=gw)


@pytest.mark.parametrize("features, problem", [(("cpu_mean", "bogus"), r"unknown feature\(s\) \['bogus'\]"),
                                               ((), "at least one feature")])
def test_feature_names_are_checked_before_any_batch_is_built(features, problem):
    from sim_bridge.envs import CloudSimEnv, CloudSimVectorEnv

    built = []  # an unknown name failed only at the first reset, with the batch already in the JVM

    def factory(config, workload, n_envs):
        built.append(n_envs)
        raise AssertionError("a batch was built")

    with pytest.raises(ValueError, match=problem):
        CloudSimVectorEnv(2, workload="seed-1551-short", features=features, batch_factory=factory)
    with pytest.raises(ValueError, match=problem):
        CloudSimEnv(workload="seed-1551-short", features=features)
    assert built == []


def test_explicit_valid_feature_names_still_work():
    from sim_bridge.envs import feature_names_of

    names = ("cpu_mean", "vm_count:S", "steps_since_action")
    assert feature_names_of(list(names), SimConfig()) == names


# ------------------------------------------------------------------------------- SimBatch
@pytest.mark.jvm
def test_a_batch_size_that_is_not_a_whole_number_is_named_and_a_numpy_integer_works(gw):
    for bad in (2.5, "2", 0, None):
        with pytest.raises(ValueError, match="n_envs must be a whole number >= 1"):
            SimBatch(SimConfig(), seed_1551_short(), bad, gateway=gw)
    batch = SimBatch(SimConfig(), seed_1551_short(), np.int64(2), gateway=gw)  # was Py4J's AttributeError
    try:
        assert batch.n_envs == 2 and type(batch.n_envs) is int
        assert batch.reset(np.arange(2), [1, 2]).clock_s.tolist() == [0.0, 0.0]
    finally:
        batch.close()


@pytest.mark.jvm
def test_env_indices_that_are_not_whole_numbers_are_refused_not_truncated(gw):
    batch = SimBatch(SimConfig(), seed_1551_short(), 2, gateway=gw)
    try:
        batch.reset([0, 1], [1, 2])
        batch.step(np.zeros((2, 3), dtype=np.int64))
        for bad in (1.5, np.nan, "1", True):
            # int() reset env 1 for 1.5: its episode restarted behind the caller's back
            with pytest.raises(ValueError, match="env index must be a whole number within"):
                batch.reset([bad], [3])
            with pytest.raises(ValueError, match="env index must be a whole number within"):
                batch.job_stats(bad)
            with pytest.raises(ValueError, match="env index must be a whole number within"):
                batch.set_workload(bad, seed_1551_short())
        with pytest.raises(ValueError, match="env index must be a whole number within"):
            batch.job_stats(-1)
        s = batch.step(np.zeros((2, 3), dtype=np.int64))
        assert s.clock_s.tolist() == [120.0, 120.0]  # neither env was reset
        assert batch.job_stats(np.int64(1)).shape == (seed_1551_short().n_jobs, 5)
        assert batch.reset(np.array([1.0]), [3]).clock_s.tolist() == [0.0]  # integral floats still name an env
    finally:
        batch.close()


@pytest.mark.jvm
@pytest.mark.parametrize("bad", [np.array([["1", "0", "0"], ["0", "0", "0"]]),
                                 np.array([[1, 0, 0], [0, 0, None]], dtype=object),
                                 np.array([[1 + 1j, 0, 0], [0, 0, 0]])])
def test_deltas_of_strings_none_or_complex_numbers_are_refused_and_the_batch_goes_on(gw, bad):
    batch = SimBatch(SimConfig(), seed_1551_short(), 2, gateway=gw)
    try:
        before = batch.reset([0, 1], [1, 2])
        # strings and None failed in NumPy's isfinite with a TypeError; 1+1j stepped as 1
        with pytest.raises(ValueError, match="deltas must be whole numbers"):
            batch.step(bad)
        s = batch.step(np.array([[0, 1, 0], [0, 0, 0]], dtype=object))  # whole numbers of any type still step
        assert s.counts[0, 1] == before.counts[0, 1] + 1 and s.clock_s.tolist() == [60.0, 60.0]
    finally:
        batch.close()


# ------------------------------------------------------------------------------- workloads
def _jobs(cores) -> "object":
    from sim_bridge.workloads import Workload

    cores = np.asarray(cores)
    n = len(cores)
    return Workload("w", np.arange(n, dtype=np.float64), np.full(n, 4400.0), cores, np.zeros(n))


@pytest.mark.parametrize("cores", [[1.5], [2.0, np.nan], [np.inf], [2**32 + 1], np.array(["1"]), np.array([True])])
def test_job_cores_that_are_not_whole_int32_numbers_are_refused(cores):
    # packed as int32: 1.5 ran on one core while core_seconds counted 1.5; 2**32 + 1 ran on one core
    with pytest.raises(ValueError, match="cores must be whole numbers"):
        _jobs(cores)


def test_whole_job_cores_of_any_numeric_type_still_pack_as_before():
    for cores in ([1, 2], [1.0, 2.0], np.array([1, 2], dtype=np.uint8), np.array([1, 2], dtype=np.int32)):
        w = _jobs(cores)
        assert np.frombuffer(w.pack()[4 + 16 * 2:4 + 16 * 2 + 8], dtype="<i4").tolist() == [1, 2]
        assert w.core_seconds(4400.0) == 3.0
