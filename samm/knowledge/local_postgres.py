"""A throwaway PostgreSQL server on loopback, from the distribution's server binaries.

For tests and demos of the Knowledge store on a real PostgreSQL:

    with LocalPostgres() as pg:          # initdb + postgres on a free 127.0.0.1 port (~1-2 s)
        store = KnowledgeStore(pg.url)   # postgresql+psycopg://postgres@127.0.0.1:PORT/postgres

The cluster lives in a temporary directory (removed on close), trusts local connections and
runs with fsync off: it is for data nobody needs after the test. PostgreSQL refuses to run as
root, so when we are root the directory is handed to the `postgres` OS user and the server
runs as that user. Binaries: `$SAMM_PG_BIN`, else the newest `/usr/lib/postgresql/*/bin`
(Debian's layout), else `pg_config --bindir`.
"""
from __future__ import annotations

import atexit
import logging
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import weakref
from pathlib import Path

from samm.localproc import popen_tied, stable_port

log = logging.getLogger(__name__)

SERVER_USER = "postgres"  # the OS user the server runs as when we are root


class PostgresUnavailable(RuntimeError):
    """No server binaries, no unprivileged user to run them, or the server did not start."""


def find_bin_dir() -> Path | None:
    """A directory holding `initdb` and `postgres`, or None."""
    candidates: list[Path] = []
    if os.environ.get("SAMM_PG_BIN"):
        candidates.append(Path(os.environ["SAMM_PG_BIN"]))

    def major(p: Path) -> float:
        try:
            return float(p.parent.name)
        except ValueError:
            return -1.0

    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=major, reverse=True)
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, timeout=10)
            candidates.append(Path(out.stdout.strip()))
        except (OSError, subprocess.SubprocessError):
            pass
    for c in candidates:
        if os.access(c / "initdb", os.X_OK) and os.access(c / "postgres", os.X_OK):
            return c
    return None


def why_unavailable() -> str | None:
    """None when a LocalPostgres can start here, else the reason."""
    if find_bin_dir() is None:
        return ("PostgreSQL server binaries (initdb, postgres) not found: install Debian's postgresql "
                "package or set SAMM_PG_BIN")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            return f"running as root and there is no {SERVER_USER!r} OS user to run the server as"
    return None


_live: "weakref.WeakSet[LocalPostgres]" = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for pg in list(_live):
        pg.close()


class LocalPostgres:
    """A private PostgreSQL cluster under `root_dir` (a temporary directory when None, removed
    on close), listening on 127.0.0.1:`port` (a free one when None) and a socket in its
    directory. `url` is ready for `KnowledgeStore`."""

    def __init__(self, root_dir: str | Path | None = None, port: int | None = None,
                 startup_timeout_s: float = 60.0):
        reason = why_unavailable()
        if reason:
            raise PostgresUnavailable(reason)
        self.bin_dir = find_bin_dir()
        self._own_root = root_dir is None
        self.root = Path(root_dir).resolve() if root_dir is not None else Path(tempfile.mkdtemp(prefix="samm-pg-"))
        self.port = port or stable_port()
        self.host = "127.0.0.1"
        self.user = "postgres"  # the database superuser initdb creates
        self.database = "postgres"
        self.startup_timeout_s = startup_timeout_s
        self._proc: subprocess.Popen | None = None
        self._as_user = SERVER_USER if os.geteuid() == 0 else None

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://{self.user}@{self.host}:{self.port}/{self.database}"

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _run_kwargs(self) -> dict:
        kw: dict = {"cwd": self.root, "stdin": subprocess.DEVNULL,
                    "env": {"PATH": "/usr/bin:/bin", "LC_ALL": "C", "LANG": "C", "TZ": "UTC"}}
        if self._as_user:
            pw = pwd.getpwnam(self._as_user)
            kw.update(user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
        return kw

    def _initdb(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if self._as_user:
            pw = pwd.getpwnam(self._as_user)
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        os.chmod(self.root, 0o700)
        out = subprocess.run([str(self.bin_dir / "initdb"), "-D", str(self.data_dir), "-U", self.user,
                              "-A", "trust", "-E", "UTF8", "--no-locale", "--no-sync"],
                             capture_output=True, text=True, timeout=120, **self._run_kwargs())
        if out.returncode != 0:
            raise PostgresUnavailable(f"initdb failed (exit {out.returncode}): {(out.stderr or out.stdout)[-2000:]}")

    def start(self) -> "LocalPostgres":
        """initdb on first start, then start the server and wait until it accepts queries.
        After `stop()` it starts again on the same port with the same data."""
        if self.running:
            return self
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb()
        logf = open(self.root / "postgres.log", "ab")
        try:
            self._proc = popen_tied(
                [str(self.bin_dir / "postgres"), "-D", str(self.data_dir), "-p", str(self.port),
                 "-h", self.host, "-k", str(self.root),
                 # throwaway data: durability off makes tests fast on slow disks
                 "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
                 "-c", "max_connections=100", "-c", "shared_buffers=32MB"],
                signal.SIGINT, stdout=logf,  # SIGINT: PostgreSQL's fast shutdown
                stderr=subprocess.STDOUT, **self._run_kwargs())
        finally:
            logf.close()
        _live.add(self)
        try:
            self._wait_ready(time.monotonic() + self.startup_timeout_s)
        except BaseException:
            self.stop()
            raise
        log.info("local PostgreSQL up: %s (data %s)", self.url, self.data_dir)
        return self

    def _wait_ready(self, deadline: float) -> None:
        import psycopg  # the driver is only needed once a server runs

        conninfo = f"host={self.host} port={self.port} user={self.user} dbname={self.database} connect_timeout=2"
        while True:
            if self._proc is not None and self._proc.poll() is not None:
                raise PostgresUnavailable(f"postgres exited with {self._proc.returncode}: {self.log_tail()}")
            try:
                with psycopg.connect(conninfo) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError as exc:
                if time.monotonic() > deadline:
                    raise PostgresUnavailable(f"postgres did not accept connections on {self.host}:{self.port} "
                                              f"in time ({exc}); log: {self.log_tail()}") from None
            time.sleep(0.05)

    def log_tail(self, n: int = 2000) -> str:
        try:
            return (self.root / "postgres.log").read_text(errors="replace")[-n:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Fast shutdown (SIGINT: open sessions are disconnected); SIGQUIT after 15 s, SIGKILL
        after 5 more."""
        p, self._proc = self._proc, None
        if p is None:
            return
        for sig, wait_s in ((signal.SIGINT, 15), (signal.SIGQUIT, 5), (signal.SIGKILL, 5)):
            if p.poll() is not None:
                break
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                break
            try:
                p.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                log.warning("postgres %d still running after %s", p.pid, signal.Signals(sig).name)
        p.wait(timeout=5)

    def close(self) -> None:
        self.stop()
        _live.discard(self)
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "LocalPostgres":
        # a failed start (its port taken, say) never reaches __exit__: its initdb'd temporary
        # cluster (tens of MB) stayed until the process exited, for good if initdb itself failed
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc) -> None:
        self.close()
