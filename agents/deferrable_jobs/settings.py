"""The constants of OSDEC's formulation (osdec-deferrable-scheduling.txt) and our readings where
the paper is silent.

Paper: reward per slot = sum over started jobs of (c*d - w1*delay) - w2*violation with w1 = 2,
w2 = 10 (Eq. 6, Table 3, L289); gamma = 0.99 per slot (Table 3); the six sensitivity settings of
Table 4 (L299-L303): core distributions over 4 categories and duration distributions over 6.

Ours (docs/deferrable-jobs.md), the paper gives none of these:
* one slot = 15 minutes, an episode = 96 slots (one day). The capacity series are 5-minute
  aggregates, so a slot's capacity is the mean of three readings;
* the 4 core categories are 1, 2, 4 and 8 cores, and the 6 duration categories are 1, 2, 4, 6,
  9 and 12 slots (15 min to 3 h);
* the fleet has 80 cores. On-demand use takes 20-80 % of it, so the capacity left for deferrable
  jobs, C_t, is between 16 and 64 cores;
* a job is submitted 0-4 slots before its earliest start, and its window (latest - earliest) is
  0-8 slots; the real-time setting of Table 2 has no window and no lead;
* a job whose latest start passes unstarted is dropped: the paper's constraint X_it = 0 outside
  [e_i, l_i] means it earns nothing, and we add no penalty (counted as `missed`).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace

W_DELAY = 2.0          # omega_1 (Table 3)
W_VIOLATION = 10.0     # omega_2 (Table 3)
GAMMA = 0.99           # per slot (Table 3)

CORE_CATEGORIES = (1, 2, 4, 8)
DURATION_CATEGORIES = (1, 2, 4, 6, 9, 12)

#: Table 4 (L299-L303)
CORE_CASES = {
    1: (0.51, 0.37, 0.08, 0.04),
    2: (0.25, 0.25, 0.25, 0.25),
    3: (0.4, 0.3, 0.2, 0.1),
}
DURATION_CASES = {
    1: (1 / 6,) * 6,
    2: (0.4, 0.25, 0.15, 0.1, 0.05, 0.05),
    3: (0.6, 0.25, 0.1, 0.05, 0.0, 0.0),
}


@dataclass(frozen=True)
class Setting:
    """One environment setting: where capacity and jobs come from and how they are shaped."""
    name: str
    slots: int = 96                    # episode length (one day of 15-minute slots)
    slot_minutes: int = 15
    fleet_cores: int = 80
    ondemand_low: float = 0.2          # on-demand share of the fleet at the series' minimum
    ondemand_high: float = 0.8         # ... and at its maximum
    capacity_noise: float = 0.03       # AR(1) noise on the on-demand share (std, fraction of the fleet)
    capacity_source: str = "azure_v2"  # datacenter-traces-aggregated series, or "synthetic"
    #: None = the empirical Alibaba 2017 batch-task distribution binned into the categories
    core_probs: tuple[float, ...] | None = None
    duration_probs: tuple[float, ...] | None = None
    offered_load: float = 0.7          # expected offered core-slots / expected capacity core-slots (calibrated: docs)
    lead_max: int = 4                  # earliest - submission, uniform 0..lead_max slots
    window_max: int = 8                # latest - earliest, uniform 0..window_max slots
    max_eligible: int = 64             # jobs the agent's observation shows (EDF order beyond)
    max_running: int = 64
    max_future: int = 32

    def __post_init__(self):
        # zero sizes divided by zero in the features, and negative ones failed deep inside NumPy
        for name in ("slots", "slot_minutes", "fleet_cores", "max_eligible", "max_running", "max_future"):
            _check_whole(self, name, 1)
        for name in ("lead_max", "window_max"):
            _check_whole(self, name, 0)
        for name in ("ondemand_low", "ondemand_high", "capacity_noise", "offered_load"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
                raise ValueError(f"setting {self.name!r}: {name} must be a finite number >= 0, got {value!r}")
        if self.ondemand_high > 1:
            raise ValueError(f"setting {self.name!r}: ondemand_high is a share of the fleet (<= 1), got "
                             f"{self.ondemand_high!r}")
        if self.ondemand_low > self.ondemand_high:
            # the capacity series was mapped upside down: the busiest hours had the most capacity
            raise ValueError(f"setting {self.name!r}: ondemand_low {self.ondemand_low!r} is above ondemand_high "
                             f"{self.ondemand_high!r}")
        for name in ("core_probs", "duration_probs"):
            probs = getattr(self, name)
            if probs is not None and (any(not math.isfinite(p) or p < 0 for p in probs) or sum(probs) <= 0):
                raise ValueError(f"setting {self.name!r}: {name} must be finite, >= 0 and not all 0, got {probs}")

    def scaled(self, **changes) -> "Setting":
        return replace(self, **changes)

    @property
    def realtime(self) -> bool:
        return self.lead_max == 0 and self.window_max == 0


def _check_whole(setting: Setting, name: str, low: int) -> None:
    value = getattr(setting, name)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"setting {setting.name!r}: {name} must be a whole number >= {low}, got {value!r}")


def _table4(name: str, core_case: int | None = None, dur_case: int | None = None) -> Setting:
    return Setting(name=name,
                   core_probs=CORE_CASES[core_case] if core_case else None,
                   duration_probs=DURATION_CASES[dur_case] if dur_case else None)


SETTINGS: dict[str, Setting] = {
    "default": Setting(name="default"),
    # Table 2: every job must start in the slot it is submitted
    "realtime": Setting(name="realtime", lead_max=0, window_max=0),
    # Table 4's six sensitivity settings: one distribution replaced, the other empirical
    "core1": _table4("core1", core_case=1),
    "core2": _table4("core2", core_case=2),
    "core3": _table4("core3", core_case=3),
    "dur1": _table4("dur1", dur_case=1),
    "dur2": _table4("dur2", dur_case=2),
    "dur3": _table4("dur3", dur_case=3),
    # seconds-fast setting for tests and smoke runs (synthetic capacity, no data files)
    "tiny": Setting(name="tiny", slots=24, fleet_cores=24, capacity_source="synthetic",
                    core_probs=CORE_CASES[1], duration_probs=DURATION_CASES[3],
                    max_eligible=16, max_running=16, max_future=8),
}

TABLE4 = ("core1", "core2", "core3", "dur1", "dur2", "dur3")


def get_setting(name: str | Setting) -> Setting:
    if isinstance(name, Setting):
        return name
    try:
        return SETTINGS[name]
    except KeyError:
        raise ValueError(f"unknown deferrable-jobs setting {name!r}; choose from {sorted(SETTINGS)}") from None
