"""Helpers for the local service launchers (Graphite, PostgreSQL) that tests, benchmarks and
the testbed start on loopback."""
from __future__ import annotations

import ctypes
import os
import queue
import random
import signal
import socket
import subprocess
import threading
from pathlib import Path
from typing import Any, Callable


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def stable_port(exclude: set[int] | frozenset[int] = frozenset(), rng: random.Random | None = None) -> int:
    """A TCP port free on 127.0.0.1 right now and OUTSIDE the kernel's ephemeral range, for a
    service that is stopped and restarted on the same port: a port from the ephemeral range
    (what `free_port` returns) can meanwhile be handed to some client's outgoing connection,
    and the restart then fails with 'Address already in use'."""
    lo, hi = _ephemeral_range()
    candidates = [r for r in ((10000, lo - 1), (hi + 1, 65535)) if r[1] > r[0]]
    rng = rng or random.Random()
    for _ in range(200):
        a, b = rng.choice(candidates)
        port = rng.randint(a, b)
        if port in exclude:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return free_port()


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A `preexec_fn`: the child gets `sig` when the process that started it dies without
    running atexit (SIGKILL, a crashed test runner), and leads its own session. Runs between
    fork and exec; a user switch clears the setting, so it must run after one."""

    def setup() -> None:
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, sig)  # PR_SET_PDEATHSIG
        except OSError:
            pass
        os.setsid()

    return setup


_spawn_requests: "queue.SimpleQueue[tuple[Callable[[], Any], queue.SimpleQueue]]" = queue.SimpleQueue()
_spawner: threading.Thread | None = None
_spawner_lock = threading.Lock()


def _spawn_forever() -> None:
    while True:
        fn, reply = _spawn_requests.get()
        try:
            reply.put((True, fn()))
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller
            reply.put((False, exc))


def popen_tied(args: list[str], sig: int = signal.SIGTERM, **kw) -> subprocess.Popen:
    """`subprocess.Popen` with `die_with_parent(sig)`, started from a thread that lives as long
    as the process. The kernel's parent-death signal follows the *thread* that forked, so a
    child started from a short-lived thread (a fault-injection thread restarting Graphite)
    would otherwise be killed the moment that thread returns."""
    global _spawner
    preexec = die_with_parent(sig)

    def spawn() -> subprocess.Popen:
        return subprocess.Popen(args, preexec_fn=preexec, **kw)

    if threading.current_thread() is threading.main_thread():
        return spawn()
    with _spawner_lock:
        if _spawner is None or not _spawner.is_alive():
            _spawner = threading.Thread(target=_spawn_forever, name="samm-spawner", daemon=True)
            _spawner.start()
    reply: queue.SimpleQueue = queue.SimpleQueue()
    _spawn_requests.put((spawn, reply))
    ok, value = reply.get()
    if not ok:
        raise value
    return value


def start_samm_serve(serve_args: list[str], timeout_s: float = 120.0) -> tuple[subprocess.Popen, str, int]:
    """`samm serve --port P <serve_args>` on a free loopback port, started and answering
    /healthz: (process, base URL, port). The caller terminates the process. A service that exits
    first, or does not answer within `timeout_s` (then stopped), is a RuntimeError carrying the
    last line it wrote on stderr (its reason: a bad --agent, a policy folder that is not there)."""
    import sys
    import tempfile
    import time
    import urllib.request

    port = free_port()
    # a file, not a pipe: nobody drains a pipe while the service runs, and a full one would block it
    err = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-m", "samm.cli.main", "serve", "--port", str(port), *serve_args],
                            stdout=subprocess.DEVNULL, stderr=err, env=dict(os.environ))
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=1) as r:
                if r.status == 200:
                    return proc, url, port
        except OSError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"samm serve {' '.join(serve_args)} exited with {proc.returncode}{_last_line(err)}")
        if time.time() > deadline:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise RuntimeError(f"samm serve {' '.join(serve_args)} did not answer /healthz within {timeout_s:g} s"
                               f"{_last_line(err)}")
        time.sleep(0.2)


def _last_line(err) -> str:
    """': <the last non-empty line written to `err`>', or '' when there is none."""
    err.seek(0)
    lines = [line.strip() for line in err.read()[-4096:].decode(errors="replace").splitlines() if line.strip()]
    return f": {lines[-1]}" if lines else ""


class AppInThread:
    """An ASGI app on uvicorn in a daemon thread, on a free loopback port: the in-process services
    of the testbeds and the tests that talk HTTP to a real server. Also a context manager."""

    def __init__(self, app, name: str = "asgi-app", what: str = "the service"):
        import uvicorn

        self.what = what
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    access_log=False))
        self.thread = threading.Thread(target=self.server.run, name=name, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0):
        import time

        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"{self.what} did not start on {self.url}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
