"""`samm collect --cgroup`: a container's own CPU, memory and CPU quota, measured from its cgroup on
a real Docker engine (from the host through the container's main process, and from inside the
container itself), where `/proc` would report the whole host."""
from __future__ import annotations

import contextlib
import math
import os
import time
from pathlib import Path

import pytest

from fixtures_docker import real_engine
from samm.monitor.cgroups import CgroupReader
from samm.monitor.collector import CgroupSampler, HostSampler, _sample_or_none

IMAGE = "local/busybox:samm"


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    yield from real_engine(tmp_path_factory, "cgcollect")


@contextlib.contextmanager
def _running(engine, cmd: list[str], name: str, **options):
    """A container of IMAGE on the private engine, removed (with its client closed) on the way out."""
    client = engine.client()
    c = client.containers.run(IMAGE, cmd, detach=True, name=name, **options)
    try:
        yield c
    finally:
        c.remove(force=True)
        client.close()


def _container_pid(c) -> int:
    c.reload()
    return int(c.attrs["State"]["Pid"])


def test_a_busy_container_reads_as_busy_against_its_own_quota_not_the_hosts_cores(engine):
    """A container spinning under a 0.5-core quota: the cgroup sampler takes 0.5 as the cores and
    reports it fully busy; the host's view of the same work is a fraction of the host."""
    with _running(engine, ["sh", "-c", "while :; do :; done"], "cg-busy", cpu_period=100_000, cpu_quota=50_000) as c:
        pid = _container_pid(c)
        sampler = CgroupSampler(pid=pid)
        assert sampler.cores == pytest.approx(0.5)
        time.sleep(2.0)
        s = sampler.sample()
        assert s.cpu_percent == pytest.approx(100.0, abs=20.0), s
        assert 0 < s.ram_used_gb < 0.5, s   # a shell: kilobytes to a few MB, never the host's RAM
        # an explicit --cores wins over the quota: the same 0.5 core is a quarter of 2 cores
        two = CgroupSampler(pid=pid, cores=2.0)
        time.sleep(2.0)
        assert two.sample().cpu_percent == pytest.approx(25.0, abs=6.0)


def test_an_unlimited_container_counts_the_cpus_it_may_use(engine):
    with _running(engine, ["sleep", "60"], "cg-free") as c:
        sampler = CgroupSampler(pid=_container_pid(c))
        assert sampler.cores == float(len(os.sched_getaffinity(_container_pid(c))))
        time.sleep(1.0)
        assert sampler.sample().cpu_percent < 5.0   # sleeping, whatever the host does


def test_a_removed_container_makes_the_collector_skip_reports_not_die(engine):
    with _running(engine, ["sleep", "60"], "cg-gone") as c:
        sampler = CgroupSampler(pid=_container_pid(c))
    s, failing = _sample_or_none(sampler, False)
    assert s is None and failing


def test_own_cgroup_named_by_the_host_path_falls_back_to_the_mounted_root(tmp_path):
    """Inside a container on cgroup v1 (host cgroup namespace) /proc/self/cgroup names the host's
    path, which is absent in the container's mount: the mount's root is the container's group.
    For another process, an absent path stays absent (its group is not visible here)."""
    proc = tmp_path / "proc"
    (proc / "7").mkdir(parents=True)
    (proc / "7" / "cgroup").write_text("4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n")
    roots = {c: tmp_path / "sys" / c for c in ("memory", "cpu")}
    for r in roots.values():
        r.mkdir(parents=True)
    reader = CgroupReader(proc=str(proc))
    reader.v1, reader.v2 = {"memory": str(roots["memory"]), "cpu": str(roots["cpu"]), "cpuacct": str(roots["cpu"])}, None
    own = reader.paths(7, own=True)
    assert own == {"memory": roots["memory"], "cpu": roots["cpu"], "cpuacct": roots["cpu"]}
    other = reader.paths(7)
    assert other["memory"] == roots["memory"] / "docker" / "abc"


def test_memory_in_use_leaves_out_inactive_page_cache(tmp_path):
    d = tmp_path / "g"
    d.mkdir()
    (d / "memory.usage_in_bytes").write_text("1000000\n")
    (d / "memory.stat").write_text("total_rss 300000\ntotal_inactive_file 400000\n")
    assert CgroupReader.memory_in_use_bytes({"memory": d}) == 600000
    u = tmp_path / "u"
    u.mkdir()
    (u / "memory.current").write_text("5000\n")
    (u / "memory.stat").write_text("anon 1000\ninactive_file 9000\n")
    assert CgroupReader.memory_in_use_bytes({"unified": u}) == 0   # never negative
    (u / "cpu.max").write_text("max 100000\n")
    assert CgroupReader.quota_cores({"unified": u}) == math.inf


def test_cgroup_sampler_refuses_bad_cores_like_the_host_sampler():
    for bad in (0, -1, math.inf, math.nan):
        with pytest.raises(ValueError, match="cores must be positive and finite"):
            CgroupSampler(cores=bad)
        with pytest.raises(ValueError, match="cores must be positive and finite"):
            HostSampler(cores=bad)



def test_samm_collect_cgroup_inside_a_container_reports_the_containers_cpu(engine, graphite, graphite_prefix):
    """The real case: `samm collect --cgroup` as a container's process (this host's Python and
    this checkout mounted read-only, host networking to reach carbon on loopback). The container
    spins under a 0.5-core quota: its collector reports it about fully busy; `/proc` would have
    said a quarter of this host's 2 CPUs at most."""
    import sys

    import docker

    from fixtures_graphite import wait_for_points
    from samm.testbed.microservices.containers import host_python

    repo = Path(__file__).resolve().parents[1]
    py = host_python()
    mounts = [docker.types.Mount(target=c, source=h, type="bind", read_only=True) for c, h in py.binds.items()]
    mounts.append(docker.types.Mount(target=str(repo), source=str(repo), type="bind", read_only=True))
    collect = (f"{sys.executable} -m samm.cli.main collect --cgroup --graphite 127.0.0.1:{graphite.carbon_port} "
               f"--prefix {graphite_prefix} --group web --instance c1 --interval 1 --duration 4")
    t0 = int(time.time())
    with _running(engine, ["sh", "-c", f"(while :; do :; done) & {collect}; echo rc=$?"], "cg-inside",
                  network_mode="host", mounts=mounts, working_dir=str(repo),
                  environment={"LD_LIBRARY_PATH": py.library_path, "PYTHONDONTWRITEBYTECODE": "1"},
                  cpu_period=100_000, cpu_quota=50_000) as c:
        status = c.wait(timeout=120)
        logs = c.logs().decode(errors="replace")
        assert status["StatusCode"] == 0 and "rc=0" in logs, logs[-3000:]
        assert "sent 4 report(s) for web/c1" in logs, logs[-3000:]
    (cpu,) = wait_for_points(graphite.render_url, f"{graphite_prefix}.groups.web.instances.c1.cpu_percent", t0 - 1,
                             int(time.time()) + 60, expect_points=3, timeout_s=30)
    values = [v for v, _ in cpu.values()]
    # the first second includes the interpreter's start-up; the spinning loop holds the quota after
    assert max(values) > 80 and sorted(values)[len(values) // 2] > 70, values
    # the container's memory (a shell and the collector), not the host's: a host sampler would send
    # total - available of this machine, far more (checked, so that this tells the two apart)
    import psutil

    (ram,) = wait_for_points(graphite.render_url, f"{graphite_prefix}.groups.web.instances.c1.ram_used_gb", t0 - 1,
                             int(time.time()) + 60, expect_points=3, timeout_s=30)
    host_used_gb = (psutil.virtual_memory().total - psutil.virtual_memory().available) / 1e9
    assert 0 < max(v for v, _ in ram.values()) < min(0.3, host_used_gb / 2), (ram.values(), host_used_gb)
