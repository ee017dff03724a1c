"""A trained C2MARL policy as SAMM hosts it: each agent's greedy action on its own Q^i (the
decentralised execution of §5.3; Q^c is a training device and is not needed to act).

    policy.rates(view)                 -> [N] rates from RATES (simulator, live admission path)
    policy.decide(observation_vector)  -> Decision(action=[N] rate indices)   (Policy protocol)
    policy.save(dir) / OversubPolicy.load(dir)

A shielded policy (shield.py, ours) carries its N-sigma floor and the prior it starts from: `rates`
computes the floor from the view's usage history and returns max(RATES[a], floor); its observation
vector ends with the floor, so `decide` applies the same max (its `info["rates"]`).
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from gymnasium import spaces

from agents.policy import Decision, load_torch_weights, save_torch_policy
from agents.registry import read_policy_metadata
from agents.spaces import check_spaces, space_from_json, space_to_json

from .features import observation, observation_size
from .network import C2MarlNet
from .settings import RATES, SETTINGS, Setting
from .shield import Shield

KIND = "c2marl"
PROBLEM = "oversubscription"
FORMAT = 1
METADATA_FILE = "metadata.json"
WEIGHTS_FILE = "weights.pt"
SHIPPED_DIR = Path(__file__).parent / "policies" / "c2marl-azure-0.95"


def oversub_spaces(setting: Setting, features: str = "paper", floor: bool = False
                   ) -> tuple[spaces.Box, spaces.MultiDiscrete]:
    obs = spaces.Box(low=0.0, high=np.inf, shape=(observation_size(setting, features, floor),), dtype=np.float32)
    act = spaces.MultiDiscrete([len(RATES)] * setting.n_subscribers)
    return obs, act


class OversubPolicy:
    problem = PROBLEM
    kind = KIND
    stateful = False

    def __init__(self, net: C2MarlNet, setting: Setting, training: dict | None = None, version: str | None = None,
                 features: str = "paper", shield: Shield | None = None):
        self.net = net.eval()
        self.setting = setting
        self.features = features
        self.shield = shield
        self.training = training or {}
        self.version = version or "unversioned"
        self.observation_space, self.action_space = oversub_spaces(setting, features, shield is not None)

    def initial_state(self):
        return None

    def action_indices(self, obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            q = self.net.agent_q(torch.as_tensor(np.asarray(obs, np.float32)).reshape(1, -1))[0]
        return q.argmax(-1).numpy()

    def rates(self, view) -> np.ndarray:
        floor = None if self.shield is None else self.shield.floor_fresh(view)
        chosen = np.asarray(RATES)[self.action_indices(observation(view, self.setting, self.features, floor))]
        return chosen if floor is None else Shield.apply(chosen, floor)

    def decide(self, observation_vec, state=None, *, mask=None, deterministic: bool = True):
        a = self.action_indices(observation_vec)
        rates = np.asarray(RATES)[a]
        if self.shield is not None:   # the observation ends with the floor (features.observation)
            n = self.setting.n_subscribers
            rates = Shield.apply(rates, np.asarray(observation_vec, dtype=np.float64).reshape(-1)[-n:])
        return Decision(action=[int(x) for x in a], name="rates " + " ".join(f"{r:g}" for r in rates),
                        info={"rates": [float(r) for r in rates]}), None

    def metadata(self) -> dict:
        from samm import __version__

        return {"kind": KIND, "problem": PROBLEM, "format": FORMAT, "version": self.version,
                "samm_version": __version__, "setting": asdict(self.setting), "rates": list(RATES),
                "features": self.features, "hidden": self.net.hidden,
                "shield": None if self.shield is None else self.shield.to_json(),
                "observation_space": space_to_json(self.observation_space),
                "action_space": space_to_json(self.action_space), "training": self.training}

    def save(self, directory) -> Path:
        return save_torch_policy(directory, self.net, self.metadata(), WEIGHTS_FILE, METADATA_FILE)

    @classmethod
    def load(cls, directory) -> "OversubPolicy":
        d = Path(directory)
        meta = read_policy_metadata(d, KIND, PROBLEM, FORMAT)
        try:
            setting = Setting(**meta["setting"])
            hidden = int(meta["hidden"])
            features = str(meta.get("features", "paper"))
            saved_obs = space_from_json(meta["observation_space"])
            saved_act = space_from_json(meta["action_space"])
            shield = None if meta.get("shield") is None else Shield.from_json(meta["shield"], setting.n_subscribers)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{d / METADATA_FILE}: missing or malformed field ({e})") from None
        floor = shield is not None
        check_spaces(saved_obs, saved_act, *oversub_spaces(setting, features, floor), what=str(d))
        net = C2MarlNet(setting.n_subscribers, observation_size(setting, features, floor), len(RATES), hidden)
        load_torch_weights(d, net, WEIGHTS_FILE, METADATA_FILE)
        return cls(net, setting, meta.get("training"), meta.get("version"), features=features, shield=shield)


def shipped_policy() -> OversubPolicy:
    return OversubPolicy.load(SHIPPED_DIR)


def default_setting() -> Setting:
    return SETTINGS["azure"]
