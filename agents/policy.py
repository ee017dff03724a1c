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


def save_torch_policy(directory, module, metadata: dict, weights_file: str = "weights.pt",
                      metadata_file: str = "metadata.json"):
    """Write a torch policy as SAMM saves them: its weights, then its `metadata.json` (the file a
    loader reads first). Each is written beside and renamed over, so an interrupted save leaves
    no torn file, and a first save cut short leaves weights without metadata: refused on load."""
    import json
    import os
    from pathlib import Path

    import torch

    from agents.report import json_default

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{weights_file}.tmp"
    torch.save({k: v.detach().clone() for k, v in module.state_dict().items()}, tmp)
    os.replace(tmp, d / weights_file)
    tmp = d / f".{metadata_file}.tmp"
    tmp.write_text(json.dumps(metadata, indent=2, default=json_default))
    os.replace(tmp, d / metadata_file)
    return d


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
    missing, unreadable, do not fit the network described in `metadata_file`, or hold NaN/inf
    (a NaN network loads and then decides garbage: argmax of NaN is action 0)."""
    from pathlib import Path

    import torch

    path = Path(directory) / weights_file
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
