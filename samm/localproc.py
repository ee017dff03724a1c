"""Helpers for the local service launchers (Graphite, PostgreSQL) that tests, benchmarks and
the testbed start on loopback."""
from __future__ import annotations

import ctypes
import os
import signal
import socket
from typing import Callable


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
