"""Hosted policies: one current version per agent name, the previous one kept for rollback, and
validated uploads swapped in atomically (a failed validation never replaces anything)."""
from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agents.registry import load_policy
from agents.spaces import space_to_json


log = logging.getLogger(__name__)

# "<agent>.current.json" beside the upload folders ("<agent>-XXXXXXXX") names the upload hosted now
POINTER_SUFFIX = ".current.json"


class PolicyRejected(ValueError):
    """An uploaded policy does not fit the agent's observation/action spec."""


@dataclass
class Hosted:
    agent: Any  # an agents.policy.Policy (autoscaling Agents are policies too)
    previous: Any | None = None
    source: str = ""  # the --agent policy folder, or an upload's folder in the store
    previous_source: str = ""


def _is_autoscaler(policy) -> bool:
    """Autoscaling agents keep their batched `act` and named-feature wire format. A plug-in
    problem's policy may name its features and action mode too: by those alone it was served on
    the autoscaler's route (no `act`) and its missing `action_names` failed every agent listing."""
    return (getattr(policy, "problem", "autoscaling") == "autoscaling"
            and hasattr(policy, "action_mode") and hasattr(policy, "feature_names"))


def spec_of(agent) -> dict:
    """What an uploaded policy must share with the hosted one: its problem, kind and spaces (for
    autoscaling agents also the features, action mode and VM types, named in errors)."""
    spec = {"problem": agent.problem, "kind": agent.kind,
            "observation_space": space_to_json(agent.observation_space),
            "action_space": space_to_json(agent.action_space)}
    if _is_autoscaler(agent):
        spec |= {"feature_names": list(agent.feature_names), "action_mode": agent.action_mode,
                 "type_names": list(agent.type_names)}
    return spec


def broken_probabilities(decision) -> bool:
    """Whether a decision's action probabilities hold a NaN or an infinity: a policy with NaN
    weights still answers an argmax (for an autoscaler, "remove" every type)."""
    return decision.probabilities is not None and not np.isfinite(np.asarray(decision.probabilities, float)).all()


def test_decision(policy) -> None:
    """A candidate must decide on a neutral observation without error."""
    if _is_autoscaler(policy):
        d, _ = policy.act(np.zeros((1, len(policy.feature_names)), np.float32), policy.initial_state(1))
        np.asarray(d.actions)
        return
    # a policy whose valid inputs are a small part of its space (a one-hot app vector) offers one:
    # a sample of the space failed every uploaded placement policy
    probe = getattr(policy, "probe_observation", None)
    if callable(probe):
        observation = probe()
    else:
        space = policy.observation_space
        space.seed(0)
        observation = space.sample()
    mask = None
    if hasattr(policy.action_space, "n"):
        mask = np.ones(int(policy.action_space.n), np.int8)
    policy.decide(observation, policy.initial_state(), mask=mask)


# a saved policy is metadata.json and two or three weight files; a body of empty files (millions
# within the body limit) took minutes to write and could use up the store's inodes
MAX_UPLOAD_FILES = 32
# the knowledge store's policy_version column: a longer version is cut there, and is repeated in
# every decide response
MAX_VERSION_CHARS = 128


def _check_version(version) -> None:
    """An upload's version names it in every response, record and log line: a number or an
    object there was swapped in and then failed every agent listing (a 500) until a rollback."""
    if not (isinstance(version, str) and 0 < len(version) <= MAX_VERSION_CHARS and version.isprintable()):
        raise PolicyRejected(f"metadata.json: version must be a printable string of 1 to {MAX_VERSION_CHARS} "
                             f"characters, got {_shown(version)}")


def _shown(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


class PolicyRegistry:
    def __init__(self, store_dir: str | Path | None = None):
        self._hosted: dict[str, Hosted] = {}
        self._base_source: dict[str, str] = {}  # what the service was started with, per name
        self._lock = threading.RLock()
        self.store_dir = Path(store_dir) if store_dir else Path(tempfile.mkdtemp(prefix="samm-policies-"))
        self.store_dir.mkdir(parents=True, exist_ok=True)

    def host(self, name: str, agent, source: str = "") -> None:
        with self._lock:
            self._hosted[name] = Hosted(agent, source=source)
            self._base_source[name] = source

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._hosted)

    def get(self, name: str) -> Any | None:
        with self._lock:
            h = self._hosted.get(name)
            return h.agent if h else None

    def describe(self, name: str) -> dict:
        with self._lock:
            h = self._hosted[name]
            a = h.agent
            out = {"name": name, **spec_of(a), "policy_version": a.version,
                   "previous_version": h.previous.version if h.previous else None}
            if _is_autoscaler(a):
                out["action_names"] = a.action_names
            return out

    def upload(self, name: str, files: dict[str, bytes]) -> Any:
        """Validate a policy (metadata.json + weights) against the hosted agent's spec and swap
        it in; raises PolicyRejected and keeps the current one otherwise."""
        return self.upload_hosted(name, files).agent

    def upload_hosted(self, name: str, files: dict[str, bytes]) -> Hosted:
        """`upload`, returning what the swap hosted: the new policy and the one it replaced, as
        they were at the swap (read afterwards, a concurrent upload or rollback shows through)."""
        with self._lock:
            if name not in self._hosted:
                raise KeyError(name)
            current = self._hosted[name].agent
        if len(files) > MAX_UPLOAD_FILES:
            raise PolicyRejected(f"a policy is at most {MAX_UPLOAD_FILES} files (metadata.json and its weights), "
                                 f"got {len(files)}")
        for fname in files:
            if "/" in fname or "\\" in fname or fname.startswith(".") or not fname:
                raise PolicyRejected(f"invalid file name {fname!r}")
        if "metadata.json" not in files:
            raise PolicyRejected("metadata.json is required")
        # the default store lives under /tmp, whose cleaners may remove it from a long-running service
        self.store_dir.mkdir(parents=True, exist_ok=True)
        target = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.store_dir))
        try:
            for fname, data in files.items():
                try:
                    (target / fname).write_bytes(data)
                except ValueError as exc:  # a NUL byte or a lone surrogate in the name
                    raise PolicyRejected(f"invalid file name {fname!r}: {exc}") from None
                except OSError as exc:
                    if exc.errno != errno.ENAMETOOLONG:
                        raise  # the store's own trouble (a full disk) is the server's, not the caller's
                    raise PolicyRejected(f"invalid file name {fname!r}: {exc.strerror}") from None
            candidate = self._validated(current, target)
            with self._lock:
                h = self._hosted[name]
                # recorded before the swap: a store that cannot take it fails the upload as a whole
                self._record_current(name, str(target))
                hosted = self._hosted[name] = Hosted(candidate, previous=h.agent, source=str(target),
                                                     previous_source=h.source)
        except BaseException:  # rejected, or the store failed (a full disk): leave no half-written policy
            shutil.rmtree(target, ignore_errors=True)
            raise
        self._discard_upload(h.previous_source, keep=(h.source, str(target)))
        return hosted

    def _validated(self, current, folder: Path) -> Any:
        """The policy in `folder`, loaded and checked to fit `current`'s spec and to decide."""
        try:
            candidate = load_policy(folder)
        except Exception as exc:  # noqa: BLE001 - any failure to load is a rejection
            raise PolicyRejected(f"cannot load the policy: {exc}") from None
        _check_version(candidate.version)
        want, got = spec_of(current), spec_of(candidate)
        diff = [k for k in want if want[k] != got.get(k)]
        # name the most specific difference first (action_mode before the space it implies)
        diff.sort(key=lambda k: k.endswith("_space"))
        if diff:
            raise PolicyRejected("the policy does not match the hosted agent's spec: "
                                 + ", ".join(f"{k} {got[k]!r} != {want[k]!r}" for k in diff))
        try:
            test_decision(candidate)
        except Exception as exc:  # noqa: BLE001
            raise PolicyRejected(f"the policy failed a test decision: {exc}") from None
        return candidate

    def _in_store(self, source: str) -> bool:
        return bool(source) and Path(source).resolve().parent == self.store_dir.resolve()

    def _record_current(self, name: str, source: str) -> None:
        """Name the upload hosted now, so that a restart hosts it again; no pointer when the
        policy hosted now is the one the service was started with."""
        pointer = self.store_dir / f"{name}{POINTER_SUFFIX}"
        if not self._in_store(source):
            pointer.unlink(missing_ok=True)
            return
        tmp = pointer.with_name(pointer.name + ".tmp")
        tmp.write_text(json.dumps({"upload": Path(source).name, "base_source": self._base_source.get(name, "")}))
        os.replace(tmp, pointer)

    def _discard_upload(self, source: str, keep: tuple[str, ...]) -> None:
        """An upload no longer current nor previous cannot be rolled back to: free its folder."""
        if self._in_store(source) and source not in keep:
            shutil.rmtree(source, ignore_errors=True)

    def restore_uploads(self) -> list[str]:
        """Host again the upload each name had when the service stopped, if it was made over the
        policy the service is started with now and still validates; one line per name on what
        was done (a stored upload is never deleted here)."""
        lines = []
        for name in self.names():
            pointer = self.store_dir / f"{name}{POINTER_SUFFIX}"
            if not pointer.is_file():
                continue
            h = self._hosted[name]
            try:
                record = json.loads(pointer.read_text())
                folder, base = self.store_dir / record["upload"], record["base_source"]
                if not (isinstance(record["upload"], str) and isinstance(base, str) and self._in_store(str(folder))):
                    raise ValueError("its fields are not an upload folder and a source")
            except (OSError, ValueError, KeyError, TypeError) as exc:
                lines.append(f"{name}: {pointer} is unreadable ({exc}); hosting {h.agent.version} from --agent")
                continue
            if base != h.source:
                lines.append(f"{name}: the upload in {folder} was made over --agent {name}={base}; --agent now names "
                             f"{name}={h.source}, which is hosted (the upload is kept)")
                continue
            try:
                candidate = self._validated(h.agent, folder)
            except PolicyRejected as exc:
                lines.append(f"{name}: the upload in {folder} is not hosted again: {exc}")
                continue
            with self._lock:
                self._hosted[name] = Hosted(candidate, previous=h.agent, source=str(folder), previous_source=h.source)
            lines.append(f"{name}: hosting the upload {candidate.version} again (from {folder}); "
                         f"a rollback returns to {h.agent.version}")
        for line in lines:
            log.warning("%s", line)
        return lines

    def rollback(self, name: str) -> Any:
        return self.rollback_hosted(name).agent

    def rollback_hosted(self, name: str) -> Hosted:
        """`rollback`, returning what it hosted (as `upload_hosted`)."""
        with self._lock:
            h = self._hosted[name]
            if h.previous is None:
                raise PolicyRejected(f"{name} has no previous version to roll back to")
            self._record_current(name, h.previous_source)
            hosted = self._hosted[name] = Hosted(h.previous, previous=h.agent, source=h.previous_source,
                                                 previous_source=h.source)
            return hosted
