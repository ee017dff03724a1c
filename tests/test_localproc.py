"""The launchers' child-process helpers."""
import os
import signal
import threading
import time

import pytest

from samm.localproc import popen_tied


def test_child_started_from_a_short_lived_thread_outlives_it():
    made = []
    t = threading.Thread(target=lambda: made.append(popen_tied(["sleep", "30"])))
    t.start()
    t.join()
    (child,) = made
    try:
        time.sleep(0.5)
        assert child.poll() is None, "the child died with the thread that asked for it"
        assert os.getpgid(child.pid) == child.pid  # leads its own session, as die_with_parent sets up
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(5)


def test_spawn_errors_reach_the_calling_thread():
    errors = []

    def spawn():
        try:
            popen_tied(["/nonexistent/binary"])
        except FileNotFoundError as exc:
            errors.append(exc)
    t = threading.Thread(target=spawn)
    t.start()
    t.join()
    assert len(errors) == 1


def test_stable_ports_stay_out_of_the_ephemeral_range():
    """A restarted service must find its port free: ports the kernel hands to outgoing
    connections (the ephemeral range) are never chosen."""
    import socket

    from samm.localproc import _ephemeral_range, stable_port

    lo, hi = _ephemeral_range()
    seen = set()
    for _ in range(50):
        port = stable_port(exclude=seen)
        assert not lo <= port <= hi and port not in seen
        seen.add(port)
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free


def test_a_samm_serve_that_exits_at_start_says_why():
    """The service's reason used to go to /dev/null: the caller saw only "exited with 2"."""
    from samm.localproc import start_samm_serve

    with pytest.raises(RuntimeError, match=r"exited with 2: error: --agent no-such-agent: unknown agent"):
        start_samm_serve(["--agent", "no-such-agent"])


def test_a_samm_serve_that_never_answers_is_stopped_and_named(monkeypatch):
    """Past its timeout the process was returned as if it answered (the caller's first request
    then failed somewhere else) and kept running."""
    import subprocess

    from samm import localproc

    started = []
    real_popen = subprocess.Popen

    def popen(*a, **kw):
        started.append(real_popen(*a, **kw))
        return started[-1]

    monkeypatch.setattr(localproc.subprocess, "Popen", popen)
    with pytest.raises(RuntimeError, match=r"did not answer /healthz within 0.5 s"):
        localproc.start_samm_serve(["--agent", "threshold"], timeout_s=0.5)
    assert started and started[0].poll() is not None   # stopped, not left running
