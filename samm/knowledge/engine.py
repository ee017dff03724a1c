"""Database URLs and engines for the Knowledge store: SQLite (default) or PostgreSQL.

SQLite is set up so that the daemon and a reader process (reports, the CLI) can share one file:
WAL journal (readers never block the writer), a busy timeout (a writer waits for the lock
instead of failing with "database is locked"), foreign keys on. pysqlite's own transaction
handling is replaced by explicit BEGINs (SQLAlchemy's documented recipe) so that a SELECT
belongs to its transaction and a writer can ask for `BEGIN IMMEDIATE` (execution option
`sqlite_begin`): it takes the write lock up front, waiting up to the busy timeout, and can
never fail later on a lock upgrade.

PostgreSQL URLs without a driver (`postgresql://`, `postgres://`) get psycopg 3, the driver
SAMM installs (SQLAlchemy's default would be psycopg2).
"""
from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError
from sqlalchemy.pool import StaticPool

from samm.config import url_without_password

SUPPORTED_BACKENDS = ("sqlite", "postgresql")
URL_EXAMPLES = "e.g. sqlite:///var/lib/samm/samm.db or postgresql+psycopg://samm@db.example/samm"
_BEGIN_MODES = ("DEFERRED", "IMMEDIATE", "EXCLUSIVE")
_DRIVERS = ("write sqlite:///PATH, or postgresql://... for psycopg 3, the driver SAMM installs "
            "(postgresql+psycopg://...)")
#: libpq settings for a daemon's connections unless its URL sets them. A server that vanished
#: mid-query (a partition, a host frozen) otherwise held a call until the kernel gave up on the
#: socket: libpq's keep-alives wait two hours by default, and unacknowledged data ~15 minutes.
#: With these a dead peer is found within about a minute and the call fails (the loop does nothing
#: that iteration, as with any store error)
PG_CONNECT_DEFAULTS = {"connect_timeout": 10, "keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10,
                       "keepalives_count": 3, "tcp_user_timeout": 60_000}
_RAW_AT = "knowledge.url (scheme {scheme!r}): an '@' in the user name or password must be written %40"


class KnowledgeError(RuntimeError):
    """A Knowledge store problem, phrased for the operator (passwords never included)."""


def normalize_url(url: str | URL) -> URL:
    """The URL SAMM connects with; raises KnowledgeError naming the problem."""
    if isinstance(url, str):
        text = url.strip()
        if not text:
            raise KnowledgeError(f"knowledge.url is empty; {URL_EXAMPLES}")
        if text.startswith("postgres://"):  # Heroku-style alias SQLAlchemy rejects
            text = "postgresql://" + text[len("postgres://"):]
        scheme = text.split("://", 1)[0] if "://" in text else "(no scheme)"
        try:
            parsed = make_url(text)
        except ArgumentError:
            # the parser's message repeats the whole string, password included
            raise KnowledgeError(f"knowledge.url is not a database URL (scheme {scheme!r}); {URL_EXAMPLES}") from None
        except ValueError:  # int() of the port; past an "@" in the password, the port text is part of it
            if text.count("@") > 1:
                raise KnowledgeError(_RAW_AT.format(scheme=scheme)) from None
            raise KnowledgeError(f"knowledge.url (scheme {scheme!r}): its port is not a number; "
                                 f"{URL_EXAMPLES}") from None
        if "@" in (parsed.host or ""):
            # the parser ends the password at its first "@": the rest, taken for the host, was shown
            # in every log line and connection error
            raise KnowledgeError(_RAW_AT.format(scheme=scheme))
    else:
        parsed = url
    backend = parsed.get_backend_name()
    if backend not in SUPPORTED_BACKENDS:
        raise KnowledgeError(f"knowledge.url: unsupported database {backend!r} (supported: "
                             f"{', '.join(SUPPORTED_BACKENDS)}); {URL_EXAMPLES}")
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    if backend == "sqlite" and (parsed.database or "").startswith("~"):
        # SQLite takes "~" literally: the database went to a directory named "~" under whatever
        # the working directory was, and a start from another one found an empty store
        parsed = parsed.set(database=os.path.expanduser(parsed.database))
    return parsed


def sqlite_url(path: str | Path) -> str:
    """The URL of the SQLite file at `path`, whatever characters the path holds: pasted into
    "sqlite:///{path}", a `?` began a query (the store went to another file) and a `%41` was
    decoded (to another directory)."""
    return URL.create("sqlite", database=str(path)).render_as_string(hide_password=False)


def shown(url: URL) -> str:
    """`url` as errors and logs show it: every password as ***, the `?password=` that libpq
    takes too (SQLAlchemy's hide_password leaves it in every error and summary)."""
    return url_without_password(url.render_as_string(hide_password=True))


def redacted(url: str | URL) -> str:
    try:
        return shown(normalize_url(url))
    except KnowledgeError:
        return "(invalid URL)"


def sqlite_path(url: URL) -> Path | None:
    """The database file of a SQLite URL; None for in-memory and `file:` URI databases."""
    db = url.database
    if url.get_backend_name() != "sqlite" or not db or db == ":memory:" or db.startswith("file:"):
        return None
    return Path(db)


def is_memory_sqlite(url: URL) -> bool:
    db = url.database
    return url.get_backend_name() == "sqlite" and (not db or db == ":memory:" or "mode=memory" in db)


def make_engine(url: str | URL, *, foreign_keys: bool = True, busy_timeout_s: float = 30.0) -> Engine:
    """An engine for `url` (SQLite parent directories are created). `foreign_keys=False` is
    for migrations: SQLite's batch mode copies and drops tables, which enforced foreign keys
    would refuse."""
    u = normalize_url(url)
    if u.get_backend_name() != "sqlite":
        # pre-ping: a daemon outlives database restarts; connect_timeout: a dead host fails
        # one loop iteration, not the whole daemon. connect_args outrank the URL's query, so the
        # defaults must not replace an operator's own ?connect_timeout= (or the others)
        defaults = {k: v for k, v in PG_CONNECT_DEFAULTS.items() if k not in u.query}
        return _create_engine(u, pool_pre_ping=True, connect_args=defaults)

    path = sqlite_path(u)
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise KnowledgeError(f"cannot create the directory of the SQLite database {path}: {exc.strerror}") from None
    kwargs: dict = {"connect_args": {"timeout": busy_timeout_s}}
    if is_memory_sqlite(u):
        # every connection to :memory: is a new, empty database: share one (KnowledgeStore
        # serialises its use across threads)
        kwargs.update(poolclass=StaticPool, connect_args={"timeout": busy_timeout_s, "check_same_thread": False})
    engine = _create_engine(u, **kwargs)
    busy_ms = int(busy_timeout_s * 1000)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record) -> None:
        dbapi_conn.isolation_level = None  # BEGIN is ours (see _on_begin)
        cur = dbapi_conn.cursor()
        try:
            cur.execute(f"PRAGMA busy_timeout = {busy_ms}")
            _wal(cur, busy_timeout_s)
            cur.execute("PRAGMA synchronous = NORMAL")  # durable across crashes in WAL mode
            cur.execute(f"PRAGMA foreign_keys = {'ON' if foreign_keys else 'OFF'}")
        finally:
            cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn) -> None:
        mode = str(conn.get_execution_options().get("sqlite_begin", "DEFERRED")).upper()
        if mode not in _BEGIN_MODES:
            raise ValueError(f"sqlite_begin must be one of {_BEGIN_MODES}, got {mode!r}")
        conn.exec_driver_sql(f"BEGIN {mode}")

    return engine


def _create_engine(u: URL, **kwargs) -> Engine:
    """create_engine, refusing by name a driver SAMM cannot use: URLs copied from elsewhere often
    say postgresql+psycopg2:// (not installed: a traceback at start) or name an asyncio driver
    (its first query failed with "greenlet_spawn has not been called")."""
    try:
        engine = create_engine(u, **kwargs)
    except (ImportError, NoSuchModuleError) as exc:
        raise KnowledgeError(f"knowledge.url: database driver {u.drivername!r} is not available ({exc}); "
                             f"{_DRIVERS}") from None
    except (ValueError, TypeError) as exc:
        # the driver converts some query parameters (sqlite's ?timeout=, ?check_same_thread=) at
        # create_engine: a bad value left as a bare "could not convert string to float" traceback
        raise KnowledgeError(f"knowledge.url {shown(u)}: a query parameter has a value the driver cannot use "
                             f"({exc})") from None
    if engine.dialect.is_async:
        engine.dispose()
        raise KnowledgeError(f"knowledge.url: {u.drivername!r} is an asyncio driver, which the knowledge store "
                             f"cannot use; {_DRIVERS}")
    return engine


def _wal(cur, busy_timeout_s: float) -> None:
    """Switch the database to WAL once. Switching needs the database to itself, and SQLite
    answers "database is locked" at once, without its busy handler, while another process is
    in a transaction (processes opening a fresh database together, one of them migrating): retry
    within the busy timeout instead of failing the connection."""
    import sqlite3
    import time

    deadline = time.monotonic() + busy_timeout_s
    while True:
        try:
            if str(cur.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                cur.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.02)
