"""The testbed's durable job queue: one SQLite file shared by the driver, every worker process,
the reconciler and the metrics publisher.

Guarantees (the paper's section 5: independent idempotent tasks, rescheduled on failure):
* no job is ever leased to two workers: every state change runs in a `BEGIN IMMEDIATE`
  transaction, which SQLite serialises across processes;
* no job is lost: a lease expires unless its worker heartbeats, and `release_worker` hands a
  killed worker's jobs back at once; either way the job waits again (counted as waiting, like
  the simulator's re-queued jobs of a removed VM) and starts from zero elsewhere;
* no job is done twice: `complete` only succeeds for the worker, and the attempt, that holds
  the lease now, so a late completion from a worker whose lease was re-queued is ignored.

Dispatch matches the simulator (java/.../SimEnv.java `dispatch`, docs/bridge-protocol.md):
the queue is ordered by original arrival (the job id is the workload index, so a re-queued
job goes back to its place) and is strict FIFO, head of line: a worker takes the head job if
it fits its free cores, then the next, and stops at the first job that does not fit. The
simulator's best-fit choice among VMs (fewest free cores that fit) has no pull-model
equivalent: here the first polling worker with room wins. `backfill=True` lets a worker skip
jobs wider than its free cores instead (not the simulator's rule).

Times: `submitted_at`, `*_started_at`, `finished_at`, `wait_s` are in WORKLOAD seconds (the
testbed's scaled clock, (wall - t0) x compression); `lease_expires` is wall time.

Deferrable jobs (the deferrable-jobs problem, OSDEC; `submit_deferrable`): optional columns
`earliest`, `latest`, `duration_slots`, `submit_slot`, `released_slot`, all in SLOTS of the
scheduling loop (not seconds), and `defer_state`:
* NULL: an ordinary job, leased FIFO as above (today's behaviour, unchanged);
* 'pending': waiting for the scheduler. Its `state` is 'waiting' but no worker may lease it:
  `lease` only takes jobs whose `defer_state` is NULL or 'released';
* 'released': the scheduler started it at `released_slot` (`release`); from then on it is an
  ordinary waiting job that the next worker with room leases. `release` only moves 'pending'
  jobs inside their window, in one transaction, so a job is released at most once ("none runs
  twice"; a lost lease still re-queues it like any job, counted in `requeues`);
* 'dropped': its latest start passed unreleased (`drop_expired`). Its `state` becomes 'done'
  with no `completed_by`, so `all_done` sees it resolved.
The columns are added to an existing file on open (ALTER TABLE ADD COLUMN when missing).
"""
from __future__ import annotations

import logging
import math
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from .options import number_problem

log = logging.getLogger(__name__)

WAITING, LEASED, DONE = "waiting", "leased", "done"
PENDING, RELEASED, DROPPED = "pending", "released", "dropped"  # defer_state of a deferrable job

#: deferrable-job columns, added to files created before them (all NULL for an ordinary job)
_DEFERRABLE_COLUMNS = (("earliest", "INTEGER"), ("latest", "INTEGER"), ("duration_slots", "INTEGER"),
                       ("submit_slot", "INTEGER"), ("released_slot", "INTEGER"), ("defer_state", "TEXT"))
_LEASABLE = "(defer_state IS NULL OR defer_state = 'released')"
#: a deferrable job's bounds: those of the scheduling request (agents/deferrable_jobs/service.py)
_MAX_JOB_CORES, _MAX_JOB_SLOTS, _MAX_SLOT = 100_000, 100_000, 2**53

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY,            -- workload index: FIFO order = original arrival order
    cores INTEGER NOT NULL CHECK (cores >= 1),
    runtime_s REAL NOT NULL CHECK (runtime_s >= 0),
    ram_gb REAL NOT NULL DEFAULT 0,
    submitted_at REAL NOT NULL,
    state TEXT NOT NULL DEFAULT 'waiting' CHECK (state IN ('waiting', 'leased', 'done')),
    lease_owner TEXT,
    lease_expires REAL,
    attempts INTEGER NOT NULL DEFAULT 0,   -- times leased (started)
    requeues INTEGER NOT NULL DEFAULT 0,   -- times handed back after a lost lease
    enqueued_at REAL NOT NULL,             -- when it last became waiting
    wait_s REAL NOT NULL DEFAULT 0,        -- total time queued before its starts
    first_started_at REAL,
    started_at REAL,
    finished_at REAL,
    completed_by TEXT
);
CREATE INDEX IF NOT EXISTS jobs_state_id ON jobs (state, id);
CREATE INDEX IF NOT EXISTS jobs_owner ON jobs (lease_owner) WHERE state = 'leased';
CREATE TABLE IF NOT EXISTS runs (           -- one row per attempt, for billing's busy time
    job_id INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    worker_id TEXT NOT NULL,
    cores INTEGER NOT NULL,
    started_at REAL NOT NULL,
    ended_at REAL,
    outcome TEXT,                           -- done | requeued | NULL while running
    PRIMARY KEY (job_id, attempt)
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value REAL NOT NULL);
"""


def _check_lease(now_wall: float, lease_s: float) -> None:
    # a NaN expiry is stored as NULL and an infinite one never comes: either way the lease of a
    # worker that dies would never expire, and its jobs would be lost
    if not (math.isfinite(lease_s) and lease_s > 0 and math.isfinite(now_wall)):
        raise ValueError(f"lease_s must be a finite number > 0 and now_wall finite, got {lease_s!r}, {now_wall!r}")


# A wait for the write lock shorter than this leaves the caller's time as given (the dates a test or
# a replay passes in stay exact); a longer one (a busy database) moves it on by the wait.
_LOCK_WAIT_NOTED_S = 0.1


def _when_held(now_wall: float, asked: float) -> float:
    """`now_wall` moved on by the time since `asked` (time.monotonic()) when that is a real wait."""
    waited = time.monotonic() - asked
    return now_wall + waited if waited >= _LOCK_WAIT_NOTED_S else now_wall


def _check_clock(t0: float, compression: float) -> None:
    """The testbed's clock, (wall - t0) x compression, as every process must share it."""
    problem = number_problem("compression", compression, strict=True)
    if problem is None and not (isinstance(t0, (int, float)) and math.isfinite(t0)):
        problem = f"t0 must be a finite wall time, got {t0!r}"
    if problem:
        raise ValueError(problem)


@dataclass(frozen=True)
class Job:
    """A leased job. `attempt` is the lease token to pass back to `complete`."""

    id: int
    cores: int
    runtime_s: float
    ram_gb: float
    submitted_at: float
    attempt: int


@dataclass(frozen=True)
class DeferrableJob:
    """A deferrable job as the scheduling loop sees it; every time is a slot."""

    id: int
    cores: int
    duration: int           # slots
    earliest: int
    latest: int
    submitted: int          # submission slot
    released: int | None    # the slot the scheduler started it in (None: not yet)
    state: str              # the job's lease state: waiting / leased / done

    def remaining(self, slot: int) -> int:
        """Slots left to run at `slot`, this one included (0 when not released or finished)."""
        return 0 if self.released is None else max(0, self.released + self.duration - slot)


@dataclass(frozen=True)
class DeferrableSnapshot:
    """The deferrable jobs at one slot, each list in id order."""

    slot: int
    eligible: list[DeferrableJob]   # pending, submitted, earliest <= slot <= latest
    future: list[DeferrableJob]     # pending, submitted, slot < earliest
    running: list[DeferrableJob]    # released, released + duration > slot

    @property
    def running_cores(self) -> int:
        return sum(j.cores for j in self.running)


@dataclass(frozen=True)
class QueueCounters:
    """The queue series of docs/metric-naming.md (`QueueReporter.report(**asdict(c))`)."""

    submitted_total: int
    waiting: int
    running: int
    completed_total: int
    waiting_submitted_this_minute: int
    waiting_cores: int = 0
    running_cores: int = 0
    head_job_cores: int = 0  # the next job a worker would lease (lowest id); 0 = none waiting


@dataclass(frozen=True)
class JobRecord:
    id: int
    cores: int
    runtime_s: float
    ram_gb: float
    submitted_at: float
    state: str
    attempts: int
    requeues: int
    wait_s: float  # time queued before its starts so far, re-queues included
    enqueued_at: float  # when it last became waiting
    first_started_at: float | None
    started_at: float | None
    finished_at: float | None
    completed_by: str | None

    def total_wait(self, clock_now: float) -> float:
        """Queued time up to `clock_now`, the current wait of a job still queued included."""
        return self.wait_s + (max(0.0, clock_now - self.enqueued_at) if self.state == WAITING else 0.0)


@dataclass(frozen=True)
class RunRecord:
    job_id: int
    attempt: int
    worker_id: str
    cores: int
    started_at: float
    ended_at: float | None
    outcome: str | None


class JobQueue:
    """A durable job queue in the SQLite file `path` (created with its schema if missing).

    One instance per process (thread-safe inside it: calls are serialised by a lock); any
    number of processes may open the same file. `busy_timeout_s` bounds how long a call waits
    for another process's write transaction.
    """

    def __init__(self, path: str | os.PathLike, busy_timeout_s: float = 30.0):
        # NaN or inf failed as "cannot convert float NaN to integer" or an OverflowError
        if problem := number_problem("busy_timeout_s", busy_timeout_s):
            raise ValueError(f"job queue {path}: {problem}")
        self.path = Path(path)
        if self.path.is_dir():
            raise ValueError(f"job queue path {self.path} is a directory; expected a SQLite file")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        # autocommit mode: every write below opens its own BEGIN IMMEDIATE
        self._db = sqlite3.connect(str(self.path), timeout=busy_timeout_s, isolation_level=None,
                                   check_same_thread=False)
        self._warned_no_clock = False
        try:
            self._open(busy_timeout_s)
        except BaseException as exc:  # a failed open kept its connection (a file descriptor) forever
            self._db.close()
            if isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError):
                # e.g. "file is not a database": a wrong --queue, not a busy file worth retrying
                raise ValueError(f"job queue {self.path} is not a usable SQLite file: {exc}") from None
            raise

    def _open(self, busy_timeout_s: float) -> None:
        self._db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        mode = self._db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise RuntimeError(f"job queue {self.path}: SQLite refused WAL mode (got {mode!r}); "
                               "is it on a filesystem without shared memory (e.g. NFS)?")
        # NORMAL in WAL mode survives any process crash (only an OS crash may lose the last commits)
        self._db.execute("PRAGMA synchronous = NORMAL")
        with self._lock:  # several processes may create the schema at once: one transaction each
            self._db.executescript("BEGIN IMMEDIATE;" + _SCHEMA + "COMMIT;")
        self._upgrade_schema()

    def _upgrade_schema(self) -> None:
        """Add the deferrable-job columns to a file made before them (checked inside the write
        transaction, so processes opening the file together add each column once)."""
        with self._write() as db:
            have = {row[1] for row in db.execute("PRAGMA table_info(jobs)")}
            for name, kind in _DEFERRABLE_COLUMNS:
                if name not in have:
                    db.execute(f"ALTER TABLE jobs ADD COLUMN {name} {kind}")
            db.execute("CREATE INDEX IF NOT EXISTS jobs_defer ON jobs (defer_state, earliest) "
                       "WHERE defer_state IS NOT NULL")

    # ------------------------------------------------------------------ plumbing
    class _Txn:
        def __init__(self, q: "JobQueue"):
            self.q = q

        def __enter__(self):
            self.q._lock.acquire()
            try:
                self.q._db.execute("BEGIN IMMEDIATE")
            except BaseException:
                self.q._lock.release()
                raise
            return self.q._db

        def __exit__(self, exc_type, exc, tb):
            try:
                self.q._db.execute("ROLLBACK" if exc_type else "COMMIT")
            finally:
                self.q._lock.release()

    def _write(self) -> "_Txn":
        return JobQueue._Txn(self)

    def _read(self, sql: str, args: Sequence = ()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> "JobQueue":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ clock
    def set_clock(self, t0: float, compression: float) -> None:
        """Record the testbed's clock (workload time = (wall - t0) x compression) so that calls
        given only wall time (`requeue_expired`, `release_worker`) can date the re-queue."""
        # `not > 0` let inf through, and a NaN t0 failed as "NOT NULL constraint failed": either
        # dated every re-queue at infinity or never, and the re-queued jobs' waits were lost
        _check_clock(t0, compression)
        with self._write() as db:
            db.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                           [("t0", float(t0)), ("compression", float(compression))])

    def clock(self) -> tuple[float, float] | None:
        """(t0, compression) as recorded by `set_clock`, or None."""
        rows = dict(self._read("SELECT key, value FROM meta WHERE key IN ('t0', 'compression')"))
        if "t0" in rows and "compression" in rows:
            return rows["t0"], rows["compression"]
        return None

    def clock_at(self, wall: float) -> float | None:
        c = self.clock()
        return None if c is None else (wall - c[0]) * c[1]

    # ------------------------------------------------------------------ producer
    def submit(self, job_id: int, cores: int, runtime_s: float, submitted_at: float, ram_gb: float = 0.0) -> bool:
        """Queue one job; re-submitting an existing id is a no-op. Returns True if it was new."""
        return self.submit_many([(job_id, cores, runtime_s, submitted_at, ram_gb)]) == 1

    def submit_many(self, jobs: Iterable[tuple]) -> int:
        """`(job_id, cores, runtime_s, submitted_at[, ram_gb])` rows in one transaction;
        existing ids are left untouched. Returns how many were new."""
        rows = []
        for j in jobs:
            if len(j) not in (4, 5):
                raise ValueError(f"a job row is (job_id, cores, runtime_s, submitted_at[, ram_gb]); got {j!r}")
            job_id, cores, runtime_s, submitted_at = int(j[0]), int(j[1]), float(j[2]), float(j[3])
            ram = float(j[4]) if len(j) == 5 else 0.0
            # an infinite runtime holds a worker's cores forever; a NaN submission time is never
            # counted as waiting nor billed; a NaN or negative RAM poisons the reported RAM
            if (cores < 1 or not 0 <= runtime_s < math.inf or job_id < 0 or not math.isfinite(submitted_at)
                    or not 0 <= ram < math.inf):
                raise ValueError(f"job {job_id}: needs id >= 0, cores >= 1, finite runtime_s >= 0, finite "
                                 f"submitted_at and finite ram_gb >= 0 (got cores={cores}, runtime_s={runtime_s}, "
                                 f"submitted_at={submitted_at}, ram_gb={ram})")
            rows.append((job_id, cores, runtime_s, ram, submitted_at, submitted_at))
        if not rows:
            return 0
        with self._write() as db:
            before = db.total_changes
            db.executemany("INSERT OR IGNORE INTO jobs (id, cores, runtime_s, ram_gb, submitted_at, enqueued_at) "
                           "VALUES (?, ?, ?, ?, ?, ?)", rows)
            return db.total_changes - before

    # ------------------------------------------------------------------ deferrable jobs
    def submit_deferrable(self, jobs: Iterable[tuple]) -> int:
        """`(job_id, cores, duration_slots, earliest, latest, submit_slot, runtime_s, submitted_at)`
        rows (slots for the window, workload seconds for the run time and the submission), queued
        'pending' in one transaction; existing ids are left untouched. Returns how many were new."""
        rows = []
        for j in jobs:
            if len(j) != 8:
                raise ValueError("a deferrable job row is (job_id, cores, duration_slots, earliest, latest, "
                                 f"submit_slot, runtime_s, submitted_at); got {j!r}")
            try:
                job_id, cores, dur, earliest, latest, sub = (int(x) for x in j[:6])
                runtime_s, submitted_at = float(j[6]), float(j[7])
            except (TypeError, ValueError, OverflowError) as e:  # None, NaN, inf, text
                raise ValueError(f"deferrable job row {j!r}: {e}") from None
            # the bounds of the scheduling request (agents/deferrable_jobs/service.py): a row past
            # them could never be shown to the agent
            if (job_id < 0 or not 1 <= cores <= _MAX_JOB_CORES or not 1 <= dur <= _MAX_JOB_SLOTS
                    or not 0 <= runtime_s < float("inf") or not math.isfinite(submitted_at)
                    or not (0 <= sub <= earliest <= latest <= _MAX_SLOT)):
                raise ValueError(f"deferrable job {job_id}: needs id >= 0, 1 <= cores <= {_MAX_JOB_CORES}, "
                                 f"1 <= duration <= {_MAX_JOB_SLOTS} slots, finite runtime_s >= 0 and submitted_at, "
                                 f"and 0 <= submit <= earliest <= latest <= {_MAX_SLOT} (got {j!r})")
            rows.append((job_id, cores, runtime_s, submitted_at, submitted_at, dur, earliest, latest, sub))
        if not rows:
            return 0
        with self._write() as db:
            before = db.total_changes
            db.executemany("INSERT OR IGNORE INTO jobs (id, cores, runtime_s, submitted_at, enqueued_at, "
                           "duration_slots, earliest, latest, submit_slot, defer_state) "
                           "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending')", rows)
            return db.total_changes - before

    _DEFER_COLS = "id, cores, duration_slots, earliest, latest, submit_slot, released_slot, state"

    def deferrable_at(self, slot: int) -> DeferrableSnapshot:
        """The eligible, future (submitted, not yet eligible) and running deferrable jobs at
        `slot`, read in one statement. A job counts as running from its release slot for its
        duration in slots, whatever its worker is doing: the schedule reserves its cores."""
        t = int(slot)
        rows = self._read(
            f"SELECT {self._DEFER_COLS} FROM jobs WHERE (defer_state = 'pending' AND submit_slot <= ? "
            "AND latest >= ? AND earliest IS NOT NULL AND duration_slots IS NOT NULL) "
            "OR (defer_state = 'released' AND released_slot + duration_slots > ?) ORDER BY id",
            (t, t, t))
        eligible, future, running = [], [], []
        for r in rows:
            job = DeferrableJob(*r)
            if job.released is not None:
                running.append(job)
            elif job.earliest <= t:
                eligible.append(job)
            else:
                future.append(job)
        return DeferrableSnapshot(t, eligible, future, running)

    def deferrable_jobs(self) -> list[DeferrableJob]:
        """Every deferrable job, in id order."""
        return [DeferrableJob(*r) for r in self._read(
            f"SELECT {self._DEFER_COLS} FROM jobs WHERE defer_state IS NOT NULL ORDER BY id")]

    def release(self, job_ids: Iterable[int], slot: int) -> list[int]:
        """Let workers lease these jobs, started at `slot`, in one transaction. Only a job still
        'pending' whose window holds `slot` moves: a job released (or dropped) once is never
        released again, so replaying a slot releases nothing new. Returns the ids released now."""
        ids = sorted({int(j) for j in job_ids})
        if not ids:
            return []
        t = int(slot)
        out = []
        with self._write() as db:
            for job_id in ids:
                if db.execute("UPDATE jobs SET defer_state = 'released', released_slot = ? WHERE id = ? AND "
                              "defer_state = 'pending' AND submit_slot <= ? AND earliest <= ? AND latest >= ?",
                              (t, job_id, t, t, t)).rowcount == 1:
                    out.append(job_id)
        return out

    def drop_expired(self, slot: int, clock_now: float | None = None) -> list[int]:
        """Drop the pending jobs whose latest start is `slot` or earlier (the end of `slot`:
        none of them can start any more). Returns their ids."""
        with self._write() as db:
            ids = [r[0] for r in db.execute("SELECT id FROM jobs WHERE defer_state = 'pending' AND latest <= ? "
                                            "ORDER BY id", (int(slot),))]
            db.executemany("UPDATE jobs SET defer_state = 'dropped', state = 'done', finished_at = ? WHERE id = ?",
                           [(clock_now, i) for i in ids])
        return ids

    # ------------------------------------------------------------------ workers
    def lease(self, worker_id: str, free_cores: int, now_wall: float, lease_s: float, clock_now: float,
              backfill: bool = False) -> list[Job]:
        """Hand `worker_id` waiting jobs in FIFO order while they fit `free_cores` (head of line:
        stops at the first that does not fit, unless `backfill`). Leases last `lease_s` wall
        seconds unless heartbeated. Expired leases are re-queued first, in the same transaction."""
        if free_cores < 1:
            return []
        _check_lease(now_wall, lease_s)
        asked = time.monotonic()
        # cheap read first: 30 idle workers polling must not serialise on the write lock
        head = self._read(f"SELECT cores FROM jobs WHERE state = 'waiting' AND {_LEASABLE} ORDER BY id LIMIT 1")
        expired = self._read("SELECT 1 FROM jobs WHERE state = 'leased' AND lease_expires < ? LIMIT 1", (now_wall,))
        if not expired and (not head or (head[0][0] > free_cores and not backfill)):
            return []
        out: list[Job] = []
        with self._write() as db:
            # the lease starts when the lock is held: after a long wait for it, a lease dated from
            # `now_wall` was born (nearly) expired, and another worker re-queued the running job
            now_wall = _when_held(now_wall, asked)
            self._requeue(db, "lease_expires < ?", (now_wall,), clock_now, at_expiry=True)
            free = int(free_cores)
            picked = []
            for row in db.execute("SELECT id, cores, runtime_s, ram_gb, submitted_at, enqueued_at, attempts "
                                  f"FROM jobs WHERE state = 'waiting' AND {_LEASABLE} ORDER BY id"):
                if row[1] <= free:
                    picked.append(row)
                    free -= row[1]
                    if free == 0:
                        break
                elif not backfill:
                    break
            for job_id, cores, runtime_s, ram, sub, enq, attempts in picked:
                attempt = attempts + 1
                db.execute("UPDATE jobs SET state = 'leased', lease_owner = ?, lease_expires = ?, attempts = ?, "
                           "wait_s = wait_s + MAX(0, ? - enqueued_at), started_at = ?, "
                           "first_started_at = COALESCE(first_started_at, ?) WHERE id = ?",
                           (worker_id, now_wall + lease_s, attempt, clock_now, clock_now, clock_now, job_id))
                db.execute("INSERT OR REPLACE INTO runs (job_id, attempt, worker_id, cores, started_at) "
                           "VALUES (?, ?, ?, ?, ?)", (job_id, attempt, worker_id, cores, clock_now))
                out.append(Job(job_id, cores, runtime_s, ram, sub, attempt))
        return out

    def heartbeat(self, worker_id: str, now_wall: float, lease_s: float) -> int:
        """Extend every lease `worker_id` holds to `now_wall + lease_s`; returns how many it holds."""
        _check_lease(now_wall, lease_s)
        asked = time.monotonic()
        with self._write() as db:
            now_wall = _when_held(now_wall, asked)  # renewed from when the lock is held, as `lease`
            return db.execute("UPDATE jobs SET lease_expires = ? WHERE state = 'leased' AND lease_owner = ?",
                              (now_wall + lease_s, worker_id)).rowcount

    def held(self, worker_id: str) -> dict[int, int]:
        """Job id -> attempt of the leases `worker_id` holds now."""
        return dict(self._read("SELECT id, attempts FROM jobs WHERE state = 'leased' AND lease_owner = ?", (worker_id,)))

    def complete(self, job_id: int, worker_id: str, clock_now: float, attempt: int | None = None) -> bool:
        """Mark the job done, only if `worker_id` still holds its lease (and, given `attempt`,
        the same lease it was handed). False = the completion was ignored."""
        with self._write() as db:
            sql = ("UPDATE jobs SET state = 'done', finished_at = ?, completed_by = ?, lease_owner = NULL, "
                   "lease_expires = NULL WHERE id = ? AND state = 'leased' AND lease_owner = ?")
            args: tuple = (clock_now, worker_id, int(job_id), worker_id)
            if attempt is not None:
                sql += " AND attempts = ?"
                args += (int(attempt),)
            if db.execute(sql, args).rowcount != 1:
                return False
            db.execute("UPDATE runs SET ended_at = ?, outcome = 'done' WHERE job_id = ? AND attempt = "
                       "(SELECT attempts FROM jobs WHERE id = ?)", (clock_now, int(job_id), int(job_id)))
            return True

    # ------------------------------------------------------------------ recovery
    def _clock_for(self, now_wall: float, clock_now: float | None) -> float | None:
        if clock_now is not None:
            return float(clock_now)
        c = self.clock_at(now_wall)
        if c is None and not self._warned_no_clock:
            log.warning("job queue %s: no clock recorded (set_clock) and none given; re-queued jobs are dated "
                        "from their start, which undercounts their wait", self.path)
            self._warned_no_clock = True
        return c

    def _requeue(self, db: sqlite3.Connection, where: str, args: tuple, clock_now: float | None,
                 at_expiry: bool = False) -> int:
        """Leased jobs matching `where` wait again from `clock_now`; with `at_expiry`, from the
        moment their lease expired (the queue knew they were lost from then), when the clock
        is recorded."""
        rows = db.execute(f"SELECT id, lease_expires FROM jobs WHERE state = 'leased' AND {where}", args).fetchall()
        if not rows:
            return 0
        meta = dict(db.execute("SELECT key, value FROM meta WHERE key IN ('t0', 'compression')").fetchall())
        for job_id, expires in rows:
            when = clock_now
            if at_expiry and expires is not None and len(meta) == 2:
                when = (expires - meta["t0"]) * meta["compression"]
                when = when if clock_now is None else min(when, clock_now)
            # runs and jobs both fall back to the job's start when no clock is known
            db.execute("UPDATE runs SET ended_at = MAX(started_at, COALESCE(?, started_at)), outcome = 'requeued' "
                       "WHERE job_id = ? AND attempt = (SELECT attempts FROM jobs WHERE id = ?)",
                       (when, job_id, job_id))
            db.execute("UPDATE jobs SET state = 'waiting', lease_owner = NULL, lease_expires = NULL, "
                       "requeues = requeues + 1, enqueued_at = MAX(started_at, COALESCE(?, started_at)) WHERE id = ?",
                       (when, job_id))
        log.info("job queue: re-queued %d job(s) (%s)", len(rows), "lease expired" if at_expiry else "worker released")
        return len(rows)

    def requeue_expired(self, now_wall: float, clock_now: float | None = None) -> int:
        """Return every job whose lease expired before `now_wall` to the queue; returns how many."""
        clock_now = self._clock_for(now_wall, clock_now)
        with self._write() as db:
            return self._requeue(db, "lease_expires < ?", (now_wall,), clock_now, at_expiry=True)

    def release_worker(self, worker_id: str, now_wall: float | None = None, clock_now: float | None = None) -> int:
        """Re-queue at once every job `worker_id` holds (its process was killed or stopped)."""
        now_wall = time.time() if now_wall is None else now_wall
        clock_now = self._clock_for(now_wall, clock_now)
        with self._write() as db:
            return self._requeue(db, "lease_owner = ?", (worker_id,), clock_now)

    # ------------------------------------------------------------------ reading
    def counters(self, clock_now: float, interval_start: float) -> QueueCounters:
        """Counters for Graphite. `interval_start` (workload s): the start of the current daemon
        interval; `waiting_submitted_this_minute` counts the jobs submitted in
        [interval_start, clock_now] that still wait."""
        row = self._read(
            "SELECT COUNT(*), "
            "COALESCE(SUM(state = 'waiting'), 0), COALESCE(SUM(state = 'leased'), 0), COALESCE(SUM(state = 'done'), 0), "
            "COALESCE(SUM(state = 'waiting' AND submitted_at >= ? AND submitted_at <= ?), 0), "
            "COALESCE(SUM(CASE WHEN state = 'waiting' THEN cores END), 0), "
            "COALESCE(SUM(CASE WHEN state = 'leased' THEN cores END), 0), "
            f"COALESCE((SELECT cores FROM jobs WHERE state = 'waiting' AND {_LEASABLE} ORDER BY id LIMIT 1), 0) FROM jobs",
            (interval_start, clock_now))[0]
        return QueueCounters(*(int(x) for x in row))

    def all_done(self, expected: int | None = None) -> bool:
        """Every submitted job is done (and, given `expected`, that many were submitted)."""
        total, done = self._read("SELECT COUNT(*), COALESCE(SUM(state = 'done'), 0) FROM jobs")[0]
        return total > 0 and done == total and (expected is None or total == expected)

    def stats(self) -> list[JobRecord]:
        """Per-job records in id order (`JobRecord.total_wait(clock_now)` for the wait so far)."""
        return [JobRecord(*r) for r in self._read(
            "SELECT id, cores, runtime_s, ram_gb, submitted_at, state, attempts, requeues, wait_s, enqueued_at, "
            "first_started_at, started_at, finished_at, completed_by FROM jobs ORDER BY id")]

    def runs(self) -> list[RunRecord]:
        """Every attempt (which worker ran which job when), for busy time per instance."""
        return [RunRecord(*r) for r in self._read(
            "SELECT job_id, attempt, worker_id, cores, started_at, ended_at, outcome FROM runs ORDER BY job_id, attempt")]
