"""Baseline oversubscription rules: what the allocator sees -> one reservation rate per subscriber.

Every rule follows one small protocol (`RateRule`): `reset()` at a new episode and
`rates(view) -> [N]` floats in (0, 1]. Continuous rates are allowed (the simulator takes any rate in
(0, 1]); only the learned agent is bound to the paper's six RATES.

From the paper (§6.4, L229):
* `GridRule(rho)`: one static rate for all subscribers (Grid-0.2/0.4/0.6 as printed; Grid-1.0 is no
  oversubscription). Its S-Cores is exactly 1 - rho.
* `BrownDESRule` ("MA", Chen et al. 2018b): each subscriber's usage RATE forecast one step ahead with
  Brown's double exponential smoothing (the paper's related work names it, L40).
* `SupervisedMaxRule` ("SL", Kumbhare et al. 2021): a regressor trained on the training days only
  predicts each subscriber's MAXIMUM usage rate over the next `horizon_hours`.
Beyond the paper, the per-task predictors of Bashir et al., EuroSys'21 ("Take it to the limit"), applied
per subscriber to its usage-rate history:
* `NSigmaRule(n, window)`: mean + n * std of the last `window` observations;
* `PercentileRule(p, window)`: their "RC-like" predictor, the p-th percentile of that window;
* `MaxRule(n, p, window)`: their "max" ensemble, the larger of the two;
* `BorgDefaultRule(fraction)`: a fixed fraction of the limit (requested cores). Their simulator's
  docs and a reading note give no production value we could verify; the note's example is 90 %, which
  we take as the default (our choice). It is the same rule as Grid(fraction).

From a usage forecast to a reservation rate (the `headroom`): a predictor estimates how much of its
requested cores a subscriber USES; the allocator needs how much to RESERVE. A PM whose 64 cores are all
reserved at rate r by VMs using a fraction u of their requests runs at u / r of its cores, and it is hot
above beta = 0.6 (Table 4), so r >= u / beta keeps a fully packed PM cool: headroom = 1 / beta ~ 1.67 is
that break-even. PMs are rarely packed full (memory and network bind first) and subscribers' peaks do
not all coincide, so the headroom is tuned on the training days (`tuning.py`), not fixed; every
predictor rule reserves clip(headroom * forecast, lo, 1).

History (`prior`): `view.usage_history` [t, N] is the episode's past usage rates (NaN where a
subscriber had no live VM). Production predictors also have last week's history, so every history rule
takes `prior: [H, N]`, the usage-rate history of the TRAINING days replayed at rate 1.0
(`replay_usage_history(setting, trace.train_workload())`). The rule's history is the prior followed by
the episode's; NaN steps are skipped, so a "window" counts observations, not hours. A subscriber with
no observation at all gets 1.0 (no oversubscription).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np

from .settings import RATES, Setting
from .sim import OversubSim, View
from .workload import Workload


class RateRule(Protocol):
    name: str

    def reset(self) -> None: ...

    def rates(self, view: View) -> np.ndarray: ...


@dataclass(frozen=True)
class RuleDefaults:
    """Defaults of the baselines' knobs; tuning.PARAM_GRIDS searches most of them."""

    lo: float = RATES[0]           # floor of any rate: the paper's smallest rate 0.2 (§6.2); our choice to use it
    beta: float = 0.6              # hot threshold (Table 4): headroom 1/beta is the full-PM break-even
    des_smoothing: float = 0.5     # Brown's a; not given by the paper; our choice (tuned)
    nsigma_n: float = 5.0          # Bashir et al.'s simulator docs use n = 5 in their example
    window: int = 24               # observations (hours): one day; not given by either paper; our choice
    percentile: float = 99.0       # not given; our choice (tuned)
    borg_fraction: float = 0.9     # example value in a reading note of Bashir et al.; unverified; our choice

    @property
    def headroom(self) -> float:
        return 1.0 / self.beta


DEFAULTS = RuleDefaults()


def replay_usage_history(setting: Setting, workload: Workload, warm: bool = False) -> np.ndarray:
    """[T, N] usage-rate history of `workload` replayed without oversubscription (rate 1.0): the
    `prior` a production predictor would have from the training days. The usage rate does not depend
    on the rates except through rejected VMs, and rate 1.0 is what the logged days ran at."""
    sim = OversubSim(setting, workload, warm_start=warm)
    ones = np.ones(setting.n_subscribers)
    view = sim.reset()
    while view is not None:
        view, _ = sim.step(ones)
    return sim.usage_history.copy()


class ObservedHistory:
    """Each subscriber's observed usage rates, oldest first: the prior's, then the episode's.

    `sync(view)` appends the episode rows the view has that were not seen yet, so a rule pays for
    each step once; `reset()` forgets the episode but keeps the prior."""

    def __init__(self, n_subscribers: int, prior: np.ndarray | None = None):
        self.n = int(n_subscribers)
        prior = np.empty((0, self.n)) if prior is None else np.asarray(prior, dtype=np.float64)
        if prior.ndim != 2 or prior.shape[1] != self.n:
            raise ValueError(f"prior must be [H, {self.n}], got shape {prior.shape}")
        self.prior = prior
        self._values = np.full((max(64, 2 * len(prior) + 64), self.n), np.nan)
        self._count = np.zeros(self.n, dtype=np.int64)
        self._extend(prior)
        self._prior_count = self._count.copy()
        self.seen = 0   # episode rows already appended

    def reset(self) -> None:
        self._count[:] = self._prior_count
        self.seen = 0

    def copy(self) -> "ObservedHistory":
        """An independent history with the same observations (the prior is shared: never written)."""
        out = object.__new__(type(self))
        out.n, out.prior, out.seen = self.n, self.prior, self.seen
        out._values, out._count, out._prior_count = self._values.copy(), self._count.copy(), self._prior_count
        return out

    def _extend(self, rows: np.ndarray) -> None:
        """Append [k, N] steps at once, each subscriber's observed values after its own last one.
        One pass for the whole block: a service request brings a day of history (24 rows), and
        appending it a row at a time cost more than the policy's forward pass."""
        got = np.isfinite(rows)
        added = got.sum(axis=0)
        need = int((self._count + added).max(initial=0))
        if need > len(self._values):
            grown = np.full((max(2 * len(self._values), need), self.n), np.nan)
            grown[: len(self._values)] = self._values
            self._values = grown
        if len(rows) == 1:      # the simulator's step: the plain row write is twice as fast
            idx = np.flatnonzero(got[0])
            self._values[self._count[idx], idx] = rows[0, idx]
        else:
            r, c = np.nonzero(got)
            # within a column, np.nonzero lists rows in order, so the k-th observation lands k places on
            slot = self._count[c] + (np.cumsum(got, axis=0) - 1)[r, c]
            self._values[slot, c] = rows[r, c]
        self._count += added

    def sync(self, usage_history: np.ndarray) -> list[np.ndarray]:
        """Append the unseen rows of the episode's history; return them (one array per step)."""
        t = len(usage_history)
        if t < self.seen:        # a new episode began without reset(): start it over
            self.reset()
        if t == self.seen:
            return []
        block = np.asarray(usage_history[self.seen:t], dtype=np.float64).reshape(t - self.seen, self.n)
        self._extend(block)
        self.seen = t
        return list(block)

    def count(self) -> np.ndarray:
        return self._count.copy()

    def recent(self, sub: int, k: int) -> np.ndarray:
        """The last k observations of subscriber `sub` (fewer if it has fewer)."""
        c = int(self._count[sub])
        return self._values[max(0, c - int(k)):c, sub]

    def last(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Every subscriber's last k observations at once: ([k', N] values, NaN-padded at the top
        where a subscriber has fewer; [N] how many are real). k' = min(k, the longest history, at
        least 1): rows no subscriber has would be padding only, and a hosted `window=10**12` asked
        for terabytes on every request."""
        k = max(1, min(int(k), int(self._count.max(initial=0))))
        rows = self._count[None, :] - k + np.arange(k)[:, None]          # [k, N]
        vals = self._values[np.maximum(rows, 0), np.arange(self.n)[None, :]]
        return np.where(rows >= 0, vals, np.nan), np.minimum(self._count, k)


def rates_from_prior(rule: "RateRule", view: View) -> np.ndarray:
    """`rule`'s rates for `view` from its prior and the view's own history alone, on a copy: neither
    `rule` nor any other caller's history is touched (a service request brings its whole history).
    A history rule copies only its history (`_HistoryRule.fresh`): a deep copy of the whole rule
    cost the admit route more than the forecast itself."""
    fresh = rule.fresh() if isinstance(rule, _HistoryRule) else copy.deepcopy(rule)
    fresh.reset()
    return fresh.rates(view)


def forecast_to_rate(forecast: np.ndarray, headroom: float, lo: float) -> np.ndarray:
    """Reservation rate from a usage-rate forecast; NaN (no history) -> 1.0 (no oversubscription)."""
    f = np.asarray(forecast, dtype=np.float64)
    out = np.clip(headroom * np.nan_to_num(f, nan=1.0), lo, 1.0)
    return np.where(np.isfinite(f), out, 1.0)


def round_up(rates: np.ndarray, grid=RATES) -> np.ndarray:
    """Each rate to the smallest rate of `grid` (ascending) at or above it; above the largest, the largest."""
    g = np.asarray(grid, dtype=np.float64)
    idx = np.searchsorted(g, np.asarray(rates, dtype=np.float64) - 1e-12, side="left")
    return g[np.minimum(idx, len(g) - 1)]


class RoundedUp:
    """A rule whose rates are rounded up to an agent's action set (default the paper's RATES): what the
    rule would save, and how safe it would be, if it had to choose as the learned agent does."""

    def __init__(self, rule: RateRule, grid=RATES, label: str = "RATES"):
        self.rule, self.grid = rule, tuple(grid)
        self.name = f"{rule.name} rounded up to {label}"

    def reset(self) -> None:
        self.rule.reset()

    def rates(self, view: View) -> np.ndarray:
        return round_up(self.rule.rates(view), self.grid)


# ----------------------------------------------------------------------------- static rules
class GridRule:
    """One static rate rho for every subscriber (Govindaraju et al. 2015, as the paper's Grid-rho)."""

    def __init__(self, rho: float, n_subscribers: int, name: str | None = None):
        if not 0.0 < rho <= 1.0:
            raise ValueError(f"rho must lie in (0, 1], got {rho}")
        self.rho = float(rho)
        self.n = int(n_subscribers)
        self.name = name or f"Grid-{rho:g}"

    def reset(self) -> None:
        pass

    def rates(self, view: View) -> np.ndarray:
        return np.full(self.n, self.rho)


class BorgDefaultRule(GridRule):
    """Bashir et al.'s borg-default: the peak is a fixed fraction of the sum of limits, so each VM
    reserves that fraction of its requested cores. Identical to Grid(fraction)."""

    def __init__(self, fraction: float, n_subscribers: int):
        super().__init__(fraction, n_subscribers, name=f"BorgDefault-{fraction:g}")


# ----------------------------------------------------------------------------- history rules
class _HistoryRule:
    """Shared machinery: keep the observed history, forecast per subscriber, turn it into a rate."""

    name = "history"

    def __init__(self, n_subscribers: int, headroom: float, lo: float = DEFAULTS.lo,
                 prior: np.ndarray | None = None):
        if not (headroom > 0 and np.isfinite(headroom)):   # NaN passed `<= 0`: every rate NaN
            raise ValueError(f"headroom must be a finite positive number, got {headroom!r}")
        if not 0.0 < lo <= 1.0:
            raise ValueError("lo must lie in (0, 1]")
        self.n = int(n_subscribers)
        self.headroom = float(headroom)
        self.lo = float(lo)
        self.history = ObservedHistory(self.n, prior)

    def reset(self) -> None:
        self.history.reset()

    def fresh(self) -> "_HistoryRule":
        """A copy that shares nothing it writes: the history is copied, the parameters shared.
        A subclass's other state must be rebuilt by its reset() (BrownDESRule's is)."""
        out = copy.copy(self)
        out.history = self.history.copy()
        return out

    def forecast(self, view: View) -> np.ndarray:
        """[N] usage-rate forecast, NaN where a subscriber has no observation."""
        raise NotImplementedError

    def rates(self, view: View) -> np.ndarray:
        self.history.sync(view.usage_history)
        return forecast_to_rate(self.forecast(view), self.headroom, self.lo)


class BrownDESRule(_HistoryRule):
    """"MA" (Chen et al. 2018b): Brown's double exponential smoothing of each subscriber's usage rate.

    With smoothing a: S1 <- a x + (1 - a) S1, S2 <- a S1 + (1 - a) S2 (both start at the first
    observation); the one-step forecast is level + trend = (2 S1 - S2) + a / (1 - a) (S1 - S2).
    A step without observation (no live VM) leaves the state as it was."""

    def __init__(self, n_subscribers: int, smoothing: float = DEFAULTS.des_smoothing,
                 headroom: float = DEFAULTS.headroom, lo: float = DEFAULTS.lo,
                 prior: np.ndarray | None = None):
        if not 0.0 < smoothing < 1.0:
            raise ValueError("Brown's smoothing factor must lie in (0, 1)")
        self.a = float(smoothing)
        self.name = f"MA(a={smoothing:g},h={headroom:g})"
        self._s1 = np.full(n_subscribers, np.nan)
        self._s2 = np.full(n_subscribers, np.nan)
        super().__init__(n_subscribers, headroom, lo, prior)
        for row in self.history.prior:
            self._smooth(row)
        self._prior_state = (self._s1.copy(), self._s2.copy())

    def _smooth(self, row: np.ndarray) -> None:
        got = np.isfinite(row)
        first = got & ~np.isfinite(self._s1)
        self._s1[first] = row[first]
        self._s2[first] = row[first]
        upd = got & ~first
        a = self.a
        self._s1[upd] = a * row[upd] + (1 - a) * self._s1[upd]
        self._s2[upd] = a * self._s1[upd] + (1 - a) * self._s2[upd]

    def reset(self) -> None:
        super().reset()
        self._s1, self._s2 = self._prior_state[0].copy(), self._prior_state[1].copy()

    def rates(self, view: View) -> np.ndarray:
        if len(view.usage_history) < self.history.seen:
            self.reset()
        for row in self.history.sync(view.usage_history):
            self._smooth(row)
        return forecast_to_rate(self.forecast(view), self.headroom, self.lo)

    def forecast(self, view: View | None = None) -> np.ndarray:
        s1, s2, a = self._s1, self._s2, self.a
        return (2 * s1 - s2) + a / (1 - a) * (s1 - s2)


def check_sigmas(n) -> float:
    """N-sigma's n: a finite number >= 0 (the shield and the hosted rules refuse the same). NaN or inf
    made every forecast non-finite, so every rate 1.0 in silence; fewer than 0 sigmas forecasts below
    the mean."""
    try:
        x = float(n)
    except (TypeError, ValueError):
        x = float("nan")
    if not 0.0 <= x < float("inf"):
        raise ValueError(f"n must be a finite number of standard deviations >= 0, got {n!r}")
    return x


def check_window(window) -> int:
    """A window counts past observations: a whole number >= 1 (0 or less gave rate 1.0 in silence,
    or an IndexError in the percentile)."""
    try:
        x = float(window)
    except (TypeError, ValueError):
        x = float("nan")
    if isinstance(window, bool) or not (np.isfinite(x) and x.is_integer() and x >= 1):
        raise ValueError(f"window must be a whole number of observations >= 1, got {window!r}")
    return int(x)


def window_mean_std(history: ObservedHistory, window: int) -> tuple[np.ndarray, np.ndarray]:
    """[N] mean and population std of each subscriber's last `window` observations (NaN: none)."""
    x, n = history.last(window)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.nansum(x, axis=0) / n
        var = np.nansum((x - mean) ** 2, axis=0) / n
    return np.where(n > 0, mean, np.nan), np.where(n > 0, np.sqrt(var), np.nan)


def window_percentile(history: ObservedHistory, window: int, p: float) -> np.ndarray:
    """[N] p-th percentile of each subscriber's last `window` observations, interpolated linearly
    between order statistics as numpy.percentile's default (NaN: none)."""
    x, n = history.last(window)
    s = np.sort(x, axis=0)                                   # NaN padding sorts to the bottom
    pos = p / 100.0 * np.maximum(n - 1, 0)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, np.maximum(n - 1, 0))
    cols = np.arange(history.n)
    out = s[lo, cols] + (pos - lo) * (s[hi, cols] - s[lo, cols])
    return np.where(n > 0, out, np.nan)


class NSigmaRule(_HistoryRule):
    """Bashir et al.'s N-sigma: mean + n * std (population std) of the last `window` observations."""

    def __init__(self, n_subscribers: int, n: float = DEFAULTS.nsigma_n, window: int = DEFAULTS.window,
                 headroom: float = DEFAULTS.headroom, lo: float = DEFAULTS.lo,
                 prior: np.ndarray | None = None):
        super().__init__(n_subscribers, headroom, lo, prior)
        self.n_sigma, self.window = check_sigmas(n), check_window(window)
        self.name = f"NSigma(n={n:g},w={window},h={headroom:g})"

    def forecast(self, view: View | None = None) -> np.ndarray:
        mean, std = window_mean_std(self.history, self.window)
        return mean + self.n_sigma * std


class PercentileRule(_HistoryRule):
    """Bashir et al.'s RC-like predictor: the p-th percentile (linear interpolation) of the last
    `window` observations."""

    def __init__(self, n_subscribers: int, p: float = DEFAULTS.percentile, window: int = DEFAULTS.window,
                 headroom: float = DEFAULTS.headroom, lo: float = DEFAULTS.lo,
                 prior: np.ndarray | None = None):
        if not 0.0 <= p <= 100.0:
            raise ValueError(f"p (a percentile) must lie in [0, 100], got {p!r}")
        super().__init__(n_subscribers, headroom, lo, prior)
        self.p, self.window = float(p), check_window(window)
        self.name = f"Percentile(p={p:g},w={window},h={headroom:g})"

    def forecast(self, view: View | None = None) -> np.ndarray:
        return window_percentile(self.history, self.window, self.p)


class MaxRule(_HistoryRule):
    """Bashir et al.'s max ensemble: the larger of N-sigma and the percentile over one window."""

    def __init__(self, n_subscribers: int, n: float = DEFAULTS.nsigma_n, p: float = DEFAULTS.percentile,
                 window: int = DEFAULTS.window, headroom: float = DEFAULTS.headroom,
                 lo: float = DEFAULTS.lo, prior: np.ndarray | None = None):
        if not 0.0 <= p <= 100.0:   # above 100 every full window indexed past its end
            raise ValueError(f"p (a percentile) must lie in [0, 100], got {p!r}")
        super().__init__(n_subscribers, headroom, lo, prior)
        self.n_sigma, self.p, self.window = check_sigmas(n), float(p), check_window(window)
        self.name = f"Max(n={n:g},p={p:g},w={window},h={headroom:g})"

    def forecast(self, view: View | None = None) -> np.ndarray:
        mean, std = window_mean_std(self.history, self.window)
        return np.fmax(mean + self.n_sigma * std, window_percentile(self.history, self.window, self.p))


# ----------------------------------------------------------------------------- supervised (SL)
@dataclass(frozen=True)
class SLParams:
    """The SL regressor. Kumbhare et al. (2021) give neither features nor model for our setting; all
    values are not given by the paper; our choice."""

    # Target: the max usage rate over the next 24 hours. A VM keeps its reservation for its whole life
    # and a day covers a full diurnal cycle, so the peak the reservation must absorb is the daily peak
    # whatever hour the VM arrives; Bashir et al.'s peak oracle also looks one day ahead by default.
    horizon_hours: int = 24
    short_window: int = 6      # observations in the "recent mean" feature
    long_window: int = 24      # observations in the recent max / mean / std features
    n_estimators: int = 100
    max_depth: int = 3
    learning_rate: float = 0.1
    random_state: int = 0


def sl_features(recent: list[np.ndarray], subs: np.ndarray, hours: np.ndarray, n_subscribers: int,
                params: SLParams = SLParams()) -> np.ndarray:
    """Rows of [one-hot subscriber (N), hour of day, last, mean of the last `short_window`, mean, max
    and std of the last `long_window` observations, their count / long_window]. Each `recent[i]` holds
    at least one observation, oldest first."""
    m = len(recent)
    out = np.zeros((m, n_subscribers + 7))
    for i, x in enumerate(recent):
        x = x[-params.long_window:]
        out[i, subs[i]] = 1.0
        out[i, n_subscribers:] = (hours[i], x[-1], x[-params.short_window:].mean(), x.mean(), x.max(),
                                  x.std(), len(x) / params.long_window)
    return out


class MaxUsageModel:
    """Gradient boosting (scikit-learn, single-threaded) predicting a subscriber's max usage rate over
    the next `horizon_hours` from its recent observations and the hour of day."""

    def __init__(self, n_subscribers: int, params: SLParams = SLParams()):
        self.n = int(n_subscribers)
        self.params = params
        self.model = None
        self.n_samples = 0

    def training_set(self, histories: list[tuple[np.ndarray, int]]) -> tuple[np.ndarray, np.ndarray]:
        """Samples from [T, N] usage-rate histories (with each one's start hour): at every step t whose
        next `horizon_hours` steps lie inside the history, features of the observations before t and
        the max observed rate in [t, t + horizon)."""
        p = self.params
        recent, subs, hours, target = [], [], [], []
        for hist, start_hour in histories:
            hist = np.asarray(hist, dtype=np.float64)
            for n in range(self.n):
                col = hist[:, n]
                for t in range(1, len(col) - p.horizon_hours + 1):
                    past = col[max(0, t - 4 * p.long_window):t]
                    past = past[np.isfinite(past)]
                    ahead = col[t:t + p.horizon_hours]
                    if not len(past) or not np.isfinite(ahead).any():
                        continue
                    recent.append(past)
                    subs.append(n)
                    hours.append((start_hour + t) % 24)
                    target.append(np.nanmax(ahead))
        if not recent:
            raise ValueError("no training sample: histories are shorter than the horizon or empty")
        x = sl_features(recent, np.array(subs), np.array(hours), self.n, p)
        return x, np.array(target)

    def fit(self, histories: list[tuple[np.ndarray, int]]) -> "MaxUsageModel":
        from sklearn.ensemble import GradientBoostingRegressor

        x, y = self.training_set(histories)
        p = self.params
        self.model = GradientBoostingRegressor(n_estimators=p.n_estimators, max_depth=p.max_depth,
                                               learning_rate=p.learning_rate, random_state=p.random_state)
        self.model.fit(x, y)
        self.n_samples = len(y)
        return self

    def predict(self, recent: list[np.ndarray], subs: np.ndarray, hour: int) -> np.ndarray:
        if self.model is None:
            raise RuntimeError("MaxUsageModel.fit() first")
        x = sl_features(recent, np.asarray(subs), np.full(len(recent), hour), self.n, self.params)
        return self.model.predict(x)


class SupervisedMaxRule(_HistoryRule):
    """"SL" (Kumbhare et al. 2021): reserve headroom x the predicted max usage rate."""

    def __init__(self, model: MaxUsageModel, headroom: float = DEFAULTS.headroom, lo: float = DEFAULTS.lo,
                 prior: np.ndarray | None = None):
        super().__init__(model.n, headroom, lo, prior)
        self.model = model
        self.name = f"SL(L={model.params.horizon_hours},h={headroom:g})"

    def forecast(self, view: View) -> np.ndarray:
        out = np.full(self.n, np.nan)
        subs = np.flatnonzero(self.history.count() > 0)
        if len(subs):
            recent = [self.history.recent(i, self.model.params.long_window) for i in subs]
            out[subs] = self.model.predict(recent, subs, view.hour)
        return out


# ----------------------------------------------------------------------------- registry
@dataclass
class RuleContext:
    """What a rule factory may use: the setting, the training days' prior history and, for SL, the
    training histories its model learns from (fitted lazily, once per SLParams)."""

    setting: Setting
    prior: np.ndarray | None = None
    training_histories: list[tuple[np.ndarray, int]] = field(default_factory=list)
    _models: dict = field(default_factory=dict, repr=False)

    def sl_model(self, params: SLParams = SLParams()) -> MaxUsageModel:
        if params not in self._models:
            if not self.training_histories:
                raise ValueError("SL needs training histories (RuleContext.training_histories)")
            self._models[params] = MaxUsageModel(self.setting.n_subscribers, params).fit(self.training_histories)
        return self._models[params]


def _grid(rho: float):
    return lambda ctx, rho=rho: GridRule(rho, ctx.setting.n_subscribers)


RULES: dict[str, Callable[..., RateRule]] = {
    "Grid-0.2": _grid(0.2),
    "Grid-0.4": _grid(0.4),
    "Grid-0.6": _grid(0.6),
    "Grid-1.0": _grid(1.0),
    "Grid-best": lambda ctx, rho: GridRule(rho, ctx.setting.n_subscribers, name=f"Grid-best({rho:g})"),
    "MA": lambda ctx, **kw: BrownDESRule(ctx.setting.n_subscribers, prior=ctx.prior, **kw),
    "SL": lambda ctx, headroom, lo=DEFAULTS.lo, **sl: SupervisedMaxRule(
        ctx.sl_model(SLParams(**sl)), headroom=headroom, lo=lo, prior=ctx.prior),
    "NSigma": lambda ctx, **kw: NSigmaRule(ctx.setting.n_subscribers, prior=ctx.prior, **kw),
    "Percentile": lambda ctx, **kw: PercentileRule(ctx.setting.n_subscribers, prior=ctx.prior, **kw),
    "Max": lambda ctx, **kw: MaxRule(ctx.setting.n_subscribers, prior=ctx.prior, **kw),
    "BorgDefault": lambda ctx, fraction=DEFAULTS.borg_fraction: BorgDefaultRule(fraction, ctx.setting.n_subscribers),
}


def make_rule(name: str, ctx: RuleContext, **params) -> RateRule:
    try:
        factory = RULES[name]
    except KeyError:
        raise ValueError(f"unknown baseline {name!r}; choose from {sorted(RULES)}") from None
    return factory(ctx, **params)
