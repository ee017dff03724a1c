"""What the agents see, computed one way for the simulator, the env, the REST service and the
live scheduling loop.

State (§4.1.1): s_t = (B^his running, B^cur eligible, B^fut submitted-but-future, C_t). We encode
it as a set of job tokens, one per job, each with its kind, its own attributes and the slot's
capacity (the paper concatenates C_t to every job vector, Eq. 2). Up to `max_eligible` eligible
jobs are shown, in EDF order (earliest latest-start first), then the running and future ones,
packed, then padding (masked), so a batch can be cut to its longest set. The eligible tokens
come first: the policy's score i belongs to eligible row i.

The auxiliary tasks (§4.2.2) read a window of per-slot summaries (capacity, violation, the mean
cores and duration of the eligible jobs, ...): `slot_summary`. Their four targets are the next
slot's capacity, mean cores, mean duration and violation (`AUX_TARGETS`).
"""
from __future__ import annotations

import numpy as np

from .settings import CORE_CATEGORIES, DURATION_CATEGORIES, Setting

TOKEN_FEATURES = ("eligible", "running", "future", "cores", "duration", "revenue", "waited", "slack",
                  "until_eligible", "remaining", "capacity", "free", "time_left")
SUMMARY_FEATURES = ("capacity", "free", "violation", "n_eligible", "mean_cores", "mean_duration",
                    "running_cores", "n_future", "day_sin", "day_cos")
#: next-slot quantities the auxiliary tasks predict: capacity, mean cores, mean duration, violation
AUX_TARGETS = (0, 4, 5, 2)
HISTORY = 8          # summaries the auxiliary GRU reads (not given by the paper; our choice)

_C = float(max(CORE_CATEGORIES))
_D = float(max(DURATION_CATEGORIES))


def n_tokens(setting: Setting) -> int:
    return setting.max_eligible + setting.max_running + setting.max_future


def job_tokens(view, setting: Setting) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens [N, F] float32, mask [N] bool, eligible rows shown [<= max_eligible])."""
    ep, t, K = view.episode, view.t, float(setting.fleet_cores)
    W = float(max(setting.window_max, 1))
    L = float(max(setting.lead_max, 1))
    elig = view.eligible[: setting.max_eligible]
    run = view.running[: setting.max_running]
    fut = view.future[: setting.max_future]
    N = n_tokens(setting)
    tok = np.zeros((N, len(TOKEN_FEATURES)), dtype=np.float32)
    mask = np.zeros(N, dtype=bool)
    offset = 0
    for rows, kind in ((elig, 0), (run, 1), (fut, 2)):
        n = len(rows)
        if not n:
            continue
        sl = slice(offset, offset + n)
        offset += n
        mask[sl] = True
        tok[sl, kind] = 1.0
        tok[sl, 3] = ep.cores[rows] / _C
        tok[sl, 4] = ep.duration[rows] / _D
        tok[sl, 5] = ep.cores[rows] * ep.duration[rows] / (_C * _D)
        if kind == 0:
            tok[sl, 6] = (t - ep.earliest[rows]) / W
            tok[sl, 7] = (ep.latest[rows] - t) / W
        elif kind == 1:
            tok[sl, 9] = (view.start[rows] + ep.duration[rows] - t) / _D
        else:
            tok[sl, 7] = (ep.latest[rows] - t) / (W + L)
            tok[sl, 8] = (ep.earliest[rows] - t) / L
    tok[mask, 10] = view.capacity / K
    tok[mask, 11] = view.free / K
    tok[mask, 12] = (view.slots - t) / float(view.slots)
    return tok, mask, elig


def slot_summary(view, setting: Setting) -> np.ndarray:
    ep, K = view.episode, float(setting.fleet_cores)
    elig = view.eligible
    per_day = max(1, 1440 // setting.slot_minutes)
    phase = 2 * np.pi * (view.t % per_day) / per_day
    return np.array([
        view.capacity / K,
        view.free / K,
        max(0.0, view.running_cores - view.capacity) / K,
        len(elig) / float(setting.max_eligible),
        ep.cores[elig].mean() / _C if len(elig) else 0.0,
        ep.duration[elig].mean() / _D if len(elig) else 0.0,
        view.running_cores / K,
        len(view.future) / float(setting.max_future),
        np.sin(phase),
        np.cos(phase),
    ], dtype=np.float32)


class SummaryHistory:
    """The last `HISTORY` slot summaries, oldest first, zero-padded at an episode's start."""

    def __init__(self, size: int = HISTORY):
        self.buf = np.zeros((size, len(SUMMARY_FEATURES)), dtype=np.float32)
        self.slot: int | None = None     # the slot the last push was for, where the caller said (`seek`)
        self._before = self.buf.copy()   # the window before that push

    def reset(self) -> None:
        self.buf[:] = 0.0
        self.slot = None

    def seek(self, slot: int) -> None:
        """Make the next push the summary of `slot`. The same slot again (a caller's retry, or two
        processes deciding one slot through one session) replaces the summary pushed for it: it
        took a second place in the window, shifting the auxiliary inputs off the ones trained on,
        and the retry got another answer. An earlier slot starts the window afresh, as the
        simulator does at a new episode: a session reused for another run carried the last run's
        slots into its first ones."""
        if self.slot is not None and slot == self.slot:
            self.buf[:] = self._before
        elif self.slot is not None and slot < self.slot:
            self.buf[:] = 0.0
        self._before = self.buf.copy()
        self.slot = slot

    def push(self, summary: np.ndarray) -> np.ndarray:
        self.buf[:-1] = self.buf[1:]
        self.buf[-1] = summary
        return self.buf.copy()
