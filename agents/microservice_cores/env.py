"""Gymnasium env `samm/MicroserviceCores-v0`: one application, one step = one second.

Observation: (M, k·ROW [+ 1] + M) float32, a row per service (features.FrameStack: the k = 5 latest
rows of Table 1's features plus the one-hot id; with `observe_queue`, ours, each service's queue
depth before the id: features.observation_layout). Action: a ∈ [0, 1]^M, cores = a · cap (the
paper's sigmoid output times the hand-set cap u), floored at control.MIN_CORES; with
`action_space="usage"` (ours) a is the headroom over the mean use of the stacked seconds
(action_map.py); `headroom_ceiling=H` (ours) caps the cores at H times that use, or a
`{"sqrt": β}` at the use plus β times its square root (action_map.Ceiling).

Reward of step(a): the second in which `a` was in force scores it (the paper's "the reward at t
is for the action of t−1": the action chosen after second t−1 runs during second t):
    −1 if that second's end-to-end p99 > QoS, else α (1 − Σ cores / Σ caps), α = 1.
Each reset draws U ~ U[users] (or takes `options={"users": U}`; a U of None draws), runs the W = 60 s warm-up at caps,
and the episode ends after e_time = 300 steps (truncated, not terminated: the application goes on).
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from .action_map import check_memoryless, check_space, cores_of
from .episode import EPISODE_S, WARMUP_S
from .features import FrameStack, feature_row_block, mean_used
from .sim import MicroserviceSim
from .topology import Topology, load_topology

ALPHA = 1.0   # α of the reward (Table 2)


COSTS = ("linear", "log")
#: the smallest share of a cap the log scales tell apart (the log cost here, the critics' log input
#: in sac.critic_log_action): 0.01 core on a 10-core cap
LOG_SHARE_FLOOR = 1e-3


def cost_shares(cores, caps, cost: str = "linear") -> np.ndarray:
    """Each service's part of the reward's cost (E, M): the row sums to the cost of reward_of.

    cost "linear" is the paper's cores_i / Σ caps. "log" (ours, SacConfig.cost) is
    (cap_i / Σ caps) · ℓ(cores_i / cap_i), ℓ(x) = 1 + log x / log(1/LOG_SHARE_FLOOR) clipped at
    the floor: the same [0, 1] range and the same weight per service, but halving a small limit
    saves as much as halving a large one, where the linear saving of a low load's limits is a few
    hundredths of the range."""
    caps = np.asarray(caps, dtype=np.float64)
    cores = np.asarray(cores, dtype=np.float64)
    if cost == "linear":
        return cores / float(np.sum(caps))
    if cost == "log":
        share = np.clip(cores / caps, LOG_SHARE_FLOOR, 1.0)
        return caps * (1.0 + np.log(share) / -np.log(LOG_SHARE_FLOOR)) / float(np.sum(caps))
    raise ValueError(f"cost must be one of {', '.join(COSTS)}, not {cost!r}")


def _violated(p99_ms, qos_ms: float) -> np.ndarray:
    return np.nan_to_num(p99_ms, nan=0.0) > qos_ms


def reward_of(p99_ms, qos_ms: float, cores, caps, alpha: float = ALPHA, cost: str = "linear") -> np.ndarray:
    """The paper's reward (L99–101) for E copies: p99 (E,), cores (E, M) in force that second:
    −1 when the second broke QoS, else α(1 − the cost of the cores, `cost_shares` summed)."""
    spent = cost_shares(cores, caps, cost).sum(axis=-1)
    return np.where(_violated(p99_ms, qos_ms), -1.0, alpha * (1.0 - spent))


def service_rewards(p99_ms, qos_ms: float, cores, caps, alpha: float = ALPHA, cost: str = "linear") -> np.ndarray:
    """reward_of split over the M services (E, M), for SacConfig.reward_split "service" (ours):
    each service is charged M times its own share of the cost and every service shares a QoS
    violation's −1, so a row's mean is reward_of's value for its copy."""
    shares = cost_shares(cores, caps, cost)
    M = shares.shape[-1]
    return np.where(_violated(p99_ms, qos_ms)[..., None], -1.0, alpha * (1.0 - M * shares))


class MicroserviceCoresEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, app: str | Topology = "chain3", k: int = 5, id_width: int | None = None,
                 episode_steps: int = EPISODE_S, warmup: int = WARMUP_S, action_space: str = "cap",
                 observe_queue: bool = False, headroom_ceiling=None, render_mode: str | None = None):
        if render_mode is not None:
            raise ValueError(f"render_mode {render_mode!r} is not supported: this environment does not render")
        self.topo = app if isinstance(app, Topology) else load_topology(app)
        if isinstance(warmup, bool) or not isinstance(warmup, (int, np.integer)) or warmup < 1:
            # the first observation is the warm-up's last second
            raise ValueError(f"warmup must be a whole number of seconds >= 1, not {warmup!r}")
        if isinstance(episode_steps, bool) or not isinstance(episode_steps, (int, np.integer)) or episode_steps < 1:
            # 0 or less truncated every episode after its first step
            raise ValueError(f"episode_steps must be a whole number of steps >= 1, not {episode_steps!r}")
        self.M = self.topo.n_services
        self.k = k
        self.episode_steps = episode_steps
        self.warmup = warmup
        self.observe_queue = observe_queue
        self.stack = FrameStack(1, self.M, k=k, id_width=id_width, queue=observe_queue)
        self.observation_space = spaces.Box(-np.inf, np.inf, (self.M, self.stack.width), np.float32)
        self.action_space = spaces.Box(0.0, 1.0, (self.M,), np.float32)
        self.action_meaning = action_space
        check_space(action_space)
        self.headroom_ceiling = check_memoryless(headroom_ceiling, "the environment")
        self.sim: MicroserviceSim | None = None
        self._t = 0
        self._prev = np.ones(self.M)
        self._used = np.zeros(self.M)

    def cores_of(self, action) -> np.ndarray:
        """Cores for an action of the env's space (action_map.py), on "usage" and under a headroom
        ceiling (ours) from the mean use over the stacked seconds of the last observation."""
        return cores_of(action, self._used, self.topo.caps, self.action_meaning, self.headroom_ceiling)

    def _checked_action(self, action) -> np.ndarray:
        """The action as (M,), refused before the simulator moves: a (1, M) or (M, 1) action
        used to advance the simulated second and only then fail, leaving the episode corrupted."""
        a = np.asarray(action, dtype=np.float64)
        try:
            return np.broadcast_to(a, (self.M,)).copy()
        except ValueError:
            raise ValueError(f"action must hold {self.M} values (one per service), got shape {a.shape}") from None

    def _rows(self, st, prev):
        return feature_row_block(st.per_service, st.latency_ms, st.requests, st.failures,
                                 self.topo.qos_ms, prev[None], self.topo.caps)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        sim_seed = int(self.np_random.integers(2**31))
        self.sim = MicroserviceSim(self.topo, n_envs=1, seed=sim_seed)
        lo, hi = self.topo.users
        drawn = self.np_random.uniform(lo, hi)   # drawn either way, so a seed's later draws stay put
        users = (options or {}).get("users")
        # None (an unset option passed on) draws as no count does; a bad count is named by the sim
        self.sim.reset(drawn if users is None else users)
        users = float(self.sim.users[0])
        caps = self.topo.caps[None]
        st = None
        for _ in range(self.warmup):
            st = self.sim.step(caps)
        self._prev = np.ones(self.M)
        self._t = 0
        obs = self.stack.reset(self._rows(st, self._prev), st.queue if self.observe_queue else None)[0]
        self._used = mean_used(obs, self.k, self.topo.caps)
        return obs, {"users": float(users)}

    def step(self, action):
        if self.sim is None:
            raise RuntimeError("call reset() before step(): the episode has not started")
        cores = self.cores_of(self._checked_action(action))
        st = self.sim.step(cores[None])
        reward = float(reward_of(st.p99_ms, self.topo.qos_ms, cores[None], self.topo.caps)[0])
        self._prev = cores / self.topo.caps
        self._t += 1
        obs = self.stack.push(self._rows(st, self._prev), st.queue if self.observe_queue else None)[0]
        self._used = mean_used(obs, self.k, self.topo.caps)
        info = {"p99_ms": float(st.p99_ms[0]), "cores": float(cores.sum()), "violated": reward == -1.0}
        return obs, reward, False, self._t >= self.episode_steps, info
