"""The paper's observation (§6.2 "State"), one implementation for the simulator, the service and the
live admission path.

State = [cpu^allo, cpu^requested, mem^allo, network^allo] (each an N-vector: every subscriber's live
reservations and its live requested cores), the request [cpu, mem, network]^request (N-vectors: what
each subscriber asks for now) and the hour of the day. Every agent sees the whole state (its Q^i is
its own network, so no agent id is needed); the cluster term Q^c sees the same vector.

Scaling (ours; the paper gives none): cluster-level vectors are divided by the cluster's capacity
spread over the subscribers, requests by one PM's capacity, so typical values are O(1); the hour is
one-hot (24), which lets a small network learn hour-specific rates.

`features="usage"` (ours, an ablation; the paper's state has no usage) appends, per subscriber, the
last observed usage rate of its live VMs and the highest over the last 24 observed hours: what the
MA / SL / N-sigma rules see.

A shielded agent (shield.py, ours) also sees its floor: the N-sigma rule's rate per subscriber, last.
"""
from __future__ import annotations

import numpy as np

from .settings import Setting

HOURS = 24


FEATURE_SETS = ("paper", "usage")


def observation_size(setting: Setting, features: str = "paper", floor: bool = False) -> int:
    if features not in FEATURE_SETS:
        raise ValueError(f"features must be one of {FEATURE_SETS}, not {features!r}")
    return (7 * setting.n_subscribers + HOURS + (2 * setting.n_subscribers if features == "usage" else 0)
            + (setting.n_subscribers if floor else 0))


def observation(view, setting: Setting, features: str = "paper", floor: np.ndarray | None = None) -> np.ndarray:
    """`floor`: a shielded agent's floor rates (shield.py), appended as the last N values."""
    n = setting.n_subscribers
    cap = np.array([setting.pm_cores, setting.pm_mem_gb, setting.pm_net_gbps])
    share = cap * setting.n_pms / n
    out = np.zeros(observation_size(setting, features, floor is not None), dtype=np.float32)
    alloc = np.asarray(view.allocated, dtype=np.float64).reshape(n, 3)
    out[0:n] = alloc[:, 0] / share[0]
    out[n:2 * n] = np.asarray(view.requested_live, dtype=np.float64) / share[0]
    out[2 * n:3 * n] = alloc[:, 1] / share[1]
    out[3 * n:4 * n] = alloc[:, 2] / share[2]
    req = np.asarray(view.request, dtype=np.float64).reshape(n, 3) / cap
    out[4 * n:5 * n] = req[:, 0]
    out[5 * n:6 * n] = req[:, 1]
    out[6 * n:7 * n] = req[:, 2]
    out[7 * n + int(view.hour) % HOURS] = 1.0
    if features == "usage":
        base = 7 * n + HOURS
        out[base:base + n], out[base + n:base + 2 * n] = usage_features(view, n)
    if floor is not None:
        out[-n:] = np.asarray(floor, dtype=np.float64).reshape(n)
    return out


def usage_features(view, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Each subscriber's last observed usage rate and its highest over the last 24 observed hours
    (0 where nothing was observed): the `usage` block of the observation."""
    hist = np.asarray(view.usage_history, dtype=np.float64).reshape(-1, n)
    if not len(hist):
        return np.zeros(n), np.zeros(n)
    recent = hist[-24:]
    with np.errstate(all="ignore"):
        peak = np.where(np.isnan(recent).all(axis=0), 0.0, np.nanmax(np.where(np.isnan(recent), -1, recent), axis=0))
    return np.nan_to_num(hist[-1], nan=0.0), np.maximum(peak, 0.0)


def request_mask(view) -> np.ndarray:
    """m^i_t of Eq. 9: agent i counts only when its subscriber has a request now."""
    return np.asarray(view.has_request, dtype=bool)
