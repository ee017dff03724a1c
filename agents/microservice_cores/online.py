"""Fine-tuning a Reclaimer policy on the live system: a Controller that learns while it acts.

The issue allows the simulator-trained policy to be "fine-tuned on the testbed if needed"; the
paper itself trains on its real cluster (260,000 seconds). `OnlineReclaimer` wraps a saved policy
and, every control second:

  1. builds the observation with `ReclaimerPolicy.observe`, as its `act` does (the paper's rows, 5 frames);
  2. completes the previous second's transition: the reward of this second (the paper's, with the
     policy's own `qos_margin`) scores the limits that were IN FORCE during it, read back from the
     measurement (what the engine applied, after the loop's clipping), not what was asked;
  3. runs `updates_per_step` SAC updates (the policy's own `Sac.update`: critics, actor, entropy
     coefficient, Polyak targets) on a replay of the live transitions only;
  4. acts: SAC's stochastic action while learning (`explore`), the deterministic one otherwise.

The networks, their input standardiser and the learned entropy coefficient start from the saved
policy (every weight is saved with it); the optimisers start fresh. A gap of more than `max_gap_s`
between two measurements (the loop's guard skipped seconds of stale or unknown latency) ends the
chain: no transition spans it; so does a measurement not later than the one before. `close()`
(called by the testbed run at its end) and every `save_every` steps write the policy and
`online.csv` (one row per second) under `out`; saved only at close (`save_every` 0, or far apart),
the rows still go to `online.csv` every `rows_kept` (3,600) steps, so a daemon's learner does not
hold them all in memory. A periodic save that fails is logged and tried again at the next, never
costing the second's decision. A restarted learner continues the policy it saved: the saved
record counts steps, transitions and updates since the base policy, whose version it keeps
(`<base>+online<transitions>`, one suffix however many restarts).

Pure decision and learning code: no I/O but the optional save.
"""
from __future__ import annotations

import csv
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from .action_map import action_of
from .control import AppLimits, clip_cores
from .env import reward_of, service_rewards
from .observation import StepMeasurement
from .policy import ReclaimerPolicy
from .sac import ReplayBuffer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OnlineConfig:
    """Ours (the paper trains online from the start and gives no fine-tuning schedule)."""
    updates_per_step: int = 2     # as the simulator runs (SIM_TRAINING); ~5 ms each for 7 services
    batch: int | None = None      # None: the policy's (Table 2: 100)
    start_after: int = 100        # live transitions before the first update: a batch's worth
    lr: float | None = None       # actor and critics; None: the policy's (the simulator run's 3e-4;
                                  # Table 2's 3e-5 moves a trained policy less per live second)
    explore: bool = True          # SAC's stochastic action while learning
    replay: int = 50_000          # live seconds kept (far more than a session holds)
    max_gap_s: float = 1.5        # a longer gap between two measurements breaks the chain
    save_every: int = 60          # control steps between saves (0: only at close)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.lr is not None and not self.lr > 0:
            raise ValueError(f"online lr must be > 0, got {self.lr}")
        # checked here, not at the first update: a replay of 0 failed every control second, a
        # NaN max_gap_s never broke a chain, a negative count silently never learned
        for name, least in (("updates_per_step", 0), ("start_after", 0), ("replay", 1), ("save_every", 0)):
            if not _whole(getattr(self, name), least):
                raise ValueError(f"online {name} must be a whole number >= {least}, got {getattr(self, name)!r}")
        if self.batch is not None and not _whole(self.batch, 1):
            raise ValueError(f"online batch must be a whole number >= 1 or null, got {self.batch!r}")
        gap = self.max_gap_s
        if isinstance(gap, bool) or not isinstance(gap, (int, float)) or not (0 < gap < np.inf):
            raise ValueError(f"online max_gap_s must be a number of seconds > 0, got {gap!r}")


def _earlier_tuning(policy: ReclaimerPolicy) -> dict:
    """What an earlier online run recorded in the policy it saved (a restarted learner continues
    it): its counts, and the version it started from; none for a policy not tuned online."""
    rec = policy.training.get("online")
    rec = rec if isinstance(rec, dict) else {}
    out = {k: v if _whole(v, 0) else 0 for k in ("steps", "transitions", "updates") for v in [rec.get(k)]}
    sec = rec.get("seconds")
    out["seconds"] = float(sec) if _whole(sec, 0) or (isinstance(sec, float) and 0 <= sec < np.inf) else 0.0
    base = rec.get("base_version")
    out["base_version"] = base if isinstance(base, str) and base else policy.version
    return out


def _whole(v, least: int) -> bool:
    """An int >= least (a bool is not a count; a float would reach numpy's array sizes)."""
    return not isinstance(v, bool) and isinstance(v, int) and v >= least


class OnlineReclaimer:
    name = "reclaimer-online"
    rows_kept = 3600    # rows in memory at most: without `out` the newest, with it written every so many steps

    def __init__(self, policy: ReclaimerPolicy, cfg: OnlineConfig = OnlineConfig(), out=None):
        self.policy = policy
        self.agent = policy.agent
        self.cfg = cfg
        self.topo = policy.topo
        self.out = Path(out) if out is not None else None
        self.limits: AppLimits | None = None
        M = self.topo.n_services
        width = policy.observation_space.shape[1]
        self.split = policy.cfg.reward_split == "service"
        self.buf = ReplayBuffer(cfg.replay, M, width, n_envs=1, seed=cfg.seed, service_rewards=self.split)
        if cfg.lr is not None:
            self.agent.set_lr(cfg.lr)
        torch.manual_seed(cfg.seed)
        self._pending: np.ndarray | None = None
        self._last_t: float | None = None
        self._base = None
        self.steps = self.updates = self.transitions = self.save_errors = 0
        self.rows: list[dict] = []              # rows not yet in online.csv
        # a restarted learner appends to its earlier log (writing it afresh lost the earlier seconds)
        self._csv_started = self.out is not None and (self.out / "online.csv").is_file()
        self._t0 = time.perf_counter()
        self._earlier = _earlier_tuning(policy)

    # -- Controller ----------------------------------------------------------------------------
    def reset(self, limits: AppLimits) -> None:
        self.policy.reset(limits)
        self.limits = limits
        self._pending, self._last_t = None, None     # the policy's reset restarts its frame stack
        self._base = None

    def act(self, m: StepMeasurement) -> np.ndarray:
        caps = self.topo.caps
        space = self.policy.cfg.action_space
        # a second repeated or out of order (a clock stepped back, a replayed measurement) breaks
        # the chain too: no transition may pair a second with one that did not come after it
        gap = self._last_t is not None and not 0 < (m.t - self._last_t) <= self.cfg.max_gap_s
        self._last_t = m.t
        obs = self.policy.observe(m, restart=gap)
        finite = bool(np.isfinite(obs).all())
        if gap:
            self._pending = None
        cores = np.where(np.isfinite(m.cpu_limit), m.cpu_limit, caps)   # unread limit: as if at the cap
        # a limit above the cap (a container without one reads as the host's CPUs) is scored as the
        # cap, the action it is stored as: its raw cost put rewards of -70 into a replay of [-1, 1]
        cores = np.minimum(cores, caps)
        qos = self.topo.qos_ms * self.policy.cfg.qos_margin
        reward = float(reward_of(m.p99_ms, qos, cores, caps, cost=self.policy.cfg.cost))
        if self._pending is not None and finite:   # a non-finite row never enters the replay
            # the action in force, read back from the limits (on "usage", against the base use of
            # the observation it was chosen on)
            in_force = action_of(cores, self._base, caps, space)
            stored = (service_rewards(np.array([m.p99_ms]), qos, cores[None], caps, cost=self.policy.cfg.cost)
                      if self.split else np.array([reward]))
            self.buf.add_batch(self._pending, in_force[None].astype(np.float32), stored, obs,
                               np.zeros(1), np.array([reward == -1.0]), np.zeros(1, dtype=np.int64))
            self.transitions += 1
        stats = None
        if self.buf.size >= max(self.cfg.start_after, 1):
            batch = self.cfg.batch or self.policy.cfg.batch
            for _ in range(self.cfg.updates_per_step):
                stats = self.agent.update(*self.buf.sample(batch))
                self.updates += 1
        a = self.agent.act(obs, deterministic=not self.cfg.explore)[0]
        self._pending = obs.copy() if finite else None
        self.steps += 1
        self.rows.append({"step": self.steps, "t": round(m.t, 3), "reward": round(reward, 5),
                          "p99_ms": round(m.p99_ms, 2), "cores": round(float(cores.sum()), 4),
                          "transitions": self.transitions, "updates": self.updates,
                          "alpha": round(stats.alpha, 6) if stats else "",
                          "q": round(stats.q, 5) if stats else "", "gap": int(gap)})
        if self.out is None and len(self.rows) > self.rows_kept:
            # nowhere to write them: a daemon's learner kept one row a second for good
            del self.rows[:-self.rows_kept]
        elif self.out is not None and len(self.rows) >= self.rows_kept and self.steps % self.rows_kept == 0:
            # saved only at close (save_every 0, or far apart): the log goes out on its own, else a
            # daemon's learner held every second's row in memory until it stopped
            self._periodic(self._write_rows, "the log")
        self._base = self.policy.base_use(obs[0])
        cores_next = clip_cores(self.policy.cores(a, obs[0]), self.limits)
        if self.out is not None and self.cfg.save_every and self.steps % self.cfg.save_every == 0:
            self._periodic(self.save, "the policy and its log")
        return cores_next

    def _periodic(self, write, what: str) -> None:
        """A save between seconds: one that fails (a full disk, an unwritable `out`) is logged and
        its rows kept for the next; the decision of this second stands (the caller's loop would
        otherwise take no action every `save_every` seconds). `close()` still raises."""
        try:
            write()
        except (OSError, RuntimeError) as exc:   # torch.save reports a failed write as RuntimeError
            self.save_errors += 1
            log.warning("reclaimer-online: saving under %s failed (%s: %s); %s tried again later",
                        self.out, type(exc).__name__, exc, what)

    # -- saving --------------------------------------------------------------------------------
    def fine_tuned_policy(self) -> ReclaimerPolicy:
        training = dict(self.policy.training)
        # counted since the base policy, across restarts: a restarted learner's version grew by
        # "+online<n>" with every restart and its record counted only the seconds since the last
        before = self._earlier
        base = before["base_version"]
        training["online"] = {"steps": before["steps"] + self.steps,
                              "transitions": before["transitions"] + self.transitions,
                              "updates": before["updates"] + self.updates,
                              "seconds": round(before["seconds"] + time.perf_counter() - self._t0, 1),
                              "config": asdict(self.cfg), "base_version": base}
        return ReclaimerPolicy(self.agent, self.topo, self.policy.cfg, training,
                               version=f"{base}+online{training['online']['transitions']}",
                               ceiling=self.policy.ceiling)

    def save(self) -> Path | None:
        if self.out is None:
            return None
        self.out.mkdir(parents=True, exist_ok=True)
        d = self.fine_tuned_policy().save(self.out / "policy")
        self._write_rows()
        return d

    def _write_rows(self) -> None:
        """The rows not yet in online.csv, appended (a long-running learner does not rewrite its
        whole history), then dropped from memory."""
        if not self.rows:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        with open(self.out / "online.csv", "a" if self._csv_started else "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(self.rows[0]))
            if not self._csv_started:
                w.writeheader()
            w.writerows(self.rows)
        self._csv_started = True
        self.rows.clear()

    def close(self) -> None:
        self.save()
