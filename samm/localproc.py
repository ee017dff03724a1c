"""Helpers for the local service launchers (Graphite, PostgreSQL) that tests, benchmarks and
the testbed start on loopback."""
from __future__ import annotations

import ctypes
import os
import queue
import signal
import socket
import subprocess
import threading
from typing import Any, Callable


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
