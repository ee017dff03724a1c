"""Ninth audit of the Monitor (Graphite render answers, the local Graphite launcher) and the
Knowledge store (URLs as operators write them, what callers hand it), against a real Graphite,
a real HTTP server and real SQLite/PostgreSQL where the defect needs one."""
from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from samm.knowledge import KnowledgeError, KnowledgeStore
from samm.monitor.collector import parse_host_port
from samm.monitor.graphite_client import GraphiteError, RenderClient
from samm.monitor.local_graphite import GraphiteUnavailable, LocalGraphite, missing_packages


# --- Graphite render answers ------------------------------------------------------------------

class _Answer:
    """A real HTTP server that answers every request with one fixed JSON body (a proxy, another
    API, or a broken Graphite in front of the reader)."""

    def __init__(self, body: bytes):
        outer = self
        self.body = body

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(outer.body)))
                self.end_headers()
                self.wfile.write(outer.body)

            do_POST = do_GET

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("body", [b'[{"target": "a.b", "datapoints": [[1.0, 1e999]]}]',
                                  b'[{"target": "a.b", "datapoints": [[1.0, -Infinity]]}]'])
def test_a_datapoint_whose_timestamp_is_infinite_is_a_graphite_error(body):
    # int(inf) raised OverflowError, which left the render client as no GraphiteError: callers that
    # catch only GraphiteError (the deferrable loop's capacity read) failed their whole iteration
    with _Answer(body) as srv:
        with pytest.raises(GraphiteError, match="returned JSON that is not a list of"):
            RenderClient(srv.url, timeout_s=5).render("a.b", 0, 60)


# --- the collector's carbon address --------------------------------------------------------------

@pytest.mark.parametrize("text", ["", " ", "carbon host:2003", "[ ]:2003", "carbon:+2003", "carbon:\u0663"])
def test_a_carbon_address_without_a_host_or_with_a_non_ascii_port_is_refused(text):
    # "" (`--graphite "$SAMM_GRAPHITE"` with the variable unset) gave host "": the collector ran for
    # good, dropping every point as "Name or service not known"; int() took "+2003" and Arabic-Indic
    # digits ("\u0663" is port 3)
    with pytest.raises(ValueError, match="expected"):
        parse_host_port(text)


def test_samm_collect_with_an_empty_graphite_address_stops_in_one_line():
    from click.testing import CliRunner

    from samm.cli.main import cli

    res = CliRunner().invoke(cli, ["collect", "--group", "g", "--instance", "i", "--graphite", "", "--once"])
    assert res.exit_code == 2, res.output
    assert "--graphite" in res.output and res.output.strip().count("\n") == 0, res.output


# --- the local Graphite launcher --------------------------------------------------------------

def _our_temp_roots() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("samm-graphite-*"))


@pytest.mark.graphite
def test_a_local_graphite_that_fails_to_start_in_a_with_leaves_no_temporary_root():
    # `with LocalGraphite() as g` whose start failed (a port taken) never reached __exit__: its
    # temporary root stayed behind for good (the exit hook only stopped daemons)
    if missing_packages():
        pytest.skip("Graphite not installed")
    import socket

    before = _our_temp_roots()
    g = LocalGraphite()
    assert g.root in _our_temp_roots() - before
    with socket.create_server(("127.0.0.1", g.web_port)):
        with pytest.raises(GraphiteUnavailable, match=f"{g.web_port} \\(graphite-web\\)"):
            with g:
                pass
    assert not g.root.exists()
    assert _our_temp_roots() - before == set()


def test_a_refused_server_argument_makes_no_temporary_root():
    if missing_packages():
        pytest.skip("Graphite not installed")
    before = _our_temp_roots()
    with pytest.raises(ValueError, match="server must be"):
        LocalGraphite(server="gunicorn")
    assert _our_temp_roots() - before == set()


@pytest.mark.graphite
def test_a_local_graphite_never_closed_has_its_temporary_root_removed_at_exit(tmp_path):
    # the exit hook stopped the daemons but left an own temporary root (whisper files, logs) behind
    if missing_packages():
        pytest.skip("Graphite not installed")
    script = ("from samm.monitor.local_graphite import LocalGraphite\n"
              "g = LocalGraphite().start()\n"
              "print(g.root, flush=True)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr[-2000:]
    root = Path(out.stdout.strip().splitlines()[-1])
    assert root.name.startswith("samm-graphite-")
    assert not root.exists(), f"{root} left behind"


# --- Knowledge store ----------------------------------------------------------------------------

@pytest.mark.parametrize("query, named", [("timeout=abc", "abc"), ("check_same_thread=maybe", "maybe")])
def test_a_sqlite_url_with_a_bad_query_value_is_named_in_one_line(tmp_path, query, named):
    # the driver converts these at create_engine: a bare ValueError ("could not convert string to
    # float: 'abc'") naming neither knowledge.url nor the store came out as a traceback
    url = f"sqlite:///{tmp_path}/k.db?{query}"
    with pytest.raises(KnowledgeError) as err:
        KnowledgeStore(url)
    message = str(err.value)
    assert "knowledge.url" in message and "query parameter" in message and named in message
    assert "\n" not in message


def test_snapshot_reasons_given_as_none_mean_no_reasons(knowledge_url):
    # reasons=None (a Monitor with nothing to say) raised TypeError: 'NoneType' object is not iterable
    with KnowledgeStore(knowledge_url) as s:
        sid = s.record_snapshot(0.0, 60.0, "ok", reasons=None, now=100.0)
        assert s.snapshot(sid).reasons == []


# --- cgroups ------------------------------------------------------------------------------------

def test_a_cgroup_v2_group_without_the_cpu_controller_has_no_quota_not_an_error(tmp_path):
    # cgroup v2 enables the cpu controller per subtree (rootless containers, many systemd units lack
    # it): cpu.max is then absent, and `samm collect --cgroup` stopped at start with "No such file"
    import math

    from samm.monitor.cgroups import CgroupReader, cgroup_mounts

    g = tmp_path / "g"
    g.mkdir()
    (g / "cpu.stat").write_text("usage_usec 1000\nuser_usec 600\nsystem_usec 400\n")
    assert CgroupReader.quota_cores({"unified": g}) == math.inf
    assert CgroupReader.quota_cores({"memory": g}) == math.inf  # v1 without the cpu hierarchy
    with pytest.raises(OSError):  # a group that is gone stays an error (the collector skips it)
        CgroupReader.quota_cores({"unified": tmp_path / "removed"})
    # the kernel's own: a v2 hierarchy mounted here whose root has cpu.stat but no cpu.max
    _, v2 = cgroup_mounts()
    if v2 is None or not (Path(v2) / "cpu.stat").exists() or (Path(v2) / "cpu.max").exists():
        pytest.skip("no cgroup v2 group without the cpu controller on this host")
    assert CgroupReader.quota_cores({"unified": Path(v2)}) == math.inf


def test_samm_collect_cgroup_on_a_group_without_the_memory_controller_fails_at_start(monkeypatch):
    # the kernel's own cgroup v2 hierarchy (mounted beside v1 here, with no controller enabled):
    # the sampler started, then skipped every report for good ("memory.current: No such file"),
    # a collector that ran and sent nothing; it now fails at start, naming the file
    from samm.monitor import cgroups
    from samm.monitor.collector import CgroupSampler

    _, v2 = cgroups.cgroup_mounts()
    if v2 is None or (Path(v2) / "memory.current").exists() or not (Path(v2) / "cpu.stat").exists():
        pytest.skip("no cgroup v2 group without the memory controller on this host")
    own = Path("/proc/self/cgroup").read_text()
    if "0::/\n" not in own and not own.endswith("0::/"):
        pytest.skip("this process is not in the v2 hierarchy's root group")
    monkeypatch.setattr(cgroups, "cgroup_mounts", lambda: ({}, v2))  # read the v2 hierarchy only
    with pytest.raises(OSError, match="memory.current"):
        CgroupSampler()
