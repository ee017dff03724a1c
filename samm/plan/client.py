"""How the daemon asks for a decision: an agent in this process, or the Policy Evaluation
Service over HTTP. Either way a failure never stops the loop: the configured safe policy
(do nothing) is used instead and the reason is returned for the record.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np
import requests

from agents.base import Agent
from sim_bridge.actions import to_deltas

log = logging.getLogger(__name__)


@dataclass
class PlanOutcome:
    """One decision, in the daemon's terms: per-group deltas plus what the agent said."""

    deltas: dict[str, int]
    action: int | list[int] | None
    action_name: str
    probabilities: list | None = None
    value: float | None = None
    policy_version: str | None = None
    source: str = "agent"  # agent | fallback
    reason: str | None = None
    latency_ms: float = 0.0
    extra: dict = field(default_factory=dict)


def deltas_of(action_mode: str, action, type_names) -> dict[str, int]:
    d = to_deltas(action_mode, np.asarray([action]) if action_mode == "paper" else np.asarray([action]),
                  len(type_names))[0]
    return {t: int(v) for t, v in zip(type_names, d)}


def fallback(reason: str, started: float) -> PlanOutcome:
    log.warning("plan: falling back to do-nothing: %s", reason)
    return PlanOutcome(deltas={}, action=None, action_name="nothing (fallback)", source="fallback", reason=reason,
                       latency_ms=(time.perf_counter() - started) * 1e3)


class InProcessPlanner:
    """Holds the agent and its recurrent state for the daemon's one session."""

    def __init__(self, agent: Agent, deterministic: bool = True):
        self.agent = agent
        self.deterministic = deterministic
        self.state = agent.initial_state(1)
        self.feature_names = agent.feature_names

    def reset(self) -> None:
        self.state = self.agent.initial_state(1)

    def decide(self, features: np.ndarray) -> PlanOutcome:
        started = time.perf_counter()
        try:
            x = np.asarray(features, dtype=np.float32).reshape(1, -1)
            if not np.all(np.isfinite(x)):
                return fallback(f"non-finite observation {x.tolist()}", started)
            d, self.state = self.agent.act(x, self.state, deterministic=self.deterministic)
            a = np.asarray(d.actions)[0]
            action = int(a) if self.agent.action_mode == "paper" else [int(v) for v in a]
            probs = None if d.probabilities is None else np.asarray(d.probabilities)[0].round(6).tolist()
            value = None if d.values is None else float(np.asarray(d.values)[0])
            return PlanOutcome(deltas_of(self.agent.action_mode, action, self.agent.type_names), action,
                               self.agent.describe_action(a), probs, value, self.agent.version,
                               latency_ms=(time.perf_counter() - started) * 1e3)
        except Exception as exc:  # noqa: BLE001 - a broken agent must not stop the loop
            log.exception("plan: agent %s failed", self.agent.kind)
            return fallback(f"agent {self.agent.kind} failed: {type(exc).__name__}: {exc}", started)


class HttpPlanner:
    """Calls `POST /v1/agents/{agent}/decide` of a Policy Evaluation Service."""

    def __init__(self, service_url: str, agent_name: str, session_id: str, timeout_s: float = 2.0,
                 deterministic: bool = True, http: requests.Session | None = None):
        self.url = service_url.rstrip("/")
        self.agent_name = agent_name
        self.session_id = session_id
        self.timeout_s = timeout_s
        self.deterministic = deterministic
        self.http = http or requests.Session()
        self.spec: dict | None = None

    @property
    def feature_names(self) -> tuple[str, ...] | None:
        self._load_spec()
        return tuple(self.spec["feature_names"]) if self.spec else None

    def _load_spec(self) -> None:
        if self.spec is not None:
            return
        try:
            r = self.http.get(f"{self.url}/v1/agents", timeout=self.timeout_s)
            r.raise_for_status()
            for a in r.json()["agents"]:
                if a["name"] == self.agent_name:
                    self.spec = a
        except (requests.RequestException, ValueError, KeyError) as exc:
            log.warning("plan: cannot read agent list from %s: %s", self.url, exc)

    def reset(self) -> None:
        try:
            self.http.post(f"{self.url}/v1/agents/{self.agent_name}/sessions/{self.session_id}/reset",
                           timeout=self.timeout_s)
        except requests.RequestException as exc:
            log.warning("plan: session reset failed: %s", exc)

    def decide(self, features: np.ndarray) -> PlanOutcome:
        started = time.perf_counter()
        self._load_spec()
        if self.spec is None:
            return fallback(f"service {self.url} unreachable or does not host agent {self.agent_name!r}", started)
        names = self.spec["feature_names"]
        x = np.asarray(features, dtype=np.float64).reshape(-1)
        if len(x) != len(names):
            return fallback(f"observation has {len(x)} values, agent expects {len(names)}", started)
        body = {"session_id": self.session_id, "observation": dict(zip(names, map(float, x))),
                "deterministic": self.deterministic}
        try:
            r = self.http.post(f"{self.url}/v1/agents/{self.agent_name}/decide", json=body, timeout=self.timeout_s)
        except requests.RequestException as exc:
            return fallback(f"service {self.url} unreachable: {type(exc).__name__}", started)
        if r.status_code != 200:
            return fallback(f"service answered HTTP {r.status_code}: {r.text[:200]}", started)
        try:
            d = r.json()
            deltas = deltas_of(self.spec["action_mode"], d["action"], self.spec["type_names"])
        except (ValueError, KeyError) as exc:
            return fallback(f"service reply not understood: {exc}", started)
        return PlanOutcome(deltas, d["action"], d["action_name"], d.get("probabilities"), d.get("value"),
                           d.get("policy_version"), latency_ms=(time.perf_counter() - started) * 1e3)
