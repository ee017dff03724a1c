"""Rollouts on Ray workers (`sim_bridge.ray_batch`), for real: a Ray cluster started in this
process (2 CPUs), actors with their own gateway JVMs. The same seeds must give the same
simulations and the same PPO run as one process; a worker killed mid-rollout is replaced and
the rollout thrown away. (`tests/test_ray_cluster.py` runs a two-node cluster on loopback.)"""
from __future__ import annotations

import numpy as np
import pytest
import torch

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e .[ray])")

from agents.ppo.config import PPOConfig  # noqa: E402
from agents.ppo.train import train  # noqa: E402
from sim_bridge.batch import SimBatch  # noqa: E402
from sim_bridge.config import SimConfig  # noqa: E402
from sim_bridge.envs import CloudSimVectorEnv  # noqa: E402
from sim_bridge.ray_batch import RaySimBatch, RolloutWorkerLost, connect, ray_batch_factory  # noqa: E402
from sim_bridge.workloads import seed_1551  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    connect("local", num_cpus=2)
    yield
    ray.shutdown()


def _kill(actor) -> None:
    """`ray.kill`, then wait until the actor is dead: the kill is asynchronous, and a call made at
    once could still be served by the dying actor (a CI run stepped it without an error)."""
    import time

    from ray.exceptions import RayActorError

    ray.kill(actor, no_restart=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            ray.get(actor.pid.remote(), timeout=5)
        except RayActorError:
            return
        time.sleep(0.05)
    raise AssertionError("the killed Ray actor still answered after 30 s")


def _same(a, b) -> None:
    assert np.array_equal(a.header, b.header) and np.array_equal(a.types, b.types)
    assert np.array_equal(a.raw.vm_type, b.raw.vm_type) and np.array_equal(a.raw.vm_cpu_busy, b.raw.vm_cpu_busy)


def test_sharded_batch_steps_and_resets_like_one_batch(cluster):
    cfg, wl = SimConfig(), seed_1551()
    local = SimBatch(cfg, wl, 3)
    remote = RaySimBatch(cfg, wl, 3, workers=2)
    try:
        assert list(remote.bounds) == [0, 2, 3]
        seeds = [11, 22, 33]
        _same(local.reset([0, 1, 2], seeds), remote.reset([0, 1, 2], seeds))
        rng = np.random.default_rng(0)
        for _ in range(30):
            d = rng.integers(-1, 2, size=(3, cfg.n_types))
            _same(local.step(d), remote.step(d))
        # a reset of envs on both workers, asked out of order, answers in the order asked
        _same(local.reset([2, 0], [5, 6]), remote.reset([2, 0], [5, 6]))
        _same(local.step(np.zeros((3, cfg.n_types))), remote.step(np.zeros((3, cfg.n_types))))
        with pytest.raises(ValueError, match="shape"):
            remote.step(np.zeros((2, cfg.n_types)))
    finally:
        local.close()
        remote.close()


def _tiny_ppo(**kw) -> PPOConfig:
    return PPOConfig(num_envs=2, num_steps=16, bptt_chunk=8, num_minibatches=2, update_epochs=2,
                     total_timesteps=2 * 16 * 3, max_episode_steps=40, lstm_hidden=16, device="cpu", seed=3,
                     checkpoint_every=1000, **kw).validate()


def _envs(factory=None):
    sim = SimConfig().model_copy(update={"max_steps": 40})
    return lambda n, seed: CloudSimVectorEnv(n, sim, seed_1551(), batch_factory=factory)


def test_training_on_two_workers_is_the_single_process_run(cluster):
    ppo = _tiny_ppo()
    alone = train(ppo, _envs(), progress=False)
    spread = train(ppo, _envs(ray_batch_factory(2)), progress=False)
    assert alone.global_step == spread.global_step == 96
    assert [e["return"] for e in alone.episodes] == [e["return"] for e in spread.episodes]
    for a, b in zip(alone.history, spread.history):
        assert a["pg_loss"] == b["pg_loss"] and a["v_loss"] == b["v_loss"]
    for (name, p), q in zip(alone.net.state_dict().items(), spread.net.state_dict().values()):
        assert torch.equal(p, q), name


def killing_factory(made: list):
    """A batch factory of 2-worker Ray batches, each listed in `made`, whose second worker is
    killed at the 20th step: the second update's rollout of 16-step rollouts, 4 steps in."""
    def factory(config, workload, n):
        b = RaySimBatch(config, workload, n, workers=2)
        made.append(b)
        inner, calls = b.step, {"n": 0}

        def step(deltas):
            calls["n"] += 1
            if calls["n"] == 20:
                _kill(b.actors[1])
            return inner(deltas)

        b.step = step
        return b
    return factory


def test_a_worker_killed_mid_rollout_is_replaced_and_its_rollout_discarded(cluster):
    made = []
    factory = killing_factory(made)
    result = train(_tiny_ppo(), _envs(factory), progress=False)
    batch = made[0]
    assert batch.replaced == 1
    assert [r["rollouts_discarded"] for r in result.history] == [0, 1, 1]
    # only whole rollouts count: 3 updates x 2 envs x 16 steps, the 4 lost steps are not in it
    assert result.global_step == 96
    assert len(result.history) == 3  # the replacement worker stepped the last two rollouts


def test_losing_a_worker_outside_training_is_a_clear_error(cluster):
    b = RaySimBatch(SimConfig(), seed_1551(), 2, workers=2)
    try:
        b.reset([0, 1], [1, 2])
        _kill(b.actors[0])
        with pytest.raises(RolloutWorkerLost, match="worker"):
            b.step(np.zeros((2, b.n_types)))
        b.reset([0, 1], [1, 2])  # the replacement's envs start afresh
        assert b.step(np.zeros((2, b.n_types))).header.shape[0] == 2
    finally:
        b.close()
    with pytest.raises(ValueError, match="rollout workers"):
        RaySimBatch(SimConfig(), seed_1551(), 2, workers=3)


def test_train_cli_names_a_bad_worker_count():
    from click.testing import CliRunner

    from samm.cli.main import cli

    r = CliRunner().invoke(cli, ["train", "--ray", "local", "--rollout-workers", "5", "--envs", "2",
                                 "--out", "/tmp/samm-ray-never"])
    assert r.exit_code == 2 and "--rollout-workers must be within [1, 2]" in r.output
    assert "--rollout-workers" in CliRunner().invoke(cli, ["train", "--help"]).output
