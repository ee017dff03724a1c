"""Session 103's own fixes of carried items (the helpers' fixes have their own files)."""
import os
import signal

import numpy as np
import pytest

from samm.knowledge.store import KnowledgeStore


@pytest.fixture()
def store(tmp_path):
    s = KnowledgeStore(f"sqlite:///{tmp_path / 'k.db'}")
    for i in range(3):
        s.record_decision(str(i), agent="x", action=None, source="none", now=100.0 + i)
    yield s
    s.close()


@pytest.mark.parametrize("bad", [-1, 1.5, "3", True])
def test_decisions_refuses_a_limit_that_is_not_a_whole_number_at_least_zero(store, bad):
    # SQLite read LIMIT -1 as "everything" where PostgreSQL refused it: one rule for both now
    with pytest.raises(ValueError, match="limit must be a whole number >= 0"):
        store.decisions(limit=bad)


def test_decisions_takes_zero_and_numpy_whole_limits(store):
    assert store.decisions(limit=0) == []
    assert [d.iteration_key for d in store.decisions(limit=np.int64(2))] == ["0", "1"]
    assert [d.iteration_key for d in store.decisions(limit=2, newest_first=True)] == ["2", "1"]


@pytest.mark.jvm
def test_vector_env_infos_carry_every_key_of_the_single_env_with_the_same_values():
    # the vector env's infos lacked six of the single env's keys (allocated_cores, clock_s, ...)
    from sim_bridge.config import SimConfig
    from sim_bridge.envs import CloudSimEnv, CloudSimVectorEnv

    cfg = SimConfig(max_steps=12)
    env, venv = CloudSimEnv(cfg, "seed-1551"), CloudSimVectorEnv(2, cfg, "seed-1551")
    try:
        _, one = env.reset(seed=7)
        _, many = venv.reset(seed=[7, 8])
        pairs = [(one, many)]
        for a in [1, 0, 2, 0, 4, 0]:
            pairs.append((env.step(a)[4], venv.step(np.array([a, 0]))[4]))
        for one, many in pairs:
            assert set(one) <= set(many), set(one) - set(many)
            for k, v in one.items():
                np.testing.assert_allclose(np.asarray(many[k][0], dtype=float), np.asarray(v, dtype=float),
                                           err_msg=k)
    finally:
        env.close()
        venv.close()


@pytest.mark.jvm
def test_the_bridge_starts_its_jvm_with_a_py4j_token_that_a_tokenless_client_lacks():
    # the gateway took a token since this session, but sim_bridge started it without one
    from py4j.java_gateway import GatewayParameters, JavaGateway
    from py4j.protocol import Py4JError

    from sim_bridge.gateway import Gateway

    gw = Gateway()
    try:
        assert gw.call("ping").startswith("samm-gateway ")
        intruder = JavaGateway(gateway_parameters=GatewayParameters(address="127.0.0.1", port=gw.port))
        try:
            with pytest.raises(Py4JError):
                intruder.entry_point.ping()
        finally:
            intruder.close()
    finally:
        gw.close()


@pytest.mark.jvm
def test_a_step_that_did_not_answer_must_be_followed_by_a_reset_of_every_env():
    # the JVM finishes a step the client gave up on: stepping on left every env one interval
    # ahead of what the caller believed, silently
    from sim_bridge.batch import SimBatch
    from sim_bridge.config import SimConfig
    from sim_bridge.errors import BridgeError, GatewayError
    from sim_bridge.workloads import seed_1551

    cfg = SimConfig(max_steps=20)
    workload = seed_1551()
    batch, fresh = SimBatch(cfg, workload, 2), SimBatch(cfg, workload, 2)
    zero = np.zeros((2, cfg.n_types), dtype=np.int64)
    try:
        batch.reset([0, 1], [3, 4])
        batch.step(zero)
        batch.gateway.step_channel().sock.settimeout(0.5)
        os.kill(batch.gateway.pid, signal.SIGSTOP)  # the JVM takes the request but answers too late
        try:
            with pytest.raises(GatewayError, match="no reply"):
                batch.step(zero)
        finally:
            os.kill(batch.gateway.pid, signal.SIGCONT)
        with pytest.raises(BridgeError, match=r"env\(s\) \[0, 1\] may have stepped.*reset them"):
            batch.step(zero)
        batch.reset([0], [3])
        with pytest.raises(BridgeError, match=r"env\(s\) \[1\]"):
            batch.step(zero)
        np.testing.assert_array_equal(batch.reset([1], [4]).header, fresh.reset([1], [4]).header)
        fresh.reset([0], [3])
        np.testing.assert_array_equal(batch.step(zero).header, fresh.step(zero).header)
    finally:
        batch.close()
        fresh.close()


def _slot_runner(tmp_path, max_iterations):
    from samm.daemon.build import build_daemon
    from samm.daemon.runner import DaemonRunner
    from samm.testbed.jobqueue import JobQueue
    from tests.test_runner_timing_audit import deferrable_config

    with JobQueue(tmp_path / "q.sqlite") as q:
        q.submit_deferrable([(1, 2, 1, 0, 10**9, 0, 1.0, 0.0)])
    return DaemonRunner(build_daemon(deferrable_config(tmp_path, interval_s=1.0)), max_iterations=max_iterations)


def _run_after_an_error(runner, stop) -> int:
    import threading

    rc: list = []
    runner.errors = 1  # an iteration that raised earlier in the run (APScheduler's EVENT_JOB_ERROR)
    first = threading.Event()
    runner.on_iteration = lambda rep: first.set()
    t = threading.Thread(target=lambda: rc.append(runner.run(install_signals=False)))
    t.start()
    assert first.wait(30)
    if stop:
        runner.request_stop()
    t.join(30)
    assert not t.is_alive()
    return rc[0]


def test_a_stop_asked_for_exits_0_even_after_an_iteration_raised(tmp_path):
    # `systemctl stop` of a daemon whose iteration raised once, weeks before, left the unit failed
    assert _run_after_an_error(_slot_runner(tmp_path, None), stop=True) == 0


def test_a_bounded_run_that_met_an_error_still_exits_1(tmp_path):
    assert _run_after_an_error(_slot_runner(tmp_path, 1), stop=False) == 1


def test_closing_a_daemon_closes_its_graphite_reader_and_its_plan_service_session(tmp_path):
    # their keep-alive pools outlived Daemon.close(): one per daemon a process built
    from samm.config import load_config
    from samm.daemon.build import build_daemon

    cfg = tmp_path / "c.yaml"
    cfg.write_text("groups:\n"
                   "  - {name: S, cores: 2, ram_gb: 8, price_per_hour: 0.1, min: 1, max: 4, asg_name: a}\n"
                   "executor: {kind: aws-asg, endpoint_url: 'http://127.0.0.1:9'}\n"
                   "agent: {name: noop, mode: http, service_url: 'http://127.0.0.1:9'}\n"
                   f"knowledge: {{url: 'sqlite:///{tmp_path}/k.db'}}\n")
    daemon = build_daemon(load_config(cfg))
    try:
        render, http = daemon.loop.monitor.source.render, daemon.loop.planner.http
        assert render.close in daemon.closers and http.close in daemon.closers
    finally:
        daemon.close()


def test_a_quick_lra_experiment_runs_the_seeds_asked_for():
    from agents.lra_placement.experiment import experiment_seeds

    assert experiment_seeds([3, 4, 5, 6, 7], quick=True) == [3, 4, 5, 6, 7]  # was cut to [3, 4]
    assert experiment_seeds(None, quick=True) == [1, 2]
    assert experiment_seeds(None, quick=False) == [1, 2, 3, 4, 5]


def test_experiment_lra_passes_no_seeds_when_none_are_typed(monkeypatch, tmp_path):
    # the CLI's default "1-5" always replaced the quick budget's own seeds
    from click.testing import CliRunner

    import agents.lra_placement.experiment as ex
    from samm.cli.main import cli

    seen = {}

    def fake_run(out, **kw):  # stands in for the minutes of work; only what the CLI passes matters
        seen.update(kw)
        return {"targets": []}

    monkeypatch.setattr(ex, "run", fake_run)
    for args, seeds in ((["--quick"], None), (["--quick", "--seeds", "3-5"], [3, 4, 5])):
        out = CliRunner().invoke(cli, ["experiment", "lra", "--out", str(tmp_path / "o"), "--quiet", *args])
        assert out.exit_code == 0, out.output
        assert seen["seeds"] == seeds


@pytest.mark.parametrize("length, ok", [(120, True), (121, False)])
def test_a_deferrable_run_name_longer_than_its_sessions_allow_is_refused_up_front(tmp_path, length, ok):
    # the run names the plan service's sessions "<run>-simg" (at most 128 characters): a longer
    # name was refused mid-run, after the testbed had started
    from click.testing import CliRunner

    from samm.cli.deferrable import RUN_NAME, testbed_deferrable

    assert bool(RUN_NAME.fullmatch("r" * length)) is ok
    if not ok:
        res = CliRunner().invoke(testbed_deferrable, ["--slots", "1", "--slot-seconds", "0.1", "--agent", "tetris",
                                                      "--out", str(tmp_path / "run"), "--run-name", "r" * length])
        assert res.exit_code == 2 and "--run-name" in res.output, res.output


@pytest.mark.docker
def test_a_load_generator_that_will_not_stop_still_leaves_no_container_behind(tmp_path_factory, monkeypatch):
    # load.stop() raising (a TimeoutExpired after kill) skipped app.close() and engine.stop()
    import importlib.util

    import docker

    if importlib.util.find_spec("locust") is None:
        pytest.skip("Locust is not installed (pip install -e .[testbed])")

    from fixtures_docker import real_engine
    from samm.testbed.microservices import load as load_mod
    from samm.testbed.microservices.containers import find_base_port
    from samm.testbed.microservices.run import MicroservicesRunOptions, run_microservices

    original = load_mod.LoadGenerator.stop

    def stop_then_fail(self, *a, **kw):
        original(self, *a, **kw)
        raise RuntimeError("the load generator would not stop")

    monkeypatch.setattr(load_mod.LoadGenerator, "stop", stop_then_fail)
    gen = real_engine(tmp_path_factory, "ms103")
    engine = next(gen)
    try:
        out = tmp_path_factory.mktemp("ms103-run")
        o = MicroservicesRunOptions(agent="autoscale", users=2, seconds=3, out_dir=str(out), docker_host=engine.base_url,
                                    warmup_s=1.0, run_name="stuckload", plots=False, base_port=find_base_port(7, 18700))
        res = run_microservices(o)
        assert res.records  # the run's seconds were still written
        client = docker.DockerClient(base_url=engine.base_url)
        try:
            left = [c.name for c in client.containers.list(all=True) if c.name.startswith("msstuckload")]
        finally:
            client.close()
        assert left == []
    finally:
        next(gen, None)


def _one_vm_summary(stopped_wall, shutdown_wall):
    from samm.testbed.billing import GroupSpec, InstanceRecord, policy_stop, summarize
    from samm.testbed.jobqueue import DONE, JobRecord

    t0 = 1_000_000.0
    # one 2-core VM for the whole run; the one job finishes at 95 s: the horizon is 120 s (2 steps)
    vm = InstanceRecord("S", "i-1", t0 - 5, policy_stop(stopped_wall, shutdown_wall), None)
    job = JobRecord(id=0, cores=1, runtime_s=90.0, ram_gb=1.0, submitted_at=5.0, state=DONE, attempts=1, requeues=0,
                    wait_s=0.0, enqueued_at=5.0, first_started_at=5.0, started_at=5.0, finished_at=95.0,
                    completed_by="i-1")
    return summarize([vm], [job], [], {"S": GroupSpec(cores=2, price_per_hour=3.6, max=4)}, compression=1.0, t0=t0,
                     step_s=60.0)


def test_instances_the_testbeds_own_shutdown_stopped_are_billed_to_the_horizon():
    # billed only to the shutdown (here 98 s, just after the last job), the cost lacked 22 s of
    # the fleet and the last step's sample found no instance (mean allocated 1 core, not 2)
    from samm.testbed.billing import policy_stop

    t0 = 1_000_000.0
    alive = _one_vm_summary(None, None)
    at_shutdown = _one_vm_summary(t0 + 98, t0 + 98)
    scaled_in = _one_vm_summary(t0 + 98, None)   # a policy's scale-in at 98 s is still one
    assert at_shutdown["vm_cost"] == alive["vm_cost"] == pytest.approx(120 * 3.6 / 3600)
    assert at_shutdown["mean_allocated_cores"] == alive["mean_allocated_cores"] == 2.0
    assert scaled_in["vm_cost"] == pytest.approx(98 * 3.6 / 3600) and scaled_in["mean_allocated_cores"] == 1.0
    assert policy_stop(t0 + 50, t0 + 98) == t0 + 50     # stopped before the shutdown: the policy's


def test_the_reconcilers_stop_records_when_it_ended_the_fleet():
    import subprocess
    import sys
    import time

    from samm.execute.moto_server import MotoServer, create_paper_asgs
    from samm.testbed.reconciler import Reconciler

    procs = []

    def spawn(group, iid, cores):
        procs.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
        return procs[-1]

    with MotoServer() as moto:
        moto.reset()
        create_paper_asgs(endpoint_url=moto.endpoint_url, names=("tb103-s",), instance_types=("m5a.large",),
                          min=(1,), max=2, desired=1)
        rec = Reconciler(moto.client("autoscaling"), {"tb103-s": ("S", 2)}, spawn, compression=1e4, poll_s=0.05)
        rec.start()
        try:
            deadline = time.time() + 20
            while time.time() < deadline and not any(v.proc is not None for v in rec.vms.values()):
                time.sleep(0.05)
            assert rec.stopped_at is None
        finally:
            rec.stop()
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait(10)
        assert rec.vms and all(v.stopped_wall == rec.stopped_at for v in rec.vms.values())
