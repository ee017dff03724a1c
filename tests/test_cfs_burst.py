"""The CFS burst the Docker executor gives a container with its CPU limit (samm/execute/cfs_burst.py):
finding a process's CPU cgroup on v1 and v2 mounts, the write order the kernel needs, and on a real
engine a limit that falls and rises with the burst following it, read back from the cgroup."""
from __future__ import annotations

import pytest

from samm.execute import cfs_burst
from samm.execute.base import ScaleRequest
from samm.execute.docker_exec import DockerExecutor
from test_execute_docker import dockerd, group  # noqa: F401 - the session's real engine


def fake_proc(tmp_path, cgroup: str, mountinfo: str, pid: int = 42):
    proc = tmp_path / "proc"
    (proc / str(pid)).mkdir(parents=True)
    (proc / "self").mkdir()
    (proc / str(pid) / "cgroup").write_text(cgroup)
    (proc / "self" / "mountinfo").write_text(mountinfo)
    return proc


def test_burst_is_a_fraction_of_the_quota():
    assert cfs_burst.burst_us(20_000, 1.0) == 20_000
    assert cfs_burst.burst_us(20_000, 0.5) == 10_000
    assert cfs_burst.burst_us(20_000, 0.0) == 0
    for bad in (-0.1, 1.5, float("nan"), True, "1"):
        with pytest.raises(ValueError, match="fraction of the quota"):
            cfs_burst.burst_us(20_000, bad)


def test_the_burst_goes_first_only_when_it_exceeds_the_new_quota():
    assert cfs_burst.burst_goes_first(30_000, 20_000)        # falling limit under a large burst
    assert not cfs_burst.burst_goes_first(20_000, 20_000)
    assert not cfs_burst.burst_goes_first(10_000, 40_000)    # rising: the quota first


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_the_cpu_cgroup_of_a_container_on_v1_and_v2_mounts(tmp_path, version):
    root = tmp_path / "mnt"
    if version == "v1":
        d, name = root / "docker" / "abc", "cpu.cfs_burst_us"
        groups = "5:memory:/docker/abc\n0::/\n2:cpuacct:/docker/abc\n1:cpu:/docker/abc\n"   # unified line first
        mounts = (f"31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"
                  f"32 31 0:29 / {root} rw,relatime - cgroup cgroup rw,cpu\n"
                  f"33 31 0:30 / {tmp_path}/cpuacct rw,relatime - cgroup cgroup rw,cpuacct\n")
    else:
        d, name = root / "system.slice" / "docker-abc.scope", "cpu.max.burst"
        groups = "0::/system.slice/docker-abc.scope\n"
        mounts = f"30 23 0:27 / {root} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
    d.mkdir(parents=True)
    (d / name).write_text("0\n")
    proc = fake_proc(tmp_path, groups, mounts)
    assert cfs_burst.cpu_cgroup_dir(42, proc=proc) == d
    assert cfs_burst.cpu_cgroup_dir(42, "abc", proc=proc) == d
    with pytest.raises(OSError, match="not in container other"):   # a pid of another host's engine
        cfs_burst.cpu_cgroup_dir(42, "other", proc=proc)
    cfs_burst.write_burst(d, 12_345)
    assert (d / name).read_text() == "12345\n" and cfs_burst.read_burst(d) == 12_345


def test_no_burst_file_is_a_clear_error(tmp_path):
    root = tmp_path / "cpu"
    (root / "docker" / "abc").mkdir(parents=True)   # an old kernel: no burst file
    proc = fake_proc(tmp_path, "1:cpu:/docker/abc\n", f"32 31 0:29 / {root} rw - cgroup cgroup rw,cpu\n")
    with pytest.raises(OSError, match="no cgroup with a CFS burst file holds pid 42"):
        cfs_burst.cpu_cgroup_dir(42, proc=proc)
    with pytest.raises(OSError):
        cfs_burst.cpu_cgroup_dir(7, proc=proc)             # no such process


def test_executor_rejects_a_bad_burst():
    with pytest.raises(ValueError, match="fraction of the quota"):
        DockerExecutor([group("web")], cpu_burst=2.0)


@pytest.mark.docker
def test_burst_follows_a_falling_and_rising_limit_on_a_real_engine(dockerd):  # noqa: F811
    ex = DockerExecutor([group("web")], base_url=dockerd.base_url, namespace="burst", stop_timeout_s=1, cpu_burst=1.0)
    try:
        assert ex.apply(ScaleRequest("web", 1, "up")).status == "succeeded"
        name = "burst-web-1"
        c = ex._docker().containers.get(name)
        try:
            d = cfs_burst.cpu_cgroup_dir(c.attrs["State"]["Pid"], c.id)
        except OSError as exc:
            pytest.skip(f"this kernel or engine has no CFS burst: {exc}")
        assert cfs_burst.read_burst(d) == 0                   # a new container has none
        for cores in (0.5, 0.2, 0.8, 0.1):                    # falls below the burst held, rises above it
            res = ex.set_cpu_limit(name, cores)
            assert res.status == "succeeded" and "cpu_burst_error" not in res.detail, res
            quota = int(round(cores * 100_000))
            assert res.detail["cpu_burst_us"] == quota
            assert cfs_burst.read_burst(d) == quota
            assert ex._docker().containers.get(name).attrs["HostConfig"]["CpuQuota"] == quota
        # without the burst the executor leaves the cgroup's value alone, unless it is above a new
        # quota (the kernel would refuse that quota): then it is lowered to the quota
        plain = DockerExecutor([group("web")], base_url=dockerd.base_url, namespace="burst", stop_timeout_s=1)
        res = plain.set_cpu_limit(name, 0.3)
        assert res.status == "succeeded" and "cpu_burst_us" not in res.detail
        assert cfs_burst.read_burst(d) == 10_000
        assert ex.set_cpu_limit(name, 0.8).detail["cpu_burst_us"] == 80_000
        res = plain.set_cpu_limit(name, 0.3)
        assert res.status == "succeeded" and res.detail["cpu_burst_lowered"] and res.detail["cpu_burst_us"] == 30_000
        assert cfs_burst.read_burst(d) == 30_000
        assert ex._docker().containers.get(name).attrs["HostConfig"]["CpuQuota"] == 30_000
        plain.close()
    finally:
        for c in ex._docker().containers.list(all=True, filters={"label": "samm.namespace=burst"}):
            c.remove(force=True)
        ex.close()


def counting_lookups(monkeypatch) -> list:
    """Calls through to the real cgroup lookup, keeping each call's (pid, container id)."""
    calls, real = [], cfs_burst.cpu_cgroup_dir
    monkeypatch.setattr(cfs_burst, "cpu_cgroup_dir", lambda pid, cid=None: calls.append((pid, cid)) or real(pid, cid))
    return calls


def test_a_missing_cgroup_is_looked_up_once_and_still_raised(monkeypatch):
    """A remote engine's pid is no process here: the lookup fails, and is not repeated every second."""
    calls = counting_lookups(monkeypatch)
    ex = DockerExecutor([group("web")])
    remote = type("Container", (), {"id": "f" * 64, "attrs": {"State": {"Pid": 2 ** 22 + 1}}})()   # above pid_max
    for _ in range(3):
        with pytest.raises(OSError):
            ex._cgroup_dir(remote)
    assert len(calls) == 1


@pytest.mark.docker
def test_the_cgroup_is_found_once_per_container_process(dockerd, monkeypatch):  # noqa: F811
    ex = DockerExecutor([group("web")], base_url=dockerd.base_url, namespace="burstc", stop_timeout_s=1, cpu_burst=1.0)
    try:
        assert ex.apply(ScaleRequest("web", 1, "up")).status == "succeeded"
        name = "burstc-web-1"
        calls = counting_lookups(monkeypatch)
        res = ex.set_cpu_limit(name, 0.5)
        if "cpu_burst_error" in res.detail:
            pytest.skip(f"this kernel or engine has no CFS burst: {res.detail['cpu_burst_error']}")
        for cores in (0.2, 0.8, 0.3):                         # rising limits look it up before and after
            assert ex.set_cpu_limit(name, cores).detail["cpu_burst_us"] == int(round(cores * 100_000))
        assert len(calls) == 1
        ex._docker().containers.get(name).restart(timeout=1)  # a new process: found again, burst still set
        assert ex.set_cpu_limit(name, 0.6).detail["cpu_burst_us"] == 60_000
        c = ex._docker().containers.get(name)
        assert len(calls) == 2 and calls[-1] == (c.attrs["State"]["Pid"], c.id)
        assert cfs_burst.read_burst(cfs_burst.cpu_cgroup_dir(c.attrs["State"]["Pid"], c.id)) == 60_000
    finally:
        for c in ex._docker().containers.list(all=True, filters={"label": "samm.namespace=burstc"}):
            c.remove(force=True)
        ex.close()
