"""Second audit of the microservice-cores simulator, its topology files, env, episodes and the
static search: inputs the first audit (test_microservice_sim_audit.py) did not reach are refused
by name, or held safely, before any simulated second runs."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from agents.microservice_cores.control import MIN_CORES
from agents.microservice_cores.env import MicroserviceCoresEnv
from agents.microservice_cores.episode import StaticController, run_episodes
from agents.microservice_cores.observation import FIELD
from agents.microservice_cores.sim import MicroserviceSim
from agents.microservice_cores.static_search import StaticSearchParams
from agents.microservice_cores.topology import load_topology

HEAD = "name: x\nqos_ms: 50\nusers: [1, 2]\nrate_per_user: 1.0\n"


def _write(tmp_path, text: str):
    path = tmp_path / "t.yaml"
    path.write_text(text)
    return path


# -- topology files -----------------------------------------------------------------------------
def test_a_cap_below_the_smallest_cpu_quota_is_refused_by_file_and_field(tmp_path):
    """A cap of 0.005 loaded, and clip_cores then set every limit to the cap, under the kernel's
    smallest quota (MIN_CORES): the live loop found the engine's limit a quota step off and sent
    the same limit again every second."""
    low = HEAD + "services:\n  a: {cpu_ms: 1, cap: 0.005}\nrequests:\n  r: {weight: 1, call: a}\n"
    with pytest.raises(ValueError, match=r"t\.yaml: services\.a\.cap: must be at least 0\.01 core"):
        load_topology(_write(tmp_path, low))
    at_floor = HEAD + f"services:\n  a: {{cpu_ms: 1, cap: {MIN_CORES}}}\nrequests:\n  r: {{weight: 1, call: a}}\n"
    assert load_topology(_write(tmp_path, at_floor)).caps.tolist() == [MIN_CORES]


@pytest.mark.parametrize("root", ["p: 0.3", "detached: true"])
def test_a_request_types_own_call_cannot_be_a_miss_or_detached(tmp_path, root):
    """`p: 0.3` on a request's root used to be accepted: 70 % of its requests then counted with a
    latency of 0 ms (the second's p50 read 0)."""
    text = HEAD + "services:\n  a: {cpu_ms: 1, cap: 1}\nrequests:\n  r: {weight: 1, call: a, " + root + "}\n"
    with pytest.raises(ValueError, match=r"requests\.r: a request type's own call \('a'\) is always made"):
        load_topology(_write(tmp_path, text))
    under = HEAD + ("services:\n  a: {cpu_ms: 1, cap: 1}\n  b: {cpu_ms: 1, cap: 1}\n"
                    "requests:\n  r: {weight: 1, call: a, stages: [[{call: b, " + root + "}]]}\n")
    assert load_topology(_write(tmp_path, under)).n_services == 2   # under the root both stay allowed


# -- the simulator ------------------------------------------------------------------------------
@pytest.mark.parametrize("users", ["abc", None, [1.0, 2.0, 3.0], {"n": 1}])
def test_users_that_are_not_a_count_are_refused_by_name(users):
    sim = MicroserviceSim(load_topology("chain3"), n_envs=2, seed=0)
    with pytest.raises(ValueError, match="users must be finite and >= 0"):
        sim.reset(users)
    topo = load_topology("chain3")
    with pytest.raises(ValueError, match="users must be finite and >= 0"):
        run_episodes(topo, lambda i: StaticController.maximum(topo), users, [1, 2], steps=1, warmup=1)


def test_env_users_option_of_none_draws_from_the_range_and_a_bad_one_is_named():
    env = MicroserviceCoresEnv("chain3", warmup=2)
    drawn, info = env.reset(seed=4)
    again, info_none = env.reset(seed=4, options={"users": None})   # used to fail in float(None)
    assert np.array_equal(drawn, again) and info == info_none
    lo, hi = env.topo.users
    assert lo <= info["users"] <= hi
    with pytest.raises(ValueError, match="users must be finite and >= 0"):
        env.reset(seed=4, options={"users": "many"})
    _, info = env.reset(seed=4, options={"users": np.array([7])})
    assert info["users"] == 7.0


@pytest.mark.parametrize("bad", [math.inf, -math.inf])
def test_an_infinite_core_count_keeps_the_limit_in_force(bad):
    """+inf used to reach the features as an infinite cpu_limit (and stay through a later NaN)."""
    topo = load_topology("chain3")
    sim = MicroserviceSim(topo, n_envs=1, seed=0)
    sim.reset(50)
    sim.step(np.array([[1.0, 1.5, 1.0]]))
    st = sim.step(np.array([[bad, 1.5, np.nan]]))
    assert st.per_service[0, :, FIELD["cpu_limit"]].tolist() == [1.0, 1.5, 1.0]
    assert np.isfinite(st.per_service).all() and np.isfinite(st.p99_ms).all()


@pytest.mark.parametrize("n", [0, -1, 2.5, "2", math.nan, math.inf, True])
def test_a_copy_count_that_is_not_a_whole_number_from_one_is_refused(n):
    # 2.5 used to run 2 copies in silence, 0 none, -1 failed in NumPy ("negative dimensions")
    with pytest.raises(ValueError, match="n_envs must be a whole number of copies >= 1"):
        MicroserviceSim(load_topology("chain3"), n_envs=n, seed=0)
    assert MicroserviceSim(load_topology("chain3"), n_envs=3.0, seed=0).E == 3


# -- env conformance ----------------------------------------------------------------------------
def test_the_env_passes_gymnasiums_checker_and_a_seed_repeats_across_resets():
    env = MicroserviceCoresEnv("chain3", warmup=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # the unbounded Box's "probably too low/high" notes
        check_env(env, skip_render_check=True)
    first, _ = env.reset(seed=11)
    steps = [env.step(np.full(3, 0.3))[:2] for _ in range(3)]
    env.reset(seed=99)
    again, _ = env.reset(seed=11)
    assert np.array_equal(first, again)
    for obs, reward in steps:
        o, r = env.step(np.full(3, 0.3))[:2]
        assert np.array_equal(obs, o) and r == reward


# -- the static search ----------------------------------------------------------------------------
@pytest.mark.parametrize("params, key", [({"warmup": 0}, "warmup"), ({"floors": ()}, "floors"),
                                         ({"seeds": (1, "a")}, r"seeds\[1\]"), ({"seeds": (-1,)}, r"seeds\[0\]"),
                                         ({"seeds": (2.5,)}, r"seeds\[0\]")])
def test_static_search_params_that_fail_later_or_search_nothing_are_refused(params, key):
    """warmup 0 passed the check and failed at the first run; no floors searched nothing and
    returned the caps as feasible; a bad seed failed in NumPy's SeedSequence without its name."""
    with pytest.raises(ValueError, match=rf"^static-search: {key} must be"):
        StaticSearchParams(**params)
    assert StaticSearchParams(seeds=(np.int64(3),), floors=[0.1], warmup=1).warmup == 1
