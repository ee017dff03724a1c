"""One emulated VM: a process that burns real CPU following its usage trace.

    python -m samm.testbed.oversub.vm --t0 EPOCH --seconds-per-step 1 --first-step 3 \
        --demand 0.012,0.020,0.015        # host cores wanted in steps 3, 4, 5; nothing after

Step k is the wall interval [t0 + k*S, t0 + (k+1)*S). In it the VM wants `demand[k - first]`
host cores, i.e. usage[v, k] x requested cores x host_cores_per_pm_core (the caller scales).

Start-up handshake: the process prints "ready" once its interpreter is up, then waits for a
line "go" on stdin; the caller moves it into its PM's cgroup in between, so the interpreter's
start-up CPU (~30 ms, several steps' worth of a small VM) is never charged to the PM.
EOF on stdin (the caller died) or SIGTERM (default action) ends it.

How it burns: it tracks its own CPU time (`time.process_time`, user + system, everything the
cgroup's cpuacct counts) against the CPU it owes, integrated over the demand, and burns in
slices to close the gap. Its own wake-ups are therefore paid for out of the demand instead of
adding to it (down to the floor of a wake-up every half step, ~0.2 ms/s: see `run_vm`). A debt
it cannot pay (its PM at its quota) is capped at two slices: a throttled VM's lost work does
not come back as a burst later.

Stdlib only, so the interpreter starts fast.
"""
from __future__ import annotations

import argparse
import hashlib
import math
import os
import sys
import threading
import time
from typing import Callable

_BUF = bytes(range(256)) * 16  # 4 KiB: a few microseconds of SHA-256 between clock checks


def demand_integral(t0: float, seconds_per_step: float, first_step: int, demand: list[float],
                    a: float, b: float) -> float:
    """Host-core-seconds owed over the wall interval [a, b)."""
    if b <= a or not demand:
        return 0.0
    total = 0.0
    k = max(first_step, int(math.floor((a - t0) / seconds_per_step)))
    last = first_step + len(demand)
    while k < last:
        lo = max(a, t0 + k * seconds_per_step)
        hi = min(b, t0 + (k + 1) * seconds_per_step)
        if lo >= b:
            break
        if hi > lo:
            total += demand[k - first_step] * (hi - lo)
        k += 1
    return total


def burn_cpu(seconds: float, max_wall_s: float) -> None:
    """Spend about `seconds` of this process's CPU, giving up after `max_wall_s` of wall time
    (a throttled cgroup gets no CPU for the rest of its period)."""
    if seconds <= 0:
        return
    end_cpu = time.process_time() + seconds
    deadline = time.monotonic() + max_wall_s
    while time.process_time() < end_cpu and time.monotonic() < deadline:
        hashlib.sha256(_BUF).digest()


def demand_at(t0: float, seconds_per_step: float, first_step: int, demand: list[float], t: float) -> float:
    k = int(math.floor((t - t0) / seconds_per_step)) - first_step
    return demand[k] if 0 <= k < len(demand) else 0.0


def run_vm(t0: float, seconds_per_step: float, first_step: int, demand: list[float],
           stop: Callable[[], bool] = lambda: False, slice_s: float = 0.05, min_burn_s: float = 0.002,
           clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep) -> float:
    """Burn until `stop()` (or the process is killed); returns the CPU seconds it spent.

    A wake-up costs ~100 us of CPU on a small VM (measured: 2 ms/s at 20 wake-ups/s), as much
    as a small VM's whole demand. So a VM wakes every `slice_s` only when each burn is at
    least `min_burn_s`; smaller demands wake less often (at most every half step), and a VM
    with nothing to burn sleeps until its next step."""
    if not seconds_per_step > 0 or not slice_s > 0:
        raise ValueError("seconds_per_step and slice_s must be positive")
    if any(not (math.isfinite(d) and d >= 0) for d in demand):
        raise ValueError("demand must be finite and >= 0")
    end_of_demand = t0 + (first_step + len(demand)) * seconds_per_step
    longest = max(slice_s, seconds_per_step / 2)
    cpu_start = cpu_last = time.process_time()
    wall_last = clock()
    owed, cap = 0.0, 0.0
    while not stop():
        now = clock()
        owed += demand_integral(t0, seconds_per_step, first_step, demand, wall_last, now)
        cpu_now = time.process_time()
        owed -= cpu_now - cpu_last
        cpu_last, wall_last = cpu_now, now
        owed = min(max(owed, 0.0), cap)
        if owed > 0:
            burn_cpu(owed, max_wall_s=slice_s)
        now = clock()
        if now >= end_of_demand:
            sleep(1.0)  # nothing left: idle until the executor stops it
            continue
        d = demand_at(t0, seconds_per_step, first_step, demand, now)
        if d <= 0:  # sleep to the next step (it may have demand)
            step_end = t0 + (math.floor((now - t0) / seconds_per_step) + 1) * seconds_per_step
            cap = 0.0
            sleep(max(0.0, step_end - now))
            continue
        every = min(max(slice_s, min_burn_s / d), longest)
        cap = 2 * every * d  # a debt a throttled VM could not pay does not come back as a burst
        sleep(max(0.0, every - ((now - t0) % every)))
    return time.process_time() - cpu_start


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m samm.testbed.oversub.vm", description=__doc__.split("\n\n")[0])
    p.add_argument("--t0", type=float, required=True, help="epoch of step 0 (shared with the executor)")
    p.add_argument("--seconds-per-step", type=float, required=True)
    p.add_argument("--first-step", type=int, required=True, help="the step demand[0] belongs to")
    p.add_argument("--demand", required=True, help="host cores per step, comma-separated")
    p.add_argument("--slice", type=float, default=0.05, help="wall seconds between burns")
    p.add_argument("--no-handshake", action="store_true", help="start at once (no ready/go on stdio)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        demand = [float(x) for x in args.demand.split(",") if x.strip()]
    except ValueError:
        demand = [math.nan]
    if not demand or any(not (math.isfinite(d) and d >= 0) for d in demand):
        print(f"vm: --demand must be comma-separated finite numbers >= 0, got {args.demand!r}", file=sys.stderr)
        return 2
    # SIGTERM keeps its default action (the process ends at once): a VM has nothing to save
    if not args.no_handshake:
        go = threading.Event()

        def watch_stdin() -> None:
            if sys.stdin.readline().strip() != "go":
                os._exit(0)  # the caller gave up on us (EOF)
            go.set()
            sys.stdin.read()  # returns at EOF: the executor is gone
            os._exit(0)

        # everything that costs CPU happens before "ready", outside the PM's cgroup
        threading.Thread(target=watch_stdin, daemon=True).start()
        print("ready", flush=True)
        go.wait()
    try:
        run_vm(args.t0, args.seconds_per_step, args.first_step, demand, slice_s=args.slice)
    except ValueError as exc:
        print(f"vm: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
