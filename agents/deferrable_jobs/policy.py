"""What SAMM hosts for the deferrable-jobs problem: a policy scores the eligible jobs of a slot
and the prefix rule (rules.py) turns the scores into the jobs to start.

    policy.scores(view, history)   -> [len(shown eligible)] confidence scores (higher = sooner)
    policy.schedule(view, history) -> job rows to start      (simulator, service, live loop)
    policy.decide(observation)     -> Decision(action=scores) (the Policy protocol: env observations)
    policy.save(dir) / OsdecPolicy.load(dir)

`history` is the window of slot summaries the auxiliary tasks read (features.SummaryHistory);
the caller keeps it (the env, the service per session, the live loop). A heuristic rule is a
policy too (`RulePolicy`), so the service and the live loop host either.
"""
from __future__ import annotations

from dataclasses import asdict, fields
from pathlib import Path

import numpy as np
import torch
from gymnasium import spaces

from agents.policy import Decision, load_torch_weights, one_line, save_torch_policy
from agents.registry import read_policy_metadata
from agents.spaces import check_spaces, space_from_json, space_to_json

from .env import DeferrableJobsEnv
from .features import SummaryHistory, job_tokens, slot_summary
from .osdec import OsdecConfig, OsdecModel
from .rules import select_by_scores
from .settings import Setting, get_setting

KIND = "osdec"
PROBLEM = "deferrable-jobs"
FORMAT = 1
METADATA_FILE = "metadata.json"
WEIGHTS_FILE = "weights.pt"
SHIPPED_DIR = Path(__file__).parent / "policies" / "osdec-default"


def deferrable_spaces(setting: Setting) -> tuple[spaces.Dict, spaces.Box]:
    env = DeferrableJobsEnv.__new__(DeferrableJobsEnv)
    DeferrableJobsEnv.__init__(env, setting, episode=None)
    return env.observation_space, env.action_space


class OsdecPolicy:
    problem = PROBLEM
    kind = KIND
    stateful = False

    def __init__(self, model: OsdecModel, cfg: OsdecConfig, setting: Setting, training: dict | None = None,
                 version: str | None = None):
        self.model = model.eval()
        self.cfg = cfg
        self.setting = setting
        self.training = training or {}
        self.version = version or "unversioned"
        self.observation_space, self.action_space = deferrable_spaces(setting)

    @property
    def mapping(self) -> str:
        """How scores become starts: "prefix" (the paper's) or "skip" (ours; rules.py)."""
        return self.cfg.mapping

    def initial_state(self):
        return None

    def _mu(self, tokens: np.ndarray, mask: np.ndarray, history: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            tok = torch.as_tensor(np.asarray(tokens, np.float32))[None]
            m = torch.as_tensor(np.asarray(mask).astype(bool))[None]
            extra = self.model.aux_features(torch.as_tensor(np.asarray(history, np.float32))[None])
            mu, _, _ = self.model(tok, m, extra)
        return mu[0].numpy()

    def scores(self, view, history: SummaryHistory) -> tuple[np.ndarray, np.ndarray]:
        """(eligible rows shown to the policy, their scores). Pushes this slot's summary."""
        tok, mask, shown = job_tokens(view, self.setting)
        hist = history.push(slot_summary(view, self.setting))
        return shown, self._mu(tok, mask, hist)[: len(shown)]

    def schedule(self, view, history: SummaryHistory) -> np.ndarray:
        shown, scores = self.scores(view, history)
        return shown[select_by_scores(scores, view.episode.cores[shown], view.free, self.mapping)]

    def check_observation(self, observation) -> None:
        """InvalidInput naming the field: a NaN token made the reply fail with "cannot convert float
        NaN to integer", and a wrongly shaped field failed deep in torch."""
        from samm.plan.dataplane import InvalidInput

        if not isinstance(observation, dict):
            raise InvalidInput("observation", "must be an object with tokens, mask and history")
        for key, space in self.observation_space.spaces.items():
            if key not in observation:
                raise InvalidInput("observation", f"missing {key!r}")
            x = np.asarray(observation[key], dtype=np.float64)
            if x.shape != space.shape:
                raise InvalidInput(f"observation.{key}", f"shape {list(x.shape)} != {list(space.shape)}")
            if not np.isfinite(x).all():
                raise InvalidInput(f"observation.{key}", "must hold finite numbers only")

    def decide(self, observation, state=None, *, mask=None, deterministic: bool = True):
        self.check_observation(observation)
        mu = self._mu(observation["tokens"], observation["mask"], observation["history"])
        return Decision(action=[float(x) for x in mu], name="scores",
                        info={"eligible_shown": int(np.asarray(observation["tokens"])[:, 0].sum())}), None

    def metadata(self) -> dict:
        from samm import __version__

        return {"kind": KIND, "problem": PROBLEM, "format": FORMAT, "version": self.version,
                "samm_version": __version__, "setting": asdict(self.setting), "config": asdict(self.cfg),
                "observation_space": space_to_json(self.observation_space),
                "action_space": space_to_json(self.action_space), "training": self.training}

    def save(self, directory) -> Path:
        return save_torch_policy(directory, self.model, self.metadata(), WEIGHTS_FILE, METADATA_FILE)

    @classmethod
    def load(cls, directory) -> "OsdecPolicy":
        d = Path(directory)
        meta = read_policy_metadata(d, KIND, PROBLEM, FORMAT)
        try:
            setting = Setting(**{k: tuple(v) if isinstance(v, list) else v for k, v in meta["setting"].items()})
            known = {f.name for f in fields(OsdecConfig)}
            cfg = OsdecConfig(**{k: tuple(v) if isinstance(v, list) else v
                                 for k, v in meta["config"].items() if k in known})
            saved_obs = space_from_json(meta["observation_space"])
            saved_act = space_from_json(meta["action_space"])
        except (KeyError, TypeError, ValueError, AttributeError) as e:   # AttributeError: a list where a mapping goes
            raise ValueError(f"{d / METADATA_FILE}: missing or malformed field ({e})") from None
        check_spaces(saved_obs, saved_act, *deferrable_spaces(setting), what=str(d))
        try:
            model = OsdecModel.build(cfg, setting)
        except (RuntimeError, TypeError, ValueError) as e:   # e.g. d_model -1: torch's bare "negative dimension"
            raise ValueError(f"{d / METADATA_FILE}: its network cannot be built ({one_line(e)})") from None
        load_torch_weights(d, model, WEIGHTS_FILE, METADATA_FILE)
        return cls(model, cfg, setting, meta.get("training"), meta.get("version"))


class RulePolicy:
    """A heuristic of baselines.py behind the same interface (it ignores the history)."""
    problem = PROBLEM
    stateful = False

    def __init__(self, name: str, setting: Setting | str = "default", **params):
        from .baselines import make_rule

        self.kind = name
        self.rule = make_rule(name, **params)
        self.params = params
        self.setting = get_setting(setting)
        self.version = f"{name}({', '.join(f'{k}={v}' for k, v in sorted(params.items()))})"
        self.observation_space, self.action_space = deferrable_spaces(self.setting)

    def initial_state(self):
        return None

    def schedule(self, view, history: SummaryHistory | None = None) -> np.ndarray:
        if history is not None:
            history.push(slot_summary(view, self.setting))
        return np.asarray(self.rule(view), dtype=np.int64)

    def decide(self, observation, state=None, *, mask=None, deterministic: bool = True):
        raise NotImplementedError(f"{self.kind} schedules whole slots: use POST /v1/agents/{self.kind}/schedule")

    def metadata(self) -> dict:
        return {"kind": self.kind, "problem": PROBLEM, "version": self.version, "params": self.params,
                "setting": asdict(self.setting)}


def shipped_policy() -> OsdecPolicy:
    return OsdecPolicy.load(SHIPPED_DIR)
