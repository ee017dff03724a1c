"""Grid search of the heuristics' parameters on TRAINING episodes only (the issue: "parameters
tuned on training data only"), so that their test figures are an honest comparison.

The objective is the mean total reward (Eq. 6 summed over the episode) over the training episodes;
ties keep the first candidate in grid order, so the search is deterministic. The grids are ours
(the paper tunes nothing it reports): margins up to 0.3 of C_t, and Tetris's eps from pure packing
(0) to 256, where the remaining-work term dominates and Tetris starts the shortest job that fits. When
first tuned (20 training episodes of `default` and `tiny`), total reward fell with every step of
margin and, for Tetris, rose with eps up to 4 (tiny) or 16 (default); rerun the search when the
episodes change.
"""
from __future__ import annotations

import itertools
import numbers
from collections.abc import Mapping

import numpy as np

from . import data
from .baselines import RULES, make_rule
from .episode import Episode
from .settings import Setting
from .sim import EpisodeResult, run_episode

_MARGINS = (0.0, 0.05, 0.1, 0.2, 0.3)
#: the default grid of each rule (not given by the paper; our choice)
GRIDS: dict[str, dict[str, tuple]] = {
    "fifo": {"margin": _MARGINS},
    "sjf": {"margin": _MARGINS},
    "edf": {"margin": _MARGINS},
    "least-slack": {"margin": _MARGINS},
    "tetris": {"margin": _MARGINS, "eps": (0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 256.0)},
    "easy-backfill": {"margin": _MARGINS},
}


def candidates(grid) -> list[dict]:
    """A grid given as {param: values} (expanded in sorted-key product order) or as a list of
    parameter dicts (kept as given)."""
    if isinstance(grid, dict):
        keys = sorted(grid)
        for k in keys:
            # one value given bare: a number failed in itertools ("'float' object is not iterable")
            # and a string was searched character by character
            if isinstance(grid[k], (str, bytes, dict)) or not hasattr(grid[k], "__iter__"):
                raise ValueError(f"grid: {k!r} needs a list of values to search, got {grid[k]!r}")
        return [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]
    grid = list(grid)
    bad = next((p for p in grid if not isinstance(p, Mapping)), None)
    if bad is not None:     # [0.1, 0.2] failed in dict() with "'float' object is not iterable"
        raise ValueError(f"grid: a list grid holds parameter dicts like {{'margin': 0.1}}, got {bad!r}")
    return [dict(p) for p in grid]


def _check_episodes(episodes) -> None:
    """Zero episodes scored every candidate NaN, and the first one was returned as the best."""
    if isinstance(episodes, bool) or not isinstance(episodes, numbers.Integral) or episodes < 1:
        raise ValueError(f"tuning needs at least 1 training episode, got {episodes!r}")


def evaluate_rule(name: str, params: dict, episodes: list[Episode]) -> list[EpisodeResult]:
    """Run the heuristic with these parameters over each episode."""
    rule = make_rule(name, **params)
    return [run_episode(ep, rule) for ep in episodes]


def _search(name: str, train: list[Episode], grid) -> tuple[dict, list[dict]]:
    table = []
    for params in candidates(grid if grid is not None else GRIDS[name]):
        rewards = np.array([r.total_reward for r in evaluate_rule(name, params, train)])
        table.append({"params": params, "mean_total_reward": float(rewards.mean()),
                      "std_total_reward": float(rewards.std())})
    if not table:
        raise ValueError(f"{name}: empty grid")
    best = max(range(len(table)), key=lambda i: (table[i]["mean_total_reward"], -i))
    return dict(table[best]["params"]), table


def tune_rule(name: str, setting: str | Setting, episodes: int = 20, seed: int = 0,
              grid=None) -> tuple[dict, list[dict]]:
    """(best parameters, table of {params, mean_total_reward, std_total_reward} per candidate)
    over `data.episodes(setting, "train", episodes, seed)`."""
    if name not in RULES:
        raise ValueError(f"unknown deferrable-jobs heuristic {name!r}; choose from {list(RULES)}")
    _check_episodes(episodes)
    return _search(name, data.episodes(setting, "train", episodes, seed), grid)


def tune_all(setting: str | Setting, episodes: int = 20, seed: int = 0) -> dict[str, dict]:
    """{rule: best parameters} for every heuristic, on one shared set of training episodes."""
    _check_episodes(episodes)
    train = data.episodes(setting, "train", episodes, seed)
    return {name: _search(name, train, None)[0] for name in RULES}
