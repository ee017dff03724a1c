"""CFS burst of a container: quota a cgroup left unused in earlier periods, spent in a later one.

A CPU limit of L cores is the kernel's quota L·P per period P; a service whose calls come in bursts
is throttled in the periods where a burst exceeds the quota even when its mean use is a fraction
of L, and each throttled call waits for the next period (the real containers' latency tail at
small limits, docs/microservice-testbed.md). Linux 5.14 added a burst to CFS bandwidth control for
this: a cgroup may bank up to B µs of quota it did not use and spend it on top of its quota. The
limit (the mean over time) stays L; only the timing within it changes.

The Docker engine (20.10) does not expose it, so it is written to the container's cgroup on the
engine's host: `cpu.cfs_burst_us` on cgroup v1, `cpu.max.burst` on v2. That needs the engine to be
local and this process to be root; where it is not, the write fails and the caller records why.

The kernel refuses a quota below the burst (and a burst above the quota), so a limit that falls
must lower the burst first (`burst_goes_first`).
"""
from __future__ import annotations

import os
from pathlib import Path

from samm.execute.base import finite_float

V1_FILE = "cpu.cfs_burst_us"
V2_FILE = "cpu.max.burst"


def burst_us(quota_us: int, fraction: float) -> int:
    """The burst for a quota: `fraction` of it, in [0, 1] (the kernel's bound is the quota)."""
    number = finite_float(fraction)
    if number is None or not 0.0 <= number <= 1.0:
        raise ValueError(f"cpu burst must be a fraction of the quota in [0, 1], not {fraction!r}")
    return int(quota_us * number)


def chosen_burst(asked: float | None, default: float | None) -> float | None:
    """The burst a run or a loop gives its containers: the one asked for, else the application's
    default (a topology's `cfs_burst`), else None (the burst is left alone); 0 asked is 0."""
    return asked if asked is not None else (default or None)


def burst_goes_first(current_burst_us: int, new_quota_us: int) -> bool:
    """Whether the burst must be written before the quota: when the burst held now exceeds the new
    quota, the kernel refuses that quota until the burst is lowered. Otherwise after the quota (a
    new burst above the quota held now would be refused)."""
    return current_burst_us > new_quota_us


def _mounts(mountinfo: str) -> list[tuple[str, str, set[str]]]:
    """(mount point, fs type, super options) of every cgroup mount in /proc/self/mountinfo's text."""
    out = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, rest = left.split(), right.split()
        if len(fields) < 5 or len(rest) < 3 or rest[0] not in ("cgroup", "cgroup2"):
            continue
        out.append((fields[4], rest[0], set(rest[2].split(","))))
    return out


def cpu_cgroup_dir(pid: int, container_id: str | None = None, proc: str | os.PathLike = "/proc") -> Path:
    """The directory of the cgroup that holds `pid`'s CPU controller, on the host's cgroup mount.
    With `container_id`, only a cgroup whose path names that container: the engine reports its
    container's pid in the engine host's namespace, which on another host (or in another pid
    namespace) is some other process. Raises OSError when there is none."""
    proc = Path(proc)
    groups = (proc / str(pid) / "cgroup").read_text()
    mounts = _mounts((proc / "self" / "mountinfo").read_text())
    foreign = False
    for line in groups.splitlines():
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hid == "0" and controllers == "":
            roots = [m for m, t, _ in mounts if t == "cgroup2"]
        elif "cpu" in controllers.split(","):
            roots = [m for m, t, opts in mounts if t == "cgroup" and "cpu" in opts]
        else:
            continue
        if container_id and container_id not in path:
            foreign = True      # e.g. a hybrid host's unified line "0::/" beside the v1 cpu line
            continue
        for root in roots:
            d = Path(root) / path.lstrip("/")
            if (d / V1_FILE).exists() or (d / V2_FILE).exists():
                return d
    if foreign:
        raise OSError(f"pid {pid} is not in container {container_id[:12]}'s cgroup (an engine on another host?)")
    raise OSError(f"no cgroup with a CFS burst file holds pid {pid} (kernel < 5.14, or not this host's engine)")


def _file(d: Path) -> Path:
    return d / V1_FILE if (d / V1_FILE).exists() else d / V2_FILE


def read_burst(d: Path) -> int:
    """The burst the cgroup holds, µs."""
    return int(_file(d).read_text().split()[0])


def write_burst(d: Path, us: int) -> None:
    _file(d).write_text(f"{int(us)}\n")
