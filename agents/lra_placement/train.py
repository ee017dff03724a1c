"""Beyond the paper: one placement policy trained across many random batches.

The paper trains a fresh network for every batch (§4, "non-generic"). Here the same REINFORCE
(K episodes of one batch per update, the batch's average reward as the baseline) runs over a
stream of random batches, cluster sizes, app mixes and constraints, so that the policy places a
new batch well at once, and the per-batch method can start from it instead of from scratch.

    .venv/bin/python -m agents.lra_placement.train --predictor metis --seed 0 --out DIR

writes DIR/metadata.json + DIR/policy.pt (a `PlacementPolicy`) and DIR/train-log.csv (one row
per update). Seeded: the same command gives the same policy (single-threaded torch).
"""
from __future__ import annotations

import argparse
import csv
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from agents.lra_placement.cluster import Batch, Cluster, Constraints, Predictor, Rule
from agents.lra_placement.network import ScorerConfig, composition_table, single_thread_blas
from agents.lra_placement.policy import PlacementPolicy
from agents.lra_placement.reinforce import PlacementProblem, accumulate_policy_gradient, new_scorer, rollout
from agents.train_log import TrainingDiverged, first_non_finite, refuse_existing_run


@dataclass(frozen=True)
class TrainConfig:
    """Hyperparameters of the cross-batch training. The paper trains per batch only, so every
    value here is not given by the paper; our choice."""

    #: episodes in all (each update samples `episodes_per_batch` episodes of one batch)
    total_episodes: int = 200_000
    #: episodes of the same batch per update; their mean reward is the baseline
    episodes_per_batch: int = 16
    #: cluster sizes drawn uniformly per batch (the network is shared over nodes: any N works later)
    n_nodes_choices: tuple[int, ...] = (9, 27)
    slots: int = 8
    #: batch size on 9 nodes: the paper's 15-48 containers (§6.1)
    paper_sizes: tuple[int, int] = (15, 48)
    #: larger clusters: between these fractions of the capacity
    fill_range: tuple[float, float] = (0.3, 0.9)
    #: probability of a skewed (Zipf) app mix instead of a uniform one
    skew_prob: float = 0.5
    #: probability that a batch comes with 1-3 random operation constraints
    constraint_prob: float = 0.3
    lr: float = 1e-3
    entropy_coef: float = 0.0
    advantage_std_floor: float = 0.01
    max_grad_norm: float = 1.0
    hidden: tuple[int, ...] = (64, 64)
    predictor_features: bool = True
    #: node features also give the gain of one more container of every app (network.FeatureSpec)
    lookahead: bool = False
    #: wall-clock cap for the whole training
    time_limit_s: float = 540.0
    #: validate every this many episodes on `validation_batches` fixed batches (0: never): the policy's
    #: greedy roll-out and `validation_samples` sampled ones, as a ratio to greedy + local search. The
    #: saved policy is the one with the best validation ratio (model selection on batches drawn from a
    #: separate seed, never trained on).
    validate_every: int = 20_000
    validation_batches: int = 16
    validation_samples: int = 16
    max_rows_per_chunk: int = 200_000

    def to_json(self) -> dict:
        d = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


# --- the stream of training batches -----------------------------------------------------------
def random_constraints(rng: np.random.Generator, n_apps: int, slots: int) -> Constraints:
    """1-3 rules: anti-affinity of two apps, at most one of an app per node, or a cardinality
    limit on one app or a pair (our choice of mix; loose enough that most batches stay feasible)."""
    rules = []
    for _ in range(int(rng.integers(1, 4))):
        a, b = (int(x) for x in rng.choice(n_apps, 2, replace=False))
        kind = rng.integers(3)
        if kind == 0:
            rules.append(Rule(a, b, "anti-affinity"))
        elif kind == 1:
            rules.append(Rule(a, a, "cardinality", int(rng.integers(2, max(3, slots // 2) + 1))))
        else:
            rules.append(Rule(a, b, "cardinality", int(rng.integers(3, slots + 1))))
    return Constraints(n_apps, tuple(rules))


def sample_training_batch(rng: np.random.Generator, n_apps: int, n_nodes: int, config: TrainConfig) -> Batch:
    from agents.lra_placement.env import sample_batch

    capacity = n_nodes * config.slots
    if n_nodes <= 9:
        size_range = config.paper_sizes
    else:
        size_range = (max(config.paper_sizes[0], int(config.fill_range[0] * capacity)),
                      int(config.fill_range[1] * capacity))
    skew = "zipf" if rng.random() < config.skew_prob else None
    return sample_batch(rng, n_apps, size_range, skew=skew, capacity=capacity)


class Validation:
    """Fixed batches (from their own seed) with their greedy + local-search score as the yardstick."""

    def __init__(self, predictor: Predictor, config: TrainConfig, seed: int, scorer_config: ScorerConfig, table):
        from agents.lra_placement.baselines import plan_greedy_local_search
        from agents.lra_placement.cluster import score
        from agents.lra_placement.errors import Infeasible

        rng = np.random.default_rng([seed, 7919])  # not the training stream
        n_apps = len(predictor.app_names)
        self.problems, self.reference = [], []
        for i in range(config.validation_batches):
            n_nodes = config.n_nodes_choices[i % len(config.n_nodes_choices)]
            cluster = Cluster(n_nodes, config.slots)
            for _ in range(10):
                batch = sample_training_batch(rng, n_apps, n_nodes, config)
                constraints = (random_constraints(rng, n_apps, config.slots) if rng.random() < config.constraint_prob
                               else Constraints.none(n_apps))
                try:
                    ref = plan_greedy_local_search(cluster, batch, constraints, predictor, rng, time_limit_s=5.0)
                except Infeasible:
                    continue
                self.problems.append(PlacementProblem(cluster, batch, constraints, predictor, scorer_config, table))
                self.reference.append(score(ref, predictor))
                break
        self.samples = config.validation_samples

    def __call__(self, scorer, rng: np.random.Generator) -> float:
        """Mean over the batches of best(policy roll-outs) / greedy-ls (0 for a batch with no valid roll-out)."""
        weights = scorer.numpy_weights()
        ratios = []
        for problem, ref in zip(self.problems, self.reference):
            best = 0.0
            for eps in (rollout(problem, weights, rng, 1, greedy=True, record=False),
                        rollout(problem, weights, rng, self.samples, record=False)):
                if eps.alive.any():
                    best = max(best, float(eps.rewards[eps.alive].max()))
            ratios.append(best / ref)
        return float(np.mean(ratios)) if ratios else float("nan")


@dataclass
class TrainResult:
    policy: PlacementPolicy
    log: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    episodes: int = 0
    validation: list[dict] = field(default_factory=list)


def train_generalist(config: TrainConfig, predictor: Predictor, n_nodes_choices: tuple[int, ...] | None = None,
                     seed: int = 0, total_episodes: int | None = None, out: str | Path | None = None,
                     progress: bool = True, command: str | None = None, predictor_name: str = "",
                     log_path: str | Path | None = None) -> TrainResult:
    """Train one policy over random batches; save it to `out` when given, with validation.csv and
    the per-update log (`log_path`, default `out`/train-log.csv)."""
    if n_nodes_choices is not None:
        config = _replace(config, n_nodes_choices=tuple(n_nodes_choices))
    if total_episodes is not None:
        config = _replace(config, total_episodes=int(total_episodes))
    start = time.perf_counter()
    rng = np.random.default_rng(seed)
    n_apps = len(predictor.app_names)
    scorer_config = ScorerConfig(n_apps, config.predictor_features, tuple(config.hidden), config.lookahead)
    scorer = new_scorer(scorer_config, seed)
    optimiser = torch.optim.Adam(scorer.parameters(), lr=config.lr)
    table = composition_table(predictor, n_apps, config.slots)
    log: list[dict] = []
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=config.total_episodes, unit="ep", file=sys.stderr, mininterval=1.0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    episodes = updates = 0
    validation_rows: list[dict] = []
    best_state, best_ratio = None, -np.inf
    val_rng = np.random.default_rng([seed, 104729])
    try:
        with single_thread_blas():
            validate = (Validation(predictor, config, seed, scorer_config, table)
                        if config.validate_every > 0 else None)
            next_validation = 0
            while episodes < config.total_episodes and time.perf_counter() - start < config.time_limit_s:
                if validate is not None and episodes >= next_validation:
                    ratio = validate(scorer, val_rng)
                    validation_rows.append({"episodes": episodes, "seconds": round(time.perf_counter() - start, 3),
                                            "ratio_to_greedy_ls": round(ratio, 6)})
                    if ratio > best_ratio:
                        best_ratio = ratio
                        best_state = {k: v.detach().clone() for k, v in scorer.state_dict().items()}
                    next_validation += config.validate_every
                    if bar is not None:
                        bar.set_postfix(val=f"{ratio:.4f}", best=f"{best_ratio:.4f}")
                n_nodes = int(rng.choice(config.n_nodes_choices))
                cluster = Cluster(n_nodes, config.slots)
                batch = sample_training_batch(rng, n_apps, n_nodes, config)
                constrained = rng.random() < config.constraint_prob
                constraints = (random_constraints(rng, n_apps, config.slots) if constrained
                               else Constraints.none(n_apps))
                problem = PlacementProblem(cluster, batch, constraints, predictor, scorer_config, table)
                k = config.episodes_per_batch
                eps = rollout(problem, scorer.numpy_weights(), rng, k)
                episodes += k
                if bar is not None:
                    bar.update(k)
                if not eps.alive.any():
                    continue  # probably no valid plan at all: nothing to learn from
                baseline = float(eps.rewards.mean())
                scale = max(float(eps.rewards.std()), config.advantage_std_floor)
                optimiser.zero_grad(set_to_none=True)
                _, entropy = accumulate_policy_gradient(scorer, problem, eps.comp_hist, eps.actions,
                                                        (eps.rewards - baseline) / scale, config.entropy_coef,
                                                        config.max_rows_per_chunk)
                torch.nn.utils.clip_grad_norm_(scorer.parameters(), config.max_grad_norm)
                optimiser.step()
                updates += 1
                check_finite(scorer, updates)
                alive = eps.rewards[eps.alive]
                row = {"update": updates, "episodes": episodes, "seconds": round(time.perf_counter() - start, 3),
                       "n_nodes": n_nodes, "batch_size": batch.size, "constrained": int(constrained),
                       "mean_reward": round(float(alive.mean()), 6), "best_reward": round(float(alive.max()), 6),
                       "dead_ends": int((~eps.alive).sum()), "entropy": round(entropy, 4)}
                log.append(row)
                if bar is not None and updates % 20 == 0:
                    recent = log[-200:]
                    bar.set_postfix(mean=f"{np.mean([r['mean_reward'] for r in recent]):.4f}",
                                    ent=f"{entropy:.2f}")
            if validate is not None:
                ratio = validate(scorer, val_rng)
                validation_rows.append({"episodes": episodes, "seconds": round(time.perf_counter() - start, 3),
                                        "ratio_to_greedy_ls": round(ratio, 6)})
                if ratio > best_ratio:
                    best_ratio, best_state = ratio, None  # the final network is the best: keep it
                if best_state is not None:
                    scorer.load_state_dict(best_state)
    except KeyboardInterrupt:
        # an interrupted run saves no policy, but keeps the log of the updates it made
        if out is not None:
            Path(out).mkdir(parents=True, exist_ok=True)
            write_log(log, Path(log_path) if log_path is not None else Path(out) / "train-log.csv")
        raise
    finally:
        torch.set_num_threads(threads)
        if bar is not None:
            bar.close()
    seconds = time.perf_counter() - start
    training = {"command": command, "seed": seed, "episodes": episodes, "updates": updates,
                "seconds": round(seconds, 1), "predictor": predictor_name, "config": config.to_json()}
    if validation_rows:
        kept = max(validation_rows, key=lambda r: r["ratio_to_greedy_ls"])
        training["validation"] = {"batches": len(validate.problems), "kept_at_episodes": kept["episodes"],
                                  "ratio_to_greedy_ls": kept["ratio_to_greedy_ls"],
                                  "final_ratio": validation_rows[-1]["ratio_to_greedy_ls"]}
    policy = PlacementPolicy(scorer, tuple(predictor.app_names), min(config.n_nodes_choices), config.slots,
                             predictor, training)
    if out is not None:
        out = Path(out)
        policy.save(out)
        write_log(log, Path(log_path) if log_path is not None else out / "train-log.csv")
        write_log(validation_rows, out / "validation.csv")
    return TrainResult(policy, log, seconds, episodes, validation_rows)


def check_finite(scorer: torch.nn.Module, update: int) -> None:
    """Stop before a NaN or inf network reaches the saved policy (it would place containers by
    garbage scores): a learning rate far too large diverges this way."""
    bad = first_non_finite(scorer)
    if bad:
        raise TrainingDiverged(f"update {update}: the network's {bad} is not finite (NaN or inf); training "
                               "stopped without saving it (lower --lr)")


#: what a run writes into its --out: one there means an earlier run, which a new one would replace
RUN_FILES = ("metadata.json", "policy.pt", "train-log.csv", "validation.csv")


def _int_list(text: str, flag: str) -> tuple[int, ...]:
    """A comma-separated list of positive integers (--nodes, --hidden), or a ValueError naming the flag."""
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise ValueError(f"{flag} must be positive integers separated by commas, not {text!r}")
    return values


def check_options(args) -> None:
    """The numbers a run needs to mean anything, each refused with its flag (a zero --episodes-per-batch
    would spin until --time-limit, a zero or negative --episodes save an untrained policy)."""
    for flag, value, ok, want in (("--episodes", args.episodes, args.episodes >= 1, ">= 1"),
                                  ("--episodes-per-batch", args.episodes_per_batch, args.episodes_per_batch >= 1, ">= 1"),
                                  ("--seed", args.seed, args.seed >= 0, ">= 0"),
                                  ("--validate-every", args.validate_every, args.validate_every >= 0, ">= 0"),
                                  ("--time-limit", args.time_limit, 0 < args.time_limit < float("inf"),
                                   "a positive number of seconds"),
                                  ("--lr", args.lr, 0 < args.lr < float("inf"), "a positive number")):
        if not ok:
            raise ValueError(f"{flag} must be {want}, not {value}")


def check_outputs(out: Path, log: Path | None) -> None:
    """--out made and proved writable, and --log's folder present, before training: an --out that is
    a file (or under one) and a --log in a missing folder failed with a traceback only after the
    whole run (minutes), the trained policy or its log lost."""
    from agents.report import writable_folder  # not prepare_out: it renames an experiment's files aside

    if log is not None and not log.parent.is_dir():
        raise ValueError(f"--log {log}: folder {log.parent} does not exist")
    try:
        writable_folder(out)
    except OSError as exc:
        raise ValueError(f"--out: {exc}") from None


def write_log(rows: list[dict], path: Path) -> None:
    if not rows:
        return
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _replace(config: TrainConfig, **changes) -> TrainConfig:
    from dataclasses import replace
    return replace(config, **changes)


def make_predictor(name: str, n_apps: int = 7, slots: int = 8):
    """'metis': the paper's forest on the Metis data (helper's `default_predictor`);
    'synthetic[:SEED]': the data-free `SyntheticInterference`."""
    from agents.lra_placement.predictor import predictor_by_name

    predictor = predictor_by_name(name, n_apps=n_apps, slots=slots)
    if name in ("metis", "forest"):
        return predictor, "metis-forest (default_predictor, 0905-6435, seed 0)"
    seed = int(name.split(":", 1)[1]) if ":" in name else 0
    return predictor, f"SyntheticInterference(n_apps={n_apps}, seed={seed}, slots={slots})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agents.lra_placement.train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--predictor", default="metis", help="metis | synthetic[:SEED] (default metis)")
    parser.add_argument("--episodes", type=int, default=TrainConfig.total_episodes)
    parser.add_argument("--nodes", default="9,27", help="cluster sizes to train on, comma-separated")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-limit", type=float, default=TrainConfig.time_limit_s, help="seconds")
    parser.add_argument("--paper-features", action="store_true",
                        help="the paper's state only (no predictor features in the network)")
    parser.add_argument("--hidden", default="64,64", help="hidden layer widths, comma-separated")
    parser.add_argument("--lr", type=float, default=TrainConfig.lr)
    parser.add_argument("--lookahead", action="store_true", help="node features for every app's next container")
    parser.add_argument("--episodes-per-batch", type=int, default=TrainConfig.episodes_per_batch)
    parser.add_argument("--validate-every", type=int, default=TrainConfig.validate_every,
                        help="episodes between validations (0: never)")
    parser.add_argument("--out", required=True, help="policy directory to write")
    parser.add_argument("--log", default=None, help="per-update CSV log (default OUT/train-log.csv)")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    try:
        check_options(args)
        hidden, nodes = _int_list(args.hidden, "--hidden"), _int_list(args.nodes, "--nodes")
        refuse_existing_run(Path(args.out), RUN_FILES, also=[Path(args.log)] if args.log else [])
        try:
            predictor, name = make_predictor(args.predictor)
        except ValueError as exc:
            raise ValueError(f"--predictor {args.predictor!r}: {exc}") from None
        check_outputs(Path(args.out), Path(args.log) if args.log else None)   # last: it makes --out
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    config = TrainConfig(time_limit_s=args.time_limit, predictor_features=not args.paper_features,
                         hidden=hidden, lr=args.lr,
                         episodes_per_batch=args.episodes_per_batch, validate_every=args.validate_every,
                         lookahead=args.lookahead)
    command = "python -m agents.lra_placement.train " + " ".join(argv if argv is not None else sys.argv[1:])
    try:
        result = train_generalist(config, predictor, nodes, args.seed, args.episodes, args.out,
                                  progress=not args.quiet, command=command, predictor_name=name, log_path=args.log)
    except ValueError as exc:   # the network diverged: nothing was saved
        print(f"error: {exc}", file=sys.stderr)
        return 1 if isinstance(exc, TrainingDiverged) else 2
    tail = result.log[-200:]
    print(f"trained {result.episodes} episodes in {result.seconds:.0f} s; mean reward of the last "
          f"{len(tail)} updates {np.mean([r['mean_reward'] for r in tail]):.4f}; saved to {args.out}")
    if "validation" in result.policy.training:
        v = result.policy.training["validation"]
        print(f"validation ({v['batches']} batches): kept the network of episode {v['kept_at_episodes']}, "
              f"best-of-roll-outs / greedy-ls = {v['ratio_to_greedy_ls']:.4f} (final {v['final_ratio']:.4f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
