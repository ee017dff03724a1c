"""A workload distribution ("mix"): a seeded object that gives every training episode its own
workload, drawn from windows of real SWF traces (the TRAINING split only), the Lublin model log,
a seed-1551-like batch generator and a diurnal/bursty Poisson generator, each scaled to a target
offered load. The fixed train/test split and the test windows of the generalisation suite live
here too, so that nothing else has to know which trace is which.

    mix = load_mix()                        # the shipped default (mixes/default.yaml)
    sampler = mix.sampler(SimConfig(), seed=7)
    w = sampler.sample()                    # e.g. "LANL-CM5-1994@d12.3+18h/c4.0/L0.85"

Every rule and range is documented in docs/workloads.md, "Workload mixes (training distribution)".
"""
from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Hashable
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Literal, Union

import numpy as np
import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..config import SimConfig
from .generators import (
    batch_workload,
    load_trace,
    offered_load,
    poisson_workload,
    pwa_dir,
    resolve_trace,
    span_seconds,
    trace_window,
    window_at_load,
)
from .model import Workload

# ------------------------------------------------------------------------------------ the split
# Fixed for the whole project (docs/workloads.md). The four test traces are never sampled in
# training; the derived first-90-days file is a copy of KTH, so it is test data too.
TEST_TRACES: tuple[str, ...] = (
    "KTH-SP2-1996-2.1-cln.swf.gz",
    "SDSC-SP2-1998-4.2-cln.swf.gz",
    "CTC-SP2-1996-3.1-cln.swf.gz",
    "LLNL-Thunder-2007-1.1-cln.swf.gz",
    "derived/KTH-SP2-1996-2.1-cln.first90days.swf",
)
# A 228-job truncated copy of the raw NASA log: a parser fixture, in neither split.
EXCLUDED_TRACES: tuple[str, ...] = ("NASA-iPSC-1993-3.swf",)
TRAIN_TRACES: tuple[str, ...] = (
    "CEA-Curie-2011-2.1-cln.swf.gz",
    "LANL-CM5-1994-4.1-cln.swf.gz",
    "LCG.swf.gz",
    "LLNL-Atlas-2006-2.1-cln.swf.gz",
    "METACENTRUM-2009-2.swf.gz",
    "NASA-iPSC-1993-3.1-cln.swf.gz",
    "OSC-Clust-2000-3.1-cln.swf.gz",
    "RICC-2010-2.swf.gz",
    "SDSC-BLUE-2000-4.2-cln.swf.gz",
    "SDSC-DS-2004-2.1-cln.swf.gz",
    "SDSC-Par-1996-3.1-cln.swf.gz",
    "Sandia-Ross-2001-1.1-cln.swf.gz",
)
LUBLIN_TRACE = "synthetic/lublin_256.swf"

DEFAULT_MIX = Path(__file__).resolve().parent / "mixes" / "default.yaml"
DEFAULT_MAX_JOBS = 3000
DEFAULT_THIN_MIN_JOBS = 50
DEFAULT_MAX_OVERLAY = 8
# A sample's columns are built in memory at once: a mix asking for billions of jobs would exhaust it.
MAX_JOBS_LIMIT = 1_000_000
MAX_MIX_FILE_BYTES = 1 << 20  # a mix is a few dozen lines; /dev/zero would be read without end
# The Poisson generator works on a 10-s grid of the span and loops over its bursts: a span of
# 1e5 hours, or millions of bursts, ran for hours. 1000 h is 60,000 one-minute steps.
MAX_SPAN_H = 1000.0
MAX_EXPECTED_BURSTS = 10_000
MAX_OVERLAY_LIMIT = 100  # overlaying a window 1e9 times (load 1e4) ran a minute and ran out of memory
MAX_ERRORS_NAMED = 5  # a mix's validation errors named in its one-line message


def _key(trace: str | Path) -> str:
    """A trace's identity for the split: its file name, any directory, with or without .gz."""
    name = Path(str(trace)).name.lower()
    return name[:-3] if name.endswith(".gz") else name


_TEST_KEYS = {_key(t) for t in TEST_TRACES}
_EXCLUDED_KEYS = {_key(t) for t in EXCLUDED_TRACES}


def split_of(trace: str | Path) -> Literal["test", "excluded", "train"]:
    """Which side of the split a trace is on (anything not listed counts as training data)."""
    k = _key(trace)
    return "test" if k in _TEST_KEYS else "excluded" if k in _EXCLUDED_KEYS else "train"


def trace_label(trace: str | Path) -> str:
    """A short name for workload names: `LANL-CM5-1994-4.1-cln.swf.gz` -> `LANL-CM5-1994`."""
    stem = re.sub(r"\.swf(\.gz)?$", "", Path(str(trace)).name, flags=re.I)
    stem = re.sub(r"-cln$", "", stem)
    return re.sub(r"-\d+(\.\d+)+$", "", stem)


# -------------------------------------------------------------------------------- windows
class WindowSpec(BaseModel):
    """One window of one trace, fully determined (build it with `build_window`).

    `load` None: the window as it is (cores capped keeping core-seconds, the way `samm sim run`
    and the paper experiment load traces). A number: the window's offered load is scaled to it
    (thinning, then one length factor; see `generators.thin_and_scale`) and capped cores keep
    their run time. `keep` overrides the capping mode."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = Field(min_length=1)
    trace: str = Field(min_length=1)  # a file name under pwa_dir(), or an absolute path
    start_h: float = Field(ge=0)  # hours after the trace's first submission
    hours: float = Field(gt=0)  # window length in trace time
    time_compression: float = Field(default=1.0, gt=0)
    load: float | None = Field(default=None, gt=0)
    keep: Literal["work", "runtime"] | None = None

    @property
    def cap_keep(self) -> str:
        return self.keep or ("work" if self.load is None else "runtime")

    @property
    def span_h(self) -> float:
        """The window's length in simulated time."""
        return self.hours / self.time_compression

    def thinning_seed(self) -> int:
        # Thinning must be reproducible from the spec alone (a test window has no sampler); the
        # name is left out so that renaming a window does not change its jobs.
        blob = self.model_dump_json(exclude={"name"}).encode()
        return int.from_bytes(hashlib.sha256(blob).digest()[:8], "little")


def _build(spec: WindowSpec, sim: SimConfig, max_jobs: int, thin_min_jobs: int, max_overlay: int,
           max_length_factor: float) -> Workload | None:
    jobs = load_trace(spec.trace)
    args = (jobs, spec.start_h * 3600.0, spec.hours, spec.time_compression, sim, spec.cap_keep)
    if spec.load is None:
        return trace_window(*args, spec.name)
    return window_at_load(*args, spec.load, np.random.default_rng(spec.thinning_seed()), max_jobs=max_jobs,
                          thin_min_jobs=thin_min_jobs, max_overlay=max_overlay,
                          max_length_factor=max_length_factor, name=spec.name)


def build_window(spec: WindowSpec, sim: SimConfig, *, max_jobs: int = DEFAULT_MAX_JOBS,
                 thin_min_jobs: int = DEFAULT_THIN_MIN_JOBS, max_overlay: int = DEFAULT_MAX_OVERLAY) -> Workload:
    """The workload of one window, deterministic; jobs capped at `sim.job_core_cap` cores. The
    keyword arguments are the mix's rules (their defaults are the shipped mix's); the length
    factor is not bounded here (a fixed window is built whatever it takes)."""
    w = _build(spec, sim, max_jobs, thin_min_jobs, max_overlay, math.inf)
    if w is None:
        raise ValueError(f"window {spec.name!r}: no job of {spec.trace} submitted in "
                         f"[{spec.start_h} h, {spec.start_h + spec.hours} h) is left")
    return w


# The generalisation suite's windows: test traces only. The first two are the windows the
# project has always reported (one whole day each, as it is); the other six are load-scaled,
# compressed windows like the training ones, light to heavy. Chosen once by scanning the traces
# for windows that pass the sampler's rules (>= 20 jobs, no job over 3x the span, last arrival
# in the second half of the window), then fixed.
_KTH, _SDSC, _CTC, _THUNDER = TEST_TRACES[:4]
TEST_WINDOWS: tuple[WindowSpec, ...] = (
    WindowSpec(name="KTH-SP2 day 10", trace=_KTH, start_h=240.0, hours=24.0),
    WindowSpec(name="SDSC-SP2 day 30", trace=_SDSC, start_h=720.0, hours=24.0),
    # After day 90, so that the first 90 days (derived/...first90days.swf) can fine-tune for it.
    WindowSpec(name="KTH-SP2@d134+24h/c6/L0.30", trace=_KTH, start_h=134 * 24.0, hours=24.0,
               time_compression=6.0, load=0.3),
    WindowSpec(name="CTC-SP2@d150+12h/c4/L0.50", trace=_CTC, start_h=150 * 24.0, hours=12.0,
               time_compression=4.0, load=0.5),
    WindowSpec(name="LLNL-Thunder@d53+12h/c6/L0.80", trace=_THUNDER, start_h=53 * 24.0, hours=12.0,
               time_compression=6.0, load=0.8),
    # Three times its own load: the two following days are overlaid on it.
    WindowSpec(name="SDSC-SP2@d250+24h/c4/L0.90", trace=_SDSC, start_h=250 * 24.0, hours=24.0,
               time_compression=4.0, load=0.9),
    WindowSpec(name="CTC-SP2@d209+48h/c8/L1.00", trace=_CTC, start_h=209 * 24.0, hours=48.0,
               time_compression=8.0, load=1.0),
    WindowSpec(name="LLNL-Thunder@d40+24h/c4/L1.10", trace=_THUNDER, start_h=40 * 24.0, hours=24.0,
               time_compression=4.0, load=1.1),
)


# ----------------------------------------------------------------------------------- sources
def _ordered(r: tuple) -> tuple:
    if r[0] > r[1]:
        raise ValueError(f"range {list(r)}: low end above high end")
    return r


def _non_negative(r: tuple) -> tuple:
    if r[0] < 0:
        raise ValueError(f"range {list(r)}: must be >= 0")
    return r


def _positive(r: tuple) -> tuple:
    if r[0] <= 0:
        raise ValueError(f"range {list(r)}: must be > 0 (drawn log-uniformly)")
    return r


Range = Annotated[tuple[float, float], AfterValidator(_ordered)]
LogRange = Annotated[tuple[float, float], AfterValidator(_ordered), AfterValidator(_positive)]
NonNegativeRange = Annotated[tuple[float, float], AfterValidator(_ordered), AfterValidator(_non_negative)]
IntRange = Annotated[tuple[int, int], AfterValidator(_ordered)]


def _cores(p: dict[int, float]) -> dict[int, float]:
    if not p or any(k < 1 for k in p) or any(v < 0 for v in p.values()) or sum(p.values()) <= 0:
        raise ValueError(f"cores must map core counts >= 1 to probabilities >= 0 with a positive sum, got {p}")
    return p


Cores = Annotated[dict[int, float], AfterValidator(_cores)]


def _median_run(w: Workload, sim: SimConfig) -> float:
    return float(np.median(w.length_mi)) / sim.host_mips


def _logu(rng: np.random.Generator, r: tuple[float, float]) -> float:
    return float(math.exp(rng.uniform(math.log(r[0]), math.log(r[1]))))


class _Source(BaseModel):
    # NaN and inf pass the range checks (NaN compares false) and crash the draws with an OverflowError
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    weight: float = Field(default=1.0, ge=0)

    def trace_files(self) -> tuple[str, ...]:
        return ()

    def prepare(self, rng: np.random.Generator):
        """What stays fixed while a rejected sample is redrawn (the trace of a window source), so
        that acceptance rates do not skew the documented weights."""
        return None


class _WindowSource(_Source):
    hours: LogRange = (6.0, 48.0)
    keep_work: float = Field(default=0.25, ge=0, le=1)

    def draw(self, rng, sim: SimConfig, mix: "WorkloadMix", trace: str):
        jobs = load_trace(trace)
        hours = _logu(rng, self.hours)
        span_h = rng.uniform(mix.span_h[0], min(mix.span_h[1], hours)) if hours > mix.span_h[0] else hours
        start_h = rng.uniform(0.0, max(0.0, jobs.span_s / 3600.0 - hours))
        load = rng.uniform(*mix.load)
        keep = "work" if rng.random() < self.keep_work else "runtime"
        c = hours / span_h
        name = (f"{trace_label(trace)}@d{start_h / 24:.1f}+{hours:.0f}h/c{c:.1f}/L{load:.2f}"
                + ("/kw" if keep == "work" else ""))
        spec = WindowSpec(name=name, trace=trace, start_h=start_h, hours=hours, time_compression=c, load=load,
                          keep=keep)
        return (_build(spec, sim, mix.max_jobs, mix.thin_min_jobs, mix.max_overlay, mix.max_length_factor),
                span_h * 3600.0, spec)


class SwfSource(_WindowSource):
    """Windows of real traces: start uniform over the trace, length log-uniform in `hours` of
    trace time, compressed to a simulated span drawn from the mix's `span_h`, scaled to a load
    drawn from the mix's `load`; a fraction `keep_work` of the draws caps cores keeping core-seconds
    (like the as-is test windows), the rest keeping run time. Traces equally likely."""

    kind: Literal["swf"] = "swf"
    traces: tuple[str, ...] = ()  # empty = every TRAIN_TRACES file

    def trace_files(self) -> tuple[str, ...]:
        return self.traces or TRAIN_TRACES

    def prepare(self, rng):
        t = self.trace_files()
        return t[int(rng.integers(len(t)))]


class LublinSource(_WindowSource):
    """Windows of the Lublin–Feitelson model log (synthetic, 256 nodes), drawn like `swf`."""

    kind: Literal["lublin"] = "lublin"
    trace: str = LUBLIN_TRACE

    def trace_files(self) -> tuple[str, ...]:
        return (self.trace,)

    def prepare(self, rng):
        return self.trace


class BatchSource(_Source):
    """seed-1551-like batches (see `generators.batch_workload`): span from the mix's `span_h`,
    `batches` uniform, idle start uniform in `idle_start_s` (at most half the span), base run time
    log-uniform in `run_s`, per-job log-sd uniform in `run_sigma` (0 = identical jobs, like the
    paper)."""

    kind: Literal["batch"] = "batch"
    batches: IntRange = (3, 30)
    idle_start_s: NonNegativeRange = (0.0, 3600.0)
    interval_jitter: float = Field(default=0.2, ge=0, lt=1)
    run_s: LogRange = (60.0, 1800.0)
    run_sigma: NonNegativeRange = (0.0, 0.5)
    size_sigma: float = Field(default=0.5, ge=0)
    cores: Cores = {1: 0.7, 2: 0.15, 4: 0.1, 8: 0.05}

    @model_validator(mode="after")
    def _check(self) -> "BatchSource":
        if self.batches[0] < 2:
            raise ValueError("batches: at least 2 (the first and the last batch fix the span)")
        return self

    def draw(self, rng, sim: SimConfig, mix: "WorkloadMix", _ctx):
        span_s = rng.uniform(*mix.span_h) * 3600.0
        batches = int(rng.integers(self.batches[0], self.batches[1] + 1))
        idle = min(rng.uniform(*self.idle_start_s), span_s / 2)
        run_s = _logu(rng, self.run_s)
        sigma = rng.uniform(*self.run_sigma)
        load = rng.uniform(*mix.load)
        w = batch_workload(rng, sim, span_s=span_s, load=load, batches=batches, idle_start_s=idle,
                           interval_jitter=self.interval_jitter, run_s=run_s, run_sigma=sigma,
                           size_sigma=self.size_sigma, cores=self.cores, min_jobs=mix.min_jobs,
                           max_jobs=mix.max_jobs, name="batch")
        # the name states the median run time after scaling to the load, not the drawn base
        name = f"batch@{batches}b/S{span_s / 3600:.1f}h/r{_median_run(w, sim):.0f}s/L{load:.2f}"
        return replace(w, name=name), span_s, None


class PoissonSource(_Source):
    """A diurnal, bursty Poisson stream (see `generators.poisson_workload`): span from the mix,
    amplitude a uniform, period P (hours) log-uniform, phase uniform in [0, 2π); bursts: a Poisson number
    (`bursts_per_h` × span hours), each uniform in start, `burst_min` minutes long, rate ×
    `burst_factor`; run-time median log-uniform in `run_median_s`, log-sd uniform in `run_sigma`."""

    kind: Literal["poisson"] = "poisson"
    amplitude: Range = (0.0, 0.9)
    period_h: LogRange = (1.0, 8.0)
    bursts_per_h: NonNegativeRange = (0.0, 1.0)
    burst_min: NonNegativeRange = (5.0, 30.0)
    burst_factor: NonNegativeRange = (2.0, 8.0)
    run_median_s: LogRange = (60.0, 1800.0)
    run_sigma: NonNegativeRange = (0.5, 1.5)
    cores: Cores = {1: 0.55, 2: 0.2, 4: 0.15, 8: 0.1}

    @model_validator(mode="after")
    def _check(self) -> "PoissonSource":
        if self.amplitude[1] >= 1 or self.amplitude[0] < 0:
            raise ValueError("amplitude must lie in [0, 1): the rate may not go negative")
        return self

    def draw(self, rng, sim: SimConfig, mix: "WorkloadMix", _ctx):
        span_s = rng.uniform(*mix.span_h) * 3600.0
        a = rng.uniform(*self.amplitude)
        period_s = _logu(rng, self.period_h) * 3600.0
        phase = rng.uniform(0.0, 2 * math.pi)
        bursts = [(rng.uniform(0.0, span_s), rng.uniform(*self.burst_min) * 60.0, rng.uniform(*self.burst_factor))
                  for _ in range(int(rng.poisson(rng.uniform(*self.bursts_per_h) * span_s / 3600.0)))]
        median = _logu(rng, self.run_median_s)
        sigma = rng.uniform(*self.run_sigma)
        load = rng.uniform(*mix.load)
        w = poisson_workload(rng, sim, span_s=span_s, load=load, amplitude=a, period_s=period_s, phase=phase,
                             bursts=bursts, run_median_s=median, run_sigma=sigma, cores=self.cores,
                             min_jobs=mix.min_jobs, max_jobs=mix.max_jobs, name="poisson")
        name = (f"poisson@S{span_s / 3600:.1f}h/a{a:.2f}/P{period_s / 3600:.1f}h/b{len(bursts)}"
                f"/m{_median_run(w, sim):.0f}s/L{load:.2f}")
        return replace(w, name=name), span_s, None


Source = Annotated[Union[SwfSource, LublinSource, BatchSource, PoissonSource], Field(discriminator="kind")]


# --------------------------------------------------------------------------------------- mix
class WorkloadMix(BaseModel):
    """Sources with weights plus the rules every sample obeys (see docs/workloads.md)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = "mix"
    load: Range = (0.2, 1.2)  # target offered load, uniform, of sim.max_fleet_cores
    span_h: Range = (1.5, 8.0)  # simulated span (hours), uniform
    min_jobs: int = Field(default=20, ge=1)  # fewer: resample
    max_jobs: int = Field(default=DEFAULT_MAX_JOBS, ge=1, le=MAX_JOBS_LIMIT)  # more: thinned / fewer generated
    thin_min_jobs: int = Field(default=DEFAULT_THIN_MIN_JOBS, ge=1)  # thinning keeps at least this many
    max_overlay: int = Field(default=DEFAULT_MAX_OVERLAY, ge=1, le=MAX_OVERLAY_LIMIT)  # windows overlaid for a load
    max_length_factor: float = Field(default=4.0, ge=1)  # window lengths scaled beyond x/÷ this: resample
    max_run_over_span: float = Field(default=3.0, gt=0)  # a longer job: resample
    min_span_fraction: float = Field(default=0.5, ge=0, le=1)  # last arrival earlier: resample
    max_attempts: int = Field(default=1000, ge=1)
    sources: list[Source] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> "WorkloadMix":
        if self.load[0] <= 0 or self.span_h[0] <= 0:
            raise ValueError("load and span_h must be positive ranges")
        if self.span_h[1] > MAX_SPAN_H:
            raise ValueError(f"span_h: at most {MAX_SPAN_H:g} hours, got {self.span_h[1]:g}")
        if not self.min_jobs <= self.max_jobs:
            raise ValueError(f"min_jobs ({self.min_jobs}) must not exceed max_jobs ({self.max_jobs})")
        if 2 * self.min_jobs > self.max_jobs:
            raise ValueError("max_jobs must be at least 2 x min_jobs (the generators aim at that many)")
        if sum(s.weight for s in self.sources) <= 0:
            raise ValueError("at least one source needs a positive weight")
        for i, s in enumerate(self.sources):
            # each batch holds at least one job, so more batches than max_jobs would break the cap
            if isinstance(s, BatchSource) and s.batches[1] > self.max_jobs:
                raise ValueError(f"sources[{i}] (batch): batches up to {s.batches[1]} exceed max_jobs "
                                 f"({self.max_jobs}); every batch holds at least one job")
            if isinstance(s, PoissonSource) and s.bursts_per_h[1] * self.span_h[1] > MAX_EXPECTED_BURSTS:
                raise ValueError(f"sources[{i}] (poisson): bursts_per_h up to {s.bursts_per_h[1]:g} over spans up "
                                 f"to {self.span_h[1]:g} h expect more than {MAX_EXPECTED_BURSTS} bursts per sample")
        self.check_split()
        return self

    def check_split(self) -> None:
        """ValueError naming the trace if any source would sample a test (or excluded) trace."""
        for i, s in enumerate(self.sources):
            for t in s.trace_files():
                role = split_of(t)
                if role != "train":
                    raise ValueError(f"sources[{i}] ({s.kind}) uses {t!r}, a {role} trace: training may "
                                     f"not sample it (test traces: {', '.join(TEST_TRACES)})")

    def sampler(self, sim: SimConfig, seed: int) -> "WorkloadSampler":
        return WorkloadSampler(self, sim, seed)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


class SamplingError(RuntimeError, ValueError):
    """No acceptable workload in `max_attempts` draws: the mix (or the trace) cannot give what its
    rules ask for. A ValueError too, so that callers reporting bad input report it in one line
    (it was a RuntimeError before: a traceback at `samm train`)."""


class WorkloadSampler:
    """A deterministic stream of workloads: same (mix, sim, seed) => same sequence. One
    np.random.Generator drives every choice; thinning inside a window is seeded from the window
    itself. Traces are loaded (and cached) when first drawn."""

    def __init__(self, mix: WorkloadMix, sim: SimConfig, seed: int):
        self.mix, self.sim, self.seed = mix, sim, int(seed)
        self.rng = np.random.default_rng(self.seed)
        w = np.array([s.weight for s in mix.sources], dtype=np.float64)
        self._p = w / w.sum()
        # fail now, not at the 300th episode, when a trace is missing; a weight-0 source is never
        # drawn, so a mix that switches the trace sources off runs where the traces are not installed
        for s in mix.sources:
            for t in s.trace_files() if s.weight > 0 else ():
                resolve_trace(t)
        self.drawn = 0
        self.rejected = 0
        self.last_spec: WindowSpec | None = None  # the window of the last sample (None: generated)

    def _acceptable(self, w: Workload | None, span_s: float) -> bool:
        m = self.mix
        if w is None or w.n_jobs < m.min_jobs:
            return False
        span = span_seconds(w, self.sim)
        if span < m.min_span_fraction * span_s:
            return False
        return float(np.max(w.length_mi)) / self.sim.host_mips <= m.max_run_over_span * span

    def sample(self) -> Workload:
        i = int(self.rng.choice(len(self._p), p=self._p))
        src = self.mix.sources[i]
        ctx = src.prepare(self.rng)
        for _ in range(self.mix.max_attempts):
            w, span_s, spec = src.draw(self.rng, self.sim, self.mix, ctx)
            if self._acceptable(w, span_s):
                assert int(w.cores.max()) <= self.sim.job_core_cap
                self.drawn += 1
                self.last_spec = spec
                return w
            self.rejected += 1
        raise SamplingError(f"source {i} ({src.kind}{', ' + str(ctx) if ctx else ''}): no acceptable workload in "
                            f"{self.mix.max_attempts} draws; widen its ranges or relax the mix's rules")

    def sample_many(self, n: int) -> list[Workload]:
        return [self.sample() for _ in range(n)]


class WorkloadWindows:
    """Random windows of ONE workload, as they are (no compression, no load scaling): the
    sampler for fine-tuning a policy on a user's own trace. Each sample starts at a uniformly
    drawn arrival-time offset and keeps the jobs submitted in the next `hours` (uniform in the
    range), re-based to the window start; windows with fewer than `min_jobs` jobs are redrawn.
    Same (workload, hours, seed) => same sequence."""

    def __init__(self, workload: Workload, seed: int, hours: tuple[float, float] = (6.0, 24.0), min_jobs: int = 20,
                 max_attempts: int = 1000):
        lo, hi = hours
        if not (0 < lo <= hi and math.isfinite(hi)):
            raise ValueError(f"window hours must satisfy 0 < low <= high < inf, got {hours}")
        if min_jobs < 1:  # an empty window is no workload
            raise ValueError(f"windows need min_jobs >= 1, got {min_jobs}")
        if workload.n_jobs < min_jobs:
            raise ValueError(f"workload {workload.name!r} has {workload.n_jobs} jobs; windows need at least {min_jobs}")
        self.workload, self.hours, self.min_jobs, self.max_attempts = workload, (lo, hi), min_jobs, max_attempts
        self.rng = np.random.default_rng(int(seed))

    def sample(self) -> Workload:
        w = self.workload
        end = float(w.arrival_s[-1])
        for _ in range(self.max_attempts):
            hours = float(self.rng.uniform(*self.hours))
            start = float(self.rng.uniform(0.0, max(end - hours * 3600.0, 0.0)))
            keep = (w.arrival_s >= start) & (w.arrival_s < start + hours * 3600.0)
            if keep.sum() >= self.min_jobs:
                return Workload(f"{w.name}@{start / 3600:.1f}h+{hours:.1f}h", w.arrival_s[keep] - start,
                                w.length_mi[keep], w.cores[keep], w.ram_gb[keep])
        raise SamplingError(f"{w.name}: no window of {self.hours} h holds {self.min_jobs} jobs in "
                            f"{self.max_attempts} draws")

    def sample_many(self, n: int) -> list[Workload]:
        return [self.sample() for _ in range(n)]


class _UniqueKeyLoader(yaml.SafeLoader):
    """A safe loader that rejects a key given twice (plain YAML keeps the last one silently)."""


def _mapping_without_duplicates(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen = set()
    for key_node, _ in node.value:  # the keys as written: a merge (<<) may be overridden, that is no duplicate
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=deep)
        if not isinstance(key, Hashable):
            break  # construct_mapping names an unhashable key itself
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    loader.flatten_mapping(node)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


def _validation_line(exc: ValidationError) -> str:
    """pydantic's errors on one line, each naming its field (its own text spans several lines)."""
    errors = exc.errors()
    parts = []
    for e in errors[:MAX_ERRORS_NAMED]:
        where = ".".join(str(x) for x in e.get("loc", ())) or "mix"
        parts.append(f"{where}: {str(e.get('msg')).removeprefix('Value error, ')}")
    if len(errors) > MAX_ERRORS_NAMED:
        parts.append(f"... and {len(errors) - MAX_ERRORS_NAMED} more error(s)")
    return "; ".join(parts)


def _read_mix_text(path: Path) -> str:
    if not path.is_file():  # a directory, a FIFO or /dev/zero: not a mix file (missing: FileNotFoundError)
        if not path.exists():
            raise FileNotFoundError(f"workload mix {path}: no such file")
        raise ValueError(f"workload mix {path}: not a regular file")
    with path.open("rb") as f:
        raw = f.read(MAX_MIX_FILE_BYTES + 1)
    if len(raw) > MAX_MIX_FILE_BYTES:
        raise ValueError(f"workload mix {path}: larger than {MAX_MIX_FILE_BYTES} bytes")
    return raw.decode("utf-8")


def load_mix(path: str | Path | None = None) -> WorkloadMix:
    """A mix from YAML (None = the shipped default); unknown keys, duplicate keys and test traces
    are rejected with a one-line ValueError naming the file."""
    path = Path(path) if path is not None else DEFAULT_MIX
    try:
        data = yaml.load(_read_mix_text(path), Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except (yaml.YAMLError, UnicodeDecodeError) as exc:  # a YAMLError is no ValueError: callers expect one
        raise ValueError(f"{path}: not a valid YAML file ({' '.join(str(exc).split())})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a workload mix must be a mapping")
    try:
        return WorkloadMix.model_validate(data)
    except ValidationError as e:
        raise ValueError(f"{path}: {_validation_line(e)}") from e


__all__ = [
    "EXCLUDED_TRACES", "LUBLIN_TRACE", "TEST_TRACES", "TEST_WINDOWS", "TRAIN_TRACES", "BatchSource", "LublinSource",
    "PoissonSource", "SamplingError", "SwfSource", "WindowSpec", "WorkloadMix", "WorkloadSampler", "WorkloadWindows",
    "build_window", "load_mix",
    "offered_load", "pwa_dir", "split_of", "trace_label",
]
