"""Schema migrations of the Knowledge store, run programmatically (no alembic CLI, no ini file:
works from an installed package).

`migrate(url)` upgrades to the newest revision inside one transaction that first takes a
migration lock, so a daemon and a reader process starting together on a fresh database do not
both create the tables: on SQLite the transaction is `BEGIN IMMEDIATE` (SQLite's DDL is
transactional), on PostgreSQL it takes an advisory transaction lock. Within one process,
migrations also take a thread lock: alembic's `context`/`op` proxies are process-global.

Developers create new revisions with the CLI: `alembic -c samm/knowledge/alembic.ini revision
--autogenerate -m "..."` with `SAMM_KNOWLEDGE__URL` pointing at a database at head; review the
script (batch operations are rendered for SQLite) and run the schema test.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import Connection, Engine, text
from sqlalchemy.engine import URL

from .engine import make_engine
from .models import Base

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
VERSION_TABLE = "samm_alembic_version"  # not alembic's default: the database may be shared
_PG_LOCK_KEY = 0x53414D4D  # "SAMM": the advisory lock serialising migrations
# alembic's `context` and `op` are module-level proxies: one migration at a time per process
_ALEMBIC_LOCK = threading.Lock()


def alembic_config(connection: Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, f"no migrations under {MIGRATIONS_DIR}"
    return head


def known_revision(revision: str) -> bool:
    """Whether `revision` is one of this SAMM's migrations (a newer SAMM's is not)."""
    try:
        return ScriptDirectory.from_config(alembic_config()).get_revision(revision) is not None
    except CommandError:
        return False


@contextmanager
def _engine(target: str | URL | Engine) -> Iterator[Engine]:
    if isinstance(target, Engine):
        yield target
        return
    engine = make_engine(target, foreign_keys=False)
    try:
        yield engine
    finally:
        engine.dispose()


@contextmanager
def migration_connection(target: str | URL | Engine) -> Iterator[Connection]:
    """A connection in a transaction that holds the migration lock; commits on success."""
    with _engine(target) as engine, engine.connect() as conn:
        conn.execution_options(sqlite_begin="IMMEDIATE")
        with conn.begin():
            if conn.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK_KEY})
            yield conn


def _migration_context(conn: Connection) -> MigrationContext:
    return MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE, "compare_type": True})


def migrate(target: str | URL | Engine, revision: str = "head") -> str | None:
    """Upgrade the database at `target` (a URL or an engine) to `revision`; returns the
    revision it is at afterwards. Running it again is a no-op."""
    with _ALEMBIC_LOCK, migration_connection(target) as conn:
        command.upgrade(alembic_config(conn), revision)
        return _migration_context(conn).get_current_revision()


def downgrade(target: str | URL | Engine, revision: str) -> str | None:
    with _ALEMBIC_LOCK, migration_connection(target) as conn:
        command.downgrade(alembic_config(conn), revision)
        return _migration_context(conn).get_current_revision()


def current_revision(target: str | URL | Engine) -> str | None:
    """The revision the database is at; None for a database never migrated."""
    with _engine(target) as engine, engine.connect() as conn:
        return _migration_context(conn).get_current_revision()


def schema_diff(target: str | URL | Engine) -> list:
    """Differences between the database and the ORM models (alembic's autogenerate
    comparison); empty when the migrations create exactly what `models.py` declares."""
    with _engine(target) as engine, engine.connect() as conn:
        return compare_metadata(_migration_context(conn), Base.metadata)
