"""A Kubernetes-VPA / Autopilot-style recommender as a Controller: per service, a high percentile
of the CPU use seen over a moving window, plus a safety margin.

    limit_i = clip(max(min_cores, (1 + margin) * P_p(use_i over the last window_s seconds)), floor, cap_i)

Where the parameters come from:

* **percentile.** The VPA recommender's target is the 90th percentile of its CPU-usage histogram
  (`--target-cpu-percentile=0.9`; its upper bound uses the 95th,
  `--recommendation-upper-bound-cpu-percentile=0.95`). Autopilot's moving-window recommender takes
  a high percentile (or the max) of a decaying window of usage samples. Our default is the 95th
  percentile: one-second samples are much noisier than the VPA's one-minute ones, and p99 latency
  within a second is hurt by the seconds in the top tail (our choice).
* **margin.** VPA's `--recommendation-margin-fraction=0.15` (15 % above the percentile), kept.
* **min_cores.** VPA's `--pod-recommendation-min-cpu-millicores=25` (0.025 cores), kept.
* **window_s.** VPA keeps a histogram with a 24 h decay half-life, Autopilot a decaying window of
  hours; an episode here lasts 300 s at one load, so we keep the last 60 one-second samples (the
  length of the warm-up, so the warm-up fills exactly one window; our choice). `half_life_s`
  optionally weights samples by exp-decay as VPA/Autopilot do (default: off, a plain window).

How it differs from the originals: VPA sets *requests* and applies them by evicting pods (minutes);
here the recommendation is the CPU *limit* and is applied every second through live updates, as
every method of this problem is. VPA's confidence multipliers for short histories are left out: the
window is seeded from the warm-up instead.

Seeding: `observe(m)` records a second without deciding. An episode runner calls it for each
warm-up second (60 s at the caps) so that the first control second already has a full window. A
controller that was never given a warm-up seeds its window from the first measurement `act` sees.

Use (CPU time per second) is capped by the limit; a throttled service reads `use == limit`, so the
percentile sits at the limit and the margin raises it by 15 % a second until the service is no
longer throttled: the recommender recovers from under-allocation by itself, slowly.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from agents.params import number_param

from .control import AppLimits, clip_cores
from .observation import StepMeasurement

#: the longest window: a day of one-second samples, the VPA's own 24 h half-life (the ring buffer
#: holds window_s rows per service, and every second takes their percentile)
MAX_WINDOW_S = 24 * 3600


@dataclass(frozen=True)
class VPAParams:
    percentile: float = 95.0       # of the window's use samples (VPA's target: 90; ours: 95, see above)
    margin: float = 0.15           # VPA --recommendation-margin-fraction
    window_s: int = 60             # one-second samples kept (our choice: the warm-up's length)
    min_cores: float = 0.025       # VPA --pod-recommendation-min-cpu-millicores=25
    half_life_s: float | None = None   # exp-decay weights of samples (None: a plain window)

    def __post_init__(self):
        # each a finite number naming its field: a NaN margin or floor made every limit the cap in
        # silence, a fractional window failed only at reset, a huge one asked for that much memory
        checked = {
            "percentile": number_param("vpa", "percentile", self.percentile, low=0, low_open=True, high=100),
            "margin": number_param("vpa", "margin", self.margin, low=0),
            "window_s": int(number_param("vpa", "window_s", self.window_s, low=1, high=MAX_WINDOW_S, whole=True)),
            "min_cores": number_param("vpa", "min_cores", self.min_cores, low=0),
        }
        if self.half_life_s is not None:
            checked["half_life_s"] = number_param("vpa", "half_life_s", self.half_life_s, low=0, low_open=True)
        for key, value in checked.items():
            given = getattr(self, key)
            # "90" from a config file is kept as 90.0, a window of 60.0 as 60 (it sizes an array)
            if isinstance(given, str) or (key == "window_s" and type(given) is not int):
                object.__setattr__(self, key, value)


def weighted_percentile(samples: np.ndarray, q: float, weights: np.ndarray | None = None) -> np.ndarray:
    """The q-th percentile (0-100) of `samples` (T, M) along axis 0. Without weights it is NumPy's
    linear-interpolation percentile; with weights it is the smallest sample whose cumulative weight
    reaches q % of the total (the histogram reading the VPA uses)."""
    samples = np.asarray(samples, dtype=np.float64)
    if weights is None:
        return np.percentile(samples, q, axis=0)
    w = np.asarray(weights, dtype=np.float64)
    order = np.argsort(samples, axis=0)
    s = np.take_along_axis(samples, order, axis=0)
    cw = np.cumsum(w[order], axis=0)
    cw /= cw[-1:]
    idx = np.argmax(cw >= q / 100.0 - 1e-12, axis=0)
    return s[idx, np.arange(s.shape[1])]


def vpa_recommend(window: np.ndarray, params: VPAParams) -> np.ndarray:
    """Cores per service from a window of use samples (T, M), oldest first (before the caps)."""
    window = np.asarray(window, dtype=np.float64)
    weights = None
    if params.half_life_s is not None:
        age = np.arange(window.shape[0])[::-1]          # 0 for the newest sample
        weights = 0.5 ** (age / params.half_life_s)
    p = weighted_percentile(window, params.percentile, weights)
    return np.maximum(params.min_cores, (1.0 + params.margin) * p)


class VPARecommender:
    """The Controller: a ring buffer of the last `window_s` use samples per service."""

    name = "vpa"

    def __init__(self, params: VPAParams | None = None):
        self.params = params or VPAParams()
        self.limits: AppLimits | None = None
        self._buf: np.ndarray | None = None
        self._n = 0          # samples recorded so far
        self._next = 0       # ring position of the next sample

    def reset(self, limits: AppLimits) -> None:
        self.limits = limits
        self._buf = np.zeros((self.params.window_s, len(limits.services)))
        self._n = 0
        self._next = 0

    def observe(self, m: StepMeasurement) -> None:
        """Record one second's use (warm-up or control); unknown use (NaN) is skipped."""
        use = np.asarray(m.cpu_used, dtype=np.float64)
        if not np.all(np.isfinite(use)):
            return
        self._buf[self._next] = np.maximum(use, 0.0)
        self._next = (self._next + 1) % self.params.window_s
        self._n = min(self._n + 1, self.params.window_s)

    def window(self) -> np.ndarray:
        """The samples held, oldest first (n, M)."""
        if self._n < self.params.window_s:
            return self._buf[: self._n].copy()
        return np.roll(self._buf, -self._next, axis=0)

    def act(self, m: StepMeasurement) -> np.ndarray:
        self.observe(m)
        if self._n == 0:            # nothing usable yet: hold the limits as they are
            return clip_cores(m.cpu_limit, self.limits)
        return clip_cores(vpa_recommend(self.window(), self.params), self.limits)

    def describe(self) -> dict:
        return {"method": self.name, **asdict(self.params)}
