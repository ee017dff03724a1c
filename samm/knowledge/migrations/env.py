"""Alembic environment of the Knowledge schema.

`samm.knowledge.schema.migrate` hands over an open connection, already in the transaction that
holds the migration lock, as `config.attributes["connection"]`. From the alembic CLI
(`alembic -c samm/knowledge/alembic.ini ...`, developers only) the URL comes from
`SAMM_KNOWLEDGE__URL`, else from the ini's `sqlalchemy.url`.
"""
from __future__ import annotations

import os

from alembic import context

from samm.knowledge.engine import normalize_url
from samm.knowledge.models import Base
from samm.knowledge.schema import VERSION_TABLE, migration_connection

config = context.config


def _url() -> str:
    url = os.environ.get("SAMM_KNOWLEDGE__URL") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit("set SAMM_KNOWLEDGE__URL (or sqlalchemy.url in the ini) to the Knowledge database")
    return url


def _configure(**kwargs) -> None:
    # batch operations: SQLite cannot ALTER most things in place; on PostgreSQL they are
    # plain ALTERs, so one script serves both
    context.configure(target_metadata=Base.metadata, version_table=VERSION_TABLE, render_as_batch=True,
                      compare_type=True, **kwargs)


def run_offline() -> None:
    _configure(url=normalize_url(_url()), literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection=connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    with migration_connection(_url()) as connection:
        _configure(connection=connection)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
