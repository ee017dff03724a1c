"""The paper's placement MDP (§4) as a Gymnasium environment: one container per step.

* State: which app the next container belongs to (one-hot), and the node x app co-location counts
  placed so far. We add `remaining` (containers of each app still to place): it lets a policy trained
  across many batches plan ahead; the paper trains one agent per batch and need not use it.
* Action: a node in Discrete(N). `info["action_mask"]` (int8, Gymnasium's convention) and
  `action_masks()` (bool, sb3-contrib's MaskablePPO convention) mark the nodes with a free slot where
  every operation constraint still holds (`cluster.place_mask`). Metis instead remaps a full node to
  a feasible one; a mask keeps the action's meaning honest.
* Reward: 0 until the batch's last container is placed, then the batch's mean normalised throughput
  (`cluster.score`), the paper's end-of-batch reward.

Failures end the episode with reward 0 instead of raising, so that random or learning agents (and
Gymnasium's `check_env`) never crash it:
* the next container has no feasible node: `info["infeasible"] = True`;
* the agent picks a masked-out (or out-of-range) node: `info["invalid_action"] = True` and nothing
  is placed.
Every terminal `info` carries "placement" (N, A), "score" (equal to the final reward, 0 on failure),
"per_app" (`per_app_score` of the placement, possibly partial) and "complete".
"""
from __future__ import annotations

import functools
from typing import Callable

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from .cluster import (
    Batch,
    Cluster,
    Constraints,
    Predictor,
    empty_placement,
    per_app_score,
    place_mask,
    score,
    whole_number,
)
from .predictor import SyntheticInterference

BatchSampler = Callable[[np.random.Generator], Batch]

# The paper's batches hold 15-48 containers (§6.1).
PAPER_BATCH_SIZES = (15, 48)
# Zipf exponent of the skewed mix; not given by the paper, our choice.
ZIPF_EXPONENT = 1.0


def sample_batch(
    rng: np.random.Generator,
    n_apps: int,
    size_range: tuple[int, int] = PAPER_BATCH_SIZES,
    skew: str | None = None,
    capacity: int | None = None,
) -> Batch:
    """A random batch of `size_range[0]..size_range[1]` containers (inclusive) over `n_apps` apps.

    skew=None draws each container's app uniformly; skew="zipf" weights the apps 1/rank (ranks in a
    random order), so a few apps dominate the batch. `capacity` caps the size (a batch larger than
    the cluster cannot be placed).
    """
    # int() truncated a range of (2.5, 3.7) into 2..3 silently
    lo, hi = whole_number(size_range[0], "size_range"), whole_number(size_range[1], "size_range")
    if whole_number(n_apps, "n_apps") < 1:  # numpy's multinomial error named pvals
        raise ValueError(f"n_apps must be >= 1, got {n_apps}")
    if capacity is not None:
        hi = min(hi, int(capacity))
        lo = min(lo, hi)
    if lo < 1 or hi < lo:
        raise ValueError(f"size_range must satisfy 1 <= lo <= hi, got {size_range} (capacity {capacity})")
    size = int(rng.integers(lo, hi + 1))
    if skew is None:
        weights = np.ones(n_apps)
    elif skew == "zipf":
        weights = 1.0 / (rng.permutation(n_apps) + 1.0) ** ZIPF_EXPONENT
    else:
        raise ValueError(f"skew must be None or 'zipf', got {skew!r}")
    counts = rng.multinomial(size, weights / weights.sum())
    return Batch(counts)


def _node_index(action) -> int | None:
    """The node an action names, or None when it names none: int() raised on NaN, None or a
    one-element array and truncated 2.7 to node 2, where the contract is an invalid action."""
    try:
        value = np.asarray(action).reshape(-1)
    except (TypeError, ValueError):
        return None
    if value.size != 1 or not (np.issubdtype(value.dtype, np.integer) or np.issubdtype(value.dtype, np.floating)):
        return None
    v = value[0]
    if not np.isfinite(v) or v != np.floor(v) or abs(v) > 2**62:
        return None
    return int(v)


class LraPlacementEnv(gym.Env):
    """Place a batch of long-running containers on a cluster, one container per step."""

    metadata = {"render_modes": []}

    def __init__(
        self,
        cluster: Cluster | None = None,
        constraints: Constraints | None = None,
        predictor: Predictor | None = None,
        batch: Batch | None = None,
        batch_sampler: BatchSampler | None = None,
        n_nodes: int = 9,
        slots: int = 8,
        n_apps: int = 7,
        seed: int | None = None,
        render_mode: str | None = None,
    ):
        if render_mode is not None:
            raise ValueError(f"render_mode {render_mode!r} is not supported: this environment does not render")
        self.cluster = cluster if cluster is not None else Cluster(n_nodes, slots)
        if predictor is None:
            predictor = SyntheticInterference(n_apps=n_apps, seed=0, slots=self.cluster.slots)
        self.predictor = predictor
        self.n_apps = len(predictor.app_names)
        self.constraints = constraints if constraints is not None else Constraints.none(self.n_apps)
        if self.constraints.n_apps != self.n_apps:
            raise ValueError(f"constraints cover {self.constraints.n_apps} apps, the predictor {self.n_apps}")
        if batch is not None:
            self._check_batch(batch)
        self.fixed_batch = batch
        capacity = self.cluster.capacity
        # a partial, not a lambda: the env stays picklable (multiprocessing, AsyncVectorEnv's workers)
        self.batch_sampler = batch_sampler or functools.partial(sample_batch, n_apps=self.n_apps, capacity=capacity)

        n, a = self.cluster.n_nodes, self.n_apps
        self.action_space = spaces.Discrete(n)
        self.observation_space = spaces.Dict(
            {
                "app": spaces.Box(0.0, 1.0, (a,), np.float32),
                "counts": spaces.Box(0.0, float(self.cluster.slots), (n, a), np.float32),
                "remaining": spaces.Box(0.0, float(capacity), (a,), np.float32),
            }
        )
        if seed is not None:
            self._np_random, self._np_random_seed = gym.utils.seeding.np_random(seed)

        self.batch: Batch | None = None
        self.placement = empty_placement(self.cluster, self.n_apps)
        self.t = 0
        self._done = True

    # --- Gymnasium API ---------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        batch = (options or {}).get("batch")
        if batch is None:
            batch = self.fixed_batch if self.fixed_batch is not None else self.batch_sampler(self.np_random)
        if not isinstance(batch, Batch):  # counts per app (a list or an array): Batch checks them
            batch = Batch(np.asarray(batch))
        self._check_batch(batch)
        self.batch = batch
        self.placement = empty_placement(self.cluster, self.n_apps)
        self.t = 0
        self._done = False
        return self._observation(), {"action_mask": self._mask()}

    def step(self, action):
        if self._done or self.batch is None:
            raise RuntimeError("the episode is over: call reset() first")
        mask = self._mask()
        if not mask.any():  # nothing can take this container, whatever the agent picks
            return self._fail(infeasible=True)
        node = _node_index(action)
        if node is None or not (0 <= node < self.cluster.n_nodes) or not mask[node]:
            return self._fail(invalid_action=True)
        self.placement[node, self.batch.order[self.t]] += 1
        self.t += 1
        if self.t == self.batch.size:
            reward = score(self.placement, self.predictor)
            return self._finish(reward, complete=True)
        if not self._mask().any():
            return self._fail(infeasible=True)
        return self._observation(), 0.0, False, False, {"action_mask": self._mask()}

    def action_masks(self) -> np.ndarray:
        """(N,) bool: nodes that can take the next container (sb3-contrib's MaskablePPO hook)."""
        return self._mask().astype(bool)

    # --- helpers --------------------------------------------------------------------------------
    @property
    def next_app(self) -> int | None:
        """App of the container to place next (None once the episode is over)."""
        if self._done or self.batch is None or self.t >= self.batch.size:
            return None
        return int(self.batch.order[self.t])

    def _check_batch(self, batch: Batch) -> None:
        if len(batch.counts) != self.n_apps:
            raise ValueError(f"the batch has {len(batch.counts)} apps, the predictor {self.n_apps}")
        if batch.size > self.cluster.capacity:
            raise ValueError(f"a batch of {batch.size} containers exceeds the cluster's {self.cluster.capacity} slots")

    def _mask(self) -> np.ndarray:
        app = self.next_app
        if app is None:
            return np.zeros(self.cluster.n_nodes, dtype=np.int8)
        return place_mask(self.placement, app, self.cluster, self.constraints)

    def _observation(self) -> dict:
        one_hot = np.zeros(self.n_apps, dtype=np.float32)
        app = self.next_app
        if app is not None:
            one_hot[app] = 1.0
        placed = self.placement.sum(axis=0)
        return {
            "app": one_hot,
            "counts": self.placement.astype(np.float32),
            "remaining": (self.batch.counts - placed).astype(np.float32),
        }

    def _finish(self, reward: float, complete: bool, **flags):
        self._done = True
        info = {
            "action_mask": np.zeros(self.cluster.n_nodes, dtype=np.int8),
            "placement": self.placement.copy(),
            "score": float(reward),
            "per_app": per_app_score(self.placement, self.predictor),
            "complete": complete,
            "infeasible": flags.get("infeasible", False),
            "invalid_action": flags.get("invalid_action", False),
        }
        return self._observation(), float(reward), True, False, info

    def _fail(self, **flags):
        return self._finish(0.0, complete=False, **flags)
