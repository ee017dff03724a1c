"""Second audit of Reclaimer's SAC training (agents/microservice_cores/sac.py, train.py)."""
from __future__ import annotations

import pytest
import torch

from agents.microservice_cores.policy import ReclaimerPolicy
from agents.microservice_cores.sac import ReplayBuffer
from agents.microservice_cores.train import main, sim_config, train
from agents.train_log import TrainingDiverged

TINY = ["--app", "chain3", "--envs", "2", "--quiet"]


def _tiny_cfg(**overrides):
    """Two 300-s episodes of two copies: the AutoScale fill, then plain SAC."""
    return sim_config(**{**dict(n_envs=2, hidden=16, classifier_updates=5, replay=20_000, updates_per_step=1,
                                autoscale_steps=600, classifier_steps=0, total_steps=1200), **overrides})


@pytest.fixture(scope="module")
def both_policy(tmp_path_factory):
    """A tiny policy whose critics read a and log a (`--critic-action both`: a wider critic input)."""
    out = tmp_path_factory.mktemp("both") / "run"
    train("chain3", _tiny_cfg(critic_action="both"), seed=1, out=out, progress=False)
    return out / "policy"


def test_a_continued_policy_records_the_settings_its_networks_were_built_with(both_policy, tmp_path):
    """--init-policy of a `--critic-action both` policy trained it as built (critics reading a and log a)
    but saved it under the recipe's "linear": the run's policy then failed to load ("weights do not fit
    the network"), the whole run lost."""
    out = tmp_path / "cont"
    assert main([*TINY, "--steps", "600", "--init-policy", str(both_policy), "--continue", "--out", str(out)]) == 0
    cont = ReclaimerPolicy.load(out / "policy")
    assert cont.cfg.critic_action == "both"


def test_a_flag_the_initial_policy_cannot_honour_is_refused_by_name(both_policy, tmp_path, capsys):
    """--critic-action log with such a policy was silently ignored (its critics kept reading a and log a)."""
    out = tmp_path / "cont"
    assert main([*TINY, "--steps", "600", "--init-policy", str(both_policy), "--continue", "--critic-action", "log",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--critic-action log" in err and "'both'" in err and "Traceback" not in err
    assert not (out / "policy").exists()


def test_a_run_from_a_saved_policy_trains_at_the_precision_it_records(both_policy, tmp_path):
    """`--init-policy P --precision bf16-state` recorded bf16-state while the agent went on updating at P's
    fp32 (its own config); and without --precision, P's bf16-state runs were recorded as the recipe's fp32."""
    init = ReclaimerPolicy.load(both_policy)
    run = train("chain3", _tiny_cfg(critic_action="both", precision="bf16-state", autoscale_steps=0, total_steps=600),
                seed=5, progress=False, init=init.agent)
    assert run.agent.cfg.precision == run.cfg.precision == "bf16-state"
    run.save(tmp_path / "bf16")
    out = tmp_path / "cont"
    assert main([*TINY, "--steps", "600", "--init-policy", str(tmp_path / "bf16"), "--continue",
                 "--out", str(out)]) == 0
    assert ReclaimerPolicy.load(out / "policy").cfg.precision == "bf16-state"


def test_continue_refuses_a_qos_margin_other_than_the_policys_own(both_policy, tmp_path, capsys):
    """--continue --qos-margin 0.9 trained silently against the policy's own margin (1.0 here)."""
    out = tmp_path / "cont"
    assert main([*TINY, "--steps", "600", "--init-policy", str(both_policy), "--continue", "--qos-margin", "0.9",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--qos-margin 0.9" in err and "--qos-margin 1.0" in err
    assert not out.exists()


def test_train_refuses_an_initial_agent_built_for_other_settings(both_policy):
    init = ReclaimerPolicy.load(both_policy)
    with pytest.raises(ValueError, match="critic_action"):
        train("chain3", _tiny_cfg(), seed=2, progress=False, init=init.agent)


def test_a_continued_run_learns_when_one_episode_of_its_copies_outgrows_the_replay(both_policy):
    """A continued run waits for one episode of every copy before SAC updates; when that was more than the
    replay holds (`--envs 334` on the recipe's 100,000) it never updated and saved the policy unchanged."""
    init = ReclaimerPolicy.load(both_policy)
    before = init.agent.actor.head.weight.clone()
    cfg = _tiny_cfg(critic_action="both", replay=400, autoscale_steps=0)
    run = train("chain3", cfg, seed=4, progress=False, init=init.agent, keep_norm=True)
    assert run.log[-1]["critic_loss"] is not None
    assert not torch.equal(run.agent.actor.head.weight, before)


def test_a_diverged_run_stops_without_saving_a_nan_policy(tmp_path):
    """A learning rate far too large made every weight NaN and the NaN network was saved as the policy
    (its episodes logged at NaN mean cores), as the other problems' trainers no longer do."""
    out = tmp_path / "nan"
    with pytest.raises(TrainingDiverged, match="not finite"):
        train("chain3", _tiny_cfg(lr=1e6, alpha_lr=1e6), seed=3, out=out, progress=False)
    assert not (out / "policy").exists()


def test_the_cli_exits_1_on_a_diverged_network_without_saving_it(tmp_path, monkeypatch, capsys):
    """The same through `python -m agents.microservice_cores.train` (the recipe's rate made far too large:
    the CLI has no --lr): exit 0 and a NaN policy saved; now exit 1, a failure of the work, as the
    other problems' trainers."""
    from agents.microservice_cores import train as train_mod

    monkeypatch.setitem(train_mod.SIM_TRAINING, "lr", 1e6)
    monkeypatch.setitem(train_mod.SIM_TRAINING, "alpha_lr", 1e6)
    out = tmp_path / "nan"
    assert main([*TINY, "--steps", "2400", "--out", str(out)]) == 1
    assert "not finite" in capsys.readouterr().err
    assert not (out / "policy").exists()


def test_a_replay_smaller_than_one_second_of_the_copies_is_refused_by_name():
    """SacConfig(replay=3) with 4 copies rounded the capacity to 0 and failed after the warm-up, at the
    first add, with a bare IndexError ("index 0 is out of bounds for axis 0 with size 0")."""
    with pytest.raises(ValueError, match="replay of 3 transitions"):
        ReplayBuffer(3, n_services=2, width=8, n_envs=4, seed=0)
    with pytest.raises(ValueError, match="replay of 3 transitions"):
        train("chain3", _tiny_cfg(replay=3, n_envs=4), seed=0, progress=False)
    buf = ReplayBuffer(4, n_services=2, width=8, n_envs=4, seed=0)     # exactly one second: fine
    assert buf.cap == 4
