"""Tenth audit round of the microservice simulator and its topologies: bad inputs that slipped
past the earlier rounds' checks, each refused with one line naming it."""
from __future__ import annotations

import numpy as np
import pytest
import yaml

from agents.microservice_cores.sim import MicroserviceSim
from agents.microservice_cores.topology import MAX_REQUESTS_PER_S, TOPOLOGY_DIR, load_topology

CHAIN3 = load_topology("chain3")


@pytest.mark.parametrize("samples", [2.5, None, float("nan"), "256", True])
def test_samples_that_are_not_a_whole_count_are_refused_by_name(samples):
    """2.5 drew 2 requests a second in silence (n_envs has refused it since an earlier round);
    None, NaN and a word failed inside int() with a message that named no option."""
    with pytest.raises(ValueError, match="samples must be at least 1 request drawn per second"):
        MicroserviceSim(CHAIN3, n_envs=1, seed=0, samples=samples)


def test_a_whole_float_or_numpy_sample_count_still_runs():
    for samples in (64.0, np.int64(64)):
        assert MicroserviceSim(CHAIN3, n_envs=1, seed=0, samples=samples).K == 64


def _chain3_with(tmp_path, **changes):
    data = yaml.safe_load((TOPOLOGY_DIR / "chain3.yaml").read_text())
    data.update(changes)
    path = tmp_path / "load.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_topology_whose_load_the_simulator_cannot_draw_is_refused_when_loaded(tmp_path):
    """users [20, 10**30] loaded fine and failed at the first step inside NumPy's Poisson draw
    ("lam value too large"), a traceback that named neither the file nor the field."""
    path = _chain3_with(tmp_path, users=[20, 10**30])
    with pytest.raises(ValueError, match=r"load\.yaml: .*users x rate_per_user .* must be at most 1e\+12 requests/s"):
        load_topology(path)
    path = _chain3_with(tmp_path, rate_per_user=1e300)
    with pytest.raises(ValueError, match="users x rate_per_user"):
        load_topology(path)


def test_users_past_the_drawable_load_are_refused_at_reset_not_at_the_next_step():
    sim = MicroserviceSim(CHAIN3, n_envs=2, seed=0)
    too_many = 2 * MAX_REQUESTS_PER_S / CHAIN3.rate_per_user
    for users in (1e20, [10, too_many]):
        with pytest.raises(ValueError, match="users must be at most 2e\\+11"):
            sim.reset(users)
        sim.reset(10)
        with pytest.raises(ValueError, match="users must be at most"):
            sim.set_users(users)
    # the largest load allowed steps (an overloaded application, not a crash)
    sim.reset(MAX_REQUESTS_PER_S / CHAIN3.rate_per_user)
    step = sim.step(CHAIN3.caps)
    assert np.all(np.isfinite(step.requests)) and np.all(step.requests > 0)
    assert np.all(step.failures <= step.requests)


def test_shipped_topologies_load_and_a_seeded_run_is_unchanged_by_the_new_checks():
    for name in ("chain3", "hotel", "social", "testbed"):
        topo = load_topology(name)
        a, b = MicroserviceSim(topo, n_envs=2, seed=7), MicroserviceSim(topo, n_envs=2, seed=7)
        a.reset(topo.users[1]), b.reset(topo.users[1])
        for _ in range(3):
            sa, sb = a.step(topo.caps * 0.5), b.step(topo.caps * 0.5)
            np.testing.assert_array_equal(sa.latency_ms, sb.latency_ms)
            np.testing.assert_array_equal(sa.per_service, sb.per_service)


@pytest.mark.parametrize("service", ["auth service", "auth/v2", "räte"])
def test_a_service_name_no_container_can_carry_is_refused_before_the_engine_starts(tmp_path, service):
    """The testbed names each container ms<run>-<service>-1: the simulator took any name, and the
    live run started the engine, the store and the first containers before Docker refused
    ("Invalid container name"), naming a container rather than the topology's service."""
    from samm.testbed.microservices.run import MicroservicesRunOptions, run_microservices

    data = yaml.safe_load((TOPOLOGY_DIR / "chain3.yaml").read_text())
    data["services"][service] = data["services"].pop("logic")
    data["requests"]["get"]["stages"][0][0]["call"] = service
    path = tmp_path / "named.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    load_topology(path)   # the simulator's file is valid as it was
    o = MicroservicesRunOptions(topology=str(path), seconds=2, out_dir=str(tmp_path / "out"),
                                docker_host="unix:///nonexistent-samm.sock", plots=False)
    with pytest.raises(ValueError, match=f"named.yaml: service name {service!r} must match .* \\(it names a container\\)"):
        run_microservices(o)
    assert not (tmp_path / "out").exists()
