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
#: the key of the metadata that holds the SHA-256 of each of the save's other files ({name: digest})
FILES_DIGEST_KEY = "files_sha256"


def save_torch_policy(directory, module, metadata: dict, weights_file: str = "weights.pt",
                      metadata_file: str = "metadata.json", *, state: dict | None = None,
                      extra_files: dict[str, str] | None = None):
    """Write a torch policy as SAMM saves them: its weights (`module`'s state dict, or `state`),
    any `extra_files` (name -> text, e.g. an observation normaliser) and its `metadata.json` (the
    file a loader reads first), which records the digests of the others.

    All are written beside first; then the metadata is renamed over (the commit point), then the
    weights and the extra files. A save killed before the commit leaves the previous policy whole;
    one killed between the renames leaves the new metadata and the rest still beside
    (`.weights.pt.tmp`), which the loaders find by their digests (`saved_weights_path`,
    `saved_file_path`): a reader sees the old policy or the new one, never new weights under old
    settings (a changed network then failed to load, an unchanged one served under the old
    version's metadata)."""
    import json
    import os
    from pathlib import Path

    import torch

    from agents.report import json_default

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    _finish_interrupted_save(d, weights_file, metadata_file)
    weights_tmp, metadata_tmp = _pending(d / weights_file), _pending(d / metadata_file)
    torch.save(state if state is not None else {k: v.detach().clone() for k, v in module.state_dict().items()},
               weights_tmp)
    extras = {name: _pending(d / name) for name in (extra_files or {})}
    for name, tmp in extras.items():
        tmp.write_text(extra_files[name])
    metadata = {**metadata, WEIGHTS_DIGEST_KEY: _sha256(weights_tmp)}
    if extra_files is not None:
        metadata[FILES_DIGEST_KEY] = {name: _sha256(tmp) for name, tmp in extras.items()}
    metadata_tmp.write_text(json.dumps(metadata, indent=2, default=json_default))
    _sync(weights_tmp, *extras.values(), metadata_tmp)
    os.replace(metadata_tmp, d / metadata_file)
    os.replace(weights_tmp, d / weights_file)
    for name, tmp in extras.items():
        os.replace(tmp, d / name)
    return d


def _finish_interrupted_save(d, weights_file: str, metadata_file: str) -> None:
    """Complete a save cut short between its renames before writing the pending files again: were
    this save cut short too, before its commit, the policy of the one before it would be lost."""
    import os

    try:
        found = {d / weights_file: saved_weights_path(d, weights_file, metadata_file)}
        for name in _recorded_files(d, metadata_file) or {}:
            found[d / name] = saved_file_path(d, name, metadata_file)
    except ValueError:   # no policy whole in the folder: nothing to keep
        return
    for path, current in found.items():
        if current is not None and current != path:
            os.replace(current, path)


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
    from pathlib import Path

    d = Path(directory)
    meta = _metadata_or_none(d, metadata_file)
    digest = meta.get(WEIGHTS_DIGEST_KEY) if isinstance(meta, dict) else None
    return _file_of_digest(d / weights_file, digest, metadata_file, WEIGHTS_DIGEST_KEY) or d / weights_file


def saved_file_path(directory, name: str, metadata_file: str = "metadata.json"):
    """Another file of a saved policy (`extra_files` of `save_torch_policy`) as `saved_weights_path`
    finds the weights; None when there is none: absent, or one an earlier save left that this
    save's metadata does not record (the save had none: the file is not this policy's)."""
    from pathlib import Path

    d = Path(directory)
    recorded = _recorded_files(d, metadata_file)
    if recorded is None:   # saved before digests (the shipped policies): the file as it is
        return d / name if (d / name).is_file() else None
    if name not in recorded:
        return None
    return _file_of_digest(d / name, recorded[name], metadata_file, f"{FILES_DIGEST_KEY}.{name}")


def _metadata_or_none(d, metadata_file: str):
    import json

    try:
        return json.loads((d / metadata_file).read_text())
    except (OSError, ValueError):   # the policy's own loader names a missing or invalid metadata file
        return None


def _recorded_files(d, metadata_file: str) -> dict | None:
    meta = _metadata_or_none(d, metadata_file)
    files = meta.get(FILES_DIGEST_KEY) if isinstance(meta, dict) else None
    if files is None:
        return None
    if not isinstance(files, dict):
        raise ValueError(f"{d / metadata_file}: {FILES_DIGEST_KEY} must map file names to digests, got {files!r:.80}")
    return files


def _file_of_digest(path, digest, metadata_file: str, key: str):
    """`path` or its pending copy, whichever has `digest` (None: `path` unchecked)."""
    if digest is None:
        return path
    if not (isinstance(digest, str) and re.fullmatch("[0-9a-f]{64}", digest)):
        raise ValueError(f"{path.parent / metadata_file}: {key} must be a SHA-256 hex digest, got {digest!r:.80}")
    for candidate in (path, _pending(path)):
        if candidate.is_file() and _sha256(candidate) == digest:
            return candidate
    if not path.is_file():
        return path   # the loader names it missing
    raise ValueError(f"{path}: not the {path.name} {metadata_file} was saved with (its SHA-256 differs: "
                     f"the files of two saves, or a file copied over)")


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
