"""The paper's per-service observation rows (Table 1), one implementation for the simulator, the
testbed loop and the service.

A row of one second: the 11 per-service counters of observation.SERVICE_FIELDS, the 12
end-to-end latency percentiles and the QoS target, requests/s and failures/s (26 numbers, the
paper's count), then the previous action (the cores set for the second, as a share of the cap).
Counters are put on comparable scales here (log1p of rates, CPU as a share of the cap, latency
as a share of the QoS target, capped at 10); the agent then standardises them with one global
mean and variance vector as the paper does (`sac.Standardiser`).

`FrameStack` keeps the k = 5 most recent rows per service (Table 2) and appends the one-hot
service id once (the paper stacks it with every frame; it never changes, so once is the same
information). Unknown latency (NaN) reads as 0: a controller never acts on such a second
(the loop's guard), but the row must stay finite.

The queue-depth ablation (ours, off by default; `SacConfig.observe_queue`): the paper keeps queue
depth from the agent on purpose. With it on, one more column per service, after the stacked frames
and before the id, holds the work queued at the end of the latest second in seconds of its limit,
log1p-scaled like the counters (`queue_feature`). Only the simulator knows it (the real
containers' queues are not measured), so such a policy runs in simulation only.
"""
from __future__ import annotations

import numpy as np

from .observation import FIELD, P99_INDEX, StepMeasurement

N_NUMERIC = 26
ROW = N_NUMERIC + 1            # + the previous action
LAT_CAP = 10.0
_LOG_FIELDS = ("rx_packets", "tx_packets", "rx_bytes", "tx_bytes", "rss_bytes", "cache_bytes",
               "page_faults", "io_bytes", "io_ops")
#: the column of a row that holds the cores used, as a share of the cap
USED_COLUMN = len(_LOG_FIELDS)
#: the column of a row that holds the first latency percentile, as a share of the QoS target
LATENCY_COLUMN = USED_COLUMN + 2
#: the queue-depth column's ceiling, in seconds of work at the limit in force
QUEUE_CAP_S = 10.0


def observation_layout(k: int, n_services: int, id_width: int | None, observe_queue: bool) -> tuple[int, int]:
    """(width of a service's observation, how many of its leading columns are standardised):
    k stacked rows, the queue-depth column when observed, then the one-hot id (not standardised)."""
    scaled = k * ROW + int(observe_queue)
    return scaled + (id_width or n_services), scaled


def queue_feature(backlog: np.ndarray, limit: np.ndarray) -> np.ndarray:
    """The queue-depth ablation's column (E, M): the work queued at a service (core-seconds) as
    seconds of its CPU limit, capped at QUEUE_CAP_S, then log1p (mostly 0, so a linear column
    would standardise a rare queue into a spike of tens of spreads)."""
    limit = np.maximum(np.asarray(limit, dtype=np.float64), 1e-6)
    q = np.nan_to_num(np.asarray(backlog, dtype=np.float64) / limit, nan=0.0, posinf=QUEUE_CAP_S)
    return np.log1p(np.clip(q, 0.0, QUEUE_CAP_S)).astype(np.float32)


def feature_row_block(per_service: np.ndarray, latency_ms: np.ndarray, requests: np.ndarray,
                      failures: np.ndarray, qos_ms: float, prev_action: np.ndarray,
                      caps: np.ndarray) -> np.ndarray:
    """Rows for E copies at once: per_service (E, M, 11), latency_ms (E, 12), requests and
    failures (E,), prev_action (E, M) in [0, 1] -> (E, M, ROW) float32."""
    E, M, _ = per_service.shape
    out = np.empty((E, M, ROW), dtype=np.float32)
    for j, name in enumerate(_LOG_FIELDS):
        out[..., j] = np.log1p(np.maximum(per_service[..., FIELD[name]], 0.0))
    j = USED_COLUMN
    out[..., j] = per_service[..., FIELD["cpu_used"]] / caps
    out[..., j + 1] = per_service[..., FIELD["cpu_limit"]] / caps
    j = LATENCY_COLUMN
    lat = np.nan_to_num(latency_ms / qos_ms, nan=0.0, posinf=LAT_CAP)
    out[..., j:j + 12] = np.minimum(lat, LAT_CAP)[:, None, :]
    j += 12
    out[..., j] = qos_ms / 1000.0
    out[..., j + 1] = np.log1p(np.maximum(requests, 0.0))[:, None]
    out[..., j + 2] = np.log1p(np.maximum(failures, 0.0))[:, None]
    out[..., j + 3] = prev_action
    assert j + 4 == ROW
    return out


def mean_used(obs: np.ndarray, k: int, caps: np.ndarray) -> np.ndarray:
    """The cores each service used, averaged over the k seconds of a stacked observation
    (..., M, width) -> (..., M): the base of the "usage" action space (action_map.py)."""
    cols = (np.arange(k) * ROW + USED_COLUMN)
    return np.asarray(obs, dtype=np.float64)[..., cols].mean(axis=-1) * caps


def latest_used(obs: np.ndarray, k: int, caps: np.ndarray) -> np.ndarray:
    """The cores each service used in the latest second of a stacked observation (..., M, width) -> (..., M)."""
    return np.asarray(obs, dtype=np.float64)[..., (k - 1) * ROW + USED_COLUMN] * caps


def latest_limit(obs: np.ndarray, k: int, caps: np.ndarray) -> np.ndarray:
    """The cores each service had in the latest second of a stacked observation (..., M, width) -> (..., M)."""
    return np.asarray(obs, dtype=np.float64)[..., (k - 1) * ROW + USED_COLUMN + 1] * caps


def latest_p99_share(obs: np.ndarray, k: int) -> np.ndarray:
    """The latest second's end-to-end p99 as a share of the QoS target (capped at LAT_CAP; an unknown
    latency reads 0, as in the rows) of a stacked observation (..., M, width) -> (...)."""
    return np.asarray(obs, dtype=np.float64)[..., 0, (k - 1) * ROW + LATENCY_COLUMN + P99_INDEX]


def feature_rows(m: StepMeasurement, prev_action: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """One copy: (M, ROW)."""
    return feature_row_block(m.per_service[None], m.latency_ms[None], np.array([m.requests_per_s]),
                             np.array([m.failures_per_s]), m.qos_ms, np.asarray(prev_action)[None],
                             caps)[0]


class FrameStack:
    """The last k rows per service for E copies, then (with `queue`) the latest queue depth, then
    the one-hot id: (E, M, observation_layout(...)[0])."""

    def __init__(self, n_envs: int, n_services: int, k: int = 5, id_width: int | None = None,
                 queue: bool = False):
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            # no frame would leave the "usage" base (the mean over the frames) NaN
            raise ValueError(f"k must be a whole number of stacked seconds >= 1, not {k!r}")
        self.E, self.M, self.k = n_envs, n_services, k
        self.id_width = id_width or n_services
        if self.id_width < n_services:
            raise ValueError(f"id width {self.id_width} is below the {n_services} services")
        self.frames = np.zeros((n_envs, n_services, k, ROW), dtype=np.float32)
        self.queue = np.zeros((n_envs, n_services, int(queue)), dtype=np.float32)
        self.ids = np.zeros((n_services, self.id_width), dtype=np.float32)
        self.ids[np.arange(n_services), np.arange(n_services)] = 1.0

    @property
    def width(self) -> int:
        return observation_layout(self.k, self.M, self.id_width, bool(self.queue.shape[2]))[0]

    def reset(self, rows: np.ndarray, queue: np.ndarray | None = None) -> np.ndarray:
        """Every frame of every copy set to `rows` (E, M, ROW): the first second, repeated."""
        self.frames[:] = rows[:, :, None, :]
        self._set_queue(queue)
        return self.observation()

    def push(self, rows: np.ndarray, queue: np.ndarray | None = None) -> np.ndarray:
        self.frames = np.roll(self.frames, -1, axis=2)
        self.frames[:, :, -1, :] = rows
        self._set_queue(queue)
        return self.observation()

    def _set_queue(self, queue) -> None:
        if not self.queue.shape[2]:
            return
        if queue is None:
            raise ValueError("this observation includes queue depth (the ablation): give each second's queue_feature")
        self.queue[..., 0] = queue

    def observation(self) -> np.ndarray:
        flat = self.frames.reshape(self.E, self.M, self.k * ROW)
        ids = np.broadcast_to(self.ids, (self.E, self.M, self.id_width))
        return np.concatenate([flat, self.queue, ids], axis=2)
