"""Second audit of the LSTM-PPO agent: masks on the served policy, truncation that is also a
termination, rollouts thrown away after a lost worker, runs that fail part-way, settings that
cannot train, saved normalisers and evaluation reports."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from agents.base import load_agent
from agents.ppo.agent import LstmPpoAgent
from agents.ppo.buffer import RolloutBuffer
from agents.ppo.config import PPOConfig
from agents.ppo.network import LstmActorCritic
from agents.ppo.normalize import RunningMeanStd
from agents.ppo.train import train
from sim_bridge.errors import RolloutWorkerLost

REPO = Path(__file__).resolve().parents[1]

# ---- the served policy and its action mask ---------------------------------------------------


def test_a_paper_mode_policy_honours_the_action_mask_of_the_policy_protocol():
    """`Policy.decide(..., mask=)` takes Gymnasium's action_mask for Discrete actions (the paper
    mode's Discrete(7)), and the validated entry `dataplane.decide` checks and passes it on; the
    LSTM-PPO policy ignored it and returned the masked-out action (an add the caller forbade)."""
    from samm.plan import dataplane

    agent = LstmPpoAgent(action_mode="paper")
    with torch.no_grad():   # a clear preference: action 3 first, then 5
        agent.net.policy.bias.copy_(torch.tensor([0.0, 0.0, 0.0, 3.0, 0.0, 2.0, 0.0]))
    obs = {name: 0.5 for name in agent.feature_names}
    assert dataplane.decide(agent, obs)[0].action == 3
    mask = [1, 1, 1, 0, 1, 1, 1]
    d, _ = dataplane.decide(agent, obs, mask=mask)
    assert (d.action, d.name) == (5, agent.describe_action(5))
    sampled = {dataplane.decide(agent, obs, mask=mask, deterministic=False)[0].action for _ in range(40)}
    assert 3 not in sampled and len(sampled) > 1


def test_a_masked_decision_keeps_the_state_and_the_masked_distribution():
    from samm.plan.dataplane import InvalidInput

    agent = LstmPpoAgent(action_mode="paper", params={"sample_seed": 7})
    obs = [0.3] * 7
    first, state = agent.decide(obs)
    mask = np.ones(7, np.int8)
    mask[first.action] = 0
    masked, masked_state = agent.decide(obs, mask=mask)
    probs = np.asarray(first.info["probabilities"])
    allowed = np.where(mask > 0, probs, -1)
    # the best allowed action; the reported probabilities are rounded to 6 decimals, and an untrained
    # network's are all near 1/7, so two of them can tie there (a flaky `== argmax` in session 103's CI)
    assert mask[masked.action] == 1 and allowed[masked.action] >= allowed.max() - 1e-6
    for a, b in zip(state[:2], masked_state[:2]):  # the memory does not depend on the action taken
        np.testing.assert_array_equal(a, b)
    # sampling: the allowed actions in the proportions of their probabilities
    draws = np.array([agent.decide(obs, mask=mask, deterministic=False)[0].action for _ in range(3000)])
    assert not (draws == first.action).any()
    expected = np.where(mask > 0, probs, 0) / np.where(mask > 0, probs, 0).sum()
    np.testing.assert_allclose(np.bincount(draws, minlength=7) / len(draws), expected, atol=0.03)
    # per-type actions are MultiDiscrete: a mask cannot apply, and is refused by name
    per_type = LstmPpoAgent(action_mode="per-type")
    with pytest.raises(InvalidInput, match="action_mask"):
        per_type.decide(obs, mask=[1, 1, 1])


# ---- the training loop on small vector envs --------------------------------------------------


class EndsAfterTwo(VectorEnv):
    """Episodes of two steps, reward 0, observation constant; the second step ends them as
    `term`/`trunc` say. Same-step autoreset. `lose_at`: env-step calls (1-based) that raise
    RolloutWorkerLost, as a Ray worker's death does."""

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, num_envs, term=True, trunc=False, lose_at=()):
        self.num_envs, self.term, self.trunc, self.lose_at = num_envs, term, trunc, set(lose_at)
        self.single_observation_space = spaces.Box(0, 1, (1,), np.float32)
        self.single_action_space = spaces.Discrete(2)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.calls, self.closed = 0, False

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return np.full((self.num_envs, 1), 0.5, np.float32), {}

    def step(self, actions):
        self.calls += 1
        if self.calls in self.lose_at or "always" in self.lose_at:
            raise RolloutWorkerLost("worker 0 died")
        self.t += 1
        end = self.t % 2 == 0
        obs = np.full((self.num_envs, 1), 0.5, np.float32)
        term = np.full(self.num_envs, end and self.term)
        trunc = np.full(self.num_envs, end and self.trunc)
        info = {"final_obs": obs.copy(), "_final_obs": term | trunc} if end else {}
        return obs, np.zeros(self.num_envs), term, trunc, info

    def close(self, **kw):
        self.closed = True


TOY = dict(num_envs=2, num_steps=8, bptt_chunk=4, num_minibatches=2, update_epochs=1, norm_obs=False,
           norm_reward=False, target_kl=None, lstm_hidden=8, initial_noop_prob=0.0, anneal_lr=False, seed=5)


def _high_value_start() -> tuple[dict, None]:
    """A network whose value estimate is 100 everywhere: a bootstrap shows in the reward."""
    net = LstmActorCritic(1, (2,), 8)
    with torch.no_grad():
        net.value.weight.zero_()
        net.value.bias.fill_(100.0)
    return {k: v.clone() for k, v in net.state_dict().items()}, None


@pytest.mark.parametrize("term, bootstrapped", [(True, False), (False, True)])
def test_an_episode_both_terminated_and_truncated_is_not_bootstrapped(monkeypatch, term, bootstrapped):
    """Gymnasium lets one step report both; the loop bootstrapped every truncation, so a terminal
    step earned gamma × V(final observation) it can never collect."""
    rewards = []
    real_add = RolloutBuffer.add

    def recording_add(self, t, obs, action, logprob, reward, value, episode_start, state):
        rewards.append(np.array(reward, dtype=np.float64))
        return real_add(self, t, obs, action, logprob, reward, value, episode_start, state)

    monkeypatch.setattr(RolloutBuffer, "add", recording_add)
    cfg = PPOConfig(total_timesteps=16, learning_rate=0.0, **TOY)
    train(cfg, lambda n, s: EndsAfterTwo(n, term=term, trunc=True), progress=False, init=_high_value_start())
    ends = np.array(rewards[1::2])  # every second step ends an episode
    if bootstrapped:
        np.testing.assert_allclose(ends, cfg.gamma * 100.0, rtol=1e-5)
    else:
        assert not ends.any(), ends
    assert not np.array(rewards[0::2]).any()


def test_a_discarded_rollout_logs_none_of_its_episodes(tmp_path):
    """A rollout thrown away after a lost worker is collected again and its global steps counted
    again, but the episodes it had ended stayed in episodes.csv and the result: the same steps
    were logged twice, with two different episodes."""
    cfg = PPOConfig(total_timesteps=32, checkpoint_every=1, **dict(TOY, num_envs=1))
    env = EndsAfterTwo(1, lose_at={5})  # two episodes ended, then the worker is lost
    res = train(cfg, lambda n, s: env, tmp_path, progress=False)
    steps = [e["global_step"] for e in res.episodes]
    assert steps == sorted(set(steps)) and len(steps) == 32 // 2, steps
    with (tmp_path / "episodes.csv").open() as f:
        logged = [int(r["global_step"]) for r in csv.DictReader(f)]
    assert logged == steps
    assert res.history[-1]["rollouts_discarded"] == 1


def test_a_run_that_fails_part_way_closes_its_environments(tmp_path):
    """Only a NaN closed them: a run that lost its workers too often (or any other error) left
    the envs, their JVMs and Ray actors, running until the process ended."""
    env = EndsAfterTwo(2, lose_at={"always"})
    with pytest.raises(RuntimeError, match="rollouts in a row lost a worker"):
        train(PPOConfig(total_timesteps=16, **TOY), lambda n, s: env, tmp_path, progress=False)
    assert env.closed
    env = EndsAfterTwo(2)

    def interrupted(update, net, obs_rms):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(PPOConfig(total_timesteps=16, **TOY), lambda n, s: env, tmp_path / "ctrl-c", progress=False,
              on_update=interrupted)
    # Ctrl-C may cut a JVM call half-way: closing over that connection could wait for an answer
    # that never comes, so the envs are left to the process's exit; the logs are written whole
    assert not env.closed and (tmp_path / "ctrl-c" / "progress.csv").exists()


# ---- settings that cannot train --------------------------------------------------------------


def test_a_minibatch_of_one_step_is_refused_before_training():
    """Its advantages' standard deviation is 0/0: every loss was NaN and the run stopped at
    update 1 blaming the learning rate or the observations."""
    cfg = dict(TOY, num_envs=1, num_steps=4, bptt_chunk=1, num_minibatches=4)
    with pytest.raises(ValueError, match="a minibatch of 1 step cannot normalise advantages"):
        PPOConfig(total_timesteps=8, **cfg).validate()
    # without advantage normalisation one step per minibatch trains
    res = train(PPOConfig(total_timesteps=8, norm_adv=False, **cfg), lambda n, s: EndsAfterTwo(n), progress=False)
    assert np.isfinite(res.history[-1]["pg_loss"])


@pytest.mark.parametrize("bad", [{"checkpoint_every": 0}, {"eval_every": -1}, {"reward_clip": -1.0},
                                 {"max_grad_norm": 0.0}, {"clip_coef": float("nan")}, {"initial_noop_prob": 1.0},
                                 {"target_kl": 0.0}, {"vf_coef": -1.0}, {"ent_coef": "0.01"}])
def test_settings_that_cannot_train_are_refused_before_the_environments_start(tmp_path, bad):
    """checkpoint_every 0 was a ZeroDivisionError after the first update's work; the others ran
    silently wrong (every reward set to the negative clip, no step at all, inverted clipping, a
    uniform start instead of the asked no-op bias)."""
    started = []

    def make_envs(n, s):
        started.append(n)
        return EndsAfterTwo(n)

    name = next(iter(bad))
    with pytest.raises(ValueError, match=name):
        train(PPOConfig(total_timesteps=16, **{**TOY, **bad}), make_envs, tmp_path, progress=False)
    assert not started
    PPOConfig(target_kl=None, ent_coef=0.0, initial_noop_prob=0.0, eval_every=0).validate()  # the edges that are fine


def test_a_gpu_this_machine_lacks_is_a_clear_error_before_the_simulator_starts(tmp_path):
    """`samm train --device cuda` on a machine without one was torch's traceback, raised after
    the environments' JVMs had started."""
    from samm.cli.main import cli

    absent = f"cuda:{torch.cuda.device_count()}"
    with pytest.raises(ValueError, match=rf"device '{absent}': this machine has \d+ CUDA GPU"):
        PPOConfig(device=absent).validate()
    with pytest.raises(ValueError, match="N of cuda:N must be a whole number"):
        PPOConfig(device="cuda:first").validate()
    if not torch.backends.mps.is_available():
        with pytest.raises(ValueError, match="device 'mps'"):
            PPOConfig(device="mps").validate()
    r = CliRunner().invoke(cli, ["train", "--timesteps", "128", "--envs", "1", "--quiet", "--device", absent,
                                 "--out", str(tmp_path / "run")])
    assert r.exit_code == 2 and "invalid PPO settings" in r.output and absent in r.output, r.output
    assert "Traceback" not in r.output and not (tmp_path / "run" / "train_config.json").exists()


# ---- saved normalisers -----------------------------------------------------------------------


@pytest.mark.parametrize("count", ["many", -5.0, None, True])
def test_a_saved_normaliser_with_a_bad_count_is_a_clear_error(tmp_path, count):
    """Fine-tuning counts on from the saved normaliser: a string count was a TypeError traceback
    at the first step, a negative one made every later observation NaN."""
    rms = RunningMeanStd((7,))
    rms.update(np.random.default_rng(0).random((5, 7)))
    LstmPpoAgent(action_mode="per-type", obs_rms=rms).save(tmp_path / "p")
    meta = json.loads((tmp_path / "p" / "metadata.json").read_text())
    meta.pop("files_sha256")   # as a policy saved before digests were recorded
    (tmp_path / "p" / "metadata.json").write_text(json.dumps(meta))
    (tmp_path / "p" / "obs_rms.json").write_text(json.dumps({**rms.to_dict(), "count": count}))
    with pytest.raises(ValueError, match=r"obs_rms\.json: count must be a finite number > 0"):
        load_agent(tmp_path / "p")
    (tmp_path / "p" / "obs_rms.json").write_text(json.dumps(rms.to_dict()))
    assert load_agent(tmp_path / "p").obs_rms.count == pytest.approx(rms.count)


# ---- evaluation reports ----------------------------------------------------------------------


@pytest.mark.jvm
def test_an_evaluation_over_an_iterator_of_seeds_reports_them():
    """The runner consumed the iterator, and the report's "seeds" came out empty."""
    from agents.evaluate import evaluate
    from agents.factory import make_agent
    from sim_bridge.config import SimConfig
    from sim_bridge.workloads import Workload

    sim = SimConfig(action_mode="per-type", max_steps=5)
    arrivals = np.repeat(60.0 + 300.0 * np.arange(2), 4)
    wl = Workload("tiny", arrivals, np.full(len(arrivals), 240.0 * 4400), np.ones(len(arrivals), np.int32),
                  np.full(len(arrivals), 0.5))
    res = evaluate(make_agent("noop", sim), sim, wl, iter([3, 4]))
    assert res["seeds"] == [3, 4] and [e["seed"] for e in res["episodes"]] == [3, 4]


# ---- spaces read from a saved policy's metadata.json -------------------------------------------


def test_a_space_too_large_to_build_is_refused_before_allocating_it():
    """The bounds of a Box are allocated whole: an uploaded metadata.json declaring a [100000,
    100000] observation took 37 GB (a MemoryError, or the service killed for memory)."""
    from agents.spaces import MAX_BOX_ELEMENTS, space_from_json

    huge = {"type": "Box", "shape": [100_000, 100_000], "low": 0, "high": 1, "dtype": "float32"}
    with pytest.raises(ValueError, match=r"Box shape \[100000, 100000\] has more than"):
        space_from_json(huge)
    with pytest.raises(ValueError, match="more than"):
        space_from_json({**huge, "shape": [MAX_BOX_ELEMENTS + 1]})
    for shape in ([2.5], "2", [-1], [True]):
        with pytest.raises(ValueError, match="Box shape must be a list of whole numbers"):
            space_from_json({**huge, "shape": shape})
    assert space_from_json({**huge, "shape": [2, 3]}).shape == (2, 3)


@pytest.mark.parametrize("desc", [{"type": "Dict", "spaces": [{"type": "Discrete", "n": 2}]},
                                  {"type": "Tuple", "spaces": {"a": {"type": "Discrete", "n": 2}}},
                                  {"type": "Dict"}])
def test_a_malformed_dict_or_tuple_space_is_a_value_error(desc):
    """A list where a mapping goes was an AttributeError, which the policy loaders of three
    problems (they catch KeyError, TypeError and ValueError) let through as a traceback."""
    from agents.spaces import space_from_json

    with pytest.raises(ValueError, match=f"{desc['type']} spaces must be a JSON"):
        space_from_json(desc)


def test_every_shipped_policy_still_loads_with_its_recorded_spaces():
    from agents.registry import load_policy

    for meta in sorted(REPO.glob("agents/**/policies/*/metadata.json")):
        policy = load_policy(meta.parent)
        assert policy.observation_space is not None and policy.action_space is not None, meta


def test_rule_agents_honour_the_mask_too():
    """Every paper-mode agent went through `Agent.decide`, which dropped the mask: a rule returned
    the action the caller had masked out."""
    from agents.builtin import NoopAgent, RandomAgent
    from samm.plan.dataplane import InvalidInput

    noop = NoopAgent()
    assert noop.decide({})[0].action == 0
    assert noop.decide({}, mask=[0, 1, 1, 1, 1, 1, 1])[0].action == 1  # the first allowed action
    rnd = RandomAgent(params={"seed": 3})
    chosen = rnd.decide({})[0].action   # the same seed's first draw each time (no state passed)
    mask = np.ones(7, np.int8)
    mask[chosen] = 0
    assert rnd.decide({}, mask=mask)[0].action == (0 if chosen else 1)
    with pytest.raises(InvalidInput, match="only defined for Discrete"):
        NoopAgent(action_mode="per-type").decide({}, mask=[1, 1, 1])
