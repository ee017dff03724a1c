"""Heuristic schedulers for the deferrable-jobs problem: what a slot's `View` shows -> the job rows
to start now. Each is a decide function for `sim.run_episode`, built by `make_rule(name, **params)`.

The paper compares with FIFO, SJF and Tetris (Grandl et al., SIGCOMM 2014) without spelling out
their rules (osdec-deferrable-scheduling.txt L199); we add EDF, least slack and EASY backfilling.
Every rule is a pure function of the View: it keeps no state between slots (EASY recomputes its
reservation every slot from the running jobs' known remaining durations).

Rules (ties always fall back to submission order, then row):
* fifo: eligible jobs by submission (tie: earliest start), started by `rules.order_select` up to the
  first misfit: head-of-line blocking, like the paper's prefix action mapping (§4.1.2).
* sjf: shortest duration first, same prefix rule.
* edf: earliest LATEST START first, same prefix rule. A job's deadline here is the last slot it may
  start in (l_i); past it the job is dropped.
* least-slack: slack = l_i - t, the slots a job can still wait. The classic slack (deadline - now -
  remaining work) needs a completion deadline; with a start-time window the work term drops out, so
  ranking by slack equals ranking by l_i and least slack differs from EDF only in its tie-break:
  among jobs with the same slack the LONGEST goes first (it carries the most revenue c*d per core,
  and a long job that waits also blocks the longest later), where EDF keeps submission order.
* tetris: Grandl et al.'s packing score, the alignment = dot(demand, free resources), both
  normalised by the capacity; with cores our only resource that is (c_i / C_t) * (free / C_t). Their
  shortest-remaining-work term is added with a weight scaled by the mean alignment so that the two
  terms are comparable: score_i = a_i - eps * mean(a) * d_i / mean(d). We use the job's duration as
  its remaining work because the cores are already in the alignment (our reading; eps = 0 is pure
  packing, i.e. most cores first). Greedy: start the best-scoring job that FITS, recompute the free
  cores and the scores, repeat until none fits. Tetris packs: it passes over misfits.
* easy-backfill: FIFO head-of-line; when the head does not fit, it gets a reservation at the
  earliest slot at which enough running jobs have finished (assuming capacity stays at C_t), and
  later jobs start now if they fit AND do not delay that reservation: they finish by the reserved
  slot, or fit in the cores spare at it. A head that would not fit even with every running job
  finished gets no reservation (nothing can be reserved for it under C_t) and is passed over; the
  next job becomes the head. Only one reservation per slot, as in EASY.

Every rule takes `margin` in [0, 0.5]: it uses only free - margin * C_t cores, holding back headroom
for capacity drops (a drop below the running cores costs w2 = 10 per core-slot, Table 3, against a
revenue of 1 per core-slot). Not given by the paper; our choice, tuned on training episodes
(`tuning.py`). Tetris also has `eps`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agents.params import number_param

from .rules import order_select
from .sim import View

RULES = ("fifo", "sjf", "tetris", "edf", "least-slack", "easy-backfill")

MARGIN_MAX = 0.5
#: each rule's parameters and their defaults (our choices; `tuning.GRIDS` searches them)
PARAM_DEFAULTS: dict[str, dict[str, float]] = {
    "fifo": {"margin": 0.0},
    "sjf": {"margin": 0.0},
    "edf": {"margin": 0.0},
    "least-slack": {"margin": 0.0},
    "tetris": {"margin": 0.0, "eps": 1.0},
    "easy-backfill": {"margin": 0.0},
}

_NONE = np.zeros(0, dtype=np.int64)


def usable_cores(view: View, margin: float) -> float:
    """The cores a rule may fill this slot: the free cores less the headroom margin * C_t."""
    return view.free - margin * view.capacity


def _fifo_order(view: View, rows: np.ndarray) -> np.ndarray:
    ep = view.episode
    return rows[np.lexsort((rows, ep.earliest[rows], ep.submit[rows]))]


def _ordered(name: str, view: View) -> np.ndarray:
    """The eligible rows in the priority order of a prefix rule."""
    ep, rows = view.episode, np.asarray(view.eligible, dtype=np.int64)
    base = _fifo_order(view, rows)    # submission order is every rule's final tie-break
    if name == "fifo":
        return base
    if name == "sjf":
        key = (ep.duration[base],)
    elif name == "edf":
        key = (ep.latest[base],)
    elif name == "least-slack":
        key = (-ep.duration[base], ep.latest[base] - view.t)
    else:
        raise ValueError(f"{name!r} is not a prefix rule")
    # a stable sort on the keys keeps submission order among equals
    return base[np.lexsort((np.arange(len(base)),) + key)]


def _prefix(name: str, view: View, margin: float) -> np.ndarray:
    rows = _ordered(name, view)
    picked = order_select(np.arange(len(rows)), view.episode.cores[rows], usable_cores(view, margin))
    return rows[picked]


def _tetris(view: View, margin: float, eps: float) -> np.ndarray:
    ep = view.episode
    rows = _fifo_order(view, np.asarray(view.eligible, dtype=np.int64))
    cores = ep.cores[rows].astype(np.float64)
    dur = ep.duration[rows].astype(np.float64)
    cap = max(float(view.capacity), 1.0)
    left = usable_cores(view, margin)
    open_ = np.ones(len(rows), dtype=bool)
    chosen = []
    while True:
        fit = np.flatnonzero(open_ & (cores <= left))
        if len(fit) == 0:
            break
        align = (cores[fit] / cap) * (left / cap)
        score = align - eps * align.mean() * dur[fit] / dur[fit].mean()
        best = fit[int(np.argmax(score))]     # first maximum: submission order breaks ties
        chosen.append(rows[best])
        open_[best] = False
        left -= cores[best]
    return np.asarray(chosen, dtype=np.int64)


def _reservation(need: float, left: float, ends: np.ndarray, end_cores: np.ndarray):
    """(slot, spare cores then) of the earliest slot at which `need` cores are free, counting the
    cores released by jobs ending at `ends`; None if they never are under the current capacity."""
    if need <= left:
        raise ValueError("a job that fits now needs no reservation")
    order = np.argsort(ends, kind="stable")
    ends, freed = ends[order], left + np.cumsum(end_cores[order])
    ok = np.flatnonzero(freed >= need)
    if len(ok) == 0:
        return None
    k = ok[0]
    # jobs ending in the same slot all free their cores by then
    k = np.flatnonzero(ends == ends[k])[-1]
    return int(ends[k]), float(freed[k] - need)


def _easy_backfill(view: View, margin: float) -> np.ndarray:
    ep, t = view.episode, view.t
    queue = _fifo_order(view, np.asarray(view.eligible, dtype=np.int64))
    left = usable_cores(view, margin)
    running = np.asarray(view.running, dtype=np.int64)
    ends = list(view.start[running] + ep.duration[running])
    end_cores = list(ep.cores[running])
    chosen: list[int] = []
    for pos, head in enumerate(queue):
        if ep.cores[head] <= left:
            chosen.append(int(head))
            left -= ep.cores[head]
            ends.append(t + ep.duration[head])
            end_cores.append(ep.cores[head])
            continue
        res = _reservation(float(ep.cores[head]), left, np.asarray(ends, dtype=np.int64),
                           np.asarray(end_cores, dtype=np.float64))
        if res is None:
            continue          # cannot be served under C_t: no reservation, the next job is the head
        shadow, spare = res
        for job in queue[pos + 1:]:
            c, finish = ep.cores[job], t + ep.duration[job]
            if c > left:
                continue
            if finish <= shadow:
                chosen.append(int(job))
                left -= c
            elif c <= spare:
                chosen.append(int(job))
                left -= c
                spare -= c    # still running at the reservation: uses its spare cores
        break
    return np.asarray(chosen, dtype=np.int64)


@dataclass(frozen=True)
class HeuristicRule:
    """A decide function for `sim.run_episode` (`rule(view) -> job rows to start`)."""
    name: str
    margin: float = 0.0
    eps: float = 1.0          # tetris only

    def __call__(self, view: View) -> np.ndarray:
        if len(view.eligible) == 0 or usable_cores(view, self.margin) < 1:
            return _NONE
        if self.name == "tetris":
            return _tetris(view, self.margin, self.eps)
        if self.name == "easy-backfill":
            return _easy_backfill(view, self.margin)
        return _prefix(self.name, view, self.margin)

    @property
    def params(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in PARAM_DEFAULTS[self.name]}


def make_rule(name: str, **params) -> HeuristicRule:
    """The heuristic `name` (one of RULES) with the given parameters (see PARAM_DEFAULTS)."""
    if name not in PARAM_DEFAULTS:
        raise ValueError(f"unknown deferrable-jobs heuristic {name!r}; choose from {list(RULES)}")
    unknown = set(params) - set(PARAM_DEFAULTS[name])
    if unknown:
        raise ValueError(f"{name}: unknown parameters {sorted(unknown)}; it takes {sorted(PARAM_DEFAULTS[name])}")
    merged = {**PARAM_DEFAULTS[name], **params}
    # finite numbers naming the rule and the key: a NaN or infinite eps scored every job alike
    # (Tetris became first-fit in silence), and "abc" gave float()'s error without the key
    margin = number_param(name, "margin", merged["margin"], low=0.0, high=MARGIN_MAX)
    eps = number_param(name, "eps", merged.get("eps", 1.0), low=0.0)
    return HeuristicRule(name=name, margin=margin, eps=eps)
