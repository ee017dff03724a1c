"""systemd's sd_notify protocol in the standard library (no systemd-python: it does not build in a
venv). Each call sends one datagram to `$NOTIFY_SOCKET`; a leading `@` names a socket in the
abstract namespace. Without `$NOTIFY_SOCKET` (not started by systemd, or `Type=` other than
notify) every call is a no-op, and a send error is logged, never raised: a notification must not
take the daemon down.

Protocol as the daemon uses it: `ready()` once config, database and scheduler are up;
`watchdog()` only when the daemon has actually made progress (a standby's polls, the start-up
recovery, then the control loops' iterations); `stopping()` on SIGTERM;
`status(text)` for `systemctl status`.
"""
from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger(__name__)


def notify_socket(environ: Mapping[str, str] | None = None) -> str | None:
    """`$NOTIFY_SOCKET`: set when systemd started this process as a Type=notify service."""
    env = os.environ if environ is None else environ
    return env.get("NOTIFY_SOCKET") or None


def notify(message: str, environ: Mapping[str, str] | None = None) -> bool:
    """Sends `message` (newline-separated KEY=VALUE lines); True when a datagram was sent."""
    env = os.environ if environ is None else environ
    address = env.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    elif not address.startswith("/"):
        log.warning("ignoring NOTIFY_SOCKET %r: neither a path nor an abstract socket", address)
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(message.encode("utf-8"))
        return True
    except OSError as exc:
        log.warning("sd_notify %r to %r failed: %s", message.split("\n", 1)[0], env.get("NOTIFY_SOCKET"), exc)
        return False


def ready(environ: Mapping[str, str] | None = None) -> bool:
    return notify("READY=1", environ)


def stopping(environ: Mapping[str, str] | None = None) -> bool:
    return notify("STOPPING=1", environ)


def watchdog(environ: Mapping[str, str] | None = None) -> bool:
    return notify("WATCHDOG=1", environ)


def status(text: str, environ: Mapping[str, str] | None = None) -> bool:
    # One line only: a newline would start a new (possibly meaningful) assignment.
    return notify("STATUS=" + " ".join(str(text).split()), environ)


def watchdog_interval_s(environ: Mapping[str, str] | None = None) -> float | None:
    """How often to send WATCHDOG=1: half of `$WATCHDOG_USEC`, as sd_watchdog_enabled advises.
    None when no watchdog is armed for this process (unset, invalid, or `$WATCHDOG_PID` names
    another process)."""
    env = os.environ if environ is None else environ
    raw = env.get("WATCHDOG_USEC")
    if not raw:
        return None
    pid = env.get("WATCHDOG_PID")
    if pid and pid.strip() != str(os.getpid()):
        return None
    try:
        usec = int(raw)
    except ValueError:
        log.warning("ignoring WATCHDOG_USEC=%r: not an integer", raw)
        return None
    if usec <= 0:
        return None
    return usec / 2 / 1_000_000
