"""What one control step measures, on both paths: the simulator emits it and the real-container
testbed builds it from the Docker engine and the load generator, so every controller (the SAC
policy, AutoScale, the Sinan-style model, the VPA recommender) reads one type and
`features.feature_rows` turns it into the paper's per-service rows in one place.

Per service, over the last 1-s interval (the paper's Table 1 where a simulator can have it):
packets and bytes received/sent, resident and cache memory, page faults, CPU time used (core
seconds in that second = cores used), the CPU limit (cores), IO bytes and IO operations.
Application level (the same for every service row): the end-to-end latency percentiles of the
requests that completed in that second, requests and failures per second, and the QoS target.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

SERVICE_FIELDS: tuple[str, ...] = (
    "rx_packets", "tx_packets", "rx_bytes", "tx_bytes",   # communication
    "rss_bytes", "cache_bytes", "page_faults",            # memory
    "cpu_used", "cpu_limit",                              # CPU (cores used in the second, limit)
    "io_bytes", "io_ops",                                 # IO
)
FIELD = {name: i for i, name in enumerate(SERVICE_FIELDS)}
#: end-to-end latency percentiles of the paper's Table 1
PERCENTILES: tuple[float, ...] = (50, 66, 75, 80, 90, 95, 98, 99, 99.9, 99.99, 99.999, 100)
P99_INDEX = PERCENTILES.index(99)


@dataclass
class StepMeasurement:
    """One second of one application. `per_service` is (M, len(SERVICE_FIELDS)) in the order of
    `services`; `latency_ms` holds PERCENTILES (NaN when no request completed in the second, or
    when the load generator is stale)."""

    services: tuple[str, ...]
    per_service: np.ndarray
    latency_ms: np.ndarray
    requests_per_s: float
    failures_per_s: float
    qos_ms: float
    t: float = 0.0
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.per_service = np.asarray(self.per_service, dtype=np.float64)
        self.latency_ms = np.asarray(self.latency_ms, dtype=np.float64)
        m = len(self.services)
        if self.per_service.shape != (m, len(SERVICE_FIELDS)):
            raise ValueError(f"per_service must be ({m}, {len(SERVICE_FIELDS)}), not {self.per_service.shape}")
        if self.latency_ms.shape != (len(PERCENTILES),):
            raise ValueError(f"latency_ms must hold {len(PERCENTILES)} percentiles, not {self.latency_ms.shape}")

    def column(self, name: str) -> np.ndarray:
        return self.per_service[:, FIELD[name]]

    @property
    def cpu_used(self) -> np.ndarray:
        return self.column("cpu_used")

    @property
    def cpu_limit(self) -> np.ndarray:
        return self.column("cpu_limit")

    @property
    def p99_ms(self) -> float:
        return float(self.latency_ms[P99_INDEX])

    @property
    def latency_known(self) -> bool:
        return bool(np.isfinite(self.p99_ms))

    def violated(self) -> bool:
        """QoS broken in this second (unknown latency is not a violation; callers that must be
        safe treat it separately)."""
        return self.latency_known and self.p99_ms > self.qos_ms
