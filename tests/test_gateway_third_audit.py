"""Third audit of the Java gateway and the bridge's env layer (sim_bridge/envs.py, runner.py,
docs/bridge-protocol.md): step caps that silently meant something else, a closed env that built
a new JVM batch behind its caller's back, and the protocol's account of a job's length.
Real JVMs only."""
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from sim_bridge.batch import SimBatch
from sim_bridge.config import SimConfig
from sim_bridge.envs import CloudSimEnv
from sim_bridge.gateway import Gateway
from sim_bridge.runner import run_episodes
from sim_bridge.workloads import Workload, seed_1551

pytestmark = pytest.mark.jvm

DOC = Path(__file__).resolve().parents[1] / "docs" / "bridge-protocol.md"


class _Noop:
    """An agent that never scales (enough to drive `run_episodes`)."""
    feature_names = ()
    action_mode = "paper"

    def initial_state(self, n):
        return None

    def act(self, feats, state, deterministic):
        return SimpleNamespace(actions=np.zeros(len(feats), dtype=np.int64)), state


@pytest.fixture(scope="module")
def gw():
    with Gateway(heap="256m") as g:
        yield g


@pytest.mark.parametrize("cap", [0, -1, 2.5, True, "3"])
def test_run_episodes_rejects_a_step_cap_that_is_not_a_whole_number_of_at_least_one(cap):
    """0 silently meant the config's 5000 steps (`max_steps or ...`) and -1 ended every episode
    after one step, reported as an ordinary truncated run."""
    with pytest.raises(ValueError, match=r"max_steps must be a whole number >= 1 .*got"):
        run_episodes(SimConfig(), seed_1551(), _Noop(), [0], max_steps=cap)


@pytest.mark.parametrize("cap", [np.int64(3), 3.0, 3])
def test_run_episodes_keeps_whole_step_caps_of_any_type(gw, cap):
    r = run_episodes(SimConfig(), seed_1551(), _Noop(), [0], gateway=gw, max_steps=cap)[0]
    assert r["steps"] == 3 and r["truncated"]


def test_run_episodes_without_a_seed_says_so():
    with pytest.raises(ValueError, match="at least one seed"):
        run_episodes(SimConfig(), seed_1551(), _Noop(), [])


def test_job_stats_of_a_closed_or_unreset_env_is_a_clear_error_and_builds_no_batch(gw):
    """On a closed env, `job_stats()` built a fresh batch in the JVM (left there until GC) only to
    fail with the JVM's "env 0 was never reset"."""
    env = CloudSimEnv(SimConfig(), gateway=gw)
    with pytest.raises(RuntimeError, match=r"call reset\(\) before job_stats\(\)"):
        env.job_stats()
    env.reset(seed=1)
    assert env.job_stats().shape == (seed_1551().n_jobs, 5)
    env.close()
    with pytest.raises(RuntimeError, match=r"call reset\(\) before job_stats\(\)"):
        env.job_stats()
    assert env._batch is None


def test_a_job_runs_its_length_on_each_of_its_cores_as_the_protocol_says(gw):
    """docs/bridge-protocol.md said a cloudlet gets round(length_mi / cores) MI per PE: a 4-core
    job would then run 4x faster than it does; and a job under 1 MI runs as 1 MI."""
    mips = SimConfig().host_mips
    w = Workload("lengths", np.array([0.0, 0.0]), np.array([30 * mips, 1e-9]), np.array([4, 1], dtype=np.int32),
                 np.array([0.5, 0.5]))
    b = SimBatch(SimConfig(), w, 1, gateway=gw)
    try:
        b.reset([0], [0])
        b.step(np.zeros((1, 3), dtype=np.int8))
        jobs = b.job_stats(0)
    finally:
        b.close()
    run = jobs[:, 2] - jobs[:, 1]
    assert run[0] == pytest.approx(30.0, abs=0.02)
    assert run[1] == pytest.approx(1.0 / mips, abs=0.011)
    text = " ".join(DOC.read_text().split())
    assert "round(length_mi / cores)" not in text
    assert "`max(1, round(length_mi))` MI on each of its `cores` PEs" in text


def test_a_run_cut_at_an_arrival_instant_counts_only_the_jobs_that_arrived(gw):
    """seed-1551's second batch arrives at 2280 s = the end of step 38. Arrivals at exactly a step's
    end belong to the next step, yet `run_episodes` counted those 100 jobs (wait 0) as arrived and
    reported half the mean wait of the 100 jobs that had."""
    cfg, w = SimConfig(), seed_1551()
    r = run_episodes(cfg, w, _Noop(), [0], gateway=gw, max_steps=38)[0]
    b = SimBatch(cfg, w, 1, gateway=gw)
    try:
        b.reset([0], [0])
        for _ in range(38):
            b.step(np.zeros((1, cfg.n_types), dtype=np.int8))
        jobs = b.job_stats(0)
    finally:
        b.close()
    waits = jobs[jobs[:, 0] < 38 * cfg.step_seconds, 3]
    assert len(waits) == 100
    assert r["mean_wait_s"] == pytest.approx(round(float(waits.mean()), 3))
    assert r["p95_wait_s"] == pytest.approx(round(float(np.percentile(waits, 95)), 3))


@pytest.mark.parametrize("counts", [[1.7, 0, 1], [1, 0.9, 1]])
def test_initial_fleet_counts_that_are_not_whole_numbers_are_rejected_not_truncated(counts):
    """`with_initial([1.7, 0.9, 1])` built a fleet of 1, 0 and 1 VMs without a word."""
    with pytest.raises(ValueError, match="fractional part"):
        SimConfig().with_initial(counts)


def test_initial_fleet_counts_of_any_whole_type_still_work_and_bounds_are_checked():
    cfg = SimConfig().with_initial([np.int64(2), 0, 3.0])
    assert [t.initial for t in cfg.vm_types] == [2, 0, 3]
    assert all(type(t.initial) is int for t in cfg.vm_types)
    with pytest.raises(ValueError, match="min <= initial <= max"):
        SimConfig().with_initial([11, 0, 0])
    with pytest.raises(ValueError, match="expected 3 initial counts"):
        SimConfig().with_initial([1, 1])


@pytest.mark.parametrize("seed", [1.7, 2**63, "3", True])
def test_a_batch_reset_refuses_a_seed_the_simulator_cannot_take(gw, seed):
    """The int64 cast ran seed 1 for 1.7 (another episode than asked) and raised NumPy's
    OverflowError, naming no seed, for 2**63."""
    b = SimBatch(SimConfig(), seed_1551(), 1, gateway=gw)
    try:
        with pytest.raises(ValueError, match="an episode seed must be a whole number"):
            b.reset([0], [seed])
        b.reset([0], [np.int64(7)])  # NumPy ints and whole floats still go
        b.reset([0], [7.0])
    finally:
        b.close()
