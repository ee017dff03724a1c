"""The trained LSTM-PPO policy behind the Agent interface (inference only)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from samm.analyze import OBSERVATION_NAMES

from ..base import Agent, Decisions, register
from .network import LstmActorCritic
from .normalize import RunningMeanStd

WEIGHTS_FILE = "policy.pt"


@register
class LstmPpoAgent(Agent):
    kind = "lstm-ppo"
    stateful = True

    def __init__(self, feature_names=OBSERVATION_NAMES, action_mode="paper", type_names=("S", "M", "L"),
                 params=None, net: LstmActorCritic | None = None, obs_rms: RunningMeanStd | None = None, **kw):
        p = {"lstm_hidden": 128, **(params or {})}
        super().__init__(tuple(feature_names), action_mode, type_names, params=p, **kw)
        nvec = (1 + 2 * self.n_types,) if action_mode == "paper" else (3,) * self.n_types
        self.net = net or LstmActorCritic(len(self.feature_names), nvec, int(p["lstm_hidden"]))
        self.net.eval()
        self.obs_rms = obs_rms
        self.torch_rng = torch.Generator().manual_seed(int(p.get("sample_seed", 0)))

    # state = (h, c), each (1, B, hidden), plus "episode start" flags
    def initial_state(self, batch=1):
        h, c = self.net.initial_state(batch)
        return h, c, torch.ones(batch)

    def reset_state(self, state, mask):
        h, c, start = state
        start = start.clone()
        start[torch.as_tensor(np.asarray(mask, dtype=bool))] = 1.0
        return h, c, start

    def _prep(self, features) -> torch.Tensor:
        x = np.asarray(features, dtype=np.float32)
        if self.obs_rms is not None:
            x = np.clip((x - self.obs_rms.mean) / np.sqrt(self.obs_rms.var + 1e-8), -10, 10).astype(np.float32)
        return torch.as_tensor(x)

    @torch.no_grad()
    def act(self, features, state, deterministic=True):
        h, c, start = state
        logits, value, (h, c) = self.net.step(self._prep(features), (h, c), start)
        dist = self.net.dist(logits)
        if deterministic:
            a = dist.mode()
        else:
            a = torch.stack([torch.multinomial(p, 1, generator=self.torch_rng)[:, 0] for p in dist.probs()], dim=-1)
        probs = torch.stack(dist.probs(), dim=1) if self.action_mode == "per-type" else dist.probs()[0]
        actions = a[:, 0].numpy() if self.action_mode == "paper" else a.numpy()
        return Decisions(actions, probs.numpy(), value.numpy()), (h, c, torch.zeros(len(start)))

    def _save_weights(self, directory: Path) -> None:
        torch.save(self.net.state_dict(), directory / WEIGHTS_FILE)
        if self.obs_rms is not None:
            (directory / "obs_rms.json").write_text(json.dumps(self.obs_rms.to_dict()))

    @classmethod
    def _from_metadata(cls, meta, directory: Path):
        agent = cls(tuple(meta["feature_names"]), meta["action_mode"], tuple(meta["type_names"]),
                    params=meta.get("params"), env_config_hash=meta.get("env_config_hash"),
                    training=meta.get("training"), version=meta.get("version"))
        weights = directory / WEIGHTS_FILE
        if not weights.is_file():
            raise FileNotFoundError(f"{directory}: missing {WEIGHTS_FILE}")
        try:
            state = torch.load(weights, map_location="cpu", weights_only=True)
            agent.net.load_state_dict(state)
        except (RuntimeError, ValueError, KeyError) as exc:
            raise ValueError(f"{weights}: does not match the declared observation/action spec ({exc})") from None
        rms = directory / "obs_rms.json"
        if rms.is_file():
            agent.obs_rms = RunningMeanStd.from_dict(json.loads(rms.read_text()))
        agent.net.eval()
        return agent
