"""The one Agent interface used by the simulator runner, the evaluator, the trainer's outputs
and the Policy Evaluation Service.

An agent is a decision function over named features (`feature_names`, computed by
`samm.analyze.features`) with explicit per-caller state: callers create it with
`initial_state(batch)`, pass it to `act` and keep what `act` returns. Nothing is shared between
callers (the prior service kept ONE global LSTM state for everyone). Everything is batched:
a single caller is a batch of one.
"""
from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from samm import __version__
from sim_bridge.actions import action_names as _action_names

from .report import json_default as _json_default
from .spaces import space_to_json
from sim_bridge.config import ActionMode

METADATA_FILE = "metadata.json"


@dataclass
class Decisions:
    """Decisions for a batch. `actions`: (B,) for `paper` mode, (B, n_types) for `per-type`.
    `probabilities`: (B, n_actions) or (B, n_types, 3) where the agent has them. `values`: (B,)."""

    actions: np.ndarray
    probabilities: np.ndarray | None = None
    values: np.ndarray | None = None


class Agent(ABC):
    """An autoscaling agent. Batched `act` serves the simulator and the trainer; `decide` (one
    caller) and the spaces make it a `agents.policy.Policy`, as every hosted policy is."""

    kind: ClassVar[str]
    problem: ClassVar[str] = "autoscaling"
    #: whether `act` depends on the state (recurrent or time-based agents)
    stateful: ClassVar[bool] = False

    def __init__(self, feature_names: tuple[str, ...], action_mode: ActionMode, type_names: tuple[str, ...],
                 params: dict | None = None, env_config_hash: str | None = None, training: dict | None = None,
                 version: str | None = None):
        self.feature_names = tuple(feature_names)
        self.action_mode: ActionMode = action_mode
        self.type_names = tuple(type_names)
        self.params = dict(params or {})
        self.env_config_hash = env_config_hash
        self.training = training or {}
        self.version = version or f"{self.kind}-{time.strftime('%Y%m%d%H%M%S')}"

    # -- deciding ----------------------------------------------------------------------------
    def initial_state(self, batch: int = 1) -> Any:
        return None

    def reset_state(self, state: Any, mask: np.ndarray) -> Any:
        """Fresh state where `mask` (B,) is true (new episodes or new sessions)."""
        return state

    @abstractmethod
    def act(self, features: np.ndarray, state: Any, deterministic: bool = True) -> tuple[Decisions, Any]:
        """features: (B, len(feature_names)) float32."""

    @property
    def n_types(self) -> int:
        return len(self.type_names)

    @property
    def action_names(self) -> list[str]:
        return _action_names(self.action_mode, self.type_names)

    def describe_action(self, action) -> str:
        if self.action_mode == "paper":
            return self.action_names[int(action)]
        words = ("remove", "keep", "add")
        return ", ".join(f"{words[int(a)]} {t}" for a, t in zip(np.asarray(action).reshape(-1), self.type_names))

    # -- the Policy protocol (one caller) ---------------------------------------------------------
    @property
    def observation_space(self):
        """The named features: the seven metrics are ratios in [0, 1]; other features (VM counts,
        queue lengths) are non-negative. Built once (the service checks bounds on every request)."""
        cached = self.__dict__.get("_observation_space")
        if cached is not None and cached.names == (self.feature_names or ("none",)):
            return cached
        from samm.analyze.features import feature_bounds

        from .spaces import NamedBox

        names = self.feature_names or ("none",)
        low = np.zeros(len(names), np.float32)
        high = np.array([feature_bounds(n)[1] for n in names], np.float32)
        self._observation_space = NamedBox(names, low, high)
        return self._observation_space

    @property
    def action_space(self):
        from gymnasium import spaces

        if self.action_mode == "paper":
            return spaces.Discrete(1 + 2 * self.n_types)
        return spaces.MultiDiscrete([3] * self.n_types)

    def decide(self, observation, state=None, *, mask=None, deterministic: bool = True):
        """observation: {feature: value} or a vector in `feature_names` order. `mask` (paper mode's
        Discrete actions only, Gymnasium's action_mask): a forbidden choice is replaced by an
        allowed one (`_allowed_action`); it was once ignored, and a forbidden action came back."""
        from samm.plan.dataplane import check_mask

        from .policy import Decision

        allowed = check_mask(self.action_space, mask)
        if isinstance(observation, dict):
            observation = [observation[f] for f in self.feature_names]
        x = np.asarray(observation, dtype=np.float32).reshape(1, -1)
        if state is None:
            state = self.initial_state(1)
        d, state = self.act(x, state, deterministic=deterministic)
        act = np.asarray(d.actions)[0]
        probs = None if d.probabilities is None else np.asarray(d.probabilities, dtype=np.float64)[0]
        if allowed is not None and not allowed[int(act)]:
            act = np.asarray(self._allowed_action(probs, allowed, deterministic))
        action = int(act) if self.action_mode == "paper" else [int(v) for v in act]
        info = {"probabilities": None if probs is None else probs.round(6).tolist(),
                "value": None if d.values is None else float(np.asarray(d.values)[0])}
        return Decision(action, self.describe_action(act), info), state

    def _allowed_action(self, probs: np.ndarray | None, allowed: np.ndarray, deterministic: bool) -> int:
        """An allowed action in place of a forbidden choice. A policy's probabilities renormalised
        over the allowed actions: the most likely, or a sample (drawn only after a forbidden
        sample, it gives exactly the masked distribution: rejection sampling). A rule without
        probabilities: the first allowed action (0, do nothing, where it is allowed)."""
        if probs is None:
            return int(np.flatnonzero(allowed)[0])
        p = np.where(allowed > 0, probs, 0.0)
        if p.sum() <= 0:   # every allowed action's probability underflowed to 0: none is preferred
            p = (allowed > 0).astype(np.float64)
        p = p / p.sum()
        rng = getattr(self, "np_rng", None)
        return int(p.argmax()) if deterministic or rng is None else int(rng.choice(len(p), p=p))

    # -- persistence -------------------------------------------------------------------------
    def metadata(self) -> dict:
        return {
            "kind": self.kind,
            "problem": self.problem,
            "version": self.version,
            "samm_version": __version__,
            "feature_names": list(self.feature_names),
            "action_mode": self.action_mode,
            "action_names": self.action_names,
            "type_names": list(self.type_names),
            "env_config_hash": self.env_config_hash,
            "params": self.params,
            "training": self.training,
            "observation_space": space_to_json(self.observation_space),
            "action_space": space_to_json(self.action_space),
        }

    def save(self, directory: str | Path) -> Path:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        self._save_weights(d)
        (d / METADATA_FILE).write_text(json.dumps(self.metadata(), indent=2, default=_json_default))
        return d

    def _save_weights(self, directory: Path) -> None:
        """Agents with learned weights write them here."""

    @classmethod
    def _from_metadata(cls, meta: dict, directory: Path) -> "Agent":
        return cls(tuple(meta["feature_names"]), meta["action_mode"], tuple(meta["type_names"]),
                   params=meta.get("params"), env_config_hash=meta.get("env_config_hash"),
                   training=meta.get("training"), version=meta.get("version"))


_REGISTRY: dict[str, type[Agent]] = {}


def register(cls: type[Agent]) -> type[Agent]:
    _REGISTRY[cls.kind] = cls
    return cls


def agent_kinds() -> list[str]:
    _load_all()
    return sorted(_REGISTRY)


def agent_class(kind: str) -> type[Agent]:
    _load_all()
    if kind not in _REGISTRY and kind in _NEEDS_TRAIN_EXTRA and _TRAIN_EXTRA_MISSING:
        raise ValueError(f"agent {kind!r} needs PyTorch, which this install lacks ({_TRAIN_EXTRA_MISSING}): "
                         "install SAMM with its train extra, pip install 'samm[train]'")
    if kind not in _REGISTRY:
        raise ValueError(f"unknown agent {kind!r}; known: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[kind]


def load_agent(directory: str | Path) -> Agent:
    from .registry import read_metadata

    d = Path(directory)
    problem = read_metadata(d).get("problem", "autoscaling")
    if problem != "autoscaling":  # was "missing 'feature_names'", which sent users to repair the file
        raise ValueError(f"{d / 'metadata.json'}: a policy of the {problem!r} problem, not an autoscaling agent "
                         f"(give --problem {problem})")
    meta = read_metadata(d, ("kind", "feature_names", "action_mode", "type_names"))
    kind = meta["kind"]
    try:
        if not isinstance(kind, str):
            raise ValueError(f"unknown agent {kind!r}: not a name")
        cls = agent_class(kind)
    except ValueError as exc:
        raise ValueError(f"{d / 'metadata.json'}: {exc}") from None
    return cls._from_metadata(meta, d)


_NEEDS_TRAIN_EXTRA = ("lstm-ppo",)
_TRAIN_EXTRA_MISSING: str | None = None   # why the PPO agent did not import, where it did not


def _load_all() -> None:
    # importing the modules registers their classes
    global _TRAIN_EXTRA_MISSING
    from . import builtin  # noqa: F401
    from .baselines import queue, target_tracking, threshold  # noqa: F401
    if _TRAIN_EXTRA_MISSING is not None:
        return                       # known missing: a failed import is not cached, so not tried again
    try:
        from .ppo import agent  # noqa: F401
    except ImportError as exc:   # an install without torch (no [train] extra) still runs the rules
        if (exc.name or "").split(".")[0] != "torch":
            raise                    # a broken module of ours is not a missing extra
        _TRAIN_EXTRA_MISSING = f"{type(exc).__name__}: {exc}"
