"""A policy's figures on the experiment's protocol, and the checkpoint a training run keeps.

`evaluate` runs a Reclaimer policy (deterministic actions) on the experiment's episodes: the load
levels of `samm experiment reclaimer` (the low end, the middle and the high end of the app's user
range), one episode per seed, the 60 s warm-up at caps, 300 control seconds. It gives the mean
allocated cores and the share of control seconds over the QoS target, overall and per level.

`BestCheckpoint` is the rule a training run with `--eval-every` applies (ours, in the manner of
Stable-Baselines3's EvalCallback): after every evaluation, keep the policy with the fewest mean
cores among those whose violation rate is at most `max_violation`. With `--actor-ema` a moving
average of the actor's weights is offered beside the live actor at each evaluation. The
evaluation's seeds must not be the experiment's (1-5) or the check seeds (6-10): a checkpoint
picked on the seeds that then report it would be picked on its own test
(docs/microservice-cores.md).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .episode import run_episodes
from .topology import Topology

#: the validation episodes' seeds: apart from the experiment's (1-5) and the check seeds (6-10)
VALIDATION_SEEDS = (101, 102, 103, 104, 105)


def evaluate(policy, topo: Topology, seeds: Sequence[int] = VALIDATION_SEEDS,
             fractions: Sequence[float] | None = None) -> dict:
    """{"mean_cores", "violation_rate", "levels": {users: {...}}} of `policy` (a ReclaimerPolicy,
    acting for every copy at once with a frame stack per copy: the figures of one fork per copy)."""
    from .experiment import FULL, levels

    per_level = {}
    for users in levels(topo, fractions if fractions is not None else FULL.level_fractions):
        eps = run_episodes(topo, None, users, seeds, batch=policy.batch())
        per_level[str(users)] = {"mean_cores": float(np.mean([e.mean_cores for e in eps])),
                                 "violation_rate": float(np.mean([e.violation_rate for e in eps]))}
    return {"mean_cores": float(np.mean([v["mean_cores"] for v in per_level.values()])),
            "violation_rate": float(np.mean([v["violation_rate"] for v in per_level.values()])),
            "levels": per_level}


@dataclass
class BestCheckpoint:
    """The fewest mean cores at a violation rate ≤ max_violation, over a run's evaluations."""
    max_violation: float = 0.0
    steps: int | None = None
    result: dict | None = None
    actor: str | None = None
    history: list[dict] = field(default_factory=list)

    def offer(self, steps: int, result: dict, actor: str = "live") -> bool:
        """Record an evaluation; True when it is the new best (the caller saves that policy).
        `actor` names which weights were evaluated (the live actor, or its moving average)."""
        self.history.append({"steps": steps, "actor": actor, **result})
        if not np.isfinite(result["mean_cores"]) or result["violation_rate"] > self.max_violation:
            return False
        if self.result is not None and result["mean_cores"] >= self.result["mean_cores"]:
            return False
        self.steps, self.result, self.actor = steps, result, actor
        return True
