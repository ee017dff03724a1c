"""The placement problem's guard step: a plan's containers go on a node only if the node's
composition after them still fits its slots and obeys every operation constraint.

A wish targets one node; its change is {app index: containers to add}. The step keeps the
compositions it has admitted so far in the decision, so several wishes for one node add up.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from samm.execute.chain import GuardContext, Skip, Step, Wish

from .cluster import Cluster, Constraints, as_whole


def _additions(change, n_apps: int) -> list[int] | None:
    """{app index: containers to add} -> containers to add per app (Python ints: a huge count
    cannot overflow), or None when `change` is not such a mapping."""
    if not isinstance(change, Mapping):
        return None
    add = [0] * n_apps
    for app, n in change.items():
        # a malformed wish (1.7, NaN, "web", True) is skipped, never truncated into another change
        app, n = as_whole(app), as_whole(n)
        if app is None or n is None or not 0 <= app < n_apps or n < 0:
            return None
        add[app] += n
    return add


def _snapshot(cluster: Cluster, constraints: Constraints, placement) -> np.ndarray:
    """The cluster's containers per node and app as (nodes, apps) int64, or a one-line ValueError
    naming what is wrong. Checked because the step trusts it: a NaN became int64's minimum and a
    negative count freed slots, so a 3-slot node took 5 more containers; a snapshot of another
    shape failed with an IndexError on the first wish for a node or app it lacks."""
    try:
        p = np.asarray(placement, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"placement: not an array of container counts: {placement!r}"[:200]) from None
    want = (cluster.n_nodes, constraints.n_apps)
    if p.shape != want:
        raise ValueError(f"placement: shape {p.shape} is not the cluster's nodes x the rules' apps {want}")
    bad = np.argwhere(~(np.isfinite(p) & (p >= 0) & (p <= 2**53) & (p == np.floor(p))))
    if len(bad):
        n, a = bad[0]
        raise ValueError(f"placement[{n}, {a}]: {p[n, a]} is not a whole number of containers >= 0")
    outside = [r for r in constraints.rules if not (0 <= r.a < want[1] and 0 <= r.b < want[1])]
    if outside:
        raise ValueError(f"constraints: rule {outside[0]} names an app outside 0..{want[1] - 1}")
    return p.astype(np.int64)


def fits_node(cluster: Cluster, constraints: Constraints, placement: np.ndarray) -> Step:
    """The step, over `placement` (the cluster's containers now); ValueError for a snapshot that
    does not fit the cluster and rules (see `_snapshot`)."""
    current = _snapshot(cluster, constraints, placement)  # admitted so far in this decision
    index = {n: i for i, n in enumerate(cluster.node_names)}

    def step(w: Wish, ctx: GuardContext) -> Wish | Skip:
        node = index.get(w.target) if isinstance(w.target, str) else None
        if node is None:
            return Skip(w.target, w.change, "unknown_node", f"node {w.target!r} is not in the cluster")
        add = _additions(w.change, current.shape[1])
        if add is None:
            return Skip(w.target, w.change, "invalid",
                        f"change {w.change!r} is not {{app index: containers to add}} with whole counts")
        total = int(current[node].sum()) + sum(add)
        if total > cluster.slots:
            return Skip(w.target, w.change, "node_full", f"{total} containers > {cluster.slots} slots on {w.target}")
        after = current[node] + np.asarray(add, dtype=np.int64)  # each count <= slots here: fits int64
        if not constraints.composition_ok(after[None, :])[0]:
            return Skip(w.target, w.change, "constraint", f"composition {after.tolist()} breaks an operation rule")
        current[node] = after
        return w.with_data(composition=after.tolist())

    return step
