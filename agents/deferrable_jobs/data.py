"""Episodes for the deferrable-jobs problem: a capacity series C_t and a stream of jobs.

The paper trained and tested on 14 days of Azure (Protean) data that is not available offline.
We substitute public traces (docs/deferrable-jobs.md) and keep the paper's structure: the capacity
left for deferrable jobs follows a datacenter's on-demand load, and the jobs' cores and durations
come from the distributions of a real batch workload, or from Table 4's cases where a setting
names one.

API (used by the simulator's callers, the heuristics' tuning, training and the experiment):
    make_episode(setting, seed, split="train") -> Episode
    episodes(setting, split, n, seed=0) -> list[Episode]
Same (setting, seed, split) -> the same episode.

Capacity (`setting.capacity_source`: "azure_v2", "google2019", "alibaba2018" or "synthetic")
    C_t = floor(fleet_cores * (1 - share_t)). share_t is the on-demand share of the fleet: the
    source's 5-minute CPU series (azure_v2 `cpu_usage`, google2019 `avg_cpu`, alibaba2018 300 s
    `cpu_util_percent`, all from datacenter-traces-aggregated) min-max normalised over the whole
    file to [ondemand_low, ondemand_high], averaged per slot (slot_minutes / 5 readings), plus
    AR(1) noise with phi 0.8 and stationary std `capacity_noise`: the aggregates are smooth
    sums over whole datacenters, and the noise stands for one cluster's short-term uncertainty
    (not given by the paper; our choice). An episode is `setting.slots` consecutive slots from a
    uniformly drawn start slot, the whole window inside its split.
    Split by days: the first round(0.7 x days) days are train, the rest test, so train and test
    episodes never share a capacity day. With 15-minute slots:
        azure_v2    30 days (8,640 readings): train days 0-20 (21), test days 21-29 (9)
        google2019  28 days (8,064 readings): train days 0-19 (20), test days 20-27 (8)
        alibaba2018 7.79 days (2,243 readings): train days 0-4 (5), test day 5 to the end (2.79)
    "synthetic" (the `tiny` setting) is one noisy sine day per episode and reads no file.

Jobs (Alibaba cluster-trace-v2017 `batch_task`, the 67,003 Terminated tasks with a CPU request)
    Alibaba's tasks are short (median 28 s) and many have thousands of instances, so each
    attribute is mapped onto the paper's categories on a log scale (not given by the paper; our
    choice, `DataParams`):
    * cores = cpus/100 x instances, binned by log base 8 (three doublings of the trace per doubling
      of ours): <= 1 -> 1 core, (1, 8] -> 2, (8, 64] -> 4, > 64 -> 8;
    * duration = task_end_time - task_create_time (at least 1 s), read as 30 trace seconds per
      slot and binned to the nearest category in log scale: edges at the geometric means of
      adjacent categories, i.e. 42, 85, 147, 220 and 312 s -> 1, 2, 4, 6, 9, 12 slots.
    The resulting default (empirical) probability vectors, printed by `empirical_probs()`:
        cores    (1, 2, 4, 8):           (0.503, 0.141, 0.163, 0.193)
        duration (1, 2, 4, 6, 9, 12):    (0.558, 0.099, 0.085, 0.061, 0.049, 0.148)
    A setting's `core_probs` / `duration_probs` (Table 4) replace the empirical vector of that
    attribute. Cores and duration are drawn independently (Table 4 gives marginals only).

Arrivals: Poisson per slot with rate lambda x profile_t. The profile is the per-slot count of the
    tasks' creation times over the 17 h trace (the full slots from time 0 on), smoothed by a
    75-minute moving average, tiled cyclically to a day of slots, normalised to mean 1 and read
    from a random phase per episode (the trace has no time of day; our choice). lambda makes the
    expected offered core-slots (sum_t rate_t x E[c] E[d]) equal `offered_load` x the episode's
    expected capacity core-slots (sum_t of the noise-free fleet x (1 - share_t)), so every
    setting offers a comparable load. The synthetic source uses a flat profile and reads no file.
    Lead (earliest - submit) is uniform on 0..lead_max, truncated so that every job's earliest
    start lies inside the episode; window (latest - earliest) is uniform on 0..window_max
    (realtime: both 0). A latest start may pass the episode's end; such a job is simply still
    waiting when the episode ends.

Randomness: capacity draws depend on (seed, split) and the job draws on (seed, split) in
separate streams, not on the setting's name, so settings that differ only in their jobs see the
same capacity windows for the same seed (common random numbers), and `realtime` episodes are the
`default` ones with the leads and windows removed.
"""
from __future__ import annotations

import csv
import gzip
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from .episode import Episode
from .settings import CORE_CATEGORIES, DURATION_CATEGORIES, Setting, get_setting

SPLITS = ("train", "test")
READING_MINUTES = 5  # the aggregated series' step (300 s)

#: capacity source -> (file under datacenter-traces-aggregated/, CPU column)
CAPACITY_SOURCES = {
    "azure_v2": ("azure_v2/vm_cpu_readings_month_aggregated_cpu_mem.csv", "cpu_usage"),
    "google2019": ("google2019/instance_usage_grouped_300_seconds_month.csv", "avg_cpu"),
    "alibaba2018": ("alibaba2018/machine_usage_days_1_to_8_grouped_300_seconds.csv", "cpu_util_percent"),
}
BATCH_TASK_FILE = "alibaba-2017-batch-task/batch_task.csv.gz"
#: a series' time column, where it has one (azure_v2; the other two are in time order without one)
TIME_COLUMN = "timestamp"


@dataclass(frozen=True)
class DataParams:
    """How the traces are turned into episodes. None of these is given by the paper; our choices."""
    train_fraction: float = 0.7          # first 70 % of a series' days train, the rest test
    noise_phi: float = 0.8               # AR(1) coefficient of the capacity noise (per slot)
    core_log_base: float = 8.0           # trace cores per category step (log scale)
    trace_seconds_per_slot: float = 30.0  # trace duration that maps to one slot
    arrival_smoothing_minutes: int = 75  # moving average over the task-creation counts


DATA = DataParams()

# stream ids of the per-episode random numbers (see "Randomness" above)
_CAPACITY, _NOISE, _PHASE, _COUNTS, _CORES, _DURATIONS, _LEADS, _WINDOWS = range(8)


# ----------------------------------------------------------------------------- files

def data_dir() -> Path:
    """Folder holding `datacenter-traces-aggregated/` and `alibaba-2017-batch-task/`
    (env SAMM_DEFERRABLE_DATA overrides; default: the workspace's shared/data)."""
    env = os.environ.get("SAMM_DEFERRABLE_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[3] / "shared" / "data"


def _need(path: Path) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"deferrable-jobs data not found at {path}; set SAMM_DEFERRABLE_DATA to the "
                                f"folder holding datacenter-traces-aggregated/ and alibaba-2017-batch-task/, "
                                f"or use the 'synthetic' capacity source with given core/duration probabilities")
    return path


@lru_cache(maxsize=None)
def _cpu_readings(source: str) -> np.ndarray:
    """The source's whole 5-minute CPU series (read once per process)."""
    if source not in CAPACITY_SOURCES:
        raise ValueError(f"unknown capacity source {source!r}; choose from {sorted(CAPACITY_SOURCES)} or 'synthetic'")
    name, column = CAPACITY_SOURCES[source]
    path = _need(data_dir() / "datacenter-traces-aggregated" / name)
    with open(path, newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None or column not in header:
            raise ValueError(f"{path}: header must name a {column!r} column, got {header}")
        col = header.index(column)
        when = header.index(TIME_COLUMN) if TIME_COLUMN in header else None
        values, last = [], None
        for row in reader:
            if not row:
                continue
            if when is not None:
                last = _later(_number(row, when, path, reader.line_num), last, path, reader.line_num)
            values.append(_reading(row, col, path, reader.line_num))
        values = np.array(values, dtype=np.float64)
    if len(values) < 2 or not np.isfinite(values).all() or values.max() <= values.min():
        raise ValueError(f"{name}: column {column} must be finite and not constant")
    values.setflags(write=False)
    return values


def _number(row: list, col: int, path: Path, line: int) -> float:
    """Field `col` of a CSV row as a float; a short row or a non-number names the file and line."""
    if col >= len(row):
        raise ValueError(f"{path}:{line}: the row has no field {col + 1}: {row}")
    try:
        return float(row[col])
    except ValueError:
        raise ValueError(f"{path}:{line}: field {col + 1} is not a number: {row[col]!r}") from None


def _reading(row: list, col: int, path: Path, line: int) -> float:
    """A CPU reading, finite and not negative: a negative one (a -1 for "no data") became the
    min-max scale's minimum and squeezed every other slot's capacity in silence, and a NaN was
    refused without the line that held it."""
    value = _number(row, col, path, line)
    if not np.isfinite(value) or value < 0:
        raise ValueError(f"{path}:{line}: a CPU reading must be a finite number >= 0, got {row[col]!r}")
    return value


def _later(time: float, previous: float | None, path: Path, line: int) -> float:
    """A reading's time, refused unless after the previous one: the series is read in file order,
    so an unsorted or repeated timestamp silently scrambled the capacity days and the split."""
    if not np.isfinite(time):
        raise ValueError(f"{path}:{line}: {TIME_COLUMN} must be a finite number, got {time}")
    if previous is not None and time <= previous:
        raise ValueError(f"{path}:{line}: {TIME_COLUMN} {time:g} is not after the previous reading's "
                         f"{previous:g}: the readings must be in time order")
    return time


def _task(row: list, path: Path, line: int) -> tuple[float, float, float]:
    """(creation time s, duration s, cores) of one batch-task row. A NaN creation time broke the
    arrival profile, and a NaN or negative CPU request was binned silently as 8 or 1 cores."""
    create, end, cpus = (_number(row, c, path, line) for c in (0, 1, 6))
    instances = _number(row, 4, path, line)
    if not np.isfinite([create, end, cpus, instances]).all() or cpus < 0 or instances < 0:
        raise ValueError(f"{path}:{line}: times, instances and CPUs must be finite and not negative, got {row}")
    return create, max(end - create, 1.0), cpus / 100.0 * int(instances)


@lru_cache(maxsize=None)
def _batch_tasks() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(creation time s, duration s, cores) of Alibaba 2017's Terminated batch tasks with a CPU request."""
    tasks = []
    path = _need(data_dir() / BATCH_TASK_FILE)
    with gzip.open(path, "rt", newline="") as fh:
        reader = csv.reader(fh)
        next(reader, None)  # header added by the mirror
        for row in reader:
            if not row:
                continue
            if len(row) < 7:
                raise ValueError(f"{path}:{reader.line_num}: expected at least 7 fields, got {row}")
            if row[5] == "Terminated" and row[6]:
                tasks.append(_task(row, path, reader.line_num))
    if not tasks:
        raise ValueError(f"{path}: no Terminated task with a CPU request")
    out = tuple(np.asarray(a, dtype=np.float64) for a in zip(*tasks))
    for a in out:
        a.setflags(write=False)
    return out


# ----------------------------------------------------------------------------- capacity

def _slots_per_day(setting: Setting) -> int:
    if 1440 % setting.slot_minutes or setting.slot_minutes % READING_MINUTES:
        raise ValueError(f"slot_minutes={setting.slot_minutes} must divide a day and be a multiple of "
                         f"{READING_MINUTES}")
    return 1440 // setting.slot_minutes


@lru_cache(maxsize=64)
def _share_series(source: str, slot_minutes: int, low: float, high: float) -> np.ndarray:
    """Noise-free on-demand share per slot over the whole source series."""
    x = _cpu_readings(source)
    x = low + (high - low) * (x - x.min()) / (x.max() - x.min())
    per = slot_minutes // READING_MINUTES
    n = len(x) // per  # a trailing partial slot is dropped
    share = x[:n * per].reshape(n, per).mean(axis=1)
    share.setflags(write=False)
    return share


def share_series(setting) -> np.ndarray:
    """The noise-free on-demand share per slot of the setting's whole capacity source."""
    setting = get_setting(setting)
    _slots_per_day(setting)
    return _share_series(setting.capacity_source, setting.slot_minutes,
                         float(setting.ondemand_low), float(setting.ondemand_high))


def split_slots(setting, split: str, params: DataParams = DATA) -> tuple[int, int]:
    """[lo, hi): the slots of the setting's capacity series that `split` may use; whole days."""
    setting = get_setting(setting)
    _check_split(split)
    n = len(share_series(setting))
    per_day = _slots_per_day(setting)
    boundary = int(round(params.train_fraction * n / per_day)) * per_day
    return (0, boundary) if split == "train" else (boundary, n)


def capacity_window(setting, split: str, rng: np.random.Generator, params: DataParams = DATA) -> int:
    """First slot of an episode's capacity window: uniform over the starts whose whole window
    lies inside the split's days."""
    setting = get_setting(setting)
    lo, hi = split_slots(setting, split, params)
    if hi - lo < setting.slots:
        raise ValueError(f"{setting.capacity_source} {split} split has {hi - lo} slots, an episode needs "
                         f"{setting.slots}")
    return int(rng.integers(lo, hi - setting.slots + 1))


def capacity_start(setting, seed: int, split: str = "train", params: DataParams = DATA) -> int | None:
    """The start slot `make_episode(setting, seed, split)` uses (None for the synthetic source)."""
    setting = get_setting(setting)
    if setting.capacity_source == "synthetic":
        return None
    return capacity_window(setting, split, _stream(seed, split, _CAPACITY), params)


def _ar1_noise(n: int, std: float, phi: float, rng: np.random.Generator) -> np.ndarray:
    """Stationary AR(1) series with marginal std `std`."""
    eps = rng.normal(0.0, std * np.sqrt(1.0 - phi * phi), n)
    noise = np.empty(n)
    noise[0] = rng.normal(0.0, std)
    for t in range(1, n):
        noise[t] = phi * noise[t - 1] + eps[t]
    return noise


def _to_capacity(share: np.ndarray, setting: Setting, rng: np.random.Generator, params: DataParams) -> np.ndarray:
    share = share + _ar1_noise(len(share), setting.capacity_noise, params.noise_phi, rng)
    return np.floor(setting.fleet_cores * (1.0 - np.clip(share, 0.0, 1.0))).astype(np.int64)


def _synthetic_share(setting: Setting, rng: np.random.Generator) -> np.ndarray:
    """One sine day over the episode, random phase, between ondemand_low and ondemand_high."""
    x = np.arange(setting.slots) / setting.slots * 2 * np.pi + rng.uniform(0, 2 * np.pi)
    return setting.ondemand_low + (setting.ondemand_high - setting.ondemand_low) * (0.5 + 0.5 * np.sin(x))


def synthetic_capacity(setting: Setting, rng: np.random.Generator, params: DataParams = DATA) -> np.ndarray:
    """Capacity of a synthetic episode (no data files): a noisy sine day."""
    setting = get_setting(setting)
    return _to_capacity(_synthetic_share(setting, rng), setting, rng, params)


def _episode_share(setting: Setting, seed: int, split: str, params: DataParams) -> np.ndarray:
    if setting.capacity_source == "synthetic":
        return _synthetic_share(setting, _stream(seed, split, _CAPACITY))
    start = capacity_start(setting, seed, split, params)
    return np.asarray(share_series(setting)[start:start + setting.slots])


# ----------------------------------------------------------------------------- jobs

def _log_bins(values: np.ndarray, edges: np.ndarray, n: int) -> np.ndarray:
    return np.bincount(np.searchsorted(edges, values, side="left"), minlength=n) / len(values)


@lru_cache(maxsize=8)
def empirical_probs(params: DataParams = DATA) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(core probabilities over CORE_CATEGORIES, duration probabilities over DURATION_CATEGORIES)
    of the Alibaba 2017 batch tasks under the mapping in the module docstring."""
    _, duration, cores = _batch_tasks()
    # category k holds cores in (base^(k-1), base^k], the first everything <= 1
    core_edges = params.core_log_base ** np.arange(len(CORE_CATEGORIES) - 1)
    cp = _log_bins(cores, core_edges, len(CORE_CATEGORIES))
    cats = np.asarray(DURATION_CATEGORIES, dtype=np.float64)
    dur_edges = np.sqrt(cats[:-1] * cats[1:]) * params.trace_seconds_per_slot
    dp = _log_bins(duration, dur_edges, len(DURATION_CATEGORIES))
    return tuple(float(p) for p in cp), tuple(float(p) for p in dp)


def job_probs(setting, params: DataParams = DATA) -> tuple[np.ndarray, np.ndarray]:
    """The setting's (core, duration) category probabilities: Table 4's where given, else empirical."""
    setting = get_setting(setting)
    cp, dp = setting.core_probs, setting.duration_probs
    if cp is None or dp is None:
        emp_c, emp_d = empirical_probs(params)
        cp = emp_c if cp is None else cp
        dp = emp_d if dp is None else dp
    cp, dp = np.asarray(cp, dtype=np.float64), np.asarray(dp, dtype=np.float64)
    if cp.shape != (len(CORE_CATEGORIES),) or dp.shape != (len(DURATION_CATEGORIES),):
        raise ValueError(f"{setting.name}: need {len(CORE_CATEGORIES)} core and {len(DURATION_CATEGORIES)} "
                         f"duration probabilities")
    return cp / cp.sum(), dp / dp.sum()


@lru_cache(maxsize=16)
def _day_profile(slot_minutes: int, slots_per_day: int, smoothing_minutes: int) -> np.ndarray:
    create, _, _ = _batch_tasks()
    slot_s = slot_minutes * 60.0
    n = int(create.max() // slot_s)  # full slots from time 0 (earlier creations are the trace's warm-up)
    if n < 1:
        raise ValueError(f"{BATCH_TASK_FILE}: the task creation times span no whole {slot_minutes}-minute slot")
    counts = np.bincount((create[(create >= 0) & (create < n * slot_s)] // slot_s).astype(np.int64), minlength=n)
    if not counts.any():  # the profile would be 0 / 0, and every arrival rate NaN
        raise ValueError(f"{BATCH_TASK_FILE}: no task created inside the trace's whole {slot_minutes}-minute slots")
    k = max(1, int(round(smoothing_minutes / slot_minutes)))
    padded = np.pad(counts.astype(np.float64), (k // 2, k - 1 - k // 2), mode="edge")
    smooth = np.convolve(padded, np.ones(k) / k, mode="valid")
    day = np.resize(smooth, slots_per_day)  # tiled cyclically
    day = day / day.mean()
    day.setflags(write=False)
    return day


def arrival_profile(setting, params: DataParams = DATA) -> np.ndarray:
    """Relative arrival rate over one day of slots (mean 1); flat for the synthetic source."""
    setting = get_setting(setting)
    per_day = _slots_per_day(setting)
    if setting.capacity_source == "synthetic":
        return np.ones(per_day)
    return _day_profile(setting.slot_minutes, per_day, params.arrival_smoothing_minutes)


def _jobs(setting: Setting, seed: int, split: str, expected_capacity: float, params: DataParams):
    T = setting.slots
    day = arrival_profile(setting, params)
    phase = int(_stream(seed, split, _PHASE).integers(len(day)))
    profile = day[(phase + np.arange(T)) % len(day)]
    cp, dp = job_probs(setting, params)
    mean_revenue = float(cp @ np.asarray(CORE_CATEGORIES)) * float(dp @ np.asarray(DURATION_CATEGORIES))
    rate = setting.offered_load * expected_capacity / (mean_revenue * profile.sum()) * profile
    counts = _stream(seed, split, _COUNTS).poisson(rate)
    submit = np.repeat(np.arange(T), counts)
    n = len(submit)
    cores = np.asarray(CORE_CATEGORIES)[_stream(seed, split, _CORES).choice(len(cp), size=n, p=cp)]
    duration = np.asarray(DURATION_CATEGORIES)[_stream(seed, split, _DURATIONS).choice(len(dp), size=n, p=dp)]
    lead_max = np.minimum(setting.lead_max, T - 1 - submit)
    earliest = submit + _stream(seed, split, _LEADS).integers(0, lead_max + 1)
    latest = earliest + _stream(seed, split, _WINDOWS).integers(0, setting.window_max + 1, size=n)
    order = np.lexsort((earliest, submit))
    return cores[order], duration[order], earliest[order], latest[order], submit[order]


# ----------------------------------------------------------------------------- episodes

def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from {SPLITS}")


def _stream(seed: int, split: str, stream: int) -> np.random.Generator:
    _check_split(split)
    if int(seed) < 0:  # NumPy's own refusal ("expected non-negative integer") names no seed
        raise ValueError(f"episode seed must be >= 0, got {seed}")
    return np.random.default_rng([int(seed), SPLITS.index(split), stream])


def make_episode(setting, seed: int, split: str = "train", params: DataParams = DATA) -> Episode:
    setting = get_setting(setting)
    _check_split(split)
    share = _episode_share(setting, seed, split, params)
    capacity = _to_capacity(share, setting, _stream(seed, split, _NOISE), params)
    expected_capacity = float(np.sum(setting.fleet_cores * (1.0 - share)))
    cores, duration, earliest, latest, submit = _jobs(setting, seed, split, expected_capacity, params)
    return Episode(cores=cores.astype(np.int64), duration=duration.astype(np.int64),
                   earliest=earliest.astype(np.int64), latest=latest.astype(np.int64),
                   submit=submit.astype(np.int64), capacity=capacity)


def episodes(setting, split: str, n: int, seed: int = 0) -> list[Episode]:
    if int(seed) < 0:  # checked here too: the per-episode seed derived from it is not the one given
        raise ValueError(f"episode seed must be >= 0, got {seed}")
    return [make_episode(setting, seed * 100_003 + i, split) for i in range(n)]
