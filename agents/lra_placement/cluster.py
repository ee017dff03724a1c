"""The placement problem's data model, shared by the simulator, every planner and the service.

A cluster is N identical nodes of `slots` containers each; a batch is a count of containers per
application (A apps) to place; a placement is an (N, A) integer matrix of containers per node
and app. A node's *composition* is its row. Every planner (the paper's agent, the baselines, the
exact optimum) produces a placement, and every placement is scored the same way: the mean, over
the batch's containers, of each container's normalised throughput as the predictor gives it for
its node's composition (the paper's "normalised average throughput of the group", §4).

Operation constraints (`Constraints`) are per app pair and never violated by any planner:

* anti-affinity(a, b): a node never hosts both a and b; anti-affinity(a, a): at most one a per node;
* cardinality(a, b, limit): on every node, count(a) + count(b) <= limit (a == b: count(a) <= limit).

They load from a CSV with the header `app_a,app_b,rule,limit` (`rule` is `anti-affinity` or
`cardinality`; `limit` is ignored for anti-affinity).
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np


class Predictor(Protocol):
    """Per-container normalised throughput of every app in each given node composition."""

    app_names: tuple[str, ...]

    def throughput(self, compositions: np.ndarray) -> np.ndarray:
        """compositions: (K, A) non-negative ints -> (K, A) float; 0 where the app is absent."""


def whole_counts(values, what: str) -> np.ndarray:
    """`values` as an int64 array, or a ValueError naming `what`: a cast to int64 truncated 1.5
    containers to 1 (and 2.7 to app 2) silently, and NaN failed with a message that named nothing."""
    try:
        arr = np.asarray(values)
    except (TypeError, ValueError):  # ragged lists
        raise ValueError(f"{what} must be whole numbers, got {values!r}"[:300]) from None
    if arr.dtype.kind in "iu":
        return arr.astype(np.int64)
    if arr.dtype.kind == "f" and np.isfinite(arr).all() and (np.abs(arr) <= 2**53).all() and (arr == np.floor(arr)).all():
        return arr.astype(np.int64)
    raise ValueError(f"{what} must be whole numbers, got {values!r}"[:300])


def as_whole(value) -> int | None:
    """A scalar count or index (2 or 2.0) as an int; None for anything else (1.7, NaN, "web", True)."""
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)) and math.isfinite(value) and float(value).is_integer():
        return int(value)
    return None


def whole_number(value, what: str) -> int:
    """A scalar count (3 or 3.0) as an int, or a ValueError naming `what` (2.5, NaN, "3", True)."""
    n = as_whole(value)
    if n is None:
        raise ValueError(f"{what} must be a whole number, got {value!r}")
    return n


@dataclass(frozen=True)
class Cluster:
    n_nodes: int
    slots: int
    node_names: tuple[str, ...] = ()

    def __post_init__(self):
        # a float size failed in range() with a TypeError naming neither field; 8.0 slots made the
        # capacity a float
        object.__setattr__(self, "n_nodes", whole_number(self.n_nodes, "n_nodes"))
        object.__setattr__(self, "slots", whole_number(self.slots, "slots"))
        if self.n_nodes < 1 or self.slots < 1:
            raise ValueError(f"a cluster needs >= 1 node and >= 1 slot, got {self.n_nodes} x {self.slots}")
        if not self.node_names:
            object.__setattr__(self, "node_names", tuple(f"node-{i}" for i in range(self.n_nodes)))
        if len(self.node_names) != self.n_nodes or len(set(self.node_names)) != self.n_nodes:
            raise ValueError("node_names must name every node once")

    @property
    def capacity(self) -> int:
        return self.n_nodes * self.slots


# Tabulating every node composition (the forest's table, the learned planners' look-ups) costs time
# and memory in C(slots + apps, apps): 6,435 rows for 7 apps x 8 slots, 888,030 for 20 slots (15 s and
# 1.2 GB measured), 1.1e9 for 64 slots (out of memory). Past this many, a plan is refused, not tried.
MAX_TABULATED_COMPOSITIONS = 1_000_000


def composition_count(n_apps: int, slots: int) -> int:
    """How many node compositions of at most `slots` containers over `n_apps` apps exist."""
    return math.comb(slots + n_apps, n_apps)


def max_tabulated_slots(n_apps: int, limit: int = MAX_TABULATED_COMPOSITIONS) -> int:
    """The most slots per node whose compositions of `n_apps` apps can still be tabulated (at most
    `limit` of them; the learned planners' own table takes fewer, `network.MAX_COMPOSITIONS`)."""
    slots = 1
    while composition_count(n_apps, slots + 1) <= limit:
        slots += 1
    return slots


@dataclass(frozen=True)
class Rule:
    a: int
    b: int
    kind: str  # "anti-affinity" | "cardinality"
    limit: int = 0


RULE_KINDS = ("anti-affinity", "cardinality")


@dataclass(frozen=True)
class Constraints:
    n_apps: int
    rules: tuple[Rule, ...] = ()

    def __post_init__(self):
        # every check treats a kind it does not know as a cardinality cap (a misspelt
        # "anti_affinity" became "never place either app") and a rule on an app past n_apps failed
        # with an IndexError at the first mask; the CSV loader and /plan refused both already
        for r in self.rules:
            if r.kind not in RULE_KINDS:
                raise ValueError(f"constraints: rule {r} has kind {r.kind!r}, not one of {', '.join(RULE_KINDS)}")
            checked = (r.a, r.b, r.limit) if r.kind == "cardinality" else (r.a, r.b)  # anti-affinity ignores limit
            if not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in checked):
                raise ValueError(f"constraints: rule {r} needs whole app indexes and limit")
            if not (0 <= r.a < self.n_apps and 0 <= r.b < self.n_apps):
                raise ValueError(f"constraints: rule {r} names an app outside 0..{self.n_apps - 1}")
            if r.kind == "cardinality" and r.limit < 0:
                raise ValueError(f"constraints: rule {r} has a negative limit")

    # --- construction ---------------------------------------------------------------------
    @classmethod
    def none(cls, n_apps: int) -> "Constraints":
        return cls(n_apps)

    @classmethod
    def from_csv(cls, path: str | Path, app_names: Sequence[str]) -> "Constraints":
        try:
            with open(path, newline="", encoding="utf-8-sig") as fh:  # utf-8-sig: spreadsheets write a BOM
                return cls._from_reader(csv.DictReader(fh), path, app_names)
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path}: not a UTF-8 text file ({exc.reason} at byte {exc.start})") from None
        except csv.Error as exc:  # e.g. a field past csv's size limit: a bad file, not a crash
            raise ValueError(f"{path}: not a readable CSV file: {exc}") from None

    @classmethod
    def _from_reader(cls, reader: csv.DictReader, path, app_names: Sequence[str]) -> "Constraints":
        index = {n: i for i, n in enumerate(app_names)}
        rules = []
        need = {"app_a", "app_b", "rule", "limit"}
        if reader.fieldnames is None or not need <= set(reader.fieldnames):
            raise ValueError(f"{path}: header must be app_a,app_b,rule,limit, got {reader.fieldnames}")
        for row in reader:
            line = reader.line_num
            # DictReader fills a short row with None: name the line instead of crashing on it
            if any(row[key] is None for key in need):
                raise ValueError(f"{path}:{line}: expected 4 fields app_a,app_b,rule,limit, got {row}")
            for key in ("app_a", "app_b"):
                if row[key] not in index:
                    raise ValueError(f"{path}:{line}: {key} {row[key]!r} is not an app ({', '.join(app_names)})")
            kind = row["rule"].strip()
            if kind not in ("anti-affinity", "cardinality"):
                raise ValueError(f"{path}:{line}: rule must be anti-affinity or cardinality, got {kind!r}")
            try:  # the module doc's contract: an anti-affinity row's limit is ignored ("", "-", "n/a")
                limit = 0 if kind == "anti-affinity" else int(row["limit"] or 0)
            except ValueError:
                raise ValueError(f"{path}:{line}: limit must be an integer, got {row['limit']!r}") from None
            if kind == "cardinality" and limit < 1:
                raise ValueError(f"{path}:{line}: a cardinality limit must be >= 1, got {limit}")
            rules.append(Rule(index[row["app_a"]], index[row["app_b"]], kind, limit))
        return cls(len(app_names), tuple(rules))

    def to_csv(self, path: str | Path, app_names: Sequence[str]) -> None:
        with open(path, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["app_a", "app_b", "rule", "limit"])
            for r in self.rules:
                w.writerow([app_names[r.a], app_names[r.b], r.kind, r.limit])

    # --- checks -----------------------------------------------------------------------------
    def composition_ok(self, comps: np.ndarray) -> np.ndarray:
        """comps: (..., A) -> bool (...,): whether each composition obeys every rule."""
        comps = np.asarray(comps)
        ok = np.ones(comps.shape[:-1], dtype=bool)
        for r in self.rules:
            ca, cb = comps[..., r.a], comps[..., r.b]
            if r.kind == "anti-affinity":
                ok &= (ca <= 1) if r.a == r.b else ~((ca > 0) & (cb > 0))
            else:
                ok &= (ca <= r.limit) if r.a == r.b else (ca + cb <= r.limit)
        return ok

    def violations(self, placement: np.ndarray) -> int:
        """Number of nodes whose composition breaks a rule."""
        return int((~self.composition_ok(placement)).sum())


def place_mask(placement: np.ndarray, app: int, cluster: Cluster, constraints: Constraints) -> np.ndarray:
    """(N,) int8 mask (Gymnasium's `action_mask` convention): 1 where one more container of `app`
    fits (a free slot, and every rule still holds after adding it)."""
    after = np.array(placement, dtype=np.int64, copy=True)
    after[:, app] += 1
    ok = (after.sum(axis=1) <= cluster.slots) & constraints.composition_ok(after)
    return ok.astype(np.int8)


def per_container_throughput(placement: np.ndarray, predictor: Predictor) -> np.ndarray:
    """(N, A) placement -> (N, A) per-container normalised throughput (0 where absent)."""
    placement = np.asarray(placement)
    tp = np.asarray(predictor.throughput(placement), dtype=np.float64)
    return np.where(placement > 0, tp, 0.0)


def score(placement: np.ndarray, predictor: Predictor) -> float:
    """Mean normalised throughput over the placed containers (the paper's final reward)."""
    placement = np.asarray(placement)
    n = placement.sum()
    if n == 0:
        return 0.0
    return float((per_container_throughput(placement, predictor) * placement).sum() / n)


def per_app_score(placement: np.ndarray, predictor: Predictor) -> np.ndarray:
    """(A,) mean normalised throughput of each app's containers (NaN for apps not placed)."""
    placement = np.asarray(placement)
    tp = per_container_throughput(placement, predictor) * placement
    counts = placement.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, tp.sum(axis=0) / np.maximum(counts, 1), np.nan)


@dataclass(frozen=True)
class Batch:
    """Containers to place: `counts[a]` of app a. `order` is the arrival order of the containers
    (app ids); by default apps interleave as they would arrive from independent deployments."""

    counts: np.ndarray
    order: np.ndarray = field(default=None)  # type: ignore[assignment]

    def __post_init__(self):
        counts = whole_counts(self.counts, "a batch's counts")
        if counts.ndim != 1 or (counts < 0).any() or counts.sum() == 0:
            raise ValueError(f"a batch needs non-negative counts per app and at least one container, got {counts}")
        object.__setattr__(self, "counts", counts)
        if self.order is None:
            object.__setattr__(self, "order", default_order(counts))
        order = whole_counts(self.order, "a batch's order (app indexes)")
        if order.ndim != 1 or (order < 0).any() or np.bincount(order, minlength=len(counts)).tolist() != counts.tolist():
            raise ValueError("order must list each container of the batch once")
        object.__setattr__(self, "order", order)

    @property
    def size(self) -> int:
        return int(self.counts.sum())


def default_order(counts: np.ndarray) -> np.ndarray:
    """Round-robin over apps (a, b, c, a, b, c, ...) until each app's count is used up."""
    counts = np.asarray(counts, dtype=np.int64).copy()
    out = []
    while counts.sum() > 0:
        for a in range(len(counts)):
            if counts[a] > 0:
                out.append(a)
                counts[a] -= 1
    return np.asarray(out, dtype=np.int64)


def empty_placement(cluster: Cluster, n_apps: int) -> np.ndarray:
    return np.zeros((cluster.n_nodes, n_apps), dtype=np.int64)


def check_plan(placement: np.ndarray, batch: Batch, cluster: Cluster, constraints: Constraints) -> list[str]:
    """Problems with a finished plan ([] when it is valid): wrong counts, overfull nodes, rules."""
    p = np.asarray(placement)
    problems = []
    if p.shape != (cluster.n_nodes, len(batch.counts)):
        return [f"plan shape {p.shape} != ({cluster.n_nodes}, {len(batch.counts)})"]
    if (p < 0).any():
        problems.append("negative counts")
    if p.sum(axis=0).tolist() != batch.counts.tolist():
        problems.append(f"placed per app {p.sum(axis=0).tolist()} != batch {batch.counts.tolist()}")
    over = np.nonzero(p.sum(axis=1) > cluster.slots)[0]
    if len(over):
        problems.append(f"nodes over {cluster.slots} slots: {over.tolist()}")
    if constraints.violations(p):
        problems.append(f"{constraints.violations(p)} node(s) break an operation constraint")
    return problems
