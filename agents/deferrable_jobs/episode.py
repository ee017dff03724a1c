"""What one episode replays: the jobs (one row each, in submission order) and the capacity left
for deferrable jobs in each slot. Produced by `data.py` (or by hand in tests), consumed by the
simulator, the heuristics and the live driver."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


ROW_FIELDS = ("cores", "duration", "earliest", "latest", "submit")


def _whole_numbers(name: str, values) -> np.ndarray:
    """`values` as a 1-D int64 array. A NaN passed every range check below (comparisons with NaN
    are false) and a fractional duration crashed the simulator mid-episode, so both are refused."""
    a = np.asarray(values)
    if a.ndim != 1:
        raise ValueError(f"episode: {name} must be a 1-D series, got shape {a.shape}")
    if np.issubdtype(a.dtype, np.integer):
        return a if a.dtype == np.int64 else a.astype(np.int64)
    if a.dtype == bool or not np.issubdtype(a.dtype, np.floating):
        raise ValueError(f"episode: {name} must hold whole numbers, got dtype {a.dtype}")
    bad = ~np.isfinite(a) | (a != np.round(a))
    if bad.any():
        raise ValueError(f"episode: {name} must hold finite whole numbers, got {a[bad][:3].tolist()}")
    return a.astype(np.int64)


@dataclass(frozen=True)
class Episode:
    cores: np.ndarray      # [J] int, c_i
    duration: np.ndarray   # [J] int slots, d_i >= 1
    earliest: np.ndarray   # [J] int slot, e_i
    latest: np.ndarray     # [J] int slot, l_i >= e_i
    submit: np.ndarray     # [J] int slot, g_i <= e_i; rows sorted by (submit, earliest)
    capacity: np.ndarray   # [T] int cores left after on-demand use, C_t

    def __post_init__(self):
        for name in ("cores", "duration", "earliest", "latest", "submit", "capacity"):
            # a read-only copy: one episode is replayed by every tuning candidate and every method,
            # and a decide function writing into it (or the caller's array) changed it for the next
            a = np.array(_whole_numbers(name, getattr(self, name)), dtype=np.int64)
            a.setflags(write=False)
            object.__setattr__(self, name, a)
        n = len(self.cores)
        for name in ("duration", "earliest", "latest", "submit"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"episode: {name} has {len(getattr(self, name))} rows, cores has {n}")
        if n:
            if (self.cores < 1).any():
                raise ValueError("episode: every job needs at least one core")
            if (self.duration < 1).any():
                raise ValueError("episode: every job lasts at least one slot")
            if (self.submit > self.earliest).any() or (self.earliest > self.latest).any():
                raise ValueError("episode: each job needs submit <= earliest <= latest")
            if (np.diff(self.submit) < 0).any():
                raise ValueError("episode: jobs must be in submission order")
        if len(self.capacity) < 1 or not np.isfinite(self.capacity).all() or (self.capacity < 0).any():
            raise ValueError("episode: capacity must be a non-empty series of cores >= 0")

    @property
    def n_jobs(self) -> int:
        return len(self.cores)

    @property
    def slots(self) -> int:
        return len(self.capacity)

    @property
    def revenue(self) -> np.ndarray:
        """r_i = c_i * d_i (§3.1)."""
        return self.cores * self.duration

    @classmethod
    def from_rows(cls, rows, capacity) -> "Episode":
        """rows of (cores, duration, earliest, latest, submit), in any order."""
        rows = list(rows)
        bad = next((r for r in rows if np.ndim(r) != 1 or len(r) != len(ROW_FIELDS)), None)
        if bad is not None:
            # six-field rows were reshaped into other jobs in silence, four-field ones an IndexError
            raise ValueError(f"episode: each row needs the {len(ROW_FIELDS)} fields {ROW_FIELDS}, got {bad!r}")
        # float, not int64: a NaN or fractional field is then named by the checks instead of
        # failing the cast or being truncated silently
        a = np.asarray(sorted(rows, key=lambda r: (r[4], r[2])), dtype=np.float64).reshape(-1, 5)
        # the capacity too: cast here, 10.7 cores became 10 and -0.5 became 0 in silence
        return cls(cores=a[:, 0], duration=a[:, 1], earliest=a[:, 2], latest=a[:, 3], submit=a[:, 4],
                   capacity=np.asarray(capacity, dtype=np.float64))

    def realtime(self) -> "Episode":
        """Table 2's real-time variant: every job must start in the slot it is submitted."""
        return Episode(cores=self.cores, duration=self.duration, earliest=self.submit.copy(),
                       latest=self.submit.copy(), submit=self.submit, capacity=self.capacity)
