"""What the service and the daemon host: a policy maps one observation (+ its own state) to one
action of its declared spaces. This module imports no problem.

The policy you serve is not the algorithm you train (Tianshou's Policy vs Algorithm, RLlib's
RLModule): training code lives in each problem's package, next to the policy it produces.

    policy.observation_space, policy.action_space   # Gymnasium spaces, recorded when saved
    state = policy.initial_state()
    decision, state = policy.decide(observation, state, mask=mask, deterministic=True)

`mask` follows Gymnasium's `action_mask` convention (int8, 1 = allowed) for Discrete action
spaces. Batched decision paths (vector environments, experiments) stay problem-specific.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from gymnasium import spaces


@dataclass
class Decision:
    """One decision: `action` is an element of the policy's action space in JSON-able form;
    `name` a human-readable description; `info` whatever else the policy can say (probabilities,
    a value estimate)."""

    action: Any
    name: str | None = None
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Policy(Protocol):
    problem: str
    kind: str
    version: str
    stateful: bool
    observation_space: spaces.Space
    action_space: spaces.Space

    def initial_state(self) -> Any: ...

    def decide(self, observation: Any, state: Any = None, *, mask=None,
               deterministic: bool = True) -> tuple[Decision, Any]: ...

    def metadata(self) -> dict: ...


#: the key of a saved policy's metadata that holds the SHA-256 of its weights file: it ties the two
#: files of one save together (policies saved before it, the shipped ones too, have none)
WEIGHTS_DIGEST_KEY = "weights_sha256"


def save_torch_policy(directory, module, metadata: dict, weights_file: str = "weights.pt",
                      metadata_file: str = "metadata.json"):
    """Write a torch policy as SAMM saves them: its weights and its `metadata.json` (the file a
    loader reads first), which records the weights' digest.

    Both are written beside first; then the metadata is renamed over (the commit point), then the
    weights. A save killed before the commit leaves the previous policy whole; one killed between
    the renames leaves the new metadata and the new weights still beside (`.weights.pt.tmp`),
    which the loader finds by the digest: a reader sees the old policy or the new one, never new
    weights under old settings (a changed network then failed to load, an unchanged one served
    under the old version's metadata)."""
    import json
    import os
    from pathlib import Path

    import torch

    from agents.report import json_default

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    _finish_interrupted_save(d, weights_file, metadata_file)
    weights_tmp, metadata_tmp = _pending(d / weights_file), _pending(d / metadata_file)
    torch.save({k: v.detach().clone() for k, v in module.state_dict().items()}, weights_tmp)
    metadata = {**metadata, WEIGHTS_DIGEST_KEY: _sha256(weights_tmp)}
    metadata_tmp.write_text(json.dumps(metadata, indent=2, default=json_default))
    _sync(weights_tmp, metadata_tmp)
    os.replace(metadata_tmp, d / metadata_file)
    os.replace(weights_tmp, d / weights_file)
    return d


def _finish_interrupted_save(d, weights_file: str, metadata_file: str) -> None:
    """Complete a save cut short between its renames before writing the pending file again: were
    this save cut short too, before its commit, the policy of the one before it would be lost."""
    import os

    try:
        found = saved_weights_path(d, weights_file, metadata_file)
    except ValueError:   # no policy whole in the folder: nothing to keep
        return
    if found != d / weights_file:
        os.replace(found, d / weights_file)


def _pending(path):
    """Where a save writes `path` before renaming it over (and where a loader finds the weights
    of a save cut short between its renames)."""
    return path.with_name(f".{path.name}.tmp")


def _sync(*paths) -> None:
    """On disk before the renames: after a power cut a renamed file could otherwise be empty."""
    import os

    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _sha256(path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def saved_weights_path(directory, weights_file: str = "weights.pt", metadata_file: str = "metadata.json"):
    """The weights file that belongs to `metadata_file`: `weights_file`, or the pending copy a save
    cut short between its renames left beside it. A one-line ValueError naming the file when the
    metadata records a digest that neither matches (files of two saves, or a weights file copied
    over); without a recorded digest (the shipped policies) `weights_file` as it is."""
    import json
    from pathlib import Path

    d = Path(directory)
    path = d / weights_file
    try:
        meta = json.loads((d / metadata_file).read_text())
    except (OSError, ValueError):   # the policy's own loader names a missing or invalid metadata file
        return path
    digest = meta.get(WEIGHTS_DIGEST_KEY) if isinstance(meta, dict) else None
    if digest is None:
        return path
    if not (isinstance(digest, str) and re.fullmatch("[0-9a-f]{64}", digest)):
        raise ValueError(f"{d / metadata_file}: {WEIGHTS_DIGEST_KEY} must be a SHA-256 hex digest, got {digest!r:.80}")
    for candidate in (path, _pending(path)):
        if candidate.is_file() and _sha256(candidate) == digest:
            return candidate
    if not path.is_file():
        return path   # read_torch_file names it missing
    raise ValueError(f"{path}: not the weights {metadata_file} was saved with (its SHA-256 differs: "
                     f"the files of two saves, or a weights file copied over)")


def one_line(exc: BaseException, limit: int = 300) -> str:
    """An exception as one line: torch's state-dict errors span several (a header, then one
    tab-indented line per mismatched tensor)."""
    text = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip()).replace(":;", ":")
    text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def read_torch_file(path, metadata_file: str = "metadata.json", what: str = "PyTorch file"):
    """torch.load of a saved policy's weights, or a one-line ValueError naming the file: a missing,
    truncated or garbage file raised FileNotFoundError, torch's multi-line error or "KeyError: 101"."""
    from pathlib import Path

    import torch

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: missing (the weights of the network in {metadata_file})")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - truncated, garbage or a pickle of arbitrary objects
        raise ValueError(f"{path}: cannot load the policy: not a readable {what} ({one_line(e)})") from None


def load_torch_weights(directory, module, weights_file: str = "weights.pt", metadata_file: str = "metadata.json") -> None:
    """Load saved weights into `module`; a one-line ValueError naming the file when they are
    missing, unreadable, not those `metadata_file` records the digest of, do not fit the network
    described there, or hold NaN/inf (a NaN network loads and then decides garbage: argmax of NaN
    is action 0)."""
    from pathlib import Path

    import torch

    path = saved_weights_path(Path(directory), weights_file, metadata_file)
    state = read_torch_file(path, metadata_file, what="PyTorch state dict")
    if not isinstance(state, dict):
        raise ValueError(f"{path}: not a PyTorch state dict (holds a {type(state).__name__})")
    try:
        module.load_state_dict(state)
    except (RuntimeError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{path}: weights do not fit the network in {metadata_file} ({one_line(e)})") from None
    bad = [k for k, v in module.state_dict().items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise ValueError(f"{path}: {bad[0]} holds NaN or inf values")
