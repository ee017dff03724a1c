"""The live scheduling loop of the deferrable-jobs problem: each slot, which queued jobs start on
the fleet's leftover cores.

    tick(slot, C_t):
      1. read the deferrable jobs of the durable queue at `slot` (samm/testbed/jobqueue.py):
         eligible, running (released, with the slots they have left) and future;
      2. ask the hosted agent (`ScheduleRequest`): in process through `service.schedule`, with a
         SummaryHistory kept by the loop, or over HTTP from a `samm serve` URL. A failed call
         (HTTP error, timeout, a policy exception) starts nothing this slot and is recorded;
      3. the DEADLINE GUARD (`deadline_guard`): an eligible job whose latest start is this slot
         and that the agent did not pick starts too if it still fits the cores left, earliest
         deadline first, skipping misfits (reason "deadline"). Without it such a job is dropped
         at the end of the slot although it could have run. Not in the paper (the agent alone
         decides there); our safety net. It does not run when the call failed: "start nothing";
      4. record ONE decision for the slot in the KnowledgeStore (loop name, problem
         "deferrable-jobs", key `slot<t>`) BEFORE releasing, then release the jobs in the queue.
         Replaying a slot after a crash finds the decision and re-applies ITS job list, and the
         queue releases a job at most once: nothing starts twice, nothing decided is lost;
      5. drop the jobs whose latest start is this slot and that did not start, and send per-slot
         counters (released, deadline-rescued, dropped, violation, error) to Graphite when given
         a sender.

Accounting follows the simulator (sim.py): a released job holds its cores from its release slot
for `duration` slots, whatever its worker is doing (the schedule reserved them), and the
violation v_t = max(0, cores running at t - C_t). `slot_decision` is the pure part (request ->
jobs to start), shared with `simulate`, which replays an Episode through the same steps so a
live run can be compared with the simulator job for job.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Protocol

import numpy as np

from .episode import Episode
from .features import SummaryHistory
from .service import MAX_JOBS, RunningJob, ScheduleRequest, WaitingJob, schedule
from .sim import DeferrableSim, EpisodeResult

log = logging.getLogger(__name__)

PROBLEM = "deferrable-jobs"


# ---------------------------------------------------------------------------------- pure steps
def deadline_guard(eligible: Iterable, chosen: Iterable, slot: int, free: float) -> list:
    """Ids of the eligible jobs whose latest start is `slot` (or earlier), not in `chosen`, that
    still fit `free` (the cores left after the chosen ones): earliest deadline first (then
    submission, then id), skipping misfits. `eligible`: objects with id, cores, latest and
    submitted (WaitingJob or the queue's DeferrableJob)."""
    picked = {str(c) for c in chosen}
    due = [j for j in eligible if j.latest <= slot and str(j.id) not in picked]
    due.sort(key=lambda j: (j.latest, j.submitted if j.submitted is not None else j.earliest, str(j.id)))
    out, left = [], float(free)
    for j in due:
        if j.cores <= left:
            out.append(j.id)
            left -= j.cores
    return out


@dataclass
class Answer:
    """What the agent answered for one slot (start = [] and an error when the call failed)."""
    start: list
    scores: dict = field(default_factory=dict)
    version: str | None = None
    error: str | None = None
    latency_ms: float = 0.0


class Agent(Protocol):
    name: str

    def ask(self, req: ScheduleRequest) -> Answer: ...


class InProcessAgent:
    """A hosted policy called in this process, through the same `service.schedule` as the REST
    route; the loop keeps its SummaryHistory (the service keeps one per session)."""

    def __init__(self, policy, name: str | None = None):
        self.policy = policy
        self.name = name or getattr(policy, "kind", "agent")
        self.history = SummaryHistory()

    def ask(self, req: ScheduleRequest) -> Answer:
        t0 = time.perf_counter()
        try:
            start, scores, _ = schedule(self.policy, req, self.history)
        except Exception as e:  # noqa: BLE001 - a failed policy is "start nothing", recorded
            return Answer([], error=f"agent {self.name!r} failed: {type(e).__name__}: {e}",
                          latency_ms=(time.perf_counter() - t0) * 1000)
        return Answer(list(start), scores, getattr(self.policy, "version", None),
                      latency_ms=(time.perf_counter() - t0) * 1000)

    def remember(self, requests: Iterable[ScheduleRequest]) -> None:
        """Rebuild the window from the requests of slots decided before a restart, oldest first,
        as `ask` would have pushed them (over HTTP the service keeps the window itself)."""
        from .service import remember

        for req in requests:
            remember(self.policy, req, self.history)


class HttpAgent:
    """`POST {url}/v1/agents/{name}/schedule` of a `samm serve`; an HTTP error, a timeout or a
    malformed answer is an Answer with an error and nothing to start."""

    def __init__(self, url: str, name: str, timeout_s: float = 2.0, session=None):
        import requests

        if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"the request timeout must be a finite number of seconds > 0, got {timeout_s!r}")
        self.url = url.rstrip("/")
        self.name = name
        self.timeout_s = timeout_s
        self.http = session or requests.Session()

    def ask(self, req: ScheduleRequest) -> Answer:
        import requests

        endpoint = f"{self.url}/v1/agents/{self.name}/schedule"
        t0 = time.perf_counter()

        def failed(msg: str) -> Answer:
            return Answer([], error=msg, latency_ms=(time.perf_counter() - t0) * 1000)

        try:
            r = self.http.post(endpoint, json=req.model_dump(), timeout=self.timeout_s)
        except (requests.RequestException, ValueError) as e:  # ValueError: e.g. a URL requests cannot use
            return failed(f"POST {endpoint} failed: {type(e).__name__}: {e}")
        if r.status_code != 200:
            return failed(f"POST {endpoint} answered HTTP {r.status_code}: {r.text[:300]}")
        try:
            body = r.json()
        except ValueError as e:
            return failed(f"POST {endpoint} returned a malformed answer: {e}")
        # the shape of ScheduleResponse, checked before anything is acted on: a string "12" as
        # `start` would otherwise be read as the jobs "1" and "2"
        start = body.get("start") if isinstance(body, dict) else None
        scores = body.get("scores") if isinstance(body, dict) else None
        version = body.get("policy_version") if isinstance(body, dict) else None
        if (not isinstance(start, list) or not all(isinstance(x, (int, str)) and not isinstance(x, bool) for x in start)
                or not isinstance(scores, (dict, type(None))) or not isinstance(version, (str, type(None)))):
            return failed(f"POST {endpoint} returned a malformed answer (expected {{'start': [job ids], 'scores': "
                          f"{{id: score}}, 'policy_version': str}}): {r.text[:300]}")
        return Answer(list(start), scores or {}, version, latency_ms=(time.perf_counter() - t0) * 1000)


def build_request(slot: int, capacity: float, eligible, running, future, session: str) -> ScheduleRequest:
    """The request of one slot from job records with id, cores, duration, earliest, latest,
    submitted (waiting) and `remaining(slot)` (running)."""
    return ScheduleRequest(
        slot=int(slot), capacity=float(capacity), session=session,
        eligible=[WaitingJob(id=int(j.id), cores=int(j.cores), duration=int(j.duration), earliest=int(j.earliest),
                             latest=int(j.latest), submitted=int(j.submitted)) for j in eligible],
        running=[RunningJob(id=int(j.id), cores=int(j.cores), remaining=int(j.remaining(slot)),
                            duration=int(j.duration)) for j in running],
        future=[WaitingJob(id=int(j.id), cores=int(j.cores), duration=int(j.duration), earliest=int(j.earliest),
                           latest=int(j.latest), submitted=int(j.submitted)) for j in future])


def checked_request(slot: int, capacity: float, eligible, running, future,
                    session: str) -> tuple[ScheduleRequest, dict, float, list[str]]:
    """`build_request` over job records read from a queue, which may hold rows the request model
    refuses (cores or durations out of range, a window that does not hold the slot: written by
    another tool, or by hand). Such a waiting job is left out of the request (it cannot start; it
    is dropped at its latest start like any other) instead of failing the whole slot; a running
    one that cannot be shown keeps its cores: they are taken off the capacity the agent sees
    (all of it when they cannot be read). A list longer than the request allows (MAX_JOBS) is cut
    the same way: the eligible jobs with the earliest latest start are shown, the future ones with
    the earliest start, and the running ones left out keep their cores. Returns (request, {job id:
    why left out}, cores hidden, notes on what was cut)."""
    t = int(slot)
    bad: dict = {}
    hidden = 0.0
    notes: list[str] = []

    def waiting(j, is_future: bool):
        w = WaitingJob(id=int(j.id), cores=int(j.cores), duration=int(j.duration), earliest=int(j.earliest),
                       latest=int(j.latest), submitted=int(j.submitted))
        ok = (w.submitted <= t < w.earliest <= w.latest) if is_future else (w.submitted <= w.earliest <= t <= w.latest)
        if not ok:
            raise ValueError(f"window submitted {w.submitted}, earliest {w.earliest}, latest {w.latest} does not fit "
                             f"slot {t}")
        return w

    def keep(jobs, make):
        out = []
        for j in jobs:
            try:
                out.append(make(j))
            except (ValueError, TypeError, OverflowError) as e:  # pydantic's ValidationError is a ValueError
                bad[getattr(j, "id", None)] = " ".join(str(e).split())[:200]
        return out

    el = keep(eligible, lambda j: waiting(j, False))
    fu = keep(future, lambda j: waiting(j, True))
    if len(el) > MAX_JOBS:  # the most urgent first, then back in the caller's (id) order
        order = {id(w): i for i, w in enumerate(el)}
        over = len(el) - MAX_JOBS
        el = sorted(sorted(el, key=lambda w: (w.latest, w.submitted, order[id(w)]))[:MAX_JOBS],
                    key=lambda w: order[id(w)])
        notes.append(f"{over} eligible job(s) past the request's limit of {MAX_JOBS} "
                     "not shown this slot (the earliest latest starts are)")
    if len(fu) > MAX_JOBS:
        order = {id(w): i for i, w in enumerate(fu)}
        fu = sorted(sorted(fu, key=lambda w: (w.earliest, order[id(w)]))[:MAX_JOBS], key=lambda w: order[id(w)])
    ru = []
    for j in running:
        try:
            ru.append(RunningJob(id=int(j.id), cores=int(j.cores), remaining=int(j.remaining(t)),
                                 duration=int(j.duration)))
        except (ValueError, TypeError, OverflowError) as e:
            bad[getattr(j, "id", None)] = "running: " + " ".join(str(e).split())[:200]
            try:
                hidden += max(0.0, float(j.cores))
            except (ValueError, TypeError):
                hidden = float("inf")
    if len(ru) > MAX_JOBS:
        hidden += sum(r.cores for r in ru[MAX_JOBS:])
        notes.append(f"{len(ru) - MAX_JOBS} running job(s) past the request's limit of {MAX_JOBS} shown as capacity "
                     "used instead")
        ru = ru[:MAX_JOBS]
    cap = float(capacity)
    shown = max(0.0, cap - hidden) if hidden != float("inf") else 0.0
    req = ScheduleRequest(slot=t, capacity=shown, session=session, eligible=el, running=ru, future=fu)
    return req, bad, hidden, notes


@dataclass
class SlotDecision:
    chosen: list            # the agent's picks (fit the free cores)
    deadline: list          # added by the deadline guard
    free: float             # C_t - running cores, before the starts
    answer: Answer

    @property
    def start(self) -> list:
        return list(self.chosen) + list(self.deadline)


def slot_decision(req: ScheduleRequest, agent: Agent, guard: bool = True) -> SlotDecision:
    """The pure decision step: ask the agent, check its answer, add the deadline guard's jobs."""
    free = req.capacity - sum(j.cores for j in req.running)
    ans = agent.ask(req)
    by_id = {str(j.id): j for j in req.eligible}
    chosen = []
    if ans.error is None:
        seen = set()
        for x in ans.start:
            key = str(x)
            if key not in by_id or key in seen:
                ans.error = f"agent answered {x!r}, not an eligible job (or twice)"
                break
            seen.add(key)
            chosen.append(by_id[key].id)
        if ans.error is None and sum(by_id[str(c)].cores for c in chosen) > max(free, 0):
            ans.error = "agent answered jobs that do not fit the free cores"
        if ans.error is not None:
            chosen = []
    deadline = []
    if guard and ans.error is None:
        left = free - sum(by_id[str(c)].cores for c in chosen)
        deadline = deadline_guard(req.eligible, chosen, req.slot, left)
    return SlotDecision(chosen, deadline, free, ans)


# ---------------------------------------------------------------------------------- the loop
@dataclass
class SlotRecord:
    slot: int
    capacity: float
    free: float                      # before the starts
    eligible: int
    future: int
    running_cores: int               # before the starts
    chosen: list
    deadline: list
    released: list                   # released in the queue now (empty on a replayed slot)
    dropped: list
    dropped_cores: list              # cores of each dropped job (for "could it have fit?")
    free_after: float                # free cores left after the starts
    violation: float                 # max(0, running cores incl. the starts - C_t)
    utilisation: float               # sum c*d of the jobs started
    delay_slots: int                 # sum (t - e) of the jobs started
    source: str                      # agent | fallback
    error: str | None
    latency_ms: float
    decision_created: bool
    malformed: list = field(default_factory=list)  # queue rows left out of the request (see checked_request)

    def csv_row(self) -> dict:
        d = asdict(self)
        for k in ("chosen", "deadline", "released", "dropped", "dropped_cores", "malformed"):
            d[k] = " ".join(str(x) for x in d[k])
        d["error"] = d["error"] or ""
        return d


@dataclass
class LoopParams:
    """Not in the paper: testbed and platform choices."""
    loop: str = "deferrable"          # the KnowledgeStore's loop name
    session: str = "deferrable"       # the service's history session
    guard: bool = True                # the deadline guard
    dry_run: bool = False             # decide and record, release and drop nothing
    prefix: str = "samm"              # Graphite prefix: <prefix>.deferrable.<loop>.<counter>


class DeferrableLoop:
    """The scheduling loop over one job queue. `store`: a KnowledgeStore (or None: no records,
    tests only); `sender`: a GraphiteSender or None; `clock_of_slot(t)`: the workload clock
    (seconds) at slot t, stamped on drops."""

    def __init__(self, queue, agent: Agent, store=None, sender=None, params: LoopParams | None = None,
                 clock_of_slot: Callable[[int], float] | None = None):
        self.q, self.agent, self.store, self.sender = queue, agent, store, sender
        self.p = params or LoopParams()
        self.clock_of_slot = clock_of_slot
        self.records: list[SlotRecord] = []
        # (slot, job ids) while a recorded decision's release is under way: still set after tick()
        # raised, it tells the daemon the decision is recorded but maybe not applied
        self.releasing: tuple[int, list[int]] | None = None

    def tick(self, slot: int, capacity: float, note: str | None = None) -> SlotRecord:
        """One slot. `note`: why the capacity is a stand-in (e.g. no reading: 0 cores, so
        nothing starts), recorded as the decision's reason."""
        t = int(slot)
        self.releasing = None
        if not (isinstance(capacity, (int, float)) and math.isfinite(capacity) and capacity >= 0):
            bad = f"capacity {capacity!r} is not a finite number >= 0; starting nothing"
            note, capacity = (f"{note}; {bad}" if note else bad), 0.0
        snap = self.q.deferrable_at(t)
        req, malformed, _, cut = checked_request(t, capacity, snap.eligible, snap.running, snap.future,
                                                 self.p.session)
        for c in cut:
            log.warning("slot %d: %s", t, c)
            note = f"{note}; {c}" if note else c
        if malformed:
            log.warning("slot %d: left %d malformed queue row(s) out of the request: %s", t, len(malformed),
                        "; ".join(f"job {i}: {why}" for i, why in malformed.items()))
            bad = f"malformed job row(s) left out: {', '.join(str(i) for i in malformed)}"
            note = f"{note}; {bad}" if note else bad
        key = f"slot{t}"
        previous = self.store.decision(key, loop=self.p.loop) if self.store is not None else None
        if previous is not None:  # a replayed slot: apply what was decided, ask nothing
            dec, created = self._recorded(previous, req), False
        else:
            dec = slot_decision(req, self.agent, self.p.guard)
            created = self._record(key, req, dec, snap, note)
            if not created:  # another process recorded this slot meanwhile: act on ITS decision, not ours
                dec = self._recorded(self.store.decision(key, loop=self.p.loop), req)
        self.releasing = (t, [int(i) for i in dec.start])
        released = [] if self.p.dry_run else self.q.release(dec.start, t)
        self.releasing = None
        # what starts now (on a replayed slot, only what the crash left unreleased)
        by_id = {j.id: j for j in snap.eligible}
        started = [by_id[int(i)] for i in released if int(i) in by_id]
        dropped = [] if self.p.dry_run else self.q.drop_expired(t, self.clock_of_slot(t) if self.clock_of_slot else None)
        started_cores = sum(j.cores for j in started)
        cores_of = {j.id: j.cores for j in snap.eligible}
        rec = SlotRecord(
            slot=t, capacity=float(capacity), free=dec.free, eligible=len(snap.eligible), future=len(snap.future),
            running_cores=snap.running_cores, chosen=[int(i) for i in dec.chosen],
            deadline=[int(i) for i in dec.deadline], released=released, dropped=dropped,
            dropped_cores=[cores_of.get(i, 0) for i in dropped], free_after=dec.free - started_cores,
            violation=max(0.0, snap.running_cores + started_cores - float(capacity)),
            utilisation=float(sum(j.cores * j.duration for j in started)),
            delay_slots=int(sum(t - j.earliest for j in started)),
            source="fallback" if dec.answer.error else "agent", error=dec.answer.error,
            latency_ms=round(dec.answer.latency_ms, 3), decision_created=created,
            malformed=list(malformed))
        if rec.error:
            log.warning("slot %d: %s; started nothing", t, rec.error)
        self._send(rec)
        self.records.append(rec)
        return rec

    def rebuild_history(self, upto: int) -> int:
        """After a restart: give an agent that keeps its window in this process (InProcessAgent)
        the summaries of the slots up to `upto` that the store holds a decision of this loop for,
        the agent asked (source "agent"), the last `HISTORY` slots at most (older ones would
        have left the window); each request rebuilt from the decision's observation and the
        queue's rows. Without it a restart mid-day decided on an empty window, not as an
        uninterrupted run. Returns the slots pushed."""
        from .features import HISTORY

        if self.store is None or not hasattr(self.agent, "remember"):
            return 0
        decided = [(k, d) for k in range(max(0, int(upto) - HISTORY + 1), int(upto) + 1)
                   if (d := self.store.decision(f"slot{k}", loop=self.p.loop)) is not None and d.source == "agent"
                   and isinstance(d.observation, dict)]
        if not decided:
            return 0
        jobs = {j.id: j for j in self.q.deferrable_jobs()}
        reqs = []
        for k, d in decided:
            obs = d.observation
            pick = lambda name: [jobs[int(i)] for i in obs.get(name) or [] if int(i) in jobs]  # noqa: E731
            req, _, _, _ = checked_request(k, float(obs["capacity"]), pick("eligible"), pick("running"),
                                           pick("future"), self.p.session)
            # the capacity the agent was shown (already net of the cores of rows it could not see)
            reqs.append(req.model_copy(update={"capacity": float(obs["capacity"])}))
        self.agent.remember(reqs)
        return len(reqs)

    def _recorded(self, previous, req: ScheduleRequest) -> SlotDecision:
        """The decision recorded for this slot, to apply again (its job lists, nothing asked)."""
        act = (previous.action if previous is not None else None) or {}
        free = req.capacity - sum(j.cores for j in req.running)
        if previous is None:  # cannot happen with a working store: start nothing
            return SlotDecision([], [], free, Answer([], error="the slot's recorded decision could not be read"))
        was_dry = bool(act.get("dry_run")) or "dry run: nothing released" in (previous.reason or "")
        if was_dry and not self.p.dry_run:
            # decided in dry run (the daemon restarted live within the slot): never act on it
            return SlotDecision([], [], free, Answer([], error="slot decided in dry run; nothing released on the "
                                                               "live replay"))
        return SlotDecision(list(act.get("chosen", [])), list(act.get("deadline", [])), free,
                            Answer([], error=previous.reason if previous.source == "fallback" else None))

    def _record(self, key: str, req: ScheduleRequest, dec: SlotDecision, snap, note: str | None = None) -> bool:
        if self.store is None:
            return True
        _, created = self.store.record_decision(
            key, agent=self.agent.name, loop=self.p.loop, problem=PROBLEM,
            source="fallback" if dec.answer.error else "agent", policy_version=dec.answer.version,
            action={"start": [int(i) for i in dec.start], "chosen": [int(i) for i in dec.chosen],
                    "deadline": [int(i) for i in dec.deadline], **({"dry_run": True} if self.p.dry_run else {})},
            action_name="start" if dec.start else "wait",
            probabilities=dec.answer.scores or None,
            reason="; ".join(x for x in (note, dec.answer.error, f"deadline: {len(dec.deadline)} job(s) at their latest "
                                         f"start" if dec.deadline else None,
                                         "dry run: nothing released" if self.p.dry_run else None) if x) or None,
            observation={"slot": req.slot, "capacity": req.capacity, "free": dec.free,
                         "running_cores": snap.running_cores, "eligible": [int(j.id) for j in snap.eligible],
                         "future": [int(j.id) for j in snap.future],
                         "running": [int(j.id) for j in snap.running]})
        return created

    def _send(self, rec: SlotRecord) -> None:
        if self.sender is None:
            return
        from samm.monitor.graphite_client import sanitize

        # the loop name is ONE path component (docs/metric-naming.md): a dot in it would add a
        # level, a space or a slash would have carbon drop the point
        base = f"{self.p.prefix}.deferrable.{sanitize(self.p.loop)}"
        ts = time.time()
        try:
            self.sender.send_many([(f"{base}.released", len(rec.released), ts),
                                   (f"{base}.deadline_rescued", len(rec.deadline), ts),
                                   (f"{base}.dropped", len(rec.dropped), ts),
                                   (f"{base}.violation", rec.violation, ts),
                                   (f"{base}.capacity", rec.capacity, ts),
                                   (f"{base}.errors", int(rec.error is not None), ts)])
            self.sender.flush()
        except Exception as e:  # noqa: BLE001 - metrics never stop the loop
            log.warning("slot %d: Graphite send failed: %s", rec.slot, e)


# ---------------------------------------------------------------------------------- summaries
def live_result(records: list[SlotRecord], jobs: int) -> dict:
    """The simulator's EpisodeResult fields for a live run (Eq. 6 with w1 = 2, w2 = 10)."""
    from .settings import W_DELAY, W_VIOLATION

    res = EpisodeResult(jobs=jobs)
    for r in records:
        n = len(r.released)
        res.utilisation += r.utilisation
        res.delay_penalty += -W_DELAY * r.delay_slots
        res.violation_penalty += -W_VIOLATION * r.violation
        res.violation_slots += int(r.violation > 0)
        res.started += n
        res.missed += len(r.dropped)
        res.delay_slots += r.delay_slots
    d = res.as_dict()
    d["deadline_rescued"] = sum(len(r.deadline) for r in records)
    d["errors"] = sum(r.error is not None for r in records)
    return d


class _Row:
    """An episode row as a job record (id = row)."""

    def __init__(self, ep: Episode, row: int, start: int):
        self.id = row
        self.cores, self.duration = int(ep.cores[row]), int(ep.duration[row])
        self.earliest, self.latest, self.submitted = int(ep.earliest[row]), int(ep.latest[row]), int(ep.submit[row])
        self.start = start

    def remaining(self, slot: int) -> int:
        return max(0, self.start + self.duration - slot)


def simulate(episode: Episode, agent: Agent, guard: bool, session: str = "sim") -> tuple[EpisodeResult, np.ndarray]:
    """Replay `episode` in the simulator, each slot decided by `slot_decision` on the request the
    live loop would build (job id = episode row). Returns the result and each job's start slot."""
    sim = DeferrableSim(episode)
    while not sim.done:
        v = sim.view()
        # id (= row) order, as the live loop reads the queue: a heuristic's last tie-break is the
        # request's row order (service.build_view keeps it), so both must send the same order
        rows = lambda idx: [_Row(episode, int(r), int(v.start[r])) for r in sorted(idx)]  # noqa: E731
        req = build_request(v.t, v.capacity, rows(v.eligible), rows(v.running), rows(v.future), session)
        dec = slot_decision(req, agent, guard)
        sim.step(np.asarray([int(i) for i in dec.start], dtype=np.int64))
    return sim.result, sim.start.copy()


def cut_episode(ep: Episode, slots: int) -> Episode:
    """The first `slots` slots of an episode: its capacity and the jobs submitted in them."""
    slots = min(int(slots), ep.slots)
    keep = ep.submit < slots
    return Episode(cores=ep.cores[keep], duration=ep.duration[keep], earliest=ep.earliest[keep],
                   latest=ep.latest[keep], submit=ep.submit[keep], capacity=ep.capacity[:slots])
