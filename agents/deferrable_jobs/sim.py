"""The deferrable-job scheduler as a plain NumPy simulator (§3 of the paper), shared by the
Gymnasium env, the heuristics, the agents' training, the experiment and the live path's tests.

Slot t:
  1. the decision sees `View`: C_t, the cores still running, and the running (B^his), eligible
     (B^cur: e_i <= t <= l_i, not started) and submitted-but-future (B^fut: g_i <= t < e_i) jobs;
  2. it picks eligible jobs to start (the caller guarantees they fit the free cores; the
     simulator refuses a pick that does not). A job runs uninterrupted for d_i slots;
  3. v_t = max(0, cores running at t - C_t): jobs started earlier overrun C_t when on-demand use
     grows, which is the risk the agent must price;
  4. reward (Eq. 6) = sum over started jobs of (c_i d_i - w1 (t - e_i)) - w2 v_t;
  5. eligible jobs whose latest start is t and that did not start are dropped (`missed`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .episode import Episode
from .rules import free_cores, slot_reward
from .settings import W_DELAY, W_VIOLATION


@dataclass
class View:
    t: int
    slots: int
    capacity: int                 # C_t
    running_cores: int            # cores of the jobs still running at t
    eligible: np.ndarray          # job rows, ordered by (latest start, submission)
    running: np.ndarray           # job rows
    future: np.ndarray            # job rows
    episode: Episode
    start: np.ndarray             # [J] start slot per job, -1 = not started (read-only)

    @property
    def free(self) -> float:
        return free_cores(self.capacity, self.running_cores)


@dataclass
class StepResult:
    started: np.ndarray           # job rows started at t
    utilisation: float            # sum c*d of the jobs started
    delay_penalty: float          # -w1 * sum of their delays
    violation_penalty: float      # -w2 * v_t
    violation: float              # v_t in cores
    missed: int                   # jobs dropped at the end of t

    @property
    def reward(self) -> float:
        return self.utilisation + self.delay_penalty + self.violation_penalty


@dataclass
class EpisodeResult:
    utilisation: float = 0.0
    delay_penalty: float = 0.0
    violation_penalty: float = 0.0
    violation_slots: int = 0
    started: int = 0
    missed: int = 0
    jobs: int = 0
    delay_slots: float = 0.0
    rewards: list[float] = field(default_factory=list)

    @property
    def total_reward(self) -> float:
        return self.utilisation + self.delay_penalty + self.violation_penalty

    def as_dict(self) -> dict:
        return {"total_reward": self.total_reward, "utilisation": self.utilisation,
                "delay_penalty": self.delay_penalty, "violation_penalty": self.violation_penalty,
                "violation_slots": self.violation_slots, "started": self.started, "missed": self.missed,
                "jobs": self.jobs, "mean_delay_slots": self.delay_slots / max(self.started, 1)}


class DeferrableSim:
    def __init__(self, episode: Episode, w_delay: float = W_DELAY, w_violation: float = W_VIOLATION):
        self.ep = episode
        self.w_delay = w_delay
        self.w_violation = w_violation
        self.T = episode.slots
        self.start = np.full(episode.n_jobs, -1, dtype=np.int64)
        self._start_seen = self.start.view()     # what the View shows: read-only, kept current
        self._start_seen.setflags(write=False)
        self.dropped = np.zeros(episode.n_jobs, dtype=bool)
        # cores running per slot, over the episode and the tail of jobs started near its end
        tail = int(episode.duration.max()) if episode.n_jobs else 0
        self.load = np.zeros(self.T + tail + 1, dtype=np.int64)
        self.t = 0
        self.result = EpisodeResult(jobs=episode.n_jobs)

    @property
    def done(self) -> bool:
        return self.t >= self.T

    def view(self) -> View:
        if self.done:  # there is no slot T to look at (capacity has T entries)
            raise RuntimeError("episode is over")
        ep, t = self.ep, self.t
        waiting = (self.start < 0) & ~self.dropped & (ep.submit <= t)
        elig = np.flatnonzero(waiting & (ep.earliest <= t) & (ep.latest >= t))
        if len(elig) > 1:
            elig = elig[np.lexsort((ep.submit[elig], ep.latest[elig]))]
        running = np.flatnonzero((self.start >= 0) & (self.start + ep.duration > t))
        future = np.flatnonzero(waiting & (ep.earliest > t))
        return View(t=t, slots=self.T, capacity=int(ep.capacity[t]), running_cores=int(self.load[t]),
                    eligible=elig, running=running, future=future, episode=ep, start=self._start_seen)

    def _job_rows(self, rows) -> np.ndarray:
        """The distinct job rows a decision names. Refused, not coerced: a negative row would wrap
        to another job, a float would be truncated and a boolean mask read as rows 0 and 1."""
        a = np.asarray(rows).reshape(-1)
        if a.size == 0:
            return np.zeros(0, dtype=np.int64)
        if not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"slot {self.t}: job rows must be integers, got {a.dtype} {a[:5].tolist()}")
        bad = (a < 0) | (a >= self.ep.n_jobs)
        if bad.any():
            raise ValueError(f"slot {self.t}: job rows {a[bad].tolist()} are outside 0..{self.ep.n_jobs - 1}")
        return np.unique(a.astype(np.int64))

    def step(self, rows) -> StepResult:
        """Start the given job rows at the current slot and advance one slot."""
        if self.done:
            raise RuntimeError("episode is over")
        ep, t = self.ep, self.t
        rows = self._job_rows(rows)
        if len(rows):
            ok = ((self.start[rows] < 0) & ~self.dropped[rows] & (ep.earliest[rows] <= t)
                  & (ep.latest[rows] >= t) & (ep.submit[rows] <= t))
            if not ok.all():
                raise ValueError(f"slot {t}: jobs {rows[~ok].tolist()} are not eligible")
            if ep.cores[rows].sum() > free_cores(ep.capacity[t], self.load[t]):
                raise ValueError(f"slot {t}: starts need {int(ep.cores[rows].sum())} cores, "
                                 f"{free_cores(ep.capacity[t], self.load[t]):g} are free")
            self.start[rows] = t
            for r in rows:
                self.load[t:t + ep.duration[r]] += ep.cores[r]
        violation = max(0.0, float(self.load[t] - ep.capacity[t]))
        util, dpen, vpen = slot_reward(ep.cores[rows], ep.duration[rows], t - ep.earliest[rows], violation,
                                       self.w_delay, self.w_violation)
        expiring = (self.start < 0) & ~self.dropped & (ep.latest <= t)
        missed = int(expiring.sum())
        self.dropped |= expiring
        res = self.result
        res.utilisation += util
        res.delay_penalty += dpen
        res.violation_penalty += vpen
        res.violation_slots += int(violation > 0)
        res.started += len(rows)
        res.missed += missed
        res.delay_slots += float(np.sum(t - ep.earliest[rows]))
        step = StepResult(started=rows, utilisation=util, delay_penalty=dpen, violation_penalty=vpen,
                          violation=violation, missed=missed)
        res.rewards.append(step.reward)
        self.t += 1
        return step


def run_episode(episode: Episode, decide, **sim_kw) -> EpisodeResult:
    """Run `decide(view) -> job rows to start` over a whole episode."""
    sim = DeferrableSim(episode, **sim_kw)
    while not sim.done:
        sim.step(decide(sim.view()))
    return sim.result
