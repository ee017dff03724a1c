"""Golden runs of the CloudSim Plus gateway through the bridge (seed-1551, the paper's set-up)."""
import numpy as np
import pytest

from sim_bridge.batch import H_REQUEUED, H_WAITING, SimBatch
from sim_bridge.config import SimConfig
from sim_bridge.envs import CloudSimEnv
from sim_bridge.runner import run_episodes
from agents.builtin import make_builtin_policy
from sim_bridge.workloads import seed_1551

pytestmark = pytest.mark.jvm


def run(cfg, policy="noop", seed=1):
    agent = make_builtin_policy(policy, cfg.action_mode, tuple(t.name for t in cfg.vm_types), seed=seed)
    return run_episodes(cfg, seed_1551(), agent, [seed])[0]


def test_full_fleet_noop_is_the_earliest_possible_end():
    r = run(SimConfig().with_initial([10, 10, 10]))
    assert r["terminated"] and r["steps"] in (229, 230)
    assert r["wait_penalty"] == 0.0 and r["mean_wait_s"] == 0.0
    assert r["vm_cost"] == pytest.approx(14.0 * r["steps"] / 60.0, abs=0.005)
    assert r["jobs_finished"] == 1551 and r["jobs_requeued"] == 0
    assert r["makespan_s"] == pytest.approx(13681.0, abs=0.5)


def fifo_reference(n_cores: int):
    """An independent FIFO queue on identical cores (1-core jobs), for cross-checking."""
    import heapq

    w = seed_1551()
    free = [0.0] * n_cores
    total_wait = makespan = 0.0
    for arrival, runtime in zip(w.arrival_s, w.length_mi / 4400):
        start = max(heapq.heappop(free), arrival)
        total_wait += start - arrival
        heapq.heappush(free, start + runtime)
        makespan = max(makespan, start + runtime)
    return total_wait, makespan


def test_minimal_fleet_noop_is_long_and_penalised():
    r = run(SimConfig())
    # 14 cores (1/1/1) for 155 core-hours from t = 1800 s: pinned figures
    assert r["terminated"] and r["jobs_finished"] == 1551
    assert r["steps"] == 697
    assert r["vm_cost"] == pytest.approx(1.4 * 697 / 60.0, abs=0.005)  # $16.26
    assert r["wait_penalty"] == pytest.approx(245.19, abs=0.05)
    # and they agree with an independent FIFO queue model (CloudSim Plus adds ~0.01 s per job)
    total_wait, makespan = fifo_reference(14)
    assert r["wait_penalty"] == pytest.approx(total_wait * 1e-5, rel=1e-3)
    assert r["makespan_s"] == pytest.approx(makespan, abs=5.0)


def test_same_seed_same_trajectory_different_seed_differs():
    cfg = SimConfig(action_mode="per-type")
    wl = seed_1551()
    rng = np.random.default_rng(7)
    actions = rng.choice([-1, 0, 1], p=[0.2, 0.5, 0.3], size=(120, 1, 3)).astype(np.int8).repeat(2, axis=1)

    def trajectory(seeds):
        b = SimBatch(cfg, wl, 2)
        try:
            out = [b.reset([0, 1], seeds).header.copy()]
            for a in actions:
                s = b.step(a)
                out.append(np.concatenate([s.header, s.raw.vm_cpu_busy, s.raw.vm_running_for_s], axis=1))
            return out
        finally:
            b.close()

    a, b_, c = trajectory([5, 5]), trajectory([5, 5]), trajectory([5, 6])
    for x, y in zip(a, b_):
        np.testing.assert_array_equal(x, y)
    # both envs of the batch with the same seed and actions are the same too
    assert all(np.array_equal(x[0], x[1]) for x in a[1:])
    assert any(not np.array_equal(x[1], y[1]) for x, y in zip(a[1:], c[1:]))


def test_bounds_are_never_crossed():
    cfg = SimConfig(action_mode="per-type")
    b = SimBatch(cfg, seed_1551(), 1)
    try:
        b.reset([0], [3])
        for _ in range(15):
            s = b.step(np.array([[5, 5, 5]]))
        assert s.counts[0].tolist() == [10, 10, 10]
        assert not s.can_add[0].any()
        for _ in range(15):
            s = b.step(np.array([[-5, -5, -5]]))
        assert s.counts[0].tolist() == [1, 0, 0]
        assert not s.can_remove[0].any()
        assert not s.applied[0]
    finally:
        b.close()


def test_boot_delay_is_seeded_and_within_bounds():
    cfg = SimConfig(action_mode="per-type")
    b = SimBatch(cfg, seed_1551(), 1)
    try:
        b.reset([0], [11])
        s = b.step(np.array([[1, 1, 1]]))  # three new VMs at t = 0
        assert s.counts[0].tolist() == [2, 2, 2] and s.booting[0].sum() >= 1
        s = b.step(np.zeros((1, 3)))  # t = 120: every delay is within 45..97 s
        assert s.booting[0].tolist() == [0, 0, 0] and s.running[0].tolist() == [2, 2, 2]
        running_for = s.raw.vm_running_for_s[0][s.raw.vm_type[0] >= 0]
        new = np.sort(running_for)[:3]
        assert np.all((new >= 120 - 97 - 1e-6) & (new <= 120 - 45 + 1e-6))
    finally:
        b.close()


def test_removed_vm_jobs_are_requeued_and_counted_waiting():
    cfg = SimConfig(action_mode="per-type").with_initial([1, 0, 1])
    b = SimBatch(cfg, seed_1551(), 1)
    try:
        b.reset([0], [2])
        for _ in range(31):  # first batch of 100 jobs at t = 1800 s: 10 cores busy
            s = b.step(np.zeros((1, 3)))
        waiting_before = s.header[0, H_WAITING]
        assert s.header[0, H_REQUEUED] == 0 and waiting_before == 90
        s = b.step(np.array([[0, 0, -1]]))  # remove the busy L VM: its 8 jobs go back
        assert s.applied[0]
        assert s.header[0, H_REQUEUED] == 8
        assert s.header[0, H_WAITING] == waiting_before + 8
        assert s.header[0, 15] > 0  # lost core-seconds
        while not s.terminated[0]:
            s = b.step(np.zeros((1, 3)))
        jobs = b.job_stats(0)
        assert np.all(jobs[:, 2] >= 0)  # every job finished
        assert int((jobs[:, 4] > 0).sum()) == 8  # exactly the 8 re-queued jobs restarted
    finally:
        b.close()


def test_cooldown_masks_and_blocks_actions():
    cfg = SimConfig(action_mode="paper", cooldown_s=180)
    env = CloudSimEnv(cfg, "seed-1551")
    try:
        env.reset(seed=0)
        _, _, _, _, info = env.step(1)  # add S at t = 0: applied, cool-down until 180 s
        assert info["action_applied"] and info["in_cooldown"]
        assert info["action_mask"].tolist() == [True] + [False] * 6
        _, _, _, _, info = env.step(3)  # t = 60: blocked
        assert not info["action_applied"] and info["vm_running"].sum() + info["vm_booting"].sum() == 4
        env.step(0)  # t = 120
        _, _, _, _, info = env.step(0)  # t = 180: free again at the start of the next step
        assert not info["in_cooldown"] and info["action_mask"][3]
        _, _, _, _, info = env.step(3)
        assert info["action_applied"]
    finally:
        env.close()


def test_unknown_java_config_key_is_rejected():
    from sim_bridge.errors import SimulatorError
    from sim_bridge.gateway import shared_gateway

    gw = shared_gateway()
    wid = gw.call("loadWorkload", bytearray(seed_1551().pack()))
    bad = SimConfig().java_json().replace('"cooldown_s"', '"cooldwn_s"')
    with pytest.raises(SimulatorError, match="cooldwn_s"):
        gw.call("createBatch", bad, wid, 1)
    gw.call("closeWorkload", wid)


@pytest.mark.parametrize("cores", [1, 2, 4, 8])
def test_a_multi_core_job_runs_for_its_run_time(cores):
    """`length_mi` is MI on EACH core: a job of 3600 s x 4400 MIPS takes 3600 s however many cores
    it holds (it once finished `cores` times sooner: the gateway divided the length by them)."""
    from sim_bridge.workloads import Workload

    w = Workload("wide", np.array([0.0]), np.array([3600.0 * 4400.0]), np.array([cores], np.int32), np.array([1.0]))
    cfg = SimConfig(action_mode="per-type").with_initial([1, 1, 1])
    r = run_episodes(cfg, w, make_builtin_policy("noop", "per-type", ("S", "M", "L")), [1])[0]
    assert r["terminated"] and r["makespan_s"] == pytest.approx(3600.0, abs=0.5)
