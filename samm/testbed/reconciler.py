"""Turns Auto Scaling Group instances into worker processes, as a cloud turns them into VMs.

Every poll reads the groups through the AWS API (moto's server in the testbed). An instance
seen InService for the first time is billed from that moment and gets a worker process after
a seeded boot delay (the simulator's U(45, 97) s, divided by the time compression); an
instance that left its group has its worker killed with SIGKILL, like a terminated VM, and its
leased jobs go straight back to the queue. A worker that exits on a live instance is restarted
at once, then, while it keeps failing, after a back-off doubling from 0.5 s to 30 s (wall), as
an init system would (`RESTART_BACKOFF_S`, reset once a worker ran `HEALTHY_S`). The daemon
never talks to the reconciler: it only sees the ASGs and Graphite, as it would on AWS.
"""
from __future__ import annotations

import logging
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

log = logging.getLogger(__name__)

#: a worker that cannot start is retried at once, then after these wall seconds, doubling up to
#: the second (an init system's restart back-off: restarted on every poll, a worker exiting at
#: start-up was spawned five times a second for the whole run, each logged)
RESTART_BACKOFF_S = (0.5, 30.0)
#: a worker that ran this long (wall seconds) was healthy: its next exit is a first failure again
HEALTHY_S = 10.0


@dataclass
class Vm:
    group: str
    instance_id: str
    cores: int
    seen_wall: float  # billed from here (booting VMs are billed, as in the simulator)
    ready_wall: float  # the worker starts here
    proc: subprocess.Popen | None = None
    stopped_wall: float | None = None
    spawns: int = 0  # worker processes started for it (0: it never ran, e.g. removed while booting)
    started_wall: float | None = None  # when its current worker process started
    failures: int = 0  # failed starts in a row: a spawn that raised, or a worker that exited before it was healthy
    retry_wall: float = 0.0  # no new worker before this (the restart back-off)


class Reconciler:
    def __init__(self, autoscaling, groups: dict[str, tuple[str, int]], spawn: Callable[[str, str, int], subprocess.Popen],
                 on_terminated: Callable[[str], None] | None = None, compression: float = 30.0, seed: int = 1,
                 boot_delay_s: tuple[float, float] = (45.0, 97.0), poll_s: float = 0.2,
                 clock: Callable[[], float] = time.time,
                 restart_backoff_s: tuple[float, float] = RESTART_BACKOFF_S, healthy_s: float = HEALTHY_S):
        """`groups`: ASG name -> (group name, cores). `spawn(group, instance_id, cores)` starts a
        worker; `on_terminated(instance_id)` releases its jobs. `restart_backoff_s` (first, most)
        and `healthy_s`: see RESTART_BACKOFF_S and HEALTHY_S."""
        self.autoscaling = autoscaling
        self.groups = groups
        self.spawn = spawn
        self.on_terminated = on_terminated
        self.compression = float(compression)
        self.rng = np.random.default_rng(seed)
        self.boot_delay_s = boot_delay_s
        self.poll_s = poll_s
        self.clock = clock
        self.stopped_at: float | None = None  # when stop() ended the fleet (billing: not a scale-in)
        self.restart_backoff_s = restart_backoff_s
        self.healthy_s = healthy_s
        self.vms: dict[str, Vm] = {}
        self.errors = 0
        self.restarts = 0
        self.polls = 0  # successful polls
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def poll(self) -> None:
        now = self.clock()
        try:
            pages = self.autoscaling.get_paginator("describe_auto_scaling_groups").paginate(
                AutoScalingGroupNames=list(self.groups))
            asgs = [g for p in pages for g in p["AutoScalingGroups"]]
        except Exception as exc:  # noqa: BLE001 - the API may throttle; try again next poll
            self.errors += 1
            log.warning("reconciler: describe failed: %s", exc)
            return
        present: set[str] = set()
        with self._lock:
            if self._stop.is_set():
                # a describe that outlived stop()'s join: its answer would start workers (and
                # bill VMs) that nothing stops any more
                return
            for asg in sorted(asgs, key=lambda a: a["AutoScalingGroupName"]):
                group, cores = self.groups[asg["AutoScalingGroupName"]]
                for inst in sorted(asg.get("Instances", []), key=lambda i: i["InstanceId"]):
                    iid = inst["InstanceId"]
                    if not inst["LifecycleState"].startswith(("Pending", "InService")):
                        continue
                    present.add(iid)
                    if iid not in self.vms:
                        # the initial fleet is up when the run starts, as in the simulator
                        delay = 0.0 if self.polls == 0 else self.rng.uniform(*self.boot_delay_s) / self.compression
                        self.vms[iid] = Vm(group, iid, cores, now, now + delay)
            self.polls += 1
            for iid, vm in self.vms.items():
                if vm.stopped_wall is not None:
                    continue
                # one instance's failure (a worker that cannot start, a locked queue) must not
                # end the reconciler: it is recorded, and the next poll tries again
                try:
                    if iid not in present:
                        self._terminate(vm, now)
                        continue
                    if vm.proc is not None and vm.proc.poll() is not None:
                        # the worker crashed on a live instance: restart it, as its init system would
                        self.restarts += 1
                        why = f"exited with {vm.proc.returncode}"
                        vm.proc = None
                        self._release(iid)
                        self._failed(vm, now, why)
                    if vm.proc is None and now >= max(vm.ready_wall, vm.retry_wall):
                        self._start(vm, now)
                except Exception as exc:  # noqa: BLE001
                    self.errors += 1
                    log.warning("reconciler: %s/%s: %s: %s; retrying next poll", vm.group, iid,
                                type(exc).__name__, exc)

    def _start(self, vm: Vm, now: float) -> None:
        try:
            vm.proc = self.spawn(vm.group, vm.instance_id, vm.cores)
        except Exception as exc:  # noqa: BLE001 - e.g. out of file descriptors: retried after the back-off
            self.errors += 1
            self._failed(vm, now, f"did not start ({type(exc).__name__}: {exc})")
            return
        vm.spawns += 1
        vm.started_wall = now

    def _failed(self, vm: Vm, now: float, why: str) -> None:
        """A worker that did not start, or exited: retried at once the first time, then after a
        delay doubling up to the back-off's bound, reset once a worker ran `healthy_s`. Called
        once per attempt, so the log says each step of the back-off once."""
        if vm.started_wall is not None and now - vm.started_wall >= self.healthy_s:
            vm.failures = 0
        vm.started_wall = None
        vm.failures += 1
        first, most = self.restart_backoff_s
        delay = 0.0 if vm.failures == 1 else min(most, first * 2.0 ** min(vm.failures - 2, 60))  # bounded: 2.0 ** 1100 overflows
        vm.retry_wall = now + delay
        log.warning("reconciler: worker of %s/%s %s (failure %d in a row); %s", vm.group, vm.instance_id, why,
                    vm.failures, "restarting it" if delay == 0 else f"retrying in {delay:.3g} s")

    def _release(self, instance_id: str) -> None:
        """Hand the instance's leased jobs back; on failure their leases expire instead."""
        if self.on_terminated is None:
            return
        try:
            self.on_terminated(instance_id)
        except Exception as exc:  # noqa: BLE001 - e.g. the queue locked past its timeout
            self.errors += 1
            log.warning("reconciler: could not release the jobs of %s (%s: %s); they return when their leases "
                        "expire", instance_id, type(exc).__name__, exc)

    def _terminate(self, vm: Vm, now: float) -> None:
        vm.stopped_wall = now
        if vm.proc is not None and vm.proc.poll() is None:
            vm.proc.send_signal(signal.SIGKILL)  # abrupt, like a terminated VM
            try:
                vm.proc.wait(5)
            except subprocess.TimeoutExpired:
                log.warning("reconciler: worker of %s did not exit 5 s after SIGKILL", vm.instance_id)
        self._release(vm.instance_id)
        log.info("reconciler: %s/%s terminated", vm.group, vm.instance_id)

    def counts(self) -> dict[str, dict[str, int]]:
        """Per group: booting (no worker yet) and running VMs now."""
        out: dict[str, dict[str, int]] = {g: {"booting": 0, "running": 0} for g, _ in self.groups.values()}
        with self._lock:
            for vm in self.vms.values():
                if vm.stopped_wall is None:
                    out[vm.group]["running" if vm.proc is not None else "booting"] += 1
        return out

    def kill_worker(self, instance_id: str) -> bool:
        """Fault injection: the worker process dies, the instance stays (a crashed process)."""
        with self._lock:
            vm = self.vms.get(instance_id)
            if vm is None or vm.proc is None or vm.proc.poll() is not None:
                return False
            vm.proc.send_signal(signal.SIGKILL)
            vm.proc.wait(5)
            return True

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
            except Exception:  # noqa: BLE001 - a reconciler that dies silently freezes the fleet
                self.errors += 1
                log.exception("reconciler: poll failed; retrying")
            self._stop.wait(self.poll_s)

    def start(self) -> "Reconciler":
        self._thread = threading.Thread(target=self.run, name="samm-reconciler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops polling and every worker (billing ends now for instances still running)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        now = self.clock()
        self.stopped_at = now
        with self._lock:
            for vm in self.vms.values():
                if vm.stopped_wall is None:
                    vm.stopped_wall = now
                    if vm.proc is not None and vm.proc.poll() is None:
                        vm.proc.terminate()
            for vm in self.vms.values():
                if vm.proc is not None:
                    try:
                        vm.proc.wait(5)
                    except subprocess.TimeoutExpired:
                        # a hung (e.g. stopped) worker never ran its SIGTERM hand-back: kill it,
                        # reap it, and hand its jobs back here
                        log.warning("reconciler: worker of %s ignored SIGTERM for 5 s; killing it", vm.instance_id)
                        vm.proc.kill()
                        try:
                            vm.proc.wait(5)
                        except subprocess.TimeoutExpired:
                            log.warning("reconciler: worker of %s did not exit 5 s after SIGKILL", vm.instance_id)
                        self._release(vm.instance_id)
