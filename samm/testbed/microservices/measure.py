"""One `observation.StepMeasurement` per second from the real containers and the load generator.

Where each per-service field comes from (over the interval since the previous measurement):

| field                     | source                                                              |
|---------------------------|---------------------------------------------------------------------|
| cpu_used (cores)          | the container's cgroup: Δ cpuacct.usage (v1) or Δ cpu.stat usage_usec (v2) / Δt |
| cpu_limit (cores)         | the engine: HostConfig.CpuQuota / CpuPeriod (docker inspect); none: the engine's CPUs, named in extra["unlimited"] |
| rss_bytes, cache_bytes    | the cgroup's memory.stat: total_rss / total_cache (v1), anon / file (v2) |
| page_faults (per second)  | Δ total_pgfault (v1) or Δ pgfault (v2) of memory.stat                |
| io_bytes, io_ops (per s)  | Δ blkio.throttle.io_service_bytes / io_serviced "Total" (v1), Δ io.stat (v2) |
| rx/tx_bytes (per second)  | the service's own counters (<state>/<service>.json, written each second by app.py) |
| rx/tx_packets (per second)| HTTP messages received / sent, from the same counters               |
| throttled (extra)         | Δ nr_throttled / Δ nr_periods and Δ throttled time / Δt of cpu.stat (v1 and v2) |

The throttling counters are not among the paper's features (Table 1 has none; the policy does not
see them): they are kept beside each step (`extra["throttled"]`, `extra["throttled_s"]`, the
steps.csv columns `throttled_<service>`) to tell whether a slow second met the CFS quota.

Why the cgroup and not the engine's stats endpoint for CPU: `docker stats` samples each container
for about a second per call (7 containers: 7 concurrent streams on a 2-core host, each a window
that is not our step); the cgroup holds the same kernel counters the engine reads, exact to the
nanosecond, read in microseconds at the step boundary. The limit is read from the engine, because
that is what `DockerExecutor.set_cpu_limit` changed (tests compare it with cpu.cfs_quota_us too).

Zeros where a counter does not exist: with host networking a container has no network interface,
so network counts are the application's (bytes of HTTP requests and responses, estimated headers
included); a stopped container (killed, or the engine down) has no cgroup, so it used 0 cores in
that second; on cgroup v1 buffered writes are charged to the root cgroup at writeback, so io_* of
the db service mostly shows its reads and fsyncs (often 0 with a warm page cache).

Counters that restart (a container restarted: another id or start time in the engine, or a
counter smaller than before) count from zero: the delta of that second is the new counter's
value. The network counters too, and a counters file written before the container's start (its
previous process's, until the new one writes) counts as missing: zeros for that second. When the
engine cannot be read, cpu_limit keeps the last value read and the error is listed in
`extra["engine_errors"]`. A running container whose cgroup cannot be found or read (its process
hidden from this user, a cgroup layout not known) has an unknown CPU use, listed with the reason in
`extra["cpu_unknown"]`, not a use of 0.

Application level: the newest second of the load generator. When its newest line ended more than
`stale_s` (2 s) ago, or it is the line an earlier measurement already handed out (Locust's line
for the second just ended came late: no new second), the load data is stale: every latency
percentile, requests/s and failures/s are NaN and `extra["stale"]` is true (and
`extra["load_repeated"]` in the second case): each line, one per load second, is fresh to one
measurement only. A fresh second in which no request completed has NaN latency too
(`extra["latency_state"] == "none completed"`).
"""
from __future__ import annotations

import json
import logging
import math
import os
import time

import numpy as np

from agents.microservice_cores.observation import FIELD, PERCENTILES, SERVICE_FIELDS, StepMeasurement
from samm.execute.docker_exec import limit_cores, parse_docker_time
from samm.monitor.cgroups import CgroupReader

NAN = float("nan")
log = logging.getLogger(__name__)


_NET = ("rx_bytes", "tx_bytes", "rx_messages", "tx_messages")
_CG = ("cpu_s", "pgfault", "io_bytes", "io_ops", "nr_periods", "nr_throttled", "throttled_s")


def unlimited_cores(executor) -> float:
    """The cores a container without a CPU quota can use: the engine's CPUs (`executor`'s
    DockerExecutor asks it once; a remote engine's are not this host's), this host's where the
    engine does not say."""
    n = executor.host_cpus() if executor is not None else None
    return float(n or os.cpu_count() or 1)


def _delta(new: float, old: float | None) -> float:
    """Δ of a cumulative counter; a counter that restarted (smaller) counts from zero."""
    if old is None:
        return 0.0
    return new - old if new >= old else new


class Measurer:
    """`measure()` builds the StepMeasurement of the interval since its previous call.
    `containers`: an AppContainers; `load`: a LoadGenerator (or anything with `latest()`)."""

    def __init__(self, topology, containers, load, *, stale_s: float = 2.0, cgroups: CgroupReader | None = None):
        self.topology = topology
        self.services = tuple(topology.service_names)
        self.c = containers
        self.load = load
        self.stale_s = stale_s
        self.cg = cgroups or CgroupReader()
        self._paths: dict[str, tuple[str, dict]] = {}    # service -> (container id, cgroup paths)
        self._prev: dict[str, dict] = {}
        self._prev_t: float | None = None
        self._started: dict[str, tuple] = {}              # service -> (container id, StartedAt) last seen running
        self._limit = {s: float(topology.services[s].cap) for s in self.services}
        # the load second a measurement last handed out as fresh, by (second, t_end) rather than by
        # object: a replaced or re-read file parses the same line into a new dict
        self._claimed: tuple | None = None

    def _inspect(self, s: str) -> dict:
        return self.c.client.api.inspect_container(self.c.names[s])

    def measure(self, now: float | None = None, *, claim: bool = True) -> StepMeasurement:
        """`claim`: the load second read is this measurement's, fresh to no later one (False for
        a measurement that only primes the counters: no step acts on it)."""
        t = time.time() if now is None else now
        dt = (t - self._prev_t) if self._prev_t is not None else None
        rows = np.zeros((len(self.services), len(SERVICE_FIELDS)))
        engine_errors: list[str] = []
        running: dict[str, bool] = {}
        kernel_limit: dict[str, float] = {}
        unlimited: list[str] = []           # services whose container has no CPU quota
        throttled: dict[str, float] = {}    # share of the second's CFS periods that ran out of quota
        throttled_s: dict[str, float] = {}  # seconds its threads waited for the next period, per second
        cpu_unknown: list[str] = []         # running services whose cgroup could not be read
        for i, s in enumerate(self.services):
            info = None
            try:
                info = self._inspect(s)
                cores = limit_cores(info["HostConfig"])   # quota / period, or --cpus' NanoCpus
                if cores is None:
                    unlimited.append(s)
                    cores = unlimited_cores(getattr(self.c, "executor", None))
                self._limit[s] = cores
                running[s] = bool(info["State"].get("Running"))
            except Exception as exc:  # noqa: BLE001 - the engine may be down: keep measuring
                engine_errors.append(f"{s}: {type(exc).__name__}: {str(exc)[:160]}")
                running[s] = False
            cur = None
            why = None
            if info is not None and running[s]:
                cid, pid = info["Id"], info["State"].get("Pid") or 0
                cached = self._paths.get(s)
                if cached is None or cached[0] != cid:
                    try:
                        self._paths[s] = (cid, self.cg.paths(pid))
                    except (OSError, ValueError) as exc:
                        self._paths.pop(s, None)
                        why = f"cgroup of pid {pid} not found ({type(exc).__name__}: {str(exc)[:120]})"
            if s in self._paths:
                try:
                    cur = self.cg.read(self._paths[s][1])
                    kernel_limit[s] = self.cg.quota_cores(self._paths[s][1])
                except (OSError, KeyError, ValueError) as exc:
                    cur = None
                    why = f"cgroup unreadable ({type(exc).__name__}: {str(exc)[:120]})"
            if info is not None and running[s] and cur is None:
                # a running container's use read as 0 looked idle: AutoScale cut it step after step
                # (/proc/<pid> hidden from the daemon's user, say); its use is unknown instead
                cpu_unknown.append(f"{s}: {why or 'cgroup unreadable'}")
            net = self._net(s)
            prev = self._prev.get(s, {})
            if info is not None and running[s]:
                if self._restarted(s, info):
                    # a new cgroup and a new process: their counters start at zero, whatever the old
                    # container had reached (comparing sizes alone took a young service's restart
                    # for a tiny delta)
                    prev = dict(prev) | {k: 0 for k in (*_CG, *_NET) if k in prev}
                net = self._since_start(net, info)
            row = rows[i]
            row[FIELD["cpu_limit"]] = self._limit[s]
            if cur is not None:
                row[FIELD["rss_bytes"]] = cur["rss"]
                row[FIELD["cache_bytes"]] = cur["cache"]
            if dt and dt > 0:
                if cur is not None:
                    row[FIELD["cpu_used"]] = _delta(cur["cpu_s"], prev.get("cpu_s")) / dt
                    row[FIELD["page_faults"]] = _delta(cur["pgfault"], prev.get("pgfault")) / dt
                    row[FIELD["io_bytes"]] = _delta(cur["io_bytes"], prev.get("io_bytes")) / dt
                    row[FIELD["io_ops"]] = _delta(cur["io_ops"], prev.get("io_ops")) / dt
                    if "nr_periods" in prev:
                        periods = _delta(cur["nr_periods"], prev["nr_periods"])
                        throttled[s] = _delta(cur["nr_throttled"], prev["nr_throttled"]) / periods if periods else 0.0
                        throttled_s[s] = _delta(cur["throttled_s"], prev["throttled_s"]) / dt
                if net is not None:
                    for field, key in (("rx_bytes", "rx_bytes"), ("tx_bytes", "tx_bytes"),
                                       ("rx_packets", "rx_messages"), ("tx_packets", "tx_messages")):
                        row[FIELD[field]] = _delta(net[key], prev.get(key)) / dt
            state = dict(prev)
            if cur is not None:  # else (no cgroup now) the old values stay: a restarted counter is smaller
                state.update({k: cur[k] for k in _CG})
            if net is not None:
                state.update({k: net[k] for k in _NET})
            self._prev[s] = state
        self._prev_t = t

        lat = np.full(len(PERCENTILES), NAN)
        rps = fps = NAN
        rec = self.load.latest()
        # a second that ends well after now is not fresh either: another clock, or a bogus line
        # (load.record_problem refuses those far ahead); NaN ages are stale too
        stale = rec is None or not -self.stale_s <= t - float(rec["t_end"]) <= self.stale_s
        # a line arriving late (within the staleness window) left the newest second the one an
        # earlier step already saw: acting on it again doubles one second's p99 in the decisions
        # and in the run's counts; each line (one per second) is fresh to one measurement only
        key = None if rec is None else (int(rec["second"]), float(rec["t_end"]))
        repeated = key is not None and key == self._claimed
        stale = stale or repeated
        if claim and not stale:
            self._claimed = key
        if stale:
            latency_state = "stale"
        else:
            rps, fps = float(rec["requests_per_s"]), float(rec["failures_per_s"])
            if rec.get("latency_ms"):
                lat = np.asarray(rec["latency_ms"], dtype=np.float64)
                latency_state = "ok"
            else:
                latency_state = "none completed"
        extra = {"stale": stale, "load_repeated": repeated, "latency_state": latency_state,
                 "engine_errors": engine_errors, "cpu_unknown": cpu_unknown, "running": running,
                 "kernel_limit": kernel_limit,
                 "unlimited": unlimited,
                 "throttled": throttled, "throttled_s": throttled_s,
                 "load_second": None if rec is None else int(rec["second"]),
                 "load_age_s": None if rec is None else round(t - float(rec["t_end"]), 3),
                 "inflight": None if rec is None else rec.get("inflight"),
                 "oldest_inflight_ms": None if rec is None else rec.get("oldest_inflight_ms"),
                 "users": None if rec is None else rec.get("users")}
        return StepMeasurement(services=self.services, per_service=rows, latency_ms=lat, requests_per_s=rps,
                               failures_per_s=fps, qos_ms=float(self.topology.qos_ms), t=t, extra=extra)

    def _restarted(self, s: str, info: dict) -> bool:
        """Whether the running container of `s` is another one, or started again, since the last
        measurement that saw it running (updates the memory)."""
        ident = (info.get("Id"), (info.get("State") or {}).get("StartedAt"))
        old, self._started[s] = self._started.get(s), ident
        return old is not None and old != ident

    @staticmethod
    def _since_start(net: dict | None, info: dict) -> dict | None:
        """The service's counters, or None while the file is still the one the container's previous
        process left (written before this start): read against the restart's zero, those would
        be a burst of the old process's whole life in one second."""
        started = parse_docker_time((info.get("State") or {}).get("StartedAt"))
        written = None if net is None else net.get("t")
        if started is not None and isinstance(written, (int, float)) and written < started:
            return None
        return net

    def _net(self, s: str) -> dict | None:
        """The service's own counters, or None (zeros this second, the previous counters kept) when
        the file is missing, unreadable or not counters: it is another process's file, and one bad
        file must not stop the measurement of every service."""
        try:
            net = json.loads((self.c.state_dir / f"{s}.json").read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(net, dict) or not all(
                isinstance(net.get(k), (int, float)) and not isinstance(net.get(k), bool)
                and math.isfinite(net[k]) and net[k] >= 0 for k in _NET):
            log.warning("service %s: counters file %s is not %s as numbers >= 0; ignored", s,
                        self.c.state_dir / f"{s}.json", ", ".join(_NET))
            return None
        return net
