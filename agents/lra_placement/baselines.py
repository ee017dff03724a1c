"""Baseline planners for LRA container placement, all with the common planner signature

    plan_xxx(cluster, batch, constraints, predictor, rng, **params) -> (N, A) placement

so that the paper's agent can be compared with standard rules and with the exact optimum.

The paper compares only with recorded manual deployments, which cannot be re-run; round-robin is
our labelled stand-in for them. The others are standard schedulers' rules (Docker Swarm's spread,
kube-scheduler's default scoring), an interference-aware greedy in the spirit of Paragon, that
greedy plus local search, and the exact optimum (`optimum.py`).

Sequential rules place the containers one by one in `batch.order`, only on nodes that `place_mask`
allows, so no rule is ever broken. They can still paint themselves into a corner (every node
refuses the next container although a valid plan exists); then `optimum.repair_placement` finds
the valid plan that keeps the most of what they had placed, and a warning is logged. Only when no
valid plan exists at all do they raise `Infeasible`.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .cluster import Batch, Cluster, Constraints, Predictor, empty_placement, place_mask
from .errors import Infeasible

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BaselineParams:
    """The baselines' knobs. The paper defines none of these baselines, so every value is
    not given by the paper; our choice."""

    ls_max_rounds: int = 100_000  # improving moves applied by greedy-ls at most
    ls_time_limit_s: float = 10.0  # wall-clock budget of greedy-ls's local search
    ls_min_gain: float = 1e-9  # a move must raise the total throughput by more than this
    # kube-scheduler's pre-1.19 defaults weigh LeastRequestedPriority and SelectorSpreadPriority 1:1.
    k8s_fit_weight: float = 1.0
    k8s_spread_weight: float = 1.0
    repair_time_limit_s: float = 10.0  # HiGHS budget when a sequential rule gets stuck


DEFAULTS = BaselineParams()


# --- shared machinery -----------------------------------------------------------------------------
def node_values(compositions: np.ndarray, predictor: Predictor) -> np.ndarray:
    """(..., A) compositions -> (...,) each node's total normalised throughput sum_a c_a * tp(c)_a."""
    comps = np.asarray(compositions, dtype=np.int64)
    if comps.shape[-1] != len(predictor.app_names):
        # the forest's lookup reshaped a batch of another number of apps into its own rows and
        # scored nonsense whenever the sizes divided (else a reshape or matmul error naming nothing)
        raise ValueError(f"the batch has {comps.shape[-1]} apps but the predictor knows {len(predictor.app_names)}")
    flat = comps.reshape(-1, comps.shape[-1])
    if len(flat) == 0:
        return np.zeros(comps.shape[:-1])
    tp = np.asarray(predictor.throughput(flat), dtype=np.float64)
    return (np.where(flat > 0, tp, 0.0) * flat).sum(axis=1).reshape(comps.shape[:-1])


class CompositionValues:
    """Memoised node values V(c) = sum_a c_a * tp(c)_a (a node's total normalised throughput).

    Planners ask for the same compositions again and again (every empty node is the same
    composition); the cache sends each distinct composition to the predictor once, and every call
    that has anything new makes exactly one batched predictor call. `predictor_calls` counts them."""

    def __init__(self, predictor: Predictor):
        self.predictor = predictor
        self._cache: dict[bytes, float] = {}
        self.predictor_calls = 0

    def __call__(self, compositions: np.ndarray) -> np.ndarray:
        comps = np.ascontiguousarray(compositions, dtype=np.int64)
        flat = comps.reshape(-1, comps.shape[-1])
        keys = [row.tobytes() for row in flat]
        missing = {k: i for i, k in enumerate(keys) if k not in self._cache}
        if missing:
            rows = flat[list(missing.values())]
            self.predictor_calls += 1
            for key, value in zip(missing, node_values(rows, self.predictor)):
                self._cache[key] = float(value)
        out = np.fromiter((self._cache[k] for k in keys), dtype=np.float64, count=len(keys))
        return out.reshape(comps.shape[:-1])


# A chooser picks one node among the allowed ones (mask, bool (N,)) for the next container of `app`.
Chooser = Callable[[np.ndarray, int, np.ndarray], int]


def _check_inputs(cluster: Cluster, batch: Batch, constraints: Constraints) -> None:
    if constraints.n_apps != len(batch.counts):
        raise ValueError(f"the batch has {len(batch.counts)} apps but the constraints cover {constraints.n_apps}")
    if batch.size > cluster.capacity:
        raise Infeasible(f"{batch.size} containers exceed {cluster.n_nodes} nodes x {cluster.slots} slots")


def place_sequentially(
    cluster: Cluster,
    batch: Batch,
    constraints: Constraints,
    choose: Chooser,
    name: str,
    repair_time_limit_s: float = DEFAULTS.repair_time_limit_s,
) -> np.ndarray:
    """Place the batch container by container with `choose`; repair if it gets stuck (see module doc)."""
    _check_inputs(cluster, batch, constraints)
    placement = empty_placement(cluster, len(batch.counts))
    for step, app in enumerate(batch.order):
        mask = place_mask(placement, int(app), cluster, constraints).astype(bool)
        if not mask.any():
            from .optimum import repair_placement

            plan = repair_placement(placement, batch, cluster, constraints, repair_time_limit_s)
            moved = int(np.maximum(placement - plan, 0).sum())
            log.warning(
                "%s got stuck at container %d of %d (app %d); repaired by an IP that moved %d placed container(s)",
                name, step, batch.size, app, moved,
            )
            return plan
        node = int(choose(placement, int(app), mask))
        if not mask[node]:
            raise AssertionError(f"{name} chose node {node}, which cannot take app {app}")
        placement[node, app] += 1
    return placement


# --- simple rules ---------------------------------------------------------------------------------
def plan_random(cluster: Cluster, batch: Batch, constraints: Constraints, predictor: Predictor,
                rng: np.random.Generator, **params) -> np.ndarray:
    """Each container (in `batch.order`) to a uniformly random node that can take it."""

    def choose(placement, app, mask):
        return int(rng.choice(np.flatnonzero(mask)))

    return place_sequentially(cluster, batch, constraints, choose, "random", **params)


def plan_round_robin(cluster: Cluster, batch: Batch, constraints: Constraints, predictor: Predictor,
                     rng: np.random.Generator, **params) -> np.ndarray:
    """Spread: container k goes to the node after the previous container's, cycling over the
    nodes and skipping those that cannot take it. Deterministic (`rng` unused).

    LABEL: this is our STAND-IN for the paper's baseline, recorded manual deployments, which cannot
    be re-run. On empty identical nodes it gives the same even spread as Docker Swarm's default
    `spread` strategy (fewest containers first; `plan_least_loaded` is that rule literally)."""
    next_node = [0]

    def choose(placement, app, mask):
        ring = (next_node[0] + np.arange(cluster.n_nodes)) % cluster.n_nodes
        node = int(ring[np.argmax(mask[ring])])
        next_node[0] = (node + 1) % cluster.n_nodes
        return node

    return place_sequentially(cluster, batch, constraints, choose, "round-robin", **params)


def plan_least_loaded(cluster: Cluster, batch: Batch, constraints: Constraints, predictor: Predictor,
                      rng: np.random.Generator, **params) -> np.ndarray:
    """Each container to the allowed node with the fewest containers (ties: lowest index), the
    rule of Docker Swarm's `spread` strategy with one resource. Deterministic (`rng` unused)."""

    def choose(placement, app, mask):
        load = np.where(mask, placement.sum(axis=1), np.iinfo(np.int64).max)
        return int(np.argmin(load))

    return place_sequentially(cluster, batch, constraints, choose, "least-loaded", **params)


def plan_k8s_default(cluster: Cluster, batch: Batch, constraints: Constraints, predictor: Predictor,
                     rng: np.random.Generator, k8s_fit_weight: float = DEFAULTS.k8s_fit_weight,
                     k8s_spread_weight: float = DEFAULTS.k8s_spread_weight, **params) -> np.ndarray:
    """Kubernetes-default-like scoring of the allowed nodes (the filter is `place_mask`):

    * LeastAllocated: 100 * free slots after placing / slots;
    * selector spreading: 100 * (maxCount - count) / maxCount, count = containers of the same app
      on the node, maxCount its maximum over the allowed nodes (100 everywhere when it is 0);

    summed with equal weights, as kube-scheduler's pre-1.19 defaults weigh LeastRequestedPriority
    and SelectorSpreadPriority; ties are broken uniformly at random, as kube-scheduler does.

    Approximations: one resource (slots) instead of CPU and memory, so BalancedAllocation is
    constant and left out; plugins with nothing to act on here (image locality, taints, node
    affinity) are left out; newer releases replace SelectorSpread by PodTopologySpread's system
    defaults (weight 2, skew-based), which we do not model; every node is scored (kube-scheduler
    samples nodes only in clusters above 100 nodes); scores are not truncated to integers."""

    def choose(placement, app, mask):
        fit = 100.0 * (cluster.slots - placement.sum(axis=1) - 1) / cluster.slots
        same = placement[:, app]
        max_count = same[mask].max()
        spread = 100.0 * (max_count - same) / max_count if max_count > 0 else np.full(len(same), 100.0)
        total = np.where(mask, k8s_fit_weight * fit + k8s_spread_weight * spread, -np.inf)
        best = np.flatnonzero(total >= total.max() - 1e-9)
        return int(rng.choice(best))

    return place_sequentially(cluster, batch, constraints, choose, "k8s-default", **params)


# --- interference-aware -----------------------------------------------------------------------------
def _greedy(cluster, batch, constraints, values: CompositionValues, repair_time_limit_s) -> np.ndarray:
    def choose(placement, app, mask):
        nodes = np.flatnonzero(mask)
        before = placement[nodes]
        after = before.copy()
        after[:, app] += 1
        both = values(np.concatenate([after, before]))  # one predictor call for every candidate
        gain = both[: len(nodes)] - both[len(nodes):]
        return int(nodes[np.argmax(gain)])  # ties: lowest index

    return place_sequentially(cluster, batch, constraints, choose, "greedy", repair_time_limit_s)


def plan_greedy(cluster: Cluster, batch: Batch, constraints: Constraints, predictor: Predictor,
                rng: np.random.Generator, repair_time_limit_s: float = DEFAULTS.repair_time_limit_s) -> np.ndarray:
    """Interference-aware greedy (Paragon-style): each container, in `batch.order`, to the allowed
    node where it raises the batch's total predicted throughput most. Only the target node's
    composition changes, so the gain is V(node + container) - V(node); all candidate nodes go to
    the predictor in one batched call. Ties: lowest node index. Deterministic (`rng` unused)."""
    return _greedy(cluster, batch, constraints, CompositionValues(predictor), repair_time_limit_s)


class _MoveTables:
    """Per-node gains of every one-node change, for the local search.

    remove[i, a]  = V(p_i - e_a) - V(p_i)           (-inf when node i has no a)
    add[i, a]     = V(p_i + e_a) - V(p_i)           (-inf when it breaks slots or a rule)
    swap[i, a, b] = V(p_i - e_a + e_b) - V(p_i)     (-inf when impossible, or a == b)

    A move of one a from i to j gains remove[i, a] + add[j, a]; swapping an a on i with a b on j
    gains swap[i, a, b] + swap[j, b, a]. Rules only limit a node's own composition, so each half
    is checked on its own node. After a move only rows i and j need recomputing."""

    def __init__(self, placement: np.ndarray, cluster: Cluster, constraints: Constraints, values: CompositionValues):
        self.p = placement
        self.cluster, self.constraints, self.values = cluster, constraints, values
        n, a = placement.shape
        self.eye = np.eye(a, dtype=np.int64)
        self.remove = np.full((n, a), -np.inf)
        self.add = np.full((n, a), -np.inf)
        self.swap = np.full((n, a, a), -np.inf)
        self.refresh(np.arange(n))

    def refresh(self, nodes: np.ndarray) -> None:
        p, eye = self.p[nodes], self.eye
        removed = p[:, None, :] - eye  # [k, a] = p_k - e_a
        added = p[:, None, :] + eye
        swapped = p[:, None, None, :] - eye[None, :, None, :] + eye[None, None, :, :]  # p_k - e_a + e_b
        ok_remove = p > 0
        ok_add = (p.sum(axis=1) < self.cluster.slots)[:, None] & self.constraints.composition_ok(added)
        ok_swap = ok_remove[:, :, None] & ~eye.astype(bool)[None] & self.constraints.composition_ok(swapped)
        pieces = [p, removed[ok_remove], added[ok_add], swapped[ok_swap]]
        sizes = np.cumsum([len(x) for x in pieces])
        v = self.values(np.concatenate(pieces))  # one predictor call at most
        base = v[: sizes[0]]
        rem = np.full(ok_remove.shape, -np.inf)
        rem[ok_remove] = v[sizes[0]: sizes[1]]
        add = np.full(ok_add.shape, -np.inf)
        add[ok_add] = v[sizes[1]: sizes[2]]
        swp = np.full(ok_swap.shape, -np.inf)
        swp[ok_swap] = v[sizes[2]: sizes[3]]
        self.remove[nodes] = rem - base[:, None]
        self.add[nodes] = add - base[:, None]
        self.swap[nodes] = swp - base[:, None, None]

    def best_move(self):
        """(gain, kind, i, j, a, b) of the best move; kind 'move' (b unused) or 'swap'."""
        # Moves: for each app, the best target j != i is the best or, when that is i, the second best.
        best_move = (-np.inf, "move", -1, -1, -1, -1)
        if len(self.p) > 1:
            order = np.argsort(-self.add, axis=0, kind="stable")  # (N, A)
            j1, j2 = order[0], order[1]
            cols = np.arange(self.add.shape[1])
            d1, d2 = self.add[j1, cols], self.add[j2, cols]
            rows = np.arange(len(self.p))[:, None]
            target = np.where(rows == j1[None, :], j2[None, :], j1[None, :])  # (N, A)
            gains = self.remove + np.where(rows == j1[None, :], d2[None, :], d1[None, :])
            i, a = np.unravel_index(np.argmax(gains), gains.shape)
            best_move = (float(gains[i, a]), "move", int(i), int(target[i, a]), int(a), -1)

            # Swaps: partner[j, a, b] = swap[j, b, a] (node j gives b and takes a).
            partner = self.swap.transpose(0, 2, 1)
            order = np.argsort(-partner, axis=0, kind="stable")
            k1, k2 = order[0], order[1]  # (A, A)
            y1 = np.take_along_axis(partner, k1[None], axis=0)[0]
            y2 = np.take_along_axis(partner, k2[None], axis=0)[0]
            rows3 = np.arange(len(self.p))[:, None, None]
            is_k1 = rows3 == k1[None]
            sgains = self.swap + np.where(is_k1, y2[None], y1[None])
            i, a, b = np.unravel_index(np.argmax(sgains), sgains.shape)
            if sgains[i, a, b] > best_move[0]:
                j = k2[a, b] if i == k1[a, b] else k1[a, b]
                best_move = (float(sgains[i, a, b]), "swap", int(i), int(j), int(a), int(b))
        return best_move


def local_search(
    placement: np.ndarray,
    cluster: Cluster,
    constraints: Constraints,
    values: CompositionValues,
    max_rounds: int = DEFAULTS.ls_max_rounds,
    time_limit_s: float = DEFAULTS.ls_time_limit_s,
    min_gain: float = DEFAULTS.ls_min_gain,
) -> tuple[np.ndarray, int]:
    """Best-improvement local search from a valid placement over two neighbourhoods: move one
    container to another node, and swap two containers of different apps between two nodes. Every
    move keeps slots and rules. Stops when no move gains more than `min_gain`, or after
    `max_rounds` moves or `time_limit_s` seconds. Returns (placement, moves applied)."""
    p = np.array(placement, dtype=np.int64, copy=True)
    tables = _MoveTables(p, cluster, constraints, values)
    deadline = time.perf_counter() + time_limit_s
    rounds = 0
    while rounds < max_rounds and time.perf_counter() < deadline:
        gain, kind, i, j, a, b = tables.best_move()
        if not gain > min_gain:
            break
        p[i, a] -= 1
        p[j, a] += 1
        if kind == "swap":
            p[j, b] -= 1
            p[i, b] += 1
        tables.refresh(np.array([i, j]))
        rounds += 1
    return p, rounds


def plan_greedy_local_search(cluster: Cluster, batch: Batch, constraints: Constraints, predictor: Predictor,
                             rng: np.random.Generator, max_rounds: int = DEFAULTS.ls_max_rounds,
                             time_limit_s: float = DEFAULTS.ls_time_limit_s,
                             min_gain: float = DEFAULTS.ls_min_gain,
                             repair_time_limit_s: float = DEFAULTS.repair_time_limit_s) -> np.ndarray:
    """`plan_greedy`, then `local_search` (best improving move or swap until none gains more than
    `min_gain`, or `max_rounds` / `time_limit_s` is spent). Deterministic unless the time limit
    stops it (`rng` unused): never worse than greedy."""
    values = CompositionValues(predictor)
    start = _greedy(cluster, batch, constraints, values, repair_time_limit_s)
    plan, _ = local_search(start, cluster, constraints, values, max_rounds, time_limit_s, min_gain)
    return plan


def _plan_optimum(cluster: Cluster, batch: Batch, constraints: Constraints, predictor: Predictor,
                  rng: np.random.Generator, **params) -> np.ndarray:
    """The exact optimum (`optimum.plan_optimum`), imported on first use (it needs SciPy's HiGHS)."""
    from .optimum import plan_optimum

    return plan_optimum(cluster, batch, constraints, predictor, rng, **params)


PLANNERS = {
    "random": plan_random,
    "round-robin": plan_round_robin,
    "least-loaded": plan_least_loaded,
    "k8s-default": plan_k8s_default,
    "greedy": plan_greedy,
    "greedy-ls": plan_greedy_local_search,
    "optimum": _plan_optimum,
}
