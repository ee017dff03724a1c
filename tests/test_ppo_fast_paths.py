"""The training loop's fast paths compute what the readable PyTorch code computes: the NumPy
rollout step (values, states, log-probabilities, sampling), the fused NumPy loss (loss,
statistics and gradients), the one-call padded LSTM unroll (gradients too) and the flat
parameter buffer (clipping and Adam)."""
import numpy as np
import pytest
import torch

from agents.ppo.flat_params import FlatParams
from agents.ppo.loss import LossCoefs, LossTargets, fused_ppo_loss, ppo_loss
from agents.ppo.network import ActionDist, LstmActorCritic
from agents.ppo.rollout_policy import RolloutPolicy


def _net(nvec, hidden=12, obs_dim=5, seed=0):
    torch.manual_seed(seed)
    net = LstmActorCritic(obs_dim, nvec, hidden)
    with torch.no_grad():  # non-trivial heads, so that every term of the loss matters
        net.policy.weight.normal_(0, 0.5)
        net.value.weight.normal_(0, 0.5)
    return net


@pytest.mark.parametrize("nvec", [(3, 3, 3), (7,)])
def test_numpy_rollout_step_matches_the_network(nvec):
    net = _net(nvec)
    pol = RolloutPolicy(net, np.random.default_rng(0))
    rng = np.random.default_rng(1)
    obs = rng.normal(size=(6, 5)).astype(np.float32)
    h, c = (rng.normal(size=(6, 12)).astype(np.float32) for _ in range(2))
    start = np.array([0, 1, 0, 0, 1, 0], dtype=np.float32)
    actions, logprob, value, h2, c2 = pol.step(obs, h, c, start)
    with torch.no_grad():
        logits, v_t, (h_t, c_t) = net.step(torch.from_numpy(obs), (torch.from_numpy(h)[None], torch.from_numpy(c)[None]),
                                           torch.from_numpy(start))
        lp_t = net.dist(logits).log_prob(torch.from_numpy(actions).reshape(6, -1))
    np.testing.assert_allclose(value, v_t.numpy(), atol=1e-5)
    np.testing.assert_allclose(h2, h_t[0].numpy(), atol=1e-5)
    np.testing.assert_allclose(c2, c_t[0].numpy(), atol=1e-5)
    np.testing.assert_allclose(logprob, lp_t.numpy(), atol=1e-5)
    assert actions.shape == (6, len(nvec)) and actions.dtype == np.int64
    np.testing.assert_allclose(pol.value(obs, h, c, start), value, atol=1e-6)


def test_numpy_sampling_follows_the_policy_probabilities():
    net = _net((3, 3, 3))
    pol = RolloutPolicy(net, np.random.default_rng(2))
    obs = np.tile(np.random.default_rng(3).normal(size=(1, 5)).astype(np.float32), (20_000, 1))
    zeros = np.zeros((20_000, 12), dtype=np.float32)
    actions, _, _, _, _ = pol.step(obs, zeros, zeros, np.ones(20_000, dtype=np.float32))
    with torch.no_grad():
        logits, _, _ = net.step(torch.from_numpy(obs[:1]), net.initial_state(1), torch.ones(1))
        probs = net.dist(logits).probs()
    for d, p in enumerate(probs):
        freq = np.bincount(actions[:, d], minlength=3) / len(actions)
        np.testing.assert_allclose(freq, p[0].numpy(), atol=0.015)  # ~4 standard errors


def _minibatch(net, length=8, batch=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(length, batch, 5, generator=g)
    starts = torch.zeros(length, batch)
    starts[0, 1] = starts[3, 0] = starts[5, 0] = starts[6, 2] = starts[length - 1, 4] = 1
    state = (torch.randn(1, batch, net.hidden, generator=g), torch.randn(1, batch, net.hidden, generator=g))
    n = length * batch
    with torch.no_grad():
        logits, values, _ = net.unroll(obs, state, starts)
    actions = torch.randint(0, net.nvec[0], (n, len(net.nvec)), generator=g)
    with torch.no_grad():
        old_lp = net.dist(logits.reshape(n, -1)).log_prob(actions)
    # perturbed old log-probabilities and values: some ratios and value changes are clipped
    targets = LossTargets(actions, old_lp + 0.4 * torch.randn(n, generator=g),
                          values.reshape(n) + 0.3 * torch.randn(n, generator=g), torch.randn(n, generator=g),
                          torch.randn(n, generator=g))
    return obs, state, starts, targets


@pytest.mark.parametrize("nvec,coefs", [
    ((3, 3, 3), LossCoefs(clip_coef=0.2, ent_coef=0.01, vf_coef=0.5)),
    ((3, 3, 3), LossCoefs(clip_coef=0.1, ent_coef=0.0, vf_coef=1.0, clip_vloss=False, norm_adv=False)),
    ((7,), LossCoefs(clip_coef=0.2, ent_coef=0.05, vf_coef=0.5)),
])
def test_fused_loss_matches_autograd(nvec, coefs):
    net = _net(nvec)
    obs, state, starts, targets = _minibatch(net)
    params = list(net.parameters())

    logits, values, _ = net.unroll(obs, state, starts, final_state=False)
    n = targets.logprobs.numel()
    loss_r, stats_r = ppo_loss(logits.reshape(n, -1), values.reshape(n), net.nvec, targets, coefs)
    grads_r = torch.autograd.grad(loss_r, params)

    hidden, rows, _ = net.hidden_rows(obs, state, starts)
    assert rows is not None  # the padded path is the one under test
    loss_f, stats_f = fused_ppo_loss(net, hidden, rows, targets, coefs)
    grads_f = torch.autograd.grad(loss_f, params)

    assert 0.0 < float(stats_r[4]) < 1.0  # some, not all, ratios clipped
    torch.testing.assert_close(loss_f, loss_r, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(stats_f, stats_r, atol=1e-5, rtol=1e-5)
    for gf, gr in zip(grads_f, grads_r):
        torch.testing.assert_close(gf, gr, atol=1e-5, rtol=1e-4)


def test_padded_unroll_has_the_step_by_step_gradient():
    net = _net((3, 3, 3))
    obs, state, starts, _ = _minibatch(net)
    params = list(net.parameters())
    logits, values, _ = net.unroll(obs, state, starts, final_state=False)
    grads = torch.autograd.grad((logits.sin().sum() + values.cos().sum()), params)
    s, outs = state, []
    for t in range(obs.shape[0]):
        lg, vl, s = net.step(obs[t], s, starts[t])
        outs.append(lg.sin().sum() + vl.cos().sum())
    grads_ref = torch.autograd.grad(sum(outs), params)
    for g, r in zip(grads, grads_ref):
        torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-4)


def test_flat_parameters_clip_and_step_like_per_parameter_ones():
    a, b = _net((3, 3, 3), seed=4), _net((3, 3, 3), seed=4)
    flat = FlatParams(b)
    opt_a = torch.optim.Adam(a.parameters(), lr=1e-2, eps=1e-5)
    opt_b = torch.optim.Adam([flat.param], lr=1e-2, eps=1e-5, fused=True)
    obs, state, starts, _ = _minibatch(a)
    for _ in range(3):
        for net, opt in ((a, opt_a), (b, opt_b)):
            logits, values, _ = net.unroll(obs, state, starts, final_state=False)
            loss = 10 * (logits.pow(2).mean() + values.pow(2).mean())  # large: clipping is active
            if net is a:
                opt.zero_grad()
                loss.backward()
                norm = torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5)
            else:
                flat.zero_grad()
                loss.backward()
                assert torch.isclose(flat.clip_grad_norm_(0.5), norm, rtol=1e-5)
            opt.step()
    assert norm > 0.5
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, atol=1e-6, rtol=1e-5, msg=name)


def test_flat_parameters_take_a_per_parameter_adam_state():
    a, b = _net((3, 3, 3), seed=5), _net((3, 3, 3), seed=5)
    opt_a = torch.optim.Adam(a.parameters(), lr=1e-2)
    sum(p.sum() for p in a.parameters()).backward()
    opt_a.step()
    flat = FlatParams(b)
    opt_b = torch.optim.Adam([flat.param], lr=1e-2)
    opt_b.load_state_dict(flat.optimizer_state_from_per_parameter(opt_a.state_dict()))
    state = opt_b.state_dict()["state"][0]
    np.testing.assert_allclose(state["exp_avg"].numpy(), 0.1 * np.ones(flat.data.numel()), rtol=1e-6)


def test_action_dist_agrees_with_categorical():
    logits = torch.randn(4, 9)
    d = ActionDist(logits, (3, 3, 3))
    cats = [torch.distributions.Categorical(logits=x) for x in logits.split(3, dim=-1)]
    a = torch.stack([c.sample() for c in cats], dim=-1)
    torch.testing.assert_close(d.log_prob(a), sum(c.log_prob(a[:, i]) for i, c in enumerate(cats)))
    torch.testing.assert_close(d.entropy(), sum(c.entropy() for c in cats))
