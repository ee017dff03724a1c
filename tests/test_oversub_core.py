"""Oversubscription core: best fit and hotness on hand-made clusters, the metrics on a
hand-checkable run, the primal-dual multiplier, the Gymnasium env and policy persistence."""
from __future__ import annotations

import numpy as np
import pytest

from agents.oversubscription.c2marl import C2Marl, C2MarlConfig
from agents.oversubscription.cluster import NO_PM, Cluster, hot, pm_usage
from agents.oversubscription.features import observation, observation_size
from agents.oversubscription.metrics import pm_hot_r, summarise
from agents.oversubscription.settings import SETTINGS, Setting
from agents.oversubscription.sim import OversubSim, run_episode
from agents.oversubscription.workload import Workload

from oversub_toy import toy_workload


def test_best_fit_picks_the_tightest_pm_where_memory_and_network_fit():
    c = Cluster(3, cores=10, mem=100, net=10)
    c.free[:] = [[6, 100, 10], [3, 100, 10], [4, 5, 10]]
    assert c.best_fit(3, 1, 1) == 1           # leaves 0 cores: tightest
    assert c.best_fit(4, 10, 1) == 0          # PM 2 has 4 cores but not the memory
    assert c.best_fit(4, 1, 1) == 2           # ties broken by fewest cores left
    assert c.best_fit(7, 1, 1) == NO_PM
    pm = c.allocate(3, 1, 1)
    assert pm == 1 and np.allclose(c.free[1], [0, 99, 9])
    c.release(1, 3, 1, 1)
    assert np.allclose(c.free[1], [3, 100, 10])


def test_hotness_is_use_above_beta_of_capacity():
    used = pm_usage(np.array([0, 0, 1, 2]), np.array([20.0, 19.0, 38.4, 39.0]), 3)
    assert used.tolist() == [39.0, 38.4, 39.0]
    assert hot(used, 64, 0.6).tolist() == [True, False, True]   # 0.6 * 64 = 38.4, strictly above is hot


def _one_pm_setting(**kw):
    base = dict(name="hand", n_subscribers=1, n_pms=2, pm_cores=10, pm_mem_gb=100, pm_net_gbps=10,
                episode_steps=4, delta_steps=2)
    base.update(kw)
    return Setting(**base)


def test_metrics_on_a_hand_checkable_run():
    # two VMs of 10 cores at step 0, living 4 steps; usage 0.3 then 0.4 then 0.3 then 0.4
    u = np.array([[0.3, 0.4, 0.3, 0.4]] * 2, np.float32)
    w = Workload(n_subscribers=1, steps=4, sub=[0, 0], arrive=[0, 0], depart=[9, 9], cores=[10, 10],
                 mem=[1, 1], net=[1, 1], usage=u)
    s = _one_pm_setting()
    sim = OversubSim(s, w)
    rec = run_episode(sim, lambda v: np.array([0.5]))
    # rate 0.5: both VMs (5 reserved cores each) share PM 0; its use is 6, 8, 6, 8 cores;
    # hot above 0.6 * 10 = 6 -> steps 1 and 3 -> 2 hot steps = delta -> the PM breaks the constraint
    assert rec.hot_counts.tolist() == [2, 0]
    assert rec.s_cores == pytest.approx(0.5)
    m = summarise([rec], s.delta_steps)
    assert m["pm_hot_r"] == 1.0 and m["c_hot_r"] == 1.0 and not m["satisfied"]["0.75"]
    rec1 = run_episode(sim, lambda v: np.array([1.0]))
    # no oversubscription: one VM per PM, 3-4 cores used each, never hot
    assert rec1.hot_counts.tolist() == [0, 0] and rec1.s_cores == 0.0
    assert pm_hot_r([rec, rec1, rec1, rec1], 2) == pytest.approx(0.25)
    assert summarise([rec, rec1, rec1, rec1], 2)["satisfied"] == {"0.75": True, "0.85": False, "0.95": False}


def test_departures_free_reservations_and_rejections_are_counted():
    u = np.full((3, 4), 0.1, np.float32)
    w = Workload(n_subscribers=1, steps=4, sub=[0, 0, 0], arrive=[0, 0, 2], depart=[2, 9, 9],
                 cores=[10, 10, 10], mem=[1, 1, 1], net=[1, 1, 1], usage=u)
    sim = OversubSim(_one_pm_setting(n_pms=1), w)
    rec = run_episode(sim, lambda v: np.array([1.0]))
    assert rec.rejected == 1          # the second VM finds no room at step 0
    assert rec.placed == 2            # the third fits once the first has left at step 2


def test_dual_variable_rises_while_violated_and_falls_when_held():
    agent = C2Marl(2, 10, C2MarlConfig(dual_lr=0.5, lambda_init=1.0), constraint_bound=0.01)
    agent.dual_update(0.5)
    assert agent.lam == pytest.approx(1.0 + 0.5 * 0.49)
    up = agent.lam
    agent.dual_update(0.0)
    assert agent.lam < up
    for _ in range(1000):
        agent.dual_update(0.0)
    assert agent.lam == 0.0            # projected onto lambda >= 0


def test_constraint_estimates_count_broken_pms_or_the_worst_pms_share():
    T, K = 10, 4
    spread = [np.eye(K, dtype=bool)[k % K] for k in range(20)]   # one PM breaks per episode, in turn
    broken = C2Marl(2, 10, C2MarlConfig(alpha=0.75, dual_estimate="broken"), constraint_bound=0.25 / T)
    worst = C2Marl(2, 10, C2MarlConfig(alpha=0.75, dual_estimate="pm-max", dual_window=8), constraint_bound=0.25 / T)
    for b in spread:
        u_sum, u_max = broken.constraint_estimate(b, T), worst.constraint_estimate(b, T)
    # one broken PM per episode: the sum bound (<= 0.25 broken per episode) is violated, while each
    # PM breaks in only 1 of every 4 episodes, which is exactly what alpha = 0.75 allows
    assert u_sum == pytest.approx(1.0 / T) and u_sum > broken.c
    assert u_max == pytest.approx(0.25 / T) and u_max <= worst.c + 1e-12
    # one PM breaking every episode violates both
    for _ in range(8):
        u_max = worst.constraint_estimate(np.eye(K, dtype=bool)[0], T)
    assert u_max == pytest.approx(1.0 / T) and u_max > worst.c
    with pytest.raises(ValueError, match="dual_estimate"):
        C2Marl(2, 10, C2MarlConfig(dual_estimate="nope"), constraint_bound=0.1).constraint_estimate(spread[0], T)


def test_a_budget_margin_tightens_the_bound_the_dual_update_sees_but_not_the_level():
    from dataclasses import replace

    from agents.oversubscription.train import constraint_bound

    s = SETTINGS["internal"]
    for constraint in ("pm", "attributed", "cluster"):
        paper = C2MarlConfig(alpha=0.85, constraint=constraint)
        halved = replace(paper, budget_margin=2.0)
        assert constraint_bound(s, halved) == pytest.approx(constraint_bound(s, paper) / 2)
        assert halved.alpha == 0.85
    assert constraint_bound(s, C2MarlConfig(alpha=0.85)) == pytest.approx(0.15 / s.episode_steps)
    with pytest.raises(ValueError, match="budget_margin"):
        constraint_bound(s, C2MarlConfig(budget_margin=0.5))
    # the worst PM breaking in 1 of 10 episodes meets 0.85's budget (0.15) but not half of it: lambda
    # falls under the paper's budget and rises under the halved one
    T = s.episode_steps
    u = 0.1 / T
    for margin, moves in ((1.0, "falls"), (2.0, "rises")):
        agent = C2Marl(2, 10, C2MarlConfig(alpha=0.85, budget_margin=margin, lambda_init=1.0),
                       constraint_bound=constraint_bound(s, C2MarlConfig(alpha=0.85, budget_margin=margin)))
        agent.dual_update(u)
        assert (agent.lam > 1.0) == (moves == "rises")


def test_observation_layout():
    s = SETTINGS["tiny"]
    sim = OversubSim(s, toy_workload())
    v = sim.reset()
    o = observation(v, s)
    assert o.shape == (observation_size(s),)
    n = s.n_subscribers
    assert o[7 * n + v.hour] == 1.0 and o[7 * n:].sum() == 1.0
    assert np.allclose(o[4 * n:5 * n], v.request[:, 0] / s.pm_cores)


def test_training_is_seeded_saved_and_reloaded(tmp_path):
    from agents.oversubscription.policy import OversubPolicy
    from agents.oversubscription.train import train

    s = SETTINGS["tiny"]
    ws = [toy_workload(seed=i) for i in range(3)]
    cfg = C2MarlConfig(episodes=12, seed=3, updates_per_episode=20)
    p1, l1 = train(s, cfg, workload_fn=lambda ep: ws[ep % 3], progress=False, out=tmp_path / "p")
    p2, l2 = train(s, cfg, workload_fn=lambda ep: ws[ep % 3], progress=False)
    assert [x.reward for x in l1] == [x.reward for x in l2]
    assert (tmp_path / "p" / "train-log.csv").is_file()
    loaded = OversubPolicy.load(tmp_path / "p")
    v = OversubSim(s, ws[0]).reset()
    assert np.array_equal(loaded.rates(v), p1.rates(v))
    with pytest.raises(ValueError, match="metadata"):
        OversubPolicy.load(tmp_path)


def test_env_passes_gymnasium_checker():
    from gymnasium.utils.env_checker import check_env
    from agents.oversubscription.env import OversubscriptionEnv

    env = OversubscriptionEnv("tiny", workload_fn=lambda rng: toy_workload(seed=int(rng.integers(100))))
    check_env(env, skip_render_check=True)
    obs, info = env.reset(seed=1)
    total, done = 0.0, False
    while not done:
        obs, r, done, trunc, info = env.step(np.zeros(3, np.int64))   # rate 0.2 everywhere
        total += r
    assert info["episode_record"].steps == SETTINGS["tiny"].episode_steps
    assert total > 0


def test_compiled_best_fit_matches_the_reference_loop():
    from agents.oversubscription.cluster import _place_batch_py

    rng = np.random.default_rng(0)
    c1 = Cluster(20, cores=64, mem=256, net=20)
    c2 = Cluster(20, cores=64, mem=256, net=20)
    cores = rng.choice([2.0, 4.0, 8.0, 30.0], size=300) * rng.choice([0.2, 0.5, 1.0], size=300)
    mem = rng.choice([4.0, 16.0, 64.0], size=300)
    net = rng.uniform(0.5, 4.0, size=300)
    fast = c1.allocate_many(cores, mem, net)
    slow = np.array([c2.allocate(c, m, n) for c, m, n in zip(cores, mem, net)])
    assert np.array_equal(fast, slow)
    assert (fast == NO_PM).any() and (fast != NO_PM).any()
    ref = _place_batch_py(Cluster(20, 64, 256, 20)._free, cores, mem, net, np.empty(300, np.int64))
    assert np.array_equal(ref, fast)
    assert np.all(c1.free >= -1e-9)


def test_agent_networks_are_n_independent_mlps_whatever_the_batched_layout():
    """C2MarlNet evaluates the N per-agent Q networks as one agent-major bmm; each agent's Q values
    and gradients must be those of its own three-layer MLP (the einsum definition over [B, N, .])."""
    import torch

    from agents.oversubscription.network import C2MarlNet

    torch.manual_seed(0)
    net = C2MarlNet(n_agents=5, obs_dim=11, n_actions=6, hidden=16)
    obs = torch.randn(7, 11)

    def reference(obs):
        x = obs.unsqueeze(1).expand(-1, 5, -1)
        for layer, act in ((net.agents.l1, True), (net.agents.l2, True), (net.agents.out, False)):
            x = torch.einsum("bni,nio->bno", x, layer.weight) + layer.bias
            x = torch.relu(x) if act else x
        return x

    q = net.agent_q(obs)
    assert q.shape == (7, 5, 6)
    torch.testing.assert_close(q, reference(obs), rtol=1e-6, atol=1e-6)
    net.zero_grad()
    net.agent_q(obs).square().sum().backward()
    grads = [p.grad.clone() for p in net.agents.parameters()]
    net.zero_grad()
    reference(obs).square().sum().backward()
    for g, ref in zip(grads, (p.grad for p in net.agents.parameters())):
        torch.testing.assert_close(g, ref, rtol=1e-5, atol=1e-6)
    # agent 2's values depend on agent 2's weights only
    with torch.no_grad():
        net.agents.l1.weight[3] += 1.0
    q2 = net.agent_q(obs)
    assert torch.equal(q2[:, 2], q[:, 2]) and not torch.equal(q2[:, 3], q[:, 3])
