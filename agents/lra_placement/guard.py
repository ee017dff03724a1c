"""The placement problem's guard step: a plan's containers go on a node only if the node's
composition after them still fits its slots and obeys every operation constraint.

A wish targets one node; its change is {app index: containers to add}. The step keeps the
compositions it has admitted so far in the decision, so several wishes for one node add up.
"""
from __future__ import annotations

import numpy as np

from samm.execute.chain import GuardContext, Skip, Step, Wish

from .cluster import Cluster, Constraints


def fits_node(cluster: Cluster, constraints: Constraints, placement: np.ndarray) -> Step:
    current = np.array(placement, dtype=np.int64, copy=True)  # admitted so far in this decision
    index = {n: i for i, n in enumerate(cluster.node_names)}

    def step(w: Wish, ctx: GuardContext) -> Wish | Skip:
        node = index.get(w.target)
        if node is None:
            return Skip(w.target, w.change, "unknown_node", f"node {w.target!r} is not in the cluster")
        add = np.zeros(current.shape[1], dtype=np.int64)
        for app, n in dict(w.change).items():
            if not 0 <= int(app) < len(add) or int(n) < 0:
                return Skip(w.target, w.change, "invalid", f"app {app} x {n} is not a valid change")
            add[int(app)] += int(n)
        after = current[node] + add
        if after.sum() > cluster.slots:
            return Skip(w.target, w.change, "node_full",
                        f"{int(after.sum())} containers > {cluster.slots} slots on {w.target}")
        if not constraints.composition_ok(after[None, :])[0]:
            return Skip(w.target, w.change, "constraint", f"composition {after.tolist()} breaks an operation rule")
        current[node] = after
        return w.with_data(composition=after.tolist())

    return step
