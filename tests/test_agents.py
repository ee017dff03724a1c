"""Baselines' decisions on hand-made observation sequences; the Agent interface's save/load."""
import numpy as np
import pytest
import torch

from agents.base import load_agent
from agents.baselines.queue import QueueAgent
from agents.baselines.target_tracking import TargetTrackingAgent
from agents.baselines.threshold import ThresholdAgent
from agents.builtin import StaticAgent, deltas_to_actions, make_builtin_policy
from agents.factory import make_agent
from agents.ppo.agent import LstmPpoAgent
from agents.promote import sign_test_p
from sim_bridge.config import SimConfig


def test_threshold_rule_and_cooldown():
    a = ThresholdAgent(params={"upper": 0.75, "lower": 0.25, "cooldown_steps": 2})
    state = a.initial_state(1)
    seq = [0.9, 0.9, 0.9, 0.9, 0.5, 0.1, 0.1, 0.1]
    got = []
    for cpu in seq:
        d, state = a.act(np.array([[cpu]], np.float32), state)
        got.append(d.actions[0].tolist())
    add, keep, rem = [2, 2, 2], [1, 1, 1], [0, 0, 0]
    # act, 2 intervals of cool-down, act again, 2 more of cool-down (the 0.1 at t=5 waits), remove
    assert got == [add, keep, keep, add, keep, keep, rem, keep]


def test_threshold_paper_single_threshold():
    a = ThresholdAgent(params={"upper": 0.75, "lower": 0.75, "cooldown_steps": 0})
    d, _ = a.act(np.array([[0.8], [0.7], [0.75]], np.float32), a.initial_state(3))
    assert d.actions.tolist() == [[2, 2, 2], [0, 0, 0], [1, 1, 1]]


def test_threshold_state_is_per_caller():
    a = ThresholdAgent(params={"upper": 0.75, "lower": 0.25, "cooldown_steps": 3})
    s1, s2 = a.initial_state(1), a.initial_state(1)
    _, s1 = a.act(np.array([[0.9]], np.float32), s1)
    d2, _ = a.act(np.array([[0.9]], np.float32), s2)
    assert d2.actions[0].tolist() == [2, 2, 2]  # caller 2 is not in caller 1's cool-down


def test_target_tracking_scales_out_at_once_and_in_slowly():
    a = TargetTrackingAgent(params={"target": 0.5, "tolerance": 0.1, "stabilization_steps": 3})
    s = a.initial_state(1)
    # cpu 1.0 with 2/2/2 VMs: desired 4 each -> add one of each (one step at a time)
    d, s = a.act(np.array([[1.0, 2, 2, 2]], np.float32), s)
    assert d.actions[0].tolist() == [2, 2, 2]
    # within tolerance: keep
    d, s = a.act(np.array([[0.52, 4, 4, 4]], np.float32), s)
    assert d.actions[0].tolist() == [1, 1, 1]
    # load drops: the window still holds higher recommendations -> keep
    d, s = a.act(np.array([[0.1, 4, 4, 4]], np.float32), s)
    assert d.actions[0].tolist() == [1, 1, 1]
    d, s = a.act(np.array([[0.1, 4, 4, 4]], np.float32), s)
    d, s = a.act(np.array([[0.1, 4, 4, 4]], np.float32), s)
    assert d.actions[0].tolist() == [0, 0, 0]  # window passed: scale in
    d, s = a.act(np.array([[0.0, 1, 1, 1]], np.float32), s)
    assert d.actions[0].tolist() != [0, 0, 0]  # never empties a group


def test_queue_agent_desired_cores():
    a = QueueAgent(params={"jobs_per_core": 1.0, "stabilization_steps": 1, "cores": [2, 4, 8]})
    # 42 jobs -> 42 cores, 14 per type -> 7 S, 4 M, 2 L wanted; have 1/1/1 -> add all
    d, s = a.act(np.array([[40, 2, 1, 1, 1]], np.float32), a.initial_state(1))
    assert d.actions[0].tolist() == [2, 2, 2]
    d, s = a.act(np.array([[0, 0, 7, 4, 2]], np.float32), s)
    assert d.actions[0].tolist() == [0, 0, 0]
    d, s = a.act(np.array([[10, 4, 2, 2, 1]], np.float32), s)  # 14 cores: 3 S, 2 M, 1 L
    assert d.actions[0].tolist() == [2, 1, 1]


def test_paper_mode_translation_changes_one_type_per_step():
    assert deltas_to_actions("paper", np.array([[1, -1, 0], [0, -1, -1], [0, 0, 0]])).tolist() == [1, 4, 0]
    assert deltas_to_actions("per-type", np.array([[1, -1, 0]])).tolist() == [[2, 0, 1]]


def test_static_agent_holds_a_fleet():
    a = make_builtin_policy("static:3,1,0", "per-type", ("S", "M", "L"))
    d, _ = a.act(np.array([[1, 1, 1], [3, 1, 0]], np.float32), None)
    assert d.actions.tolist() == [[2, 1, 0], [1, 1, 1]]
    with pytest.raises(ValueError):
        StaticAgent(params={"targets": [1, 2]})


@pytest.mark.parametrize("mode", ["paper", "per-type"])
def test_lstm_agent_save_load_gives_identical_actions(tmp_path, mode):
    torch.manual_seed(0)
    a = LstmPpoAgent(action_mode=mode)
    a.save(tmp_path / "p")
    b = load_agent(tmp_path / "p")
    assert b.kind == "lstm-ppo" and b.action_mode == mode and b.version == a.version
    x = np.random.default_rng(0).random((25, 3, 7)).astype(np.float32)
    sa, sb = a.initial_state(3), b.initial_state(3)
    for t in range(25):
        da, sa = a.act(x[t], sa)
        db, sb = b.act(x[t], sb)
        np.testing.assert_array_equal(da.actions, db.actions)
        np.testing.assert_allclose(da.probabilities, db.probabilities, rtol=1e-6)
        np.testing.assert_allclose(da.values, db.values, rtol=1e-6)
    meta = b.metadata()
    assert meta["feature_names"][0] == "allocated_cores_ratio" and len(meta["action_names"]) in (3, 7)


def test_baseline_save_load_round_trip(tmp_path):
    a = make_agent("threshold", SimConfig(), {"upper": 0.8, "lower": 0.3, "cooldown_steps": 1})
    a.save(tmp_path / "t")
    b = load_agent(tmp_path / "t")
    assert b.params == a.params and b.kind == "threshold"


def test_load_rejects_mismatched_weights(tmp_path):
    LstmPpoAgent(action_mode="paper").save(tmp_path / "p")
    import json

    meta = json.loads((tmp_path / "p" / "metadata.json").read_text())
    meta["action_mode"] = "per-type"  # 7 logits in the file, 9 expected
    (tmp_path / "p" / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="does not match"):
        load_agent(tmp_path / "p")
    with pytest.raises(FileNotFoundError):
        load_agent(tmp_path / "nothing")


def test_sign_test():
    assert sign_test_p(5, 0) == pytest.approx(1 / 32)
    assert sign_test_p(0, 0) == 1.0
    assert sign_test_p(3, 2) == pytest.approx(0.5)


@pytest.mark.parametrize("mode", ["paper", "per-type"])
def test_numpy_inference_matches_the_torch_network(mode):
    torch.manual_seed(1)
    a = LstmPpoAgent(action_mode=mode)
    x = np.random.default_rng(2).random((30, 4, 7)).astype(np.float32)
    starts = np.zeros((30, 4), dtype=bool)
    starts[0] = True
    starts[12, 1] = starts[20, 3] = True
    state = a.initial_state(4)
    tstate = a.net.initial_state(4)
    for t in range(30):
        state = a.reset_state(state, starts[t])
        d, state = a.act(x[t], state)
        with torch.no_grad():
            logits, value, tstate = a.net.step(torch.as_tensor(x[t]), tstate, torch.as_tensor(starts[t], dtype=torch.float32))
            probs = torch.stack(a.net.dist(logits).probs(), dim=1).numpy()
        np.testing.assert_allclose(d.values, value.numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(np.asarray(d.probabilities).reshape(probs.shape), probs, rtol=1e-4, atol=1e-6)
        np.testing.assert_array_equal(np.asarray(d.actions).reshape(4, -1), probs.argmax(-1))
