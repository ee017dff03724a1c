"""A production predictor as a floor under the learned rates (ours, not the paper's).

    rate_i = max(RATES[a_i], floor_i),   floor = the N-sigma rule's rate at an aggressive headroom

Why: trained on one week, the paper's agents were safe on the days they trained on and broke their
PMs on held-apart weeks (docs/oversubscription.md, "Where the held-apart gap comes from"), while
the per-subscriber N-sigma rule tuned on the same training days held its bound. Shielding is the
safe-RL answer to a policy that cannot be trusted out of distribution: a rule the operator already
trusts bounds what the agent may do. Here the rule is deliberately aggressive (a headroom below the
tuned one, unsafe on its own), and the agent learns where to reserve MORE than it: it sees the
floor in its observation and can only raise a subscriber's rate above it, never lower it.

The floor is computed from the same history the baselines see (`View.usage_history` after the
training days' `prior`), with `baselines.NSigmaRule`, so there is one N-sigma implementation.
`Shield.floor` keeps the rule's history between the steps of one episode (the simulator) and
starts over when the history is shorter than what it saw; `Shield.floor_fresh` builds it from the
view alone (the service: each request brings its own history).

The same object anchors the headroom action (`mode="headroom"`, ours; settings.ACTIONS): there the
"floor" is the N-sigma FORECAST itself (headroom 1, a floor of ANCHOR_LO instead of the smallest rate),
the agent's action values are headrooms, and

    rate_i = clip(headroom[a_i] * forecast_i, RATES[0], 1)

so the agent scales the rule rather than bounding it; it sees the forecast as the last N values of
its observation, as a shielded agent sees its floor. A subscriber with no usage history has forecast
1.0 and so is not oversubscribed, as with the rules. The anchor's forecast is N-sigma's by default;
`rule` makes it the percentile or the max predictor of Bashir et al. instead (`ANCHOR_RULES`, the
same `baselines` classes as the hosted and tuned rules), so an agent can scale whichever production
predictor saves most on its training days.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .baselines import DEFAULTS, MaxRule, NSigmaRule, PercentileRule, rates_from_prior
from .settings import RATES


MODES = ("floor", "headroom")
#: the forecasts a shield may be built on: rule name -> (its baselines class, its saved "kind")
ANCHOR_RULES = {"NSigma": (NSigmaRule, "nsigma"), "Percentile": (PercentileRule, "percentile"),
                "Max": (MaxRule, "max")}
_RULE_OF_KIND = {kind: name for name, (_, kind) in ANCHOR_RULES.items()}
ANCHOR_LO = 0.001     # the headroom action's forecast floor: low enough that no tuned headroom meets it


@dataclass(frozen=True)
class ShieldSpec:
    # n and window are the tuned N-sigma's on the Azure-like training days (tuning.py, Table 3 run:
    # n 2, window 24, headroom 3); the headroom is lower on purpose, so the floor saves more and
    # the agent has something to add (ours; docs/oversubscription.md measures the choice)
    n: float = 2.0
    window: int = 24
    headroom: float = 2.25
    lo: float = RATES[0]
    mode: str = "floor"
    rule: str = "NSigma"               # the forecast (ANCHOR_RULES); n is N-sigma's and Max's, p the others'
    p: float = DEFAULTS.percentile

    def __post_init__(self):
        # chained comparisons refuse NaN and inf too (a NaN headroom used to load and fail only when serving)
        if (not 0 < self.headroom < np.inf or not 1 <= self.window < np.inf or self.window != int(self.window)
                or not 0 <= self.n < np.inf):
            raise ValueError(f"shield needs a finite headroom > 0, a whole window >= 1 and a finite n >= 0, got {self}")
        if self.rule not in ANCHOR_RULES:
            raise ValueError(f"shield rule must be one of {list(ANCHOR_RULES)}, not {self.rule!r}")
        if not 0.0 <= self.p <= 100.0:
            raise ValueError(f"shield percentile must lie in [0, 100], got {self.p}")
        if not 0.0 < self.lo <= 1.0:
            raise ValueError(f"shield lo must lie in (0, 1], got {self.lo}")
        if self.mode not in MODES:
            raise ValueError(f"shield mode must be one of {list(MODES)}, not {self.mode!r}")

    @classmethod
    def anchor(cls, n: float, window: int, rule: str = "NSigma", p: float = DEFAULTS.percentile) -> "ShieldSpec":
        """The headroom action's anchor: the forecast of `rule` with (n, p, window) itself."""
        return cls(n=float(n), window=int(window), headroom=1.0, lo=ANCHOR_LO, mode="headroom", rule=rule,
                   p=float(p))

    @classmethod
    def from_record(cls, record: dict) -> "ShieldSpec":
        """The anchor of a run's anchor record (train.anchor_spec: rule, its parameters, headroom)."""
        return cls.anchor(record.get("n", cls.n), record["window"], record.get("rule", "NSigma"),
                          record.get("p", cls.p))

    def rule_params(self) -> dict:
        """The forecast's parameters as baselines.make_rule names them."""
        n = {"n": self.n} if self.rule in ("NSigma", "Max") else {}
        p = {"p": self.p} if self.rule in ("Percentile", "Max") else {}
        return {**n, **p, "window": self.window}


def anchor_words(record: dict) -> str:
    """An anchor record in words, as the experiment's report writes it: the rule, the parameters it
    reads, its headroom and where they came from ("Max: n 3, p 99, window 24, headroom 2 (tuned)", or
    "(tuned at 0.875)" for an anchor tuned with a margin)."""
    params = ShieldSpec.from_record(record).rule_params()
    source = record.get("source", "given")
    if "tuned_at" in record:
        source += f" at {record['tuned_at']:g}"
    return (f"{record.get('rule', 'NSigma')}: {', '.join(f'{k} {v:g}' for k, v in params.items())}, "
            f"headroom {record['headroom']:g} ({source})")


class Shield:
    """The floor (or anchor forecast) for `n_subscribers`, with the training days' usage history as its prior."""

    def __init__(self, spec: ShieldSpec, n_subscribers: int, prior: np.ndarray | None):
        self.spec = spec
        self.n = int(n_subscribers)
        self.prior = None if prior is None else np.asarray(prior, dtype=np.float64)
        if self.prior is not None and (self.prior.ndim != 2 or self.prior.shape[1] != self.n):
            # reshaped, another setting's [H, M] history became rows of the wrong subscribers' values
            raise ValueError(f"shield: the prior must be [steps, {self.n}] usage rates, got shape {self.prior.shape}")
        self._rule = ANCHOR_RULES[spec.rule][0](self.n, **spec.rule_params(), headroom=spec.headroom,
                                                lo=spec.lo, prior=self.prior)

    def reset(self) -> None:
        self._rule.reset()

    def floor(self, view) -> np.ndarray:
        """[N] floor rates in [lo, 1]; incremental over one episode's steps."""
        return self._rule.rates(view)

    def floor_fresh(self, view) -> np.ndarray:
        """The same floor computed from the prior and this view's history alone (thread-safe)."""
        return rates_from_prior(self._rule, view)

    def apply(self, values: np.ndarray, floor: np.ndarray) -> np.ndarray:
        """The rates the simulator gets from the agent's action values (rates, or headrooms in
        "headroom" mode) and this step's floor (the forecast in "headroom" mode)."""
        v, f = np.asarray(values, dtype=np.float64), np.asarray(floor, dtype=np.float64)
        if self.spec.mode == "headroom":
            return np.clip(v * f, RATES[0], 1.0)
        return np.maximum(v, f)

    def to_json(self) -> dict:
        spec = asdict(self.spec)
        kind = ANCHOR_RULES[spec.pop("rule")][1]
        for unread in {"n", "p"} - set(self.spec.rule_params()):   # from_json restores its default
            spec.pop(unread)
        return {"kind": kind, **spec,
                "prior": None if self.prior is None else np.where(np.isfinite(self.prior), self.prior, None).tolist()}

    @classmethod
    def from_json(cls, data: dict, n_subscribers: int) -> "Shield":
        data = dict(data)
        kind = data.pop("kind", None)
        if kind not in _RULE_OF_KIND:
            raise ValueError(f"shield: kind must be one of {sorted(_RULE_OF_KIND)}, not {kind!r}")
        data["rule"] = _RULE_OF_KIND[kind]
        prior = data.pop("prior", None)
        if prior is not None:
            # one row per past step, one value per subscriber: a row of another width would otherwise be
            # cut into rows by the reshape and the floor built on values of the wrong subscribers
            if any(not isinstance(row, (list, tuple)) or len(row) != n_subscribers for row in prior):
                raise ValueError(f"shield: every prior row must hold {n_subscribers} usage rates")
            prior = np.array([[np.nan if v is None else v for v in row] for row in prior], dtype=np.float64)
            prior = prior.reshape(-1, n_subscribers)
        return cls(ShieldSpec(**data), n_subscribers, prior)
