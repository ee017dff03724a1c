"""Edge inputs of the five learning agents' `decide` (the Policy protocol called directly, without the
service's data plane in front): a non-finite or misshapen observation is refused with InvalidInput
naming the field, instead of a NaN action, a silently wrong one, or a bare numpy/torch error."""
from __future__ import annotations

import numpy as np
import pytest

from samm.plan.dataplane import InvalidInput


# -- LSTM-PPO (the main paper's agent) ------------------------------------------------------------
def _ppo(action_mode="per-type"):
    from agents.ppo.agent import LstmPpoAgent

    return LstmPpoAgent(action_mode=action_mode)


def test_ppo_decide_refuses_nan_observation_instead_of_removing_every_type():
    agent = _ppo()
    with pytest.raises(InvalidInput, match=r"observation\.cpu_mean: must be a finite number"):
        agent.decide({**{f: 0.5 for f in agent.feature_names}, "cpu_mean": float("nan")})


def test_ppo_nan_observation_leaves_the_session_state_usable():
    agent = _ppo()
    ok = [0.5] * len(agent.feature_names)
    first, state = agent.decide(ok)
    with pytest.raises(InvalidInput):
        agent.decide([float("nan")] * len(agent.feature_names), state)
    # the refused call changed nothing: the state still decides finite probabilities
    second, _ = agent.decide(ok, state)
    assert np.isfinite(np.asarray(second.info["probabilities"], dtype=float)).all()


def test_ppo_decide_names_the_expected_features_on_a_short_vector():
    agent = _ppo("paper")
    with pytest.raises(InvalidInput, match=r"6 values, the policy reads 7"):
        agent.decide([0.5] * 6)


@pytest.mark.parametrize("mode", ["paper", "per-type"])
def test_ppo_without_vm_types_is_refused_when_built_not_at_the_first_decision(mode):
    from agents.ppo.agent import LstmPpoAgent

    with pytest.raises(ValueError, match="at least one VM type"):
        LstmPpoAgent(action_mode=mode, type_names=())


# -- C2MARL ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def c2marl():
    from agents.oversubscription.policy import shipped_policy

    return shipped_policy()


def test_c2marl_decide_refuses_nan_observation(c2marl):
    n = c2marl.observation_space.shape[0]
    with pytest.raises(InvalidInput, match=r"observation\[0\]: must be a finite number"):
        c2marl.decide(np.full(n, np.nan))


@pytest.mark.parametrize("size", [0, -1])
def test_c2marl_decide_names_the_length_of_a_wrong_vector(c2marl, size):
    n = c2marl.observation_space.shape[0]
    with pytest.raises(InvalidInput, match=rf"{n + size if size else 0} values, the policy reads {n}"):
        c2marl.decide(np.zeros(n + size if size else 0))


def test_c2marl_decide_still_decides_a_valid_observation(c2marl):
    d, _ = c2marl.decide(np.zeros(c2marl.observation_space.shape[0]))
    assert len(d.action) == c2marl.setting.n_subscribers and np.isfinite(d.info["rates"]).all()


# -- OSDEC -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def osdec():
    from agents.deferrable_jobs.policy import shipped_policy

    return shipped_policy()


def _osdec_obs(policy):
    return {k: np.zeros(s.shape, dtype=np.float32) for k, s in policy.observation_space.spaces.items()}


def test_osdec_decide_refuses_nan_tokens_with_the_field_named(osdec):
    obs = _osdec_obs(osdec)
    obs["tokens"][0, 0] = np.nan
    with pytest.raises(InvalidInput, match=r"observation\.tokens: must hold finite numbers only"):
        osdec.decide(obs)


def test_osdec_decide_refuses_a_misshapen_history(osdec):
    obs = _osdec_obs(osdec)
    obs["history"] = obs["history"][:-1]
    with pytest.raises(InvalidInput, match=r"observation\.history: shape"):
        osdec.decide(obs)


def test_osdec_decide_with_no_eligible_job_still_answers(osdec):
    d, _ = osdec.decide(_osdec_obs(osdec))   # an all-False mask: nothing eligible
    assert d.info["eligible_shown"] == 0 and np.isfinite(d.action).all()


# -- LRA -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lra():
    from agents.lra_placement.policy import shipped_policy

    return shipped_policy()


def _lra_obs(policy):
    return {"app": np.eye(policy.n_apps)[0], "counts": np.zeros((policy.n_nodes, policy.n_apps)),
            "remaining": np.ones(policy.n_apps)}


def test_lra_decide_refuses_a_nan_app_instead_of_placing_app_0(lra):
    obs = _lra_obs(lra)
    obs["app"] = np.r_[np.nan, np.zeros(lra.n_apps - 1)]
    with pytest.raises(InvalidInput, match=r"observation\.app: must hold finite numbers only"):
        lra.decide(obs)


def test_lra_decide_refuses_nan_remaining_with_the_field_named(lra):
    obs = _lra_obs(lra)
    obs["remaining"] = np.full(lra.n_apps, np.nan)
    with pytest.raises(InvalidInput, match=r"observation\.remaining"):
        lra.decide(obs)


def test_lra_decide_names_a_mask_of_the_wrong_length(lra):
    with pytest.raises(InvalidInput, match=rf"action_mask: length 3 != {lra.n_nodes} nodes"):
        lra.decide(_lra_obs(lra), mask=np.ones(3, dtype=np.int8))


def test_lra_decide_with_an_all_false_mask_names_the_mask_not_the_counts(lra):
    with pytest.raises(InvalidInput, match=r"action_mask: every node is masked out"):
        lra.decide(_lra_obs(lra), mask=np.zeros(lra.n_nodes, dtype=np.int8))


# -- Reclaimer SAC ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reclaimer():
    from agents.microservice_cores.policy import shipped_policy

    return shipped_policy("hotel")


def test_reclaimer_decide_refuses_nan_observation(reclaimer):
    obs = np.zeros(reclaimer.observation_space.shape, dtype=np.float32)
    obs[2, 5] = np.nan
    with pytest.raises(InvalidInput, match=r"observation\[2\]\[5\]: must be a finite number"):
        reclaimer.decide(obs)


@pytest.mark.parametrize("services", [0, 14])
def test_reclaimer_decide_names_the_expected_shape(reclaimer, services):
    width = reclaimer.observation_space.shape[1]
    with pytest.raises(InvalidInput, match=r"observation: shape .* \(15 services of hotel\)"):
        reclaimer.decide(np.zeros((services, width), dtype=np.float32))


def test_reclaimer_decide_still_decides_a_valid_observation(reclaimer):
    d, _ = reclaimer.decide(np.zeros(reclaimer.observation_space.shape, dtype=np.float32))
    assert len(d.action) == 15 and np.isfinite(d.action).all()


# -- LRA: a saved policy's files -------------------------------------------------------------------
def _lra_copy(tmp_path):
    import shutil

    from agents.lra_placement.policy import SHIPPED_DIR

    d = tmp_path / "lra"
    shutil.copytree(SHIPPED_DIR, d)
    return d


@pytest.mark.parametrize("content, message", [(b"garbage", "cannot load the policy: not a readable PyTorch file"), (None, "missing")])
def test_lra_load_names_the_weights_file_when_it_is_garbage_or_missing(tmp_path, content, message):
    from agents.lra_placement.policy import PlacementPolicy

    d = _lra_copy(tmp_path)
    if content is None:
        (d / "policy.pt").unlink()
    else:
        (d / "policy.pt").write_bytes(content)
    with pytest.raises(ValueError, match=rf"policy\.pt: {message}"):
        PlacementPolicy.load(d)


@pytest.mark.parametrize("hidden", [[], [0]])
def test_lra_load_names_the_metadata_for_a_network_without_width(tmp_path, hidden):
    import json

    from agents.lra_placement.policy import PlacementPolicy

    d = _lra_copy(tmp_path)
    meta = json.loads((d / "metadata.json").read_text())
    meta["network"]["hidden"] = hidden
    (d / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"metadata\.json: .*hidden width"):
        PlacementPolicy.load(d)


def test_lra_load_refuses_nan_weights_instead_of_placing_everything_on_node_0(tmp_path):
    import torch

    from agents.lra_placement.policy import PlacementPolicy

    d = _lra_copy(tmp_path)
    payload = torch.load(d / "policy.pt", weights_only=True)
    payload["scorer"]["out.bias"] = torch.full_like(payload["scorer"]["out.bias"], float("nan"))
    torch.save(payload, d / "policy.pt")
    with pytest.raises(ValueError, match=r"policy\.pt: out\.bias holds NaN"):
        PlacementPolicy.load(d)


# -- sampled decisions replay after a restart ---------------------------------------------------------
def test_sampled_decisions_of_reclaimer_and_lra_replay_in_a_fresh_policy_and_leave_torch_alone():
    """deterministic=False drew from torch's global generator (Reclaimer) and an unseeded numpy one
    (LRA): the same requests to a restarted service were answered differently."""
    import torch

    from agents.registry import make_policy

    def draws(policy, obs):
        out = []
        for _ in range(3):
            decision, _ = policy.decide(obs, policy.initial_state(), deterministic=False)
            out.append(np.asarray(decision.action, dtype=float).round(6).tolist())
        return out

    reclaimer = make_policy("reclaimer")
    obs = np.full(reclaimer.observation_space.shape, 0.5, np.float32)
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    first = draws(reclaimer, obs)
    assert torch.rand(1) == before  # the global generator (training's) was not consumed
    assert draws(make_policy("reclaimer"), obs) == first
    assert len({str(x) for x in first}) > 1  # still sampled, not the mean action

    from agents.lra_placement.policy import SHIPPED_DIR, PlacementPolicy

    lra = PlacementPolicy.load(SHIPPED_DIR)
    assert draws(lra, lra.probe_observation()) == draws(PlacementPolicy.load(SHIPPED_DIR), lra.probe_observation())
