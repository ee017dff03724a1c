"""The paper's learning agent (§4, Algorithm 1, Eq. 1): REINFORCE trained afresh for one batch.

For each arriving batch a new policy places the batch's containers one per step (in
`batch.order`) by a masked softmax over the feasible nodes; the only reward is the finished
placement's mean normalised throughput (`cluster.score`). The policy gradient uses the average
reward as the baseline b (Eq. 1). Episodes with reward r >= eta * R* (R* the best so far) are kept
in a buffer B, and each update uses the latest episodes together with a batch replayed from B.
The answer is the highest-reward plan in B, not a greedy roll-out of the policy (Alg. 1, line 14).

An episode that reaches a container with no feasible node (a dead end under the constraints)
gets reward 0 and is not stored.

Speed: K episodes of the same batch run side by side (one network evaluation per step for all K,
in NumPy), nodes are moved as composition ids of a `CompositionTable` (so the predictor is one
table lookup for all K x N nodes), and the gradient is one batched PyTorch pass over the stored
composition ids.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields, replace

import numpy as np
import torch

from agents.lra_placement.cluster import Batch, Cluster, Constraints, Predictor, check_plan, score
from agents.lra_placement.errors import Infeasible
from agents.lra_placement.network import (
    CompositionTable,
    NodeScorer,
    NumpyScorer,
    ScorerConfig,
    composition_table,
    single_thread_blas,
)


@dataclass(frozen=True)
class ReinforceConfig:
    """Hyperparameters of the per-batch agent. The paper gives the algorithm (REINFORCE with an
    average-reward baseline, gamma in (0, 1], a top-episode replay buffer gated by eta * R*) but no
    values: every value below is our choice unless it says otherwise."""

    #: episodes E of Alg. 1 (upper bound; `time_limit_s` may stop earlier). Not given by the paper; our choice.
    episodes: int = 20_000
    #: wall-clock budget per batch. The paper plans a batch in "less than 7.5 minutes" (§6); our default stays
    #: well inside it. Not given by the paper; our choice.
    time_limit_s: float = 120.0
    #: stop once R* has not improved for this many episodes (0: never). Not in the paper; our choice.
    patience_episodes: int = 10_000
    #: fresh episodes sampled per update (the "latest experience" of Alg. 1 line 12). Our choice.
    episodes_per_update: int = 32
    #: episodes replayed from B per update (Alg. 1 line 12 "batch experience selected from B"). Our choice.
    replay_batch: int = 8
    #: capacity of B (best episodes kept). Not given by the paper; our choice.
    buffer_size: int = 64
    #: an episode enters B when r >= eta * R* (Alg. 1 line 9). eta not given by the paper; our choice.
    eta: float = 0.99
    #: discount (Eq. 1: gamma in (0, 1]). The reward comes only at the end of the batch and the paper's reward
    #: is "independent of the actual container scheduling order", so gamma = 1 (every step gets the final
    #: reward). Value not given by the paper; our choice.
    gamma: float = 1.0
    #: Adam learning rate (Eq. 1's alpha). Not given by the paper; our choice.
    lr: float = 3e-3
    #: entropy bonus weight (not in the paper; our choice, 0 disables it).
    entropy_coef: float = 0.0
    #: advantages (r - b) are divided by max(std of the update's fresh rewards, this) so the step size does not
    #: depend on the reward's scale. Not in the paper; our choice.
    advantage_std_floor: float = 0.01
    #: gradient-norm clip. Not in the paper; our choice.
    max_grad_norm: float = 1.0
    #: network: hidden widths of the per-node scorer. Not given by the paper; our choice.
    hidden: tuple[int, ...] = (64, 64)
    #: feed the predictor's throughput of each node to the network (our addition; the paper's state is the
    #: one-hot container and the node counts only).
    predictor_features: bool = False
    #: rows (steps x episodes x nodes) per backward chunk; bounds the memory of one update. Our choice.
    max_rows_per_chunk: int = 200_000
    #: torch threads during training (1 is fastest for these small matrices on 2 cores; measured).
    torch_threads: int = 1

    def scorer_config(self, n_apps: int) -> ScorerConfig:
        return ScorerConfig(n_apps, self.predictor_features, tuple(self.hidden))


# --- one batch as a problem -------------------------------------------------------------------
class PlacementProblem:
    """A batch on a cluster with everything a rollout needs precomputed."""

    def __init__(self, cluster: Cluster, batch: Batch, constraints: Constraints, predictor: Predictor,
                 spec_config: ScorerConfig, table: CompositionTable | None = None):
        n_apps = len(batch.counts)
        if constraints.n_apps != n_apps:
            raise ValueError(f"constraints cover {constraints.n_apps} apps, the batch {n_apps}")
        if spec_config.n_apps != n_apps:
            raise ValueError(f"the network is for {spec_config.n_apps} apps, the batch has {n_apps}")
        self.cluster, self.batch, self.constraints, self.predictor = cluster, batch, constraints, predictor
        self.table = table if table is not None else composition_table(predictor, n_apps, cluster.slots)
        self.spec = spec_config.features
        self.allowed = self.table.allowed(constraints)                # (C+1,)
        self.order = batch.order                                      # (T,)
        self.node_x = node_table(self.table, self.spec)                # (A, C+1, F) float32
        self.globals = self.spec.batch_globals(self.order, cluster.n_nodes, cluster.slots)  # (T, G)
        self._torch = None

    @property
    def T(self) -> int:
        return len(self.order)

    def torch_inputs(self):
        if self._torch is None:
            self._torch = (torch.from_numpy(self.node_x), torch.from_numpy(self.globals))
        return self._torch

    def placement(self, actions: np.ndarray) -> np.ndarray:
        """(T,) node per container -> (N, A) placement."""
        p = np.zeros((self.cluster.n_nodes, len(self.batch.counts)), dtype=np.int64)
        np.add.at(p, (np.asarray(actions, dtype=np.int64), self.order), 1)
        return p


def node_table(table: CompositionTable, spec) -> np.ndarray:
    cache = table.__dict__.setdefault("_node_tables", {})
    if spec not in cache:
        cache[spec] = spec.node_table(table)
    return cache[spec]


@dataclass
class Episodes:
    """K episodes of one problem. comp_hist[t, k, n]: composition id of node n before step t."""

    comp_hist: np.ndarray   # (T, K, N) int32
    actions: np.ndarray     # (T, K) int64; -1 from a dead end on
    final: np.ndarray       # (K, N) composition ids at the end
    rewards: np.ndarray     # (K,) mean normalised throughput; 0 for a dead end
    alive: np.ndarray       # (K,) bool: every container placed


def rollout(problem: PlacementProblem, scorer: NumpyScorer, rng: np.random.Generator, k: int,
            greedy: bool = False, record: bool = True) -> Episodes:
    """Run k episodes side by side, sampling (or, greedy=True, taking the best-scored node)."""
    table, N, T = problem.table, problem.cluster.n_nodes, problem.T
    first_global = scorer.global_part(problem.globals)                   # (T, h0)
    comp = np.full((k, N), table.empty_id, dtype=np.int64)
    alive = np.ones(k, dtype=bool)
    hist = np.empty((T, k, N), dtype=np.int32) if record else None
    actions = np.full((T, k), -1, dtype=np.int64)
    rows = np.arange(k)
    for t in range(T):
        a = int(problem.order[t])
        if record:
            hist[t] = comp
        nxt = table.add[comp, a]
        mask = problem.allowed[nxt] & alive[:, None]
        alive &= mask.any(axis=1)
        if not alive.any():
            break
        # one evaluation per distinct composition (many nodes and episodes share one)
        uniq, inverse = np.unique(comp, return_inverse=True)
        scores = scorer.trunk(scorer.node_part(problem.node_x[a][uniq]) + first_global[t])
        logits = scores[inverse.reshape(comp.shape)]
        logits = np.where(mask, logits, -np.inf)
        if greedy:
            choice = np.argmax(logits, axis=1)
        else:
            with np.errstate(invalid="ignore"):  # rows of dead episodes are all -inf
                z = logits - logits.max(axis=1, keepdims=True)
            z[~alive] = 0.0
            p = np.exp(z)
            cum = np.cumsum(p, axis=1)
            u = rng.random(k)[:, None] * cum[:, -1:]
            choice = np.minimum((cum <= u).sum(axis=1), N - 1)
            # guard against landing on a masked node through rounding (cum flat there)
            bad = ~mask[rows, choice] & alive
            if bad.any():
                choice[bad] = np.argmax(np.where(mask[bad], p[bad], -1.0), axis=1)
        live = rows[alive]
        actions[t, live] = choice[live]
        comp[live, choice[live]] = nxt[live, choice[live]]
    rewards = np.where(alive, table.total[np.minimum(comp, table.sentinel - 1)].sum(axis=1) / T, 0.0)
    return Episodes(hist, actions, comp, rewards, alive)


# --- the policy gradient ----------------------------------------------------------------------
def accumulate_policy_gradient(scorer: NodeScorer, problem: PlacementProblem, comp_hist: np.ndarray,
                               actions: np.ndarray, advantages: np.ndarray, entropy_coef: float,
                               max_rows: int, gamma: float = 1.0, weight: float = 1.0) -> tuple[float, float]:
    """Add the gradient of -(1/E) sum_e A_e sum_t gamma^(T-1-t) log pi(a_t | s_t) / T (minus an entropy
    bonus) for E episodes to `scorer`'s .grad (Eq. 1 with the final reward only: the return from step t is
    gamma^(T-1-t) r). Chunked over steps to bound memory. Returns (mean log-prob, mean entropy)."""
    T, E, N = comp_hist.shape
    node_x, glob = problem.torch_inputs()
    table = problem.table
    adv = torch.as_tensor(advantages, dtype=torch.float32)
    discounts = torch.as_tensor(gamma ** (T - 1 - np.arange(T)), dtype=torch.float32)
    chunk = max(1, max_rows // max(E * N, 1))
    sum_lp = sum_ent = 0.0
    n_valid = 0
    for t0 in range(0, T, chunk):
        t1 = min(T, t0 + chunk)
        comps = comp_hist[t0:t1].astype(np.int64)                         # (c, E, N)
        apps = problem.order[t0:t1]
        act = actions[t0:t1]
        valid = act >= 0                                                  # (c, E)
        mask = problem.allowed[table.add[comps, apps[:, None, None]]]      # (c, E, N)
        mask[~valid] = True
        # The score of a node depends on (step, composition) only, and episodes share many compositions:
        # evaluate the network once per distinct pair and scatter the logits back (exact, much cheaper).
        steps = np.arange(t1 - t0)
        keys = steps[:, None, None] * (table.sentinel + 1) + comps
        uniq, inverse = np.unique(keys, return_inverse=True)
        u_step, u_comp = uniq // (table.sentinel + 1), uniq % (table.sentinel + 1)
        x = node_x[torch.as_tensor(apps[u_step]), torch.as_tensor(u_comp)]          # (U, F)
        first = scorer.node_in(x) + scorer.global_in(glob[t0:t1])[torch.as_tensor(u_step)]
        logits = scorer.trunk(first)[torch.as_tensor(inverse.reshape(comps.shape))]  # (c, E, N)
        mask_t = torch.as_tensor(mask)
        logp_all = torch.log_softmax(logits.masked_fill(~mask_t, float("-inf")), dim=-1)
        a_t = torch.as_tensor(np.where(valid, act, 0))
        lp = logp_all.gather(-1, a_t.unsqueeze(-1)).squeeze(-1)          # (c, E)
        valid_t = torch.as_tensor(valid, dtype=torch.float32)
        # masked entries have probability 0; fill their -inf log-probs with 0 so 0 * log 0 adds 0 (not NaN)
        safe = logp_all.masked_fill(~mask_t, 0.0)
        ent = -(safe.exp() * safe * mask_t).sum(-1)
        objective = (lp * valid_t * discounts[t0:t1, None] * adv[None, :]).sum()
        if entropy_coef:
            objective = objective + entropy_coef * (ent * valid_t).sum()
        loss = -objective * (weight / (E * T))
        loss.backward()
        sum_lp += float((lp.detach() * valid_t).sum())
        sum_ent += float((ent.detach() * valid_t).sum())
        n_valid += int(valid.sum())
    n_valid = max(n_valid, 1)
    return sum_lp / n_valid, sum_ent / n_valid


# --- the top-episode buffer B -----------------------------------------------------------------
class TopEpisodes:
    """B of Alg. 1: episodes with r >= eta * R*, at most `capacity` (the best kept), no duplicates.
    Entries that fall below eta * R* when R* rises are dropped too (our choice: B stays "the top")."""

    def __init__(self, capacity: int, eta: float):
        self.capacity, self.eta = capacity, eta
        self.best = -np.inf
        self.rewards: list[float] = []
        self.actions: list[np.ndarray] = []
        self.hists: list[np.ndarray] = []
        self._seen: set[bytes] = set()

    def __len__(self) -> int:
        return len(self.rewards)

    def offer(self, episodes: Episodes) -> int:
        """Store the alive episodes that qualify; returns how many were stored."""
        stored = 0
        dtype = np.int16 if episodes.comp_hist.max(initial=0) < np.iinfo(np.int16).max else np.int32
        for k in np.argsort(-episodes.rewards, kind="stable"):
            if not episodes.alive[k]:
                continue
            r = float(episodes.rewards[k])
            if r < self.eta * max(self.best, r):
                continue
            key = episodes.actions[:, k].astype(np.int16).tobytes()
            if key in self._seen:
                continue
            self.best = max(self.best, r)
            self._seen.add(key)
            self.rewards.append(r)
            self.actions.append(episodes.actions[:, k].copy())
            self.hists.append(episodes.comp_hist[:, k].astype(dtype))
            stored += 1
        self._prune()
        return stored

    def _prune(self) -> None:
        keep = [i for i in np.argsort(-np.asarray(self.rewards), kind="stable")
                if self.rewards[i] >= self.eta * self.best][: self.capacity]
        if len(keep) == len(self.rewards):
            return
        dropped = set(range(len(self.rewards))) - set(keep)
        for i in dropped:
            self._seen.discard(self.actions[i].astype(np.int16).tobytes())
        self.rewards = [self.rewards[i] for i in keep]
        self.actions = [self.actions[i] for i in keep]
        self.hists = [self.hists[i] for i in keep]

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if not self.rewards or n <= 0:
            return np.zeros(0, dtype=np.int64)
        return rng.integers(0, len(self.rewards), size=n)

    def top(self) -> tuple[float, np.ndarray]:
        i = int(np.argmax(self.rewards))
        return self.rewards[i], self.actions[i]


# --- the per-batch agent ----------------------------------------------------------------------
@dataclass
class ReinforceResult:
    placement: np.ndarray
    score: float                     # cluster.score of the returned plan under the predictor
    episodes: int
    updates: int
    seconds: float
    dead_ends: int                   # episodes that hit a container with no feasible node
    curve: list[dict] = field(default_factory=list)  # per update: episodes, seconds, best (R*), mean, buffer
    scorer: NodeScorer | None = None
    config: ReinforceConfig | None = None


def new_scorer(config: ScorerConfig, seed: int) -> NodeScorer:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return NodeScorer(config)


def reinforce(cluster: Cluster, batch: Batch, constraints: Constraints, predictor: Predictor,
              rng: np.random.Generator, config: ReinforceConfig = ReinforceConfig(),
              init_policy=None, progress=None) -> ReinforceResult:
    """Alg. 1 for one batch. `init_policy`: a NodeScorer (or anything with `.scorer`) to start from
    instead of a fresh network (fine-tuning a policy trained across batches)."""
    start = time.perf_counter()
    if batch.size > cluster.capacity:
        raise Infeasible(f"{batch.size} containers do not fit in {cluster.capacity} slots")
    if init_policy is not None:
        base = getattr(init_policy, "scorer", init_policy)
        scorer = new_scorer(base.config, 0)
        scorer.load_state_dict(base.state_dict())
        scorer_config = base.config
    else:
        scorer_config = config.scorer_config(len(batch.counts))
        scorer = new_scorer(scorer_config, int(rng.integers(2**31)))
    problem = PlacementProblem(cluster, batch, constraints, predictor, scorer_config)
    threads = torch.get_num_threads()
    torch.set_num_threads(config.torch_threads)
    blas = single_thread_blas()
    blas.__enter__()
    try:
        optimiser = torch.optim.Adam(scorer.parameters(), lr=config.lr)
        buffer = TopEpisodes(config.buffer_size, config.eta)
        curve, episodes, updates, dead = [], 0, 0, 0
        best_seen, improved_at = -np.inf, 0
        while episodes < config.episodes and time.perf_counter() - start < config.time_limit_s:
            k = min(config.episodes_per_update, config.episodes - episodes)
            fresh = rollout(problem, scorer.numpy_weights(), rng, k)
            episodes += k
            dead += int((~fresh.alive).sum())
            buffer.offer(fresh)
            baseline = float(fresh.rewards.mean())  # the average reward of the latest episodes (Eq. 1's b)
            scale = max(float(fresh.rewards.std()), config.advantage_std_floor)
            picks = buffer.sample(rng, config.replay_batch)
            hist = fresh.comp_hist
            actions = fresh.actions
            rewards = fresh.rewards
            if len(picks):
                hist = np.concatenate([hist, np.stack([buffer.hists[i] for i in picks], axis=1).astype(np.int32)], axis=1)
                actions = np.concatenate([actions, np.stack([buffer.actions[i] for i in picks], axis=1)], axis=1)
                rewards = np.concatenate([rewards, [buffer.rewards[i] for i in picks]])
            optimiser.zero_grad(set_to_none=True)
            _, entropy = accumulate_policy_gradient(
                scorer, problem, hist, actions, (rewards - baseline) / scale, config.entropy_coef,
                config.max_rows_per_chunk, config.gamma)
            torch.nn.utils.clip_grad_norm_(scorer.parameters(), config.max_grad_norm)
            optimiser.step()
            updates += 1
            alive_r = fresh.rewards[fresh.alive]
            curve.append({"update": updates, "episodes": episodes, "seconds": round(time.perf_counter() - start, 4),
                          "best": float(buffer.best) if len(buffer) else 0.0,
                          "mean": float(alive_r.mean()) if len(alive_r) else 0.0,
                          "dead": int((~fresh.alive).sum()), "entropy": entropy, "buffer": len(buffer)})
            if progress is not None:
                progress(curve[-1])
            if buffer.best > best_seen:
                best_seen, improved_at = buffer.best, episodes
            elif config.patience_episodes and episodes - improved_at >= config.patience_episodes:
                break
    finally:
        blas.__exit__(None, None, None)
        torch.set_num_threads(threads)
    if len(buffer):
        _, best_actions = buffer.top()
        placement = problem.placement(best_actions)
    else:
        # every episode met a container with no feasible node: like the baselines, repair the most
        # advanced partial plan (Infeasible when no valid plan exists at all)
        placement = repair(problem, [fresh] if updates else [])
    problems = check_plan(placement, batch, cluster, constraints)
    assert not problems, problems  # the mask makes this impossible; a failure here is a bug
    return ReinforceResult(placement, score(placement, predictor), episodes, updates,
                           time.perf_counter() - start, dead, curve, scorer, config)


def repair(problem: PlacementProblem, runs: list[Episodes]) -> np.ndarray:
    """A valid plan keeping as much as possible of the most advanced partial episode in `runs`
    (the baselines' `repair_placement`); Infeasible when no valid plan exists."""
    from agents.lra_placement.optimum import repair_placement

    partial = np.zeros((problem.cluster.n_nodes, len(problem.batch.counts)), dtype=np.int64)
    placed = -1
    for ep in runs:
        for k in range(len(ep.alive)):
            n = int((ep.actions[:, k] >= 0).sum())
            if n > placed:
                placed, partial = n, problem.table.comps[ep.final[k]]
    return repair_placement(partial, problem.batch, problem.cluster, problem.constraints)


def config_from_params(params: dict, base: ReinforceConfig = ReinforceConfig()) -> tuple[ReinforceConfig, dict]:
    """Split planner params into ReinforceConfig overrides and the rest."""
    names = {f.name for f in fields(ReinforceConfig)}
    overrides = {k: v for k, v in params.items() if k in names}
    if "hidden" in overrides:
        overrides["hidden"] = tuple(overrides["hidden"])
    return replace(base, **overrides), {k: v for k, v in params.items() if k not in names}


def plan_reinforce(cluster: Cluster, batch: Batch, constraints: Constraints, predictor: Predictor,
                   rng: np.random.Generator, **params) -> np.ndarray:
    """The paper's per-batch agent as a planner. Params: any ReinforceConfig field (e.g. `episodes`,
    `time_limit_s`), `init_policy` (a trained policy to fine-tune instead of a fresh network) and
    `polish` (True: finish the best plan with the baselines' local search: name such runs
    "lra-reinforce + local-search polish")."""
    config, rest = config_from_params(params)
    init_policy = rest.pop("init_policy", None)
    polish = bool(rest.pop("polish", False))
    if rest:
        raise TypeError(f"unknown plan_reinforce params: {sorted(rest)}")
    result = reinforce(cluster, batch, constraints, predictor, rng, config, init_policy=init_policy)
    if polish:
        return polish_plan(result.placement, cluster, batch, constraints, predictor, rng)
    return result.placement


def polish_plan(placement: np.ndarray, cluster: Cluster, batch: Batch, constraints: Constraints,
                predictor: Predictor, rng: np.random.Generator, **params) -> np.ndarray:
    """The baselines' local search started from `placement` (never worse than it)."""
    from agents.lra_placement.baselines import CompositionValues, local_search

    improved, _ = local_search(placement, cluster, constraints, CompositionValues(predictor), **params)
    return improved if score(improved, predictor) >= score(placement, predictor) else placement


def config_to_json(config: ReinforceConfig) -> dict:
    d = asdict(config)
    d["hidden"] = list(config.hidden)
    return d
