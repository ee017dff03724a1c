"""Turns Auto Scaling Group instances into worker processes, as a cloud turns them into VMs.

Every poll reads the groups through the AWS API (moto's server in the testbed). An instance
seen InService for the first time is billed from that moment and gets a worker process after
a seeded boot delay (the simulator's U(45, 97) s, divided by the time compression); an
instance that left its group has its worker killed with SIGKILL, like a terminated VM, and its
leased jobs go straight back to the queue. The daemon never talks to the reconciler: it only
sees the ASGs and Graphite, as it would on AWS.
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


class Reconciler:
    def __init__(self, autoscaling, groups: dict[str, tuple[str, int]], spawn: Callable[[str, str, int], subprocess.Popen],
                 on_terminated: Callable[[str], None] | None = None, compression: float = 30.0, seed: int = 1,
                 boot_delay_s: tuple[float, float] = (45.0, 97.0), poll_s: float = 0.2,
                 clock: Callable[[], float] = time.time):
        """`groups`: ASG name -> (group name, cores). `spawn(group, instance_id, cores)` starts a
        worker; `on_terminated(instance_id)` releases its jobs."""
        self.autoscaling = autoscaling
        self.groups = groups
        self.spawn = spawn
        self.on_terminated = on_terminated
        self.compression = float(compression)
        self.rng = np.random.default_rng(seed)
        self.boot_delay_s = boot_delay_s
        self.poll_s = poll_s
        self.clock = clock
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
                    elif vm.proc is None and now >= vm.ready_wall:
                        vm.proc = self.spawn(vm.group, iid, vm.cores)
                        vm.spawns += 1
                    elif vm.proc is not None and vm.proc.poll() is not None:
                        # the worker crashed on a live instance: restart it, as its init system would
                        self.restarts += 1
                        log.warning("reconciler: worker of %s/%s exited with %s; restarting it", vm.group, iid,
                                    vm.proc.returncode)
                        vm.proc = None  # a failed spawn below is retried on the next poll
                        self._release(iid)
                        vm.proc = self.spawn(vm.group, iid, vm.cores)
                        vm.spawns += 1
                except Exception as exc:  # noqa: BLE001
                    self.errors += 1
                    log.warning("reconciler: %s/%s: %s: %s; retrying next poll", vm.group, iid,
                                type(exc).__name__, exc)

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
