"""Second audit of the Monitor stage's Graphite path: a render answer that trickles in, error
pages as reasons, counter resets, reused instance names and a fleet that nobody measures,
against a real Graphite where the defect needs one."""
from __future__ import annotations

import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from fixtures_graphite import last_boundary, publish_window, wait_for_points
from samm.analyze.metrics import compute_metrics
from samm.analyze.snapshot import VM_BOOTING, VM_RUNNING, FleetSpec
from samm.execute.base import GroupStatus, Instance
from samm.monitor.assemble import assemble_snapshot
from samm.monitor.collector import InstanceReporter
from samm.monitor.graphite_client import GraphiteError, GraphiteSender, RenderClient, post_event
from samm.monitor.graphite_source import GraphiteSource, InstanceReading, MonitorReading, QueueReading

FLEET = FleetSpec(("small",), np.array([2]), np.array([4.0]), np.array([10]), np.array([0]), np.array([0.1]))
QUEUE = dict(submitted_total=70, waiting=5, running=3, completed_total=60, waiting_submitted_this_minute=2)
QUEUE_BEFORE = dict(submitted_total=40, waiting=9, running=3, completed_total=30, waiting_submitted_this_minute=0)


def source(graphite, prefix, E, **kw) -> GraphiteSource:
    """A reader whose clock stands just after the window ending at E."""
    return GraphiteSource(RenderClient(graphite.render_url), prefix, ["small"], interval_s=60, lateness_s=5,
                          now=lambda: E + 6, **kw)


class _Trickle:
    """An HTTP server that sends its headers, then one byte of the body every 0.2 s for as long
    as the client listens (a stuck proxy, a server swapping): each read arrives within any
    socket timeout, the answer never does."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    @staticmethod
    def _drip(conn):
        with conn:
            try:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n[")
                while True:
                    time.sleep(0.2)
                    conn.sendall(b" ")
            except OSError:
                return

    def close(self):
        self.sock.close()


def _in_thread(fn):
    """Run `fn` in a thread; its result or exception, or "still running" after a generous 30 s."""
    out = {}

    def run():
        try:
            out["result"] = fn()
        except Exception as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(30)
    return "still running" if t.is_alive() else out


def test_a_render_answer_that_trickles_in_is_cut_at_the_timeout():
    """requests' timeout bounds each socket read, not the answer: a server trickling its body
    held `render` (and the daemon's loop) for as long as it kept sending (days, here)."""
    srv = _Trickle()
    try:
        got = _in_thread(lambda: RenderClient(srv.url, timeout_s=0.5).render("a.b", 0, 60))
        assert got != "still running", "render ignored its timeout"
        assert isinstance(got.get("error"), GraphiteError), got
        assert "did not arrive within 0.5 s of its headers" in str(got["error"]) and srv.url in str(got["error"])
        reading = _in_thread(lambda: GraphiteSource(RenderClient(srv.url, timeout_s=0.5), "p", ["small"],
                                                    reread_delay_s=0).read())
        assert reading != "still running" and reading["result"].status == "stale"
        assert reading["result"].reasons[0].startswith("Graphite unavailable: GET ")
        # events go through the same bounded read: a courtesy must not hold the loop either
        posted = _in_thread(lambda: post_event(srv.url, "scale small 1->2", "samm", timeout_s=0.5))
        assert posted == {"result": False}
    finally:
        srv.close()


def test_an_html_error_page_becomes_a_one_line_reason(caplog):
    """A proxy's 502 page is HTML over many lines; the reason (log line, knowledge-store record)
    carried the page's line breaks."""
    page = (b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
            b"<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n")

    class BadGateway(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _answer(self):
            self.send_response(502)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        do_GET = do_POST = _answer

    srv = ThreadingHTTPServer(("127.0.0.1", 0), BadGateway)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        reading = GraphiteSource(RenderClient(url, timeout_s=5), "p", ["small"], reread_delay_s=0).read()
        assert reading.status == "stale"
        [reason] = reading.reasons
        assert "\n" not in reason and "\r" not in reason
        assert reason.startswith("Graphite unavailable: GET ")
        assert "HTTP 502: <html> <head><title>502 Bad Gateway" in reason
        with caplog.at_level(logging.WARNING, logger="samm.monitor.graphite_client"):
            assert not post_event(url, "scale small 1->2", "samm")
        [line] = [r.getMessage() for r in caplog.records if "not posted" in r.getMessage()]
        assert "HTTP 502 <html>" in line and "\n" not in line
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.graphite
def test_an_old_counter_reset_does_not_hold_back_the_windows_after_it(graphite, graphite_prefix):
    """A queue restart two windows back left its drop in the history: every window whose delta
    no longer spanned it was still `partial` (no decision for three minutes instead of one)."""
    E = last_boundary()
    sender = GraphiteSender(graphite.carbon_host, graphite.carbon_port)
    for ts in range(E - 180, E, 10):
        total = 500 + (ts - (E - 180)) if ts < E - 150 else (ts - (E - 150)) // 2  # 520 -> 0 at E-150
        for metric, value in dict(QUEUE, submitted_total=total, completed_total=total).items():
            sender.send(f"{graphite_prefix}.queue.{metric}", value, ts)
    sender.flush()
    publish_window(sender, graphite_prefix, E, [("small", "i1", 50.0, 1.0, E - 180)])
    wait_for_points(graphite.render_url, f"{graphite_prefix}.queue.*", E - 181, E - 1, 5, 18)
    wait_for_points(graphite.render_url, f"{graphite_prefix}.groups.small.instances.i1.*", E - 181, E - 1, 3, 18)

    now = source(graphite, graphite_prefix, E).read()
    assert now.status == "ok", now.reasons
    assert now.queue.submitted_interval == 30  # 70 at E-10 minus 40 at E-70, after the reset
    # the window the drop falls into is still called what it is
    then = source(graphite, graphite_prefix, E - 120).read()
    assert then.status == "partial" and any("went backwards" in r for r in then.reasons)


@pytest.mark.graphite
def test_a_reused_instance_name_is_a_new_instance(graphite, graphite_prefix):
    """Docker names a new container after the newest one removed (`ns-small-3` again): the new
    one inherited the old one's heartbeats, so it was `silent` (partial) while booting and then
    400 s old at its first report, its boot-time load counted past the warm-up."""
    E = last_boundary()
    sender = GraphiteSender(graphite.carbon_host, graphite.carbon_port)
    old = InstanceReporter(sender, graphite_prefix, "small", "ns-small-3")
    for ts in range(E - 400, E - 100, 10):  # removed at E-100
        old.report(40.0, 1.0, ts, flush=False)
    publish_window(sender, graphite_prefix, E, [("small", "ns-small-1", 50.0, 1.0, E - 400)], QUEUE, QUEUE_BEFORE)
    wait_for_points(graphite.render_url, f"{graphite_prefix}.groups.small.instances.*.up", E - 401, E - 1, 2, 30)
    wait_for_points(graphite.render_url, f"{graphite_prefix}.queue.*", E - 181, E - 1, 5)
    inventory = {"small": GroupStatus("small", 2, 0, 10, (
        Instance("small", "ns-small-1", "running", launched_at=E - 400),
        Instance("small", "ns-small-3", "running", launched_at=E - 30)))}  # the new one

    booting = assemble_snapshot(source(graphite, graphite_prefix, E).read(), inventory, FLEET, ["small"])
    assert booting.status == "ok", booting.reasons
    np.testing.assert_array_equal(booting.snapshot.vm_state, [VM_RUNNING, VM_BOOTING])

    new = InstanceReporter(sender, graphite_prefix, "small", "ns-small-3")
    for ts in (E - 20, E - 10):
        new.report(5.0, 0.2, ts, flush=False)
    sender.flush()
    wait_for_points(graphite.render_url, f"{graphite_prefix}.groups.small.instances.ns-small-3.cpu_percent",
                    E - 61, E - 1, 1, 2)
    up = assemble_snapshot(source(graphite, graphite_prefix, E).read(), inventory, FLEET, ["small"])
    assert up.status == "ok", up.reasons
    np.testing.assert_array_equal(up.snapshot.vm_state, [VM_RUNNING, VM_RUNNING])
    np.testing.assert_allclose(up.snapshot.vm_running_for_s, [400, 30])  # since its launch, not the old one's
    metrics = compute_metrics(up.snapshot, FLEET, warmup_s=120)
    assert metrics[1] == pytest.approx(0.5)  # the new instance is still warming up: not measured


@pytest.mark.graphite
def test_a_fleet_none_of_which_reports_is_partial_not_idle(graphite, graphite_prefix):
    """Collectors down (or never started) while the queue reports: every VM counted as booting
    under a note, the snapshot `ok` and CPU 0, which a threshold policy reads as an idle fleet
    and removes capacity."""
    E = last_boundary()
    sender = GraphiteSender(graphite.carbon_host, graphite.carbon_port)
    n = publish_window(sender, graphite_prefix, E, [], QUEUE, QUEUE_BEFORE)
    wait_for_points(graphite.render_url, f"{graphite_prefix}.queue.*", E - 181, E - 1, n)
    reading = source(graphite, graphite_prefix, E).read()
    assert reading.status == "ok", reading.reasons
    inventory = {"small": GroupStatus("small", 2, 0, 10, (Instance("small", "i1", "running", launched_at=E - 3600),
                                                          Instance("small", "i2", "running", launched_at=E - 3600)))}
    out = assemble_snapshot(reading, inventory, FLEET, ["small"])
    assert out.status == "partial"
    assert any("no instance of the fleet reported CPU and RAM" in r and "load is unknown" in r for r in out.reasons)
    # a fleet that only just launched is booting, as before: nothing to complain about yet
    fresh = {"small": GroupStatus("small", 1, 0, 10, (Instance("small", "i3", "pending", launched_at=E - 30),))}
    assert assemble_snapshot(reading, fresh, FLEET, ["small"]).status == "ok"


def test_a_launch_time_after_the_window_says_nothing_about_it():
    """The inventory is read after the window, on the executor's clock: a launch time past the
    window's end (a replayed or delayed window) must not turn a reporting instance into a booting one."""
    E = 1_000_020.0
    reading = MonitorReading(E - 60, E, {("small", "a"): InstanceReading("small", "a", 50.0, 2.0, E - 300, E - 5)},
                             QueueReading(), "ok", ())
    inventory = {"small": GroupStatus("small", 1, 0, 10, (Instance("small", "a", "running", launched_at=E + 200),))}
    out = assemble_snapshot(reading, inventory, FLEET, ["small"])
    assert out.status == "ok", out.reasons
    np.testing.assert_array_equal(out.snapshot.vm_state, [VM_RUNNING])
    np.testing.assert_allclose(out.snapshot.vm_running_for_s, [300])
