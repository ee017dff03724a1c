"""The placement policy's network and the tables that make its inputs cheap.

The policy scores every node with one small MLP shared over nodes (so one network works for any
number of nodes N) and picks a node by a softmax over the feasible nodes' scores. Nodes are
identical, so a node is fully described by its *composition* (its row of the placement). With
at most `slots` containers of A apps per node there are few compositions (6,435 for 7 apps and
8 slots), so `CompositionTable` enumerates them once: the predictor's throughput of each, the
composition reached by adding one container of each app, and whether the constraints allow it.
A rollout then moves integer composition ids instead of count vectors, and the network's
per-node inputs are rows of a precomputed table.

Inputs of the scorer for node n when the next container is of app a (`FeatureSpec`):

* per node: the node's counts / slots (A), its free slots / slots (1); with `predictor_features`
  also the predictor's per-container throughput of each app on the node now (A), the change of
  the node's summed throughput if the container goes there (1) and the container's own predicted
  throughput there (1);
* per step (shared by all nodes): one-hot app a (A), containers of each app still to place,
  current one included, / batch size (A), the fraction of the batch placed (1) and the containers
  still to place / free slots in the cluster (1).

The paper's state is the one-hot container plus every node's counts (§4); the remaining counts,
free slots and tightness are functions of that state and the batch, and the predictor features
are our addition (they let one policy generalise across batches).
"""
from __future__ import annotations

import contextlib
import weakref
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import nn

from agents.lra_placement.cluster import Constraints, Predictor
from agents.torch_threads import torch_threads

#: compositions tabulated at most (memory: about 100 bytes per composition and app)
MAX_COMPOSITIONS = 400_000


def enumerate_compositions(n_apps: int, slots: int) -> np.ndarray:
    """Every (A,) vector of non-negative counts with sum <= slots, as a (C, A) int64 array."""
    comps = np.zeros((1, 0), dtype=np.int64)
    for _ in range(n_apps):
        used = comps.sum(axis=1)
        parts = [np.column_stack([comps[used + k <= slots], np.full(int((used + k <= slots).sum()), k)])
                 for k in range(slots + 1)]
        comps = np.concatenate(parts).astype(np.int64)
    return comps


class CompositionTable:
    """All node compositions for `n_apps` apps and `slots` slots, with the predictor tabulated.

    Composition ids index the arrays below; id `C` (one past the end) is a sentinel meaning
    "no such composition" (a full node), so transitions never need a branch."""

    def __init__(self, predictor: Predictor, n_apps: int, slots: int):
        # a predictor for another app count failed deep in its matmul ("core dimension 0") or
        # silently read the wrong columns
        names = getattr(predictor, "app_names", None)
        if names is not None and len(names) != n_apps:
            raise ValueError(f"the predictor covers {len(names)} apps, the placement {n_apps}")
        n = _n_compositions(n_apps, slots)
        if n > MAX_COMPOSITIONS:
            raise ValueError(f"{n} compositions of {n_apps} apps in {slots} slots is too many to tabulate "
                             f"(limit {MAX_COMPOSITIONS})")
        self.n_apps, self.slots = n_apps, slots
        comps = enumerate_compositions(n_apps, slots)
        self.powers = (slots + 1) ** np.arange(n_apps, dtype=np.int64)
        keys = comps @ self.powers
        order = np.argsort(keys)
        self.comps, self.keys = comps[order], keys[order]
        C = len(self.comps)
        self.sentinel = C
        tp = np.concatenate([np.asarray(predictor.throughput(self.comps[i:i + 50_000]), dtype=np.float64)
                             for i in range(0, C, 50_000)])
        self.throughput = np.where(self.comps > 0, tp, 0.0)            # (C, A) per container
        self.total = (self.throughput * self.comps).sum(axis=1)         # (C,) summed over the node
        sizes = self.comps.sum(axis=1)
        self.free = slots - sizes                                       # (C,)
        add = np.full((C + 1, n_apps), C, dtype=np.int64)               # (C+1, A) composition after +1 of app
        for a in range(n_apps):
            room = sizes < slots
            add[:C][room, a] = np.searchsorted(self.keys, self.keys[room] + self.powers[a])
        self.add = add
        total_ext = np.append(self.total, 0.0)
        tp_ext = np.vstack([self.throughput, np.zeros((1, n_apps))])
        self.gain = np.where(add[:C] < C, total_ext[add[:C]] - self.total[:, None], 0.0)      # (C, A)
        self.own_after = np.where(add[:C] < C, tp_ext[add[:C], np.arange(n_apps)], 0.0)      # (C, A)
        self.empty_id = int(np.searchsorted(self.keys, 0))

    def __len__(self) -> int:
        return len(self.comps)

    def ids(self, counts: np.ndarray) -> np.ndarray:
        """(..., A) counts -> (...,) composition ids; ValueError for a composition over `slots`."""
        counts = np.asarray(counts, dtype=np.int64)
        if (counts < 0).any() or (counts.sum(axis=-1) > self.slots).any():
            raise ValueError(f"a node holds more than {self.slots} containers or a negative count")
        return np.searchsorted(self.keys, counts @ self.powers)

    def allowed(self, constraints: Constraints) -> np.ndarray:
        """(C+1,) bool: compositions obeying every rule (the sentinel is never allowed)."""
        return np.append(constraints.composition_ok(self.comps), False)


def _n_compositions(n_apps: int, slots: int) -> int:
    from math import comb
    return comb(slots + n_apps, n_apps)


_TABLES: "weakref.WeakKeyDictionary[object, dict]" = weakref.WeakKeyDictionary()


def composition_table(predictor: Predictor, n_apps: int, slots: int) -> CompositionTable:
    """A cached table per predictor object (the predictor must not change once tabulated)."""
    try:
        per = _TABLES.setdefault(predictor, {})
    except TypeError:  # not weak-referenceable: no cache
        return CompositionTable(predictor, n_apps, slots)
    key = (n_apps, slots)
    if key not in per:
        per[key] = CompositionTable(predictor, n_apps, slots)
    return per[key]


def single_thread_blas():
    """Context: NumPy's BLAS on one thread. The rollouts multiply small matrices many times; a
    multi-threaded OpenBLAS spends far more time waking threads than computing (measured 18x slower
    on 2 busy cores), so the hot loops run inside this."""
    global _CONTROLLER
    if _CONTROLLER is None:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:  # scikit-learn's dependency; without it, leave the threads alone
            return contextlib.nullcontext()
        # finding the loaded libraries reads /proc (about 1 ms): do it once
        _CONTROLLER = ThreadpoolController()
    return _CONTROLLER.limit(limits=1, user_api="blas")


_CONTROLLER = None


# --- features ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class FeatureSpec:
    n_apps: int
    predictor_features: bool = True
    #: also the change of the node's summed throughput for one more container of EACH app (A): how
    #: good the node would be for the containers still to come
    lookahead: bool = False

    @property
    def n_node(self) -> int:
        n = self.n_apps + 1
        if self.predictor_features:
            n += self.n_apps + 2 + (self.n_apps if self.lookahead else 0)
        return n

    @property
    def n_global(self) -> int:
        return 2 * self.n_apps + 2

    def node_table(self, table: CompositionTable) -> np.ndarray:
        """(A, C+1, n_node) float32: node features of every composition when placing app a
        (the sentinel row is zeros; it is never chosen)."""
        S = table.slots
        base = [table.comps / S, table.free[:, None] / S]
        out = np.zeros((self.n_apps, len(table) + 1, self.n_node), dtype=np.float32)
        for a in range(self.n_apps):
            cols = list(base)
            if self.predictor_features:
                cols += [table.throughput, table.gain[:, a:a + 1], table.own_after[:, a:a + 1]]
                if self.lookahead:
                    cols.append(table.gain)
            out[a, :-1] = np.hstack(cols)
        return out

    def global_features(self, apps: np.ndarray, remaining: np.ndarray, batch_size: int,
                        placed: np.ndarray, free_slots: np.ndarray) -> np.ndarray:
        """Per-step features. apps (T,) app ids; remaining (T, A) still to place incl. the current
        container; placed (T,) containers placed before the step; free_slots (T,) in the cluster."""
        apps = np.asarray(apps, dtype=np.int64)
        onehot = np.eye(self.n_apps, dtype=np.float32)[apps]
        T = float(max(batch_size, 1))
        still = np.asarray(remaining, dtype=np.float32).sum(axis=-1)
        tight = still / np.maximum(np.asarray(free_slots, dtype=np.float32), 1.0)
        return np.column_stack([onehot, np.asarray(remaining, dtype=np.float32) / T,
                                np.asarray(placed, dtype=np.float32) / T, tight]).astype(np.float32)

    def batch_globals(self, order: np.ndarray, n_nodes: int, slots: int) -> np.ndarray:
        """(T, n_global) for a batch placed in `order` on an empty cluster."""
        order = np.asarray(order, dtype=np.int64)
        T = len(order)
        onehots = np.eye(self.n_apps, dtype=np.int64)[order]
        remaining = onehots[::-1].cumsum(axis=0)[::-1]          # incl. the current container
        placed = np.arange(T)
        return self.global_features(order, remaining, T, placed, n_nodes * slots - placed)


# --- the scorer -------------------------------------------------------------------------------
@dataclass(frozen=True)
class ScorerConfig:
    n_apps: int
    predictor_features: bool = True
    #: hidden layer widths (not given by the paper; our choice)
    hidden: tuple[int, ...] = (64, 64)
    lookahead: bool = False

    @property
    def features(self) -> FeatureSpec:
        return FeatureSpec(self.n_apps, self.predictor_features, self.lookahead)

    def to_json(self) -> dict:
        d = asdict(self)
        d["hidden"] = list(self.hidden)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "ScorerConfig":
        return cls(int(d["n_apps"]), bool(d["predictor_features"]), tuple(int(h) for h in d["hidden"]),
                   bool(d.get("lookahead", False)))


class NodeScorer(nn.Module):
    """One logit per node from [node features, step features]; the first layer is split in a
    node part and a step part so a rollout can precompute the node part per composition."""

    def __init__(self, config: ScorerConfig):
        super().__init__()
        self.config = config
        spec = config.features
        h0 = config.hidden[0]
        self.node_in = nn.Linear(spec.n_node, h0)
        self.global_in = nn.Linear(spec.n_global, h0, bias=False)
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(config.hidden[:-1], config.hidden[1:]))
        self.out = nn.Linear(config.hidden[-1], 1)
        # orthogonal_ runs a QR whose last bits depend on torch's thread count (MKL's LAPACK), so
        # one seed gave other weights on another core count or without OMP_NUM_THREADS=1: one thread
        with torch_threads(1):
            for layer in [self.node_in, self.global_in, *self.hidden]:
                nn.init.orthogonal_(layer.weight, np.sqrt(2))
                if layer.bias is not None:
                    nn.init.zeros_(layer.bias)
            # small output weights: the first policy is close to uniform over feasible nodes
            nn.init.orthogonal_(self.out.weight, 0.01)
            nn.init.zeros_(self.out.bias)

    def trunk(self, first: torch.Tensor) -> torch.Tensor:
        """first: (..., h0) pre-activation of the first layer -> (...,) logits."""
        h = torch.relu(first)
        for layer in self.hidden:
            h = torch.relu(layer(h))
        return self.out(h).squeeze(-1)

    def forward(self, node_x: torch.Tensor, global_x: torch.Tensor) -> torch.Tensor:
        """node_x (..., N, n_node), global_x (..., n_global) -> logits (..., N)."""
        return self.trunk(self.node_in(node_x) + self.global_in(global_x).unsqueeze(-2))

    def numpy_weights(self) -> "NumpyScorer":
        return NumpyScorer(self)


class NumpyScorer:
    """A frozen NumPy copy of a NodeScorer for fast rollouts and inference (no autograd, no
    per-call framework overhead). float32 like the network."""

    def __init__(self, scorer: NodeScorer):
        with torch.no_grad():
            self.w_node = scorer.node_in.weight.detach().numpy().T.astype(np.float32)
            self.b_node = scorer.node_in.bias.detach().numpy().astype(np.float32)
            self.w_global = scorer.global_in.weight.detach().numpy().T.astype(np.float32)
            self.hidden = [(l.weight.detach().numpy().T.astype(np.float32), l.bias.detach().numpy().astype(np.float32))
                           for l in scorer.hidden]
            self.w_out = scorer.out.weight.detach().numpy()[0].astype(np.float32)
            self.b_out = np.float32(scorer.out.bias.detach().numpy()[0])

    def node_part(self, node_x: np.ndarray) -> np.ndarray:
        """(..., n_node) -> (..., h0): the node half of the first layer, bias included."""
        return node_x @ self.w_node + self.b_node

    def global_part(self, global_x: np.ndarray) -> np.ndarray:
        return global_x @ self.w_global

    def trunk(self, first: np.ndarray) -> np.ndarray:
        h = np.maximum(first, 0.0)
        for w, b in self.hidden:
            h = np.maximum(h @ w + b, 0.0)
        return h @ self.w_out + self.b_out

    def logits(self, node_x: np.ndarray, global_x: np.ndarray) -> np.ndarray:
        return self.trunk(self.node_part(node_x) + self.global_part(global_x)[..., None, :])
