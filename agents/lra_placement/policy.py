"""A trained placement policy as a service hosts it (inference only).

`PlacementPolicy` wraps a `NodeScorer` trained across many batches (`train.py`) and offers:

* the platform's Policy protocol (`agents/policy.py`): the environment's spaces (`env.py`: a Dict
  of the next container's one-hot app, the node x app counts and the containers still to place;
  Discrete(N) nodes), and `decide(observation, state, mask=..., deterministic=...)` placing one
  container; `decide_node(...)` is the same returning the node as a plain int;
* `plan(...)`: a whole batch: K sampled plans plus the policy's greedy roll-out, optionally a few
  seconds of the paper's per-batch REINFORCE started from this policy (fine-tuning), optionally the
  baselines' local search; the best plan wins;
* `save(dir)` / `PlacementPolicy.load(dir)`: `metadata.json` (kind, problem, version, spaces,
  network config, training info) and `policy.pt` (the network's state dict and, when the network
  reads the predictor, the predictor tabulated over every node composition, so a hosted policy
  does not need the training data).

The network is shared over nodes, so one policy serves any number of nodes: `for_nodes(n)` gives
the same policy with the spaces of an n-node cluster.
"""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from gymnasium import spaces

from agents.lra_placement.cluster import Batch, Cluster, Constraints, Predictor, check_plan, score
from agents.lra_placement.errors import Infeasible
from samm.plan.dataplane import InvalidInput
from agents.lra_placement.network import (
    NodeScorer,
    ScorerConfig,
    composition_table,
    enumerate_compositions,
    single_thread_blas,
)
from agents.lra_placement.reinforce import (
    PlacementProblem,
    ReinforceConfig,
    polish_plan,
    reinforce,
    repair,
    rollout,
)
from agents.policy import one_line, read_torch_file, save_torch_policy, saved_weights_path
from agents.spaces import check_spaces, space_from_json, space_to_json

KIND = "lra-reinforce"
PROBLEM = "lra-placement"
FORMAT = 1
METADATA_FILE = "metadata.json"
WEIGHTS_FILE = "policy.pt"
#: where the policy shipped with SAMM lives (trained on the Metis forest; see its metadata.json)
SHIPPED_DIR = Path(__file__).resolve().parent / "policies" / "lra-reinforce-default"


def placement_spaces(n_nodes: int, slots: int, n_apps: int) -> tuple[spaces.Dict, spaces.Discrete]:
    """The environment's observation and action spaces (must equal `LraPlacementEnv`'s)."""
    capacity = n_nodes * slots
    obs = spaces.Dict({
        "app": spaces.Box(0.0, 1.0, (n_apps,), np.float32),
        "counts": spaces.Box(0.0, float(slots), (n_nodes, n_apps), np.float32),
        "remaining": spaces.Box(0.0, float(capacity), (n_apps,), np.float32),
    })
    return obs, spaces.Discrete(n_nodes)


class TabulatedPredictor:
    """A predictor restored from a table of every composition's per-container throughput (what a
    policy directory stores). Compositions outside the table (over `slots`) get 0."""

    def __init__(self, app_names: tuple[str, ...], slots: int, throughput: np.ndarray):
        self.app_names = tuple(app_names)
        self.slots = slots
        comps = enumerate_compositions(len(app_names), slots)
        self._powers = (slots + 1) ** np.arange(len(app_names), dtype=np.int64)
        keys = comps @ self._powers
        order = np.argsort(keys)
        self._keys = keys[order]
        throughput = np.asarray(throughput, dtype=np.float64)
        if throughput.shape != comps.shape:
            raise ValueError(f"predictor table has shape {throughput.shape}, expected {comps.shape}")
        self._table = throughput

    def throughput(self, compositions: np.ndarray) -> np.ndarray:
        comps = np.asarray(compositions, dtype=np.int64)
        shape = comps.shape
        comps = comps.reshape(-1, len(self.app_names))
        ok = (comps >= 0).all(axis=1) & (comps.sum(axis=1) <= self.slots)
        keys = np.where(ok, np.where(ok[:, None], comps, 0) @ self._powers, 0)
        idx = np.minimum(np.searchsorted(self._keys, keys), len(self._keys) - 1)
        out = np.where(ok[:, None], self._table[idx], 0.0)
        return np.where(comps > 0, out, 0.0).reshape(shape)


class PlacementPolicy:
    problem = PROBLEM
    kind = KIND
    stateful = False

    def __init__(self, scorer: NodeScorer, app_names: tuple[str, ...], n_nodes: int, slots: int,
                 predictor: Predictor | None = None, training: dict | None = None, version: str | None = None):
        if len(app_names) != scorer.config.n_apps:
            raise ValueError(f"the network is for {scorer.config.n_apps} apps, got {len(app_names)} names")
        if scorer.config.predictor_features and predictor is None:
            raise ValueError("this network reads the predictor: give one")
        if predictor is not None and len(predictor.app_names) != len(app_names):
            raise ValueError(f"the predictor covers {len(predictor.app_names)} apps, the policy {len(app_names)}")
        self.scorer = scorer.eval()
        self.app_names = tuple(app_names)
        self.n_nodes, self.slots = int(n_nodes), int(slots)
        self.predictor = predictor
        self.training = dict(training or {})
        self.version = version or f"{KIND}-{time.strftime('%Y%m%d%H%M%S')}"
        self.observation_space, self.action_space = placement_spaces(self.n_nodes, self.slots, len(self.app_names))
        self._np = scorer.numpy_weights()
        self._table = None
        self._features = None
        # sampled decisions (deterministic=False) draw from the policy's own stream: a service
        # restarted and asked the same questions answers the same (an unseeded draw did not)
        self._sample_rng = np.random.default_rng(0)

    @property
    def n_apps(self) -> int:
        return len(self.app_names)

    def for_nodes(self, n_nodes: int) -> "PlacementPolicy":
        """The same network, with the spaces of an `n_nodes` cluster."""
        return PlacementPolicy(self.scorer, self.app_names, n_nodes, self.slots, self.predictor,
                               self.training, self.version)

    # --- one container -----------------------------------------------------------------------
    def initial_state(self):
        return None

    def _lookup(self):
        if self._table is None:
            predictor = self.predictor if self.predictor is not None else _ZeroPredictor(self.app_names)
            self._table = composition_table(predictor, self.n_apps, self.slots)
            self._features = self.scorer.config.features.node_table(self._table)
        return self._table, self._features

    def node_logits(self, observation: dict) -> tuple[np.ndarray, np.ndarray]:
        """(N,) logits and (N,) bool: nodes with room for the next container (by the counts)."""
        table, node_x = self._lookup()
        app_vec = np.asarray(observation["app"], dtype=np.float64).reshape(-1)
        counts = np.asarray(observation["counts"], dtype=np.float64)
        remaining = np.clip(np.rint(np.asarray(observation["remaining"], dtype=np.float64).reshape(-1)), 0, None)
        if app_vec.shape != (self.n_apps,) or counts.ndim != 2 or counts.shape[1] != self.n_apps \
                or remaining.shape != (self.n_apps,):
            raise ValueError(f"observation needs app ({self.n_apps},), counts (N, {self.n_apps}), "
                             f"remaining ({self.n_apps},)")
        app = int(np.argmax(app_vec))
        counts = np.clip(np.rint(counts), 0, None).astype(np.int64)
        n = len(counts)
        fits = counts.sum(axis=1) <= self.slots      # a node over its slots (not a real state) is full
        ids = np.full(n, table.sentinel, dtype=np.int64)
        ids[fits] = table.ids(counts[fits])
        nxt = table.add[ids, app]
        room = nxt != table.sentinel
        placed = int(counts.sum())
        batch_size = placed + int(remaining.sum())
        glob = self.scorer.config.features.global_features(
            np.array([app]), remaining[None], max(batch_size, 1), np.array([placed]),
            np.array([n * self.slots - placed]))[0]
        logits = self._np.trunk(self._np.node_part(node_x[app][ids]) + self._np.global_part(glob))
        return logits, room

    def decide_node(self, observation: dict, mask=None, deterministic: bool = True,
                    rng: np.random.Generator | None = None) -> int:
        """The node for the next container. `mask` (N,) int8/bool, 1 = allowed (e.g. the env's
        `info["action_mask"]`, which also applies the constraints); without it any node with a free
        slot is allowed. Raises Infeasible when no node can take it."""
        node, _ = self._decide(observation, mask, deterministic, rng)
        return node

    def probe_observation(self) -> dict:
        """A valid observation for an upload's test decision: a sample of the space is never one-hot
        in `app`, so every uploaded placement policy failed its test decision."""
        app = np.zeros(len(self.app_names), np.float32)
        app[0] = 1.0
        remaining = app.copy()
        return {"app": app, "counts": np.zeros((self.n_nodes, len(self.app_names)), np.float32),
                "remaining": remaining}

    def decide(self, observation: dict, state=None, *, mask=None, deterministic: bool = True):
        """The platform's Policy protocol: (Decision(action=node), state)."""
        from agents.policy import Decision

        # NaN counts as nonzero: [NaN, 0, ...] passed the one-hot check and placed app 0's container,
        # and a NaN in `remaining` failed with "cannot convert float NaN to integer"
        for key in ("app", "counts", "remaining"):
            if not np.isfinite(np.asarray(observation[key], dtype=np.float64)).all():
                raise InvalidInput(f"observation.{key}", "must hold finite numbers only")
        app_vec = np.asarray(observation["app"], dtype=np.float64).reshape(-1)
        # argmax of a zero or many-hot vector would silently place app 0's or some app's container
        if np.count_nonzero(app_vec) != 1:
            raise InvalidInput("observation.app", "must be one-hot: exactly one app is the next container's")
        n_nodes = len(np.asarray(observation["counts"]))
        if mask is not None and np.asarray(mask).size != n_nodes:
            raise InvalidInput("action_mask", f"length {np.asarray(mask).size} != {n_nodes} nodes")
        if mask is not None and not np.asarray(mask).any():  # was blamed on observation.counts
            raise InvalidInput("action_mask", "every node is masked out; nothing can be decided")
        try:
            node, info = self._decide(observation, mask, deterministic, None)
        except Infeasible as exc:  # a full cluster is the caller's input, not the policy failing
            raise InvalidInput("observation.counts", str(exc)) from None
        return Decision(node, f"node {node}", info), state

    def _decide(self, observation, mask, deterministic, rng):
        with single_thread_blas():
            logits, room = self.node_logits(observation)
        allowed = room if mask is None else room & (np.asarray(mask).reshape(-1).astype(bool))
        info = {}
        if not allowed.any():
            if mask is None or not np.asarray(mask).any():
                raise Infeasible("no node can take the next container")
            # the caller's mask allows nodes the counts say are full: trust the caller, score nothing
            info["fallback"] = "no allowed node has room by the counts; took the first allowed node"
            return int(np.flatnonzero(np.asarray(mask).reshape(-1))[0]), info
        z = np.where(allowed, logits, -np.inf)
        p = np.exp(z - z.max())
        p /= p.sum()
        info["probability"] = None
        if deterministic:
            node = int(np.argmax(z))
        else:
            rng = rng if rng is not None else self._sample_rng
            node = int(rng.choice(len(p), p=p))
        info["probability"] = round(float(p[node]), 6)
        return node, info

    # --- a whole batch -----------------------------------------------------------------------
    def plan(self, cluster: Cluster, batch: Batch, constraints: Constraints, predictor: Predictor | None = None,
             rng: np.random.Generator | None = None, samples: int = 64, fine_tune_s: float = 0.0,
             polish: bool = False, fine_tune: dict | None = None, return_details: bool = False,
             polish_starts: int = 16):
        """Best of: the greedy roll-out, `samples` sampled roll-outs, (fine_tune_s > 0) the paper's
        per-batch REINFORCE started from this policy for that many seconds, (polish) the baselines'
        local search started from each of the `polish_starts` best of those (multi-start: the
        policy proposes the starting points, the search finishes them). Returns the (N, A)
        placement (and a details dict)."""
        start = time.perf_counter()
        predictor = predictor if predictor is not None else self.predictor
        if predictor is None:
            raise ValueError("plan needs a predictor (this policy has none)")
        rng = rng if rng is not None else np.random.default_rng(0)
        if len(batch.counts) != self.n_apps:
            raise ValueError(f"the batch has {len(batch.counts)} apps, the policy {self.n_apps}")
        if batch.size > cluster.capacity:
            raise Infeasible(f"{batch.size} containers do not fit in {cluster.capacity} slots")
        if isinstance(predictor, TabulatedPredictor) and cluster.slots > predictor.slots:
            # its table scores every fuller node 0: the plan was chosen by garbage, silently
            raise ValueError(f"the policy's stored predictor covers nodes of at most {predictor.slots} slots, "
                             f"the cluster has {cluster.slots}: pass a predictor for {cluster.slots} slots")
        details = {}
        table = composition_table(predictor, self.n_apps, cluster.slots)
        problem = PlacementProblem(cluster, batch, constraints, predictor, self.scorer.config, table)
        candidates = []  # (reward, placement, source)
        with single_thread_blas():
            greedy = rollout(problem, self._np, rng, 1, greedy=True, record=False)
            runs = [greedy]
            if greedy.alive[0]:
                candidates.append((float(greedy.rewards[0]), problem.placement(greedy.actions[:, 0]), "greedy"))
            chunk = max(1, min(samples, 200_000 // max(cluster.n_nodes, 1)))
            left = samples
            while left > 0:
                sampled = rollout(problem, self._np, rng, min(chunk, left), record=False)
                left -= min(chunk, left)
                runs.append(sampled)
                # keep the best few of each chunk: they are the local search's starting points
                keep = polish_starts if polish else 1
                for k in np.argsort(-np.where(sampled.alive, sampled.rewards, -np.inf))[:keep]:
                    if sampled.alive[k]:
                        candidates.append((float(sampled.rewards[k]), problem.placement(sampled.actions[:, k]),
                                           "sampled"))
        details["rollout_s"] = time.perf_counter() - start
        if fine_tune_s > 0:
            # the time budget governs (no episode cap unless `fine_tune` sets one)
            config = replace(ReinforceConfig(episodes=10**9), **(fine_tune or {}))
            config = replace(config, time_limit_s=fine_tune_s)
            try:
                tuned = reinforce(cluster, batch, constraints, predictor, rng, config, init_policy=self.scorer)
                candidates.append((score(tuned.placement, predictor), tuned.placement, "fine-tuned"))
                details["fine_tune_episodes"] = tuned.episodes
            except Infeasible:
                pass
        if not candidates:
            plan = repair(problem, runs)          # Infeasible when no valid plan exists
            candidates.append((score(plan, predictor), plan, "repaired"))
        candidates.sort(key=lambda c: -c[0])
        plan, source = candidates[0][1], candidates[0][2]
        details["unpolished_score"] = score(plan, predictor)
        details["unpolished_plan"] = plan
        details["unpolished_s"] = time.perf_counter() - start
        if polish:
            finished = [polish_plan(c[1], cluster, batch, constraints, predictor, rng)
                        for c in candidates[:max(1, polish_starts)]]
            plan = max(finished, key=lambda p: score(p, predictor))
            details["polish_starts"] = len(finished)
        problems = check_plan(plan, batch, cluster, constraints)
        assert not problems, problems
        details |= {"source": source, "score": score(plan, predictor), "seconds": time.perf_counter() - start}
        return (plan, details) if return_details else plan

    # --- persistence -------------------------------------------------------------------------
    def metadata(self) -> dict:
        from samm import __version__

        return {
            "kind": KIND,
            "problem": PROBLEM,
            "format": FORMAT,
            "version": self.version,
            "samm_version": __version__,
            "app_names": list(self.app_names),
            "n_nodes": self.n_nodes,
            "slots": self.slots,
            "observation_space": space_to_json(self.observation_space),
            "action_space": space_to_json(self.action_space),
            "network": self.scorer.config.to_json(),
            "predictor_table": self.predictor is not None and self.scorer.config.predictor_features,
            "training": self.training,
        }

    def save(self, directory: str | Path) -> Path:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        payload = {"scorer": {k: v.detach().clone() for k, v in self.scorer.state_dict().items()}}
        if self.predictor is not None and self.scorer.config.predictor_features:
            comps = enumerate_compositions(self.n_apps, self.slots)
            comps = comps[np.argsort(comps @ ((self.slots + 1) ** np.arange(self.n_apps)))]
            tp = np.asarray(self.predictor.throughput(comps), dtype=np.float32)
            payload["predictor_throughput"] = torch.from_numpy(tp)
        # one save: killed part-way, the folder holds the previous policy or this one, whole
        return save_torch_policy(d, None, self.metadata(), WEIGHTS_FILE, METADATA_FILE, state=payload)

    @classmethod
    def load(cls, directory: str | Path, observation_space: spaces.Space | None = None,
             action_space: spaces.Space | None = None, n_nodes: int | None = None,
             predictor: Predictor | None = None) -> "PlacementPolicy":
        """Load a saved policy; ValueError when the directory is not an lra-reinforce policy, is
        inconsistent, or its spaces differ from the given ones. `n_nodes` rebinds the (node-shared)
        network to another cluster size first; `predictor` replaces the stored table."""
        from agents.registry import read_policy_metadata

        d = Path(directory)
        meta = read_policy_metadata(d, KIND, PROBLEM, FORMAT)
        try:
            config = ScorerConfig.from_json(meta["network"])
            app_names = tuple(meta["app_names"])
            saved_n, slots = int(meta["n_nodes"]), int(meta["slots"])
            saved_obs = space_from_json(meta["observation_space"])
            saved_act = space_from_json(meta["action_space"])
            # checked here: a width, node or slot count below 1 failed in torch or gymnasium, unnamed
            if saved_n < 1 or slots < 1 or not config.hidden or min(config.hidden) < 1:
                raise ValueError(f"n_nodes {saved_n}, slots {slots} and every network.hidden width "
                                 f"{list(config.hidden)} must be >= 1")
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{d / METADATA_FILE}: missing or malformed field ({one_line(e)})") from None
        # the recorded spaces must be the ones this network and cluster imply
        check_spaces(saved_obs, saved_act, *placement_spaces(saved_n, slots, len(app_names)), what=str(d))
        payload = _read_payload(saved_weights_path(d, WEIGHTS_FILE, METADATA_FILE))
        scorer = NodeScorer(config)
        try:
            scorer.load_state_dict(payload["scorer"])
        except (RuntimeError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{d / WEIGHTS_FILE}: weights do not fit the network in {METADATA_FILE} "
                             f"({one_line(e)})") from None
        bad = [k for k, v in scorer.state_dict().items() if not torch.isfinite(v).all()]
        if bad:  # NaN logits: the argmax is node 0 for every container
            raise ValueError(f"{d / WEIGHTS_FILE}: {bad[0]} holds NaN or inf values")
        if predictor is None and "predictor_throughput" in payload:
            try:
                predictor = TabulatedPredictor(app_names, slots, payload["predictor_throughput"].numpy())
            except (ValueError, AttributeError) as e:
                raise ValueError(f"{d / WEIGHTS_FILE}: predictor_throughput: {one_line(e)}") from None
        policy = cls(scorer, app_names, n_nodes or saved_n, slots, predictor, meta.get("training"), meta.get("version"))
        if observation_space is not None or action_space is not None:
            check_spaces(policy.observation_space, policy.action_space,
                         observation_space if observation_space is not None else policy.observation_space,
                         action_space if action_space is not None else policy.action_space, what=str(d))
        return policy


def _read_payload(path: Path) -> dict:
    """policy.pt's {"scorer": state dict, ...}, or a one-line ValueError naming the file."""
    payload = read_torch_file(path, METADATA_FILE)
    if not isinstance(payload, dict) or not isinstance(payload.get("scorer"), dict):
        raise ValueError(f"{path}: not a saved placement policy (no 'scorer' state dict)")
    return payload


class _ZeroPredictor:
    """Stands in when a network that ignores the predictor has none (its features never read it)."""

    def __init__(self, app_names):
        self.app_names = tuple(app_names)

    def throughput(self, compositions):
        return np.zeros(np.shape(compositions), dtype=np.float64)


def load_policy(directory: str | Path = SHIPPED_DIR, **kwargs) -> PlacementPolicy:
    return PlacementPolicy.load(directory, **kwargs)


_SHIPPED: dict[str, PlacementPolicy] = {}


def shipped_policy() -> PlacementPolicy:
    """The policy shipped with SAMM (loaded once)."""
    if "default" not in _SHIPPED:
        if not (SHIPPED_DIR / METADATA_FILE).is_file():
            raise FileNotFoundError(f"no shipped policy at {SHIPPED_DIR} (train one with "
                                    "`python -m agents.lra_placement.train --out DIR`)")
        _SHIPPED["default"] = PlacementPolicy.load(SHIPPED_DIR)
    return _SHIPPED["default"]


def plan_policy(cluster: Cluster, batch: Batch, constraints: Constraints, predictor: Predictor,
                rng: np.random.Generator, policy: PlacementPolicy | str | Path | None = None, **params) -> np.ndarray:
    """Planner with the common signature: a trained policy (the shipped one by default, or a
    PlacementPolicy or a directory) plans the batch. Params as `PlacementPolicy.plan` (samples,
    fine_tune_s, polish)."""
    if policy is None:
        policy = shipped_policy()
    elif not isinstance(policy, PlacementPolicy):
        policy = PlacementPolicy.load(policy)
    return policy.plan(cluster, batch, constraints, predictor, rng, **params)
