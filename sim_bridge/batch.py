"""A batch of simulations stepped together in one Py4J round trip per call.

Replies are packed little-endian float64 records (docs/bridge-protocol.md) decoded with
`np.frombuffer` into `SimStep`, whose `raw` field is the `RawSnapshot` the analyzer consumes.
"""
from __future__ import annotations

import base64
import struct
from dataclasses import dataclass

import numpy as np

from samm.analyze import FleetSpec, RawSnapshot

from .config import SimConfig
from .errors import BridgeError, SimulatorError
from .gateway import Gateway, shared_gateway
from .workloads import Workload

HEADER = 21
TYPE_FIELDS = 4
VM_FIELDS = 5
#: the most VMs of one type a step adds or removes: the step protocol carries int8 deltas
MAX_STEP_DELTA = 127
(H_CLOCK, H_STEP, H_TERMINATED, H_APPLIED, H_COOLDOWN, H_SUBMITTED, H_SUBMITTED_INT, H_WAITING,
 H_WAITING_INT, H_FINISHED, H_RUNNING_JOBS, H_VM_COST, H_WAIT_JOB_S, H_REQUEUED, H_BUSY_CORE_S,
 H_LOST_CORE_S, H_WAITING_CORES, H_RUNNING_CORES, H_HEAD_CORES, H_MAX_FREE_CORES,
 H_SINCE_ACTION_S) = range(HEADER)


@dataclass(frozen=True)
class SimStep:
    """Decoded snapshots of several envs (leading axis = env)."""

    header: np.ndarray  # (E, 16)
    types: np.ndarray  # (E, T, 4): running, booting, can_add, can_remove
    raw: RawSnapshot

    @property
    def clock_s(self) -> np.ndarray:
        return self.header[:, H_CLOCK]

    @property
    def terminated(self) -> np.ndarray:
        return self.header[:, H_TERMINATED] > 0.5

    @property
    def applied(self) -> np.ndarray:
        return self.header[:, H_APPLIED] > 0.5

    @property
    def in_cooldown(self) -> np.ndarray:
        return self.header[:, H_COOLDOWN] > 0.5

    @property
    def vm_cost(self) -> np.ndarray:
        return self.header[:, H_VM_COST]

    @property
    def wait_job_seconds(self) -> np.ndarray:
        return self.header[:, H_WAIT_JOB_S]

    @property
    def running(self) -> np.ndarray:
        return self.types[:, :, 0].astype(np.int64)

    @property
    def booting(self) -> np.ndarray:
        return self.types[:, :, 1].astype(np.int64)

    @property
    def counts(self) -> np.ndarray:
        return self.running + self.booting

    @property
    def can_add(self) -> np.ndarray:
        return self.types[:, :, 2] > 0.5

    @property
    def can_remove(self) -> np.ndarray:
        return self.types[:, :, 3] > 0.5

    def row(self, i: int) -> "SimStep":
        sl = slice(i, i + 1)
        r = self.raw
        return SimStep(self.header[sl], self.types[sl], r.select(sl))


def record_width(n_types: int, n_slots: int) -> int:
    """Doubles per env record."""
    return HEADER + TYPE_FIELDS * n_types + VM_FIELDS * n_slots


def decode_records(buf: bytes, n_types: int, n_slots: int) -> SimStep:
    width = record_width(n_types, n_slots)
    flat = np.frombuffer(buf, dtype="<f8")
    if flat.size % width:
        raise SimulatorError(f"reply of {len(buf)} bytes is not a whole number of {width}-double records")
    rec = flat.reshape(-1, width)
    header = rec[:, :HEADER]
    types = rec[:, HEADER:HEADER + TYPE_FIELDS * n_types].reshape(-1, n_types, TYPE_FIELDS)
    vms = rec[:, HEADER + TYPE_FIELDS * n_types:].reshape(-1, n_slots, VM_FIELDS)
    raw = RawSnapshot(
        vm_type=vms[:, :, 0].astype(np.int64),
        vm_state=vms[:, :, 1].astype(np.int64),
        vm_cpu_busy=vms[:, :, 2],
        vm_ram_used_gb=vms[:, :, 3],
        vm_running_for_s=vms[:, :, 4],
        jobs_submitted_total=header[:, H_SUBMITTED],
        jobs_submitted_interval=header[:, H_SUBMITTED_INT],
        jobs_waiting_now=header[:, H_WAITING],
        jobs_waiting_interval=header[:, H_WAITING_INT],
        jobs_running=header[:, H_RUNNING_JOBS],
        jobs_waiting_cores=header[:, H_WAITING_CORES],
        jobs_running_cores=header[:, H_RUNNING_CORES],
        head_job_cores=header[:, H_HEAD_CORES],
        since_action_s=header[:, H_SINCE_ACTION_S],
    )
    return SimStep(header, types, raw)


def check_core_cap(workload: Workload, config: SimConfig) -> None:
    too_big = int(workload.cores.max())
    if too_big > config.job_core_cap:
        raise ValueError(
            f"workload {workload.name!r} has a {too_big}-core job but jobs may use at most "
            f"{config.job_core_cap} cores (cap it when loading: `core_cap`)"
        )


class BatchShape:
    """What every batch of simulations (here or on Ray workers) checks the same way."""

    config: SimConfig
    n_envs: int

    @property
    def n_types(self) -> int:
        return self.config.n_types

    @property
    def n_slots(self) -> int:
        return self.config.vm_slots

    _closed: bool

    def _check_open(self) -> None:
        # else a call on a closed Ray batch took its killed workers for lost ones and started new
        # JVMs that nothing would ever close
        if self._closed:
            raise BridgeError("this simulation batch is closed (its environment's close() was called)")

    def _env_index(self, env) -> int:
        # whole numbers only: int() made env 1.5 env 1 (another env's workload or job records)
        value = _whole(env)
        if value is None or not 0 <= value < self.n_envs:
            raise ValueError(f"env index must be a whole number within [0, {self.n_envs}), got {env!r}")
        return value

    def _reset_request(self, envs, seeds) -> tuple[np.ndarray, np.ndarray]:
        # each checked: the int64 casts reset env 1 for 1.5, ran seed 1 for 1.7 and named no seed for 2**63
        envs = np.asarray([self._env_index(x) for x in np.asarray(envs, dtype=object).reshape(-1)], dtype=np.int64)
        seeds = np.asarray([_episode_seed(x) for x in np.asarray(seeds, dtype=object).reshape(-1)], dtype=np.int64)
        if envs.shape != seeds.shape:
            raise ValueError("envs and seeds must have the same length")
        return envs, seeds

    def _step_request(self, deltas) -> np.ndarray:
        deltas = np.asarray(deltas)
        if deltas.shape != (self.n_envs, self.n_types):
            raise ValueError(f"deltas must have shape {(self.n_envs, self.n_types)}, got {deltas.shape}")
        numbers = deltas
        if deltas.dtype.kind == "O":  # e.g. a list mixing Python and NumPy numbers, or holding None
            try:
                numbers = deltas.astype(np.float64)
            except (TypeError, ValueError):
                numbers = None
        # the int8 cast would silently truncate 1.7 to 1, turn NaN into 0 (or garbage) and drop an
        # imaginary part; strings and None failed inside NumPy's isfinite with a TypeError
        if numbers is None or numbers.dtype.kind not in "iubf" or (
                numbers.dtype.kind == "f" and not (np.all(np.isfinite(numbers)) and np.all(numbers == np.rint(numbers)))):
            raise ValueError(f"deltas must be whole numbers, got {str(deltas.tolist())[:80]}")
        return numbers


def _whole(x) -> int | None:
    """`x` as a Python int when it is a whole number (an int, a NumPy integer, an integral float such
    as 20000.0 read from JSON), else None (bools are not numbers here)."""
    value = x.item() if isinstance(x, np.generic) else x
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def _episode_seed(seed) -> int:
    """A seed as the simulator's Java long: `int()` truncated 1.5 to 1 (another episode than asked,
    reported as seed 1), and 2**63 failed later with NumPy's OverflowError naming no seed."""
    value = _whole(seed)
    if value is None or not -2**63 <= value < 2**63:
        raise ValueError(f"an episode seed must be a whole number in [-2**63, 2**63), got {seed!r}")
    return value


class SimBatch(BatchShape):
    """`n_envs` simulations under one config, hosted by one JVM; every env starts with the same
    workload and `set_workload` gives one env another (training on a workload distribution)."""

    def __init__(self, config: SimConfig, workload: Workload, n_envs: int, gateway: Gateway | None = None,
                 fast: bool = True):
        """`fast`: step and reset over the gateway's raw-socket step channel (default) instead of
        Py4J calls; both return the same bytes."""
        if _whole(n_envs) is None or n_envs < 1:
            # a NumPy integer reached Py4J as an AttributeError, a float as "method does not exist"
            raise ValueError(f"n_envs must be a whole number >= 1, got {n_envs!r}")
        n_envs = int(n_envs)
        check_core_cap(workload, config)
        self.config = config
        self.workload = workload
        self.n_envs = n_envs
        self.fleet = FleetSpec.from_vm_types(config.vm_types)
        self.gateway = gateway or shared_gateway()
        self._workload_id = self.gateway.call("loadWorkload", bytearray(workload.pack()))
        try:
            self._id = self.gateway.call("createBatch", config.java_json(), self._workload_id, n_envs)
        except BaseException:
            self._closed = True  # nothing for close() (or __del__) to free but the workload, freed here
            self._free_workload()  # else every rejected config leaves its job list in the JVM for good
            raise
        self._closed = False
        self.fast = fast
        self.workloads = [workload] * n_envs
        # envs a step may or may not have moved: a step the client gave up on (a time-out, a
        # Ctrl-C) still runs in the JVM, so stepping on would leave them one interval ahead unseen
        self._unsure: set[int] = set()

    def set_workload(self, env: int, workload: Workload) -> None:
        """Env `env` replays `workload` from its next reset on."""
        self._check_open()
        env = self._env_index(env)
        check_core_cap(workload, self.config)
        self.gateway.call("setEnvWorkload", self._id, env, bytearray(workload.pack()))
        self.workloads[env] = workload

    def reset(self, envs, seeds) -> SimStep:
        return decode_records(self.reset_records(envs, seeds), self.n_types, self.n_slots)

    def step(self, deltas: np.ndarray) -> SimStep:
        return decode_records(self.step_records(deltas), self.n_types, self.n_slots)

    def reset_records(self, envs, seeds) -> bytes:
        """`reset` as the simulator's packed records (one per env, in the order asked)."""
        self._check_open()
        envs, seeds = self._reset_request(envs, seeds)
        req = np.zeros(len(envs), dtype=[("env", "<i4"), ("seed", "<i8")])
        req["env"], req["seed"] = envs, seeds
        payload = struct.pack("<i", len(envs)) + req.tobytes()
        if self.fast:
            records = self.gateway.step_channel().reset(self._id, payload)
        else:
            records = base64.b64decode(self.gateway.call("reset", self._id, bytearray(payload)))
        self._unsure.difference_update(envs.tolist())
        return records

    def step_records(self, deltas: np.ndarray) -> bytes:
        """`step` as the simulator's packed records (one per env)."""
        self._check_open()
        deltas = self._step_request(deltas)
        if self._unsure:
            raise BridgeError(f"env(s) {sorted(self._unsure)} may have stepped in a step that did not answer "
                              "(a time-out or an interrupt): reset them before the next step")
        payload = np.clip(deltas, -MAX_STEP_DELTA, MAX_STEP_DELTA).astype(np.int8).tobytes()
        try:
            if self.fast:
                return self.gateway.step_channel().step(self._id, payload)
            return base64.b64decode(self.gateway.call("step", self._id, bytearray(payload)))
        except SimulatorError:
            raise  # the JVM answered: it refused the step, or failed it and wants a reset itself
        except BaseException:
            self._unsure.update(range(self.n_envs))
            raise

    def job_stats(self, env: int) -> np.ndarray:
        """(n_jobs, 5): arrival_s, start_s, finish_s, wait_s, restarts (-1 = not yet)."""
        self._check_open()
        reply = self.gateway.call("jobStats", self._id, self._env_index(env))
        return np.frombuffer(base64.b64decode(reply), dtype="<f8").reshape(-1, 5)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.gateway.alive():
            try:
                self.gateway.call("closeBatch", self._id)
                self.gateway.call("closeWorkload", self._workload_id)
            except Exception:  # noqa: BLE001 - best effort at shutdown
                pass

    def _free_workload(self) -> None:
        try:
            if self.gateway.alive():
                self.gateway.call("closeWorkload", self._workload_id)
        except Exception:  # noqa: BLE001 - best effort: the original error is the one to report
            pass

    def __del__(self) -> None:  # pragma: no cover - GC timing
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass
