"""Built-in reference policies: `noop`, `random` and `static:S,M,L` (hold a fixed fleet).

They act on (observation, info) in either action mode of the simulator and are pure functions
of their inputs and their own seeded state.
"""
from __future__ import annotations

import numpy as np
from gymnasium import spaces


class NoopPolicy:
    name = "noop"

    def __init__(self, action_space: spaces.Space):
        self.space = action_space

    def reset(self) -> None:
        pass

    def act(self, obs: np.ndarray, info: dict):
        if isinstance(self.space, spaces.Discrete):
            return 0
        return np.ones(len(self.space.nvec), dtype=np.int64)  # keep every type


class RandomPolicy:
    name = "random"

    def __init__(self, action_space: spaces.Space, seed: int = 0):
        self.space = action_space
        self.seed = seed
        self.reset()

    def reset(self) -> None:
        self.space.seed(self.seed)

    def act(self, obs: np.ndarray, info: dict):
        return self.space.sample()


class StaticPolicy:
    """Moves the fleet towards fixed per-type counts and holds it there. In `paper` mode (one
    change per step) it fixes the type with the largest gap first."""

    def __init__(self, action_space: spaces.Space, targets: list[int]):
        self.space = action_space
        self.targets = np.asarray(targets, dtype=np.int64)
        self.name = "static:" + ",".join(str(t) for t in targets)

    def reset(self) -> None:
        pass

    def act(self, obs: np.ndarray, info: dict):
        counts = np.asarray(info["vm_running"]) + np.asarray(info["vm_booting"])
        gap = self.targets - counts
        if isinstance(self.space, spaces.Discrete):
            if not np.any(gap):
                return 0
            i = int(np.argmax(np.abs(gap)))
            return 1 + 2 * i + (0 if gap[i] > 0 else 1)
        return (np.sign(gap) + 1).astype(np.int64)


BUILTIN_POLICIES = ("noop", "random", "static:S,M,L")


def make_builtin_policy(spec: str, action_space: spaces.Space, n_types: int, seed: int = 0):
    if spec == "noop":
        return NoopPolicy(action_space)
    if spec == "random":
        return RandomPolicy(action_space, seed=seed)
    if spec.startswith("static:"):
        try:
            targets = [int(x) for x in spec.split(":", 1)[1].split(",")]
        except ValueError:
            raise ValueError(f"static policy needs integer counts, e.g. static:2,1,1; got {spec!r}") from None
        if len(targets) != n_types or min(targets) < 0:
            raise ValueError(f"static policy needs {n_types} non-negative counts, got {spec!r}")
        return StaticPolicy(action_space, targets)
    raise ValueError(f"unknown policy {spec!r}; built-in policies: {', '.join(BUILTIN_POLICIES)}")
