"""The pieces a workload mix is sampled from: cached SWF traces and their windows, the
seed-1551-like batch generator, the diurnal/bursty Poisson generator, and the load measure
that every source is scaled to (`offered_load`).

All of it is deterministic for a given `np.random.Generator`; the rules (what is thinned, how
the load scale acts, what counts as an absurd window) are described in docs/workloads.md,
"Workload mixes (training distribution)".
"""
from __future__ import annotations

import math
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config import SimConfig
from .model import Workload
from .swf import F_ALLOC, F_REQ_MEM, F_REQ_PROCS, F_RUN, F_SUBMIT, F_USED_MEM, read_swf_table

RAM_GB_PER_CORE = 0.5  # the default of `SwfTransform` and of seed-1551
CACHE_FORMAT = "v1"  # bump when the cached columns change, so stale .npz files are ignored


# --------------------------------------------------------------------------------- locations
def pwa_dir() -> Path:
    """The Parallel Workloads Archive traces: `$SAMM_PWA_DIR`, else `../shared/data/pwa-swf`
    next to the repository. Raises FileNotFoundError naming the path when it is missing."""
    env = os.environ.get("SAMM_PWA_DIR")
    path = Path(env).expanduser() if env else Path(__file__).resolve().parents[3] / "shared" / "data" / "pwa-swf"
    if not path.is_dir():
        how = "$SAMM_PWA_DIR" if env else "the default location (set SAMM_PWA_DIR to override)"
        raise FileNotFoundError(f"SWF trace directory not found: {path} ({how})")
    return path


def resolve_trace(trace: str | Path) -> Path:
    """An absolute path as it is; a relative name under `pwa_dir()`."""
    p = Path(trace).expanduser()
    path = p if p.is_absolute() else pwa_dir() / p
    if not path.is_file():
        raise FileNotFoundError(f"SWF trace not found: {path}")
    return path


def cache_dir() -> Path:
    return Path.home() / ".cache" / "samm" / "swf"


# ------------------------------------------------------------------------------ trace cache
@dataclass(frozen=True)
class TraceJobs:
    """The jobs of one trace that put load on a cluster (run time > 0), sorted by submission.
    `offset_s` is measured from the first such submission, exactly as `load_swf` does, so a
    window built from here is byte-identical to `load_swf` with the same window."""

    name: str
    offset_s: np.ndarray  # float64, non-decreasing
    run_s: np.ndarray  # float64, > 0
    cores: np.ndarray  # int32, max(requested, allocated, 1), not capped
    ram_gb: np.ndarray  # float64, as `load_swf` derives it

    @property
    def n_jobs(self) -> int:
        return len(self.offset_s)

    @property
    def span_s(self) -> float:
        return float(self.offset_s[-1])


_MEMORY: dict[tuple[str, int, int], TraceJobs] = {}


def _parse(path: Path) -> TraceJobs:
    table = read_swf_table(path)
    table = table[table[:, F_RUN] > 0]
    if len(table) == 0:
        raise ValueError(f"{path}: no job with a positive run time")
    table = table[np.argsort(table[:, F_SUBMIT], kind="stable")]
    cores = np.maximum.reduce([table[:, F_REQ_PROCS], table[:, F_ALLOC], np.ones(len(table))]).astype(np.int32)
    per_proc_kb = np.where(table[:, F_USED_MEM] > 0, table[:, F_USED_MEM], table[:, F_REQ_MEM])
    ram_gb = np.where(per_proc_kb > 0, per_proc_kb * cores / 1024.0**2, RAM_GB_PER_CORE * cores)
    return TraceJobs(name=path.name, offset_s=table[:, F_SUBMIT] - table[0, F_SUBMIT], run_s=table[:, F_RUN].copy(),
                     cores=cores, ram_gb=ram_gb.astype(np.float64))


def load_trace(trace: str | Path) -> TraceJobs:
    """A trace's jobs, cached in this process and on disk (`~/.cache/samm/swf/*.npz`, keyed by
    file name, size and modification time): parsing the 447k-job RICC log costs about half a
    second per process, the cached arrays a few milliseconds."""
    path = resolve_trace(trace)
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key in _MEMORY:
        return _MEMORY[key]
    cached = cache_dir() / f"{path.name}-{st.st_size}-{st.st_mtime_ns}-{CACHE_FORMAT}.npz"
    jobs = None
    if cached.is_file():
        try:
            with np.load(cached) as z:
                jobs = TraceJobs(path.name, z["offset_s"], z["run_s"], z["cores"], z["ram_gb"])
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
            jobs = None  # a damaged cache file is re-parsed and rewritten
    if jobs is None:
        jobs = _parse(path)
        _write_cache(cached, jobs)
    _MEMORY[key] = jobs
    return jobs


def _write_cache(target: Path, jobs: TraceJobs) -> None:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp.npz")
        np.savez(tmp, offset_s=jobs.offset_s, run_s=jobs.run_s, cores=jobs.cores, ram_gb=jobs.ram_gb)
        os.replace(tmp, target)  # atomic: a concurrent reader sees the old file or the whole new one
    except OSError:
        pass  # a read-only home only costs the parse next time


def clear_trace_cache() -> None:
    """Forget the in-process cache (the disk cache stays)."""
    _MEMORY.clear()


# ------------------------------------------------------------------------------- load measure
def span_seconds(workload: Workload, sim: SimConfig) -> float:
    """The simulated time over which the workload's jobs arrive: from the episode's start to the
    last arrival (a Workload carries no window end), at least one step."""
    return max(float(workload.arrival_s[-1]), sim.step_seconds)


def offered_load(workload: Workload, sim: SimConfig) -> float:
    """Offered core-hours / (the fleet's maximum cores × span hours): 1.0 means the whole fleet at
    its maximum size would be busy for the whole arrival period. Run time = length / host MIPS on
    each of the job's cores (the `Workload` convention)."""
    return workload.core_seconds(sim.host_mips) / (sim.max_fleet_cores * span_seconds(workload, sim))


def subset(workload: Workload, keep: np.ndarray, name: str | None = None) -> Workload:
    return Workload(name or workload.name, workload.arrival_s[keep], workload.length_mi[keep],
                    workload.cores[keep], workload.ram_gb[keep])


def scale_to_load(workload: Workload, sim: SimConfig, target: float, name: str | None = None) -> Workload:
    """Multiply every job's length by one factor so that `offered_load` equals `target` (arrivals,
    cores and RAM unchanged)."""
    factor = target / offered_load(workload, sim)
    return Workload(name or workload.name, workload.arrival_s, workload.length_mi * factor, workload.cores,
                    workload.ram_gb)


def thin_and_scale(workload: Workload, sim: SimConfig, target: float, rng: np.random.Generator,
                   max_jobs: int, thin_min_jobs: int, max_length_factor: float = math.inf,
                   name: str | None = None) -> Workload | None:
    """The load scale of a trace window. A uniform random subset of round(p × n) jobs is kept,
    p = min(1, max(target / load, thin_min_jobs / n), max_jobs / n): a window heavier than the
    target loses a share of its jobs (a subset of the cluster's users; run times, cores and the
    arrival pattern stay real) but keeps at least `thin_min_jobs`, and no window keeps more than
    `max_jobs`. The kept jobs' lengths are then multiplied by the one factor f that makes the
    offered load exactly `target` (≈ 1 when thinning alone got there; < 1 when the job floor
    stopped it; > 1 for a window lighter than the target). None when f lies outside
    [1 / max_length_factor, max_length_factor] (the window would no longer look like its trace)."""
    n = workload.n_jobs
    load = offered_load(workload, sim)
    p = min(1.0, max(target / load, thin_min_jobs / n), max_jobs / n)
    if p < 1.0:
        # exactly round(p n) jobs, a uniform random subset, so `max_jobs` is a hard cap
        keep = np.sort(rng.choice(n, size=max(1, min(max_jobs, round(p * n))), replace=False))
        workload = subset(workload, keep)
    factor = target / offered_load(workload, sim)
    if not 1.0 / max_length_factor <= factor <= max_length_factor:
        return None
    return scale_to_load(workload, sim, target, name)


# ------------------------------------------------------------------------------ trace windows
def trace_window(jobs: TraceJobs, start_s: float, hours: float, compression: float, sim: SimConfig,
                 keep: str, name: str) -> Workload | None:
    """Jobs submitted in [start, start + hours) of trace time, re-based to the window start;
    arrivals and run times divided by `compression`; lengths = run time × host MIPS; cores capped
    at `sim.job_core_cap` keeping the job's core-seconds (`keep="work"`) or its run time
    (`"runtime"`). None when the window holds no job. With keep="work", compression 1 and the
    default host MIPS this equals `load_swf(path, SwfTransform(window...), core_cap=...)`."""
    lo, hi = np.searchsorted(jobs.offset_s, [start_s, start_s + hours * 3600.0], side="left")
    if hi <= lo:
        return None
    sl = slice(lo, hi)
    arrival = (jobs.offset_s[sl] - start_s) / compression
    runtime = jobs.run_s[sl] / compression
    w = Workload(name, arrival.astype(np.float64), (runtime * sim.host_mips).astype(np.float64),
                 jobs.cores[sl].copy(), jobs.ram_gb[sl].copy())
    return w.cap_cores(sim.job_core_cap, keep=keep)


def overlay_starts(jobs: TraceJobs, start_s: float, hours: float, m: int) -> list[float]:
    """The window and the m - 1 windows that follow it in the trace, wrapping to the trace's
    start past its end."""
    length = hours * 3600.0
    room = max(jobs.span_s - length, length)
    return [start_s if j == 0 else (start_s + j * length) % room for j in range(m)]


def window_at_load(jobs: TraceJobs, start_s: float, hours: float, compression: float, sim: SimConfig, keep: str,
                   load: float, rng: np.random.Generator, *, max_jobs: int, thin_min_jobs: int, max_overlay: int,
                   max_length_factor: float = math.inf, name: str) -> Workload | None:
    """A trace window scaled to offered load `load`. Lighter than the target: the windows that
    follow it are overlaid on it (re-based to the same start, as if more users shared the fleet),
    m = round(target / load) windows in all, at most `max_overlay`. Then `thin_and_scale`: thinning
    to the target (or to `max_jobs`) and one exact length factor. None when nothing is left
    or the factor is out of bounds."""
    w = trace_window(jobs, start_s, hours, compression, sim, keep, name)
    if w is None:
        return None
    # round, not ceil: a window at 0.99 of the target is stretched by 1 %, not mixed half-and-half with the next
    m = min(max_overlay, math.floor(load / offered_load(w, sim) + 0.5))
    if m > 1:
        parts = [w] + [trace_window(jobs, s, hours, compression, sim, keep, name)
                       for s in overlay_starts(jobs, start_s, hours, m)[1:]]
        parts = [p for p in parts if p is not None]
        arrival = np.concatenate([p.arrival_s for p in parts])
        order = np.argsort(arrival, kind="stable")
        w = Workload(name, arrival[order], np.concatenate([p.length_mi for p in parts])[order],
                     np.concatenate([p.cores for p in parts])[order],
                     np.concatenate([p.ram_gb for p in parts])[order])
    return thin_and_scale(w, sim, load, rng, max_jobs, thin_min_jobs, max_length_factor, name)


# -------------------------------------------------------------------------------- generators
def _categorical(rng: np.random.Generator, probs: dict[int, float], n: int, cap: int) -> np.ndarray:
    values = np.array(sorted(probs), dtype=np.int32)
    p = np.array([probs[v] for v in values], dtype=np.float64)
    cores = rng.choice(values, size=n, p=p / p.sum())
    return np.minimum(cores, cap).astype(np.int32)  # a smaller fleet's cap keeps the job winnable


def _jobs_for(load: float, sim: SimConfig, span_s: float, mean_cores: float, mean_run_s: float,
              min_jobs: int, max_jobs: int) -> int:
    """How many jobs of this mean size fill `load` of the fleet over `span_s`, kept within
    [2 × min_jobs, max_jobs] (the run times then absorb the difference when scaled to the load)."""
    n = load * sim.max_fleet_cores * span_s / (mean_cores * mean_run_s)
    return int(np.clip(round(n), 2 * min_jobs, max_jobs))


def batch_workload(rng: np.random.Generator, sim: SimConfig, *, span_s: float, load: float, batches: int,
                   idle_start_s: float, interval_jitter: float, run_s: float, run_sigma: float, size_sigma: float,
                   cores: dict[int, float], min_jobs: int, max_jobs: int, name: str) -> Workload:
    """Batches of independent jobs like `seed-1551`: the first batch after an idle start, the
    last at `span_s`; gaps equal up to ±`interval_jitter`; batch sizes ∝ lognormal(0, size_sigma)
    weights (at least one job each); run times `run_s` × lognormal(0, run_sigma); cores from the
    categorical `cores`. The job count is what fills `load` at these sizes, then lengths are
    scaled so that the offered load is exactly `load`."""
    gaps = 1.0 + interval_jitter * rng.uniform(-1.0, 1.0, batches - 1)
    times = idle_start_s + np.concatenate([[0.0], np.cumsum(gaps)]) * (span_s - idle_start_s) / gaps.sum()
    weights = rng.lognormal(0.0, size_sigma, batches)
    mean_cores = float(sum(k * v for k, v in cores.items()) / sum(cores.values()))
    n = max(_jobs_for(load, sim, span_s, mean_cores, run_s * np.exp(run_sigma**2 / 2), min_jobs, max_jobs), batches)
    sizes = 1 + np.floor(weights / weights.sum() * (n - batches)).astype(int)
    sizes[np.argsort(-weights)[: n - sizes.sum()]] += 1  # largest remainders, roughly: the total is exactly n
    arrival = np.repeat(times, sizes)
    c = _categorical(rng, cores, n, sim.job_core_cap)
    runtime = run_s * rng.lognormal(0.0, run_sigma, n)
    w = Workload(name, arrival, runtime * sim.host_mips, c, RAM_GB_PER_CORE * c.astype(np.float64))
    return scale_to_load(w, sim, load)


def poisson_workload(rng: np.random.Generator, sim: SimConfig, *, span_s: float, load: float, amplitude: float,
                     period_s: float, phase: float, bursts: list[tuple[float, float, float]], run_median_s: float,
                     run_sigma: float, cores: dict[int, float], min_jobs: int, max_jobs: int,
                     name: str) -> Workload:
    """A non-homogeneous Poisson process on [0, span_s]: rate λ(t) = base × (1 + a·sin(2πt/P + φ))
    × k inside each burst (start, duration, k); run times lognormal (median `run_median_s`, log-sd
    `run_sigma`); cores categorical. `base` is set so the expected job count fills `load`; the
    count is Poisson, the arrivals follow λ exactly (inverse of its integral on a 10-s grid),
    then lengths are scaled so that the offered load is exactly `load`."""
    grid = np.append(np.arange(0.0, span_s, 10.0), span_s)
    shape = 1.0 + amplitude * np.sin(2 * np.pi * grid / period_s + phase)
    for start, duration, factor in bursts:
        shape[(grid >= start) & (grid < start + duration)] *= factor
    cum = np.concatenate([[0.0], np.cumsum((shape[1:] + shape[:-1]) / 2 * np.diff(grid))])
    if not math.isfinite(cum[-1]):  # overlapping bursts multiply their factors: 1e200 twice is inf
        raise ValueError(f"{name}: the arrival rate overflows ({len(bursts)} bursts, factors up to "
                         f"{max(f for _, _, f in bursts):g}); lower burst_factor or bursts_per_h")
    mean_cores = float(sum(k * v for k, v in cores.items()) / sum(cores.values()))
    expected = _jobs_for(load, sim, span_s, mean_cores, run_median_s * np.exp(run_sigma**2 / 2), min_jobs, max_jobs)
    n = int(np.clip(rng.poisson(expected), min_jobs, max_jobs))
    arrival = np.sort(np.interp(rng.uniform(0.0, cum[-1], n), cum, grid))
    c = _categorical(rng, cores, n, sim.job_core_cap)
    runtime = run_median_s * rng.lognormal(0.0, run_sigma, n)
    w = Workload(name, arrival, runtime * sim.host_mips, c, RAM_GB_PER_CORE * c.astype(np.float64))
    return scale_to_load(w, sim, load)
