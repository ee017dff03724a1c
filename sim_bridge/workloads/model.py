"""A workload: the jobs to replay, as columns (sorted by arrival)."""
from __future__ import annotations

import hashlib
import numbers
import struct
from dataclasses import dataclass

import numpy as np

INT32_MAX = 2**31 - 1  # `pack` sends cores as int32


@dataclass(frozen=True)
class Workload:
    name: str
    arrival_s: np.ndarray  # float64, seconds from the start of the episode, non-decreasing
    length_mi: np.ndarray  # float64, MI executed on EACH of the job's cores (CloudSim semantics)
    cores: np.ndarray  # int32, >= 1
    ram_gb: np.ndarray  # float64, RAM the job holds while it runs

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        for col in ("arrival_s", "length_mi", "cores", "ram_gb"):
            if np.ndim(getattr(self, col)) != 1:  # `pack` writes flat columns: a 2-D one would be garbage
                raise ValueError(f"workload {self.name!r}: column {col} must be one-dimensional")
            if len(getattr(self, col)) != n:
                raise ValueError(f"workload {self.name!r}: column {col} has a different length")
        if n == 0:
            raise ValueError(f"workload {self.name!r} has no jobs")
        if np.any(np.diff(self.arrival_s) < 0):
            raise ValueError(f"workload {self.name!r}: arrivals must be sorted")
        if np.any(~np.isfinite(self.arrival_s)) or np.any(self.arrival_s < 0):
            raise ValueError(f"workload {self.name!r}: arrivals must be finite and >= 0")
        if np.any(~(self.length_mi > 0)) or np.any(np.isinf(self.length_mi)):
            raise ValueError(f"workload {self.name!r}: every job needs a positive, finite length")
        if np.any(~np.isfinite(self.ram_gb)) or np.any(self.ram_gb < 0):
            raise ValueError(f"workload {self.name!r}: every job's RAM must be finite and >= 0")
        self._check_cores()
        if np.any(self.cores < 1):
            raise ValueError(f"workload {self.name!r}: every job needs at least one core")

    def _check_cores(self) -> None:
        """`pack` casts cores to int32: 1.5 ran on 1 core while `core_seconds` (the reward scale, the
        offered load) counted 1.5, NaN became a garbage count and 2**32 + 1 wrapped to 1."""
        cores = np.asarray(self.cores)
        if cores.dtype.kind not in "iuf":  # bools, strings, objects
            raise ValueError(f"workload {self.name!r}: cores must be whole numbers, got {cores.dtype} values")
        bad = cores > INT32_MAX
        if cores.dtype.kind == "f":
            bad |= ~np.isfinite(cores) | (cores != np.floor(cores))
        if np.any(bad):
            j = int(np.argmax(bad))
            raise ValueError(f"workload {self.name!r}: job {j} needs {cores[j]} cores; cores must be whole "
                             f"numbers in [1, {INT32_MAX}]")

    @property
    def n_jobs(self) -> int:
        return len(self.arrival_s)

    def runtime_s(self, host_mips: float) -> np.ndarray:
        return self.length_mi / host_mips

    def core_seconds(self, host_mips: float) -> float:
        return float(np.sum(self.runtime_s(host_mips) * self.cores))

    def pack(self) -> bytes:
        """Struct-of-arrays bytes for the Java gateway's `loadWorkload` (little-endian)."""
        return b"".join(
            [
                struct.pack("<i", self.n_jobs),
                self.arrival_s.astype("<f8").tobytes(),
                self.length_mi.astype("<f8").tobytes(),
                self.cores.astype("<i4").tobytes(),
                self.ram_gb.astype("<f8").tobytes(),
            ]
        )

    def digest(self) -> str:
        return hashlib.sha256(self.pack()).hexdigest()[:16]

    def cap_cores(self, cap: int, keep: str = "work") -> "Workload":
        """Cap every job's cores at `cap` (multi-core jobs run on one VM). `keep="work"` keeps
        the job's core-seconds (it runs longer on fewer cores), `"runtime"` keeps its duration."""
        if keep not in ("work", "runtime"):
            raise ValueError(f"keep must be 'work' or 'runtime', got {keep!r}")
        # a fractional cap would scale the work by cores / cap but round the cores down; NaN caps nothing
        if not isinstance(cap, numbers.Integral) or cap < 1:
            raise ValueError(f"workload {self.name!r}: core cap must be an integer >= 1, got {cap!r}")
        over = self.cores > cap
        if not np.any(over):
            return self
        length = self.length_mi.copy()
        if keep == "work":
            length[over] = length[over] * self.cores[over] / cap
        cores = np.minimum(self.cores, cap).astype(np.int32)
        ram = self.ram_gb * cores / self.cores  # keep RAM per core: the job must still fit a VM
        return Workload(self.name, self.arrival_s, length, cores, ram)
