"""The best static allocation found by search on the simulator: for one application and one user
level, the cheapest fixed vector of cores whose QoS-violation rate over a few seeds (the paper's
protocol: 60 s warm-up at the caps, then 300 control seconds) is at most `max_violation`.

**An oracle per load level.** The search knows the user count and runs the simulator at it; no
online method has that knowledge. It bounds what a fixed allocation can do at a known, constant
load, and is the yardstick a dynamic method has to approach (at a constant load a dynamic method
can still beat it only by reacting to the noise of each second).

The search, in three steps:

1. **Measure** each service's mean CPU use u_i at that load with every service at its cap
   (`measure_s` seconds after the warm-up, on the search seeds).
2. **Common multiplier with a floor.** cores_i(m, f) = clip(max(m * u_i, f), MIN_CORES, cap_i).
   For each floor f in `floors` (cores; the floor matters because a limit below one core also slows
   every call of the service, not only its queue), the smallest feasible m is found by bisection
   on log m between `m_low` (0.5) and the multiplier that reaches every cap; the cheapest (m, f)
   is kept.
3. **Coordinate descent.** Services in order of decreasing cores, each tried at `shrink` times its
   cores; a step is kept if the vector stays feasible. Rounds repeat until one changes nothing or
   `descent_rounds` is reached.

Feasible = mean violation rate over `seeds` <= max_violation. The seeds of the search are not the
evaluation's, and a search fits its own seeds' noise: with the issue's 1 % as the search target,
the vectors found violated 0.6–1.9 % of the seconds on seeds 1–3 (Hotel and Social, 3 loads each;
5 of the 6 above 1 %). The default target is therefore 0.5 % on the search seeds: the vectors
then violate 0.3–0.8 % on seeds 1–3 and 0.3–1.2 % on seeds 4–5, for about the same cores (−3 to
+5 %). If even the caps are infeasible, the caps are returned and `StaticSearchResult.feasible`
is False.

Cost: 58–87 distinct simulator evaluations of 3 seeds x 360 s per load level, 27–67 s on this
2-core machine (Hotel, Social).
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from agents.params import number_param

from .control import MIN_CORES
from .episode import EPISODE_S, WARMUP_S, StaticController, run_episodes
from .topology import Topology


@dataclass(frozen=True)
class StaticSearchParams:
    max_violation: float = 0.005                      # on the search seeds (the 1 %, halved: see above)
    seeds: tuple[int, ...] = (1001, 1002, 1003)       # search seeds (not the evaluation's)
    steps: int = EPISODE_S                            # control seconds per evaluation
    warmup: int = WARMUP_S
    measure_s: int = 60                               # seconds at caps to measure mean use
    floors: tuple[float, ...] = (0.0, 0.05, 0.1)      # per-service floors tried (cores)
    m_low: float = 0.5                                # the bisection's lower end (x mean use)
    rel_tol: float = 0.02                             # bisection stops when hi / lo < 1 + rel_tol
    descent_rounds: int = 2
    shrink: float = 0.85

    def __post_init__(self):
        """Each field within its meaning, naming it: a rel_tol <= 0 never ended the bisection (it
        spun forever on cached vectors), an m_low of 0 divided by zero, and an empty seed list had
        no violation rate to compare."""
        kind = "static-search"
        number_param(kind, "max_violation", self.max_violation, low=0, high=1)
        if isinstance(self.seeds, (str, bytes)) or not hasattr(self.seeds, "__len__") or not len(self.seeds):
            raise ValueError(f"{kind}: seeds must be a non-empty list of seeds, got {self.seeds!r}")
        for i, seed in enumerate(self.seeds):
            # NumPy's own refusal ("expected non-negative integer") came from deep in the first run
            if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
                raise ValueError(f"{kind}: seeds[{i}] must be a whole number >= 0, got {seed!r}")
        number_param(kind, "steps", self.steps, low=1, whole=True)
        # run_episodes needs a warm-up second for the first decision to see (it refused 0 only later)
        number_param(kind, "warmup", self.warmup, low=1, whole=True)
        number_param(kind, "measure_s", self.measure_s, low=1, whole=True)
        if isinstance(self.floors, (str, bytes)) or not hasattr(self.floors, "__len__") or not len(self.floors):
            # with no floor to try nothing was searched, and the caps came back marked feasible
            raise ValueError(f"{kind}: floors must be a non-empty list of cores, got {self.floors!r}")
        for i, f in enumerate(self.floors):
            number_param(kind, f"floors[{i}]", f, low=0)
        number_param(kind, "m_low", self.m_low, low=0, low_open=True)
        number_param(kind, "rel_tol", self.rel_tol, low=0, low_open=True)
        number_param(kind, "descent_rounds", self.descent_rounds, low=0, whole=True)
        number_param(kind, "shrink", self.shrink, low=0, low_open=True, high=1)


@dataclass
class StaticSearchResult:
    app: str
    users: float
    cores: np.ndarray                 # the vector found (M,)
    mean_use: np.ndarray              # u_i measured at caps (M,)
    multiplier: float
    floor: float
    violation_rate: float             # on the search seeds
    feasible: bool
    evaluations: int                  # simulator evaluations (distinct vectors)
    seconds: float
    history: list = field(default_factory=list)   # (stage, total cores, violation rate) per evaluation

    @property
    def total_cores(self) -> float:
        return float(self.cores.sum())

    def controller(self, name: str = "static-search") -> StaticController:
        return StaticController(self.cores, name=name)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["cores"] = self.cores.tolist()
        d["mean_use"] = self.mean_use.tolist()
        return d


def measure_mean_use(topo: Topology, users: float, seeds, measure_s: int = 60,
                     warmup: int = WARMUP_S) -> np.ndarray:
    """Mean cores used per service at `users` with every service at its cap."""
    res = run_episodes(topo, lambda i: StaticController.maximum(topo), users, seeds,
                       steps=measure_s, warmup=warmup)
    return np.mean([r.used.mean(axis=0) for r in res], axis=0)


def violation_rate(topo: Topology, cores, users: float, seeds, steps: int = EPISODE_S,
                   warmup: int = WARMUP_S) -> float:
    """Mean QoS-violation rate of a fixed allocation over `seeds`."""
    cores = np.asarray(cores, dtype=np.float64)
    res = run_episodes(topo, lambda i: StaticController(cores), users, seeds, steps=steps, warmup=warmup)
    return float(np.mean([r.violation_rate for r in res]))


def search_static(topo: Topology, users: float, params: StaticSearchParams | None = None) -> StaticSearchResult:
    p = params or StaticSearchParams()
    t0 = time.time()
    caps = topo.caps
    seeds = list(p.seeds)
    history: list = []

    cache: dict[tuple, float] = {}

    def rate(v: np.ndarray, stage: str) -> float:
        key = tuple(np.round(v, 6))
        if key not in cache:       # floors that bind nowhere give the same vectors: run each once
            cache[key] = violation_rate(topo, v, users, seeds, steps=p.steps, warmup=p.warmup)
            history.append((stage, float(v.sum()), cache[key]))
        return cache[key]

    def vec(m: float, f: float) -> np.ndarray:
        return np.clip(np.maximum(m * use, f), MIN_CORES, caps)

    use = measure_mean_use(topo, users, seeds, measure_s=p.measure_s, warmup=p.warmup)
    use = np.maximum(use, 1e-6)
    r_caps = rate(caps.copy(), "caps")
    if r_caps > p.max_violation:
        return StaticSearchResult(topo.name, float(users), caps.copy(), use, float("nan"), float("nan"),
                                  r_caps, False, len(history), time.time() - t0, history)

    m_top = float(np.max(caps / use))
    best: tuple[float, float, float, float] | None = None     # (total, m, f, rate)
    for f in p.floors:
        lo, hi = p.m_low, m_top
        r_lo = rate(vec(lo, f), f"bisect f={f}")
        if r_lo <= p.max_violation:
            hi, r_hi = lo, r_lo
        else:
            r_hi = r_caps if np.allclose(vec(hi, f), caps) else rate(vec(hi, f), f"bisect f={f}")
            if r_hi > p.max_violation:
                continue
            while hi / lo > 1.0 + p.rel_tol:
                mid = math.sqrt(lo * hi)
                if not lo < mid < hi:      # adjacent floats (a tiny rel_tol): no narrower bracket
                    break
                r_mid = rate(vec(mid, f), f"bisect f={f}")
                if r_mid <= p.max_violation:
                    hi, r_hi = mid, r_mid
                else:
                    lo = mid
        total = float(vec(hi, f).sum())
        if best is None or total < best[0]:
            best = (total, hi, f, r_hi)
    if best is None:           # only the caps are feasible
        return StaticSearchResult(topo.name, float(users), caps.copy(), use, m_top, 0.0, r_caps, True,
                                  len(history), time.time() - t0, history)
    _, m_best, f_best, r_best = best
    cores = vec(m_best, f_best)
    for _ in range(p.descent_rounds):
        changed = False
        for i in np.argsort(-cores):
            trial = cores.copy()
            trial[i] = max(MIN_CORES, trial[i] * p.shrink)
            if trial[i] >= cores[i]:
                continue
            r = rate(trial, "descent")
            if r <= p.max_violation:
                cores, r_best, changed = trial, r, True
        if not changed:
            break
    return StaticSearchResult(topo.name, float(users), cores, use, float(m_best), float(f_best), float(r_best),
                              True, len(history), time.time() - t0, history)
