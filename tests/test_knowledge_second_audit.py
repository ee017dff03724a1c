"""Second audit of the Knowledge store (SQLite and a real PostgreSQL): what an operator reads
about it (URLs, errors) keeps secrets out and stays on one line; URLs as operators write them (a
driver SAMM lacks, a path under ~, a directory, their own connect timeout) work or are named;
what the loops hand it is stored, not a crash; a throwaway PostgreSQL that fails to start
leaves nothing behind."""
from __future__ import annotations

import re
import socket
import time

import numpy as np
import pytest

from samm.knowledge import KnowledgeError, KnowledgeStore
from samm.knowledge.engine import redacted
from samm.knowledge.store import to_json


# --- secrets in URLs ----------------------------------------------------------------------------

def test_a_password_given_as_a_query_parameter_is_never_shown():
    # libpq takes ?password=... (and ?sslpassword=...); SQLAlchemy's hide_password masks only the
    # user-info password, so the store's errors and every summary showed this one
    url = "postgresql://samm@127.0.0.1:1/samm?sslmode=disable&password=hunter2&sslpassword=keypass"
    with pytest.raises(KnowledgeError, match="cannot open") as err:
        KnowledgeStore(url)
    assert "hunter2" not in str(err.value) and "keypass" not in str(err.value)
    assert "password=***" in str(err.value) and "sslmode=disable" in str(err.value)
    shown = redacted(url)
    assert "hunter2" not in shown and "keypass" not in shown and "127.0.0.1:1" in shown


@pytest.mark.postgres
def test_the_url_of_an_open_postgres_store_hides_a_query_password(pg_url):
    # the local server trusts loopback: the password is accepted and ignored
    with KnowledgeStore(pg_url + "&password=hunter2") as s:
        assert s.record_decision("k", agent="a", action=1, source="agent")[1]
        assert "hunter2" not in s.url and "hunter2" not in repr(s)


# --- errors on one line -------------------------------------------------------------------------

def test_an_unreachable_postgres_is_named_on_one_line():
    # psycopg's message adds a tab-indented hint on a second line: the operator's one-line error
    # (and a log line) came out in two pieces
    with pytest.raises(KnowledgeError, match="cannot open: .*Connection refused") as err:
        KnowledgeStore("postgresql://samm@127.0.0.1:1/samm")
    assert "\n" not in str(err.value) and "\t" not in str(err.value)


def test_a_constraint_error_is_named_on_one_line(knowledge_url):
    # PostgreSQL adds a DETAIL line to a failed constraint
    with KnowledgeStore(knowledge_url) as s:
        with pytest.raises(KnowledgeError, match="record_observation failed: IntegrityError") as err:
            s.record_observation(999, {"cpu_mean": 0.5})
        assert "\n" not in str(err.value)
        assert s.counts()["observations"] == 0


# --- values from numpy --------------------------------------------------------------------------

def test_long_double_values_are_stored_as_numbers(knowledge_url):
    # np.longdouble(...).item() is the numpy scalar itself: to_json recursed until RecursionError,
    # so a snapshot or a feature computed in long double was never recorded
    assert to_json(np.longdouble(1.5)) == 1.5
    assert to_json([np.longdouble("inf")]) == [None]
    with KnowledgeStore(knowledge_url) as s:
        snap = s.record_snapshot(0.0, 60.0, "ok", raw={"cpu": np.array([0.25, 0.5], dtype=np.longdouble)})
        obs = s.record_observation(snap, {"cpu_mean": np.longdouble(0.375)})
        assert s.snapshot(snap).raw == {"cpu": [0.25, 0.5]}
        assert s.observation(obs).features == {"cpu_mean": 0.375}


# --- drivers SAMM does not have -----------------------------------------------------------------

@pytest.mark.parametrize("url, says", [
    ("postgresql+psycopg2://samm:hunter2@127.0.0.1:1/samm", "driver 'postgresql+psycopg2' is not available"),
    ("postgresql+nosuch://samm:hunter2@127.0.0.1:1/samm", "driver 'postgresql+nosuch' is not available"),
    ("postgresql+psycopg_async://samm:hunter2@127.0.0.1:1/samm", "is an asyncio driver"),
])
def test_a_url_naming_a_driver_samm_cannot_use_is_a_clear_error(url, says):
    # URLs copied from elsewhere say postgresql+psycopg2://: create_engine's ImportError escaped as
    # a traceback; an asyncio driver failed at its first query ("greenlet_spawn has not been called")
    with pytest.raises(KnowledgeError, match=re.escape(says)) as err:
        KnowledgeStore(url)
    assert "postgresql://" in str(err.value) and "hunter2" not in str(err.value)


def test_samm_run_with_a_psycopg2_url_stops_in_one_line(tmp_path):
    from click.testing import CliRunner

    from samm.cli.main import cli

    cfg = tmp_path / "c.yaml"
    cfg.write_text("groups:\n"
                   "  - {name: S, cores: 2, ram_gb: 8, price_per_hour: 0.1, min: 1, max: 4}\n"
                   "executor: {kind: sim}\nagent: {name: noop}\n"
                   "knowledge: {url: 'postgresql+psycopg2://samm@127.0.0.1:1/samm'}\n")
    out = CliRunner().invoke(cli, ["run", "--config", str(cfg), "--iterations", "1"])
    assert out.exit_code == 2, out.output
    assert "cannot start: knowledge.url: database driver 'postgresql+psycopg2' is not available" in out.output
    assert "Traceback" not in out.output


# --- the throwaway PostgreSQL -------------------------------------------------------------------

@pytest.mark.postgres
def test_a_local_postgres_that_fails_to_start_leaves_no_cluster_behind():
    from samm.knowledge.local_postgres import LocalPostgres, PostgresUnavailable, why_unavailable

    if why_unavailable():
        pytest.skip(why_unavailable())
    with socket.socket() as taken:  # another program on its port: postgres exits at start
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        pg = LocalPostgres(port=taken.getsockname()[1], startup_timeout_s=30)
        with pytest.raises(PostgresUnavailable, match="postgres exited"):
            with pg:
                pass
    assert not pg.root.exists() and not pg.running


# --- SQLite paths -------------------------------------------------------------------------------

def test_a_sqlite_path_under_the_home_directory_is_expanded(tmp_path, monkeypatch):
    # sqlite:///~/samm.db made a directory literally named "~" in the working directory: started
    # from another directory (or by systemd), the daemon found an empty store and no cool-downs
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    with KnowledgeStore("sqlite:///~/state/samm.db") as s:
        s.set_cooldown("web", 500.0)
        assert s.url == f"sqlite:///{home}/state/samm.db"
    assert (home / "state" / "samm.db").exists() and not (cwd / "~").exists()
    monkeypatch.chdir(tmp_path)
    with KnowledgeStore("sqlite:///~/state/samm.db") as s:
        assert s.cooldowns() == {"web": 500.0}


def test_a_sqlite_url_naming_a_directory_says_so(tmp_path):
    # SQLite says only "unable to open database file"
    (tmp_path / "state").mkdir()
    with pytest.raises(KnowledgeError, match=r"cannot open: unable to open database file \(.*state is a "
                                             r"directory: knowledge.url names the database file"):
        KnowledgeStore(f"sqlite:///{tmp_path}/state")


# --- connection options -------------------------------------------------------------------------

def test_a_connect_timeout_in_the_url_is_honoured():
    # the store's default connect_args (10 s) silently replaced the URL's own ?connect_timeout=:
    # a server that accepts TCP but never answers held every start and reconnect for 10 s
    with socket.socket() as silent:  # the kernel completes the handshake; nobody ever answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(KnowledgeError, match="cannot open"):
            KnowledgeStore(f"postgresql://samm@127.0.0.1:{port}/samm?connect_timeout=2")
        assert time.monotonic() - started < 6


def test_postgres_connections_find_a_dead_peer_within_about_a_minute(pg_url):
    """libpq's keep-alives wait two hours by default: a server gone mid-query held the call."""
    with KnowledgeStore(pg_url) as s, s.engine.connect() as conn:
        params = conn.connection.dbapi_connection.info.get_parameters()
    assert params["keepalives_idle"] == "30" and params["tcp_user_timeout"] == "60000"
    assert params["connect_timeout"] == "10"


def test_a_keepalive_setting_in_the_url_wins(pg_url):
    with KnowledgeStore(pg_url + "&keepalives_idle=5") as s, s.engine.connect() as conn:
        params = conn.connection.dbapi_connection.info.get_parameters()
    assert params["keepalives_idle"] == "5" and params["keepalives_count"] == "3"


@pytest.mark.parametrize("name", ["run?1", "c%41d", "14:30 ü"])
def test_sqlite_url_keeps_the_store_in_any_folder(tmp_path, name):
    """The testbeds pasted their run folder into "sqlite:///{path}": a `?` began a query and the
    store went to another file, a `%41` was decoded to another folder."""
    from samm.knowledge.engine import sqlite_url

    folder = tmp_path / name
    folder.mkdir()
    KnowledgeStore(sqlite_url(folder / "k.db")).close()
    assert (folder / "k.db").is_file() and sorted(p.name for p in tmp_path.iterdir()) == [name]
