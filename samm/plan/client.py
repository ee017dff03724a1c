"""How the daemon asks for a decision: an agent in this process, or the Policy Evaluation
Service over HTTP. Either way a failure never stops the loop: the configured safe policy
(do nothing) is used instead and the reason is returned for the record.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import time
from dataclasses import dataclass, field

import numpy as np
import requests

from agents.base import Agent
from samm.config import url_without_password
from samm.httpio import fetch_bounded, one_line_page
from samm.plan.registry import broken_probabilities
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
            d, state = self.agent.act(x, self.state, deterministic=self.deterministic)
            if broken_probabilities(d):
                # as the service refuses it: a NaN policy's argmax is "remove" every type
                return fallback(f"agent {self.agent.kind} failed: its action probabilities are not finite "
                                "(a broken policy)", started)
            self.state = state
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


#: how soon the agent list is read again after reading it failed
SPEC_RETRY_S = 1.0


class HttpPlanner:
    """Calls `POST /v1/agents/{agent}/decide` of a Policy Evaluation Service."""

    def __init__(self, service_url: str, agent_name: str, session_id: str, timeout_s: float = 2.0,
                 deterministic: bool = True, http: requests.Session | None = None):
        self.url = service_url.rstrip("/")
        # what logs and recorded reasons show: a basic-auth password in the URL is ***
        self.shown_url = url_without_password(self.url)
        self.agent_name = agent_name
        self.session_id = service_session_id(session_id)
        self.timeout_s = timeout_s
        self.deterministic = deterministic
        self.http = http or requests.Session()
        self.spec: dict | None = None
        self.spec_error: str | None = None  # why the agent list gave no usable spec
        self._spec_failed_at = -float("inf")  # monotonic time the last reading of it failed

    @property
    def feature_names(self) -> tuple[str, ...] | None:
        self._load_spec()
        return tuple(self.spec["feature_names"]) if self.spec else None

    def _load_spec(self) -> None:
        if self.spec is not None:
            return
        # an iteration reads the features, then decides: a service that is down cost it two
        # timeouts, one per call; a failure just now is the answer for the second
        if self.spec_error is not None and time.monotonic() - self._spec_failed_at < SPEC_RETRY_S:
            return
        try:
            status, body, _ = fetch_bounded(self.http.get, f"{self.url}/v1/agents", self.timeout_s)
            if status != 200:  # named: "unreachable: HTTPError" hid a 503 or a proxy's 404
                self.spec_error = f"service {self.shown_url}: agent list answered HTTP {status}: {one_line_page(body, 200)}"
                log.warning("plan: cannot read agent list: %s", self.spec_error)
                return
            listed = json.loads(body)
            agents = listed.get("agents") if isinstance(listed, dict) else None
            if not isinstance(agents, list):
                raise ValueError("the reply has no list 'agents'")
            for a in agents:
                if isinstance(a, dict) and a.get("name") == self.agent_name:
                    self.spec = _autoscaling_spec(a)
            self.spec_error = None if self.spec else f"service {self.shown_url} does not host agent {self.agent_name!r}"
        except requests.RequestException as exc:
            self.spec_error = f"service {self.shown_url} unreachable: {type(exc).__name__}"
            log.warning("plan: cannot read agent list from %s: %s", self.shown_url, exc)
        except ValueError as exc:  # not JSON, or not the service's schema
            self.spec_error = f"service {self.shown_url}: agent list not understood: {str(exc)[:200]}"
            log.warning("plan: cannot read agent list from %s: %s", self.shown_url, exc)
        finally:
            if self.spec is None:
                self._spec_failed_at = time.monotonic()

    def reset(self) -> bool:
        """Start the session's memory afresh; whether the service did (a refusal is logged, as a
        failure to reach it is: a 404 or a 422 left the old memory in place without a word)."""
        try:
            status, reply, _ = fetch_bounded(
                self.http.post, f"{self.url}/v1/agents/{self.agent_name}/sessions/{self.session_id}/reset",
                self.timeout_s)
        except requests.RequestException as exc:
            log.warning("plan: session reset failed: %s", exc)
            return False
        if status != 200:
            log.warning("plan: session reset failed: service %s answered HTTP %d: %s", self.shown_url, status,
                        one_line_page(reply, 200))
            return False
        return True

    def decide(self, features: np.ndarray) -> PlanOutcome:
        started = time.perf_counter()
        self._load_spec()
        if self.spec is None:
            return fallback(self.spec_error or f"service {self.shown_url} unreachable or does not host agent "
                                                   f"{self.agent_name!r}", started)
        names = self.spec["feature_names"]
        x = np.asarray(features, dtype=np.float64).reshape(-1)
        if len(x) != len(names):
            return fallback(f"observation has {len(x)} values, agent expects {len(names)}", started)
        if not np.all(np.isfinite(x)):  # as in process: requests refuses to send a NaN, which read "unreachable"
            return fallback(f"non-finite observation {x.tolist()}", started)
        body = {"session_id": self.session_id, "observation": dict(zip(names, map(float, x))),
                "deterministic": self.deterministic}
        try:
            # bounded as a whole: requests' timeout bounds each read only, and a service (or a proxy)
            # trickling its answer held the daemon's iteration for as long as it trickled
            asked = f"{self.url}/v1/agents/{self.agent_name}/decide"
            status, reply, answered = fetch_bounded(self.http.post, asked, self.timeout_s, json=body)
        except requests.RequestException as exc:
            return fallback(f"service {self.shown_url} unreachable: {type(exc).__name__}", started)
        if status != 200:
            if status in (404, 422):  # the service may host another policy under this name now
                self.spec = None      # (a restart): read its features again on the next call
            # a proxy's 301/302 turns the POST into a GET: "HTTP 405" alone sent operators to the service
            moved = f" (redirected to {url_without_password(answered)})" if answered != asked else ""
            # one line: a proxy's HTML error page spans many, and the reason is a record's field
            return fallback(f"service answered HTTP {status}{moved}: {one_line_page(reply, 200)}", started)
        try:
            d = json.loads(reply)
            if not isinstance(d, dict):
                raise ValueError(f"expected a JSON object, got {type(d).__name__}")
            action = _checked_action(d.get("action"), self.spec["action_mode"], len(self.spec["type_names"]))
            deltas = deltas_of(self.spec["action_mode"], action, self.spec["type_names"])
        except ValueError as exc:
            self.spec = None  # perhaps another action space now: read the agent list again next time
            return fallback(f"service reply not understood: {exc}", started)
        # what the decision record keeps: anything but the expected types is dropped, not stored
        value = _finite(d.get("value"))
        probs = d.get("probabilities")
        version = d.get("policy_version")
        return PlanOutcome(deltas, action, str(d.get("action_name") or action),
                           probs if isinstance(probs, list) else None, value,
                           version if isinstance(version, str) else None,
                           latency_ms=(time.perf_counter() - started) * 1e3)


#: what the service accepts as a session id (samm/plan/service.py's SESSION_PATTERN)
SESSION_CHARS = re.compile(r"[^A-Za-z0-9._:-]")
MAX_SESSION_ID = 128


def service_session_id(name: str) -> str:
    """`name` as a session id the service accepts: the daemon builds its own from the host name,
    which may be long or hold other characters, and the service would refuse every call (422).
    The same name always maps to the same id, so a restarted daemon keeps its session."""
    sid = SESSION_CHARS.sub("-", name)
    if sid == name and 0 < len(sid) <= MAX_SESSION_ID:
        return name
    # a digest of the whole name keeps two names that differ only where they were cut apart
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{sid[:MAX_SESSION_ID - 13]}-{digest}"


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _finite(v) -> float | None:
    """A reply's number as a finite float, else None: math.isfinite raised OverflowError on an
    integer past any float (JSON has no limit), out of the daemon's iteration."""
    if not _is_number(v):
        return None
    try:
        x = float(v)
    except OverflowError:
        return None
    return x if math.isfinite(x) else None


def _autoscaling_spec(agent: dict) -> dict:
    """The fields of a listed agent the daemon needs, checked: an agent of another problem (no
    named features) or a malformed entry is a ValueError naming it, never a TypeError later."""
    name = agent.get("name")
    features, types, mode = agent.get("feature_names"), agent.get("type_names"), agent.get("action_mode")
    if not (isinstance(features, list) and features and all(isinstance(f, str) for f in features)):
        raise ValueError(f"agent {name!r} has no named features: not an autoscaling agent")
    if not (isinstance(types, list) and types and all(isinstance(t, str) for t in types)):
        raise ValueError(f"agent {name!r}: type_names must be a list of names, got {types!r}")
    if mode not in ("paper", "per-type"):
        raise ValueError(f"agent {name!r}: unknown action_mode {mode!r}")
    return agent


def _checked_action(action, mode: str, n_types: int):
    """The reply's action, exactly of the agent's action space (an int for `paper`, one int per
    VM type for `per-type`): a float, a bool, a string or another length is never acted on."""
    if mode == "paper":
        if not isinstance(action, int) or isinstance(action, bool) or not 0 <= action <= 2 * n_types:
            raise ValueError(f"action must be an integer in [0, {2 * n_types}], got {action!r}")
        return action
    if not (isinstance(action, list) and len(action) == n_types
            and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 2 for v in action)):
        raise ValueError(f"action must be {n_types} integers in [0, 2], got {action!r}")
    return action
