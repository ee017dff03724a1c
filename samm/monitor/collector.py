"""Collectors: what each managed instance (and the queue's owner) sends to Graphite.

The reporters are the reusable part: they turn measured values into the series of
docs/metric-naming.md and send them as one batch. `samm collect` wraps `InstanceReporter`
around a psutil sampler of the host (or of one process tree with `--pid`); the testbed's
workers call the reporters in-process with their own measured values.
"""
from __future__ import annotations

import logging
import math
import os
import re
import threading
import time
from dataclasses import dataclass
from typing import Callable

import psutil

from .graphite_client import GraphiteSender, sanitize

log = logging.getLogger(__name__)

INSTANCE_METRICS = ("cpu_percent", "ram_used_gb", "up")
QUEUE_METRICS = ("submitted_total", "waiting", "running", "completed_total", "waiting_submitted_this_minute",
                 "waiting_cores", "running_cores", "head_job_cores")
GB = 1e9
# the rule `graphite.prefix` follows in the daemon's config: dotted components of [A-Za-z0-9_-]
# (carbon turns '/' and '..' into other levels and ';' into a tagged series: the reader would
# never find the points; graphyte refuses whitespace, and every point would be skipped)
_PREFIX = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")


def check_prefix(prefix: str) -> str:
    """`prefix` unchanged, or ValueError naming it when it is not a valid metric prefix."""
    if not isinstance(prefix, str) or not _PREFIX.match(prefix):
        raise ValueError(f"prefix {prefix!r} is not dotted components of letters, digits, '_' and '-' "
                         "(as graphite.prefix in the daemon's config)")
    return prefix


def check_group(group: str) -> str:
    """`group` unchanged, or ValueError when no daemon config could name it (groups[].name is
    `[A-Za-z0-9_-]+`): sanitised, its reports would land under a group nobody reads, and the
    instance would count as silent (`--group "$UNSET"` gives `_`)."""
    if not isinstance(group, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,50}", group):
        raise ValueError(f"group {group!r} is not 1-50 letters, digits, '_' and '-' (as groups[].name in the daemon's config)")
    return group


def instance_path(prefix: str, group: str, instance: str, metric: str) -> str:
    return f"{prefix}.groups.{sanitize(group)}.instances.{sanitize(instance)}.{metric}"


def queue_path(prefix: str, metric: str) -> str:
    return f"{prefix}.queue.{metric}"


class InstanceReporter:
    """`report(cpu_percent, ram_used_gb, ts)` sends the three per-instance series: CPU busy
    share of the instance's cores (0–100) over the last sampling period, RAM in use (GB) and
    the `up` heartbeat."""

    def __init__(self, sender: GraphiteSender, prefix: str, group: str, instance: str):
        self.sender = sender
        check_prefix(prefix)
        self._paths = {m: instance_path(prefix, group, instance, m) for m in INSTANCE_METRICS}

    def report(self, cpu_percent: float, ram_used_gb: float, ts: float | None = None, flush: bool = True) -> None:
        """`flush=False` leaves the points in the sender's buffer (several reporters sharing
        one sender then flush once)."""
        ts = time.time() if ts is None else ts
        self.sender.send(self._paths["cpu_percent"], cpu_percent, ts)
        self.sender.send(self._paths["ram_used_gb"], ram_used_gb, ts)
        self.sender.send(self._paths["up"], 1, ts)
        if flush:
            self.sender.flush()


class QueueReporter:
    """The job queue's counters (cumulative `*_total`, gauges for the rest)."""

    def __init__(self, sender: GraphiteSender, prefix: str):
        self.sender = sender
        check_prefix(prefix)
        self._paths = {m: queue_path(prefix, m) for m in QUEUE_METRICS}

    def report(self, submitted_total: float, waiting: float, running: float, completed_total: float,
               waiting_submitted_this_minute: float, ts: float | None = None, flush: bool = True,
               waiting_cores: float | None = None, running_cores: float | None = None,
               head_job_cores: float | None = None) -> None:
        """The core counts are optional (exporters that predate them send none); policies on
        the `extended` features need them."""
        ts = time.time() if ts is None else ts
        values = dict(submitted_total=submitted_total, waiting=waiting, running=running,
                      completed_total=completed_total, waiting_submitted_this_minute=waiting_submitted_this_minute,
                      waiting_cores=waiting_cores, running_cores=running_cores, head_job_cores=head_job_cores)
        for m in QUEUE_METRICS:
            if values[m] is not None:
                self.sender.send(self._paths[m], values[m], ts)
        if flush:
            self.sender.flush()


@dataclass
class Sample:
    cpu_percent: float
    ram_used_gb: float


class HostSampler:
    """CPU busy share and RAM in use of this host, or of one process tree (`pid`).

    CPU is expressed as a share of `cores` when given (an instance type's cores), else of every
    online CPU; capped at 100. RAM is the host's total − available, or the tree's resident set.
    The first `sample()` measures since construction.

    Without `pid` the counters are /proc's, which a container shares with its host (cgroup v1
    or v2 alike: only the cgroup files are the container's): inside a container this measures
    the whole host, so a container's collector measures its own processes with `pid=1`.
    """

    def __init__(self, cores: float | None = None, pid: int | None = None):
        if cores is not None and not 0 < cores < math.inf:  # inf would report 0 % whatever the load
            raise ValueError(f"cores must be positive and finite, got {cores}")
        self.cores = float(cores) if cores else float(psutil.cpu_count() or 1)
        self.pid = pid
        self._proc = psutil.Process(pid) if pid is not None else None  # raises NoSuchProcess early
        self._gone = False
        self._last_cpu_s = self._cpu_seconds()
        self._last_t = time.monotonic()

    def _tree(self) -> list[psutil.Process]:
        if self._gone:
            return []
        # psutil reads a PID's counters without checking that it is still the same process: once
        # the measured one has exited, its PID can be handed to an unrelated process
        if not self._proc.is_running():
            log.warning("process %d exited: reporting 0 CPU and RAM for it from now on", self.pid)
            self._gone = True
            return []
        procs = [self._proc]
        try:
            procs += self._proc.children(recursive=True)
        except psutil.NoSuchProcess:
            pass
        return procs

    def _cpu_seconds(self) -> float:
        if self._proc is None:
            t = psutil.cpu_times()
            return t.user + t.system + getattr(t, "nice", 0.0) + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0) \
                + getattr(t, "steal", 0.0)
        total = 0.0
        for p in self._tree():
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                pass
        return total

    def _ram_gb(self) -> float:
        if self._proc is None:
            vm = psutil.virtual_memory()
            return (vm.total - vm.available) / GB
        rss = 0
        for p in self._tree():
            try:
                rss += p.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        return rss / GB

    def sample(self) -> Sample:
        now, cpu_s = time.monotonic(), self._cpu_seconds()
        elapsed = max(now - self._last_t, 1e-6)
        # a process that exited takes its CPU seconds with it: never report a negative delta
        busy_cores = max(0.0, cpu_s - self._last_cpu_s) / elapsed
        self._last_t, self._last_cpu_s = now, cpu_s
        return Sample(cpu_percent=min(100.0, 100.0 * busy_cores / self.cores), ram_used_gb=self._ram_gb())


class CgroupSampler(HostSampler):
    """CPU busy share and memory in use of one cgroup: the collector's own (inside a container,
    the container's) or the one holding `pid` (a container's main process, seen from the host).

    CPU time is the cgroup's (every process in it, user and system); memory is what it is charged
    less inactive page cache (as `docker stats`); the cores are `cores` when given, else the
    cgroup's CPU quota, else the CPUs the process may run on. Unlike `HostSampler(pid=...)` it
    counts processes that left the measured tree but not the cgroup (a daemonised child), and
    it reads the container's limit, not the host's CPU count. A cgroup that disappears (its
    container removed) makes `sample()` raise OSError, which the collector's loop skips.
    """

    def __init__(self, cores: float | None = None, pid: int | None = None):
        from .cgroups import CgroupReader

        if cores is not None and not 0 < cores < math.inf:
            raise ValueError(f"cores must be positive and finite, got {cores}")
        if pid is not None:
            psutil.Process(pid)  # NoSuchProcess early, as HostSampler
        self._reader = CgroupReader()
        self._paths = self._reader.paths(os.getpid() if pid is None else pid, own=pid is None)
        missing = [str(p) for p in self._paths.values() if not p.is_dir()]
        if not self._paths or missing:
            raise OSError(f"no cgroup directory of {'this process' if pid is None else f'pid {pid}'} is visible "
                          f"here ({', '.join(missing) or 'no cgroup hierarchy mounted'})")
        if cores is None:
            quota = self._reader.quota_cores(self._paths)
            allowed = len(os.sched_getaffinity(0 if pid is None else pid)) or 1
            cores = min(quota, allowed)
        self.cores = float(cores)
        self.pid = pid
        self._proc = None
        self._gone = False
        try:
            # both read once here: a group without the memory controller (cgroup v2 enables it per
            # subtree) otherwise started a collector that skipped every report, for good
            self._ram_gb()
            self._last_cpu_s = self._cpu_seconds()
        except KeyError as exc:  # cgroup v1 without that controller's hierarchy mounted
            raise OSError(f"no {exc.args[0]} cgroup hierarchy is mounted here") from None
        self._last_t = time.monotonic()

    def _cpu_seconds(self) -> float:
        return self._reader.cpu_seconds(self._paths)

    def _ram_gb(self) -> float:
        return self._reader.memory_in_use_bytes(self._paths) / GB


def _next_tick(start: float, tick: int, interval_s: float, now: float) -> int:
    """The tick after `tick`, skipping those that would come less than half an interval after
    `now`: a collector that was stalled (stopped, swapped out, a slow carbon) must not send the
    missed ticks back to back, as each sample would measure CPU over microseconds (10 ms clock
    ticks make that 0 % or 100 %) and overwrite the good point in carbon's slot."""
    due = math.floor((now + interval_s / 2 - start) / interval_s) + 1
    if due > tick + 1:
        log.warning("collector fell %d tick(s) behind (stalled?); skipping them", due - tick - 1)
    return max(tick + 1, due)


def _sample_or_none(sampler: HostSampler, failing: bool) -> tuple[Sample | None, bool]:
    """A sample, or None while /proc cannot be read (logged once per streak): a collector skips
    those reports and goes on, it never stops for good. Returns (sample, failing now)."""
    try:
        s = sampler.sample()
    except (OSError, psutil.Error) as exc:
        if not failing:
            log.warning("collector: cannot read CPU and RAM (%s); skipping reports until it can", exc)
        return None, True
    if failing:
        log.info("collector: CPU and RAM readable again")
    return s, False


def run_collector(reporter: InstanceReporter, sampler: HostSampler, interval_s: float = 10.0,
                  once: bool = False, duration_s: float | None = None,
                  sleep: Callable[[float], None] = time.sleep, on_report: Callable[[Sample], None] | None = None,
                  stop: threading.Event | None = None) -> int:
    """Sample and report every `interval_s` (drift-free: ticks are scheduled from the start;
    ticks missed by a stall are skipped, never sent in a burst) until `duration_s` elapses, or
    once after a short first measurement, or until `stop` is set (its wait replaces `sleep`;
    a report under way is finished). Returns reports sent."""
    if not interval_s > 0:
        raise ValueError(f"interval must be positive, got {interval_s}")
    pause = sleep if stop is None else stop.wait
    start = time.monotonic()
    n, tick = 0, 1
    sampling_failed = False
    while True:
        wait = min(1.0, interval_s) if once else start + tick * interval_s - time.monotonic()
        if duration_s is not None and not once and tick * interval_s > duration_s + 1e-9:
            return n
        if wait > 0:
            pause(wait)
        if stop is not None and stop.is_set():
            return n
        s, sampling_failed = _sample_or_none(sampler, sampling_failed)
        if s is not None:
            reporter.report(s.cpu_percent, s.ram_used_gb, time.time())
            n += 1
            if on_report:
                on_report(s)
        if once:
            return n
        tick = _next_tick(start, tick, interval_s, time.monotonic())


def _port(port: str, text: str) -> int:
    # ASCII digits only: int() also takes "+5", " 5" and other scripts' digits ("٣" is 3)
    if not (port.isascii() and port.isdigit()):
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    p = int(port)
    if not 1 <= p <= 65535:
        raise ValueError(f"expected HOST:PORT with a port in 1..65535, got {text!r}")
    return p


def _host(host: str, text: str) -> str:
    # an empty or blank host (`--graphite "$UNSET"` from the systemd unit's environment file) named
    # no carbon: the collector ran on for good, every point dropped as "Name or service not known"
    if not host or any(c.isspace() for c in host):
        raise ValueError(f"expected HOST:PORT with a host name or address, got {text!r}")
    return host


def parse_host_port(text: str, default_port: int = 2003) -> tuple[str, int]:
    """`HOST`, `HOST:PORT`, `[IPV6]` or `[IPV6]:PORT`. A bare IPv6 address is refused: in
    `::1:2003` nobody can tell the port from the address."""
    if text.startswith("["):
        addr, sep, rest = text[1:].partition("]")
        if not sep or not addr or (rest and not rest.startswith(":")):
            raise ValueError(f"expected [IPV6]:PORT, got {text!r}")
        return _host(addr, text), (_port(rest[1:], text) if rest else default_port)
    if text.count(":") > 1:
        raise ValueError(f"an IPv6 address needs brackets, as [ADDR]:PORT, got {text!r}")
    host, sep, port = text.rpartition(":")
    if not sep:
        return _host(text, text), default_port
    return _host(host, text), _port(port, text)
