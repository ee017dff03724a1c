"""The Sinan-style learned baseline (Zhang et al., ASPLOS'21), the paper's second baseline: a model
of the next seconds' latency and of the chance of a QoS violation, given the last seconds'
per-service measurements and a *candidate* allocation, and a scheduler that applies, each second,
the cheapest candidate the model predicts safe.

Three parts, as in Sinan (facts from the paper and its public code, zyqCSL/sinan-local; no code
taken):

1. **Data collection** (`collect`, `SinanExplorer`). Sinan runs the application over its user range
   under an exploration policy that moves every tier's CPU limit each second with a bias toward the
   QoS boundary: a multi-armed bandit per latency/load state whose arms are the ops
   {−10 % of the tier's max, −1 core, hold, +1 core, +25 %, +50 % of max}, with biases that favour
   scaling down, damped by exp(−0.99 · projected utilisation); 1 % random allocations, 5 % holds;
   only scale-up ops while the p99 is above a region of interest (250 ms for a 200 ms QoS, so
   1.25 × QoS), then a 3-second hold after a violation. Ours keeps that shape but replaces the
   bandit's information-gain scores with fixed op probabilities per band of p99/QoS, per service,
   over the ops ×0.75, ×0.9, hold, ×1.1, ×1.25 of the current limit: mostly down below 0.5 (up ops
   2 %, as the bandit's up biases are ~1/1000 of its down biases), mostly down or hold in
   [0.5, 0.8), mostly hold or up in [0.8, 1.25]; the same utilisation damping, random (1 %) and hold
   (5 %) rates, recovery (+10/25/50 % of the cap while p99 > 1.25 × QoS) and 3-second hold after a
   violation. Each simulated copy draws U ~ U[app users], warms up 60 s at the caps, then explores
   for 300 s; 48 copies × 3 batches by default (43,200 explored seconds; about a third of the
   samples see a violation within 5 s, so the data sits around the QoS boundary as Sinan wants).
   (A first version with up ops sized by the cap in every band never got near the boundary at low
   load: 1.4 % of its low-load samples saw a violation, and the model it trained violated QoS 44 %
   of the time at 20 Social users.)
2. **Model** (`SinanModel`). Sinan: a CNN over the last 5 s of per-tier usage (CPU, memory,
   network, ...) and latency percentiles plus the candidate allocation predicts the next second's
   latency percentiles; XGBoost on the CNN's latent features plus the allocation predicts the
   probability of a violation within the next k seconds (k = 5 in its data parser). Ours: two
   scikit-learn HistGradientBoosting models on hand-built features (no CNN, no latent layer): a
   regressor of log(p99_{t+1} / QoS) and a classifier of "p99 > QoS in any of the next k = 5
   seconds". Features (`build_features`): per service, the candidate as a
   share of the cap, the projected utilisation of the candidate from the last second's, the
   3-second mean and the 5-second max use, the current utilisation, the candidate / current limit,
   resident memory (MB); for the application, the last 5 s of the p90/p95/p98/p99/p99.9 latency
   (Sinan's five) over the QoS, requests/s (last, 5-s mean), failures/s, the candidate's total share
   of the caps, and the largest projected utilisation over services. The projected utilisations
   are the relation Sinan's CNN has to learn from raw usage and limits; we hand them to the trees.
   No upsampling of violations (Sinan's parser can upsample to 50 %): the probabilities stay
   calibrated (tried: upsampling to 50 % made Social worse, 7 % violations at 110 users).
   The k-second label is what keeps the scheduler safe: with k = 1 or 2 it violated QoS 6–32 % of
   the time at low load (measured on Hotel and Social); with k = 5 (Sinan's) it is safe, at the
   price of pessimism: the label counts violations caused by the explorer's *later* moves, so a
   state the explorer would have left by scaling down reads as riskier than holding it is. The
   per-application threshold tuning below absorbs that, as Sinan's per-application tuning would.
3. **Scheduler** (`SinanController`), as Sinan's online scheduler: candidates are hold (services
   above 70 % utilisation raised to 70 %), every service at its cap, scale up one service (each up
   op), scale up all, scale up the services scaled down in the last 5 actions ("victims"), scale
   down all, scale down one service, and scale down the l lowest-utilised services (l = 2..n−1) for
   each down op. Decision: the cheapest scale-down candidate with predicted p99 < QoS − margin and
   P(violation) <= 0.055, but only while the load is steady; otherwise hold if its p99 < QoS −
   margin and P < 0.10; otherwise the cheapest scale-up candidate meeting that; otherwise every
   service at its cap. Sinan's margin is its CNN's validation error (25 ms for 200 ms): we use
   12.5 % of the QoS for both applications.
4. **Tuning** (`tune_sinan`, part of `train_sinan`). The Reclaimer paper notes Sinan's
   hyperparameters are tuned per application; ours tunes one: the scale-down threshold p_down
   (p_hold = p_down + 0.045, Sinan's gap), from Sinan's 0.055 along a grid (0.02 … 0.35), keeping the
   cheapest value whose violation rate is <= 0.5 % at each of 4 tuning loads (0, 30, 70, 100 % of
   the user range; seeds 2001–2002, not the evaluation's).

Where ours differs from Sinan, besides the model: fractional limits with a 0.02-core floor
(Sinan rounds to whole cores with at least 0.5 core, far above what most of our simulated services
use); ops as fractions (down: ×0.9, ×0.75 of the current limit; up: ×1.1, ×1.25 of it and +25 %,
+50 % of the cap) for Sinan's −10 %/−1 core/+1 core/+25 %/+50 % of max; "steady load" is
|Δ requests/s| <= 2 % plus twice the Poisson noise of the difference (Sinan: 2 %, for a generator
whose rate barely fluctuates; one-second Poisson counts move by more than 2 % at our rates); and
a violation observed in the last second rules out scale-down and hold (scale up: the cheapest
candidate predicted safe, else the caps), a rule Sinan's data collection has and its scheduler
leaves to the model.

`train_sinan(app, seed, ...)` collects, fits, tunes and (with `out_dir`) saves
`sinan-<app>.joblib` (2–3 MB); `load_sinan(path_or_dir, app)` loads it; `SinanController(model)` is
the Controller (it takes the model's tuned thresholds); `train_for_experiment` and
`load_controller` are the entry points of the experiment and hosting.py. Training one application
takes 1.5–3.5 min on this shared 2-core machine (measured: collection 5–10 s, fit 10–25 s,
tuning 60–165 s; Hotel 194 s, Social 89 s).
The trees run on one OpenMP thread (`THREADS`).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import joblib
import numpy as np
from threadpoolctl import threadpool_limits

from agents.params import number_param
from agents.policy import one_line

from .control import AppLimits, clip_cores
from .episode import EPISODE_S, WARMUP_S, run_episodes
from .observation import FIELD, PERCENTILES, StepMeasurement
from .sim import MicroserviceSim
from .topology import Topology, load_topology

FORMAT_VERSION = 1
#: Sinan's CNN looks at the last 5 one-second steps
HISTORY_S = 5
#: Sinan's five end-to-end percentiles
LAT_PCTS = (90, 95, 98, 99, 99.9)
_LAT_IDX = [PERCENTILES.index(p) for p in LAT_PCTS]
FEATURES_PER_SERVICE = ("cand_share", "proj_util_last", "proj_util_mean3", "proj_util_max5",
                        "util_now", "cand_over_limit", "rss_mb")
_MB = 2.0 ** 20
#: OpenMP threads for the trees: one. Small predict batches each second pay more for a thread pool
#: than they gain: on this shared 2-core machine, predicting 25 candidates took 156 ms with the
#: default threads and 7.5 ms with one, and a fit of 8,000 rows 2.5 s against 0.6 s.
THREADS = 1


# ---------------------------------------------------------------------------------------------
# parameters
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SinanParams:
    # scheduler (Sinan's defaults where they exist)
    down_ops: tuple[float, ...] = (0.90, 0.75)          # x current limit (Sinan: -10 %, -1 core)
    up_mult: tuple[float, ...] = (1.10, 1.25)           # x current limit (Sinan: +1 core)
    up_cap: tuple[float, ...] = (0.25, 0.50)            # + share of the cap (Sinan: +25 %, +50 % of max)
    margin: float = 0.125                # predicted p99 < QoS (1 - margin); Sinan: 25 ms of 200 ms
    p_down: float = 0.055                # Sinan --xgb-scale-down-threshold
    p_hold: float = 0.10                 # Sinan --xgb-scale-up-threshold (hold / scale-up acceptance)
    max_util: float = 0.70               # Sinan --max-cpu-util: saturated services are raised to it
    victims_window: int = 5              # Sinan --queueing-delay: actions whose victims may be scaled up
    steady_rps: float = 0.02             # Sinan: no scale-down when |d rps| / rps >= 2 % (plus Poisson noise, ours)
    noise_sigmas: float = 2.0
    min_cores: float = 0.02              # ours (Sinan: 0.5 core, whole cores)
    block_down_on_violation: bool = True

    def __post_init__(self):
        """Each field within its meaning, naming it: unchecked, `p_down="0.1"` failed at the first
        decision, a NaN threshold or margin never scaled down (the caps in silence), and
        `victims_window=0` kept every past action (`[-0:]` is the whole list)."""
        def number(key, low=None, high=None, low_open=False, whole=False):
            x = number_param("sinan", key, getattr(self, key), low=low, high=high, low_open=low_open, whole=whole)
            object.__setattr__(self, key, int(x) if whole else x)

        def numbers(key, low, high=None, low_open=False):
            given = getattr(self, key)
            if isinstance(given, (str, bytes, dict)) or not hasattr(given, "__iter__"):
                raise ValueError(f"sinan: {key} must be a list of numbers, got {given!r}")
            object.__setattr__(self, key, tuple(
                number_param("sinan", f"{key}[{i}]", v, low=low, high=high, low_open=low_open)
                for i, v in enumerate(given)))

        numbers("down_ops", 0, 1, low_open=True)       # a share of the current limit kept
        numbers("up_mult", 1)
        numbers("up_cap", 0)
        number("margin", 0, 1, low_open=False)
        number("p_down", 0, 1)
        number("p_hold", 0, 1)
        number("max_util", 0, 1, low_open=True)
        number("victims_window", 1, whole=True)
        number("steady_rps", 0)
        number("noise_sigmas", 0)
        number("min_cores", 0)
        if not isinstance(self.block_down_on_violation, (bool, np.bool_)):
            raise ValueError(f"sinan: block_down_on_violation must be true or false, "
                             f"got {self.block_down_on_violation!r}")


@dataclass(frozen=True)
class SinanTrainParams:
    copies: int = 48                     # simulated copies per batch
    batches: int = 3                     # each copy draws its own user count per batch
    explore_s: int = 300                 # control seconds per episode (the paper's e_time)
    warmup: int = WARMUP_S
    k: int = 5                           # violation look-ahead (Sinan's data parser: 5 incl. the next)
    roi: float = 1.25                    # p99 / QoS above which only scale-up ops are explored (250 / 200)
    hold_after_violation: int = 3        # Sinan --hold-delay
    explore_rate: float = 0.01           # Sinan explore_rate: a random allocation
    hold_rate: float = 0.05              # Sinan hold_rate
    util_damping: float = 0.99           # Sinan: down ops weighted by exp(-0.99 * projected utilisation)
    # fixed op probabilities per p99/QoS band, ops (x0.75, x0.9, hold, x1.1, x1.25) of the current
    # limit; like the bandit's biases (2.5 for down ops, 2.0 hold, 0.0025 up), up ops are rare
    # while the latency is far from the QoS
    band_edges: tuple[float, ...] = (0.5, 0.8)
    band_probs: tuple[tuple[float, ...], ...] = ((0.40, 0.35, 0.23, 0.015, 0.005),
                                                 (0.15, 0.30, 0.45, 0.07, 0.03),
                                                 (0.05, 0.15, 0.45, 0.25, 0.10))
    recover_ups: tuple[float, ...] = (0.10, 0.25, 0.50)     # + share of the cap (Sinan: +1 core, +25 %, +50 % of max)
    min_cores: float = 0.02
    # the trees
    max_iter: int = 300
    learning_rate: float = 0.08
    max_leaf_nodes: int = 31
    l2: float = 1.0
    validation_share: float = 0.15       # copies held out to report the fit
    upsample_to: float | None = None     # weight violations up to this share (Sinan's parser option: 0.5)


# ---------------------------------------------------------------------------------------------
# history and features (vectorised over copies)
# ---------------------------------------------------------------------------------------------
class History:
    """The last HISTORY_S seconds of E copies: use, limit and resident memory per service, the
    five latency percentiles, requests and failures per second. Oldest first along axis 1."""

    def __init__(self, n_envs: int, n_services: int, h: int = HISTORY_S):
        self.E, self.M, self.h = n_envs, n_services, h
        self.used = np.zeros((n_envs, h, n_services))
        self.limit = np.ones((n_envs, h, n_services))
        self.rss = np.zeros((n_envs, h, n_services))
        self.lat = np.zeros((n_envs, h, len(LAT_PCTS)))
        self.rps = np.zeros((n_envs, h))
        self.fails = np.zeros((n_envs, h))
        self.count = 0

    def push(self, per_service: np.ndarray, latency_ms: np.ndarray, requests: np.ndarray,
             failures: np.ndarray) -> None:
        """per_service (E, M, fields), latency_ms (E, 12), requests and failures (E,)."""
        first = self.count == 0
        for arr in (self.used, self.limit, self.rss, self.lat, self.rps, self.fails):
            arr[:, :-1] = arr[:, 1:]
        self.used[:, -1] = per_service[..., FIELD["cpu_used"]]
        self.limit[:, -1] = np.maximum(per_service[..., FIELD["cpu_limit"]], 1e-6)
        self.rss[:, -1] = per_service[..., FIELD["rss_bytes"]] / _MB
        self.lat[:, -1] = np.nan_to_num(latency_ms[:, _LAT_IDX], nan=0.0)
        self.rps[:, -1] = requests
        self.fails[:, -1] = failures
        if first:                      # a lone first second stands for the whole history
            for arr in (self.used, self.limit, self.rss, self.lat, self.rps, self.fails):
                arr[:] = arr[:, -1:]
        self.count += 1

    def push_measurement(self, m: StepMeasurement) -> None:
        self.push(m.per_service[None], m.latency_ms[None], np.array([m.requests_per_s]),
                  np.array([m.failures_per_s]))


def n_features(n_services: int) -> int:
    return n_services * len(FEATURES_PER_SERVICE) + HISTORY_S * len(LAT_PCTS) + 7


def build_features(hist: History, cand: np.ndarray, caps: np.ndarray, qos_ms: float,
                   env_index: np.ndarray | None = None) -> np.ndarray:
    """Rows of model features, one per candidate. `cand` is (N, M) cores; row n reads the history
    of copy env_index[n] (default: copy n, or copy 0 for every row when the history holds one)."""
    cand = np.maximum(np.asarray(cand, dtype=np.float64), 1e-6)
    N, M = cand.shape
    if env_index is None:
        env_index = np.zeros(N, dtype=int) if hist.E == 1 else np.arange(N)
    used = hist.used[env_index]                  # (N, h, M)
    limit = hist.limit[env_index]
    last = used[:, -1]
    mean3 = used[:, -3:].mean(axis=1)
    max5 = used.max(axis=1)
    cur = limit[:, -1]
    per = np.empty((N, M, len(FEATURES_PER_SERVICE)))
    per[..., 0] = cand / caps
    per[..., 1] = last / cand
    per[..., 2] = mean3 / cand
    per[..., 3] = max5 / cand
    per[..., 4] = last / cur
    per[..., 5] = cand / cur
    per[..., 6] = hist.rss[env_index, -1]
    lat = np.log1p(hist.lat[env_index] / qos_ms).reshape(N, -1)          # (N, h*5)
    rps = hist.rps[env_index]
    app = np.stack([
        np.log1p(rps[:, -1]), np.log1p(rps.mean(axis=1)), np.log1p(hist.fails[env_index, -1]),
        cand.sum(axis=1) / caps.sum(), per[..., 1].max(axis=1), per[..., 3].max(axis=1),
        last.sum(axis=1) / cand.sum(axis=1)], axis=1)
    out = np.concatenate([per.reshape(N, -1), lat, app], axis=1).astype(np.float32)
    return out


# ---------------------------------------------------------------------------------------------
# data collection
# ---------------------------------------------------------------------------------------------
class SinanExplorer:
    """The randomised exploration policy of data collection, for E copies at once."""

    def __init__(self, topo: Topology, n_envs: int, params: SinanTrainParams, rng: np.random.Generator):
        self.topo, self.E, self.p, self.rng = topo, n_envs, params, rng
        self.caps = topo.caps
        self.hold_left = np.zeros(n_envs, dtype=int)
        self.was_violating = np.zeros(n_envs, dtype=bool)

    def act(self, hist: History) -> np.ndarray:
        p, rng, caps = self.p, self.rng, self.caps
        E, M = self.E, self.topo.n_services
        qos = self.topo.qos_ms
        cur = hist.limit[:, -1]
        util = hist.used[:, -3:].mean(axis=1) / np.maximum(hist.limit[:, -3:].mean(axis=1), 1e-9)
        rho = hist.lat[:, -1, LAT_PCTS.index(99)] / qos
        recover = rho > p.roi
        # a violation just ended: hold for a few seconds (Sinan's hold delay)
        ended = self.was_violating & (rho <= 1.0)
        self.hold_left[ended] = p.hold_after_violation
        self.was_violating = rho > 1.0
        # per service ops from the band of the app's p99
        band = np.searchsorted(np.asarray(p.band_edges), rho, side="right")
        probs = np.asarray(p.band_probs)[np.minimum(band, len(p.band_probs) - 1)]   # (E, 5)
        probs = np.broadcast_to(probs[:, None, :], (E, M, 5)).copy()
        down_factors = np.array([0.75, 0.90])
        proj = util[..., None] / down_factors                                      # (E, M, 2)
        probs[..., :2] *= np.exp(-p.util_damping * proj)
        probs /= probs.sum(axis=2, keepdims=True)
        u = rng.random((E, M, 1))
        op = (u > np.cumsum(probs, axis=2)).sum(axis=2)                            # (E, M) in 0..4
        nxt = cur.copy()
        nxt = np.where(op == 0, cur * 0.75, nxt)
        nxt = np.where(op == 1, cur * 0.90, nxt)
        nxt = np.where(op == 3, cur * 1.10, nxt)
        nxt = np.where(op == 4, cur * 1.25, nxt)
        # Sinan's floor for saturated services: not below 70 % projected utilisation
        sat_min = np.where(util > 0.7, cur * util / 0.7, 0.0)
        nxt = np.maximum(nxt, sat_min)
        # recovery: scale-up ops only
        ups = np.asarray(p.recover_ups)[rng.integers(0, len(p.recover_ups), size=(E, M))]
        nxt = np.where(recover[:, None], cur + ups * caps, nxt)
        # holds, then random allocations
        coin = rng.random(E)
        hold = ((coin >= p.explore_rate) & (coin < p.explore_rate + p.hold_rate)) | (self.hold_left > 0)
        hold &= ~recover
        nxt = np.where(hold[:, None], cur, nxt)
        rand = (coin < p.explore_rate) & ~recover
        if rand.any():
            lo = np.maximum(p.min_cores, cur * 0.5)
            nxt = np.where(rand[:, None], lo + rng.random((E, M)) * np.maximum(caps - lo, 0.0), nxt)
        self.hold_left = np.maximum(self.hold_left - 1, 0)
        return np.clip(nxt, p.min_cores, caps)


@dataclass
class SinanData:
    X: np.ndarray           # (N, F) features of (history, applied allocation)
    y_lat: np.ndarray       # (N,) log(p99_{t+1} / QoS)
    y_viol: np.ndarray      # (N,) 1 if p99 > QoS in any of t+1..t+k
    group: np.ndarray       # (N,) copy id (batch * copies + copy), for held-out splits
    users: np.ndarray       # (N,) user count of the copy


def outcome_labels(p99_ms: np.ndarray, qos_ms: float, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The two targets of every second t with k seconds of future (axis 0 is time; the first
    T - k + 1 rows): log(p99_t / QoS), where p99_t is the second the allocation of t was in force,
    and whether any of seconds t .. t+k-1 broke the QoS."""
    n = len(p99_ms) - k + 1
    viol = p99_ms > qos_ms
    win = np.zeros((n,) + p99_ms.shape[1:], dtype=bool)
    for j in range(k):
        win |= viol[j:j + n]
    return np.log(np.maximum(p99_ms[:n], 1e-3) / qos_ms), win.astype(np.int8)


def collect(topo: Topology, seed: int, params: SinanTrainParams | None = None) -> SinanData:
    """Exploration episodes over the app's user range; samples (features, next p99, violation
    within k seconds) of every control second with k seconds of future."""
    p = params or SinanTrainParams()
    rng = np.random.default_rng(seed)
    E, M, k, T = p.copies, topo.n_services, p.k, p.explore_s
    qos = topo.qos_ms
    Xs, yl, yv, gs, us = [], [], [], [], []
    for b in range(p.batches):
        users = rng.uniform(topo.users[0], topo.users[1], size=E)
        sim = MicroserviceSim(topo, n_envs=E, seed=int(rng.integers(2**31)))
        sim.reset(users)
        hist = History(E, M)
        caps = np.tile(topo.caps, (E, 1))
        for _ in range(p.warmup):
            st = sim.step(caps)
            hist.push(st.per_service, st.latency_ms, st.requests, st.failures)
        explorer = SinanExplorer(topo, E, p, rng)
        X = np.zeros((T, E, n_features(M)), dtype=np.float32)
        p99 = np.zeros((T, E))
        for t in range(T):
            cores = explorer.act(hist)
            X[t] = build_features(hist, cores, topo.caps, qos)
            st = sim.step(cores)
            hist.push(st.per_service, st.latency_ms, st.requests, st.failures)
            p99[t] = np.nan_to_num(st.p99_ms, nan=0.0)      # outcome of the action taken at t
        n = T - k + 1
        y_lat, y_viol = outcome_labels(p99, qos, k)
        Xs.append(X[:n].reshape(n * E, -1))
        yl.append(y_lat.reshape(-1))
        yv.append(y_viol.reshape(-1))
        gs.append(np.tile(np.arange(E) + b * E, n))
        us.append(np.tile(users, n))
    return SinanData(np.concatenate(Xs), np.concatenate(yl), np.concatenate(yv), np.concatenate(gs),
                     np.concatenate(us))


# ---------------------------------------------------------------------------------------------
# the model
# ---------------------------------------------------------------------------------------------
@dataclass
class SinanModel:
    app: str
    services: tuple[str, ...]
    caps: np.ndarray
    qos_ms: float
    latency: object                 # HistGradientBoostingRegressor: log(p99_{t+1} / QoS)
    violation: object               # HistGradientBoostingClassifier: P(violation within k s)
    k: int = 5
    info: dict = field(default_factory=dict)
    scheduler: dict = field(default_factory=dict)   # SinanParams fields tuned for this application
    format_version: int = FORMAT_VERSION

    def predict(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(predicted p99 in ms, P(violation within k s)) per row."""
        with threadpool_limits(limits=THREADS):
            lat = self.qos_ms * np.exp(self.latency.predict(X))
            if len(self.violation.classes_) < 2:       # only one class seen in training
                pv = np.full(len(X), float(self.violation.classes_[0]))
            else:
                pv = self.violation.predict_proba(X)[:, 1]
        return lat, pv

    def save(self, directory: str | Path) -> Path:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"sinan-{self.app}.joblib"
        joblib.dump(self, path)
        return path


def load_sinan(path_or_dir: str | Path, app: str | None = None) -> SinanModel:
    p = Path(path_or_dir)
    if p.is_dir():
        if app is None:
            raise ValueError("give the application when loading from a directory")
        p = p / f"sinan-{app}.joblib"
    if not p.is_file():
        raise ValueError(f"{p}: no such Sinan-style model file")
    try:
        model = joblib.load(p)
    except Exception as e:
        # a truncated or foreign file raised UnpicklingError (a traceback out of `samm run`), or a
        # ValueError that did not name the file ("EOF: reading array data ...")
        raise ValueError(f"{p}: not a readable Sinan-style model ({one_line(e)})") from None
    if not isinstance(model, SinanModel) or model.format_version != FORMAT_VERSION:
        raise ValueError(f"{p}: not a Sinan-style model of format {FORMAT_VERSION}")
    if app is not None and model.app != app:
        raise ValueError(f"{p}: a model of {model.app!r}, not {app!r}")
    return model


def fit(topo: Topology, data: SinanData, params: SinanTrainParams | None = None, seed: int = 0,
        holdout_from: np.ndarray | None = None) -> SinanModel:
    """`holdout_from`: the groups the held-out share is drawn from (default: all)."""
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
    from sklearn.metrics import mean_absolute_error, roc_auc_score

    p = params or SinanTrainParams()
    groups = np.unique(data.group if holdout_from is None else holdout_from)
    rng = np.random.default_rng(seed)
    n_val = int(round(len(groups) * p.validation_share))
    val_groups = rng.choice(groups, size=n_val, replace=False) if n_val else np.array([], dtype=int)
    val = np.isin(data.group, val_groups)
    tr = ~val
    kw = dict(max_iter=p.max_iter, learning_rate=p.learning_rate, max_leaf_nodes=p.max_leaf_nodes,
              l2_regularization=p.l2, random_state=seed, early_stopping=False)
    t0 = time.time()
    w = None
    share = float(data.y_viol[tr].mean())
    if p.upsample_to is not None and 0 < share < p.upsample_to:
        # as duplicating violation samples would: their total weight becomes upsample_to of all
        w = np.where(data.y_viol[tr] == 1, p.upsample_to / share * (1 - share) / (1 - p.upsample_to), 1.0)
    with threadpool_limits(limits=THREADS):
        reg = HistGradientBoostingRegressor(**kw).fit(data.X[tr], data.y_lat[tr])
        clf = HistGradientBoostingClassifier(**kw).fit(data.X[tr], data.y_viol[tr], sample_weight=w)
    info = {"samples": int(tr.sum()), "held_out": int(val.sum()),
            "violation_share": float(data.y_viol.mean()), "fit_s": time.time() - t0}
    model = SinanModel(topo.name, topo.service_names, topo.caps.copy(), topo.qos_ms, reg, clf, k=p.k, info=info)
    if val.any():
        lat, pv = model.predict(data.X[val])
        true_ms = topo.qos_ms * np.exp(data.y_lat[val])
        info["val_mae_ms"] = float(mean_absolute_error(true_ms, lat))
        info["val_mae_log"] = float(np.mean(np.abs(np.log(lat / true_ms))))
        yv = data.y_viol[val]
        info["val_auc"] = float(roc_auc_score(yv, pv)) if 0 < yv.mean() < 1 else None
        info["val_brier"] = float(np.mean((pv - yv) ** 2))
    return model


@dataclass(frozen=True)
class SinanTuneParams:
    """Per-application tuning of the scale-down threshold (Sinan's hyperparameters are tuned per
    application, the Reclaimer paper notes). p_hold stays p_down + 0.045, Sinan's gap (0.055 / 0.10)."""
    grid: tuple[float, ...] = (0.02, 0.035, 0.055, 0.08, 0.12, 0.18, 0.25, 0.35)
    start: float = 0.055                     # Sinan's own threshold
    levels: tuple[float, ...] = (0.0, 0.3, 0.7, 1.0)   # shares of the user range (edges included, not the middle)
    seeds: tuple[int, ...] = (2001, 2002)
    steps: int = EPISODE_S
    max_violation: float = 0.005             # at every level (mean over the seeds)


def tune_sinan(model: SinanModel, topo: Topology, tp: SinanTuneParams | None = None) -> list[dict]:
    """Set `model.scheduler` to the cheapest p_down of the grid whose violation rate is at most
    tp.max_violation at every tuning level. From Sinan's 0.055 the search walks up while feasible
    (a higher threshold scales down more, so it can only violate more) or down until feasible; if
    nothing is feasible, the most conservative threshold is kept. Returns the table of trials."""
    tp = tp or SinanTuneParams()
    lo, hi = topo.users
    grid = sorted(tp.grid)
    table: list[dict] = []

    def trial(pd: float) -> dict:
        params = SinanParams(p_down=pd, p_hold=pd + 0.045)
        rates, cores = [], []
        for share in tp.levels:
            res = run_episodes(topo, lambda i: SinanController(model, params), lo + share * (hi - lo),
                               list(tp.seeds), steps=tp.steps)
            rates.append(float(np.mean([r.violation_rate for r in res])))
            cores.append(float(np.mean([r.mean_cores for r in res])))
        row = {"p_down": pd, "p_hold": pd + 0.045, "worst_violation": max(rates),
               "mean_cores": float(np.mean(cores)), "feasible": max(rates) <= tp.max_violation}
        table.append(row)
        return row

    i = grid.index(tp.start) if tp.start in grid else 0
    first = trial(grid[i])
    step = 1 if first["feasible"] else -1
    j = i + step
    while 0 <= j < len(grid):
        row = trial(grid[j])
        if step == 1 and not row["feasible"]:
            break
        if step == -1 and row["feasible"]:
            break
        j += step
    feasible = [r for r in table if r["feasible"]]
    best = min(feasible, key=lambda r: r["mean_cores"]) if feasible else min(table, key=lambda r: r["p_down"])
    model.scheduler = {"p_down": best["p_down"], "p_hold": best["p_hold"]}
    return table


def train_sinan(app: str | Topology, seed: int = 0, params: SinanTrainParams | None = None,
                out_dir: str | Path | None = None, tune: SinanTuneParams | bool | None = True) -> SinanModel:
    """Collect exploration data for one application, fit the two models, tune the scale-down
    threshold for it (`tune=False`: keep Sinan's 0.055 / 0.10), save when `out_dir` is given.
    `model.info` records sample counts, held-out errors, the tuning table and timings."""
    topo = app if isinstance(app, Topology) else load_topology(app)
    p = params or SinanTrainParams()
    t0 = time.time()
    data = collect(topo, seed, p)
    t1 = time.time()
    model = fit(topo, data, p, seed=seed)
    t2 = time.time()
    if tune:
        model.info["tuning"] = tune_sinan(model, topo, tune if isinstance(tune, SinanTuneParams) else None)
    model.info.update({"collect_s": t1 - t0, "fit_total_s": t2 - t1, "tune_s": time.time() - t2,
                       "total_s": time.time() - t0, "seed": seed, "params": asdict(p),
                       "scheduler": dict(model.scheduler)})
    if out_dir is not None:
        model.info["path"] = str(model.save(out_dir))
    return model


# ---------------------------------------------------------------------------------------------
# the scheduler
# ---------------------------------------------------------------------------------------------
@dataclass
class Candidates:
    cores: np.ndarray               # (C, M)
    kind: list[str]                 # "hold", "max", "up", "down"


class SinanController:
    name = "sinan"

    def __init__(self, model: SinanModel, params: SinanParams | None = None):
        self.model = model
        self.p = params or SinanParams(**getattr(model, "scheduler", {}))
        self.limits: AppLimits | None = None
        self.last_choice: dict = {}

    def reset(self, limits: AppLimits) -> None:
        if tuple(limits.services) != tuple(self.model.services):
            raise ValueError(f"the model was trained on {self.model.app}'s services, not these")
        self.limits = limits
        self.hist = History(1, len(limits.services))
        self.victims: list[np.ndarray] = []

    def observe(self, m: StepMeasurement) -> None:
        """Record a second without deciding (the warm-up)."""
        self.hist.push_measurement(m)

    # -- candidates ---------------------------------------------------------------------------
    def candidates(self) -> Candidates:
        p, caps = self.p, self.limits.caps
        M = len(caps)
        cur = self.hist.limit[0, -1]
        util = self.hist.used[0, -3:].mean(axis=0) / np.maximum(self.hist.limit[0, -3:].mean(axis=0), 1e-9)
        floor = np.where(util > p.max_util, cur * util / p.max_util, 0.0)   # saturated: back to 70 %
        base = np.maximum(cur, floor)
        rows, kinds = [base], ["hold"]
        rows.append(caps.copy()); kinds.append("max")
        ups = [lambda c, f=f: c * f for f in p.up_mult] + [lambda c, a=a: c + a * caps for a in p.up_cap]
        for up in ups:
            raised = np.maximum(up(cur), floor)
            for i in np.nonzero(cur < caps - 1e-9)[0]:
                c = base.copy(); c[i] = raised[i]; rows.append(c); kinds.append("up")
            rows.append(raised); kinds.append("up")
            seen: set = set()
            for v in self.victims[::-1]:             # the newest action's victims first, then more
                grown = seen | set(np.nonzero(v)[0].tolist())
                if len(grown) > len(seen):
                    seen = grown
                    c = base.copy(); idx = sorted(seen); c[idx] = raised[idx]
                    rows.append(c); kinds.append("up")
        order = [i for i in np.argsort(util) if util[i] < p.max_util]
        for f in p.down_ops:
            rows.append(np.maximum(cur * f, floor)); kinds.append("down")
            for i in range(M):
                c = base.copy(); c[i] = max(cur[i] * f, floor[i]); rows.append(c); kinds.append("down")
            for l in range(2, len(order)):
                c = base.copy(); idx = order[:l]; c[idx] = np.maximum(cur[idx] * f, floor[idx])
                rows.append(c); kinds.append("down")
        cores = np.clip(np.array(rows), max(p.min_cores, self.limits.floor), caps)
        return Candidates(cores, kinds)

    def _steady(self) -> bool:
        r = self.hist.rps[0]
        now, before = r[-1], r[-2]
        if now <= 0:
            return False
        noise = self.p.noise_sigmas * np.sqrt(max(now + before, 1.0))
        return abs(now - before) <= self.p.steady_rps * now + noise

    # -- the decision -------------------------------------------------------------------------
    def act(self, m: StepMeasurement) -> np.ndarray:
        self.hist.push_measurement(m)
        cur = self.hist.limit[0, -1].copy()
        if self.hist.count < HISTORY_S:             # Sinan holds until it has a full history
            self.victims.append(np.zeros(len(cur), dtype=bool))
            return clip_cores(cur, self.limits)
        cand = self.candidates()
        X = build_features(self.hist, cand.cores, self.limits.caps, self.model.qos_ms)
        lat, pv = self.model.predict(X)
        qos = self.model.qos_ms
        ok_lat = lat < qos * (1.0 - self.p.margin)
        total = cand.cores.sum(axis=1)
        kinds = np.array(cand.kind)
        violated = m.violated()
        block = violated and self.p.block_down_on_violation

        def cheapest(mask: np.ndarray) -> int | None:
            idx = np.nonzero(mask)[0]
            if idx.size == 0:
                return None
            best = np.lexsort((lat[idx], total[idx]))[0]
            return int(idx[best])

        choice, why = None, ""
        if not block and self._steady():
            choice = cheapest((kinds == "down") & ok_lat & (pv <= self.p.p_down))
            why = "down"
        if choice is None and not block and ok_lat[0] and pv[0] < self.p.p_hold:
            choice, why = 0, "hold"
        if choice is None:
            choice = cheapest((kinds == "up") & ok_lat & (pv < self.p.p_hold))
            why = "up"
        if choice is None:
            choice, why = 1, "max"
        nxt = cand.cores[choice]
        self.victims.append(nxt < cur - 1e-12)
        self.victims = self.victims[-self.p.victims_window:]
        self.last_choice = {"why": why, "pred_p99_ms": float(lat[choice]), "p_violation": float(pv[choice]),
                            "candidates": len(kinds), "violated": bool(violated)}
        return clip_cores(nxt, self.limits)


# ---------------------------------------------------------------------------------------------
# entry points for the experiment, the REST service and the testbed loop (hosting.py)
# ---------------------------------------------------------------------------------------------
#: where shipped models live: policies/sinan-<app>.joblib (as experiment.SHIPPED_SINAN)
SHIPPED_DIR = Path(__file__).parent / "policies"


def train_for_experiment(topo: Topology | str, seed: int = 0, seconds: int | None = None,
                         out: str | Path | None = None, tune: SinanTuneParams | bool | None = True) -> SinanModel:
    """`train_sinan` with a data budget: `seconds` is the number of explored control seconds over
    all copies together (None: SinanTrainParams' default, 48 copies x 3 batches x 300 s = 43,200).
    A budget below one full batch shrinks the copies first, then the episode length."""
    topo = topo if isinstance(topo, Topology) else load_topology(topo)
    p = SinanTrainParams() if seconds is None else params_for_budget(seconds)
    return train_sinan(topo, seed=seed, params=p, out_dir=out, tune=tune)


def params_for_budget(seconds: int, p: SinanTrainParams | None = None) -> SinanTrainParams:
    """`p` (default: SinanTrainParams()) collecting about `seconds` explored control seconds over
    all copies together: whole batches first; below one batch, fewer copies, then shorter episodes."""
    p = p or SinanTrainParams()
    seconds = int(seconds)
    if seconds < 2 * (p.k + 10):
        raise ValueError(f"a Sinan-style model needs more than {seconds} explored seconds")
    per_batch = p.copies * p.explore_s
    if seconds >= per_batch:
        return replace(p, batches=max(1, seconds // per_batch))
    explore_s = min(p.explore_s, max(p.k + 10, seconds // 2))
    return replace(p, batches=1, explore_s=explore_s, copies=max(1, seconds // explore_s))


def load_controller(topo: Topology | str, model_dir: str | Path | None = None, **params) -> SinanController:
    """A SinanController for `topo` from `model_dir/sinan-<app>.joblib` (default: SHIPPED_DIR);
    `params` override the model's tuned SinanParams fields (e.g. p_down=0.1)."""
    topo = topo if isinstance(topo, Topology) else load_topology(topo)
    where = Path(model_dir) if model_dir is not None else SHIPPED_DIR
    path = where / f"sinan-{topo.name}.joblib" if where.is_dir() or model_dir is None else where
    if not path.is_file():
        raise ValueError(f"no Sinan-style model for {topo.name!r} at {path}: train one with "
                         f"agents.microservice_cores.sinan.train_sinan({topo.name!r}, out_dir=DIR) and pass that DIR")
    model = load_sinan(path, topo.name)
    sp = SinanParams(**{**model.scheduler, **params}) if params else None
    return SinanController(model, sp)
