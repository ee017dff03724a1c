"""The Monitor stage against a real Graphite: sending, window alignment, staleness, partial
readings, counters, first-seen / warm-up, the `samm collect` verb; and the pure assembly of
the raw snapshot from a reading and the executor's inventory."""
from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from click.testing import CliRunner

from fixtures_graphite import last_boundary, publish_window, send_plaintext, wait_for_points
from samm.analyze.metrics import compute_metrics
from samm.analyze.snapshot import VM_BOOTING, VM_RUNNING, FleetSpec
from samm.cli.main import cli
from samm.execute.base import GroupStatus, Instance
from samm.monitor.assemble import assemble_snapshot, build_raw_snapshot
from samm.monitor.collector import QueueReporter
from samm.monitor.graphite_client import GraphiteError, GraphiteSender, RenderClient, post_event
from samm.monitor.graphite_source import GraphiteSource, InstanceReading, MonitorReading, QueueReading
from samm.monitor.local_graphite import LocalGraphite

QUEUE = dict(submitted_total=70, waiting=5, running=3, completed_total=60, waiting_submitted_this_minute=2)
QUEUE_BEFORE = dict(submitted_total=40, waiting=9, running=3, completed_total=30, waiting_submitted_this_minute=0)


class CountingRender(RenderClient):
    """A real RenderClient that counts its /render calls."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.calls = 0

    def render(self, *a, **kw):
        self.calls += 1
        return super().render(*a, **kw)


def source(graphite, prefix, E, groups=("small",), **kw) -> GraphiteSource:
    """A reader whose clock stands just after the window ending at E."""
    return GraphiteSource(kw.pop("render", None) or RenderClient(graphite.render_url), prefix, groups,
                          interval_s=60, lateness_s=5, now=lambda: E + 6, **kw)


# --- sending -------------------------------------------------------------------------------

def test_sender_flushes_one_connection_per_batch():
    received, conns = [], []
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(0.1)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except OSError:
                continue
            conns.append(c)
            with c:
                while chunk := c.recv(65536):
                    received.append(chunk)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    sender = GraphiteSender("127.0.0.1", srv.getsockname()[1])
    for i in range(100):
        sender.send(f"a.m{i % 7}", i, 1_700_000_000 + i + 0.9)
    sender.send("a.nan", float("nan"), 1_700_000_000)
    sender.send("a.inf", float("inf"), 1_700_000_000)  # carbon would store it, and readers take it as measured
    sender.send("a.ninf", float("-inf"), 1_700_000_000)
    assert sender.pending == 100 and sender.skipped == 3
    assert sender.flush() == 100
    deadline = time.monotonic() + 5
    while b"".join(received).count(b"\n") < 100 and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    t.join(timeout=5)
    srv.setblocking(False)
    with pytest.raises(BlockingIOError):  # flush has returned: a second connection would be queued
        srv.accept()
    srv.close()
    lines = b"".join(received).decode().splitlines()
    assert len(conns) == 1 and len(lines) == 100
    # timestamps floored, never rounded into the next slot
    assert lines[0] == "a.m0 0.0 1700000000" and lines[99] == "a.m1 99.0 1700000099"


def test_sender_never_raises_on_dead_carbon(caplog):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    sender = GraphiteSender("127.0.0.1", dead_port, timeout_s=0.5)
    sender.send_many([("x.y", 1, time.time()), ("x.z", 2, time.time())])
    assert sender.flush() == 0
    sender.send("x.y", 3, time.time())
    sender.flush()
    assert sender.dropped == 3 and sender.sent == 0
    assert sum("unreachable" in r.message for r in caplog.records) == 1  # one line per failure streak


@pytest.mark.graphite
def test_batched_sender_delivers_to_real_carbon(graphite, graphite_prefix):
    E = last_boundary()
    sender = GraphiteSender(graphite.carbon_host, graphite.carbon_port)
    for k in range(6):
        for m in ("a", "b", "c"):
            sender.send(f"{graphite_prefix}.batch.{m}", k * 10, E - 60 + 10 * k)
    assert sender.flush() == 18
    got = wait_for_points(graphite.render_url, f"{graphite_prefix}.batch.*", E - 61, E - 1, expect_series=3, expect_points=6)
    for s in got:
        assert s.values() == [(10.0 * k, E - 60 + 10 * k) for k in range(6)]


@pytest.mark.graphite
def test_render_errors_name_the_url_and_events_post(graphite):
    with pytest.raises(GraphiteError, match=r"render.*HTTP 400"):
        RenderClient(graphite.render_url).render("summarize(x, '1min', 'p90')", -60, "now")
    assert post_event(graphite.render_url, "scale small 1->2", ["samm", "scaling", "small"], "test")
    import requests
    ev = requests.get(f"{graphite.render_url}/events/get_data", params={"tags": "scaling", "from": "-1h"}, timeout=5).json()
    assert any(e["what"] == "scale small 1->2" for e in ev)
    assert not post_event("http://127.0.0.1:9", "nowhere", "samm scaling", timeout_s=0.5)



def test_render_retries_one_server_error_then_names_it():
    """graphite-web answers 500 while carbon creates a new series' file: one retry, then an error."""
    import http.server
    import json as _json

    answers, seen = [], []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.path)
            code = answers.pop(0) if answers else 200
            body = b"boom" if code >= 500 else _json.dumps([{"target": "a.b", "datapoints": [[1.0, 60]]}]).encode()
            self.send_response(code)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        client = RenderClient(f"http://127.0.0.1:{srv.server_address[1]}")
        answers[:] = [500]
        assert [x.values() for x in client.render("a.b", 0, 60)] == [[(1.0, 60)]] and len(seen) == 2
        answers[:], seen[:] = [500, 503], []
        with pytest.raises(GraphiteError, match="HTTP 503"):
            client.render("a.b", 0, 60)
        assert len(seen) == 2
    finally:
        srv.shutdown()


def test_render_names_a_payload_that_is_not_a_list_of_series():
    """A proxy or another API can answer 200 with JSON of another shape: the reader's reason
    says so (it read "AttributeError: 'str' object has no attribute 'get'" before)."""
    import http.server

    body = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body[0])

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        for payload in (b'{"error": "bad target"}', b'null', b'["a.b"]', b'[{"target": "a.b", "datapoints": [[1.0]]}]',
                        b'[{"target": "a.b", "datapoints": null}]'):
            body[:] = [payload]
            with pytest.raises(GraphiteError, match="not a list of {target, datapoints"):
                RenderClient(url).render("a.b", 0, 60)
        reading = GraphiteSource(RenderClient(url), "p", ["small"], now=lambda: 1_000_026).read()
        assert reading.status == "stale" and "Graphite unavailable" in reading.reasons[0]
        assert "not a list of {target, datapoints" in reading.reasons[0]
    finally:
        srv.shutdown()

# --- reading ---------------------------------------------------------------------------------

@pytest.mark.graphite
def test_window_is_the_last_complete_interval_without_off_by_one(graphite, graphite_prefix):
    E = last_boundary(back=1)  # E + 60 is in the past too, so the following minute is visible
    sender = GraphiteSender(graphite.carbon_host, graphite.carbon_port)
    for minute, value in ((E - 120, 10.0), (E - 60, 20.0), (E, 30.0)):
        for ts in range(minute, minute + 60, 10):
            sender.send(f"{graphite_prefix}.groups.small.instances.i1.cpu_percent", value, ts)
            sender.send(f"{graphite_prefix}.groups.small.instances.i1.ram_used_gb", value / 10, ts)
            sender.send(f"{graphite_prefix}.groups.small.instances.i1.up", 1, ts)
        for m, v in QUEUE.items():  # the interval's cohort stays within its 10 arrivals
            step = value / 10 if m == "waiting_submitted_this_minute" else value
            sender.send(f"{graphite_prefix}.queue.{m}", v + step, minute + 50)
    sender.flush()
    wait_for_points(graphite.render_url, f"{graphite_prefix}.groups.small.instances.i1.*", E - 121, E + 59, 3, 18)
    wait_for_points(graphite.render_url, f"{graphite_prefix}.queue.*", E - 121, E + 59, 5, 3)

    # the pitfall: from=E-60&until=E reads E-59..E, i.e. the wrong minute's first point
    render = RenderClient(graphite.render_url)
    naive = render.render(f"{graphite_prefix}.groups.small.instances.i1.cpu_percent", E - 60, E)[0].values()
    assert (30.0, E) in naive and (20.0, E - 60) not in naive
    right = render.render(f"{graphite_prefix}.groups.small.instances.i1.cpu_percent", E - 61, E - 1)[0].values()
    assert right == [(20.0, t) for t in range(E - 60, E, 10)]

    reading = source(graphite, graphite_prefix, E).read()
    assert (reading.window_start, reading.window_end) == (E - 60, E)
    inst = reading.instances[("small", "i1")]
    assert inst.cpu_percent == 20.0 and inst.ram_used_gb == 2.0
    assert reading.queue.waiting == QUEUE["waiting"] + 20 and reading.queue.submitted_total == 90
    assert reading.queue.submitted_interval == 10  # 90 at E-10 minus 80 at E-70
    assert reading.status == "ok", reading.reasons
    # lateness: 4 s after the boundary the interval before is still the latest complete one
    early = GraphiteSource(render, graphite_prefix, ["small"], 60, lateness_s=5, now=lambda: E + 4)
    assert early.window() == (E - 120, E - 60)


class _FlushRace(RenderClient):
    """graphite-web as a cache flush leaves it for one render: `hide` absent from the first
    render that holds it (graphite-web reads the whisper file before it asks carbon's cache)."""

    def __init__(self, url: str, hide: str):
        super().__init__(url)
        self.hide, self.hidden = hide, 0

    def render(self, targets, from_, until):
        series = super().render(targets, from_, until)
        if not self.hidden and any(s.target.endswith(self.hide) for s in series):
            self.hidden += 1
            series = [s for s in series if not s.target.endswith(self.hide)]
        return series


@pytest.mark.graphite
def test_a_series_hidden_by_a_cache_flush_is_read_again_not_called_stale(graphite, graphite_prefix):
    E = last_boundary(back=1)
    sender = GraphiteSender(graphite.carbon_host, graphite.carbon_port)
    publish_window(sender, graphite_prefix, E, [("small", "i1", 50.0, 1.0, E - 300)], queue=QUEUE,
                   queue_before={**QUEUE, "submitted_total": 60}, history_start=E - 200)
    wait_for_points(graphite.render_url, f"{graphite_prefix}.queue.*", E - 60, E - 1, expect_series=5)
    wait_for_points(graphite.render_url, f"{graphite_prefix}.groups.small.instances.i1.*", E - 60, E - 1, 3, 5)

    naps = []
    race = _FlushRace(graphite.render_url, ".queue.submitted_total")
    reading = source(graphite, graphite_prefix, E, render=race, sleep=naps.append).read()
    assert race.hidden == 1 and naps == [0.5]
    assert reading.status == "ok", reading.reasons
    assert reading.queue.submitted_total == QUEUE["submitted_total"] and reading.queue.submitted_interval == 10
    assert reading.instances[("small", "i1")].first_seen == E - 200   # the re-read started from the same state

    # without the re-read the same race is a stale window, and no decision for a minute
    once = source(graphite, graphite_prefix, E, render=_FlushRace(graphite.render_url, ".queue.submitted_total"),
                  reread_delay_s=0).read()
    assert once.status == "stale" and "submitted_total missing" in " ".join(once.reasons)

    # data that is really missing is read twice and then called what it is
    naps.clear()
    gone = source(graphite, graphite_prefix + "x", E, sleep=naps.append).read()
    assert naps == [0.5] and gone.status == "stale"
    assert "the data is missing, not in flight" in gone.reasons[-1]


@pytest.mark.graphite
def test_counters_delta_gauges_and_call_count(graphite, graphite_prefix):
    E = last_boundary()
    sender = GraphiteSender(graphite.carbon_host, graphite.carbon_port)
    n = publish_window(sender, graphite_prefix, E, [("small", "i1", 40.0, 1.0, E - 50)], QUEUE, QUEUE_BEFORE)
    wait_for_points(graphite.render_url, [f"{graphite_prefix}.groups.*.instances.*.*", f"{graphite_prefix}.queue.*"],
                    E - 181, E - 1, n)
    render = CountingRender(graphite.render_url)
    r = source(graphite, graphite_prefix, E, render=render).read()
    assert r.status == "ok", r.reasons
    assert r.queue == QueueReading(submitted_total=70, submitted_interval=30, waiting=5, running=3,
                                   completed_total=60, waiting_interval=2)
    assert render.calls == 2  # no lookback: the instance appeared after a silent interval


@pytest.mark.graphite
def test_counter_without_baseline_or_going_backwards_is_partial(graphite, graphite_prefix):
    E = last_boundary()
    sender = GraphiteSender(graphite.carbon_host, graphite.carbon_port)
    inst = [("small", "i1", 40.0, 1.0, E - 50)]
    p1, p2 = graphite_prefix + "a", graphite_prefix + "b"
    n = publish_window(sender, p1, E, inst, QUEUE)  # nothing before the window
    sender.send(f"{p1}.queue.submitted_total", 61, E - 40)  # an earlier point inside the window
    publish_window(sender, p2, E, inst, QUEUE, dict(QUEUE_BEFORE, submitted_total=100))  # 100 -> 70
    sender.flush()
    for p in (p1, p2):
        wait_for_points(graphite.render_url, [f"{p}.groups.*.instances.*.*", f"{p}.queue.*"], E - 181, E - 1, n)
    a = source(graphite, p1, E).read()
    assert a.status == "partial" and a.queue.submitted_interval == 70 - 61
    assert any("lower bound" in x for x in a.reasons)
    b = source(graphite, p2, E).read()
    assert b.status == "partial" and b.queue.submitted_interval == 70  # a reset: counted from 0
    assert any("went backwards" in x for x in b.reasons)


@pytest.mark.graphite
def test_partial_on_invalid_values_and_incomplete_instances(graphite, graphite_prefix):
    E = last_boundary()
    sender = GraphiteSender(graphite.carbon_host, graphite.carbon_port)
    n = publish_window(sender, graphite_prefix, E, [
        ("small", "ok1", 30.0, 1.0, E - 55),
        ("small", "hot", 250.0, 1.0, E - 55),  # cpu above 100 %
        ("small", "inf", math.inf, 1.0, E - 55),  # SAMM's sender skips inf, carbon would store it:
        ("small", "fat", 30.0, 100.0, E - 55),  # 100 GB on a 4 GB type
        ("small", "nan", math.nan, 1.0, E - 55),  # NaN never leaves the sender
        ("small", "neg", 30.0, -1.0, E - 55),
    ], QUEUE, QUEUE_BEFORE)
    sender.send(f"{graphite_prefix}.groups.small.instances.cpuonly.cpu_percent", 10, E - 30)
    sender.flush()
    send_plaintext(graphite, [f"{graphite_prefix}.groups.small.instances.inf.cpu_percent inf {t}" for t in range(E - 55, E, 10)])
    wait_for_points(graphite.render_url, [f"{graphite_prefix}.groups.*.instances.*.*", f"{graphite_prefix}.queue.*"],
                    E - 181, E - 1, n)
    r = source(graphite, graphite_prefix, E, ram_gb={"small": 4.0}).read()
    assert r.status == "partial"
    inst = r.instances
    assert inst[("small", "ok1")].reported
    assert inst[("small", "hot")].cpu_percent is None and inst[("small", "inf")].cpu_percent is None
    assert inst[("small", "fat")].ram_used_gb is None and inst[("small", "neg")].ram_used_gb is None
    assert inst[("small", "nan")].cpu_percent is None and inst[("small", "nan")].ram_used_gb == 1.0
    assert not inst[("small", "cpuonly")].reported
    text = " | ".join(r.reasons)
    for needle in ("cpu_percent above 101", "non-finite", "4x the type's RAM", "negative", "small/cpuonly"):
        assert needle in text, text
    # the NaN instance is partial too (CPU missing), but its RAM still counts
    assert "small/nan" in text


@pytest.mark.graphite
def test_an_unknown_queue_series_does_not_make_the_window_partial(graphite, graphite_prefix):
    """`queue.*` also brings other exporters' series: their values are none of the reader's
    business (a negative one made every window partial, so the daemon never acted)."""
    E = last_boundary()
    sender = GraphiteSender(graphite.carbon_host, graphite.carbon_port)
    n = publish_window(sender, graphite_prefix, E, [("small", "i1", 40.0, 1.0, E - 50)], QUEUE, QUEUE_BEFORE)
    sender.send(f"{graphite_prefix}.queue.net_change", -3, E - 10)
    sender.flush()
    send_plaintext(graphite, [f"{graphite_prefix}.queue.backlog_ratio inf {E - 10}"])  # SAMM's sender skips inf
    wait_for_points(graphite.render_url, f"{graphite_prefix}.queue.*", E - 61, E - 1, 7)
    wait_for_points(graphite.render_url, f"{graphite_prefix}.groups.*.instances.*.*", E - 61, E - 1, n - 5)
    r = source(graphite, graphite_prefix, E).read()
    assert r.status == "ok", r.reasons
    assert r.queue.submitted_interval == 30 and r.queue.waiting == QUEUE["waiting"]


@pytest.mark.graphite
def test_a_lost_baseline_interval_or_disagreeing_queue_counters_are_partial(graphite, graphite_prefix):
    """Both read "ok" before, with a wrong metric 6 or 7 passed on: a `submitted_total` delta
    over two intervals (the one before the window lost its points), and a queue whose waiting
    jobs outnumber the jobs ever submitted (or the interval's cohort its arrivals)."""
    E = last_boundary()
    sender = GraphiteSender(graphite.carbon_host, graphite.carbon_port)
    inst = [("small", "i1", 40.0, 1.0, E - 50)]
    gap, more, cohort = (graphite_prefix + x for x in "gmc")
    publish_window(sender, gap, E, inst, QUEUE)
    QueueReporter(sender, gap).report(**QUEUE_BEFORE, ts=E - 130, flush=False)  # nothing in [E-120, E-60)
    publish_window(sender, more, E, inst, dict(QUEUE, waiting=500), QUEUE_BEFORE)
    publish_window(sender, cohort, E, inst, dict(QUEUE, waiting_submitted_this_minute=31), QUEUE_BEFORE)
    sender.flush()
    for p in (gap, more, cohort):
        wait_for_points(graphite.render_url, f"{p}.queue.*", E - 61, E - 1, 5)
        wait_for_points(graphite.render_url, f"{p}.groups.*.instances.*.*", E - 61, E - 1, 3)
    g = source(graphite, gap, E).read()
    assert g.status == "partial" and g.queue.submitted_interval == 30
    assert any(f"from {E - 130}, 70 s before it" in x and "more than one interval" in x for x in g.reasons), g.reasons
    m = source(graphite, more, E).read()
    assert m.status == "partial"
    assert any("queue.waiting (500) exceeds queue.submitted_total (70)" in x for x in m.reasons), m.reasons
    c = source(graphite, cohort, E).read()
    assert c.status == "partial"
    assert any("(31) exceeds the interval's arrivals (30)" in x for x in c.reasons), c.reasons


class _Overshoot(RenderClient):
    """A server that ignores `until`: heartbeats from after the window come back with it."""

    def __init__(self, url: str, late: dict):
        super().__init__(url)
        self.late = late  # target -> [(value, ts)]

    def render(self, targets, from_, until):
        series = super().render(targets, from_, until)
        for s in series:
            s.points += self.late.get(s.target, [])
        return series


@pytest.mark.graphite
def test_heartbeats_at_or_after_the_window_end_are_not_trusted(graphite, graphite_prefix):
    """An instance silent in the window must stay silent whatever comes back from after it
    (such a heartbeat hid it: the snapshot read "ok" with its load unknown)."""
    E = last_boundary()
    sender = GraphiteSender(graphite.carbon_host, graphite.carbon_port)
    n = publish_window(sender, graphite_prefix, E - 60, [("small", "stays", 40.0, 1.0, E - 170),
                                                         ("small", "quits", 60.0, 1.0, E - 170)], QUEUE_BEFORE)
    n += publish_window(sender, graphite_prefix, E, [("small", "stays", 40.0, 1.0, E - 60)], QUEUE, QUEUE_BEFORE)
    wait_for_points(graphite.render_url, [f"{graphite_prefix}.groups.*.instances.*.*", f"{graphite_prefix}.queue.*"],
                    E - 181, E - 1, 11)
    late = {f"{graphite_prefix}.groups.small.instances.quits.up": [(1.0, E), (1.0, E + 30)]}
    r = source(graphite, graphite_prefix, E, render=_Overshoot(graphite.render_url, late)).read()
    assert r.instances[("small", "quits")].last_seen == E - 70
    inv = {"small": GroupStatus("small", 2, 0, 10, tuple(Instance("small", i, "running") for i in ("stays", "quits")))}
    fleet = FleetSpec(("small",), np.array([2]), np.array([4.0]), np.array([10]), np.array([0]), np.array([0.1]))
    a = assemble_snapshot(r, inv, fleet, ["small"])
    assert a.status == "partial" and any("small/quits reported before" in x for x in a.reasons), a.reasons


@pytest.mark.graphite
def test_stale_without_queue_or_data(graphite, graphite_prefix):
    E = last_boundary()
    empty = source(graphite, graphite_prefix + "none", E).read()
    assert empty.status == "stale" and any("no data" in x for x in empty.reasons)
    sender = GraphiteSender(graphite.carbon_host, graphite.carbon_port)
    n = publish_window(sender, graphite_prefix, E, [("small", "i1", 40.0, 1.0, E - 50)])
    wait_for_points(graphite.render_url, f"{graphite_prefix}.groups.*.instances.*.*", E - 61, E - 1, n)
    r = source(graphite, graphite_prefix, E).read()
    assert r.status == "stale" and r.instances[("small", "i1")].reported
    assert any("submitted_total, waiting, waiting_submitted_this_minute missing" in x for x in r.reasons)


@pytest.mark.graphite
def test_stale_while_graphite_is_down_and_recovery_keeps_data(tmp_path, graphite_prefix):
    E = last_boundary()
    with LocalGraphite(tmp_path / "g") as g:
        sender = GraphiteSender(g.carbon_host, g.carbon_port, timeout_s=0.5)
        n = publish_window(sender, graphite_prefix, E, [("small", "i1", 40.0, 1.0, E - 50)], QUEUE, QUEUE_BEFORE)
        wait_for_points(g.render_url, [f"{graphite_prefix}.groups.*.instances.*.*", f"{graphite_prefix}.queue.*"],
                        E - 181, E - 1, n)
        src = GraphiteSource(RenderClient(g.render_url, timeout_s=1), graphite_prefix, ["small"], now=lambda: E + 6)
        assert src.read().status == "ok"
        g.stop()
        down = src.read()
        assert down.status == "stale" and down.window_end == E
        assert any("Graphite unavailable" in x and g.render_url in x for x in down.reasons), down.reasons
        sender.send("x.y", 1, time.time())
        assert sender.flush() == 0 and sender.dropped == 1  # collectors keep going
        # restarted from a short-lived thread, as the testbed's fault injection does: the
        # daemons must outlive that thread (the parent-death signal follows the forking thread)
        t = threading.Thread(target=g.start)
        t.start()
        t.join()
        time.sleep(1.0)
        assert g.running
        back = src.read()
        assert back.status == "ok", back.reasons
        assert back.instances[("small", "i1")].cpu_percent == 40.0 and back.queue.submitted_interval == 30


@pytest.mark.graphite
def test_first_seen_from_lookback_and_warmup(graphite, graphite_prefix):
    E = last_boundary()
    sender = GraphiteSender(graphite.carbon_host, graphite.carbon_port)
    n = publish_window(sender, graphite_prefix, E, [("small", "old", 50.0, 1.0, E - 600),
                                                    ("small", "new", 90.0, 1.0, E - 25)], QUEUE, QUEUE_BEFORE)
    wait_for_points(graphite.render_url, [f"{graphite_prefix}.groups.*.instances.*.*", f"{graphite_prefix}.queue.*"],
                    E - 181, E - 1, n)
    render = CountingRender(graphite.render_url)
    src = source(graphite, graphite_prefix, E, render=render)
    r = src.read()
    assert render.calls == 3  # 'old' has heartbeats from the start of the history: one lookback
    assert r.instances[("small", "old")].first_seen == E - 600
    assert r.instances[("small", "new")].first_seen == E - 25
    src.read()
    assert render.calls == 5  # first_seen is cached: no second lookback

    fleet = FleetSpec(("small",), np.array([2]), np.array([4.0]), np.array([10]), np.array([0]), np.array([0.1]))
    inv = {"small": GroupStatus("small", 2, 0, 10, (Instance("small", "old", "running"), Instance("small", "new", "running")))}
    snap = build_raw_snapshot(r, inv, fleet, ["small"])
    assert sorted(snap.vm_running_for_s.tolist()) == [25.0, 600.0]
    m = compute_metrics(snap, fleet, warmup_s=120)
    assert m[1] == pytest.approx(0.5)  # only 'old' is past the warm-up
    assert compute_metrics(snap, fleet, warmup_s=0)[1] == pytest.approx(0.7)



def test_following_reads_skip_heartbeats_and_still_flag_silent_instances(graphite, graphite_prefix):
    """After its first read a reader renders two series per instance per interval (no heartbeat
    history), yet knows who fell silent and when a newcomer started, like a fresh reader."""
    E = last_boundary()
    sender = GraphiteSender(graphite.carbon_host, graphite.carbon_port)
    n = publish_window(sender, graphite_prefix, E - 60, [("small", "stays", 40.0, 1.0, E - 400),
                                                         ("small", "quits", 60.0, 1.0, E - 400)], QUEUE_BEFORE)
    n += publish_window(sender, graphite_prefix, E, [("small", "stays", 40.0, 1.0, E - 60),
                                                     ("small", "joins", 80.0, 1.0, E - 25)], QUEUE, QUEUE_BEFORE)
    wait_for_points(graphite.render_url, [f"{graphite_prefix}.groups.*.instances.*.*", f"{graphite_prefix}.queue.*"],
                    E - 181, E - 1, 9)
    render = CountingRender(graphite.render_url)
    follower = source(graphite, graphite_prefix, E, render=render)
    follower.read(window_end=E - 60)
    calls = render.calls
    r = follower.read(window_end=E)
    assert render.calls - calls == 2  # the window's CPU and RAM, the queue: no heartbeats, no look-back
    fresh = source(graphite, graphite_prefix, E).read(window_end=E)
    assert r.instances == fresh.instances
    assert r.instances[("small", "quits")].cpu_percent is None
    assert r.instances[("small", "quits")].last_seen == E - 70
    assert r.instances[("small", "joins")].first_seen == E - 25
    assert r.instances[("small", "stays")].first_seen == E - 400

    inv = {"small": GroupStatus("small", 3, 0, 10, tuple(Instance("small", i, "running") for i in ("stays", "quits", "joins")))}
    fleet = FleetSpec(("small",), np.array([2]), np.array([4.0]), np.array([10]), np.array([0]), np.array([0.1]))
    a = assemble_snapshot(r, inv, fleet, ["small"])
    assert a.status == "partial" and any("small/quits" in x for x in a.reasons)


def test_look_back_over_thousands_of_names_goes_as_post(graphite, graphite_prefix):
    """A fresh reader looks back for every instance by name: at fleet scale that query is far
    longer than a URL may be (HTTP 414 at 5,000 instances), so it goes as a form POST."""
    E = last_boundary()
    sender = GraphiteSender(graphite.carbon_host, graphite.carbon_port, batch_size=5000)
    names = [f"i-{k:017x}" for k in range(300)]
    n = publish_window(sender, graphite_prefix, E, [("small", i, 30.0, 1.0, E - 300) for i in names],
                       QUEUE, QUEUE_BEFORE, history_start=E - 180)
    wait_for_points(graphite.render_url, [f"{graphite_prefix}.groups.*.instances.*.*", f"{graphite_prefix}.queue.*"],
                    E - 181, E - 1, n, timeout_s=60)
    render = CountingRender(graphite.render_url)
    src = source(graphite, graphite_prefix, E, render=render, first_seen_lookback_s=600)
    r = src.read()
    assert r.status == "ok", r.reasons
    assert render.calls == 3
    assert {x.first_seen for x in r.instances.values()} == {E - 180}  # the earliest point Graphite holds
    assert len(r.instances) == 300
    # 5,000 names: some 100 KB of query, beyond any server's URL limit
    many = names[:3] + [f"i-{k:017x}" for k in range(10_000, 14_997)]
    got = RenderClient(graphite.render_url).render(
        f"{graphite_prefix}.groups.small.instances.{{{','.join(many)}}}.up", E - 61, E - 1)
    assert sorted(x.target.split(".")[-2] for x in got) == names[:3]

# --- assembling (pure) -----------------------------------------------------------------------

FLEET = FleetSpec(("S", "M"), np.array([2, 4]), np.array([4.0, 8.0]), np.array([5, 5]), np.array([0, 0]),
                  np.array([0.2, 0.4]))


def _inst(group, iid, cpu, ram, first, last):
    return InstanceReading(group, iid, cpu, ram, first, last)


def test_build_raw_snapshot_maps_inventory_and_reading():
    E = 1_000_020.0
    reading = MonitorReading(E - 60, E, {
        ("S", "a"): _inst("S", "a", 50.0, 2.0, E - 300, E - 5),
        ("S", "b"): _inst("S", "b", 20.0, 1.0, E - 30, E - 5),  # pending per executor, but reporting
        ("M", "c"): _inst("M", "c", None, None, E - 400, E - 100),  # went silent
        ("M", "gone"): _inst("M", "gone", 99.0, 7.0, E - 900, E - 5),  # terminated, collector still up
    }, QueueReading(submitted_total=100, submitted_interval=10, waiting=8, running=4, completed_total=88,
                    waiting_interval=3), "ok", ())
    inv = {
        "S": GroupStatus("S", 3, 0, 5, (Instance("S", "b", "pending", launched_at=E - 40),
                                        Instance("S", "a", "running", launched_at=E - 320),
                                        Instance("S", "x", "terminating"))),
        "M": GroupStatus("M", 2, 0, 5, (Instance("M", "c", "running"), Instance("M", "d", "pending"))),
    }
    out = assemble_snapshot(reading, inv, FLEET, ["S", "M"])
    s = out.snapshot
    assert [sl.instance_id for sl in out.slots] == ["a", "b", "c", "d"]
    np.testing.assert_array_equal(s.vm_type, [0, 0, 1, 1])
    np.testing.assert_array_equal(s.vm_state, [VM_RUNNING, VM_RUNNING, VM_BOOTING, VM_BOOTING])
    np.testing.assert_allclose(s.vm_cpu_busy, [0.5, 0.2, 0, 0])
    np.testing.assert_allclose(s.vm_ram_used_gb, [2.0, 1.0, 0, 0])
    np.testing.assert_allclose(s.vm_running_for_s, [300, 30, -1, -1])
    assert s.batch_shape == ()
    assert (float(s.jobs_submitted_total), float(s.jobs_submitted_interval), float(s.jobs_waiting_now),
            float(s.jobs_waiting_interval), float(s.jobs_running)) == (100, 10, 8, 3, 4)
    assert out.status == "partial"
    assert any("M/c reported before" in x for x in out.reasons)
    assert any("not in the inventory" in x and "M/gone" in x for x in out.reasons)
    m = compute_metrics(s, FLEET)
    assert m[0] == pytest.approx((2 + 2 + 4 + 4) / 30) and m[1] == pytest.approx(0.35)
    assert m[5] == pytest.approx(0.08) and m[6] == pytest.approx(0.3)


def test_an_instance_never_heard_long_after_launch_is_noted_not_blocking():
    E = 1_000_020.0
    reading = MonitorReading(E - 60, E, {("S", "a"): _inst("S", "a", 50.0, 2.0, E - 300, E - 5)}, QueueReading(),
                             "ok", ())
    inv = {"S": GroupStatus("S", 3, 0, 5, (Instance("S", "a", "running", launched_at=E - 320),
                                           Instance("S", "new", "pending", launched_at=E - 90),
                                           Instance("S", "dead", "running", launched_at=E - 3_600))),
           "M": GroupStatus("M", 0, 0, 5)}
    out = assemble_snapshot(reading, inv, FLEET, ["S", "M"])
    np.testing.assert_array_equal(out.snapshot.vm_state, [VM_BOOTING, VM_RUNNING, VM_BOOTING])
    assert out.status == "ok"  # a dead collector must not stop the loop for good
    [note] = [x for x in out.reasons if "launched over 600 s ago" in x]
    assert "S/dead (3600 s)" in note and "S/new" not in note  # 90 s is an ordinary boot
    assert not assemble_snapshot(reading, inv, FLEET, ["S", "M"], boot_grace_s=7_200).reasons


def test_build_raw_snapshot_empty_fleet_and_stale_reading():
    reading = MonitorReading(0.0, 60.0, status="stale", reasons=("Graphite unavailable: x",))
    out = assemble_snapshot(reading, {"S": GroupStatus("S", 0, 0, 5), "M": GroupStatus("M", 0, 0, 5)}, FLEET, ["S", "M"])
    assert out.status == "stale" and out.reasons == ("Graphite unavailable: x",)
    assert out.snapshot.vm_type.tolist() == [-1]  # one padding slot keeps the analyzer's shapes valid
    assert np.isnan(out.snapshot.jobs_waiting_now)
    # no VM, so no load; the queue's counts are unknown, and so are its ratios (not an empty queue)
    np.testing.assert_array_equal(compute_metrics(out.snapshot, FLEET), [0, 0, 0, 0, 0, np.nan, np.nan])
    missing = assemble_snapshot(MonitorReading(0.0, 60.0), {"S": GroupStatus("S", 0, 0, 5)}, FLEET, ["S", "M"])
    assert missing.status == "partial" and "no group 'M'" in missing.reasons[0]
    with pytest.raises(ValueError, match="group_order has 1 groups but the fleet has 2"):
        build_raw_snapshot(reading, {}, FLEET, ["S"])


# --- samm collect ------------------------------------------------------------------------------

def test_collect_help_and_bad_options():
    runner = CliRunner()
    res = runner.invoke(cli, ["collect", "--help"])
    assert res.exit_code == 0 and "--graphite" in res.output and "--once" in res.output
    res = runner.invoke(cli, ["collect", "--group", "S", "--graphite", "host:notaport", "--once"])
    assert res.exit_code == 2 and "HOST:PORT" in res.output
    res = runner.invoke(cli, ["collect", "--group", "S", "--cores", "0", "--once"])
    assert res.exit_code == 2 and "cores must be positive" in res.output


@pytest.mark.graphite
def test_samm_collect_once_end_to_end(graphite, graphite_prefix):
    t0 = int(time.time())
    proc = subprocess.run([sys.executable, "-m", "samm.cli.main", "collect", "--graphite",
                           f"{graphite.carbon_host}:{graphite.carbon_port}", "--prefix", graphite_prefix,
                           "--group", "small", "--instance", "vm.1", "--cores", "2", "--once"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "sent 1 report(s) for small/vm.1" in proc.stderr and "0 point(s) dropped" in proc.stderr
    base = f"{graphite_prefix}.groups.small.instances.vm_1"  # '.' sanitised: one path level
    got = wait_for_points(graphite.render_url, f"{base}.*", t0 - 1, int(time.time()) + 1, 3)
    vals = {s.target.rsplit(".", 1)[1]: s.values()[0][0] for s in got}
    assert vals["up"] == 1.0 and 0.0 <= vals["cpu_percent"] <= 100.0 and 0.0 < vals["ram_used_gb"] < 10_000


def test_host_sampler_measures_a_process_tree_and_collector_loop_counts_reports():
    from samm.monitor.collector import HostSampler, InstanceReporter, run_collector

    sampler = HostSampler(cores=1, pid=None)
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<0.6: pass"])
    try:
        tree = HostSampler(cores=1, pid=busy.pid)
        busy.wait(timeout=10)
    finally:
        busy.kill()
    # the child exited: its CPU seconds vanish with it, and the share never goes negative
    assert tree.sample().cpu_percent == 0.0
    own = HostSampler(cores=1, pid=os.getpid())
    t = time.process_time()
    while time.process_time() - t < 0.3:
        pass
    s = own.sample()
    assert 20.0 < s.cpu_percent <= 100.0 and s.ram_used_gb > 0.01
    assert 0.0 <= sampler.sample().cpu_percent <= 100.0

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = sock.getsockname()[1]
    sender = GraphiteSender("127.0.0.1", dead, timeout_s=0.2)
    slept = []
    n = run_collector(InstanceReporter(sender, "p", "g", "i"), sampler, interval_s=10, duration_s=30, sleep=slept.append)
    # ticks are scheduled from the start (drift-free): a sleep that does not pass time shows it
    assert n == 3 and sender.dropped == 9 and [round(x) for x in slept] == [10, 20, 30]


@pytest.mark.graphite
def test_local_graphite_accepts_a_relative_root(tmp_path, monkeypatch):
    """`samm demo --out demo-report` passes a relative directory: the daemons run with their
    own working directory, so the launcher must resolve it."""
    from samm.monitor.local_graphite import LocalGraphite, missing_packages

    if missing_packages():
        pytest.skip("Graphite not installed")
    monkeypatch.chdir(tmp_path)
    g = LocalGraphite("rel-graphite")
    try:
        g.start()
        assert g.root.is_absolute() and g.running
    finally:
        g.close()
