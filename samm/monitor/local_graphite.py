"""A real, private Graphite on loopback: carbon-cache + graphite-web from the Debian packages.

Used by the tests, the testbed and `samm demo`. Both daemons run under the system
`/usr/bin/python3` (Django 3.2 from Debian), never the project venv, with their own config
under `root_dir` and free loopback ports, so several instances can coexist on one machine.

    with LocalGraphite(tmp_path) as g:
        GraphiteSender(g.carbon_host, g.carbon_port).send(...)
        RenderClient(g.render_url).render(...)
        g.stop(); g.start()   # an outage; the whisper files (the data) survive

Pitfalls this handles (see the platform notes): carbon's default MAX_CREATES_PER_MINUTE (50)
silently drops new metrics, so every budget is `inf`; graphite-web answers HTTP 500 to every
request without a settings module named by GRAPHITE_SETTINGS_MODULE; points stay in carbon's
cache before they reach disk, so graphite-web queries carbon's cache port (CARBONLINK_HOSTS);
roll-ups use xFilesFactor 0 so one 10 s point per 10 one-second slots still rolls up.
"""
from __future__ import annotations

import atexit
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
import weakref
from pathlib import Path

from samm.localproc import popen_tied, stable_port

log = logging.getLogger(__name__)

SYSTEM_PYTHON = "/usr/bin/python3"
CARBON_CACHE = "/usr/bin/carbon-cache"
SETTINGS_MODULE = "samm_local_graphite_settings"

# Counters keep their last value when rolled up (an average of a cumulative count means
# nothing); everything else is averaged. xFilesFactor 0: a 10 s sender leaves 9 of every 10
# one-second slots empty, and the roll-up must still happen.
STORAGE_AGGREGATION = """\
[counters]
pattern = _total$
xFilesFactor = 0
aggregationMethod = last

[count]
pattern = \\.count$
xFilesFactor = 0
aggregationMethod = sum

[max]
pattern = \\.max$
xFilesFactor = 0
aggregationMethod = max

[default]
pattern = .*
xFilesFactor = 0
aggregationMethod = average
"""


class GraphiteUnavailable(RuntimeError):
    """The Debian packages are missing, or the daemons did not come up (the message says which)."""


def missing_packages() -> list[str]:
    """Names of the missing pieces (empty when a LocalGraphite can start)."""
    missing = []
    if not os.access(CARBON_CACHE, os.X_OK):
        missing.append(f"{CARBON_CACHE} (Debian package graphite-carbon)")
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        missing.append(SYSTEM_PYTHON)
    elif not Path("/usr/lib/python3/dist-packages/graphite/settings.py").exists():
        missing.append("graphite-web for /usr/bin/python3 (Debian package graphite-web)")
    return missing


_live: "weakref.WeakSet[LocalGraphite]" = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    # close, not only stop: a temporary root of an instance never closed is removed too
    for g in list(_live):
        g.close()


class LocalGraphite:
    """carbon-cache + graphite-web on free loopback ports under `root_dir` (a temporary
    directory when None, removed on close).

    `retentions` is carbon's storage-schemas string for every metric. `server` picks how
    graphite-web is served: "wsgi" (default) runs `graphite_web_server.py`, a threaded stdlib
    WSGI server that also migrates, in one interpreter; "runserver" is the documented recipe
    (`django migrate` + `runserver --nothreading`), about a second slower to start and
    one request at a time.
    `die_with_parent` asks the kernel to SIGTERM the daemons when this process dies without
    cleaning up (SIGKILL, a crashed test runner), a safety net against leaked processes; the
    daemons are forked from a thread that lives as long as the process, so starting (or
    restarting) from a short-lived thread is safe.
    """

    def __init__(self, root_dir: str | Path | None = None, retentions: str = "1s:6h,10s:1d,1m:7d",
                 server: str = "wsgi", startup_timeout_s: float = 30.0, die_with_parent: bool = True):
        missing = missing_packages()
        if missing:
            raise GraphiteUnavailable("cannot start a local Graphite, missing: " + ", ".join(missing))
        # checked before the temporary root is made: a refused argument must leave nothing behind
        if server not in ("wsgi", "runserver"):
            raise ValueError(f"server must be 'wsgi' or 'runserver', got {server!r}")
        self._own_root = root_dir is None
        self.root = Path(root_dir).resolve() if root_dir is not None else Path(tempfile.mkdtemp(prefix="samm-graphite-"))
        self.retentions = retentions
        self.server = server
        self.startup_timeout_s = startup_timeout_s
        self.die_with_parent = die_with_parent
        self.carbon_host = "127.0.0.1"
        # outside the ephemeral range: stop()/start() must get the same ports back
        ports: set[int] = set()
        for _ in range(4):
            ports.add(stable_port(exclude=ports))
        self.carbon_port, self.pickle_port, self.query_port, self.web_port = sorted(ports)
        self._carbon: subprocess.Popen | None = None
        self._web: subprocess.Popen | None = None
        self._migrated = False
        try:
            self._write_config()
        except BaseException:
            self.close()  # a temporary root half written (a full disk, say) is ours to remove
            raise

    @property
    def render_url(self) -> str:
        """Base URL of graphite-web (append /render, /metrics/find, /events/)."""
        return f"http://127.0.0.1:{self.web_port}"

    @property
    def whisper_dir(self) -> Path:
        return self.root / "storage" / "whisper"

    @property
    def running(self) -> bool:
        return all(p is not None and p.poll() is None for p in (self._carbon, self._web))

    # --- configuration ---------------------------------------------------------------------
    def _write_config(self) -> None:
        conf, storage = self.root / "conf", self.root / "storage"
        for d in (conf, storage / "log" / "webapp", self.whisper_dir, self.root / "run"):
            d.mkdir(parents=True, exist_ok=True)
        (conf / "carbon.conf").write_text(f"""\
[cache]
STORAGE_DIR = {storage}/
LOCAL_DATA_DIR = {self.whisper_dir}/
CONF_DIR = {conf}/
LOG_DIR = {self.root}/log/
PID_DIR = {self.root}/run/
USER =
DATABASE = whisper
ENABLE_LOGROTATION = False
MAX_CACHE_SIZE = inf
MAX_UPDATES_PER_SECOND = inf
MAX_UPDATES_PER_SECOND_ON_SHUTDOWN = inf
MAX_CREATES_PER_MINUTE = inf
MIN_TIMESTAMP_RESOLUTION = 1
LINE_RECEIVER_INTERFACE = 127.0.0.1
LINE_RECEIVER_PORT = {self.carbon_port}
ENABLE_UDP_LISTENER = False
PICKLE_RECEIVER_INTERFACE = 127.0.0.1
PICKLE_RECEIVER_PORT = {self.pickle_port}
CACHE_QUERY_INTERFACE = 127.0.0.1
CACHE_QUERY_PORT = {self.query_port}
USE_FLOW_CONTROL = True
LOG_UPDATES = False
LOG_CREATES = False
LOG_LISTENER_CONNECTIONS = False
CACHE_WRITE_STRATEGY = sorted
WHISPER_AUTOFLUSH = False
WHISPER_FALLOCATE_CREATE = False
WHISPER_SPARSE_CREATE = True
""")
        (conf / "storage-schemas.conf").write_text(
            f"[carbon]\npattern = ^carbon\\.\nretentions = 60:90d\n\n"
            f"[default]\npattern = .*\nretentions = {self.retentions}\n")
        (conf / "storage-aggregation.conf").write_text(STORAGE_AGGREGATION)
        (conf / f"{SETTINGS_MODULE}.py").write_text(f"""\
SECRET_KEY = "samm-local-graphite"
TIME_ZONE = "UTC"
STORAGE_DIR = {str(storage)!r}
WHISPER_DIR = {str(self.whisper_dir) + '/'!r}
INDEX_FILE = {str(storage / 'index')!r}
LOG_DIR = {str(storage / 'log' / 'webapp')!r}
STANDARD_DIRS = [WHISPER_DIR]
CARBONLINK_HOSTS = ["127.0.0.1:{self.query_port}:a"]
CARBONLINK_TIMEOUT = 1.0
CARBONLINK_RETRY_DELAY = 1
DATABASES = {{"default": {{"NAME": {str(storage / 'graphite.db')!r}, "ENGINE": "django.db.backends.sqlite3",
                          "USER": "", "PASSWORD": "", "HOST": "", "PORT": ""}}}}
LOG_RENDERING_PERFORMANCE = False
LOG_CACHE_PERFORMANCE = False
DEFAULT_CACHE_DURATION = 0
USE_WORKER_POOL = False
TAGDB = "graphite.tags.localdatabase.LocalDatabaseTagDB"

# A throw-away Graphite: no fsync per sqlite transaction (migrate is ~3x faster on slow disks)
from django.db.backends.signals import connection_created


def _fast_sqlite(sender, connection, **kwargs):
    if connection.vendor == "sqlite":
        with connection.cursor() as cur:
            cur.execute("PRAGMA synchronous=OFF")
            cur.execute("PRAGMA journal_mode=MEMORY")


connection_created.connect(_fast_sqlite)
""")

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "DJANGO"))}
        env.update(PYTHONPATH=str(self.root / "conf"), DJANGO_SETTINGS_MODULE="graphite.settings",
                   GRAPHITE_SETTINGS_MODULE=SETTINGS_MODULE, TZ="UTC")
        # the venv's bin first on PATH would still not matter (absolute interpreter), but
        # keep /usr/bin ahead so carbon's own shebang resolves to the system python
        env["PATH"] = "/usr/bin:/bin:" + env.get("PATH", "")
        return env

    def _popen(self, args: list[str], log_name: str) -> subprocess.Popen:
        out = open(self.root / log_name, "ab")
        try:
            kw = dict(cwd=self.root, env=self._env(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            if self.die_with_parent:
                return popen_tied(args, signal.SIGTERM, **kw)
            return subprocess.Popen(args, preexec_fn=os.setsid, **kw)
        finally:
            out.close()

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> "LocalGraphite":
        """Start both daemons (again, after `stop()`: same ports, same data) and wait until
        carbon accepts connections and graphite-web answers /metrics/find."""
        if self.running:
            return self
        self.stop()
        self._check_ports_free()
        self._remove_stale_pid_files()
        deadline = time.monotonic() + self.startup_timeout_s
        self._carbon = self._popen([SYSTEM_PYTHON, CARBON_CACHE, "--config", str(self.root / "conf" / "carbon.conf"),
                                    "--nodaemon", "--logdir", str(self.root / "log"), "start"], "carbon.out")
        _live.add(self)
        if self.server == "runserver":
            if not self._migrated:
                mig = subprocess.run([SYSTEM_PYTHON, "-m", "django", "migrate", "--run-syncdb", "-v", "0"],
                                     cwd=self.root, env=self._env(), capture_output=True, text=True,
                                     timeout=max(1.0, deadline - time.monotonic()))
                if mig.returncode != 0:
                    self.stop()
                    raise GraphiteUnavailable(f"graphite-web migrate failed (exit {mig.returncode}): {mig.stderr[-2000:]}")
            args = [SYSTEM_PYTHON, "-m", "django", "runserver", f"127.0.0.1:{self.web_port}", "--noreload", "--nothreading"]
        else:
            # migrates (the sqlite DB holds events and tags) and serves in one interpreter
            args = [SYSTEM_PYTHON, str(Path(__file__).with_name("graphite_web_server.py")), "127.0.0.1",
                    str(self.web_port), "0" if self._migrated else "1"]
        self._web = self._popen(args, "web.out")
        try:
            self._wait_ready(deadline)
        except BaseException:
            self.stop()
            raise
        self._migrated = True
        log.info("local Graphite up: carbon %s:%d, web %s", self.carbon_host, self.carbon_port, self.render_url)
        return self

    def _check_ports_free(self) -> None:
        """Raise naming the ports another process listens on. The ports were free when this
        instance was made, but a restart after `stop()` can find one taken; carbon then dies
        while the ready check, talking to whoever holds the port, would report it up."""
        taken = []
        for name, port in (("carbon line receiver", self.carbon_port), ("carbon pickle receiver", self.pickle_port),
                           ("carbon cache query", self.query_port), ("graphite-web", self.web_port)):
            with socket.socket() as s:
                # as the daemons bind: our own last run's TIME_WAIT connections are no conflict
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    taken.append(f"{port} ({name})")
        if taken:
            raise GraphiteUnavailable("cannot start a local Graphite: another process holds 127.0.0.1 port(s) "
                                      + ", ".join(taken))

    def _remove_stale_pid_files(self) -> None:
        """carbon-cache refuses to start while its pid file names a live process, and after a
        crash or a reboot that pid can belong to anything. Our carbon runs in the foreground and
        was stopped above, so a pid file here is stale unless it names a carbon of this root."""
        conf = str(self.root / "conf" / "carbon.conf")
        for f in (self.root / "run").glob("*.pid"):
            try:
                cmdline = Path(f"/proc/{int(f.read_text().strip())}/cmdline").read_bytes().decode(errors="replace")
            except (OSError, ValueError):
                cmdline = ""
            if "carbon-cache" in cmdline and conf in cmdline:
                continue  # a carbon of this root still runs: carbon's own refusal names it
            log.info("removing stale carbon pid file %s", f)
            f.unlink(missing_ok=True)

    def _wait_ready(self, deadline: float) -> None:
        def alive_or_raise():
            for name, p, logf in (("carbon-cache", self._carbon, "carbon.out"), ("graphite-web", self._web, "web.out")):
                if p.poll() is not None:
                    tail = (self.root / logf).read_text(errors="replace")[-2000:]
                    raise GraphiteUnavailable(f"{name} exited with {p.returncode}: {tail}")

        while True:
            alive_or_raise()
            try:
                socket.create_connection((self.carbon_host, self.carbon_port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise GraphiteUnavailable(f"carbon-cache not listening on {self.carbon_port} in time") from None
                time.sleep(0.05)
        url = f"{self.render_url}/metrics/find?query=*"
        while True:
            alive_or_raise()
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise GraphiteUnavailable(f"graphite-web did not answer {url} in time")
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM both daemons (carbon writes its cache to disk first) and wait for them;
        SIGKILL after 10 s."""
        for p in (self._web, self._carbon):
            if p is None or p.poll() is not None:
                continue
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in (self._web, self._carbon):
            if p is None:
                continue
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log.warning("Graphite daemon %d ignored SIGTERM; killing it", p.pid)
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(timeout=5)
        self._web = self._carbon = None

    def close(self) -> None:
        self.stop()
        _live.discard(self)
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "LocalGraphite":
        # a failed start (a port taken, a daemon that died) never reaches __exit__: its temporary
        # root stayed behind for good (the exit hook only stops daemons), as LocalPostgres's did
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc) -> None:
        self.close()
