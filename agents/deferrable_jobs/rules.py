"""The pure decision rules of the formulation, shared by the simulator, the heuristics, the
agents and the live scheduling loop.

`prefix_select` is the paper's action mapping (§4.1.2): sort the eligible jobs by confidence
score, highest first (the text prints "cs(i) <= cs(j) for i < j", which we read as a typo: the
highest-confidence job must come first for the score to mean confidence), and start the longest
prefix whose cores fit the capacity limit. Jobs after the first misfit are not considered, so a
policy can hold capacity back by ranking a job that does not fit first.
"""
from __future__ import annotations

import numpy as np

from .settings import W_DELAY, W_VIOLATION


def free_cores(capacity: float, running_cores: float) -> float:
    """The capacity limit a slot's starts must fit: C_t minus the cores of the jobs still running."""
    return float(capacity) - float(running_cores)


def prefix_select(scores: np.ndarray, cores: np.ndarray, free: float) -> np.ndarray:
    """Indices (into `scores`/`cores`) of the jobs to start: the longest prefix of the jobs sorted
    by score, highest first, whose cores sum to at most `free`. Ties keep the given order, so
    a heuristic's order is its tie-break. NaN scores rank last."""
    scores = np.asarray(scores, dtype=np.float64)
    cores = np.asarray(cores)
    if scores.shape != cores.shape:
        raise ValueError(f"scores has shape {scores.shape}, cores {cores.shape}")
    if scores.size == 0 or free < 1:
        return np.zeros(0, dtype=np.int64)
    key = np.where(np.isnan(scores), -np.inf, scores)
    order = np.argsort(-key, kind="stable")
    fits = np.cumsum(cores[order]) <= free
    k = int(np.argmin(fits)) if not fits.all() else len(order)
    return order[:k]


MAPPINGS = ("prefix", "skip")


def select_by_scores(scores: np.ndarray, cores: np.ndarray, free: float, mapping: str = "prefix") -> np.ndarray:
    """The action mapping: "prefix" is the paper's (`prefix_select`). "skip" is ours: jobs with
    a score below 0 wait, the others start highest score first, passing over a job that does not
    fit and packing on (as Tetris does). Under "prefix" a static order cannot skip a job that
    stops fitting after the jobs before it started; on our episodes the best static order
    ("fits, then shortest") scored 1.6 % under Tetris (docs/deferrable-jobs.md)."""
    if mapping == "prefix":
        return prefix_select(scores, cores, free)
    if mapping != "skip":
        raise ValueError(f"unknown action mapping {mapping!r}; choose from {MAPPINGS}")
    scores = np.asarray(scores, dtype=np.float64)
    key = np.where(np.isnan(scores), -np.inf, scores)
    order = np.argsort(-key, kind="stable")
    order = order[key[order] >= 0.0]
    return order_select(order, np.asarray(cores), free, skip_misfits=True)


def order_select(order: np.ndarray, cores: np.ndarray, free: float, skip_misfits: bool = False) -> np.ndarray:
    """Start jobs in the given order (indices into `cores`) while they fit: stop at the first
    misfit (the prefix rule) or, with `skip_misfits`, pass over it and keep packing (Tetris-like
    and backfilling rules)."""
    chosen = []
    left = float(free)
    for i in order:
        c = cores[i]
        if c <= left:
            chosen.append(int(i))
            left -= c
        elif not skip_misfits:
            break
    return np.asarray(chosen, dtype=np.int64)


def slot_reward(cores: np.ndarray, duration: np.ndarray, delay: np.ndarray, violation: float,
                w_delay: float = W_DELAY, w_violation: float = W_VIOLATION) -> tuple[float, float, float]:
    """Eq. 6 for one slot: (utilisation, delay penalty, violation penalty); the reward is their sum.
    Utilisation = sum of c*d over the jobs started, delay = -w1 * sum(t - e), violation = -w2 * v_t."""
    util = float(np.sum(np.asarray(cores) * np.asarray(duration)))
    dpen = -w_delay * float(np.sum(delay))
    vpen = -w_violation * float(violation)
    return util, dpen, vpen
