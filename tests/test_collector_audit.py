"""Regression tests from the audit of `samm collect`, the Graphite sender and the local Graphite:
a stalled collector's catch-up burst, SIGTERM, metric prefixes carbon would mangle, IPv6
addresses, out-of-range option values and points, and starting Graphite over a taken port or
a stale carbon pid file."""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from click.testing import CliRunner

from fixtures_graphite import wait_for_points
from samm.cli.main import cli
from samm.monitor.collector import HostSampler, InstanceReporter, QueueReporter, parse_host_port, run_collector
from samm.monitor.graphite_client import GraphiteSender
from samm.monitor.local_graphite import GraphiteUnavailable, LocalGraphite, missing_packages


def dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_stalled_collector_skips_missed_ticks_instead_of_sending_a_burst():
    """After a stall (SIGSTOP, swap, a slow carbon) the missed ticks used to fire back to back:
    each sample measured CPU over microseconds (0 % or 100 % at 10 ms clock ticks) and, with the
    same timestamp, overwrote the good point in carbon's slot."""
    interval = 0.4
    calls, reported_at = [], []

    def stalling_sleep(wait: float) -> None:
        calls.append(wait)
        time.sleep(wait + (1.3 if len(calls) == 2 else 0.0))  # stalled for three ticks

    sender = GraphiteSender("127.0.0.1", dead_port(), timeout_s=0.2)
    n = run_collector(InstanceReporter(sender, "p", "g", "i"), HostSampler(cores=1), interval_s=interval,
                      duration_s=3.2, sleep=stalling_sleep, on_report=lambda s: reported_at.append(time.monotonic()))
    gaps = [b - a for a, b in zip(reported_at, reported_at[1:])]
    assert n == len(reported_at) >= 3
    assert min(gaps) > interval / 2, gaps  # the next tick is at least half an interval away


def test_reporters_refuse_a_prefix_carbon_would_mangle():
    sender = GraphiteSender("127.0.0.1", dead_port())
    for bad in ("my prefix", "a..b", "samm/prod", "x;k=v", "", ".samm", "sämm"):
        with pytest.raises(ValueError, match="prefix"):
            InstanceReporter(sender, bad, "g", "i")
        with pytest.raises(ValueError, match="prefix"):
            QueueReporter(sender, bad)
    InstanceReporter(sender, "samm.prod-1_a", "g", "i")  # dotted components stay allowed


def test_collect_refuses_bad_prefix_or_group_infinite_cores_and_a_duration_below_the_interval():
    """Each of these used to run and send points nobody reads (or none at all), with exit 0."""
    runner = CliRunner()
    base = ["collect", "--group", "g", "--instance", "i", "--graphite", f"127.0.0.1:{dead_port()}"]
    for args, expect in ((["--prefix", "my prefix", "--once"], "--prefix"),
                         (["--group", "", "--once"], "--group"),  # `--group "$UNSET"`
                         (["--group", "small ", "--once"], "--group"),
                         (["--group", "small.v2", "--once"], "--group"),
                         (["--prefix", "samm/prod", "--once"], "--prefix"),
                         (["--cores", "inf", "--once"], "cores must be positive"),
                         (["--interval", "1e10"], "--interval"),  # used to overflow the sleep: a traceback
                         (["--interval", "10", "--duration", "5"], "shorter than --interval"),
                         (["--graphite", "::1"], "brackets")):
        res = runner.invoke(cli, base + args)
        assert res.exit_code == 2, (args, res.output)
        assert expect in res.output and res.output.count("\n") == 1, (args, res.output)


def test_graphite_addresses_with_ipv6_brackets():
    assert parse_host_port("[::1]:2004") == ("::1", 2004)
    assert parse_host_port("[::1]") == ("::1", 2003)
    assert parse_host_port("carbon.example:2004") == ("carbon.example", 2004)
    for bad in ("::1", "fe80::1:2003", "[::1", "[::1]2003", "[]:2003", "[::1]:0", "[::1]:x", ":2003"):
        with pytest.raises(ValueError):
            parse_host_port(bad)


def test_collect_once_delivers_over_ipv6_loopback():
    try:
        srv = socket.create_server(("::1", 0), family=socket.AF_INET6)
    except OSError:
        pytest.skip("no IPv6 loopback")
    received: list[bytes] = []

    def serve():
        conn, _ = srv.accept()
        with conn:
            while chunk := conn.recv(65536):
                received.append(chunk)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    with srv:
        res = CliRunner().invoke(cli, ["collect", "--group", "g", "--instance", "i", "--once",
                                       "--graphite", f"[::1]:{srv.getsockname()[1]}"])
        t.join(timeout=10)
    assert res.exit_code == 0 and "0 point(s) dropped" in res.output, res.output
    assert sorted(line.split()[0] for line in b"".join(received).decode().splitlines()) == [
        "samm.groups.g.instances.i.cpu_percent", "samm.groups.g.instances.i.ram_used_gb", "samm.groups.g.instances.i.up"]


def test_collect_once_fails_when_no_point_reached_carbon():
    """`samm collect --once` against a dead carbon said "sent 1 report(s)" and exited 0: a cron
    job or a probe could not tell."""
    res = CliRunner().invoke(cli, ["collect", "--group", "g", "--instance", "i", "--once",
                                   "--graphite", f"127.0.0.1:{dead_port()}"])
    assert res.exit_code == 1 and "3 point(s) dropped" in res.output, res.output
    assert "error: no point reached carbon at 127.0.0.1:" in res.output


def test_sender_skips_values_and_timestamps_out_of_range_instead_of_raising():
    sender = GraphiteSender("127.0.0.1", dead_port())
    sender.send("a.big", 10 ** 400, time.time())  # beyond float: OverflowError used to escape
    sender.send("a.when", 1.0, float("inf"))
    sender.send("a.ok", 1.0, time.time())
    assert sender.skipped == 2 and sender.pending == 1


@pytest.mark.graphite
def test_sigterm_ends_collect_with_its_summary(graphite, graphite_prefix):
    """A service manager stops the collector with SIGTERM (as a container's PID 1, where the
    default action is to ignore it, it used to run on until SIGKILL)."""
    t0 = int(time.time())
    proc = subprocess.Popen([sys.executable, "-m", "samm.cli.main", "collect", "--graphite",
                             f"{graphite.carbon_host}:{graphite.carbon_port}", "--prefix", graphite_prefix,
                             "--group", "small", "--instance", "i1", "--interval", "1"],
                            stderr=subprocess.PIPE, text=True)
    try:
        # points in Graphite: the collector is in its loop, its handler installed
        wait_for_points(graphite.render_url, f"{graphite_prefix}.groups.small.instances.i1.up", t0 - 1,
                        int(time.time()) + 60, timeout_s=30)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-2000:]
    assert "report(s) for small/i1" in err and "0 point(s) dropped" in err


@pytest.mark.graphite
def test_local_graphite_refuses_to_start_on_a_taken_port(tmp_path):
    """A restart after `stop()` (an outage test) can find a port taken: carbon died on it while
    the ready check, talking to the squatter, said up."""
    if missing_packages():
        pytest.skip("Graphite not installed")
    g = LocalGraphite(tmp_path / "g")
    try:
        g.start()
        g.stop()
        with socket.create_server(("127.0.0.1", g.carbon_port)):
            with pytest.raises(GraphiteUnavailable, match=f"{g.carbon_port} \\(carbon line receiver\\)"):
                g.start()
        assert not g.running
    finally:
        g.close()


@pytest.mark.graphite
def test_local_graphite_starts_over_a_stale_carbon_pid_file(tmp_path):
    """After a crash or a reboot the pid in carbon's pid file can belong to another process;
    carbon then refused to start ("already running")."""
    if missing_packages():
        pytest.skip("Graphite not installed")
    g = LocalGraphite(tmp_path / "g")
    other = subprocess.Popen(["sleep", "60"])
    try:
        (g.root / "run" / "carbon-cache-a.pid").write_text(f"{other.pid}\n")
        g.start()
        assert g.running
    finally:
        other.kill()
        other.wait(timeout=10)
        g.close()


REUSED_PID_SCRIPT = """
import json, subprocess, sys, time
from samm.monitor.collector import HostSampler
first = subprocess.Popen(["sleep", "0.3"])
sampler = HostSampler(cores=1, pid=first.pid)
first.wait()
with open("/proc/sys/kernel/ns_last_pid", "w") as f:  # the next process gets the measured one's PID
    f.write(str(first.pid - 1))
busy = subprocess.Popen([sys.executable, "-c", "import time\\nt = time.time()\\nwhile time.time() - t < 5: pass"])
time.sleep(1.0)
s = sampler.sample()
busy.kill()
print(json.dumps({"reused": busy.pid == first.pid, "cpu": s.cpu_percent, "ram": s.ram_used_gb}))
"""


def test_collect_pid_never_measures_the_process_that_inherits_its_pid(tmp_path):
    """psutil reads a PID's counters without checking it is still the same process: after the
    measured process exited, a busy stranger given its PID was reported as the workload."""
    import json
    import os
    import shutil

    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare (a PID namespace whose next PID can be set)")
    script = tmp_path / "reuse.py"
    script.write_text(REUSED_PID_SCRIPT)
    proc = subprocess.run(["unshare", "-pfm", "--mount-proc", sys.executable, str(script)],
                          capture_output=True, text=True, timeout=60)
    if proc.returncode != 0 or not proc.stdout.strip():
        pytest.skip(f"cannot make a PID namespace here: {proc.stderr[-300:]}")
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if not got["reused"]:
        pytest.skip("the kernel did not hand the PID out again")
    assert got["cpu"] == 0.0 and got["ram"] == 0.0, got
    assert "exited" in proc.stderr


def test_collect_skips_reports_while_proc_is_unreadable_and_resumes(tmp_path):
    """A /proc read failure (here /proc unmounted mid-run, in a private mount namespace) used to
    end the collector with a traceback; at the start it was a traceback, not a one-line error."""
    import os
    import shutil

    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare (a private mount namespace)")
    log = tmp_path / "collect.log"
    with socket.socket() as held:  # bound, never listening: every flush is refused, and logged
        held.bind(("127.0.0.1", 0))
        collect = (f"{sys.executable} -m samm.cli.main collect --group g --instance i --interval 0.5 "
                   f"--graphite 127.0.0.1:{held.getsockname()[1]}")
        # wait for each state in the log, never for a fixed time (a loaded machine is only slower),
        # and give up after 30 s each
        script = f"""
await_line() {{ n=0; until grep -q "$1" {log}; do [ $n -ge 300 ] && return 1; sleep 0.1; n=$((n+1)); done; }}
{collect} > {log} 2>&1 & P=$!
await_line unreachable && umount -l /proc && await_line 'cannot read CPU and RAM' && mount -t proc proc /proc \
    && await_line 'readable again'
kill -TERM $P; wait $P
echo "rc=$?"
umount -l /proc
{collect} --once 2>&1
"""
        proc = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=120)
    if "rc=" not in proc.stdout:
        pytest.skip(f"cannot make a mount namespace here: {proc.stderr[-300:]}")
    text = log.read_text()
    assert "rc=0" in proc.stdout and "readable again" in text and "Traceback" not in text, text[-2000:]
    at_start = proc.stdout.strip().splitlines()[-1]
    assert at_start.startswith("error: cannot read the CPU and RAM of this host") and "Traceback" not in proc.stdout
