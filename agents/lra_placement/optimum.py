"""The exact optimum of a batch placement, by integer programming over node compositions.

Why this exists: the room above good heuristics is small on this problem, so every planner (the
paper's agent included) is judged by its gap to the true optimum, not only by ratios to weak rules.

Every node of a `Cluster` is identical, so a placement is, up to renaming nodes, a multiset of node
compositions. Enumerate every composition c (A counts, sum <= slots, obeying the rules, and never
more of an app than the batch has); its value is v_c = sum_a c_a * tp(c)_a (one batched predictor
call). With integer y_c = number of nodes that take composition c (the empty one included):

    maximise  sum_c v_c y_c   subject to  sum_c y_c = N,   sum_c c_a y_c = counts[a]  for every app a.

The batch size is fixed, so the maximal total is also the maximal mean normalised throughput
(`cluster.score`). HiGHS (via `scipy.optimize.milp`) solves 7 apps x 8 slots (<= 6,435 columns)
quickly. The formulation is exact only because nodes are identical; per-node capacities or rules
would need a per-node model (inputs this module cannot represent are refused with a ValueError).

`repair_placement` is the per-node model, used by the sequential baselines when they paint
themselves into a corner: it finds the valid plan that keeps the most of a partial placement.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy import sparse
from scipy.optimize import Bounds, LinearConstraint, linear_sum_assignment, milp

from .baselines import node_values
from .cluster import Batch, Cluster, Constraints, Predictor, check_plan
from .errors import Infeasible

# scipy.optimize.milp status codes (documented in its reference).
_OPTIMAL, _LIMIT_REACHED, _INFEASIBLE = 0, 1, 2


@dataclass(frozen=True)
class OptimumParams:
    """Solver settings (none is given by the paper, which has no exact baseline; our choices)."""

    time_limit_s: float = 120.0  # our choice; 81 nodes x 400 containers solved in ~2 s here
    # Relative MIP gap at which HiGHS stops. HiGHS's own default (1e-4) could let a heuristic beat
    # the "optimum" by up to 0.01 %, so we ask for a proof to floating-point precision.
    mip_rel_gap: float = 1e-9
    max_compositions: int = 500_000  # refuse rather than build a model that cannot be solved
    repair_time_limit_s: float = 10.0
    # HiGHS does not look at its clock inside a presolve pass, which took 4-8 s on the 6,435-column
    # model of 9 nodes (a 0.05 s limit ran 5-7 s). Below this limit presolve is skipped (the model
    # has 8 rows; it solved 9 nodes in 0.6 s without it, against 8.5 s with it); at or above it,
    # the recorded solves are unchanged.
    presolve_min_limit_s: float = 30.0


@dataclass(frozen=True)
class OptimumResult:
    placement: np.ndarray  # (N, A) int64
    value: float  # total normalised throughput, sum over containers
    score: float  # value / batch size: the mean normalised throughput (`cluster.score`)
    optimal: bool  # HiGHS proved optimality (within mip_rel_gap)
    gap: float | None  # HiGHS's relative MIP gap at the end (None when it reports none)
    seconds: float  # wall time of the whole call (enumeration, prediction, solve)
    solve_seconds: float  # wall time of the MILP solve alone
    status: int  # scipy.optimize.milp status (0 optimal, 1 time/node limit, 2 infeasible, ...)
    message: str
    n_compositions: int  # columns of the integer program
    dual_bound: float | None  # upper bound on the total value


def count_compositions(slots: int, caps: np.ndarray) -> int:
    """How many compositions have sum <= slots and c_a <= caps[a] (a small DP, no enumeration)."""
    # no composition within the caps sums past their total: a node of 10^8 slots (a typo) took
    # 12 s and 1.7 GB here, 10^9 all the memory, for the count of a node of sum(caps) slots
    slots = int(min(slots, sum(max(0, int(c)) for c in caps)))
    ways = np.zeros(slots + 1, dtype=object)  # ways[s]: compositions of the apps so far summing to s
    ways[0] = 1
    for cap in caps:
        new = np.zeros_like(ways)
        for k in range(int(min(cap, slots)) + 1):
            new[k:] += ways[: slots + 1 - k]
        ways = new
    return int(ways.sum())


def enumerate_compositions(n_apps: int, slots: int, caps: np.ndarray | None = None) -> np.ndarray:
    """(K, A) int64: every composition with sum <= slots (and c_a <= caps[a]), the empty one
    first, in lexicographic order. Without caps K = C(slots + A, A), e.g. 6,435 for 7 apps x 8."""
    caps = np.full(n_apps, slots) if caps is None else np.minimum(np.asarray(caps, dtype=np.int64), slots)
    comps = np.zeros((1, 0), dtype=np.int64)
    for a in range(n_apps):
        values = np.arange(caps[a] + 1, dtype=np.int64)
        grown = np.concatenate(
            [np.repeat(comps, len(values), axis=0), np.tile(values, len(comps))[:, None]], axis=1
        )
        comps = grown[grown.sum(axis=1) <= slots]
    return comps


def _check_inputs(cluster: Cluster, batch: Batch, constraints: Constraints, predictor: Predictor | None) -> None:
    n_apps = len(batch.counts)
    if constraints.n_apps != n_apps:
        raise ValueError(f"the batch has {n_apps} apps but the constraints cover {constraints.n_apps}")
    if predictor is not None and len(predictor.app_names) != n_apps:
        raise ValueError(f"the batch has {n_apps} apps but the predictor knows {len(predictor.app_names)}")
    for r in constraints.rules:
        if not (0 <= r.a < n_apps and 0 <= r.b < n_apps):
            raise ValueError(f"rule {r} names an app outside 0..{n_apps - 1}")


def _usable_compositions(cluster: Cluster, batch: Batch, constraints: Constraints, max_compositions: int) -> np.ndarray:
    n = count_compositions(cluster.slots, batch.counts)
    if n > max_compositions:
        raise ValueError(
            f"{n:,} node compositions for {len(batch.counts)} apps x {cluster.slots} slots exceed "
            f"max_compositions={max_compositions:,}: the exact composition IP is not practical here"
        )
    comps = enumerate_compositions(len(batch.counts), cluster.slots, batch.counts)
    return comps[constraints.composition_ok(comps)]


def _presolve_fits(time_limit_s: float) -> bool:
    return float(time_limit_s) >= OptimumParams.presolve_min_limit_s


def _solve_composition_ip(comps, values, n_nodes, counts, time_limit_s, mip_rel_gap, presolve=True):
    """y (K,) nodes per composition, or None with the milp result when there is no solution."""
    k = len(comps)
    # No composition can be used more often than the batch's counts allow (tightens the model).
    with np.errstate(divide="ignore"):
        per_app = np.where(comps > 0, counts[None, :] // np.maximum(comps, 1), n_nodes)
    upper = np.minimum(per_app.min(axis=1), n_nodes).astype(float)
    a_eq = np.vstack([np.ones((1, k)), comps.T.astype(float)])
    rhs = np.concatenate([[n_nodes], counts]).astype(float)
    res = milp(
        c=-np.asarray(values, dtype=float),
        integrality=np.ones(k),
        bounds=Bounds(np.zeros(k), upper),
        constraints=LinearConstraint(sparse.csr_array(a_eq), rhs, rhs),
        options={"time_limit": max(0.0, float(time_limit_s)), "mip_rel_gap": float(mip_rel_gap), "disp": False,
                 "presolve": bool(presolve)},
    )
    if res.x is None:
        return None, res
    return np.rint(res.x).astype(np.int64), res


def _compositions_to_placement(comps: np.ndarray, y: np.ndarray, n_nodes: int) -> np.ndarray:
    """Give the chosen compositions to nodes 0, 1, ... fullest first (empty nodes last)."""
    rows = np.repeat(comps, y, axis=0)
    rows = rows[np.argsort(-rows.sum(axis=1), kind="stable")]
    if len(rows) != n_nodes:
        raise AssertionError(f"the IP used {len(rows)} nodes, not {n_nodes}")
    return rows.astype(np.int64)


def optimum(
    cluster: Cluster,
    batch: Batch,
    constraints: Constraints,
    predictor: Predictor,
    time_limit_s: float = OptimumParams.time_limit_s,
    mip_rel_gap: float = OptimumParams.mip_rel_gap,
    max_compositions: int = OptimumParams.max_compositions,
) -> OptimumResult:
    """The best placement of `batch` under the predictor, with the solver's status and timings.

    Raises Infeasible when no valid placement exists, TimeoutError when HiGHS found no solution
    within the time limit, ValueError for inputs the composition model cannot represent."""
    t0 = time.perf_counter()
    _check_inputs(cluster, batch, constraints, predictor)
    if batch.size > cluster.capacity:
        raise Infeasible(f"{batch.size} containers exceed {cluster.n_nodes} nodes x {cluster.slots} slots")
    comps = _usable_compositions(cluster, batch, constraints, max_compositions)
    values = node_values(comps, predictor)
    if not np.isfinite(values).all():  # HiGHS would refuse them with a message that names no input
        bad = comps[~np.isfinite(values)][0].tolist()
        raise ValueError(f"the predictor gave a non-finite throughput for {int((~np.isfinite(values)).sum())} "
                         f"node composition(s), e.g. {bad}")
    t_solve = time.perf_counter()
    # the limit bounds the whole call: HiGHS gets what the model's build left of it
    left = time_limit_s - (t_solve - t0)
    y, res = _solve_composition_ip(comps, values, cluster.n_nodes, batch.counts, left, mip_rel_gap,
                                   _presolve_fits(time_limit_s))
    solve_seconds = time.perf_counter() - t_solve
    if y is None:
        if res.status == _INFEASIBLE:
            raise Infeasible(f"no placement of {batch.counts.tolist()} obeys the slots and rules ({res.message})")
        raise TimeoutError(f"HiGHS found no placement within {time_limit_s} s (status {res.status}: {res.message})")
    placement = _compositions_to_placement(comps, y, cluster.n_nodes)
    problems = check_plan(placement, batch, cluster, constraints)
    if problems:  # would be a modelling bug; never hand out an invalid plan
        raise AssertionError(f"the IP's plan is invalid: {problems}")
    value = float(values @ y)
    gap = getattr(res, "mip_gap", None)
    dual = getattr(res, "mip_dual_bound", None)
    return OptimumResult(
        placement=placement,
        value=value,
        score=value / batch.size,
        optimal=res.status == _OPTIMAL,
        gap=None if gap is None else float(gap),
        seconds=time.perf_counter() - t0,
        solve_seconds=solve_seconds,
        status=int(res.status),
        message=str(res.message),
        n_compositions=len(comps),
        dual_bound=None if dual is None else -float(dual),
    )


def plan_optimum(
    cluster: Cluster,
    batch: Batch,
    constraints: Constraints,
    predictor: Predictor,
    rng: np.random.Generator | None = None,
    **params,
) -> np.ndarray:
    """Planner interface to `optimum` (params: time_limit_s, mip_rel_gap, max_compositions).

    Exact for identical nodes, the only kind `Cluster` models. Deterministic: `rng` is unused.
    When the time limit stops HiGHS it returns the best plan found (see `optimum` for the gap)."""
    return optimum(cluster, batch, constraints, predictor, **params).placement


# --- repair for heuristics ------------------------------------------------------------------------
def feasible_placement(
    cluster: Cluster, batch: Batch, constraints: Constraints, time_limit_s: float = OptimumParams.repair_time_limit_s
) -> np.ndarray:
    """Some valid placement (no predictor involved), or Infeasible when none exists.

    The composition IP with a zero objective: node symmetry is already factored out, so proving
    infeasibility is quick."""
    _check_inputs(cluster, batch, constraints, None)
    if batch.size > cluster.capacity:
        raise Infeasible(f"{batch.size} containers exceed {cluster.n_nodes} nodes x {cluster.slots} slots")
    comps = _usable_compositions(cluster, batch, constraints, OptimumParams.max_compositions)
    y, res = _solve_composition_ip(comps, np.zeros(len(comps)), cluster.n_nodes, batch.counts, time_limit_s, 0.0)
    if y is None:
        if res.status == _INFEASIBLE:
            raise Infeasible(f"no placement of {batch.counts.tolist()} obeys the slots and rules ({res.message})")
        raise TimeoutError(f"HiGHS found no valid placement within {time_limit_s} s ({res.message})")
    return _compositions_to_placement(comps, y, cluster.n_nodes)


def _overlap_assignment(partial: np.ndarray, plan: np.ndarray) -> np.ndarray:
    """Permute the plan's node rows so that they keep as many of the partial's containers as possible."""
    overlap = np.minimum(partial[:, None, :], plan[None, :, :]).sum(axis=2)
    rows, cols = linear_sum_assignment(-overlap)
    out = np.empty_like(plan)
    out[rows] = plan[cols]
    return out


def repair_placement(
    partial: np.ndarray,
    batch: Batch,
    cluster: Cluster,
    constraints: Constraints,
    time_limit_s: float = OptimumParams.repair_time_limit_s,
) -> np.ndarray:
    """A valid plan for the whole batch that keeps as many containers of `partial` (a valid partial
    placement of part of the batch) on their nodes as possible; Infeasible when no plan exists.

    Per-node MILP: x[i, a] containers of a on node i, kept[i, a] <= min(x, partial); maximise the
    kept total. Anti-affinity between two apps needs one binary per node and rule (which of the two
    the node may host); the other rules are linear. If HiGHS finds no plan in time, any valid plan
    (`feasible_placement`) is matched to the partial's nodes instead."""
    partial = np.asarray(partial, dtype=np.int64)
    _check_inputs(cluster, batch, constraints, None)
    if partial.shape != (cluster.n_nodes, len(batch.counts)):
        raise ValueError(f"partial placement shape {partial.shape} != ({cluster.n_nodes}, {len(batch.counts)})")
    n, a_count = partial.shape
    counts = batch.counts
    try:  # proves (in)feasibility quickly, and gives a fallback plan
        feasible = feasible_placement(cluster, batch, constraints, time_limit_s)
    except ValueError:  # too many compositions for that model: rely on the per-node model alone
        feasible = None

    upper = np.minimum(counts, cluster.slots).astype(float)
    unary = np.full(a_count, np.inf)
    pair_cards, pair_antis = [], []
    for r in constraints.rules:
        if r.a == r.b:
            unary[r.a] = min(unary[r.a], 1 if r.kind == "anti-affinity" else r.limit)
        elif r.kind == "cardinality":
            pair_cards.append(r)
        else:
            pair_antis.append(r)
    upper = np.minimum(upper, unary)

    nx = n * a_count
    nz = n * len(pair_antis)
    n_vars = 2 * nx + nz  # x, kept, z

    def xi(i, a):
        return i * a_count + a

    rows, cols, vals, lo, hi = [], [], [], [], []

    def add_row(entries, lb, ub):
        r = len(lo)
        for c, v in entries:
            rows.append(r)
            cols.append(c)
            vals.append(v)
        lo.append(lb)
        hi.append(ub)

    for a in range(a_count):  # every container placed
        add_row([(xi(i, a), 1.0) for i in range(n)], counts[a], counts[a])
    for i in range(n):
        add_row([(xi(i, a), 1.0) for a in range(a_count)], -np.inf, cluster.slots)
        for a in range(a_count):  # kept <= x
            add_row([(nx + xi(i, a), 1.0), (xi(i, a), -1.0)], -np.inf, 0.0)
        for r in pair_cards:
            add_row([(xi(i, r.a), 1.0), (xi(i, r.b), 1.0)], -np.inf, r.limit)
        for k, r in enumerate(pair_antis):
            z = 2 * nx + i * len(pair_antis) + k  # z = 1: the node may host r.a; z = 0: r.b
            add_row([(xi(i, r.a), 1.0), (z, -upper[r.a])], -np.inf, 0.0)
            add_row([(xi(i, r.b), 1.0), (z, upper[r.b])], -np.inf, upper[r.b])
    matrix = sparse.csr_array((vals, (rows, cols)), shape=(len(lo), n_vars))

    lower_b = np.zeros(n_vars)
    upper_b = np.concatenate([np.tile(upper, n), partial.reshape(-1).astype(float), np.ones(nz)])
    integrality = np.concatenate([np.ones(nx), np.zeros(nx), np.ones(nz)])
    objective = np.concatenate([np.zeros(nx), -np.ones(nx), np.zeros(nz)])
    res = milp(
        c=objective,
        integrality=integrality,
        bounds=Bounds(lower_b, upper_b),
        constraints=LinearConstraint(matrix, np.asarray(lo, float), np.asarray(hi, float)),
        options={"time_limit": float(time_limit_s), "disp": False},
    )
    if res.x is not None:
        plan = np.rint(res.x[:nx]).astype(np.int64).reshape(n, a_count)
        if not check_plan(plan, batch, cluster, constraints):
            return plan
    if feasible is not None:
        return _overlap_assignment(partial, feasible)
    if res.status == _INFEASIBLE:
        raise Infeasible(f"no placement of {batch.counts.tolist()} obeys the slots and rules ({res.message})")
    raise TimeoutError(f"HiGHS found no valid placement within {time_limit_s} s ({res.message})")


__all__ = [
    "OptimumParams",
    "OptimumResult",
    "count_compositions",
    "enumerate_compositions",
    "feasible_placement",
    "optimum",
    "plan_optimum",
    "repair_placement",
]
