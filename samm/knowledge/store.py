"""The Knowledge store: the daemon's memory of what it saw, decided and did.

    store = KnowledgeStore("sqlite:///var/lib/samm/samm.db")      # migrates on open
    snap = store.record_snapshot(t0, t1, "ok", reasons=[], raw={...})
    obs = store.record_observation(snap, {"cpu_mean": 0.4, ...})
    decision_id, created = store.record_decision(key, agent="lstm-ppo", action=3, source="agent", ...)
    row, owned = store.begin_action(decision_id, req.idempotency_key, "aws-asg", req.group, req)
    if owned:                      # only the owner calls the executor
        result = executor.apply(req)
        store.finish_action(req.idempotency_key, result.status, result.detail, result.error,
                            cooldown_until=now + cooldown_s)

Every method is one short transaction and returns plain frozen dataclasses (no ORM objects,
no open sessions). Idempotency rests on the database's unique constraints, not on a prior
SELECT, so two threads or two processes racing on one key get exactly one owner.

JSON values (snapshot `raw`, features, actions, probabilities, requests, results) are made
JSON-safe by `to_json`: NaN and ±inf become None (with a warning naming where; standard JSON
has no such numbers, PostgreSQL rejects them, SQLite would store an unreadable token), numpy
scalars and arrays become Python numbers and lists, tuples become lists, dataclasses become
dicts; any other object is stored as its `str()` with a warning. Free text (reasons, errors,
action names, a decision's agent and policy version) is stored alike on both databases: NUL
characters (PostgreSQL refuses them) as `\\x00`, undecodable characters as backslash escapes, a
label over its column cut. A time that is NaN is refused (ValueError) on both.

Errors: invalid arguments (an unknown status, say) raise ValueError; an unreachable or broken
database raises KnowledgeError naming the operation and the URL (password hidden).
"""
from __future__ import annotations

import dataclasses
import functools
import operator
import contextlib
import logging
import math
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from alembic.util.exc import CommandError
from sqlalchemy import delete, func, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session

from . import schema
from .engine import KnowledgeError, is_memory_sqlite, make_engine, normalize_url, shown, sqlite_path
from .models import (ACTION_STATUSES, DECISION_SOURCES, DEFAULT_LOOP, DEFAULT_PROBLEM, FINAL_ACTION_STATUSES, OPEN_ACTION_STATUSES,
                     SNAPSHOT_STATUSES, Action, Base, Decision, GroupState, Lease, Observation, PolicyVersion,
                     Snapshot)

log = logging.getLogger(__name__)
T = TypeVar("T")
_PG_POLICY_LOCK_SPACE = 0x53414D50  # "SAMP": advisory locks (space, agent) serialising activations
#: the shortest history `prune` may keep: a decision younger than this may still be replayed
#: (a restarted iteration finds its decision by key), and an operator reading yesterday's
#: incident needs it
MIN_RETENTION_S = 86_400.0


# --- JSON -----------------------------------------------------------------------------------

def to_json(value: Any, where: str = "value") -> Any:
    """A JSON-safe copy of `value` (see the module docstring); `where` names it in warnings."""
    replaced: list[str] = []
    out = _to_json(value, where, replaced)
    if replaced:
        log.warning("non-finite number(s) stored as null: %s", ", ".join(replaced[:10])
                    + (f" (+{len(replaced) - 10} more)" if len(replaced) > 10 else ""))
    return out


def _to_json(value: Any, where: str, replaced: list[str]) -> Any:
    if isinstance(value, str):
        return _utf8(value, where)
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        replaced.append(f"{where}={value}")
        return None
    if isinstance(value, np.ndarray):
        return _to_json(value.tolist(), where, replaced)
    if isinstance(value, np.generic):
        item = value.item()
        if isinstance(item, np.generic):  # long double and its complex: no Python type holds them
            item = float(item) if isinstance(item, np.floating) else str(item)
        return _to_json(item, where, replaced)
    if isinstance(value, Mapping):
        return {str(k): _to_json(v, f"{where}.{k}", replaced) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_json(v, f"{where}[{i}]", replaced) for i, v in enumerate(value)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _to_json(dataclasses.asdict(value), where, replaced)
    log.warning("%s: %s is not JSON; storing its str()", where, type(value).__name__)
    return str(value)


def _utf8(value: str, where: str) -> str:
    """`value` if UTF-8 can encode it; lone surrogates (undecodable bytes of a subprocess's
    output or a path, say) otherwise become backslash escapes, as neither database takes them."""
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        log.warning("%s: text with undecodable characters stored with backslash escapes", where)
        return value.encode("utf-8", "backslashreplace").decode("utf-8")


def _text(value: str | None, where: str, max_len: int | None = None) -> str | None:
    """Free text for a TEXT/VARCHAR column, stored alike on SQLite and PostgreSQL: PostgreSQL
    refuses NUL characters (SQLite keeps them) and enforces VARCHAR lengths (SQLite does not).
    NUL becomes the escape `\\x00`, a value over `max_len` is cut (with a warning each)."""
    if value is None:
        return None
    value = _utf8(str(value), where)
    if "\x00" in value:
        log.warning("%s: NUL character(s) stored as \\x00", where)
        value = value.replace("\x00", "\\x00")
    if max_len is not None and len(value) > max_len:
        log.warning("%s: %d characters, cut to the column's %d", where, len(value), max_len)
        value = value[:max_len - 1] + "…"
    return value


def _finite_or_none(value: float | None, where: str) -> float | None:
    if value is None:
        return None
    value = float(value)
    if math.isfinite(value):
        return value
    log.warning("%s=%s is not finite; stored as null", where, value)
    return None


def _time(value: float, where: str) -> float:
    """A time or duration in seconds for a NOT NULL float column. NaN is refused: SQLite would
    store it as NULL (a constraint error, or a lease "held by someone else"), PostgreSQL as NaN,
    which compares false with every time (a cool-down that never holds, a lease that never
    expires). ±inf is kept: both databases store it and it compares as "never"/"always"."""
    value = float(value)
    if math.isnan(value):
        raise ValueError(f"{where} is NaN: a time must be a number of seconds")
    return value


def _check(value: str, allowed: tuple[str, ...], what: str) -> str:
    if value not in allowed:
        raise ValueError(f"{what} must be one of {list(allowed)}, got {value!r}")
    return value


# --- records ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class SnapshotRecord:
    id: int
    window_start: float
    window_end: float
    status: str
    reasons: list[str]
    raw: dict[str, Any] | None
    created_at: float


@dataclass(frozen=True)
class ObservationRecord:
    id: int
    snapshot_id: int
    features: dict[str, float | None]
    created_at: float


@dataclass(frozen=True)
class DecisionRecord:
    id: int
    loop: str
    problem: str
    iteration_key: str
    agent: str
    policy_version: str | None
    observation_id: int | None
    observation: Any
    action: Any
    action_name: str | None
    probabilities: Any
    value: float | None
    source: str
    reason: str | None
    created_at: float


@dataclass(frozen=True)
class ActionRecord:
    id: int
    decision_id: int
    loop: str
    idempotency_key: str
    executor: str
    group_name: str
    request: dict[str, Any]
    status: str
    result: dict[str, Any] | None
    error: str | None
    created_at: float
    finished_at: float | None

    @property
    def open(self) -> bool:
        """Not finished: planned, or in flight (the back-end may or may not have acted)."""
        return self.status in OPEN_ACTION_STATUSES


@dataclass(frozen=True)
class GroupStateRecord:
    loop: str
    group_name: str
    cooldown_until: float
    last_action_at: float | None
    last_action_key: str | None


@dataclass(frozen=True)
class LeaseRecord:
    name: str
    holder: str
    token: int
    acquired_at: float
    renewed_at: float
    expires_at: float


@dataclass(frozen=True)
class Fence:
    """What a leader's writes must still match: lease `name` held by `holder` with `token`."""
    name: str
    holder: str
    token: int


class LeaseLost(KnowledgeError):
    """A fenced write found the lease expired or held by another daemon: nothing was written."""


@dataclass(frozen=True)
class PolicyVersionRecord:
    id: int
    agent: str
    version: str
    path: str | None
    sha256: str | None
    source: str | None
    created_at: float
    active: bool


R = TypeVar("R")


def _record(cls: type[R], row: Base) -> R:
    return cls(**{f.name: getattr(row, f.name) for f in dataclasses.fields(cls)})  # type: ignore[arg-type]


def _cause(exc: BaseException) -> str:
    """The driver's message on one line: PostgreSQL's span several (a refused connection adds a
    tab-indented hint, a server error its DETAIL), which broke the one-line error an operator
    reads, and a log line, into pieces."""
    message = str(getattr(exc, "orig", None) or exc)
    return "; ".join(line.strip() for line in message.splitlines() if line.strip())


def _sqlite_access_hint(url: URL, exc: BaseException) -> str:
    """Why SQLite could not open or write its file, when the file system says so: its own
    message ("unable to open database file") names neither the file nor the cause. WAL mode
    needs to create `-wal` and `-shm` files next to the database, even to read it."""
    path = sqlite_path(url)
    message = _cause(exc)
    if path is not None and any(m in message for m in ("disk I/O error", "disk is full")):
        return _free_space_hint(path)
    if path is None or not any(m in message for m in ("unable to open", "readonly", "read-only")):
        return ""
    if path.is_dir():
        return f" ({path} is a directory: knowledge.url names the database file, e.g. {path / 'samm.db'})"
    if path.exists() and not os.access(path, os.W_OK):
        return f" (the file {path} is read-only; SAMM needs to write it, even to read it in WAL mode)"
    if not os.access(path.parent, os.W_OK | os.X_OK):
        return (f" (its directory {path.parent} is not writable, a read-only file system say: SQLite needs "
                "to create the -wal and -shm files there, even to read)")
    return ""


def _free_space_hint(path: Path) -> str:
    """SQLite reports a full file system as "disk I/O error" when it cannot extend its -shm file."""
    try:
        free = shutil.disk_usage(path.parent).free
    except OSError:
        return ""
    return f" ({free} bytes free on the file system of {path.parent}: is it full?)"


def _guarded(method: Callable[..., T]) -> Callable[..., T]:
    """Database failures leave as KnowledgeError naming the operation and the database."""

    @functools.wraps(method)
    def wrapper(self: "KnowledgeStore", *args, **kwargs) -> T:
        try:
            return method(self, *args, **kwargs)
        except SQLAlchemyError as exc:
            raise KnowledgeError(f"knowledge store {self.url}: {method.__name__} failed: "
                                 f"{type(exc).__name__}: {_cause(exc)}"
                                 f"{_sqlite_access_hint(self._url, exc)}") from exc

    return wrapper


# --- the store --------------------------------------------------------------------------------

class KnowledgeStore:
    """The Knowledge database at `url` (`sqlite:///path` or `postgresql+psycopg://...`).

    `migrate=True` upgrades the schema on open (safe with several processes: see
    `schema.migrate`); with `migrate=False` (read-only tools) a database that is not at the
    newest revision raises KnowledgeError instead of failing later on a missing table.
    An in-memory SQLite URL (experiments: nothing survives the process) is one connection, which
    the store's calls take one at a time.
    """

    def __init__(self, url: str | URL, *, migrate: bool = True, busy_timeout_s: float = 30.0,
                 clock: Callable[[], float] = time.time):
        self._url = normalize_url(url)
        self.url = shown(self._url)
        self.clock = clock
        # set by a leading daemon (samm/daemon/leadership.py): decisions and action claims are
        # then written only while its lease holds, in the same transaction that checks it
        self.fence: Fence | None = None
        self.engine = make_engine(self._url, busy_timeout_s=busy_timeout_s)
        self.in_memory = is_memory_sqlite(self._url)
        # an in-memory database is one connection (StaticPool): two threads in it at once (the
        # daemon's lease keeper and its loops) interleave transactions, or crash the process
        self._one_at_a_time = threading.RLock() if is_memory_sqlite(self._url) else contextlib.nullcontext()
        # writers take SQLite's write lock at BEGIN (waiting up to the busy timeout): a
        # read-then-write transaction can then never fail on a lock upgrade
        self._write_bind = self.engine.execution_options(sqlite_begin="IMMEDIATE")
        try:
            # a separate engine (foreign keys off) unless the database only lives in this one
            target = self.engine if is_memory_sqlite(self._url) else self._url
            if migrate:
                schema.migrate(target)
            else:
                at, head = schema.current_revision(target), schema.head_revision()
                if at != head and at is not None and not schema.known_revision(at):
                    # migrating cannot help here: only the newer SAMM that wrote it knows that revision
                    raise KnowledgeError(f"knowledge store {self.url} is at schema revision {at}, unknown to this "
                                         f"SAMM (it knows revisions up to {head}): a newer SAMM wrote it; read it "
                                         "with that version")
                if at != head:
                    raise KnowledgeError(f"knowledge store {self.url} is at schema revision {at}, not {head}: "
                                         "open it once with migrate=True (the daemon does)")
        except SQLAlchemyError as exc:
            self.engine.dispose()
            raise KnowledgeError(f"knowledge store {self.url}: cannot open: {_cause(exc)}"
                                 f"{_sqlite_access_hint(self._url, exc)}") from exc
        except CommandError as exc:  # e.g. a revision this SAMM does not know: a newer SAMM wrote it
            self.engine.dispose()
            raise KnowledgeError(f"knowledge store {self.url}: cannot migrate its schema ({exc}); a database "
                                 f"written by a newer SAMM needs that version (this one knows revisions up to "
                                 f"{schema.head_revision()})") from exc
        except BaseException:
            self.engine.dispose()
            raise
        # SQLite: the file this store opened. Deleted or replaced while open, its open
        # connections would go on writing to an unlinked file, lost at exit, without an error
        path = sqlite_path(self._url)
        self._sqlite_file = None if path is None else path.absolute()
        self._file_id = self._current_file_id()

    def _current_file_id(self) -> tuple[int, int] | None:
        if self._sqlite_file is None:
            return None
        try:
            st = self._sqlite_file.stat()
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def _check_file(self) -> None:
        if self._file_id is not None and self._current_file_id() != self._file_id:
            raise KnowledgeError(f"knowledge store {self.url}: the SQLite file {self._sqlite_file} was deleted or "
                                 "replaced while the store had it open: not writing to a file nobody will read "
                                 "again; restore the file (or point knowledge.url at its copy), then restart")

    # --- plumbing -------------------------------------------------------------------------------
    def _insert(self, row) -> int:
        """Add one row in its own transaction and return its id."""
        with self._write() as s:
            s.add(row)
            s.flush()
            return row.id

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> "KnowledgeStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"KnowledgeStore({self.url!r})"

    @contextmanager
    def _write(self) -> Iterator[Session]:
        self._check_file()
        with self._one_at_a_time, Session(self._write_bind) as session, session.begin():
            yield session

    @contextmanager
    def _read(self) -> Iterator[Session]:
        with self._one_at_a_time, Session(self.engine) as session, session.begin():
            yield session

    def _now(self, now: float | None) -> float:
        return _time(self.clock() if now is None else now, "now (the store's clock)" if now is None else "now")

    def _check_fence(self, session: Session, now: float | None) -> None:
        """Refuse the write unless this daemon's lease still holds (FOR SHARE on PostgreSQL: a
        takeover waits for this transaction, and this one for a takeover under way). The time
        is read here, inside the transaction, unless given: not before a wait for the lock."""
        f = self.fence
        if f is None:
            return
        row = session.scalar(select(Lease).where(Lease.name == f.name).with_for_update(read=True))
        now = self._now(now)
        if row is None or row.holder != f.holder or row.token != f.token or row.expires_at < now:
            now_held = "nobody" if row is None else f"{row.holder} (token {row.token}, expires {row.expires_at:.3f})"
            raise LeaseLost(f"knowledge store {self.url}: lease {f.name!r} no longer ours ({f.holder}, token "
                            f"{f.token}); held by {now_held} at {now:.3f}: not writing")
        if session.get_bind().dialect.name == "postgresql":
            # our FOR SHARE lock holds a takeover back until this transaction ends: should this
            # process stall inside it (a pause, a frozen VM: its connection stays open), the
            # server ends the session when the lease ends, so neither does a standby wait on a
            # stalled leader nor does the stalled leader commit after its lease
            # clamped before int(): a lease with an infinite ttl has no integer number of ms
            ms = int(min(max(10.0, (row.expires_at - now) * 1000), 86_400_000))  # the setting's range
            session.execute(text(f"SET LOCAL idle_in_transaction_session_timeout = {ms}"))

    def _upsert_group_state(self, session: Session, group: str, until: float, key: str | None, now: float,
                            loop: str = DEFAULT_LOOP) -> None:
        values = {"loop": loop, "group_name": group, "cooldown_until": until, "last_action_at": now,
                  "last_action_key": key}
        dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
        stmt = dialect.insert(GroupState).values(**values)
        stmt = stmt.on_conflict_do_update(index_elements=[GroupState.loop, GroupState.group_name],
                                          set_={k: v for k, v in values.items() if k not in ("loop", "group_name")})
        session.execute(stmt)

    # --- Monitor / Analyze ----------------------------------------------------------------------
    @_guarded
    def record_snapshot(self, window_start: float, window_end: float, status: str, reasons=(),
                        raw: Mapping[str, Any] | None = None, *, now: float | None = None) -> int:
        """Store one Monitor snapshot; `status` is ok / partial / stale, `reasons` says why not
        ok. Returns its id."""
        _check(status, SNAPSHOT_STATUSES, "snapshot status")
        if reasons is None:  # "no reasons", as (): not a TypeError from deep in the list below
            reasons = ()
        elif isinstance(reasons, str):
            reasons = [reasons]
        row = Snapshot(window_start=_time(window_start, "window_start"), window_end=_time(window_end, "window_end"),
                       status=status,
                       reasons=to_json([str(r) for r in reasons], "snapshot.reasons"), raw=to_json(raw, "snapshot.raw"),
                       created_at=self._now(now))
        return self._insert(row)

    @_guarded
    def record_observation(self, snapshot_id: int, features: Mapping[str, float], *,
                           now: float | None = None) -> int:
        """Store the named features derived from a snapshot (non-finite values become null)."""
        row = Observation(snapshot_id=snapshot_id, features=to_json(dict(features), "features"),
                          created_at=self._now(now))
        return self._insert(row)

    # --- Plan -------------------------------------------------------------------------------------
    @_guarded
    def record_decision(self, iteration_key: str, *, agent: str, action: Any, source: str,
                        policy_version: str | None = None, observation_id: int | None = None,
                        action_name: str | None = None, probabilities: Any = None, value: float | None = None,
                        reason: str | None = None, now: float | None = None, loop: str = DEFAULT_LOOP,
                        problem: str = DEFAULT_PROBLEM, observation: Any = None) -> tuple[int, bool]:
        """Store the decision of iteration `iteration_key` (e.g. the window end) of `loop`.
        Returns (decision id, created); when that iteration already has a decision, its id and
        False: a replayed or restarted iteration never records (or acts) twice."""
        _check(source, DECISION_SOURCES, "decision source")
        # agent and policy version are labels (the version comes from a Policy Evaluation
        # Service's reply): kept as free text, so PostgreSQL refuses them no more than SQLite
        row = Decision(loop=loop, problem=problem, iteration_key=str(iteration_key),
                       agent=_text(agent, "decision.agent", 128),
                       policy_version=_text(policy_version, "decision.policy_version", 128),
                       observation_id=observation_id,
                       observation=to_json(observation, "decision.observation"),
                       action=to_json(action, "decision.action"),
                       action_name=_text(action_name, "decision.action_name", 256),
                       probabilities=to_json(probabilities, "decision.probabilities"),
                       value=_finite_or_none(value, "decision.value"), source=source,
                       reason=_text(reason, "decision.reason"),
                       created_at=self._now(now))
        try:
            with self._write() as s:
                self._check_fence(s, now)
                s.add(row)
                s.flush()
                return row.id, True
        except IntegrityError:
            with self._read() as s:
                existing = s.scalar(select(Decision.id).where(Decision.loop == loop,
                                                              Decision.iteration_key == str(iteration_key)))
            if existing is None:  # not the unique key: a bad observation_id, say
                raise
            return existing, False

    @_guarded
    def decision(self, iteration_key: str, loop: str = DEFAULT_LOOP) -> DecisionRecord | None:
        with self._read() as s:
            row = s.scalar(select(Decision).where(Decision.loop == loop, Decision.iteration_key == str(iteration_key)))
            return None if row is None else _record(DecisionRecord, row)

    # --- Execute ----------------------------------------------------------------------------------
    @_guarded
    def begin_action(self, decision_id: int, idempotency_key: str, executor: str, group: str, request: Any, *,
                     status: str = "in_flight", now: float | None = None,
                     loop: str = DEFAULT_LOOP) -> tuple[ActionRecord, bool]:
        """Claim the action `idempotency_key` before calling the executor.

        Inserts it with `status` (default in_flight; a final status such as blocked or
        dry_run records an action that will not run, finished at once) and returns
        (row, True). If the key exists, returns (existing row, False) and changes nothing,
        except that an in_flight claim of a 'planned' row takes it over atomically and
        returns (row now in_flight, True). So: call the executor if and only if the second
        value is True. `request` is a ScaleRequest or a dict.
        """
        _check(status, ACTION_STATUSES, "action status")
        t = self._now(now)
        row = Action(decision_id=decision_id, loop=loop, idempotency_key=idempotency_key, executor=executor, group_name=group,
                     request=to_json(request, "action.request"), status=status, created_at=t,
                     finished_at=t if status in FINAL_ACTION_STATUSES else None)
        try:
            with self._write() as s:
                self._check_fence(s, now)
                s.add(row)
                s.flush()
                return _record(ActionRecord, row), True
        except IntegrityError:
            pass
        with self._write() as s:
            claimed = False
            if status == "in_flight":
                self._check_fence(s, now)
                res = s.execute(update(Action).where(Action.idempotency_key == idempotency_key,
                                                     Action.status == "planned").values(status="in_flight"))
                claimed = res.rowcount == 1
            existing = s.scalar(select(Action).where(Action.idempotency_key == idempotency_key))
            if existing is None:
                raise KnowledgeError(f"action {idempotency_key!r} could not be recorded: decision {decision_id} "
                                     "does not exist (or another constraint failed)")
            return _record(ActionRecord, existing), claimed

    @_guarded
    def finish_action(self, idempotency_key: str, status: str, result: Any = None, error: str | None = None, *,
                      cooldown_until: float | None = None, now: float | None = None,
                      fenced: bool = False) -> ActionRecord:
        """Record the outcome of an open action (final `status`: succeeded, failed, skipped,
        dry_run, blocked). With `cooldown_until`, the group's cool-down is set in the same
        transaction, so a crash cannot keep one without the other. An action already finished
        keeps its first outcome (logged). Unknown key: KnowledgeError. The outcome of a call
        this daemon made is written even after it lost the lease; `fenced` (resolving actions
        left in flight, which may be the new leader's) writes only while the lease holds."""
        _check(status, FINAL_ACTION_STATUSES, "final action status")
        if cooldown_until is not None:
            cooldown_until = _time(cooldown_until, "cooldown_until")
        t = self._now(now)
        with self._write() as s:
            if fenced:
                self._check_fence(s, now)
            res = s.execute(update(Action)
                            .where(Action.idempotency_key == idempotency_key, Action.status.in_(OPEN_ACTION_STATUSES))
                            .values(status=status, result=to_json(result, "action.result"),
                                    error=_text(error, "action.error"), finished_at=t))
            row = s.scalar(select(Action).where(Action.idempotency_key == idempotency_key))
            if row is None:
                raise KnowledgeError(f"no action with idempotency key {idempotency_key!r}")
            if res.rowcount == 0:
                log.warning("action %s already finished as %s; keeping that, not %s", idempotency_key, row.status,
                            status)
            elif cooldown_until is not None:
                self._upsert_group_state(s, row.group_name, cooldown_until, idempotency_key, t, row.loop)
            return _record(ActionRecord, row)

    @_guarded
    def in_flight_actions(self, include_planned: bool = False, loop: str | None = None) -> list[ActionRecord]:
        """Actions begun and never finished (after a crash: the back-end may or may not have
        acted; compare with its inventory, then finish them), oldest first; of one loop or all."""
        statuses = OPEN_ACTION_STATUSES if include_planned else ("in_flight",)
        q = select(Action).where(Action.status.in_(statuses)).order_by(Action.id)
        if loop is not None:
            q = q.where(Action.loop == loop)
        with self._read() as s:
            rows = s.scalars(q)
            return [_record(ActionRecord, r) for r in rows]

    @_guarded
    def action(self, idempotency_key: str) -> ActionRecord | None:
        with self._read() as s:
            row = s.scalar(select(Action).where(Action.idempotency_key == idempotency_key))
            return None if row is None else _record(ActionRecord, row)

    # --- cool-downs ---------------------------------------------------------------------------
    @_guarded
    def cooldowns(self, loop: str = DEFAULT_LOOP) -> dict[str, float]:
        """target -> epoch seconds until which `loop` must not act on it again."""
        with self._read() as s:
            return {g: u for g, u in s.execute(select(GroupState.group_name, GroupState.cooldown_until)
                                               .where(GroupState.loop == loop))}

    @_guarded
    def group_states(self, loop: str = DEFAULT_LOOP) -> dict[str, GroupStateRecord]:
        with self._read() as s:
            return {r.group_name: _record(GroupStateRecord, r)
                    for r in s.scalars(select(GroupState).where(GroupState.loop == loop))}

    @_guarded
    def set_cooldown(self, group: str, until: float, action_key: str | None = None, now: float | None = None,
                     loop: str = DEFAULT_LOOP) -> None:
        until = _time(until, "cooldown until")
        with self._write() as s:
            self._upsert_group_state(s, group, until, action_key, self._now(now), loop)

    # --- policies -------------------------------------------------------------------------------
    # --- leadership -------------------------------------------------------------------------
    @_guarded
    def acquire_lease(self, name: str, holder: str, ttl_s: float, *, now: float | None = None,
                      take_over: bool = False, fresh: bool = False) -> LeaseRecord | None:
        """Take or renew lease `name` for `holder` until now + ttl_s. Renewing keeps the token; a
        new holder (the lease expired, or `take_over`) increments it. None: someone else holds it.
        `fresh`: the caller does not hold the lease yet, so a row under the same holder name is
        another process's (two daemons given one name, or a predecessor of this one): it is taken
        only as another holder's would be, with the token incremented, never renewed."""
        ttl_s = _time(ttl_s, "lease ttl_s")
        try:
            with self._write() as s:
                row = s.scalar(select(Lease).where(Lease.name == name).with_for_update())
                # the time once the lock is ours: a renewal that waited for it (another writer,
                # a locked SQLite file) must not write an expiry already past, over a newer one
                t = self._now(now)
                if row is None:
                    row = Lease(name=name, holder=holder, token=1, acquired_at=t, renewed_at=t, expires_at=t + ttl_s)
                    s.add(row)
                elif row.holder == holder and not (fresh or take_over):
                    row.renewed_at, row.expires_at = t, t + ttl_s
                elif row.expires_at < t or take_over:
                    row.holder, row.token = holder, row.token + 1
                    row.acquired_at, row.renewed_at, row.expires_at = t, t, t + ttl_s
                else:
                    return None
                s.flush()
                return _record(LeaseRecord, row)
        except IntegrityError:  # another daemon created the row first
            return None

    @_guarded
    def release_lease(self, name: str, holder: str, *, now: float | None = None) -> bool:
        """Let lease `name` go at once (a clean stop), if `holder` still has it."""
        t = self._now(now)
        with self._write() as s:
            res = s.execute(update(Lease).where(Lease.name == name, Lease.holder == holder)
                            .values(expires_at=t - 1e-3, renewed_at=t))
            return res.rowcount == 1

    @_guarded
    def lease(self, name: str) -> LeaseRecord | None:
        with self._read() as s:
            row = s.scalar(select(Lease).where(Lease.name == name))
            return None if row is None else _record(LeaseRecord, row)

    @_guarded
    def register_policy_version(self, agent: str, version: str, *, path: str | None = None,
                                sha256: str | None = None, source: str | None = None, activate: bool = True,
                                now: float | None = None) -> PolicyVersionRecord:
        """Record that `agent` runs policy `version` (idempotent: registering it again returns
        the row). `activate` makes it the agent's only active version. The same version with
        a different sha256 raises KnowledgeError: a version label names one file forever."""
        row = PolicyVersion(agent=agent, version=version, path=path, sha256=sha256, source=source,
                            created_at=self._now(now), active=False)
        try:
            with self._write() as s:
                s.add(row)
                s.flush()
                if activate:
                    self._activate(s, agent, row.id)
                s.refresh(row)
                return _record(PolicyVersionRecord, row)
        except IntegrityError:
            pass
        with self._write() as s:
            existing = s.scalar(select(PolicyVersion).where(PolicyVersion.agent == agent,
                                                            PolicyVersion.version == version))
            if existing is None:
                raise KnowledgeError(f"policy {agent} {version}: could not be recorded")
            if sha256 and existing.sha256 and sha256 != existing.sha256:
                raise KnowledgeError(f"policy {agent} version {version!r} is registered with sha256 "
                                     f"{existing.sha256[:12]}…, not {sha256[:12]}…: give the new file a new version")
            if activate and not existing.active:
                self._activate(s, agent, existing.id)
                s.refresh(existing)
            return _record(PolicyVersionRecord, existing)

    @staticmethod
    def _activate(s: Session, agent: str, policy_id: int) -> None:
        if s.get_bind().dialect.name == "postgresql":
            # two registrations at once would each miss the other's uncommitted row and both
            # stay active (SQLite's BEGIN IMMEDIATE serialises them): one agent at a time, and
            # the UPDATE after the wait sees the other's committed row
            s.execute(text("SELECT pg_advisory_xact_lock(:space, hashtext(:agent))"),
                      {"space": _PG_POLICY_LOCK_SPACE, "agent": agent})
        s.execute(update(PolicyVersion).where(PolicyVersion.agent == agent)
                  .values(active=(PolicyVersion.id == policy_id)))

    @_guarded
    def active_policy(self, agent: str) -> PolicyVersionRecord | None:
        with self._read() as s:
            row = s.scalar(select(PolicyVersion).where(PolicyVersion.agent == agent, PolicyVersion.active)
                           .order_by(PolicyVersion.id.desc()).limit(1))
            return None if row is None else _record(PolicyVersionRecord, row)

    # --- queries for reports and tests ----------------------------------------------------------
    @_guarded
    def snapshot(self, snapshot_id: int) -> SnapshotRecord | None:
        with self._read() as s:
            row = s.get(Snapshot, snapshot_id)
            return None if row is None else _record(SnapshotRecord, row)

    @_guarded
    def observation(self, observation_id: int) -> ObservationRecord | None:
        with self._read() as s:
            row = s.get(Observation, observation_id)
            return None if row is None else _record(ObservationRecord, row)

    @_guarded
    def decisions(self, since: float | None = None, limit: int | None = None,
                  loop: str | None = None, newest_first: bool = False) -> list[DecisionRecord]:
        """Decisions created at or after `since` (epoch seconds), of one loop or all, oldest first
        (`limit` keeps the oldest), or newest first (`limit` keeps the newest)."""
        q = select(Decision).order_by(Decision.created_at.desc(), Decision.id.desc()) if newest_first \
            else select(Decision).order_by(Decision.created_at, Decision.id)
        if loop is not None:
            q = q.where(Decision.loop == loop)
        if since is not None:
            q = q.where(Decision.created_at >= since)
        if limit is not None:
            # SQLite reads a negative LIMIT as "no limit", PostgreSQL refuses it: one rule for both
            try:
                whole = None if isinstance(limit, bool) else operator.index(limit)
            except TypeError:
                whole = None
            if whole is None or whole < 0:
                raise ValueError(f"decisions: limit must be a whole number >= 0, not {limit!r}")
            q = q.limit(whole)
        with self._read() as s:
            return [_record(DecisionRecord, r) for r in s.scalars(q)]

    @_guarded
    def actions(self, decision_id: int | None = None) -> list[ActionRecord]:
        q = select(Action).order_by(Action.id)
        if decision_id is not None:
            q = q.where(Action.decision_id == decision_id)
        with self._read() as s:
            return [_record(ActionRecord, r) for r in s.scalars(q)]

    @_guarded
    def prune(self, older_than_s: float, *, now: float | None = None, batch: int = 2000) -> dict[str, int]:
        """Delete the history older than `now - older_than_s` and return the rows deleted per
        table: decisions with their actions, observations, snapshots. Kept whatever their age: a
        decision with an open action (recovery reads it) and what a kept row refers to; never
        touched: cool-downs, leases, policy versions (the state a restart needs). Deletes in
        transactions of `batch` decisions or rows, so a running daemon waits for one short lock,
        not for the whole history (SQLite reuses the freed pages; its file does not shrink)."""
        older_than_s = float(older_than_s)
        if not older_than_s >= MIN_RETENTION_S:  # NaN fails too
            raise ValueError(f"prune keeps at least {MIN_RETENTION_S:.0f} s of history, not {older_than_s}")
        if not 1 <= batch <= 100_000:
            raise ValueError(f"prune batch must be in [1, 100000], not {batch}")
        cutoff = self._now(now) - older_than_s
        deleted = {"decisions": 0, "actions": 0, "observations": 0, "snapshots": 0}
        open_action = select(Action.id).where(Action.decision_id == Decision.id,
                                              Action.status.in_(OPEN_ACTION_STATUSES)).exists()
        kept_observations = select(Decision.observation_id).where(Decision.observation_id.is_not(None))
        stages = [
            (Decision, select(Decision.id).where(Decision.created_at < cutoff, ~open_action)),
            (Observation, select(Observation.id).where(Observation.created_at < cutoff,
                                                       Observation.id.not_in(kept_observations))),
            # by when each row was written (a simulated loop's windows start at 0): a snapshot
            # recorded just now, its observation not yet, is young and stays
            (Snapshot, select(Snapshot.id).where(Snapshot.created_at < cutoff,
                                                 Snapshot.id.not_in(select(Observation.snapshot_id)))),
        ]
        for model, doomed in stages:
            while True:
                with self._write() as s:
                    ids = list(s.scalars(doomed.order_by(model.id).limit(batch)))
                    if not ids:
                        break
                    if model is Decision:
                        deleted["actions"] += s.execute(delete(Action).where(Action.decision_id.in_(ids))).rowcount
                    deleted[model.__tablename__] += s.execute(delete(model).where(model.id.in_(ids))).rowcount
        if any(deleted.values()):
            log.info("knowledge store %s: pruned history before %.0f: %s", self.url, cutoff,
                     ", ".join(f"{n} {t}" for t, n in deleted.items()))
        return deleted

    @_guarded
    def counts(self) -> dict[str, int]:
        """Rows per table."""
        with self._read() as s:
            return {t.name: s.scalar(select(func.count()).select_from(t)) or 0
                    for t in Base.metadata.sorted_tables}
