"""The application's containers on a local Docker engine, without an image registry.

Each service runs in its own container of the registry-free busybox image
(`local_dockerd.ensure_busybox_image`), started as

    <host python> -I -u <repo>/samm/testbed/microservices/app.py --service S --topology /conf/topology.json ...

with read-only binds of the host interpreter's prefix (binary, libpython, stdlib), of the
directories holding the shared libraries it and its stdlib extension modules load (found with
`ldd`, so it works for a Debian /usr/bin/python3 as well as a pyenv build), and of the repository;
`/conf` (the topology) is read-only, `/state` (the per-service counters) writable. Host networking:
service i listens on 127.0.0.1:(base_port + i), a block held (`PortBlock`) from construction to
`close()`, so that two testbeds on one host never pick the same ports. Labels `samm.namespace=<ns>` and
`samm.group=<service>` and the name `<ns>-<service>-1` follow `DockerExecutor`'s conventions, so
its inventory sees one instance per service, and every CPU limit is set through
`DockerExecutor.set_cpu_limit` (CFS period 100 ms, quota = cores × period).

`PrivateDockerd` is `LocalDockerd` plus `restart()` on the same data root (the engine-restart
fault); without live-restore the engine stops the containers when it goes down, and the run's
supervisor (`AppContainers.ensure_running`) starts them again once it is back.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import docker

from samm.config import GroupConfig
from samm.execute import cfs_burst
from samm.execute.base import ActionResult
from samm.execute.docker_exec import (CPU_PERIOD_US, LABEL_GROUP, LABEL_NAMESPACE, DockerExecutor, cpu_quota_for,
                                      limit_cores)
from samm.execute.local_dockerd import BUSYBOX_TAG, LocalDockerd

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[3]
APP = Path(__file__).resolve().with_name("app.py")
LABEL_TESTBED = "samm.testbed"
LABEL_BASE_PORT = "samm.base_port"   # whose port block the containers belong to (a live owner holds it)
MEM_LIMIT = "256m"


# ----------------------------------------------------------------------------- the host's Python
@dataclass(frozen=True)
class HostPython:
    executable: str                      # the real interpreter (not the venv's symlink)
    binds: dict = field(default_factory=dict)   # container path -> host path (all read-only)
    library_path: str = ""               # LD_LIBRARY_PATH inside the container


def _ldd(paths: list[str]) -> set[str]:
    """Shared objects `paths` load, as ldd prints them (with the loader)."""
    out: set[str] = set()
    for i in range(0, len(paths), 50):
        try:
            text = subprocess.run(["ldd", *paths[i:i + 50]], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        for line in text.splitlines():
            line = line.strip()
            if line.endswith(":"):  # the "file:" header ldd prints when given several files
                continue
            part = line.split("=>", 1)[1] if "=>" in line else line
            cand = part.split("(", 1)[0].strip()
            if cand.startswith("/"):
                out.add(cand)
    return out


def host_python() -> HostPython:
    """What a container needs to run this machine's Python read-only."""
    exe = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    dynload = Path(sysconfig.get_paths()["platstdlib"].replace(sys.prefix, sys.base_prefix)) / "lib-dynload"
    objects = [exe] + [str(p) for p in sorted(dynload.glob("*.so"))]
    libs = _ldd(objects)
    dirs: dict[str, str] = {}   # container path -> host path

    def add(container_dir: str) -> None:
        host = os.path.realpath(container_dir)
        for d in (container_dir, host):   # the path the loader asks for, and where it really is
            if any(d == k or d.startswith(k.rstrip("/") + "/") for k in dirs):
                continue
            dirs[d] = host
    add(prefix)
    if not exe.startswith(prefix.rstrip("/") + "/"):
        add(os.path.dirname(exe))
    for lib in sorted(libs):
        add(os.path.dirname(lib))
    libdirs = sorted({os.path.dirname(x) for x in libs} | {os.path.realpath(os.path.dirname(x)) for x in libs})
    return HostPython(exe, dict(sorted(dirs.items())), ":".join(libdirs))


# ----------------------------------------------------------------------------- the engine
class PrivateDockerd(LocalDockerd):
    """A LocalDockerd that can be restarted on the same data root (images and containers kept)."""

    _reuse_root = False

    def _make_root(self) -> Path:
        if self._reuse_root and self.root is not None:
            return self.root
        return super()._make_root()

    def restart(self, down_s: float = 0.0) -> float:
        """SIGTERM the engine (it stops the containers), wait `down_s`, start it again. Returns
        the seconds the engine was unreachable."""
        if self.proc is None or self.root is None:
            raise RuntimeError("PrivateDockerd is not started")
        t0 = time.monotonic()
        self._terminate()
        if self.log_path.exists():
            os.replace(self.log_path, self.root / f"dockerd.{int(time.time())}.log")
        time.sleep(down_s)
        self._reuse_root = True
        try:
            self.start()
        finally:
            self._reuse_root = False
        return time.monotonic() - t0


PORT_LOCK_DIR = Path(tempfile.gettempdir()) / "samm-ports"


class PortBlock:
    """Ports base .. base+n-1 on 127.0.0.1 held for one application: an exclusive `flock` per
    port under PORT_LOCK_DIR, so that another SAMM process searching for ports skips them from the
    moment they are chosen (not only once the services listen) until `release()` or its exit (the
    kernel drops a dead process's locks, so no reservation outlives its owner)."""

    def __init__(self, base: int, n: int, fds: list[int]):
        self.base, self.n, self._fds = base, n, fds

    def release(self) -> None:
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)

    @staticmethod
    def held(base: int, n: int) -> bool:
        """Whether a live process holds any port of base .. base+n-1 (its lock, not its socket:
        the services of a run whose process died still listen)."""
        for port in range(base, base + n):
            try:
                fd = os.open(PORT_LOCK_DIR / f"{port}.lock", os.O_RDONLY)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            finally:
                os.close(fd)
        return False

    @staticmethod
    def range_problem(base: int, n: int) -> str | None:
        """Why base .. base+n-1 are not all port numbers, or None (a block past 65535 made
        `bind` raise OverflowError, after the engine had started)."""
        if base < 1 or base + n - 1 > 65535:
            return f"ports {base}..{base + n - 1} for {n} services are not all in 1..65535 (choose a lower base port)"
        return None

    @classmethod
    def try_hold(cls, base: int, n: int) -> "PortBlock | None":
        """The block, if no other holder has any of its ports and each is free; else None.
        ValueError when the block is not all port numbers."""
        problem = cls.range_problem(base, n)
        if problem:
            raise ValueError(problem)
        fds: list[int] = []
        block = cls(base, n, fds)
        try:
            PORT_LOCK_DIR.mkdir(mode=0o777, parents=True, exist_ok=True)
            for port in range(base, base + n):
                fds.append(os.open(PORT_LOCK_DIR / f"{port}.lock", os.O_RDWR | os.O_CREAT, 0o666))
                try:
                    fcntl.flock(fds[-1], fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    block.release()
                    return None
                if not _port_free(port):
                    block.release()
                    return None
        except OSError as exc:
            block.release()
            raise RuntimeError(f"cannot hold ports {base}..{base + n - 1} through their lock files in "
                               f"{PORT_LOCK_DIR}: {exc}") from exc
        return block


def reserve_ports(n: int, start: int = 18100, tries: int = 200) -> PortBlock:
    """The first block from `start` (stepping by 10) that `PortBlock.try_hold` gets."""
    p = start
    for _ in range(tries):
        block = PortBlock.try_hold(p, n)
        if block is not None:
            return block
        p += 10
    raise RuntimeError(f"no {n} consecutive free ports from {start}")


def find_base_port(n: int, start: int = 18100, tries: int = 200) -> int:
    """The first p >= start (stepping by 10) with p .. p+n-1 free and held by no SAMM process
    (not held on return: `AppContainers` holds it)."""
    block = reserve_ports(n, start, tries)
    block.release()
    return block.base


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


# ----------------------------------------------------------------------------- the application
class AppContainers:
    """One container per service of `topology` on the engine at `base_url`."""

    def __init__(self, topology, base_url: str, run_dir: str | os.PathLike, *, namespace: str = "ms",
                 base_port: int | None = None, image: str = BUSYBOX_TAG, python: HostPython | None = None,
                 timeout_s: int = 5, cpu_burst: float | None = None):
        self.topology = topology
        self.services: tuple[str, ...] = topology.service_names
        self.base_url = base_url
        self.run_dir = Path(run_dir).resolve()
        self.namespace = namespace
        n = len(self.services)
        if base_port is None:
            self.ports_held = reserve_ports(n)
        else:
            self.ports_held = PortBlock.try_hold(base_port, n)
            if self.ports_held is None:
                raise RuntimeError(f"ports {base_port}..{base_port + n - 1} on 127.0.0.1 are taken or held by "
                                   f"another SAMM testbed (choose another base port)")
        self.base_port = self.ports_held.base
        self.ports = {s: self.base_port + i for i, s in enumerate(self.services)}
        self.image = image
        self.names = {s: f"{namespace}-{s}-1" for s in self.services}
        try:
            self.python = python or host_python()
            self.client = docker.DockerClient(base_url=base_url, timeout=timeout_s)
            groups = [GroupConfig(name=s, cores=1, ram_gb=0.25, price_per_hour=0.0, min=0, max=1,
                                  docker_image=image) for s in self.services]
            self.executor = DockerExecutor(groups, base_url=base_url, namespace=namespace, stop_timeout_s=2,
                                           timeout_s=timeout_s, cpu_burst=cpu_burst)
        except BaseException:
            self.ports_held.release()
            raise
        self.seed: int | None = None
        self.last_limit: dict[str, float] = {}   # the last limit set per service (kept for a re-creation)
        self.errors: list[str] = []              # the last ensure_running's failures
        self.conf_dir = self.run_dir / "conf"
        self.state_dir = self.run_dir / "state"

    # -- life cycle --------------------------------------------------------------------------
    def start(self, cores: dict[str, float] | None = None, seed: int | None = None, ready_timeout_s: float = 30.0) -> None:
        """Start every service (initial limits `cores`, default the caps) and wait until each
        answers /health. Refuses to start when a port is taken."""
        cores = cores or {s: self.topology.services[s].cap for s in self.services}
        busy = [p for p in self.ports.values() if not _port_free(p)]
        if busy:
            raise RuntimeError(f"ports {busy} on 127.0.0.1 are taken (choose another base port)")
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.state_dir, 0o777)
        owner = self._live_owner()
        if owner is not None:
            raise RuntimeError(f"namespace {self.namespace!r} is in use by a live testbed on ports {owner}.."
                               f"{owner + len(self.services) - 1} (choose another run name / namespace)")
        (self.conf_dir / "topology.json").write_text(json.dumps(self.topology.model_dump(mode="json"), indent=1))
        self.remove()  # leftovers of an earlier run with the same namespace
        self.seed = seed
        for s in self.services:
            self._run(s, float(cores[s]))
        self.wait_ready(ready_timeout_s)
        if self.executor.cpu_burst is not None:    # a new container's cgroup starts without one
            for s in self.services:
                res = self.set_limit(s, float(cores[s]))
                if res.status != "succeeded" or "cpu_burst_error" in res.detail:
                    raise RuntimeError(f"service {s}: the CPU burst was not set: {res.error or res.detail.get('cpu_burst_error')}")

    def _live_owner(self) -> int | None:
        """The base port of another live testbed whose running containers carry this namespace
        (removing them as leftovers would pull its services from under its run), else None."""
        for c in self.client.containers.list(filters={"label": f"{LABEL_NAMESPACE}={self.namespace}"}):
            base = str(c.labels.get(LABEL_BASE_PORT, ""))
            if base.isdigit() and int(base) != self.base_port and PortBlock.held(int(base), len(self.services)):
                return int(base)
        return None

    def _run(self, s: str, cores: float) -> None:
        i = self.services.index(s)
        # a host directory may appear twice (the path the loader asks for and its real path);
        # mounts, not "host:container:mode" binds: a ':' in the run's path (a time in --out) split those
        binds = [(h, c, True) for c, h in self.python.binds.items()]
        binds += [(str(REPO_ROOT), str(REPO_ROOT), True), (str(self.conf_dir), "/conf", True),
                  (str(self.state_dir), "/state", False)]
        mounts = [docker.types.Mount(target=c, source=h, type="bind", read_only=ro) for h, c, ro in binds]
        cmd = [self.python.executable, "-I", "-u", str(APP), "--service", s, "--topology", "/conf/topology.json",
               "--base-port", str(self.base_port), "--state-dir", "/state"]
        if self.seed is not None:
            cmd += ["--seed", str(self.seed * 1000 + i)]
        self.client.containers.run(
            self.image, cmd, name=self.names[s], detach=True, init=True, network_mode="host",
            labels={LABEL_NAMESPACE: self.namespace, LABEL_GROUP: s, LABEL_TESTBED: "microservices",
                    "samm.app": self.topology.name, LABEL_BASE_PORT: str(self.base_port)},
            mounts=mounts, environment={"LD_LIBRARY_PATH": self.python.library_path, "PYTHONHASHSEED": "0"},
            cpu_period=CPU_PERIOD_US, cpu_quota=cpu_quota_for(self.executor.within_host(cores)),
            mem_limit=MEM_LIMIT)
        self.last_limit[s] = cores

    def wait_ready(self, timeout_s: float = 30.0, services=None) -> None:
        deadline = time.monotonic() + timeout_s
        pending = list(services or self.services)
        while pending:
            s = pending[0]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.ports[s]}/health", timeout=2) as r:
                    if r.status == 200:
                        pending.pop(0)
                        continue
            except OSError:
                pass
            if time.monotonic() > deadline:
                c = self.client.containers.get(self.names[s])
                raise RuntimeError(f"service {s} not ready within {timeout_s:g} s (container {c.status}): "
                                   f"{c.logs(tail=10).decode(errors='replace')}")
            time.sleep(0.1)

    def remove(self) -> None:
        for c in self.client.containers.list(all=True, filters={"label": f"{LABEL_NAMESPACE}={self.namespace}"}):
            try:
                c.remove(force=True)
            except docker.errors.APIError:
                pass

    def close(self) -> None:
        try:
            self.remove()
        except Exception as exc:  # noqa: BLE001 - teardown of an engine that may be gone
            log.warning("removing the app's containers failed: %s", exc)
        self.client.close()
        self.executor.close()
        self.ports_held.release()

    # -- control -----------------------------------------------------------------------------
    def set_limit(self, service: str, cores: float) -> ActionResult:
        res = self.executor.set_cpu_limit(self.names[service], float(cores))
        if res.status == "succeeded":
            self.last_limit[service] = float(cores)
        return res

    def read_limit(self, service: str) -> float:
        """The limit the engine holds for `service` (cores; the engine's CPUs when unlimited)."""
        from .measure import unlimited_cores

        cores = limit_cores(self.client.api.inspect_container(self.names[service])["HostConfig"])
        return cores if cores is not None else unlimited_cores(self.executor)

    def read_burst(self, service: str) -> int:
        """The CFS burst (µs) the kernel holds for `service`'s container (needs a local engine)."""
        info = self.client.api.inspect_container(self.names[service])
        return cfs_burst.read_burst(cfs_burst.cpu_cgroup_dir(info["State"]["Pid"], info["Id"]))

    def kill(self, service: str) -> None:
        """The kill fault: SIGKILL the service's container (it exits; nothing restarts it but us)."""
        self.client.api.kill(self.names[service])

    def ensure_running(self) -> list[str]:
        """Start every service container that is not running; one the engine refuses to start
        (e.g. "task already exists" after an engine restart cut a start short) is removed and
        created again with its last limit, as is one that no longer exists (removed). Returns the services started; the failures of this
        call are in `self.errors` (the engine may be down: then every service fails)."""
        started, self.errors = [], []
        for s in self.services:
            try:
                try:
                    info = self.client.api.inspect_container(self.names[s])
                except docker.errors.NotFound:   # removed (docker rm -f, a lost engine state): made again
                    log.warning("service %s has no container: creating it again", s)
                    self._run(s, self.last_limit.get(s, float(self.topology.services[s].cap)))
                    started.append(s)
                    continue
                if info["State"].get("Running"):
                    continue
                status = info["State"].get("Status")
                try:
                    self.client.api.start(self.names[s])
                except docker.errors.APIError as exc:
                    log.warning("service %s (%s) would not start (%s): creating it again", s, status, exc)
                    self.client.api.remove_container(self.names[s], force=True)
                    self._run(s, self.last_limit.get(s, float(self.topology.services[s].cap)))
                started.append(s)
                log.warning("service %s was %s: started it again", s, status)
            except Exception as exc:  # noqa: BLE001 - engine down or refusing: try again next step
                self.errors.append(f"{s}: {type(exc).__name__}: {str(exc)[:200]}")
        return started
