"""A vectorised queueing-network simulator of a microservice application, one step = one second.

E independent copies of one application step together (NumPy over (envs, services)), so a batch
of episodes costs little more than one. Per second and per copy:

1. **Load (closed loop).** N users think for Exp(1/rate) and wait for their response; the
   response-time law gives the request rate X = N / (Z + R), R the previous second's mean
   end-to-end latency, so a slow application gets fewer requests, as under Locust. Requests of
   each type arrive Poisson(X · mix).
2. **Work.** A service's calls are its requests' expected visits (cache misses included); their
   CPU work is the calls times the mean CPU per call, with the spread of a sum of exponentials.
3. **CPU limit and backlog (fluid).** A service serves at most min(limit, workers) core-seconds
   per second; what it cannot serve stays as backlog for the next second, so under-allocation
   keeps hurting after it ends. Work queued for longer than the timeout fails (failures/s):
   a request type fails with the worst dropped share among the services it visits, and its
   failed requests count at the timeout in its own draws.
4. **Latency under a CFS quota.** A limit of L cores is the kernel's quota: L·P core-seconds per
   period P = 100 ms, every thread running at a full core's speed until the period's quota is
   spent, then all of them stalled until the period ends. So a call's sojourn = network hop +
   the wait behind the backlog + the M/M/c wait of that second (Erlang C with c = ceil(L)
   full-speed servers, utilisation capped below 1, the backlog covering overload) + an Exp
   service time at full speed + a throttle stall: a period runs out of quota with the chance
   θ that its demand D (compound Poisson, normal approximation) exceeds L·P, certainly while a
   backlog is queued; it then stalls for W = P·(1 − L/c) (the longest stall, which matches the
   real containers best), and a call meets that stall with the chance θ·W/P, waiting U(0, W).
   At an integer limit W = 0 and the service is exactly M/M/c. Two options of the topology
   for the real-container twin (off elsewhere): `throttle_chain` q, the chance that a stalled
   call sits out the next whole period too (a Geometric number of periods), and host noise,
   an extra Exp(`jitter_ms`) on a call with the chance `jitter_p`. A CFS burst (`cfs_burst` b,
   the testbed's `--cpu-burst`, off by default): a period is throttled only when its demand
   exceeds (1 + b)·L·P, the burst taken as banked in full, and then stalls for P·(1 − (1 + b)·L/c).
   K requests per copy are drawn, stratified over the types, and composed along their call
   graphs (sequential stages add, parallel calls take the slowest, detached calls are not
   waited for); the paper's latency percentiles of the second come from these K, or
   (`percentiles_over: requests`) from as many of them as the second had requests, as a load
   generator computes them: a second of 25 requests has a p99 near their maximum.

`validate` in tests compares a single service with the exact M/M/c formulas. What the
simulator does not model (documented in docs/microservice-cores.md): memory limits, network
contention, and cold caches.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit
from scipy.special import ndtr

from .control import MIN_CORES
from .observation import FIELD, PERCENTILES, SERVICE_FIELDS, StepMeasurement
from .topology import MAX_REQUESTS_PER_S, CallNode, Topology

#: requests drawn per copy and second to estimate the latency percentiles
DEFAULT_SAMPLES = 256
#: the M/M/c term is evaluated at most at this utilisation; beyond, the fluid backlog takes over
RHO_CAP = 0.97
#: the CFS period of Docker's --cpus (cpu.cfs_period_us = 100000)
CFS_PERIOD_S = 0.1


@dataclass(frozen=True)
class _Node:
    service: int
    p: float
    detached: bool
    stages: tuple[tuple[int, ...], ...]   # indices into the type's node list


def _compile(req: CallNode, index: dict[str, int]) -> list[_Node]:
    """A request type's call tree as a post-order list (children before parents; root last)."""
    nodes: list[_Node] = []

    def walk(node: CallNode) -> int:
        stages = tuple(tuple(walk(child) for child in stage) for stage in node.stages)
        nodes.append(_Node(index[node.call], node.p, node.detached, stages))
        return len(nodes) - 1
    walk(req)
    return nodes


def erlang_c(c: np.ndarray, a: np.ndarray, c_max: int) -> np.ndarray:
    """Probability of waiting in M/M/c with c servers (integer array) and offered load a = λ/μ
    (Erlangs, a < c), by the Erlang B recursion; 0 where c is outside 1..c_max."""
    c = np.asarray(c, dtype=np.int64)
    a = np.asarray(a, dtype=np.float64)
    shape = np.broadcast_shapes(c.shape, a.shape)
    c, a = np.broadcast_to(c, shape).ravel(), np.broadcast_to(a, shape).ravel()
    return _erlang_c(c, a, int(c_max)).reshape(shape)


@njit(cache=True, nogil=True)
def _erlang_c(c, a, c_max):
    # compiled: the recursion runs to each element's own c (NumPy ran every element to c_max,
    # hundreds of passes for a database's pool: 1.4 ms of a Social step). Same operations in
    # the same order, so the same bits (tested against the recursion written in NumPy)
    out = np.empty(a.shape[0])
    for i in range(a.shape[0]):
        b = 1.0
        e = 0.0
        for k in range(1, c_max + 1):
            b = a[i] * b / (k + a[i] * b)
            if k == c[i]:
                e = b
                break
        rho = a[i] / max(c[i], 1)
        out[i] = e / (1.0 - rho * (1.0 - e))
    return out


class MicroserviceSim:
    """E copies of one application. `reset(users)` starts them; `step(cores)` advances one second
    and returns per-copy `StepMeasurement`s plus the raw arrays."""

    def __init__(self, topology: Topology, n_envs: int = 1, seed: int | None = None,
                 samples: int = DEFAULT_SAMPLES):
        self.topo = topology
        if isinstance(n_envs, bool) or not isinstance(n_envs, (int, float, np.integer)) \
                or not 1 <= n_envs < 2**31 or n_envs != int(n_envs):
            # 2.5 ran 2 copies in silence, 0 stepped nothing, -1 failed in NumPy's allocation
            raise ValueError(f"n_envs must be a whole number of copies >= 1, not {n_envs!r}")
        self.E = int(n_envs)
        self.M = topology.n_services
        if isinstance(samples, bool) or not isinstance(samples, (int, float, np.integer, np.floating)) \
                or not 1 <= samples < 2**31 or samples != int(samples):
            # as n_envs: 2.5 drew 2 requests in silence, None or NaN failed inside int()
            raise ValueError(f"samples must be at least 1 request drawn per second, a whole number, not {samples!r}")
        self.K = int(samples)
        self.rng = np.random.default_rng(seed)
        specs = list(topology.services.values())
        self.cpu_s = topology.cpu_seconds                                   # mean CPU seconds per call
        self.workers = np.array([s.workers for s in specs], dtype=np.float64)
        self.caps = topology.caps
        self.rss = np.array([s.rss_mb for s in specs]) * 2**20
        self.kb = np.array([s.kb_per_call for s in specs]) * 1024.0
        self.io_kb = np.array([s.io_kb_per_call for s in specs]) * 1024.0
        self.cache_bytes = np.array([s.cache_mb for s in specs]) * 2**20
        self.faults_per_call = np.array([s.faults_per_call for s in specs])
        self.faults_per_s = np.array([s.faults_per_s for s in specs])
        self.is_db = np.array([s.kind == "db" for s in specs])
        self.hop = topology.hop_ms / 1000.0
        self.timeout = topology.timeout_s
        self.think = 1.0 / topology.rate_per_user
        index = {name: i for i, name in enumerate(topology.services)}
        self.programs = [_compile(r, index) for r in topology.requests.values()]
        self.visits = topology.visits                                       # (types, M)
        self._visits_mean = topology.mean_visits()
        self.mix = topology.mix
        self._fanout = self._children_per_call()
        self.k_per_type = _stratified(self.mix, self.K)
        # each draw's request type and place in its type's block (the layout `_sample_latency` writes)
        self._draw_type = np.repeat(np.arange(len(self.k_per_type)), np.maximum(self.k_per_type, 0))
        self._draw_rank = np.concatenate([np.arange(k) for k in self.k_per_type if k > 0])
        self._visits_any = (self.visits > 0).astype(np.float64)                 # (types, M)
        self.per_request = topology.percentiles_over == "requests"
        self.chain = topology.throttle_chain
        self.burst = topology.cfs_burst
        self.jitter_p, self.jitter_s = topology.jitter_p, topology.jitter_ms / 1000.0
        self.c_max = int(np.ceil(self.workers.max()))
        self.users = np.zeros(self.E)
        self.limit = np.tile(self.caps, (self.E, 1))
        self.backlog = np.zeros((self.E, self.M))
        self.mean_latency = np.zeros(self.E)
        self.t = 0

    def _children_per_call(self) -> np.ndarray:
        """Expected downstream calls one call of each service makes (for its sent packets)."""
        out = np.zeros(self.M)
        calls = np.zeros(self.M)
        for prog, w in zip(self.programs, self.mix):
            reach = {len(prog) - 1: 1.0}
            for i in range(len(prog) - 1, -1, -1):
                node = prog[i]
                p_here = reach.get(i, 0.0) * node.p
                calls[node.service] += w * p_here
                for stage in node.stages:
                    for child in stage:
                        reach[child] = p_here
                        out[node.service] += w * p_here * prog[child].p
        return np.divide(out, calls, out=np.zeros_like(out), where=calls > 0)

    # -- episode control ---------------------------------------------------------------------
    def reset(self, users) -> None:
        self.users = self._checked_users(users)
        self.limit = np.tile(self.caps, (self.E, 1))
        self.backlog = np.zeros((self.E, self.M))
        self.mean_latency = np.full(self.E, self.hop * 4)
        self.t = 0

    def set_users(self, users) -> None:
        self.users = self._checked_users(users)

    def _checked_users(self, users) -> np.ndarray:
        """Each copy's users (E,): a negative, NaN or infinite count would only fail later, deep in
        the Poisson draw ("lam value too large"), so it is refused here by name."""
        try:
            out = np.broadcast_to(np.asarray(users, dtype=np.float64), (self.E,)).copy()
        except (TypeError, ValueError):   # None, a word, or a list of the wrong length
            out = np.array([np.nan])
        if not np.all(np.isfinite(out) & (out >= 0)):
            raise ValueError(f"users must be finite and >= 0 (one count, or one per copy), not {users!r}")
        if np.any(out * self.topo.rate_per_user > MAX_REQUESTS_PER_S):
            # the request rate is at most users x rate_per_user; past the topology's own bound the
            # Poisson draw of the next step failed ("lam value too large")
            raise ValueError(f"users must be at most {MAX_REQUESTS_PER_S / self.topo.rate_per_user:g} "
                             f"({MAX_REQUESTS_PER_S:g} requests/s at {self.topo.rate_per_user:g} per user), not {users!r}")
        return out

    def _limits_of(self, cores) -> np.ndarray:
        """The CPU limits (E, M) of a second: a NaN or infinite core count (a controller that could
        not decide) keeps the limit in force, since one NaN would turn the backlog, the latency and
        the next second's load into NaN for the rest of the episode, and an infinite one put an
        infinite cpu_limit into the features (and kept it there through any later NaN); floored at
        the controllers' MIN_CORES, Docker's smallest --cpus: a lower floor let a baseline run in
        simulation at limits no real container accepts. One row (M,) or (1, M) holds for every copy."""
        cores = np.asarray(cores, dtype=np.float64)
        if cores.ndim not in (1, 2) or cores.shape[-1] != self.M or cores.shape[:-1] not in ((), (1,), (self.E,)):
            # a reshape took any E·M numbers: limits given (services, copies) ran scrambled in silence
            raise ValueError(f"cores must hold one row of {self.M} services per copy, shape ({self.E}, {self.M}), "
                             f"or one row for every copy, not shape {cores.shape}")
        cores = np.broadcast_to(cores, (self.E, self.M))
        return np.clip(np.where(np.isfinite(cores), cores, self.limit), MIN_CORES, None)

    # -- one second --------------------------------------------------------------------------
    def step(self, cores: np.ndarray) -> "SimStep":
        rng = self.rng
        E, M = self.E, self.M
        limit = self._limits_of(cores)
        self.limit = limit
        # 1. closed-loop load
        rate = self.users / (self.think + self.mean_latency)                     # (E,)
        arrivals = rng.poisson(rate[:, None] * self.mix[None, :])                # (E, types)
        requests = arrivals.sum(axis=1).astype(np.float64)
        calls = arrivals @ self.visits                                           # (E, M) expected calls
        # 2. work with the spread of a sum of exponentials
        mean_work = calls * self.cpu_s
        noise = rng.standard_normal((E, M)) * np.sqrt(np.maximum(calls, 1.0)) * self.cpu_s
        work = np.maximum(mean_work + noise, 0.0)
        # 3. fluid backlog under the CPU limit
        capacity = np.minimum(limit, self.workers)                               # core-seconds/s
        before = self.backlog
        total = before + work
        served = np.minimum(total, capacity)
        after = total - served
        # work that would wait past the timeout fails
        cap_backlog = capacity * self.timeout
        dropped = np.maximum(after - cap_backlog, 0.0)
        after = after - dropped
        self.backlog = after
        dropped_calls = dropped / self.cpu_s
        # a request fails when any of its calls is dropped: per type, the worst share of dropped
        # calls among the services it visits (a type that never calls the overloaded service
        # does not fail with it)
        share = np.minimum(np.divide(dropped_calls, np.maximum(calls, 1e-9)), 1.0)
        type_share = np.max(share[:, None, :] * self._visits_any[None], axis=2)     # (E, types)
        failures = np.minimum((type_share * arrivals).sum(axis=1), requests)
        # 4. per-call latency distribution of this second
        servers = np.minimum(np.ceil(capacity - 1e-9), self.workers).clip(1, None)
        # the M/M/c term takes the arrival intensity, not this second's count: its stationary law
        # already holds the Poisson spread, which the count would add a second time
        lam = rate[:, None] * self._visits_mean                                  # calls/s
        a = np.minimum(lam * self.cpu_s, RHO_CAP * servers)                      # offered Erlangs
        p_wait = erlang_c(servers.astype(int), a, self.c_max)
        mu = 1.0 / self.cpu_s                                                    # full-speed server
        wait_rate = np.maximum(servers * mu - lam, (1 - RHO_CAP) * servers * mu)
        stall, p_stall, theta = self._throttle(lam, capacity, servers, before)
        backlog_wait = 0.5 * (before + after) / capacity
        lat = self._sample_latency(backlog_wait, p_wait, wait_rate, stall, p_stall)  # (E, K) s
        lat = np.minimum(lat, self.timeout)
        # the draws that stand for this second's requests: all K, or (percentiles_over: requests)
        # as many of each type as arrived, so that a second of 25 requests has the p99 of 25
        valid = self._second_requests(arrivals) if self.per_request else None
        lat = self._failed_at_timeout(lat, type_share, arrivals)
        # the closed loop's response time: every draw, the expected latency of the second, not
        # the spread of its few requests
        self.mean_latency = lat.mean(axis=1)
        if valid is None:
            pct = np.percentile(lat, PERCENTILES, axis=1).T * 1000.0              # (E, 12) ms
        else:
            pct = _masked_percentiles(lat, valid, PERCENTILES) * 1000.0
        no_req = requests <= 0
        pct[no_req] = np.nan
        self.t += 1
        # per-service counters of the second (Table 1)
        sojourn = backlog_wait + p_wait / wait_rate + self.cpu_s + 0.5 * p_stall * stall
        inflight = calls * sojourn
        feats = np.zeros((E, M, len(SERVICE_FIELDS)))
        down = calls * self._fanout
        feats[..., FIELD["rx_packets"]] = calls + down
        feats[..., FIELD["tx_packets"]] = calls + down
        feats[..., FIELD["rx_bytes"]] = (calls + down) * self.kb
        feats[..., FIELD["tx_bytes"]] = (calls + down) * self.kb
        feats[..., FIELD["rss_bytes"]] = self.rss + inflight * 2**18
        feats[..., FIELD["cache_bytes"]] = np.where(self.is_db, self.io_kb * 1000.0, 0.0) + self.cache_bytes
        feats[..., FIELD["page_faults"]] = self.faults_per_s + calls * self.faults_per_call
        feats[..., FIELD["cpu_used"]] = served
        feats[..., FIELD["cpu_limit"]] = limit
        feats[..., FIELD["io_bytes"]] = calls * self.io_kb
        feats[..., FIELD["io_ops"]] = np.where(self.io_kb > 0, calls, 0.0)
        return SimStep(t=self.t, per_service=feats, latency_ms=pct, requests=requests,
                       failures=failures, backlog=after.copy(), qos_ms=self.topo.qos_ms, throttled=theta)

    def _failed_at_timeout(self, lat: np.ndarray, type_share: np.ndarray, arrivals: np.ndarray) -> np.ndarray:
        """Failed requests count at the timeout, as a load generator records them, each in its own
        type's block of draws: round(share · n) of the block's first draws (its valid draws under
        `percentiles_over: requests`, which are the block's first). Charging them to the first
        type's block, whatever service overloaded, hid that type's latency from the p99."""
        block = self.k_per_type[self._draw_type]                                 # (K,) block size
        if self.per_request:   # the block's valid draws: as many as its type's arrivals
            block = np.minimum(block[None, :], arrivals[:, self._draw_type])
        n_fail = np.minimum(np.round(type_share[:, self._draw_type] * block), block)
        return np.where(self._draw_rank[None, :] < n_fail, self.timeout, lat)

    def _second_requests(self, arrivals: np.ndarray) -> np.ndarray:
        """(E, K) mask of the draws that stand for this second's requests: of each type's block of
        draws (the layout `_sample_latency` writes), the first min(arrived, block) of them."""
        valid = np.zeros((self.E, self.K), dtype=bool)
        col = 0
        for j, k in enumerate(self.k_per_type):
            if k <= 0:
                continue
            valid[:, col:col + k] = np.arange(k)[None, :] < arrivals[:, j:j + 1]
            col += k
        return valid

    def _throttle(self, lam, capacity, servers, backlog):
        """CFS throttling of the second: the stall W a throttled period ends with, the chance
        that a call meets it, and the chance θ that a period is throttled (the model's
        nr_throttled / nr_periods, kept in SimStep.throttled). A period is throttled when its
        demand exceeds the quota; the demand of Poisson calls with Exp CPU times has mean λsP
        and variance 2λs²P (taken as normal).
        W is the longest stall, P·(1 − L/c): a stall sized by the expected excess over the quota
        (shorter) put the VPA-style baseline at 12–21 % violations on the testbed's twin against
        the real containers' 88–90 %, this one at 86–93 % (docs/microservice-testbed.md)."""
        stall = CFS_PERIOD_S * (1.0 - capacity / servers)                       # 0 at integer L
        mean = lam * self.cpu_s * CFS_PERIOD_S
        sd = np.sqrt(2.0 * lam * self.cpu_s ** 2 * CFS_PERIOD_S) + 1e-12
        budget = capacity * (1.0 + self.burst)        # the quota and the burst banked on top of it
        theta = ndtr((mean - budget * CFS_PERIOD_S) / sd)
        if self.burst > 0:
            # the period runs on until quota and burst are spent; a queue has spent the burst
            stall = np.where(backlog > 0, stall, CFS_PERIOD_S * np.maximum(1.0 - budget / servers, 0.0))
        theta = np.where(backlog > 0, 1.0, theta)                                # a queue spends every quota
        return stall, theta * stall / CFS_PERIOD_S, theta

    def _sample_latency(self, backlog_wait, p_wait, wait_rate, stall, p_stall) -> np.ndarray:
        """K end-to-end latencies per copy (seconds), stratified over request types."""
        rng = self.rng
        E = self.E
        out = np.empty((E, self.K))
        col = 0
        for prog, k in zip(self.programs, self.k_per_type):
            if k <= 0:
                continue
            node_lat: list[np.ndarray] = []
            for node in prog:
                s = node.service
                waits = rng.random((E, k)) < p_wait[:, s:s + 1]
                wq = np.where(waits, rng.exponential(1.0, (E, k)) / wait_rate[:, s:s + 1], 0.0)
                svc = rng.exponential(1.0, (E, k)) * self.cpu_s[s]
                stalled = rng.random((E, k)) < p_stall[:, s:s + 1]
                thr = np.where(stalled, rng.random((E, k)) * stall[:, s:s + 1], 0.0)
                if self.chain > 0:   # whole periods sat out after the first stall
                    thr = thr + np.where(stalled, CFS_PERIOD_S * (rng.geometric(1.0 - self.chain, (E, k)) - 1), 0.0)
                own = 2 * self.hop + backlog_wait[:, s:s + 1] + wq + svc + thr
                if self.jitter_p > 0:
                    own = own + np.where(rng.random((E, k)) < self.jitter_p,
                                         rng.exponential(self.jitter_s, (E, k)), 0.0)
                for stage in node.stages:
                    waited = [node_lat[c] for c in stage if not prog[c].detached]
                    if waited:
                        own = own + (np.maximum.reduce(waited) if len(waited) > 1 else waited[0])
                if node.p < 1.0:
                    own = np.where(rng.random((E, k)) < node.p, own, 0.0)
                node_lat.append(own)
            out[:, col:col + k] = node_lat[-1]
            col += k
        return out


def _stratified(mix: np.ndarray, samples: int) -> np.ndarray:
    """Draws per request type: its share of `samples` rounded down, the rest to the commonest type,
    and at least one for every type while the draws go round (a type under 1/samples of the mix
    would otherwise never be drawn: its latency never measured, its requests never in the
    percentiles over a second's own requests), taken from the commonest type."""
    k = np.floor(mix * samples).astype(int)
    top = int(np.argmax(mix))
    k[top] += samples - k.sum()
    short = k < 1
    if short.any() and samples >= len(k) and k[top] - short.sum() >= 1:
        k[top] -= short.sum()
        k[short] = 1
    return k


def _masked_percentiles(x: np.ndarray, valid: np.ndarray, q) -> np.ndarray:
    """np.percentile's linear interpolation along axis 1 over the valid entries of each row:
    (rows, len(q)); NaN for a row without one."""
    n = valid.sum(axis=1)
    srt = np.sort(np.where(valid, x, np.inf), axis=1)
    srt[n == 0] = 0.0
    pos = np.asarray(q, dtype=np.float64)[None, :] / 100.0 * np.maximum(n - 1, 0)[:, None]
    lo = np.floor(pos).astype(int)
    hi = np.minimum(lo + 1, np.maximum(n - 1, 0)[:, None])
    rows = np.arange(x.shape[0])[:, None]
    a, b = srt[rows, lo], srt[rows, hi]
    out = a + (pos - lo) * np.where(hi > lo, b - a, 0.0)
    out[n == 0] = np.nan
    return out


@dataclass
class SimStep:
    """One second of E copies: per-service counters (E, M, fields), latency percentiles (E, 12)
    in ms, requests and failures per copy, and the backlog left (E, M) core-seconds."""
    t: int
    per_service: np.ndarray
    latency_ms: np.ndarray
    requests: np.ndarray
    failures: np.ndarray
    backlog: np.ndarray
    qos_ms: float
    throttled: np.ndarray | None = None  # (E, M) the chance θ that a CFS period ran out of quota

    @property
    def p99_ms(self) -> np.ndarray:
        return self.latency_ms[:, PERCENTILES.index(99)]

    @property
    def cpu_used(self) -> np.ndarray:
        return self.per_service[..., FIELD["cpu_used"]]

    @property
    def queue(self) -> np.ndarray:
        """The queue-depth ablation's column of this second (features.queue_feature), (E, M)."""
        from .features import queue_feature

        return queue_feature(self.backlog, self.per_service[..., FIELD["cpu_limit"]])

    def measurement(self, e: int, services: tuple[str, ...]) -> StepMeasurement:
        return StepMeasurement(services=services, per_service=self.per_service[e],
                               latency_ms=self.latency_ms[e], requests_per_s=float(self.requests[e]),
                               failures_per_s=float(self.failures[e]), qos_ms=self.qos_ms, t=float(self.t),
                               extra={"backlog": self.backlog[e]} | ({} if self.throttled is None else
                                      {"throttled": dict(zip(services, self.throttled[e].tolist()))}))
