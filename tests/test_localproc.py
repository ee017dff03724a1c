"""The launchers' child-process helpers."""
import os
import signal
import threading
import time

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
