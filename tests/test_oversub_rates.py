"""The agents' action set (`C2MarlConfig.rates`, ours beside the paper's six RATES): named grids,
training that acts only on the chosen grid, a saved policy that keeps it (and refuses a grid its
network does not fit), and the admit route reporting the policy's own grid."""
from __future__ import annotations

import json

import numpy as np
import pytest
from fastapi.testclient import TestClient

from agents.oversubscription.c2marl import C2Marl, C2MarlConfig, run_training_episode
from agents.oversubscription.features import observation, observation_size, request_mask
from agents.oversubscription.network import C2MarlEnsemble, C2MarlNet
from agents.oversubscription.policy import OversubPolicy
from agents.oversubscription.settings import RATE_GRIDS, RATES, SETTINGS, check_rates, rate_grid
from agents.oversubscription.sim import OversubSim
from agents.oversubscription.train import main as train_main
from agents.oversubscription.train import train

from oversub_toy import toy_workload

TINY = SETTINGS["tiny"]
TENTHS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def test_the_paper_grid_is_the_default_and_tenths_fills_the_gap_above_0_6():
    assert C2MarlConfig().rates == "paper" and rate_grid("paper") == RATES == (0.2, 0.3, 0.4, 0.5, 0.6, 1.0)
    assert rate_grid("tenths") == TENTHS
    with pytest.raises(ValueError, match="rates must be one of"):
        rate_grid("halves")
    for bad in ([0.5, 0.4], [0.0, 1.0], [0.5, 1.5], [], ["x"], None):
        with pytest.raises(ValueError, match="rates must"):
            check_rates(bad)
    assert check_rates([0.25, 1]) == (0.25, 1.0)


def test_training_on_tenths_acts_only_on_tenths_and_every_rate_of_the_grid_is_reachable():
    cfg = C2MarlConfig(rates="tenths", episodes=4, updates_per_episode=1, seed=3, eps_start=1.0, eps_end=1.0)
    agent = C2Marl(TINY.n_subscribers, observation_size(TINY, cfg.features), cfg, 0.01)
    assert agent.n_actions == 9 and agent.net.n_actions == 9
    sim = OversubSim(TINY, toy_workload(steps=TINY.episode_steps))
    seen = []
    step = sim.step

    def recording_step(rates):
        seen.append(np.asarray(rates, dtype=float).copy())
        return step(rates)
    sim.step = recording_step
    run_training_episode(agent, sim, TINY, 0, lambda v, f: observation(v, TINY, cfg.features, f), request_mask)
    used = np.unique(np.round(np.concatenate(seen), 6))
    assert set(used) <= set(TENTHS)
    assert {0.7, 0.8, 0.9} & set(used)          # epsilon 1 draws the rates the paper's set lacks


def test_a_policy_keeps_its_grid_through_save_and_load_and_the_runs_metadata(tmp_path):
    cfg = C2MarlConfig(rates="tenths", episodes=3, updates_per_episode=2, seed=1)
    policy, _ = train("tiny", cfg, trace_seed=7, progress=False, out=tmp_path / "p")
    assert policy.rate_set.tolist() == list(TENTHS) and list(policy.action_space.nvec) == [9] * TINY.n_subscribers
    meta = json.loads((tmp_path / "p" / "metadata.json").read_text())
    assert meta["rates"] == list(TENTHS) and meta["training"]["config"]["rates"] == "tenths"
    loaded = OversubPolicy.load(tmp_path / "p")
    assert loaded.rate_set.tolist() == list(TENTHS)
    obs = np.abs(np.random.default_rng(0).normal(size=loaded.observation_space.shape)).astype(np.float32)
    d, _ = loaded.decide(obs)
    assert d.info["rates"] == [TENTHS[i] for i in d.action]
    voted = OversubPolicy(C2MarlEnsemble([loaded.net, loaded.net]), TINY, rates=TENTHS).with_vote("max")
    assert voted.rate_set.tolist() == list(TENTHS)


def test_a_saved_policy_without_rates_reads_the_papers_and_a_grid_its_network_does_not_fit_is_refused(tmp_path):
    net = C2MarlNet(TINY.n_subscribers, observation_size(TINY), len(RATES))
    OversubPolicy(net, TINY, version="old-1").save(tmp_path / "old")
    meta_path = tmp_path / "old" / "metadata.json"
    meta = json.loads(meta_path.read_text())
    del meta["rates"]                             # as policies saved before the grid was configurable
    meta_path.write_text(json.dumps(meta))
    assert OversubPolicy.load(tmp_path / "old").rate_set.tolist() == list(RATES)
    meta["rates"] = list(TENTHS)                  # 9 rates for a 6-action network: the spaces differ
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ValueError):
        OversubPolicy.load(tmp_path / "old")
    meta["rates"] = [0.6, 0.2, 0.3, 0.4, 0.5, 1.0]
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="ascend"):
        OversubPolicy.load(tmp_path / "old")
    with pytest.raises(ValueError, match="9 rates for a network of 6 actions"):
        OversubPolicy(net, TINY, rates=TENTHS)


def test_the_admit_route_offers_the_policys_own_grid():
    from agents.oversubscription.service import create_app

    net = C2MarlNet(TINY.n_subscribers, observation_size(TINY), len(TENTHS))
    c = TestClient(create_app("c2marl", OversubPolicy(net, TINY, version="t-1", rates=TENTHS)))
    body = {"subscriber": 0, "cores": 8.0, "mem_gb": 32.0, "net_gbps": 2.0, "hour": 13,
            "allocated": [[4.0, 16.0, 1.0], [0.0, 0.0, 0.0], [10.0, 40.0, 2.5]],
            "requested_live": [8.0, 0.0, 10.0]}
    d = c.post("/v1/agents/c2marl/admit", json=body).json()
    assert d["rates_offered"] == list(TENTHS) and d["rate"] in TENTHS


def test_the_cli_and_the_experiment_refuse_an_unknown_grid(tmp_path, capsys):
    from agents.oversubscription.experiment import run

    with pytest.raises(SystemExit):
        train_main(["--setting", "tiny", "--rates", "halves", "--episodes", "1"])
    assert "invalid choice" in capsys.readouterr().err
    with pytest.raises(ValueError, match="rates must be one of"):
        run(tmp_path / "x", quick=True, rates="halves")
    from samm.cli.main import cli

    # the CLI names the grids itself (as it does the votes); they must stay settings.RATE_GRIDS
    option = next(p for p in cli.commands["experiment"].commands["c2marl"].params if p.name == "rates")
    assert sorted(option.type.choices) == sorted(RATE_GRIDS)


def test_the_grid_benchmark_rounds_a_tuned_rule_up_and_the_coarser_grid_saves_least(tmp_path, capsys):
    """benchmarks/oversub_rate_grid.py: rounding up only raises a rule's rates, so S-Cores falls from the
    continuous rule to tenths to the paper's set (rates come from usage history, not placement)."""
    from agents.oversubscription.baselines import RoundedUp, round_up
    from benchmark_script import load_benchmark

    mod = load_benchmark("oversub_rate_grid")
    out = tmp_path / "rg.json"
    assert mod.main(["--case", "tiny-cold", "--rule", "Max", "--params",
                     '{"n": 3.0, "p": 99.0, "window": 24, "headroom": 2.0}', "--test-episodes", "3",
                     "--json", str(out)]) == 0
    rows = {r["rates"]: r for r in json.loads(out.read_text())["rows"]}
    assert list(rows) == ["continuous", "paper", "tenths"]
    assert rows["paper"]["s_cores"] < rows["tenths"]["s_cores"] < rows["continuous"]["s_cores"]
    assert mod.main(["--case", "tiny-cold", "--rule", "Max", "--grids", "halves"]) == 2
    assert mod.main(["--case", "tiny-cold", "--rule", "Max", "--params", "[1"]) == 2
    assert "unknown grids" in capsys.readouterr().err

    class Fixed:
        name = "fixed"

        def reset(self):
            pass

        def rates(self, view):
            return np.array([0.05, 0.65, 1.0])
    wrapped = RoundedUp(Fixed(), TENTHS, "tenths")
    assert wrapped.name == "fixed rounded up to tenths" and list(wrapped.rates(None)) == [0.2, 0.7, 1.0]
    assert list(round_up(np.array([0.65]))) == [1.0]


def test_the_gym_env_on_tenths_passes_the_checker_and_reserves_at_the_chosen_rate():
    from gymnasium.utils.env_checker import check_env

    from agents.oversubscription.env import OversubscriptionEnv

    env = OversubscriptionEnv("tiny", workload_fn=lambda rng: toy_workload(seed=int(rng.integers(100))),
                              rates="tenths")
    assert list(env.action_space.nvec) == [9] * TINY.n_subscribers
    check_env(env, skip_render_check=True)
    env.reset(seed=1)
    _, _, _, _, info = env.step(np.full(3, 5, np.int64))          # index 5 = 0.7, absent from the paper's set
    rec = env._sim.record
    assert rec.steps == 1 and rec.requested_cores > 0
    assert rec.assigned_cores == pytest.approx(0.7 * rec.requested_cores)
    with pytest.raises(ValueError, match="indices into"):
        env.step(np.full(3, 9, np.int64))
    with pytest.raises(ValueError, match="rates must be one of"):
        OversubscriptionEnv("tiny", rates="halves")
