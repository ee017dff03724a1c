"""PPO pieces on tiny problems: GAE by hand, chunked BPTT == step-by-step unroll, and a policy
that must remember a cue to be rewarded."""
import numpy as np
import pytest
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from agents.ppo.buffer import RolloutBuffer, compute_gae
from agents.ppo.config import PPOConfig
from agents.ppo.network import LstmActorCritic
from agents.ppo.train import train


def test_gae_matches_a_hand_computation():
    g, lam = 0.9, 0.8
    r = torch.tensor([[1.0], [2.0], [3.0]])
    v = torch.tensor([[0.5], [1.0], [1.5]])
    starts = torch.tensor([[0.0], [0.0], [1.0]])  # obs 2 begins a new episode
    nv, ns = torch.tensor([2.0]), torch.tensor([0.0])
    adv, ret = compute_gae(r, v, starts, nv, ns, g, lam)
    d2 = 3.0 + 0.9 * 2.0 - 1.5  # last step bootstraps from next_value
    d1 = 2.0 + 0.0 - 1.0  # obs 2 starts a new episode: no flow across
    d0 = 1.0 + 0.9 * 1.0 - 0.5
    a2, a1 = d2, d1
    a0 = d0 + g * lam * a1
    np.testing.assert_allclose(adv[:, 0].numpy(), [a0, a1, a2], rtol=1e-6)
    np.testing.assert_allclose(ret[:, 0].numpy(), [a0 + 0.5, a1 + 1.0, a2 + 1.5], rtol=1e-6)


def test_chunked_unroll_equals_step_by_step():
    torch.manual_seed(0)
    net = LstmActorCritic(5, (7,), hidden=12)
    L, B = 20, 4
    obs = torch.randn(L, B, 5)
    starts = torch.zeros(L, B)
    starts[0, 1] = 1
    starts[7, 0] = starts[7, 2] = 1
    starts[13, 3] = 1
    state = (torch.randn(1, B, 12), torch.randn(1, B, 12))
    logits_f, values_f, state_f = net.unroll(obs, state, starts)
    s = state
    for t in range(L):
        lg, vl, s = net.step(obs[t], s, starts[t])
        torch.testing.assert_close(lg, logits_f[t], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(vl, values_f[t], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s[0], state_f[0], atol=1e-5, rtol=1e-5)


def test_buffer_chunks_start_from_stored_states():
    buf = RolloutBuffer(steps=8, envs=2, obs_dim=1, act_dims=1, hidden=3, device="cpu")
    for t in range(8):
        st = (torch.full((1, 2, 3), float(t)), torch.full((1, 2, 3), -float(t)))
        buf.add(t, torch.tensor([[t], [10 + t]], dtype=torch.float32), torch.zeros(2, 1, dtype=torch.long),
                torch.zeros(2), torch.zeros(2), torch.zeros(2), torch.zeros(2), st)
    buf.finish(torch.zeros(2), torch.zeros(2), 0.99, 0.95)
    seen = []
    for mb in buf.chunks(4, 2, torch.Generator().manual_seed(0)):
        for b in range(mb.obs.shape[1]):
            first = float(mb.obs[0, b, 0])
            t0 = int(first) % 10
            assert float(mb.state[0][0, b, 0]) == t0  # the stored state of the chunk's first step
            np.testing.assert_array_equal(mb.obs[:, b, 0].numpy(), first + np.arange(4))
            seen.append(first)
    assert sorted(seen) == [0, 4, 10, 14]


class CueMemoryVecEnv(VectorEnv):
    """The first observation shows a cue bit, later ones do not; the action taken on the last
    observation (`length - 1` steps later, after the cue has vanished) earns 1 iff it equals the
    cue. Same-step autoreset."""

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, num_envs, seed, length=3):
        self.num_envs, self.length = num_envs, length
        self.single_observation_space = spaces.Box(0, 1, (2,), np.float32)
        self.single_action_space = spaces.Discrete(2)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.rng = np.random.default_rng(seed)

    def _first(self, idx):
        self.cue[idx] = self.rng.integers(0, 2, len(idx))
        self.t[idx] = 0

    def _obs(self):
        o = np.zeros((self.num_envs, 2), np.float32)
        first = self.t == 0
        o[first, 0] = self.cue[first]
        o[first, 1] = 1.0
        return o

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.cue = np.zeros(self.num_envs, np.int64)
        self.t = np.zeros(self.num_envs, np.int64)
        self._first(np.arange(self.num_envs))
        return self._obs(), {}

    def step(self, actions):
        self.t += 1
        last = self.t == self.length - 1
        reward = np.where(last & (np.asarray(actions) == self.cue), 1.0, 0.0)
        term = last.copy()
        obs = self._obs()
        info = {}
        if term.any():
            info["final_obs"] = obs.copy()
            self._first(np.nonzero(term)[0])
            obs = self._obs()
        return obs, reward, term, np.zeros_like(term), info


def test_a_policy_learns_a_memory_task():
    cfg = PPOConfig(num_envs=16, num_steps=16, bptt_chunk=8, num_minibatches=4, total_timesteps=40_000,
                    lstm_hidden=32, learning_rate=3e-3, ent_coef=0.01, norm_reward=False, gamma=0.9,
                    anneal_lr=False, seed=3, update_epochs=4, target_kl=None, norm_obs=False,
                    initial_noop_prob=0.0)
    res = train(cfg, lambda n, s: CueMemoryVecEnv(n, s, length=3), progress=False)
    early = np.mean([e["return"] for e in res.episodes[:200]])
    late = np.mean([e["return"] for e in res.episodes[-200:]])
    assert early < 0.7
    assert late > 0.9, (early, late)  # without memory the best possible is 0.5


def test_initial_noop_bias():
    net = LstmActorCritic(7, (3, 3, 3), hidden=8)
    net.bias_towards((1, 1, 1), 0.8)
    logits, _, _ = net.step(torch.zeros(2, 7), net.initial_state(2), torch.ones(2))
    probs = net.dist(logits).probs()
    for p in probs:
        np.testing.assert_allclose(p[0].detach().numpy(), [0.1, 0.8, 0.1], atol=0.02)
    net = LstmActorCritic(7, (7,), hidden=8)
    net.bias_towards((0,), 0.8)
    logits, _, _ = net.step(torch.zeros(1, 7), net.initial_state(1), torch.ones(1))
    assert float(net.dist(logits).probs()[0][0, 0]) == pytest.approx(0.8, abs=0.02)


def test_config_validation():
    with pytest.raises(ValueError):
        PPOConfig(num_steps=100, bptt_chunk=16).validate()
    assert PPOConfig().validate().batch_size == 16 * 256
    # zeros and negatives once passed (bptt_chunk 0 was a ZeroDivisionError, total_timesteps -1 a run of nothing)
    for bad in ({"bptt_chunk": 0}, {"total_timesteps": -1}, {"num_envs": 0}, {"learning_rate": float("nan")}, {"learning_rate": -1e-3},
                {"device": "tpu"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            PPOConfig(**bad).validate()
    assert PPOConfig(learning_rate=0.0).validate().learning_rate == 0.0   # a run that must not move the weights
