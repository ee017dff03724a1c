"""What SAMM hosts for the microservice-cores problem: the trained Reclaimer actor.

    policy.act(measurement)            -> cores per service (a Controller: the simulator's
                                          episodes, the experiment, the testbed loop)
    policy.decide(observation)         -> Decision(action=[a_i in [0, 1]]) (the Policy protocol:
                                          an env observation of (M, width) rows,
                                          features.observation_layout)
    policy.save(dir) / ReclaimerPolicy.load(dir)

The policy keeps its own frame stack for `act`; `reset` clears it. The application's topology is
saved with the policy (its name, services and caps), and loading checks the spaces. A headroom
ceiling (ours; `ceiling`, an action_map.Ceiling saved as `headroom_ceiling`, chosen by ceiling.py)
caps every service's cores by its mean use over the stacked seconds (action_map.cores_of): that
many times it, or the use plus a multiple of its square root.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from gymnasium import spaces

from agents.policy import Decision, load_torch_weights, one_line, save_torch_policy
from agents.registry import read_policy_metadata
from agents.spaces import check_spaces, space_from_json, space_to_json

from .action_map import Ceiling, CeilingMemory, check_ceiling, cores_of
from .control import AppLimits, clip_cores
from .features import (FrameStack, feature_row_block, feature_rows, latest_limit, latest_p99_share, latest_used,
                       mean_used, observation_layout, queue_feature)
from .observation import FIELD, StepMeasurement
from .sac import Sac, SacConfig
from .topology import Topology

KIND = "reclaimer"
PROBLEM = "microservice-cores"
FORMAT = 1
METADATA_FILE = "metadata.json"
WEIGHTS_FILE = "weights.pt"
SHIPPED_DIR = Path(__file__).parent / "policies"


def policy_spaces(topo: Topology, cfg: SacConfig) -> tuple[spaces.Box, spaces.Box]:
    width, _ = observation_layout(cfg.k, topo.n_services, cfg.id_width, cfg.observe_queue)
    return (spaces.Box(-np.inf, np.inf, (topo.n_services, width), np.float32),
            spaces.Box(0.0, 1.0, (topo.n_services,), np.float32))


class ReclaimerPolicy:
    problem = PROBLEM
    kind = KIND
    stateful = False
    name = "reclaimer"

    def __init__(self, agent: Sac, topo: Topology, cfg: SacConfig, training: dict | None = None,
                 version: str | None = None, ceiling: Ceiling | float | dict | None = None):
        self.agent = agent.eval()
        self.topo = topo
        self.cfg = cfg
        self.training = training or {}
        self.version = version or "unversioned"
        self.ceiling = check_ceiling(ceiling)
        # a ceiling with a memory makes the policy stateful (a REST session keeps the memory)
        self.stateful = self.ceiling is not None and self.ceiling.stateful
        self.observation_space, self.action_space = policy_spaces(topo, cfg)
        self.limits: AppLimits | None = None
        self._stack: FrameStack | None = None
        self._memory: CeilingMemory | None = None
        self._prev = np.ones(topo.n_services)
        # seeds of sampled decisions (deterministic=False): the policy's own stream, so a restarted
        # service replays its draws; torch's global generator (training's) is left untouched
        self._sample_seeds = np.random.default_rng(0)

    def fork(self) -> "ReclaimerPolicy":
        """The same network with its own frame stack (one per controlled application)."""
        return ReclaimerPolicy(self.agent, self.topo, self.cfg, self.training, self.version, self.ceiling)

    def with_ceiling(self, ceiling: Ceiling | float | dict | None) -> "ReclaimerPolicy":
        """A fork under another headroom ceiling (None: none); the same network."""
        return ReclaimerPolicy(self.agent, self.topo, self.cfg, self.training, self.version, ceiling)

    def ceiling_json(self):
        """The ceiling as saved and reported: None, a number (times the use) or {"multiple", "sqrt"}."""
        return None if self.ceiling is None else self.ceiling.to_json()

    # -- Controller ------------------------------------------------------------------------
    def reset(self, limits: AppLimits) -> None:
        self.check_services(limits)
        self.limits = limits
        self._stack = None
        self._memory = None
        self._prev = np.ones(self.topo.n_services)

    def check_services(self, limits: AppLimits) -> None:
        if tuple(limits.services) != self.topo.service_names:
            raise ValueError(f"this policy controls {self.topo.name}'s services {self.topo.service_names}, "
                             f"not {tuple(limits.services)}")

    def batch(self) -> "ReclaimerBatch":
        """This policy controlling every copy of a simulated batch at once (`run_episodes(batch=)`)."""
        return ReclaimerBatch(self)

    def observe(self, m: StepMeasurement, restart: bool = False) -> np.ndarray:
        """The (1, M, width) observation of this second: its rows pushed on the frame stack (the
        first second, or one after `restart`, fills every frame)."""
        caps = self.topo.caps
        # the previous action is what was in force, as a share of the cap (read back, not assumed)
        prev = np.clip(m.cpu_limit / caps, 0.0, 1.0)
        rows = feature_rows(m, prev, caps)[None]
        if restart:
            self._stack = self._memory = None
        self._stack = self.stacked(self._stack, rows, self._queue(m))
        obs = self._stack.observation()
        self._memory = self.remember(self._memory, obs)
        return obs

    def remember(self, memory: CeilingMemory | None, obs: np.ndarray) -> CeilingMemory | None:
        """A stateful ceiling's memory of the copies of obs (E, M, width) with their latest second
        pushed (a new one when there is none); None when the ceiling needs none."""
        if not self.stateful:
            return None
        if memory is None:
            memory = CeilingMemory(self.ceiling, len(obs), self.topo.n_services)
        k, caps = self.cfg.k, self.topo.caps
        memory.push(latest_used(obs, k, caps), latest_p99_share(obs, k), latest_limit(obs, k, caps))
        return memory

    def stacked(self, stack: FrameStack | None, rows: np.ndarray, queue: np.ndarray | None) -> FrameStack:
        """`stack` with the rows (E, M, ROW) of one second pushed; a new stack, every frame set to
        them, when there is none yet."""
        if stack is None:
            stack = FrameStack(len(rows), self.topo.n_services, k=self.cfg.k, id_width=self.cfg.id_width,
                               queue=self.cfg.observe_queue)
            stack.reset(rows, queue)
        else:
            stack.push(rows, queue)
        return stack

    def _queue(self, m: StepMeasurement) -> np.ndarray | None:
        if not self.cfg.observe_queue:
            return None
        backlog = m.extra.get("backlog")
        if backlog is None or np.shape(backlog) != (self.topo.n_services,):
            raise ValueError("this policy observes each service's queue depth (the queue-depth ablation), which only "
                             "the simulator measures: it cannot act on measurements without one")
        return queue_feature(np.asarray(backlog)[None], m.cpu_limit[None])

    def act(self, m: StepMeasurement) -> np.ndarray:
        obs = self.observe(m)
        a = self.agent.act(obs, deterministic=True)[0]
        return clip_cores(self.cores(a, obs[0]), self.limits)

    def cores(self, a, obs, memory: CeilingMemory | None = None) -> np.ndarray:
        """Cores for the action a chosen on observation obs (M, width), or on E copies' (E, M, width)
        (action_map.py); a stateful ceiling reads `memory` (default: this controller's own)."""
        base = self.base_use(obs)
        memory = memory if memory is not None else self._memory
        if memory is None:
            return cores_of(a, base, self.topo.caps, self.cfg.action_space, self.ceiling)
        single = np.ndim(obs) == 2
        ceiling_base = memory.base(base[None] if single else base)
        lifted, panic = memory.lifted(), memory.panicking()
        return cores_of(a, base, self.topo.caps, self.cfg.action_space, self.ceiling,
                        ceiling_base=ceiling_base[0] if single else ceiling_base,
                        lifted=lifted[0] if single else lifted, panic=panic[0] if single else panic)

    def base_use(self, obs) -> np.ndarray | None:
        """The use a "usage" action or the ceiling scales (the mean over obs's stacked seconds);
        None on "cap" without a ceiling."""
        if self.cfg.action_space == "cap" and self.ceiling is None:
            return None
        return mean_used(obs, self.cfg.k, self.topo.caps)

    # -- Policy protocol --------------------------------------------------------------------
    def initial_state(self):
        return None

    def checked_observation(self, observation) -> np.ndarray:
        """The (M, width) observation as float32, or InvalidInput naming what is wrong: another shape
        failed with a bare broadcast error, and a NaN gave NaN actions (and a NaN in a stateful
        ceiling's memory)."""
        from samm.plan.dataplane import InvalidInput

        obs = np.asarray(observation, dtype=np.float32)
        shape = self.observation_space.shape
        if obs.shape != shape:
            raise InvalidInput("observation", f"shape {list(obs.shape)} != {list(shape)} "
                                              f"({self.topo.n_services} services of {self.topo.name})")
        bad = np.argwhere(~np.isfinite(obs))
        if len(bad):
            row, col = (int(i) for i in bad[0])
            raise InvalidInput(f"observation[{row}][{col}]", f"must be a finite number, got {obs[row, col]} "
                                                             f"(service {self.topo.service_names[row]})")
        return obs

    def decide(self, observation, state=None, *, mask=None, deterministic: bool = True):
        """One decision on a whole observation; with a stateful ceiling, `state` is its memory of the
        caller's earlier observations (None: the first), returned updated."""
        obs = self.checked_observation(observation)[None]
        if deterministic:
            a = self.agent.act(obs, deterministic=True)[0]
        else:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(int(self._sample_seeds.integers(2**62)))
                a = self.agent.act(obs, deterministic=False)[0]
        memory = self.remember(state, obs)
        cores = self.cores(a, obs[0], memory)
        return Decision(action=[float(x) for x in a],
                        name="cores share" if self.cfg.action_space == "cap" else "headroom over use",
                        info={"cores": [round(float(c), 4) for c in cores],
                              "total_cores": round(float(cores.sum()), 4), "headroom_ceiling": self.ceiling_json()}), memory

    def metadata(self) -> dict:
        from samm import __version__

        return {"kind": KIND, "problem": PROBLEM, "format": FORMAT, "version": self.version,
                "samm_version": __version__, "app": self.topo.model_dump(mode="json"),
                "config": self.cfg.to_json(),
                "observation_space": space_to_json(self.observation_space),
                "action_space": space_to_json(self.action_space), "training": self.training,
                "headroom_ceiling": self.ceiling_json()}

    def save(self, directory) -> Path:
        return save_torch_policy(directory, self.agent, self.metadata(), WEIGHTS_FILE, METADATA_FILE)

    @classmethod
    def load(cls, directory) -> "ReclaimerPolicy":
        d = Path(directory)
        meta = read_policy_metadata(d, KIND, PROBLEM, FORMAT)
        try:
            topo = Topology.model_validate(meta["app"])
            cfg = SacConfig.from_json(meta["config"])
            saved_obs = space_from_json(meta["observation_space"])
            saved_act = space_from_json(meta["action_space"])
            ceiling = check_ceiling(meta.get("headroom_ceiling"))
        except (KeyError, TypeError, ValueError) as e:   # pydantic's errors span lines: one_line
            raise ValueError(f"{d / METADATA_FILE}: missing or malformed field ({one_line(e)})") from None
        check_spaces(saved_obs, saved_act, *policy_spaces(topo, cfg), what=str(d))
        try:
            agent = Sac(*observation_layout(cfg.k, topo.n_services, cfg.id_width, cfg.observe_queue),
                        topo.n_services, cfg)
        except (RuntimeError, TypeError, ValueError) as e:   # e.g. hidden -1: torch's bare "negative dimension"
            raise ValueError(f"{d / METADATA_FILE}: its network cannot be built ({one_line(e)})") from None
        load_torch_weights(d, agent, WEIGHTS_FILE, METADATA_FILE)
        return cls(agent, topo, cfg, meta.get("training"), meta.get("version"), ceiling)


class ReclaimerBatch:
    """A policy acting for the E copies of a simulated batch at once (`episode.run_episodes(batch=)`),
    to the bit what E forks of it would do there: the rows and frames of all copies built together,
    the actor run copy by copy (a matrix product over more rows may round otherwise: on Hotel's 15
    services it did, measured). Training's validation runs on it (1.5x faster than forks on Social)."""

    def __init__(self, policy: ReclaimerPolicy):
        self.policy = policy
        self.name = policy.name
        self._stack: FrameStack | None = None
        self._memory: CeilingMemory | None = None

    def reset(self, limits: AppLimits) -> None:
        self.policy.check_services(limits)
        self._stack = self._memory = None

    def observe_block(self, st) -> np.ndarray:
        """The (E, M, width) observations of a simulated second (a `sim.SimStep`)."""
        p = self.policy
        limit = st.per_service[..., FIELD["cpu_limit"]]
        rows = feature_row_block(st.per_service, st.latency_ms, st.requests, st.failures, st.qos_ms,
                                 np.clip(limit / p.topo.caps, 0.0, 1.0), p.topo.caps)
        queue = queue_feature(st.backlog, limit) if p.cfg.observe_queue else None
        self._stack = p.stacked(self._stack, rows, queue)
        obs = self._stack.observation()
        self._memory = p.remember(self._memory, obs)
        return obs

    def act_block(self, st) -> np.ndarray:
        obs = self.observe_block(st)
        a = np.concatenate([self.policy.agent.act(obs[e:e + 1], deterministic=True) for e in range(len(obs))])
        return self.policy.cores(a, obs, self._memory)


def shipped_policy(app: str) -> ReclaimerPolicy:
    d = SHIPPED_DIR / f"reclaimer-{app}"
    if not (d / METADATA_FILE).is_file():
        raise ValueError(f"no shipped Reclaimer policy for {app!r} (looked in {d}); train one with "
                         f"`samm train --problem microservice-cores --app {app}`")
    return ReclaimerPolicy.load(d)
