"""Hosted policies: one current version per agent name, the previous one kept for rollback, and
validated uploads swapped in atomically (a failed validation never replaces anything)."""
from __future__ import annotations

import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agents.base import Agent, load_agent


class PolicyRejected(ValueError):
    """An uploaded policy does not fit the agent's observation/action spec."""


@dataclass
class Hosted:
    agent: Agent
    previous: Agent | None = None
    source: str = ""


def spec_of(agent: Agent) -> dict:
    return {"kind": agent.kind, "feature_names": list(agent.feature_names), "action_mode": agent.action_mode,
            "type_names": list(agent.type_names)}


class PolicyRegistry:
    def __init__(self, store_dir: str | Path | None = None):
        self._hosted: dict[str, Hosted] = {}
        self._lock = threading.RLock()
        self.store_dir = Path(store_dir) if store_dir else Path(tempfile.mkdtemp(prefix="samm-policies-"))
        self.store_dir.mkdir(parents=True, exist_ok=True)

    def host(self, name: str, agent: Agent, source: str = "") -> None:
        with self._lock:
            self._hosted[name] = Hosted(agent, source=source)

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._hosted)

    def get(self, name: str) -> Agent | None:
        with self._lock:
            h = self._hosted.get(name)
            return h.agent if h else None

    def describe(self, name: str) -> dict:
        with self._lock:
            h = self._hosted[name]
            a = h.agent
            return {"name": name, **spec_of(a), "policy_version": a.version, "action_names": a.action_names,
                    "previous_version": h.previous.version if h.previous else None}

    def upload(self, name: str, files: dict[str, bytes]) -> Agent:
        """Validate a policy (metadata.json + weights) against the hosted agent's spec and swap
        it in; raises PolicyRejected and keeps the current one otherwise."""
        with self._lock:
            if name not in self._hosted:
                raise KeyError(name)
            current = self._hosted[name].agent
        for fname in files:
            if "/" in fname or "\\" in fname or fname.startswith(".") or not fname:
                raise PolicyRejected(f"invalid file name {fname!r}")
        if "metadata.json" not in files:
            raise PolicyRejected("metadata.json is required")
        target = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.store_dir))
        try:
            for fname, data in files.items():
                (target / fname).write_bytes(data)
            try:
                candidate = load_agent(target)
            except Exception as exc:  # noqa: BLE001 - any failure to load is a rejection
                raise PolicyRejected(f"cannot load the policy: {exc}") from None
            want, got = spec_of(current), spec_of(candidate)
            diff = [k for k in want if want[k] != got[k]]
            if diff:
                raise PolicyRejected("the policy does not match the hosted agent's spec: "
                                     + ", ".join(f"{k} {got[k]!r} != {want[k]!r}" for k in diff))
            try:  # it must decide on a neutral observation without error
                d, _ = candidate.act(np.zeros((1, len(candidate.feature_names)), np.float32), candidate.initial_state(1))
                np.asarray(d.actions)
            except Exception as exc:  # noqa: BLE001
                raise PolicyRejected(f"the policy failed a test decision: {exc}") from None
        except PolicyRejected:
            shutil.rmtree(target, ignore_errors=True)
            raise
        with self._lock:
            h = self._hosted[name]
            self._hosted[name] = Hosted(candidate, previous=h.agent, source=str(target))
        return candidate

    def rollback(self, name: str) -> Agent:
        with self._lock:
            h = self._hosted[name]
            if h.previous is None:
                raise PolicyRejected(f"{name} has no previous version to roll back to")
            self._hosted[name] = Hosted(h.previous, previous=h.agent)
            return h.previous
