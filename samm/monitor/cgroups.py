"""A process's cgroup counters (v1 or v2): CPU time, memory, I/O, throttling and the CPU quota.

One reader for the two places that measure a container rather than a host: the microservice
testbed (each service container, found from the host through its main process) and
`samm collect --cgroup` (the collector's own container, or the cgroup of `--pid`).

Where a process's cgroup lives: /proc/<pid>/cgroup names it relative to each hierarchy's root,
and /proc/self/mountinfo says where each hierarchy is mounted. Inside a container the mounted
root IS the container's cgroup (Docker bind-mounts it there), while /proc/self/cgroup may still
name the host's path (cgroup v1, host cgroup namespace): the named path is then absent, and the
reader falls back to the mount's root when asked for its own cgroup (`own=True`). For another
process an absent path is an error (its cgroup is not visible from here).
"""
from __future__ import annotations

import math
from pathlib import Path


def cgroup_mounts(mountinfo: str = "/proc/self/mountinfo") -> tuple[dict[str, str], str | None]:
    """(cgroup v1 controller -> mount point, the cgroup2 mount point or None)."""
    v1: dict[str, str] = {}
    v2 = None
    for line in Path(mountinfo).read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if len(fields) < 5 or len(rest) < 3:
            continue
        fstype, mount = rest[0], fields[4]
        if fstype == "cgroup2":
            v2 = v2 or mount
        elif fstype == "cgroup":
            for opt in rest[2].split(","):
                if opt in ("cpu", "cpuacct", "memory", "blkio", "pids"):
                    v1.setdefault(opt, mount)
    return v1, v2


def read_kv(path: Path) -> dict[str, int]:
    """`key value` lines of a cgroup stat file (cpu.stat, memory.stat) as integers."""
    out = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def _blkio_total(path: Path) -> int:
    total = 0
    for line in path.read_text().splitlines():
        parts = line.split()
        if parts and parts[0] == "Total":
            return int(parts[1])
        if len(parts) == 3 and parts[1] in ("Read", "Write"):
            total += int(parts[2])
    return total


class CgroupReader:
    """Reads one cgroup's counters, found through /proc/<pid>/cgroup."""

    def __init__(self, proc: str = "/proc"):
        self.proc = Path(proc)
        self.v1, self.v2 = cgroup_mounts()

    def paths(self, pid: int, own: bool = False) -> dict[str, Path]:
        """Controller -> the cgroup directory of `pid` ("unified" on a pure cgroup v2 host).
        `own`: a named directory that is absent here is the mount's root (see the module doc)."""
        out: dict[str, Path] = {}
        for line in (self.proc / str(pid) / "cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            rel = path.lstrip("/")
            if controllers == "" and self.v2 and not self.v1:
                out["unified"] = self._at(Path(self.v2), rel, own)
            for c in controllers.split(","):
                if c in self.v1:
                    out[c] = self._at(Path(self.v1[c]), rel, own)
        return out

    @staticmethod
    def _at(root: Path, rel: str, own: bool) -> Path:
        d = root / rel
        return root if own and rel and not d.is_dir() else d

    def read(self, paths: dict[str, Path]) -> dict[str, float]:
        """Cumulative counters; raises OSError when the cgroup is gone."""
        if "unified" in paths:
            d = paths["unified"]
            cpu = read_kv(d / "cpu.stat")
            mem = read_kv(d / "memory.stat")
            io_b = io_o = 0
            try:
                for line in (d / "io.stat").read_text().splitlines():
                    for kv in line.split()[1:]:
                        k, _, v = kv.partition("=")
                        if k in ("rbytes", "wbytes"):
                            io_b += int(v)
                        elif k in ("rios", "wios"):
                            io_o += int(v)
            except OSError:
                pass
            return {"cpu_s": cpu["usage_usec"] / 1e6, "rss": mem.get("anon", 0), "cache": mem.get("file", 0),
                    "pgfault": mem.get("pgfault", 0), "io_bytes": io_b, "io_ops": io_o,
                    "nr_periods": cpu.get("nr_periods", 0), "nr_throttled": cpu.get("nr_throttled", 0),
                    "throttled_s": cpu.get("throttled_usec", 0) / 1e6}
        cpu_s = self.cpu_seconds(paths)
        mem = read_kv(paths["memory"] / "memory.stat")
        io_b = io_o = 0
        if "blkio" in paths:
            try:
                io_b = _blkio_total(paths["blkio"] / "blkio.throttle.io_service_bytes")
                io_o = _blkio_total(paths["blkio"] / "blkio.throttle.io_serviced")
            except OSError:
                pass
        try:
            stat = read_kv(paths["cpu"] / "cpu.stat") if "cpu" in paths else {}
        except OSError:
            stat = {}
        return {"cpu_s": cpu_s, "rss": mem.get("total_rss", mem.get("rss", 0)),
                "cache": mem.get("total_cache", mem.get("cache", 0)),
                "pgfault": mem.get("total_pgfault", mem.get("pgfault", 0)), "io_bytes": io_b, "io_ops": io_o,
                "nr_periods": stat.get("nr_periods", 0), "nr_throttled": stat.get("nr_throttled", 0),
                "throttled_s": stat.get("throttled_time", 0) / 1e9}

    @staticmethod
    def cpu_seconds(paths: dict[str, Path]) -> float:
        """CPU time of every process in the cgroup, user and system (seconds, cumulative)."""
        if "unified" in paths:
            return read_kv(paths["unified"] / "cpu.stat")["usage_usec"] / 1e6
        return int((paths["cpuacct"] / "cpuacct.usage").read_text()) / 1e9

    @staticmethod
    def memory_in_use_bytes(paths: dict[str, Path]) -> int:
        """Memory charged to the cgroup less its inactive page cache (what `docker stats`
        shows as usage: the kernel reclaims inactive files first, so they are not "in use")."""
        if "unified" in paths:
            d = paths["unified"]
            usage, inactive = int((d / "memory.current").read_text()), read_kv(d / "memory.stat").get("inactive_file", 0)
        else:
            d = paths["memory"]
            stat = read_kv(d / "memory.stat")
            usage = int((d / "memory.usage_in_bytes").read_text())
            inactive = stat.get("total_inactive_file", stat.get("inactive_file", 0))
        return max(0, usage - inactive)

    @staticmethod
    def quota_cores(paths: dict[str, Path]) -> float:
        """The kernel's view of the CPU limit (cores; inf when unlimited). A group without the cpu
        controller (cgroup v2 enables it per subtree: rootless containers and many systemd units
        lack it) has no quota of its own: inf, not an error that stopped `samm collect --cgroup`
        at start, and dropped every testbed measurement of the group."""
        if "unified" in paths:
            cpu_max = paths["unified"] / "cpu.max"
            if not cpu_max.exists() and (paths["unified"] / "cpu.stat").exists():
                return math.inf
            quota, period = cpu_max.read_text().split()
            return math.inf if quota == "max" else int(quota) / int(period)
        if "cpu" not in paths:  # cgroup v1 without the cpu hierarchy mounted
            return math.inf
        quota = int((paths["cpu"] / "cpu.cfs_quota_us").read_text())
        period = int((paths["cpu"] / "cpu.cfs_period_us").read_text())
        return math.inf if quota < 0 else quota / period
