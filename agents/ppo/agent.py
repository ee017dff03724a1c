"""The trained LSTM-PPO policy behind the Agent interface (inference only)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from samm.analyze import OBSERVATION_NAMES

from ..base import METADATA_FILE, Agent, Decisions, register
from ..builtin import LoadErrorsNameTheFile, check_action_mode
from ..params import check_param_keys, number_param
from ..policy import one_line, save_torch_policy, saved_file_path, saved_weights_path
from .network import LstmActorCritic
from .normalize import RunningMeanStd


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))

WEIGHTS_FILE = "policy.pt"
OBS_RMS_FILE = "obs_rms.json"
#: what a saved policy's "params" may hold: its LSTM's width and the seed of its sampled actions
PARAMS = ("lstm_hidden", "sample_seed")
MAX_LSTM_HIDDEN = 1024


def _read_obs_rms(path: Path, n_features: int) -> RunningMeanStd:
    """The saved observation normaliser, checked to fit the policy's features (a wrong one would
    fail, or act on garbage, at the first decision instead of here)."""
    try:
        rms = RunningMeanStd.from_dict(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a saved observation normaliser ({exc})") from None
    if rms.mean.shape != (n_features,) or rms.var.shape != (n_features,):
        raise ValueError(f"{path}: normalises {rms.mean.size} features, the policy reads {n_features}")
    if not (np.isfinite(rms.mean).all() and np.isfinite(rms.var).all() and (rms.var >= 0).all()):
        raise ValueError(f"{path}: mean or var holds NaN, inf or a negative variance")
    # fine-tuning goes on counting from it: a string was a TypeError traceback at the first
    # training step, a negative or NaN one turned every later normalised observation into NaN
    count = rms.count
    if isinstance(count, bool) or not isinstance(count, (int, float)) or not 0 < count < float("inf"):
        raise ValueError(f"{path}: count must be a finite number > 0, got {count!r:.40}")
    return rms


@register
class LstmPpoAgent(LoadErrorsNameTheFile, Agent):
    kind = "lstm-ppo"
    stateful = True

    def __init__(self, feature_names=OBSERVATION_NAMES, action_mode="paper", type_names=("S", "M", "L"),
                 params=None, net: LstmActorCritic | None = None, obs_rms: RunningMeanStd | None = None, **kw):
        check_action_mode(self.kind, action_mode)
        if not tuple(type_names):  # no VM type leaves no action head: decide failed with an IndexError
            raise ValueError(f"{self.kind}: type_names must name at least one VM type")
        check_param_keys(self.kind, params or {}, PARAMS)
        p = {"lstm_hidden": 128, **(params or {})}
        # bounded: an uploaded metadata.json declaring 20,000 units built an hours-long, 6-GB network
        # before its weights could be compared (the shipped policies use 128)
        number_param(self.kind, "lstm_hidden", p["lstm_hidden"], low=1, high=MAX_LSTM_HIDDEN, whole=True)
        number_param(self.kind, "sample_seed", p.get("sample_seed", 0), low=0, whole=True)
        super().__init__(tuple(feature_names), action_mode, type_names, params=p, **kw)
        nvec = (1 + 2 * self.n_types,) if action_mode == "paper" else (3,) * self.n_types
        self.net = net or LstmActorCritic(len(self.feature_names), nvec, int(p["lstm_hidden"]))
        self.net.eval()
        self.obs_rms = obs_rms
        self.np_rng = np.random.default_rng(int(p.get("sample_seed", 0)))
        self._row_rngs: list[np.random.Generator] | None = None
        self._np = None

    def seed_rows(self, seeds) -> None:
        """Sample (deterministic=False) batch row i from its own stream of (sample_seed, seeds[i]), so an
        episode's sampled actions depend on its seed alone, not on the other rows of its batch or on
        what this agent sampled before (sim_bridge.runner.run_episodes calls it); None: the one
        shared stream again."""
        base = int(self.params.get("sample_seed", 0))
        self._row_rngs = None if seeds is None else [np.random.default_rng([base, int(s) % 2**64]) for s in seeds]

    # Inference runs in NumPy: one LSTM step at batch 1 costs ~0.7 ms through PyTorch's call
    # overhead and ~0.05 ms as four small matrix products. The maths is nn.LSTM's (gate order
    # i, f, g, o); a test checks both paths agree. State = (h, c, episode_start), NumPy arrays.
    def _weights(self):
        if self._np is None:
            sd = {k: v.detach().cpu().numpy().astype(np.float64) for k, v in self.net.state_dict().items()}
            self._np = (sd["lstm.weight_ih_l0"].T, sd["lstm.weight_hh_l0"].T,
                        sd["lstm.bias_ih_l0"] + sd["lstm.bias_hh_l0"],
                        sd["policy.weight"].T, sd["policy.bias"], sd["value.weight"].T, sd["value.bias"])
        return self._np

    def initial_state(self, batch=1):
        h = np.zeros((batch, self.net.hidden))
        return h, h.copy(), np.ones(batch, dtype=bool)

    def reset_state(self, state, mask):
        h, c, start = state
        return h, c, start | np.asarray(mask, dtype=bool)

    def decide(self, observation, state=None, *, mask=None, deterministic: bool = True):
        """The Policy protocol's one decision, refusing a vector act() cannot use: one NaN would
        make every later decision of this session NaN too (the LSTM state keeps it), and the
        argmax of NaN probabilities is action 0, "remove" of every type in per-type mode.
        `mask`: see `Agent.decide`."""
        from samm.plan.dataplane import InvalidInput

        if not isinstance(observation, dict):
            x = np.asarray(observation, dtype=np.float64).reshape(-1)
            if x.size != len(self.feature_names):
                raise InvalidInput("observation", f"{x.size} values, the policy reads {len(self.feature_names)} "
                                                  f"({', '.join(self.feature_names)})")
            observation = dict(zip(self.feature_names, x.tolist()))
        missing = [f for f in self.feature_names if f not in observation]
        if missing:
            raise InvalidInput("observation", f"missing {missing}")
        for name in self.feature_names:
            try:
                finite = np.isfinite(float(observation[name]))
            except (TypeError, ValueError):
                finite = False
            if not finite:
                raise InvalidInput(f"observation.{name}", f"must be a finite number, got {observation[name]!r}")
        return super().decide(observation, state, mask=mask, deterministic=deterministic)

    def _prep(self, features) -> np.ndarray:
        x = np.asarray(features, dtype=np.float64)
        if self.obs_rms is not None:
            x = np.clip((x - self.obs_rms.mean) / np.sqrt(self.obs_rms.var + 1e-8), -10, 10)
        return x

    def act(self, features, state, deterministic=True):
        w_ih, w_hh, b, w_p, b_p, w_v, b_v = self._weights()
        h, c, start = state
        keep = (~start)[:, None]
        h, c = h * keep, c * keep
        gates = self._prep(features) @ w_ih + h @ w_hh + b
        i, f, g, o = np.split(gates, 4, axis=1)
        c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
        h = _sigmoid(o) * np.tanh(c)
        logits = (h @ w_p + b_p).reshape(len(h), -1, self.net.nvec[0])  # (B, dims, n)
        logits = logits - logits.max(axis=-1, keepdims=True)
        probs = np.exp(logits)
        probs /= probs.sum(axis=-1, keepdims=True)
        if deterministic:
            a = probs.argmax(axis=-1)
        else:
            rows = self._row_rngs
            if rows is not None and len(rows) == len(probs):
                u = np.stack([r.random(probs.shape[1:-1] + (1,)) for r in rows])
            else:
                u = self.np_rng.random(probs.shape[:-1] + (1,))
            a = (probs.cumsum(axis=-1) < u).sum(axis=-1).clip(max=probs.shape[-1] - 1)
        value = (h @ w_v + b_v)[:, 0]
        if self.action_mode == "paper":
            return Decisions(a[:, 0], probs[:, 0], value), (h, c, np.zeros(len(h), dtype=bool))
        return Decisions(a, probs, value), (h, c, np.zeros(len(h), dtype=bool))

    def save(self, directory: str | Path) -> Path:
        """Weights, normaliser and metadata as one save (`save_torch_policy`): killed part-way, the
        folder holds the previous policy or this one, never this one's weights under the previous
        one's normaliser or settings."""
        rms = {} if self.obs_rms is None else {OBS_RMS_FILE: json.dumps(self.obs_rms.to_dict())}
        d = save_torch_policy(directory, self.net, self.metadata(), WEIGHTS_FILE, METADATA_FILE, extra_files=rms)
        if not rms:
            (d / OBS_RMS_FILE).unlink(missing_ok=True)   # an earlier save's: not this policy's (loaders skip it)
        return d

    @classmethod
    def _from_metadata(cls, meta, directory: Path):
        agent = super()._from_metadata(meta, directory)
        weights = saved_weights_path(directory, WEIGHTS_FILE, METADATA_FILE)
        if not weights.is_file():
            raise FileNotFoundError(f"{directory}: missing {WEIGHTS_FILE}")
        try:
            state = torch.load(weights, map_location="cpu", weights_only=True)
        except Exception as exc:  # truncated, garbage or a pickle of arbitrary objects: unreadable here
            raise ValueError(f"{weights}: not a readable PyTorch state dict ({one_line(exc)})") from None
        try:
            agent.net.load_state_dict(state)
            agent._np = None
        except (RuntimeError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{weights}: does not match the declared observation/action spec ({one_line(exc)})") from None
        # NaN weights give NaN probabilities, whose argmax is action 0: "remove a VM" of every type
        bad = [k for k, v in agent.net.state_dict().items() if not torch.isfinite(v).all()]
        if bad:
            raise ValueError(f"{weights}: {bad[0]} holds NaN or inf values")
        rms = saved_file_path(directory, OBS_RMS_FILE, METADATA_FILE)
        if rms is not None:
            agent.obs_rms = _read_obs_rms(rms, len(agent.feature_names))
        agent.net.eval()
        return agent
