"""Recurrent state per (agent, session): never shared between callers, expired after a TTL,
and started afresh when the policy version changes under a session."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable


@dataclass
class Session:
    state: Any
    policy_version: str
    last_used: float


class SessionStore:
    def __init__(self, ttl_s: float = 3600.0, max_sessions: int = 10_000, clock: Callable[[], float] = time.monotonic):
        self.ttl_s, self.max_sessions, self.clock = ttl_s, max_sessions, clock
        self._sessions: dict[tuple[str, str], Session] = {}
        self._lock = threading.Lock()

    def checkout(self, agent_name: str, session_id: str, agent) -> Any:
        now = self.clock()
        with self._lock:
            self._expire(now)
            s = self._sessions.get((agent_name, session_id))
            if s is None or s.policy_version != agent.version:
                return agent.initial_state(1) if hasattr(agent, "action_mode") else agent.initial_state()
            return s.state

    def store(self, agent_name: str, session_id: str, agent, state: Any) -> None:
        with self._lock:
            if len(self._sessions) >= self.max_sessions and (agent_name, session_id) not in self._sessions:
                oldest = min(self._sessions, key=lambda k: self._sessions[k].last_used)
                del self._sessions[oldest]
            self._sessions[(agent_name, session_id)] = Session(state, agent.version, self.clock())

    def reset(self, agent_name: str, session_id: str) -> bool:
        with self._lock:
            return self._sessions.pop((agent_name, session_id), None) is not None

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def _expire(self, now: float) -> None:
        dead = [k for k, s in self._sessions.items() if now - s.last_used > self.ttl_s]
        for k in dead:
            del self._sessions[k]
