"""A private Docker engine for tests and demos, plus a registry-free busybox image.

`LocalDockerd` runs a real `dockerd` (root only) with everything under one temporary directory:
its API socket, data root, exec root and the containerd it manages. It never touches the host's
engine, `/var/lib/docker` or iptables, and creates no bridge (`--bridge=none`), so several can
run side by side. On exit it removes its containers, stops the engine, kills any leftover
containerd/shim/container process and unmounts what the engine left mounted.

`ensure_busybox_image` builds a tiny image with `docker import` from the host's static busybox,
because these machines have no registry access.
"""
from __future__ import annotations

import io
import json
import os
import shutil
import signal
import struct
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import docker
import psutil

BUSYBOX_TAG = "local/busybox:samm"
# AF_UNIX paths are limited to 108 bytes (containerd's socket lives under the exec root too, and
# containerd derives longer ones from it: a containerd.sock path of 99 bytes under pytest-xdist's
# popen-gw1 folder failed to start containerd at all)
_MAX_SOCKET_PATH = 88


class DockerdUnavailable(RuntimeError):
    """dockerd cannot run on this machine (not root, not installed, or it exits at start-up)."""


class LocalDockerd:
    """Context manager: `with LocalDockerd() as d: docker.DockerClient(base_url=d.base_url)`."""

    def __init__(
        self,
        workdir: str | os.PathLike | None = None,
        *,
        start_timeout_s: float = 20.0,
        stop_timeout_s: float = 15.0,
        storage_driver: str = "overlay2",
        dockerd: str = "dockerd",
    ) -> None:
        self._workdir = Path(workdir) if workdir is not None else None
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.storage_driver = storage_driver
        self.dockerd = dockerd
        self.root: Path | None = None
        self.proc: subprocess.Popen | None = None

    @property
    def socket_path(self) -> Path:
        if self.root is None:
            raise RuntimeError("LocalDockerd is not started")
        return self.root / "docker.sock"

    @property
    def base_url(self) -> str:
        return f"unix://{self.socket_path}"

    @property
    def log_path(self) -> Path:
        if self.root is None:
            raise RuntimeError("LocalDockerd is not started")
        return self.root / "dockerd.log"

    def client(self, timeout: int = 30) -> docker.DockerClient:
        return docker.DockerClient(base_url=self.base_url, timeout=timeout)

    def __enter__(self) -> "LocalDockerd":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        if os.geteuid() != 0:
            raise DockerdUnavailable("dockerd needs root (this process runs as uid %d)" % os.geteuid())
        binary = shutil.which(self.dockerd)
        if binary is None:
            raise DockerdUnavailable(f"{self.dockerd!r} is not installed (apt-get install docker.io)")
        self.root = self._make_root()
        config = self.root / "daemon.json"
        config.write_text("{}")  # keeps a host /etc/docker/daemon.json out of our engine
        cmd = [
            binary,
            f"--host=unix://{self.socket_path}",
            f"--data-root={self.root / 'data'}",
            f"--exec-root={self.root / 'exec'}",
            f"--pidfile={self.root / 'docker.pid'}",
            f"--config-file={config}",
            f"--storage-driver={self.storage_driver}",
            "--iptables=false",
            "--ip-masq=false",
            "--bridge=none",
            # Containers run with init=True, so they honour SIGTERM quickly; a short engine
            # shutdown timeout keeps teardown fast when one does not.
            "--shutdown-timeout=3",
        ]
        log = open(self.log_path, "wb")
        try:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        finally:
            log.close()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _make_root(self) -> Path:
        parent = self._workdir
        if parent is not None:
            parent.mkdir(parents=True, exist_ok=True)
            root = Path(tempfile.mkdtemp(prefix="dockerd-", dir=parent))
            if len(str(root / "exec" / "containerd" / "containerd.sock")) <= _MAX_SOCKET_PATH:
                return root
            shutil.rmtree(root, ignore_errors=True)
        return Path(tempfile.mkdtemp(prefix="samm-dockerd-"))

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        last_error: Exception | None = None
        client = docker.APIClient(base_url=self.base_url, version="1.41", timeout=2)
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise DockerdUnavailable(
                        f"dockerd exited with status {self.proc.returncode} at start-up: {self._log_tail()}")
                if self.socket_path.exists():
                    try:
                        if client.ping():
                            return
                    except Exception as exc:  # not listening yet
                        last_error = exc
                time.sleep(0.05)
        finally:
            client.close()
        raise TimeoutError(f"dockerd did not answer /_ping within {self.start_timeout_s:g} s "
                           f"(last error: {last_error}); log: {self._log_tail()}")

    def _log_tail(self, lines: int = 8) -> str:
        try:
            return " | ".join(self.log_path.read_text(errors="replace").strip().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _terminate(self) -> None:
        """SIGTERM the engine (it stops its containers), SIGKILL it after the stop timeout."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.root is None:
            return
        if self.proc is not None and self.proc.poll() is None:
            self._remove_containers()
            self._terminate()
        self._kill_leftovers()
        self._unmount_leftovers()
        shutil.rmtree(self.root, ignore_errors=True)
        self.root = None
        self.proc = None

    def _remove_containers(self) -> None:
        """Removing containers through the API lets the engine unmount their layers itself."""
        try:
            client = docker.APIClient(base_url=self.base_url, version="1.41", timeout=10)
            try:
                for c in client.containers(all=True):
                    try:
                        client.remove_container(c["Id"], force=True)
                    except docker.errors.APIError:
                        pass
            finally:
                client.close()
        except Exception:  # the engine is already unhealthy: the process sweep below handles it
            pass

    def _kill_leftovers(self) -> None:
        """containerd and its shims carry our root in their command line; the container
        processes are their descendants."""
        root = str(self.root)
        victims: list[psutil.Process] = []
        for p in psutil.process_iter(["cmdline"]):
            try:
                if any(root in part for part in (p.info["cmdline"] or [])):
                    victims.append(p)
                    victims.extend(p.children(recursive=True))
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        for p in victims:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(victims, timeout=5)

    def _unmount_leftovers(self) -> None:
        root = str(self.root)
        try:
            mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
        except OSError:
            return
        for target in sorted((m for m in mounts if m.startswith(root + "/")), key=len, reverse=True):
            subprocess.run(["umount", "-l", target], capture_output=True, check=False)


def _is_static_elf(path: Path) -> bool:
    """True for an ELF binary without a PT_INTERP program header (no dynamic loader needed)."""
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2:  # 64-bit only, which is all we run on
            return False
        endian = "<" if head[5] == 1 else ">"
        phoff, = struct.unpack_from(endian + "Q", head, 0x20)
        phentsize, phnum = struct.unpack_from(endian + "HH", head, 0x36)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    return all(struct.unpack_from(endian + "I", table, i * phentsize)[0] != 3 for i in range(phnum))


def find_static_busybox() -> Path:
    for candidate in ("/bin/busybox", "/usr/bin/busybox", shutil.which("busybox")):
        if candidate and Path(candidate).is_file() and _is_static_elf(Path(candidate)):
            return Path(candidate)
    raise FileNotFoundError("no statically linked busybox found (apt-get install busybox-static)")


def busybox_rootfs_tar(busybox: Path | None = None) -> bytes:
    """A root filesystem as a tar: /bin/busybox plus one symlink per applet, and empty
    mount points the runtime expects."""
    busybox = busybox or find_static_busybox()
    listing = subprocess.run([str(busybox), "--list"], capture_output=True, text=True, check=True).stdout
    applets = sorted({a.strip() for a in listing.split() if a.strip() and a.strip() != "busybox"})
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d, mode in (("bin", 0o755), ("dev", 0o755), ("etc", 0o755), ("proc", 0o555),
                        ("sys", 0o555), ("tmp", 0o1777), ("root", 0o700)):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)
        data = busybox.read_bytes()
        info = tarfile.TarInfo("bin/busybox")
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
        for applet in applets:
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type, info.linkname, info.mode = tarfile.SYMTYPE, "busybox", 0o777
            tar.addfile(info)
        passwd = b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"
        info = tarfile.TarInfo("etc/passwd")
        info.size, info.mode = len(passwd), 0o644
        tar.addfile(info, io.BytesIO(passwd))
    return buf.getvalue()


def ensure_busybox_image(client: docker.DockerClient, tag: str = BUSYBOX_TAG) -> str:
    """Returns the id of `tag`, importing a busybox rootfs under that tag first if missing."""
    try:
        return client.images.get(tag).id
    except docker.errors.ImageNotFound:
        pass
    repository, _, version = tag.rpartition(":")
    if not repository or "/" in version:
        repository, version = tag, "latest"
    out = client.api.import_image_from_data(busybox_rootfs_tar(), repository=repository, tag=version,
                                            changes=['ENV PATH=/bin', 'CMD ["/bin/sh"]'])
    status = json.loads(out.strip().splitlines()[-1]) if isinstance(out, str) and out.strip() else {}
    if "error" in status:
        raise RuntimeError(f"docker import of {tag} failed: {status['error']}")
    return client.images.get(tag).id
