"""Pytest fixtures and helpers for tests against a real Graphite (carbon-cache + graphite-web
from the Debian packages, started once per session on free loopback ports)."""
from __future__ import annotations

import time
import uuid

import pytest

from samm.monitor.graphite_client import GraphiteError, RenderClient
from samm.monitor.local_graphite import LocalGraphite, missing_packages


@pytest.fixture(scope="session")
def graphite(tmp_path_factory):
    """A running `LocalGraphite` shared by the session. Skips only when the Debian packages
    are missing; a daemon that is installed but fails to start fails the test."""
    missing = missing_packages()
    if missing:
        pytest.skip("Graphite not installed (apt-get install graphite-carbon graphite-web): missing " + ", ".join(missing))
    g = LocalGraphite(tmp_path_factory.mktemp("graphite"))
    g.start()
    yield g
    g.close()


@pytest.fixture
def graphite_prefix() -> str:
    """A metric prefix of its own, so tests sharing one Graphite never see each other's data."""
    return "t" + uuid.uuid4().hex[:10]


def wait_for_points(render_url: str, targets, from_, until, expect_series: int = 1, expect_points: int = 1,
                    timeout_s: float = 15.0):
    """Poll /render until `expect_series` series each have at least `expect_points` non-null
    points (new whisper files take about a second to appear). Returns the series."""
    client = RenderClient(render_url)
    deadline = time.monotonic() + timeout_s
    got, error = [], None
    while time.monotonic() < deadline:
        try:
            got = client.render(targets, from_, until)
        except GraphiteError as exc:
            # graphite-web can answer 500 while carbon is still creating a series' whisper file
            # (it reads a half-written header); the next poll sees the whole file
            error = exc
            time.sleep(0.1)
            continue
        full = [s for s in got if len(s.values()) >= expect_points]
        if len(full) >= expect_series:
            return got
        time.sleep(0.1)
    raise AssertionError(f"Graphite did not show {expect_series} series x {expect_points} points of {targets} "
                         f"in {timeout_s} s; got {[(s.target, len(s.values())) for s in got]}"
                         + (f"; last error: {error}" if error else ""))


def last_boundary(interval_s: int = 60, back: int = 0) -> int:
    """An epoch-aligned interval end in the past (`back` intervals before the latest)."""
    return (int(time.time()) // interval_s - back) * interval_s


def publish_window(sender, prefix: str, window_end: int, instances=(), queue: dict | None = None,
                   queue_before: dict | None = None, interval_s: int = 60, step_s: int = 10,
                   history_start: int | None = None) -> int:
    """Publish one interval as the collectors and the queue's owner would: every instance
    `(group, instance, cpu_percent, ram_used_gb, first_seen)` reports every `step_s` from its
    `first_seen` (not before `history_start`) to the window's end; the queue reports `queue`
    at the window's last step and `queue_before` one interval earlier. Returns the number of
    series written (for `wait_for_points`)."""
    import math

    from samm.monitor.collector import QUEUE_METRICS, InstanceReporter, QueueReporter

    n = 0
    for group, inst, cpu, ram, first_seen in instances:
        rep = InstanceReporter(sender, prefix, group, inst)
        t = int(math.ceil(first_seen))
        if history_start is not None and t < history_start:
            t += int(math.ceil((history_start - t) / step_s)) * step_s
        while t < window_end:
            rep.report(cpu, ram, t, flush=False)
            t += step_s
        n += 3
    if queue is not None:
        q = QueueReporter(sender, prefix)
        if queue_before is not None:
            q.report(**queue_before, ts=window_end - interval_s - step_s, flush=False)
        q.report(**queue, ts=window_end - step_s, flush=False)
        n += sum(1 for k in QUEUE_METRICS if queue.get(k) is not None)
    sender.flush()
    return n


def send_plaintext(graphite, lines) -> None:
    """Points as another exporter writes them, past SAMM's sender (which skips non-finite values):
    one "path value timestamp" line each, to carbon's plaintext port."""
    import socket

    with socket.create_connection((graphite.carbon_host, graphite.carbon_port)) as raw:
        raw.sendall("".join(f"{line}\n" for line in lines).encode())
