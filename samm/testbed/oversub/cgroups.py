"""One cgroup (v1) per emulated PM: a CPU quota sized to the PM's cores, and its CPU time.

    with PmCgroups(n_pms=4, quota_host_cores=0.3) as cg:   # /sys/fs/cgroup/{cpu,cpuacct}/samm-oversub-<pid>/pm<k>
        cg.add(pid, pm=2)
        cg.usage_ns()                                     # cumulative CPU ns of every PM

A PM's quota is `quota_host_cores` of a host core (cpu.cfs_quota_us / cpu.cfs_period_us): an
emulated PM of B cores is B x host_cores_per_pm_core host cores, so its VMs can never use more
than its cores, exactly as on a real machine. The parent group gets a high CPU weight
(cpu.shares, `PARENT_SHARES`) so that the PMs get their CPU when the host is busy. CPU time comes from cpuacct.usage (ns, every
process in the group, user and system).

The `cpu` and `cpuacct` controllers may be mounted apart (as on the machines this was built on)
or together (`cpu,cpuacct`): a pid is written to each distinct hierarchy.

Clean-up is not optional: the groups are removed on `close()` / context exit, at interpreter
exit (atexit), and groups left by a process that died without cleaning up (SIGKILL) are removed
by the next run (`remove_stale`). A group still holding processes (a worker that survived)
has them moved to the root group first, since the kernel refuses to remove a non-empty group.
"""
from __future__ import annotations

import atexit
import logging
import math
import os
import re
import weakref
from pathlib import Path

log = logging.getLogger(__name__)

CPU_ROOT = Path("/sys/fs/cgroup/cpu")
CPUACCT_ROOT = Path("/sys/fs/cgroup/cpuacct")
PREFIX = "samm-oversub-"
PERIOD_US = 100_000  # the kernel's default CFS period
MIN_QUOTA_US = 1000  # the kernel's smallest cpu.cfs_quota_us
MIN_PERIOD_US, MAX_PERIOD_US = 1000, 1_000_000  # the kernel's cpu.cfs_period_us range (1 ms to 1 s)
# The emulated cluster's weight against everything else on the host (a process in the root
# group weighs 1024). Its quotas cap it anyway (e.g. 1.2 host cores in all), so a high weight
# cannot starve the host; it keeps other work from stealing the PMs' CPU, which the
# measurement would read as VMs using less than their traces say. Our choice.
PARENT_SHARES = 8 * 1024
_STALE = re.compile(rf"^{PREFIX}(\d+)(?:-\d+)?$")


class CgroupError(RuntimeError):
    """The cgroup file system refused an operation (the message names the path)."""


def unavailable_reason(cpu_root: Path = CPU_ROOT, cpuacct_root: Path = CPUACCT_ROOT) -> str | None:
    """Why PM cgroups cannot be made here, or None when they can (v1 cpu and cpuacct
    hierarchies present and writable: a probe group is created and removed)."""
    for root, files in ((cpu_root, ("cpu.cfs_quota_us", "cpu.cfs_period_us", "cgroup.procs")),
                        (cpuacct_root, ("cpuacct.usage", "cgroup.procs"))):
        missing = [f for f in files if not (root / f).exists()]
        if missing:
            return f"no cgroup v1 hierarchy at {root} (missing {', '.join(missing)})"
    probe = cpu_root / f"{PREFIX}probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError as exc:
        return f"cannot create a cgroup under {cpu_root}: {exc.strerror or exc}"
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _procs(group: Path) -> list[int]:
    try:
        return [int(x) for x in (group / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def _evacuate_and_remove(group: Path, root: Path) -> None:
    """Move any process left in `group` (and its children) to `root`, then remove them."""
    if not group.is_dir():
        return
    for child in sorted((p for p in group.iterdir() if p.is_dir()), reverse=True):
        _evacuate_and_remove(child, root)
    for pid in _procs(group):
        try:
            (root / "cgroup.procs").write_text(str(pid))
        except OSError:
            pass  # it exited meanwhile
    try:
        group.rmdir()
    except OSError as exc:
        log.warning("cgroup %s could not be removed: %s", group, exc)


def remove_stale(cpu_root: Path = CPU_ROOT, cpuacct_root: Path = CPUACCT_ROOT) -> list[str]:
    """Remove `samm-oversub-<pid>` groups whose process is gone; returns their names."""
    removed = []
    for root in {cpu_root.resolve(): cpu_root, cpuacct_root.resolve(): cpuacct_root}.values():
        if not root.is_dir():
            continue
        for group in root.iterdir():
            m = _STALE.match(group.name)
            if m and group.is_dir() and not _pid_alive(int(m.group(1))):
                _evacuate_and_remove(group, root)
                removed.append(f"{root}/{group.name}")
    return removed


_live: "weakref.WeakSet[PmCgroups]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for g in list(_live):
        g.close()


class PmCgroups:
    """`n_pms` groups `pm0..pm<n-1>` under a parent unique to this process."""

    def __init__(self, n_pms: int, quota_host_cores: float, period_us: int = PERIOD_US,
                 cpu_root: Path = CPU_ROOT, cpuacct_root: Path = CPUACCT_ROOT, parent_shares: int = PARENT_SHARES):
        if n_pms < 1:
            raise ValueError(f"n_pms must be >= 1, got {n_pms}")
        if not 0 < quota_host_cores < math.inf:  # inf was an OverflowError in round() below
            raise ValueError(f"quota_host_cores must be a finite positive number, got {quota_host_cores}")
        if not MIN_PERIOD_US <= period_us <= MAX_PERIOD_US:  # the kernel refuses others with a bare EINVAL
            raise ValueError(f"period_us must be in [{MIN_PERIOD_US}, {MAX_PERIOD_US}] (the kernel's CFS "
                             f"period range), got {period_us}")
        self.n_pms = int(n_pms)
        self.quota_host_cores = float(quota_host_cores)
        self.period_us = int(period_us)
        # the kernel's minimum quota is 1 ms: a smaller one is refused, not raised to 1 ms (that
        # silently gave every PM more CPU than its share: 200 PMs in 1.2 host cores got 2)
        self.quota_us = int(round(self.quota_host_cores * self.period_us))
        if self.quota_us < MIN_QUOTA_US:
            raise ValueError(f"a PM's CPU quota of {self.quota_host_cores:.4g} host cores is below the kernel's "
                             f"minimum {MIN_QUOTA_US / self.period_us:.4g} ({MIN_QUOTA_US} us per {self.period_us} "
                             f"us period): fewer PMs or more host cores")
        self.cpu_root, self.cpuacct_root = Path(cpu_root), Path(cpuacct_root)
        self.parent_shares = int(parent_shares)
        self.name = self._unique_name()
        self.created = False

    def _unique_name(self) -> str:
        base = f"{PREFIX}{os.getpid()}"
        name, i = base, 1
        while (self.cpu_root / name).exists() or (self.cpuacct_root / name).exists():
            i += 1
            name = f"{base}-{i}"
        return name

    @property
    def roots(self) -> list[Path]:
        """The distinct hierarchies (one when cpu and cpuacct are mounted together)."""
        return list({self.cpu_root.resolve(): self.cpu_root, self.cpuacct_root.resolve(): self.cpuacct_root}.values())

    def cpu_dir(self, pm: int) -> Path:
        return self.cpu_root / self.name / f"pm{pm}"

    def acct_dir(self, pm: int) -> Path:
        return self.cpuacct_root / self.name / f"pm{pm}"

    def _write(self, path: Path, value) -> None:
        try:
            path.write_text(str(value))
        except OSError as exc:
            raise CgroupError(f"cannot write {value!r} to {path}: {exc.strerror or exc}") from None

    def create(self) -> "PmCgroups":
        remove_stale(self.cpu_root, self.cpuacct_root)
        reason = unavailable_reason(self.cpu_root, self.cpuacct_root)
        if reason:
            raise CgroupError(reason)
        _live.add(self)
        self.created = True
        try:
            for root in self.roots:
                (root / self.name).mkdir()
                for k in range(self.n_pms):
                    (root / self.name / f"pm{k}").mkdir()
            self._write(self.cpu_root / self.name / "cpu.shares", self.parent_shares)
            for k in range(self.n_pms):
                self._write(self.cpu_dir(k) / "cpu.cfs_period_us", self.period_us)
                self._write(self.cpu_dir(k) / "cpu.cfs_quota_us", self.quota_us)
        except BaseException:
            self.close()
            raise
        log.info("PM cgroups %s: %d PMs, quota %d/%d us each", self.name, self.n_pms, self.quota_us, self.period_us)
        return self

    def add(self, pid: int, pm: int) -> None:
        """Move process `pid` (all its threads) into PM `pm`'s group in every hierarchy."""
        if not 0 <= pm < self.n_pms:
            raise ValueError(f"pm must be in [0, {self.n_pms}), got {pm}")
        for d in {self.cpu_dir(pm), self.acct_dir(pm)}:
            self._write(d / "cgroup.procs", int(pid))

    def release(self, pid: int) -> None:
        """Move `pid` out of its PM into the parent group (no quota): a VM that has left its PM
        must not charge it for its exit. A pid already gone is ignored."""
        for root in self.roots:
            try:
                (root / self.name / "cgroup.procs").write_text(str(int(pid)))
            except OSError:
                pass

    def pids(self, pm: int) -> list[int]:
        return _procs(self.cpu_dir(pm))

    def usage_ns(self) -> list[int]:
        """Cumulative CPU time of every PM's processes (ns), read now."""
        out = []
        for k in range(self.n_pms):
            try:
                out.append(int((self.acct_dir(k) / "cpuacct.usage").read_text()))
            except (OSError, ValueError) as exc:
                raise CgroupError(f"cannot read {self.acct_dir(k) / 'cpuacct.usage'}: {exc}") from None
        return out

    def throttled(self) -> list[int]:
        """Periods in which each PM hit its quota (cpu.stat nr_throttled)."""
        out = []
        for k in range(self.n_pms):
            stat = dict(line.split() for line in (self.cpu_dir(k) / "cpu.stat").read_text().splitlines()
                        if len(line.split()) == 2)
            out.append(int(stat.get("nr_throttled", 0)))
        return out

    def exists(self) -> bool:
        return any((root / self.name).exists() for root in self.roots)

    def close(self) -> None:
        """Remove every group (idempotent); processes still inside go to the root group."""
        if not self.created:
            return
        for root in self.roots:
            _evacuate_and_remove(root / self.name, root)
        self.created = False
        _live.discard(self)

    def __enter__(self) -> "PmCgroups":
        return self.create()

    def __exit__(self, *exc) -> None:
        self.close()
