"""Standard Workload Format (SWF 2.2, the Parallel Workloads Archive) readers and transforms.

Transforms, applied in this order (all documented in docs/workloads.md):

1. Jobs whose run time is unknown or not positive (field 4 <= 0, e.g. cancelled before start)
   are dropped: they put no load on a cluster.
2. Time window: keep jobs submitted in ``[window_start_s, window_end_s)``, measured from the
   trace's first submission; arrivals are re-based to the window start.
3. Time compression ``c``: arrival offsets and run times are divided by ``c``.
4. Cores = max(requested, allocated, 1) (CloudSim Plus's reader does the same), then capped at
   ``max_cores`` (default: the largest VM type) keeping the job's core-seconds
   (``core_cap_keep="work"``) or its run time (``"runtime"``).
5. Length in MI per core = run time × ``mips_per_core`` (the speed the trace's run times are
   taken to be measured at; equal to the simulated host MIPS it keeps run times unchanged).
6. RAM = used memory per processor (field 7, KB) × cores, else requested memory (field 10),
   else ``ram_gb_per_core`` × cores.
"""
from __future__ import annotations

import gzip
import io
import zlib
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from .model import INT32_MAX, Workload

F_SUBMIT, F_RUN, F_ALLOC, F_USED_MEM, F_REQ_PROCS, F_REQ_MEM = 1, 3, 4, 6, 7, 9


class SwfTransform(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    window_start_s: float = Field(default=0.0, ge=0)
    window_end_s: float | None = Field(default=None, gt=0)
    time_compression: float = Field(default=1.0, gt=0)
    max_cores: int | None = Field(default=None, ge=1)
    core_cap_keep: Literal["work", "runtime"] = "work"
    mips_per_core: float = Field(default=4400.0, gt=0)
    ram_gb_per_core: float = Field(default=0.5, gt=0)
    max_jobs: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _window(self) -> "SwfTransform":
        if self.window_end_s is not None and self.window_end_s <= self.window_start_s:
            raise ValueError("window_end_s must be after window_start_s")
        return self


SWF_FIELDS = 18
FIELD_NAMES = ("job number", "submit time", "wait time", "run time", "allocated processors", "average CPU time",
               "used memory", "requested processors", "requested time", "requested memory", "status", "user id",
               "group id", "executable", "queue", "partition", "preceding job", "think time")


def _is_record(line: str) -> bool:
    """Not blank, not an SWF header line (';'), not only a '#' comment (np.loadtxt skips those)."""
    return bool(line.split("#", 1)[0].strip()) and not line.lstrip().startswith(";")


def read_swf_table(path: str | Path) -> np.ndarray:
    """The trace's records as an (n, 18) float array; header (';') and blank lines skipped.
    Accepts plain and gzip-compressed files. A malformed record is a ValueError naming the
    file, the line and the field."""
    path = Path(path)
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:  # EOFError: a truncated download
            raise ValueError(f"{path}: not a readable gzip file ({exc})") from None
    lines = raw.decode("utf-8", errors="replace").splitlines()
    rows = [ln for ln in lines if _is_record(ln)]
    if not rows:
        raise ValueError(f"{path}: no job records found (is it an SWF file?)")
    try:
        table = np.loadtxt(io.StringIO("\n".join(rows)), dtype=np.float64, ndmin=2)
    except ValueError:
        table = _parse_records_line_by_line(path, lines)  # slow, but names the bad line
    if table.shape[1] < SWF_FIELDS:
        raise ValueError(f"{path}: SWF records need 18 fields, found {table.shape[1]}")
    table = table[:, :SWF_FIELDS]
    _check_values(path, table, lines)
    return table


def _parse_records_line_by_line(path: Path, lines: list[str]) -> np.ndarray:
    table = []
    for number, line in enumerate(lines, start=1):
        if not _is_record(line):
            continue
        fields = line.split("#", 1)[0].split()  # '#' starts a comment, as for np.loadtxt
        if len(fields) < SWF_FIELDS:
            raise ValueError(f"{path} line {number}: an SWF record needs 18 fields, found {len(fields)}")
        values = []
        for k, token in enumerate(fields[:SWF_FIELDS]):
            try:
                values.append(float(token))
            except ValueError:
                raise ValueError(f"{path} line {number}: field {k + 1} ({FIELD_NAMES[k]}) is not a number: "
                                 f"{token[:20]!r}") from None
        table.append(values)
    return np.array(table, dtype=np.float64).reshape(-1, SWF_FIELDS)


def _check_values(path: Path, table: np.ndarray, lines: list[str]) -> None:
    """NaN or infinite fields (no SWF writer emits them) and processor counts beyond int32 would
    drop jobs silently or wrap around to a negative core count: name them instead."""
    bad = ~np.isfinite(table)
    procs = [F_ALLOC, F_REQ_PROCS]
    bad[:, procs] |= table[:, procs] > INT32_MAX
    if not bad.any():
        return
    row, col = (int(x) for x in np.argwhere(bad)[0])
    number = [i for i, ln in enumerate(lines, start=1) if _is_record(ln)][row]
    value = table[row, col]
    problem = "out of range" if np.isfinite(value) else "not a finite number"
    raise ValueError(f"{path} line {number}: field {col + 1} ({FIELD_NAMES[col]}) is {value:g}, {problem}")


def load_swf(path: str | Path, transform: SwfTransform | None = None, default_core_cap: int | None = None) -> Workload:
    t = transform or SwfTransform()
    table = read_swf_table(path)
    table = table[table[:, F_RUN] > 0]
    if len(table) == 0:
        raise ValueError(f"{path}: no job with a positive run time")
    table = table[np.argsort(table[:, F_SUBMIT], kind="stable")]
    offset = table[:, F_SUBMIT] - table[0, F_SUBMIT]
    keep = offset >= t.window_start_s
    if t.window_end_s is not None:
        keep &= offset < t.window_end_s
    table, offset = table[keep], offset[keep]
    if t.max_jobs is not None:
        table, offset = table[: t.max_jobs], offset[: t.max_jobs]
    if len(table) == 0:
        raise ValueError(f"{path}: the time window [{t.window_start_s}, {t.window_end_s}) holds no job")

    arrival = (offset - t.window_start_s) / t.time_compression
    runtime = table[:, F_RUN] / t.time_compression
    cores = np.maximum.reduce([table[:, F_REQ_PROCS], table[:, F_ALLOC], np.ones(len(table))]).astype(np.int32)
    per_proc_kb = np.where(table[:, F_USED_MEM] > 0, table[:, F_USED_MEM], table[:, F_REQ_MEM])
    ram_gb = np.where(per_proc_kb > 0, per_proc_kb * cores / 1024.0**2, t.ram_gb_per_core * cores)

    workload = Workload(
        name=Path(path).name,
        arrival_s=arrival.astype(np.float64),
        length_mi=(runtime * t.mips_per_core).astype(np.float64),
        cores=cores,
        ram_gb=ram_gb.astype(np.float64),
    )
    cap = t.max_cores or default_core_cap
    return workload.cap_cores(cap, keep=t.core_cap_keep) if cap else workload
