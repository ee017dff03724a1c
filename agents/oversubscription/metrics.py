"""The paper's metrics (§6.4, L225-227) over a set of test episodes.

* PM-Hot-R: "the maximum probability of a PM in the cluster being hot [more] than delta": for each
  PM the share of episodes in which it was hot on delta or more steps (the constraint asks for
  fewer than delta), then the maximum over PMs. Why ">= delta": Eq. 2 and Definition 1 (L66, L76)
  ask for a hot share strictly below delta, so PM-Hot-R is the complement of the constraint; the
  prose of L201 ("not hot over 3 times") and L225 ("more than") would allow delta itself. We follow
  the equations, which the learner's constraint also uses.
* C-Hot-R (Table 5): the share of episodes in which the cluster (any PM) was hot on delta or more
  steps.
* S-Cores = 1 - assigned / requested cores, over the VMs placed in the episode (mean over episodes).
* Satisfied at alpha: Pr(a PM is hot fewer than delta steps) >= alpha for every PM, i.e.
  PM-Hot-R <= 1 - alpha.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

from .settings import ALPHAS
from .sim import EpisodeRecord


def pm_hot_r(records: list[EpisodeRecord], delta: int) -> float:
    if not records:  # no episodes, nothing hot: as the other metrics say (np.stack refuses an empty list)
        return 0.0
    over = np.stack([r.hot_counts >= delta for r in records])  # [E, K]
    return float(over.mean(axis=0).max())


def c_hot_r(records: list[EpisodeRecord], delta: int) -> float:
    return float(np.mean([r.cluster_hot_steps >= delta for r in records])) if records else 0.0


def broken_pms(records: list[EpisodeRecord], delta: int) -> float:
    """Mean count per episode of PMs hot on delta or more steps (the PMs that broke their bound)."""
    return float(np.mean([(r.hot_counts >= delta).sum() for r in records])) if records else 0.0


def s_cores(records: list[EpisodeRecord]) -> float:
    return float(np.mean([r.s_cores for r in records])) if records else 0.0


def satisfied(pm_hot_rate: float, alpha: float) -> bool:
    return pm_hot_rate <= 1.0 - alpha + 1e-12


def summarise(records: list[EpisodeRecord], delta: int, alphas: Iterable[float] = ALPHAS) -> dict:
    ph = pm_hot_r(records, delta)
    return {
        "pm_hot_r": ph,
        "c_hot_r": c_hot_r(records, delta),
        "s_cores": s_cores(records),
        "satisfied": {f"{a:.2f}": satisfied(ph, a) for a in alphas},
        "rejected": int(sum(r.rejected for r in records)),
        "placed": int(sum(r.placed for r in records)),
        "warm_rejected": int(sum(r.warm_rejected for r in records)),
        "mean_cluster_hot_steps": float(np.mean([r.cluster_hot_steps for r in records])) if records else 0.0,
        "episodes": len(records),
    }
