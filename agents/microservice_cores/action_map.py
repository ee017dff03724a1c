"""How the agent's action in [0, 1] per service becomes cores, and back: one implementation for
the environment, the trainer, the policy, the REST service and the online learner.

"cap" (the paper, L107–109): cores = a · cap, the hand-set cap u of each service.

"usage" (ours, off by default; `SacConfig.action_space`): the action is the headroom over the
cores the service used, averaged over the k seconds the agent sees (`features.mean_used` of its
observation: the base every caller passes as `used`), on a log scale,

    cores = base · h_lo · (h_hi / h_lo)^a,   base = max(mean use, MIN_CORES),

clipped to [MIN_CORES, cap]. Why: on "cap", a low load's limits all sit in the first tenth of a's
range, where the sigmoid's resolution and the linear cost term are smallest, and the shipped
Hotel policy holds 2.3 times the per-load oracle's cores at 500 users; a headroom of 1.5 over
use is one action at every load. When a service is throttled its use is its limit, so a
headroom above 1 is how a limit grows (h_hi per second at most); h_lo < 1 lets a limit fall
below a few seconds of noisy use. The 5-s mean rather than the last second: a fixed headroom over
the last second breaks QoS far more often at Hotel's low load (benchmarks/reclaimer_headroom.py).
HEADROOM reaches into AutoScale's own range (it holds use / limit in [0.1, 0.3), a headroom of
3.3-10), so the AutoScale fill is represented up to h_hi.

Alone it did not help (docs/microservice-cores.md, "The action as a headroom over use"): Hotel's
500 users fell to 1.61 cores but 3,500 users rose to 8.01. With the mixed fill and one entropy
coefficient per service it gives the shipped Hotel policy (session 44, "One entropy coefficient
per service").

A NaN action (a controller that could not decide) gives the cap on either space, the safe side.

A headroom ceiling (ours, off by default; `ReclaimerPolicy.ceiling`, chosen after training on
validation episodes by `ceiling.py`) caps the cores of either space by the same base use u:

    cap = multiple · u + sqrt · √u      (a `Ceiling`; cores and √cores)
    cap = min(that, max_multiple · u)  (with `max_multiple` H > 0)

The trained policies keep a low load's services at 3-10 times their use, where a fixed rule needs
2 (docs/microservice-cores.md, "A headroom ceiling"): `Ceiling(multiple=H)` is that rule, H times
the use. `Ceiling(sqrt=β)` is square-root staffing (Halfin and Whitt: R servers of offered load
need R + β√R to keep the chance of waiting fixed), with u the offered load in cores: the relative
headroom β/√u is large for a lightly used service, whose use is noisy from second to second, and
small for a busy one. Measured (docs/microservice-cores.md, "A square-root staffing ceiling"): on
Hotel 4.05 mean cores against H = 1.9's 4.08, but one violating second on the check seeds, so not
shipped; on Social even β = 0.3 breaks QoS at 200 users. A throttled service uses its whole limit,
so under either the limit can still grow a second. The relative headroom β/√u of the square root
grows without bound as u falls (2.3 times the use at u = 0.02 core and β = 0.26); `max_multiple` H
bounds it at H times the use for the services below (β/(H − 1))² cores, and leaves the others alone
(ours, session 93: Social's pair held 1.34 cores at 20 users, 2.8 times their use, at a p99 of 38 ms
against 500; docs/history/microservice-cores.md, "A bound on the relative headroom").

A ceiling may also remember (`Ceiling.stateful`; session 88, docs/microservice-cores.md, "A
ceiling that yields to latency"): `window` W takes u as the larger of the 5-s mean and the mean
over the last W seconds, so a second of low use does not pull every limit down with it, while a
rise in use still raises the ceiling within 5 s; `release` f with `hold` S lifts every service's
ceiling for S seconds after any second whose p99 reached f times the QoS target, handing the limits
back to the policy when the load jumps (measured: the 5-s ceiling alone broke QoS in three times
as many seconds as the policy without it after a jump of the load, and a 60-s window without the
release never recovered). `pinned` r lifts one service's ceiling for the same `hold` while its
latest use reached r times its limit, i.e. it is pinned at it: a ramp of the load pins a service
before its latency shows it (measured: Social's widest ramps broke QoS in 66 and 24 seconds of
30,000 without it, none with it, and on 100 fresh seeds 0 against 106 of 120,000; shipped in
Social's ceiling since session 89, not in Hotel's). `panic` P (ours, after Knative's panic mode)
sets every service at its cap for the P seconds after a second whose p99 broke the QoS target:
after a jump of the load the backlog of the jump's second makes the next one slow too unless the
limits reach far above what the policy's own rise gives (measured, session 92: on Social the
policy broke the jump's second and the next, every service at its cap from the second after a
jump breaks the first alone; on Hotel even that breaks both, the floor of a controller without
headroom at the jump). A panic costs nothing in a second that meets the target.
`CeilingMemory` holds that memory for E controlled copies; it is fed
from the latest frame of each observation, so the batch, a controller's `act` and a REST
session share one implementation.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .control import MIN_CORES

ACTION_SPACES = ("cap", "usage")
#: (h_lo, h_hi) of the "usage" space: cores from half of the base use to 8 times it
HEADROOM = (0.5, 8.0)


def check_space(space: str) -> None:
    if space not in ACTION_SPACES:
        raise ValueError(f"action_space must be one of {', '.join(ACTION_SPACES)}, not {space!r}")


@dataclass(frozen=True)
class Ceiling:
    """cap = multiple · u + sqrt · √u cores for a base use u (cores); `window` (s, 0: none) and
    `release`/`hold` make it remember (module doc); `check_ceiling` makes valid ones."""
    multiple: float = 1.0
    sqrt: float = 0.0
    window: int = 0
    release: float = 0.0
    hold: int = 0
    pinned: float = 0.0
    panic: int = 0
    max_multiple: float = 0.0

    def cap(self, base) -> np.ndarray:
        cap = self.multiple * base + self.sqrt * np.sqrt(base)
        return np.minimum(cap, self.max_multiple * base) if self.max_multiple else cap

    @property
    def stateful(self) -> bool:
        """Whether it needs a memory of earlier seconds (`CeilingMemory`)."""
        return self.window > 0 or self.release > 0 or self.pinned > 0 or self.panic > 0

    def to_json(self):
        """A plain multiple as its number (the form policies saved before the square-root rule)."""
        if self.sqrt == 0 and not self.stateful and not self.max_multiple:
            return self.multiple
        out = {"multiple": self.multiple, "sqrt": self.sqrt}
        if self.max_multiple:
            out["max_multiple"] = self.max_multiple
        if self.stateful:
            out.update(window=self.window, release=self.release, hold=self.hold)
            if self.pinned:
                out["pinned"] = self.pinned
            if self.panic:
                out["panic"] = self.panic
        return out

    def label(self) -> str:
        """"1.9" for 1.9 times the use, "sqrt0.13" for u + 0.13 √u, "sqrt0.13-w60-r0.8-h60" with a
        60-s window and a 60-s release at 0.8 of the QoS target, "-panic2" with a 2-s panic at every cap,
        "sqrt0.26-x2" with at most 2 times the use (a policy version's suffix)."""
        if self.sqrt == 0:
            text = f"{self.multiple:g}"
        else:
            text = f"sqrt{self.sqrt:g}" if self.multiple == 1 else f"{self.multiple:g}+sqrt{self.sqrt:g}"
        if self.max_multiple:
            text += f"-x{self.max_multiple:g}"
        if self.window:
            text += f"-w{self.window}"
        if self.pinned:
            text += f"-p{self.pinned:g}"
        if self.release or self.pinned:
            text += (f"-r{self.release:g}" if self.release else "") + f"-h{self.hold}"
        if self.panic:
            text += f"-panic{self.panic}"
        return text


#: the longest memory a ceiling's `window` may ask (s): a day
MAX_WINDOW_S = 86_400

#: the keys a saved ceiling may hold
CEILING_KEYS = ("multiple", "sqrt", "window", "release", "hold", "pinned", "panic", "max_multiple")


def check_ceiling(ceiling) -> Ceiling | None:
    """A headroom ceiling: None (none), a number H >= 1 (H times the use), {"multiple": H >= 1,
    "sqrt": β >= 0, "window": whole seconds >= 0, "release": a share of the QoS target >= 0,
    "hold": whole seconds >= 0, "pinned": a share of the limit in [0, 1], "panic": whole seconds
    >= 0, "max_multiple": 0 (none) or >= 1} or a Ceiling (a limit under the use it must serve would
    throttle the service for good); the Ceiling, or None."""
    if ceiling is None:
        return None
    if isinstance(ceiling, Ceiling):
        parts = {k: getattr(ceiling, k) for k in CEILING_KEYS}
    elif isinstance(ceiling, dict) and ceiling and set(ceiling) <= set(CEILING_KEYS):
        parts = {**{k: getattr(Ceiling(), k) for k in CEILING_KEYS}, **ceiling}
    else:
        parts = {**{k: getattr(Ceiling(), k) for k in CEILING_KEYS}, "multiple": ceiling}

    def number(x, least):
        return not isinstance(x, bool) and isinstance(x, (int, float)) and np.isfinite(x) and x >= least

    def whole(x):
        return number(x, 0) and float(x) == int(x)

    # the memory holds `window` seconds of every service's use, rolled each second: a window of
    # 1e9 s asked 52 GiB at the first decision (MemoryError), 1e8 s a 5-GiB copy every second
    if whole(parts["window"]) and parts["window"] > MAX_WINDOW_S:
        raise ValueError(f"headroom_ceiling's window must be at most {MAX_WINDOW_S} s (a day), "
                         f"not {parts['window']!r}")
    if not (number(parts["multiple"], 1.0) and number(parts["sqrt"], 0.0) and whole(parts["window"])
            and number(parts["release"], 0.0) and whole(parts["hold"])
            and number(parts["pinned"], 0.0) and parts["pinned"] <= 1.0 and whole(parts["panic"])
            and (number(parts["max_multiple"], 1.0) or (number(parts["max_multiple"], 0.0)
                                                        and parts["max_multiple"] == 0))):
        raise ValueError("headroom_ceiling must be a number >= 1 (times the mean use), "
                         "{\"multiple\": >= 1, \"sqrt\": >= 0, \"window\": s >= 0, \"release\": >= 0, "
                         "\"hold\": s >= 0, \"pinned\": 0..1, \"panic\": s >= 0, \"max_multiple\": 0 or >= 1} "
                         f"or null, not {ceiling!r}")
    return Ceiling(float(parts["multiple"]), float(parts["sqrt"]), int(parts["window"]),
                   float(parts["release"]), int(parts["hold"]), float(parts["pinned"]), int(parts["panic"]),
                   float(parts["max_multiple"]))


def check_memoryless(ceiling, where: str) -> Ceiling | None:
    """`check_ceiling` for a path that keeps no memory of earlier seconds (the env, the trainer):
    a stateful ceiling is refused by name rather than applied without its memory."""
    c = check_ceiling(ceiling)
    if c is not None and c.stateful:
        raise ValueError(f"{where}: a headroom_ceiling with a window, a release or a panic ({c.label()}) needs a "
                         "controller's memory of earlier seconds; here only a multiple and a sqrt term apply")
    return c


class CeilingMemory:
    """What a stateful ceiling remembers of E controlled copies: each service's use over the last
    `window` seconds, how many more seconds each copy's ceiling stays lifted after a second whose p99
    reached `release` times the QoS target, and each service's after a second it was `pinned` at
    its limit (that second's decision included), and how many more of each copy's decisions put
    every service at its cap after a second whose p99 broke the target (`panic`)."""

    def __init__(self, ceiling: Ceiling, n_envs: int, n_services: int):
        self.ceiling = ceiling
        self.use = np.zeros((n_envs, max(ceiling.window, 1), n_services))
        self.seen = 0
        self.left = np.zeros(n_envs, dtype=np.int64)
        self.service_left = np.zeros((n_envs, n_services), dtype=np.int64)
        self.panic_left = np.zeros(n_envs, dtype=np.int64)

    def push(self, used, p99_share, limit=None) -> None:
        """One second: the cores each service used (E, M) and the p99 as a share of the QoS target (E,);
        an unknown p99 (NaN) counts as a slow second (lifting is the safe side). The policy reads both
        from an observation's latest frame, where an unknown latency is already 0; its loops do not
        act on such a second. `limit` (E, M): the cores each service had in that second (read by
        `pinned`)."""
        self.use = np.roll(self.use, -1, axis=1)
        self.use[:, -1] = np.nan_to_num(np.asarray(used, dtype=np.float64), nan=0.0)
        self.seen = min(self.seen + 1, self.use.shape[1])
        c = self.ceiling
        share = np.asarray(p99_share, dtype=np.float64)
        if c.release > 0:
            slow = ~(share < c.release)
            self.left = np.where(slow, c.hold + 1, np.maximum(self.left - 1, 0))
        if c.panic > 0:
            self.panic_left = np.where(~(share < 1.0), c.panic, np.maximum(self.panic_left - 1, 0))
        if c.pinned > 0 and limit is not None:
            limit = np.nan_to_num(np.asarray(limit, dtype=np.float64), nan=0.0)
            pinned = self.use[:, -1] >= c.pinned * np.maximum(limit, 1e-9)
            self.service_left = np.where(pinned, c.hold + 1, np.maximum(self.service_left - 1, 0))

    def base(self, fast) -> np.ndarray:
        """The use the ceiling scales (E, M): the larger of `fast` (the 5-s mean) and the window's mean."""
        if not self.ceiling.window or not self.seen:
            return np.asarray(fast, dtype=np.float64)
        return np.maximum(fast, self.use[:, -self.seen:].mean(axis=1))

    def lifted(self) -> np.ndarray:
        """(E, M) whether each service's ceiling is lifted this second (its copy's, or its own)."""
        return (self.left > 0)[:, None] | (self.service_left > 0)

    def panicking(self) -> np.ndarray:
        """(E,) whether each copy's services are all at their caps this second."""
        return self.panic_left > 0


def _base(used) -> np.ndarray:
    """The use a "usage" action scales: NaN read as none, floored at MIN_CORES."""
    return np.maximum(np.nan_to_num(np.asarray(used, dtype=np.float64), nan=0.0), MIN_CORES)


def cores_of(a, used, caps, space: str = "cap", ceiling: Ceiling | float | None = None,
             ceiling_base=None, lifted=None, panic=None) -> np.ndarray:
    """Cores per service for actions a (..., M); `used` (..., M) is the base use (cores), read
    on "usage" and by a headroom `ceiling` (at most ceiling.cap(base use); a number H is
    Ceiling(multiple=H); None: no ceiling). A stateful ceiling's memory gives its own base
    (`ceiling_base`, ..., M), where it is `lifted` (a bool broadcast over the services) and which
    copies panic (`panic`, a bool (...,): every service at its cap)."""
    check_space(space)
    if ceiling is not None and not isinstance(ceiling, Ceiling):
        ceiling = check_ceiling(ceiling)
    caps = np.asarray(caps, dtype=np.float64)
    a = np.asarray(a, dtype=np.float64)
    nan = ~np.isfinite(a)
    a = np.clip(np.where(nan, 1.0, a), 0.0, 1.0)
    if space == "cap":
        cores = a * caps
    else:
        lo, hi = HEADROOM
        cores = _base(used) * lo * (hi / lo) ** a
    if ceiling is not None:
        capped = np.minimum(cores, ceiling.cap(_base(used if ceiling_base is None else ceiling_base)))
        cores = capped if lifted is None else np.where(lifted, cores, capped)
    if panic is not None:
        cores = np.where(np.asarray(panic, dtype=bool)[..., None], caps, cores)
    return np.clip(np.where(nan, caps, cores), MIN_CORES, caps)


def action_of(cores, used, caps, space: str = "cap") -> np.ndarray:
    """The action in [0, 1] that sets `cores` (clipped where no action of the space reaches them)."""
    check_space(space)
    caps = np.asarray(caps, dtype=np.float64)
    cores = np.asarray(cores, dtype=np.float64)
    if space == "cap":
        return np.clip(cores / caps, 0.0, 1.0)
    lo, hi = HEADROOM
    return np.clip(np.log(np.maximum(cores, MIN_CORES) / (_base(used) * lo)) / np.log(hi / lo), 0.0, 1.0)


def scaled_actions(a, scales, caps, space: str = "cap") -> np.ndarray:
    """Each action (E, M) with its cores multiplied by each of `scales` (C,): (E, C, M) actions,
    the QoS-classifier explorer's candidates. On "cap" this is the paper's a · (1 + c), floored at
    MIN_CORES / cap; on "usage" the same cores, a shift of log(1 + c) / log(h_hi / h_lo)."""
    check_space(space)
    a = np.asarray(a, dtype=np.float64)
    scales = np.asarray(scales, dtype=np.float64)
    if space == "cap":
        caps = np.asarray(caps, dtype=np.float64)
        return np.clip(a[:, None, :] * scales[None, :, None], MIN_CORES / caps, 1.0)
    lo, hi = HEADROOM
    return np.clip(a[:, None, :] + (np.log(scales) / np.log(hi / lo))[None, :, None], 0.0, 1.0)
