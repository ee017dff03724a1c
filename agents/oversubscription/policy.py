"""A trained C2MARL policy as SAMM hosts it: each agent's greedy action on its own Q^i (the
decentralised execution of §5.3; Q^c is a training device and is not needed to act).

    policy.rates(view)                 -> [N] rates from its action set (simulator, live admission path)
    policy.decide(observation_vector)  -> Decision(action=[N] rate indices)   (Policy protocol)
    policy.save(dir) / OversubPolicy.load(dir)

Its network is one C2MarlNet or, from `--ensemble K` (ours), a C2MarlEnsemble of the run's last K
snapshots voting per agent; the metadata's "ensemble" says which, and load rebuilds the same.

A shielded policy (shield.py, ours) carries its N-sigma floor and the prior it starts from: `rates`
computes the floor from the view's usage history and returns max(rates[a], floor); its observation
vector ends with the floor, so `decide` applies the same max (its `info["rates"]`).

The action set is the paper's RATES unless the policy was trained on another (`C2MarlConfig.rates`,
ours); the metadata's "rates" holds it (policies saved before it was configurable held RATES there).

A headroom policy (`C2MarlConfig.action="headroom"`, ours) carries its anchor (an N-sigma, percentile or
max predictor's forecast) as a shield in "headroom" mode; its action values are headrooms (the metadata's "headrooms", "rates" null) and its
rate for subscriber i is clip(headroom[a_i] * forecast_i, 0.2, 1), the forecast last in its observation.
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
from .network import C2MarlEnsemble, C2MarlNet
from .baselines import rates_from_prior
from .settings import RATES, SETTINGS, Setting, check_headrooms, check_rates
from .shield import Shield

KIND = "c2marl"
PROBLEM = "oversubscription"
FORMAT = 1
METADATA_FILE = "metadata.json"
WEIGHTS_FILE = "weights.pt"
SHIPPED_DIR = Path(__file__).parent / "policies" / "c2marl-azure-0.95"


def oversub_spaces(setting: Setting, features: str = "paper", floor: bool = False, n_rates: int = len(RATES)
                   ) -> tuple[spaces.Box, spaces.MultiDiscrete]:
    obs = spaces.Box(low=0.0, high=np.inf, shape=(observation_size(setting, features, floor),), dtype=np.float32)
    act = spaces.MultiDiscrete([n_rates] * setting.n_subscribers)
    return obs, act


class OversubPolicy:
    problem = PROBLEM
    kind = KIND
    stateful = False

    def __init__(self, net: C2MarlNet | C2MarlEnsemble, setting: Setting, training: dict | None = None,
                 version: str | None = None, features: str = "paper", shield: Shield | None = None,
                 rates=RATES):
        self.net = net.eval()
        self.headroom = shield is not None and shield.spec.mode == "headroom"
        # `rates`: the action values, rates in (0, 1], or headrooms for a headroom policy
        self.action_values = np.asarray(check_headrooms(rates) if self.headroom else check_rates(rates))
        if self.action_values.size != net.n_actions:
            what = "headrooms" if self.headroom else "rates"
            raise ValueError(f"{self.action_values.size} {what} for a network of {net.n_actions} actions")
        self.setting = setting
        self.features = features
        self.shield = shield
        self.training = training or {}
        self.version = version or "unversioned"
        self.observation_space, self.action_space = oversub_spaces(setting, features, shield is not None,
                                                                   self.action_values.size)

    @property
    def rate_set(self) -> np.ndarray | None:
        """The rates the agents choose from; None for a headroom policy (its rates are continuous)."""
        return None if self.headroom else self.action_values

    def initial_state(self):
        return None

    def check_observation(self, observation_vec) -> None:
        """InvalidInput naming what is wrong: a vector of another length fails deep in torch, and a
        NaN one makes every agent's argmax index 0, the lowest rate (the most oversubscription)."""
        from samm.plan.dataplane import InvalidInput

        x = np.asarray(observation_vec, dtype=np.float64).reshape(-1)
        n = self.observation_space.shape[0]
        if x.size != n:
            raise InvalidInput("observation", f"{x.size} values, the policy reads {n}")
        bad = np.flatnonzero(~np.isfinite(x))
        if bad.size:
            raise InvalidInput(f"observation[{bad[0]}]", f"must be a finite number, got {x[bad[0]]}")

    def action_indices(self, obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return self.net.greedy(torch.as_tensor(np.asarray(obs, np.float32)).reshape(1, -1))[0].numpy()

    def rates(self, view) -> np.ndarray:
        floor = None if self.shield is None else self.shield.floor_fresh(view)
        chosen = self.action_values[self.action_indices(observation(view, self.setting, self.features, floor))]
        return chosen if floor is None else self.shield.apply(chosen, floor)

    def decide(self, observation_vec, state=None, *, mask=None, deterministic: bool = True):
        self.check_observation(observation_vec)
        a = self.action_indices(observation_vec)
        rates = self.action_values[a]
        if self.shield is not None:   # the observation ends with the floor or forecast (features.observation)
            n = self.setting.n_subscribers
            rates = self.shield.apply(rates, np.asarray(observation_vec, dtype=np.float64).reshape(-1)[-n:])
        return Decision(action=[int(x) for x in a], name="rates " + " ".join(f"{r:g}" for r in rates),
                        info={"rates": [float(r) for r in rates]}), None

    def metadata(self) -> dict:
        from samm import __version__

        return {"kind": KIND, "problem": PROBLEM, "format": FORMAT, "version": self.version,
                "samm_version": __version__, "setting": asdict(self.setting),
                "rates": None if self.headroom else self.action_values.tolist(),
                **({"headrooms": self.action_values.tolist()} if self.headroom else {}),
                "features": self.features, "hidden": self.net.hidden,
                "shield": None if self.shield is None else self.shield.to_json(),
                "ensemble": None if not isinstance(self.net, C2MarlEnsemble)
                else {"members": len(self.net.members), "vote": self.net.how},
                "observation_space": space_to_json(self.observation_space),
                "action_space": space_to_json(self.action_space), "training": self.training}

    def with_vote(self, how: str) -> "OversubPolicy":
        """The same ensemble's members voting by `how` (network.VOTES): a saved ensemble tested under
        another vote without training again. A single net has no vote to change."""
        if not isinstance(self.net, C2MarlEnsemble):
            raise ValueError(f"policy {self.version} is a single net, not an ensemble: it has no vote to change")
        training = dict(self.training)
        if isinstance(training.get("ensemble"), dict):    # the vote changes no weight, only how they act
            training["ensemble"] = training["ensemble"] | {"vote": how}
        return type(self)(C2MarlEnsemble(list(self.net.members), how), self.setting, training, self.version,
                          features=self.features, shield=self.shield, rates=self.action_values)

    def save(self, directory) -> Path:
        return save_torch_policy(directory, self.net, self.metadata(), WEIGHTS_FILE, METADATA_FILE)

    @classmethod
    def load(cls, directory) -> "OversubPolicy":
        d = Path(directory)
        meta = read_policy_metadata(d, KIND, PROBLEM, FORMAT)
        try:
            setting = Setting(**meta["setting"])
            hidden = int(meta["hidden"])
            if hidden < 1:   # a network of no (or negative) width fails deep in torch, or divides by zero
                raise ValueError(f"hidden {hidden} < 1")
            features = str(meta.get("features", "paper"))
            observation_size(setting, features)   # an unknown feature set, named with the file
            saved_obs = space_from_json(meta["observation_space"])
            saved_act = space_from_json(meta["action_space"])
            shield = None if meta.get("shield") is None else Shield.from_json(meta["shield"], setting.n_subscribers)
            if shield is not None and shield.spec.mode == "headroom":
                rates = check_headrooms(meta["headrooms"])
            else:
                rates = check_rates(meta.get("rates", RATES))
            ensemble = meta.get("ensemble")
            if ensemble is not None:
                members, how = int(ensemble["members"]), str(ensemble["vote"])
                if members < 1:
                    raise ValueError(f"ensemble members {members} < 1")
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{d / METADATA_FILE}: missing or malformed field ({e})") from None
        floor = shield is not None
        check_spaces(saved_obs, saved_act, *oversub_spaces(setting, features, floor, len(rates)), what=str(d))
        shape = (setting.n_subscribers, observation_size(setting, features, floor), len(rates), hidden)
        try:
            net = C2MarlNet(*shape) if ensemble is None else C2MarlEnsemble([C2MarlNet(*shape) for _ in range(members)],
                                                                             how)
        except ValueError as e:
            raise ValueError(f"{d / METADATA_FILE}: {e}") from None
        load_torch_weights(d, net, WEIGHTS_FILE, METADATA_FILE)
        return cls(net, setting, meta.get("training"), meta.get("version"), features=features, shield=shield,
                   rates=rates)


#: hosted rule name -> (baselines.RULES name, parameters tuned on the Azure-like training days at
#: alpha = 0.95: the Table 3 run of `samm experiment c2marl`, docs/experiments/c2marl-azure-report.md)
HOSTED_RULES = {
    "nsigma": ("NSigma", {"n": 2.0, "window": 24, "headroom": 3.0}),
    "percentile": ("Percentile", {"p": 100.0, "window": 120, "headroom": 2.0}),
    "max-predictor": ("Max", {"n": 3.0, "p": 99.0, "window": 24, "headroom": 2.4}),
    "ma-des": ("MA", {"smoothing": 0.2, "headroom": 14.0}),
}
_INT_PARAMS = ("window",)


class RulePolicy:
    """A production overcommit predictor of baselines.py hosted behind the admit routes: what
    docs/oversubscription.md advises until a learned policy holds its bound on unseen weeks.

    Its history is the prior (the setting's calibrated training days replayed at rate 1, or none
    with `prior="none"`) followed by the `usage_history` each request brings; every call starts
    from that prior, so callers never share state."""

    problem = PROBLEM
    stateful = False

    def __init__(self, name: str, setting: Setting | str = "azure", prior: str = "trace", trace_seed: int = 0,
                 **params):
        from .baselines import RuleContext, make_rule, replay_usage_history
        from .settings import get_setting

        if name not in HOSTED_RULES:
            raise ValueError(f"oversubscription hosts the rules {sorted(HOSTED_RULES)}, not {name!r}")
        if prior not in ("trace", "none"):
            raise ValueError(f"prior must be 'trace' or 'none', not {prior!r}")
        rule_name, defaults = HOSTED_RULES[name]
        self.kind = name
        self.setting = get_setting(setting)
        try:
            self.params = {**defaults, **{k: (int(v) if k in _INT_PARAMS else float(v)) for k, v in params.items()}}
        except ValueError as exc:
            raise ValueError(f"{name}: parameters must be numbers ({exc})") from None
        history = None
        if prior == "trace":
            from .data import generate_trace
            history = replay_usage_history(self.setting, generate_trace(self.setting, int(float(trace_seed))).train_workload())
        self._template = make_rule(rule_name, RuleContext(self.setting, prior=history), **self.params)
        self.prior = prior
        self.version = f"{name}({', '.join(f'{k}={v:g}' for k, v in sorted(self.params.items()))})"
        self.observation_space, self.action_space = oversub_spaces(self.setting)

    def initial_state(self):
        return None

    def rates(self, view) -> np.ndarray:
        return rates_from_prior(self._template, view)

    def decide(self, observation_vec, state=None, *, mask=None, deterministic: bool = True):
        raise NotImplementedError(f"{self.kind} forecasts from each subscriber's usage history: "
                                  f"use POST /v1/agents/{self.kind}/admit")

    def metadata(self) -> dict:
        return {"kind": self.kind, "problem": PROBLEM, "version": self.version, "params": self.params,
                "prior": self.prior, "setting": asdict(self.setting)}


def shipped_policy() -> OversubPolicy:
    return OversubPolicy.load(SHIPPED_DIR)


def default_setting() -> Setting:
    return SETTINGS["azure"]
