"""PostgreSQL for the tests: a throwaway server from Debian's binaries
(samm.knowledge.local_postgres) for the whole session, or the server at SAMM_TEST_POSTGRES_URL.
Every test gets its own schema, so tests never see each other's rows."""
import os
import uuid

import pytest
from sqlalchemy import create_engine, text

from samm.knowledge import normalize_url
from samm.knowledge.local_postgres import LocalPostgres, why_unavailable


@pytest.fixture(scope="session")
def postgres_server_url():
    url = os.environ.get("SAMM_TEST_POSTGRES_URL")
    if url:
        yield url
        return
    reason = why_unavailable()
    if reason:
        pytest.skip(f"no PostgreSQL for the postgres tests: {reason} (or set SAMM_TEST_POSTGRES_URL)")
    with LocalPostgres() as pg:
        yield pg.url


@pytest.fixture
def pg_url(postgres_server_url):
    """A fresh schema on the server, selected by the URL's search_path."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = create_engine(normalize_url(postgres_server_url))
    with admin.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {name}"))
    url = normalize_url(postgres_server_url).update_query_dict({"options": f"-csearch_path={name}"})
    yield url.render_as_string(hide_password=False)
    with admin.begin() as conn:
        conn.execute(text(f"DROP SCHEMA {name} CASCADE"))
    admin.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def knowledge_url(request, tmp_path):
    """The knowledge store URL, once per supported database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/k.db"
    return request.getfixturevalue("pg_url")
