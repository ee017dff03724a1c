"""Docker executor: a group's instances are containers on one Docker engine.

Each container carries the labels `samm.namespace=<namespace>` and `samm.group=<group>` (plus the
group's optional `docker_label`, `key=value` or `key`), runs the group's image with a CPU limit of
`cores` (CFS period/quota: the engine refuses to mix NanoCpus with period/quota, and only
period/quota can be changed live; more cores than the engine's CPUs are clamped to them, said in
the result's `clamped`, since such a quota limits nothing; fewer than 0.01, the kernel's smallest
quota, are raised to it) and a memory limit of `ram_gb`, and is named `<namespace>-<group>-<n>`
(`samm-web-3` with the default namespace). Scaling is synchronous: `apply` returns once the
containers are started or removed, so there is no separate "desired" state to keep: desired
capacity is the live count. Exited containers, and ones created but never started, are reaped
and replaced; one that ended by itself right after its start is kept (its logs say why) and no
other is launched for `crash_backoff_s`. A request refused before any call that changes capacity
(unknown group, target out of bounds, no image, that crash back-off, an engine that cannot be
reached or listed) fails with `may_have_acted` false (`base.refused`): no cool-down is due for
it. As on AWS, a request whose group an operator moved past or away from its target since the
decision (`ScaleRequest.basis`) is skipped.

`set_cpu_limit` changes a running container's CPU quota in place (for agents that allocate cores
per container; held to [0.01, the engine's CPUs] as above, said in `clamped`), with `cpu_burst`
also its CFS burst (`cfs_burst`: a share of the quota the container may bank while idle, written
to its cgroup on a local engine), and `container_stats` reads CPU, memory working set and
throttling from the engine's stats endpoint.
"""
from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

import docker
import requests

from samm.config import GroupConfig
from samm.execute import cfs_burst
from samm.execute.base import (ActionResult, Executor, ExecutorError, GroupStatus, Instance, InstanceState, ScaleRequest,
                               finite_float, moved_past, refused)

log = logging.getLogger(__name__)

CPU_PERIOD_US = 100_000
MIN_CPU_QUOTA_US = 1_000  # the kernel refuses CFS quotas under 1 ms
_CGROUP_CACHE_SIZE = 4096  # containers whose cgroup dir is remembered
DEFAULT_COMMAND: tuple[str, ...] = ("sleep", "infinity")
LABEL_GROUP = "samm.group"
LABEL_NAMESPACE = "samm.namespace"
LABEL_REQUEST = "samm.request"
# A container that ends by itself this soon after its start is crashing (a bad command, image or
# config): it is kept (its logs tell why) and no other is launched in its place for a while.
CRASH_WINDOW_S = 10.0
CRASH_BACKOFF_S = 60.0
_STOPPED_FROM_OUTSIDE = (137, 143)   # 128 + SIGKILL / SIGTERM: `docker kill`/`stop`, not a crash
# (samm.config.DOCKER_LABELS_OF_SAMM: a group's docker_label may not replace them)

_STATE: dict[str, InstanceState] = {
    "running": "running",
    "paused": "running",  # still holds its resources
    # never started: left by an apply cut off between create and start (an engine restart), so
    # it is reaped and replaced like an exited one rather than counted as capacity forever
    "created": "terminating",
    "restarting": "pending",
    "removing": "terminating",
    "exited": "terminating",
    "dead": "terminating",
}
_DOCKER_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException, OSError)
# Engine calls that change nothing: a request that failed in one of them applied nothing, so it is
# refused (no cool-down), not failed-after-acting; reaping exited containers changes no capacity.
_READ_ONLY_CALLS = frozenset({"connect", "info", "containers.list", "containers.get", "container.stats"})
T = TypeVar("T")


class _CallFailed(Exception):
    def __init__(self, call: str, exc: BaseException) -> None:
        # one line: the engine's errors may carry runc's multi-line output
        super().__init__(" ".join(f"docker {call} failed: {type(exc).__name__}: {exc}".split()))
        self.call = call


def _call(name: str, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Runs one engine call, turning any engine or connection error into one that names it."""
    try:
        return fn(*args, **kwargs)
    except _DOCKER_ERRORS as exc:
        raise _CallFailed(name, exc) from exc


def parse_docker_time(value: str | None) -> float | None:
    """Docker's RFC 3339 timestamps with nanoseconds -> epoch seconds; None for the zero time."""
    if not value or value.startswith("0001-01-01"):
        return None
    m = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)?$", value)
    if not m:
        return None
    base, frac, tz = m.groups()
    tz = "+00:00" if tz in (None, "Z") else tz
    stamp = datetime.fromisoformat(f"{base}{tz}").astimezone(timezone.utc).timestamp()
    return stamp + (float(f"0.{frac}") if frac else 0.0)


def _parse_label(spec: str | None) -> dict[str, str]:
    if not spec:
        return {}
    key, _, value = spec.partition("=")
    return {key.strip(): value.strip()} if key.strip() else {}


def cpu_quota_for(cores: float) -> int:
    """CFS quota (µs per 100 ms period) giving `cores` CPUs."""
    number = finite_float(cores)
    if number is None or number <= 0:
        raise ValueError(f"cores must be a positive finite number, got {cores!r}")
    quota = number * CPU_PERIOD_US
    if not math.isfinite(quota):   # e.g. 1e305 cores: int() of the overflow would raise past the caller
        raise ValueError(f"cores {cores!r} is too large for a CFS quota")
    return max(MIN_CPU_QUOTA_US, int(round(quota)))


def below_kernel_floor(cores: float, detail: dict) -> None:
    """Says in `detail` (as `within_host` does for the top) when `cpu_quota_for` raised `cores` to
    the kernel's smallest quota: the limit held is then MIN_CPU_QUOTA_US, not what was asked, and a
    caller comparing what it asked with what the engine holds must know that."""
    floor = MIN_CPU_QUOTA_US / CPU_PERIOD_US
    if cores < floor:
        detail |= {"cores": floor, "cores_asked": cores,
                   "clamped": f"{cores:g} cores is below the kernel's smallest CFS quota ({MIN_CPU_QUOTA_US} µs "
                              f"per {CPU_PERIOD_US} µs period); raised to {floor:g}"}


def limit_cores(host_config: Mapping[str, Any] | None) -> float | None:
    """The CPU limit a container's HostConfig holds, in cores: CpuQuota / CpuPeriod (period 0 is
    the kernel's 100 ms), or NanoCpus / 1e9 for a container made with `--cpus` (Compose's `cpus`);
    None when it has none (unlimited)."""
    h = host_config or {}
    quota, nano = h.get("CpuQuota") or 0, h.get("NanoCpus") or 0
    if quota > 0:
        return quota / (h.get("CpuPeriod") or CPU_PERIOD_US)
    if nano > 0:
        return nano / 1e9
    return None


def stats_summary(stats: Mapping[str, Any]) -> dict[str, float | None]:
    """One engine stats sample (with its `precpu_stats`) -> cpu_percent (100 = one core),
    mem_working_set_bytes and throttle_ratio (share of CFS periods that were throttled)."""
    cpu, pre = stats.get("cpu_stats") or {}, stats.get("precpu_stats") or {}
    d_total = (cpu.get("cpu_usage") or {}).get("total_usage", 0) - (pre.get("cpu_usage") or {}).get("total_usage", 0)
    d_system = cpu.get("system_cpu_usage", 0) - pre.get("system_cpu_usage", 0)
    online = cpu.get("online_cpus") or len((cpu.get("cpu_usage") or {}).get("percpu_usage") or []) or 1
    # Without a previous sample the delta spans the host's uptime and means nothing.
    cpu_percent = d_total / d_system * online * 100.0 if d_system > 0 and pre.get("system_cpu_usage") else None
    thr, pre_thr = cpu.get("throttling_data") or {}, pre.get("throttling_data") or {}
    d_periods = thr.get("periods", 0) - pre_thr.get("periods", 0)
    d_throttled = thr.get("throttled_periods", 0) - pre_thr.get("throttled_periods", 0)
    throttle_ratio = d_throttled / d_periods if d_periods > 0 else 0.0
    mem = stats.get("memory_stats") or {}
    usage = mem.get("usage")
    working_set = None
    if usage is not None:
        detail = mem.get("stats") or {}
        inactive = detail.get("total_inactive_file", detail.get("inactive_file", 0))  # cgroup v1 / v2
        working_set = max(0, usage - inactive)
    return {"cpu_percent": cpu_percent, "mem_working_set_bytes": working_set, "throttle_ratio": throttle_ratio}


class DockerExecutor(Executor):
    kind = "docker"

    def __init__(
        self,
        groups: Sequence[GroupConfig],
        client: docker.DockerClient | None = None,
        *,
        base_url: str | None = None,
        namespace: str = "samm",
        commands: Mapping[str, Sequence[str]] | None = None,
        network: str | None = None,
        stop_timeout_s: int = 10,
        timeout_s: int = 30,
        cpu_burst: float | None = None,
    ) -> None:
        """`client` wins over `base_url`; with neither, the environment (DOCKER_HOST) is used.
        The client is made on first use, so a down engine fails calls, not construction.
        `commands` maps a group name to its containers' command (default: sleep forever).
        `cpu_burst`: the CFS burst `set_cpu_limit` gives with each quota, a fraction of it in
        [0, 1] (None: the burst is left alone)."""
        if cpu_burst is not None:
            cfs_burst.burst_us(CPU_PERIOD_US, cpu_burst)   # validates it
        self.cpu_burst = cpu_burst
        self.groups = {g.name: g for g in groups}
        if not re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*", namespace):
            raise ValueError(f"namespace {namespace!r} must match [a-zA-Z0-9][a-zA-Z0-9_.-]* (it prefixes container names)")
        self.namespace = namespace
        self.commands = {k: list(v) for k, v in (commands or {}).items()}
        unknown = sorted(set(self.commands) - set(self.groups))
        if unknown:
            raise ValueError(f"commands given for unknown groups {unknown}")
        self.network = network
        self.stop_timeout_s = stop_timeout_s
        self.timeout_s = timeout_s
        self.crash_backoff_s = CRASH_BACKOFF_S
        self._base_url = base_url
        self._client = client
        # (container id, pid) -> its cgroup dir, or why there is none: a container's cgroup holds
        # while its process does, and a restart brings a new pid (a new key)
        self._cgroups: dict[tuple[str, int], Path | OSError] = {}
        self._host_cpus: int | None = None

    # -- engine access -------------------------------------------------------------------------
    def _docker(self) -> docker.DockerClient:
        if self._client is None:
            if self._base_url:
                self._client = _call("connect", docker.DockerClient, base_url=self._base_url, timeout=self.timeout_s)
            else:
                self._client = _call("connect", docker.from_env, timeout=self.timeout_s)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def host_cpus(self) -> int | None:
        """The engine's CPUs (`docker info`'s NCPU: the host's, or its cpuset's), read once; None
        when the engine cannot say (the limit is then sent as asked)."""
        if self._host_cpus is None:
            try:
                ncpu = _call("info", self._docker().info).get("NCPU")
            except _CallFailed as exc:
                log.warning("the engine's CPU count is unknown (%s); CPU limits are not clamped to it", exc)
                return None
            if isinstance(ncpu, int) and not isinstance(ncpu, bool) and ncpu > 0:
                self._host_cpus = ncpu
        return self._host_cpus

    def within_host(self, cores: float, detail: dict | None = None) -> float:
        """`cores`, clamped to the engine's CPUs (recorded in `detail`): a CFS quota above them
        limits nothing, and the engine refuses the same limit given as NanoCpus (`--cpus`)."""
        detail = {} if detail is None else detail
        host = self.host_cpus()
        if host is None or cores <= host:
            return cores
        detail["cores_asked"], detail["host_cpus"] = cores, host
        detail["clamped"] = f"{cores:g} cores is more than the engine's {host} CPUs; clamped to {host}"
        return float(host)

    def _labels(self, group: str) -> dict[str, str]:
        return {LABEL_NAMESPACE: self.namespace, LABEL_GROUP: group}

    def _containers(self, group: str) -> list:
        filters = {"label": [f"{k}={v}" for k, v in self._labels(group).items()]}
        return _call("containers.list", self._docker().containers.list, all=True, filters=filters,
                     ignore_removed=True)

    # -- Executor ------------------------------------------------------------------------------
    def inventory(self) -> dict[str, GroupStatus]:
        """Raises ExecutorError naming the engine call when the engine cannot be reached."""
        result = {}
        try:
            for name, cfg in self.groups.items():
                instances = tuple(self._instance(name, c) for c in self._containers(name))
                live = sum(1 for i in instances if i.state != "terminating")
                result[name] = GroupStatus(name=name, desired=live, min=cfg.min, max=cfg.max, instances=instances)
        except _CallFailed as exc:
            raise ExecutorError(str(exc)) from exc
        return result

    @staticmethod
    def _instance(group: str, container) -> Instance:
        state = container.attrs.get("State") or {}
        status = state.get("Status") if isinstance(state, dict) else state
        return Instance(group=group, instance_id=container.name, state=_STATE.get(status or "", "pending"),
                        launched_at=parse_docker_time(state.get("StartedAt") if isinstance(state, dict) else None))

    def apply(self, request: ScaleRequest) -> ActionResult:
        cfg = self.groups.get(request.group)
        if cfg is None:
            return refused({"group": request.group}, f"unknown group {request.group!r} (known: {sorted(self.groups)})")
        if not isinstance(request.target, int) or isinstance(request.target, bool) \
                or not cfg.min <= request.target <= cfg.max:
            return refused({"group": cfg.name, "target": request.target},
                           f"target {request.target!r} outside [{cfg.min}, {cfg.max}] of group {cfg.name!r}")
        if not cfg.docker_image:
            return refused({"group": cfg.name}, f"group {cfg.name!r} has no docker_image")
        detail: dict[str, Any] = {"group": cfg.name, "target": request.target, "started": [], "removed": [],
                                  "reaped": []}
        try:
            containers = self._containers(cfg.name)
            crashed = self._crashed_recently(containers)
            # Exited or dead instances are replaced, not restarted, as an ASG replaces unhealthy
            # instances; removing them keeps names free and inventories short.
            for c in containers:
                if _STATE.get(c.status) == "terminating" and c.status != "removing" and c.name not in crashed:
                    if self._remove(c, detail, stop=False):
                        detail["reaped"].append(c.name)
            live = [c for c in containers if _STATE.get(c.status, "pending") != "terminating"]
            detail["live_before"] = len(live)
            if len(live) == request.target:
                return ActionResult("skipped", detail | {"live": len(live), "reason": "target already met"})
            stale = moved_past(request, len(live))   # an operator's `docker run`/`rm` since the decision
            if stale:
                return ActionResult("skipped", detail | {"live": len(live), "reason": stale})
            if len(live) < request.target:
                if crashed:
                    detail["crashed"] = sorted(crashed)
                    # nothing launched (the reaping changed no capacity): no cool-down
                    return refused(detail, next(iter(crashed.values())))
                taken = {c.name for c in containers}
                cores = self.within_host(float(cfg.cores), detail)
                for _ in range(request.target - len(live)):
                    detail["started"].append(self._start_one(cfg, request, taken, cores))
            else:
                for c in self._victims(live, len(live) - request.target, request.victim, detail):
                    if self._remove(c, detail, stop=True):
                        detail["removed"].append(c.name)
            detail["live"] = request.target
            return ActionResult("succeeded", detail)
        except _CallFailed as exc:
            log.warning("scaling %s to %d failed: %s", cfg.name, request.target, exc)
            acted = exc.call not in _READ_ONLY_CALLS or bool(detail["started"] or detail["removed"])
            return ActionResult("failed", detail | {"call": exc.call}, str(exc), may_have_acted=acted)
        except Exception as exc:  # never raise out of apply: the daemon loop must keep running
            log.exception("scaling %s to %d failed", cfg.name, request.target)
            return ActionResult("failed", detail, f"docker executor: {type(exc).__name__}: {exc}")

    def _remove(self, c, detail: dict, *, stop: bool) -> bool:
        """Stops (when asked) and removes one container; False when someone else removed it since
        the listing (recorded in the detail's `already_gone`): its capacity is gone either way."""
        try:
            if stop:
                _call("container.stop", c.stop, timeout=self.stop_timeout_s)
            _call("container.remove", c.remove, v=True, force=not stop)
        except _CallFailed as exc:
            if not isinstance(exc.__cause__, docker.errors.NotFound):
                raise
            detail.setdefault("already_gone", []).append(c.name)
            return False
        return True

    def _crashed_recently(self, containers: list) -> dict[str, str]:
        """Name -> why, for each container that ended by itself within CRASH_WINDOW_S of its start
        less than `crash_backoff_s` ago: launching another would crash the same way, every loop."""
        quick: list[tuple[Any, float, float, Any]] = []
        for c in containers:
            state = c.attrs.get("State")
            if c.status != "exited" or not isinstance(state, dict):
                continue
            started, finished = parse_docker_time(state.get("StartedAt")), parse_docker_time(state.get("FinishedAt"))
            code = state.get("ExitCode")
            if started is None or finished is None or finished - started > CRASH_WINDOW_S \
                    or (code in _STOPPED_FROM_OUTSIDE and not state.get("OOMKilled")):
                continue
            quick.append((c, started, finished, code))
        if not quick:
            return {}
        now, found = self._engine_now(), {}
        for c, started, finished, code in quick:
            if now - finished >= self.crash_backoff_s:
                continue
            wait, lived = self.crash_backoff_s - (now - finished), max(finished - started, 0.0)   # not "-0.0 s"
            found[c.name] = (f"container {c.name} exited with code {code} {lived:.1f} s after its start "
                             f"(a crash loop? see `docker logs {c.name}`): no new one for {wait:.0f} s")
        return found

    def _engine_now(self) -> float:
        """The engine's clock (`docker info`'s SystemTime), the one that stamped FinishedAt: this
        host's may differ (a remote engine, a skewed or stepped clock), and the crash back-off was
        shifted by the difference: an engine 5 minutes behind relaunched a crash loop every
        interval, one ahead held scale-out back for minutes. This host's clock when it cannot say."""
        try:
            stamp = parse_docker_time(_call("info", self._docker().info).get("SystemTime"))
        except _CallFailed as exc:
            log.warning("the engine's clock is unknown (%s); the crash back-off uses this host's", exc)
            stamp = None
        return stamp if stamp is not None else time.time()

    def _start_one(self, cfg: GroupConfig, request: ScaleRequest, taken: set[str], cores: float) -> str:
        labels = self._labels(cfg.name) | _parse_label(cfg.docker_label) | {LABEL_REQUEST: request.idempotency_key[:200]}
        kwargs: dict[str, Any] = dict(
            image=cfg.docker_image,
            command=self.commands.get(cfg.name, list(DEFAULT_COMMAND)),
            labels=labels,
            cpu_period=CPU_PERIOD_US,
            cpu_quota=cpu_quota_for(cores),
            mem_limit=int(cfg.ram_gb * 2**30),
            init=True,  # without an init, PID 1 ignores SIGTERM and every stop waits its full timeout
            detach=True,
        )
        if self.network:
            kwargs["network"] = self.network
        pattern = re.compile(rf"{re.escape(self.namespace)}-{re.escape(cfg.name)}-(\d+)")
        for attempt in range(5):
            index = 1 + max((int(m.group(1)) for n in taken if (m := pattern.fullmatch(n))), default=0)
            name = f"{self.namespace}-{cfg.name}-{index}"
            taken.add(name)
            try:
                container = _call("containers.create", self._docker().containers.create, name=name, **kwargs)
                break
            except _CallFailed as exc:
                # Someone else (another daemon, a human) took the name meanwhile: use the next one.
                cause = exc.__cause__
                if attempt == 4 or getattr(cause, "status_code", None) != 409:
                    raise
        try:
            _call("container.start", container.start)
        except _CallFailed:
            # A created-but-never-started container would count as pending forever.
            try:
                container.remove(force=True)
            except _DOCKER_ERRORS:
                pass
            raise
        return name

    @staticmethod
    def _victims(live: list, count: int, victim: str | None, detail: dict) -> list:
        """The requested victim first, then the newest instances (the least warmed-up)."""
        chosen = []
        if victim:
            match = [c for c in live if victim in (c.name, c.id) or (len(victim) >= 12 and c.id.startswith(victim))]
            if match:
                chosen.append(match[0])
            else:
                detail["victim_missing"] = victim
        newest_first = sorted(
            (c for c in live if c not in chosen),
            key=lambda c: (parse_docker_time((c.attrs.get("State") or {}).get("StartedAt")) or math.inf,
                           c.attrs.get("Created", "")),
            reverse=True,
        )
        return (chosen + newest_first)[:count]

    # -- per-container control -----------------------------------------------------------------
    def set_cpu_limit(self, container: str, cores: float) -> ActionResult:
        """Changes a running container's CPU limit in place (no restart), and with `cpu_burst`
        its CFS burst. A burst that cannot be written (a remote engine, no root, an old kernel)
        leaves the limit set and says why in the detail's `cpu_burst_error`. More cores than the
        engine has are clamped to its CPUs, fewer than the kernel's smallest quota (0.01) raised to
        it (`cores` is the limit set, `cores_asked` and `clamped` say so). A container that is gone
        (or renamed) fails with `may_have_acted` false: nothing was changed."""
        try:
            quota = cpu_quota_for(cores)
        except ValueError as exc:
            return refused({"container": container, "cores": cores}, str(exc))
        cores = float(cores)   # an agent's np.float32 is recorded as a plain (JSON) number
        detail: dict[str, Any] = {"container": container, "cores": cores, "cpu_period": CPU_PERIOD_US,
                                  "cpu_quota": quota}
        below_kernel_floor(cores, detail)
        try:
            c = _call("containers.get", self._docker().containers.get, container)
            if (limit := self.within_host(cores, detail)) != cores:
                quota = cpu_quota_for(limit)
                detail |= {"cores": limit, "cpu_quota": quota}
            burst_after = self._burst(c, quota, detail, before=True)
            if ((c.attrs.get("HostConfig") or {}).get("NanoCpus") or 0) > 0:
                # made with --cpus: the engine refuses a quota beside NanoCpus (409), so the limit
                # stays NanoCpus (the kernel's quota per 100 ms period is the same)
                nano = quota * 10_000   # the same limit as the quota: µs per 100 ms -> ns per s
                detail = {k: v for k, v in detail.items() if k not in ("cpu_period", "cpu_quota")} | {"nano_cpus": nano}
                api = c.client.api
                _call("container.update", lambda: api._result(
                    api._post_json(api._url("/containers/{0}/update", c.id), data={"NanoCpus": nano}), True))
            else:
                _call("container.update", c.update, cpu_period=CPU_PERIOD_US, cpu_quota=quota)
            if burst_after:
                self._burst(c, quota, detail, before=False)
        except _CallFailed as exc:
            # a container gone or renamed since the caller looked (containers.get) got no limit
            return ActionResult("failed", detail | {"call": exc.call}, str(exc),
                                may_have_acted=exc.call not in _READ_ONLY_CALLS)
        return ActionResult("succeeded", detail)

    def _burst(self, c, quota: int, detail: dict, before: bool) -> bool:
        """Writes the container's CFS burst for `quota` before the quota changes (when the burst
        held now would exceed the new quota) or after it; returns whether it is still to write.
        Without `cpu_burst` the burst is not ours to set, but one set by someone else above the
        new quota would make the kernel refuse that quota: it is lowered to the quota (recorded)."""
        if "cpu_burst_error" in detail or (self.cpu_burst is None and not before):
            return False
        try:
            d = self._cgroup_dir(c)
            held = cfs_burst.read_burst(d) if before else None
            if self.cpu_burst is None:
                if held > quota:
                    cfs_burst.write_burst(d, quota)
                    detail["cpu_burst_us"], detail["cpu_burst_lowered"] = quota, True
                return False
            if before and not cfs_burst.burst_goes_first(held, quota):
                return True
            want = cfs_burst.burst_us(quota, self.cpu_burst)
            cfs_burst.write_burst(d, want)
        except (OSError, ValueError) as exc:
            if self.cpu_burst is not None:   # asked for and not set; without it, nothing was asked
                detail["cpu_burst_error"] = f"{type(exc).__name__}: {exc}"
            return False
        detail["cpu_burst_us"] = want
        return False

    def _cgroup_dir(self, c) -> Path:
        """The container's CPU cgroup dir, found once per (container, process): `set_cpu_limit`
        runs every second per container, and the lookup reads two /proc files."""
        key = (c.id, int((c.attrs.get("State") or {}).get("Pid") or 0))
        if key not in self._cgroups:
            if len(self._cgroups) >= _CGROUP_CACHE_SIZE:   # containers come and go: drop the oldest
                del self._cgroups[next(iter(self._cgroups))]
            try:
                self._cgroups[key] = cfs_burst.cpu_cgroup_dir(key[1], c.id)
            except OSError as exc:
                self._cgroups[key] = exc.with_traceback(None)
        found = self._cgroups[key]
        if isinstance(found, OSError):
            raise type(found)(*found.args)   # a fresh one: raising the kept one would grow its traceback
        return found

    def container_stats(self, container: str) -> dict[str, float | None]:
        """cpu_percent (100 = one full core; None without a previous sample),
        mem_working_set_bytes and throttle_ratio over the engine's last ~1 s sample.
        Takes about a second. Raises ExecutorError naming the call on engine errors."""
        try:
            c = _call("containers.get", self._docker().containers.get, container)
            raw = _call("container.stats", c.stats, stream=False)
        except _CallFailed as exc:
            raise ExecutorError(str(exc)) from exc
        return stats_summary(raw) | {"read_at": time.time()}
