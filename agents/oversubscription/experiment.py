"""`samm experiment c2marl --out DIR`: the paper's Tables 1, 2, 3 and 5 with ours beside them.

Per case (the Azure-like setting as Table 3; the internal-like setting in cold start as Tables 1 and
5 and in warm start as Table 2):
  1. one calibrated trace (data.py): training weekdays and held-apart test blocks;
  2. every baseline tuned on training days only (tuning.py) at alpha = 0.95, the fixed grid rates
     as printed (Grid-0.2/0.4/0.6, Grid-1.0 = none);
  3. C2MARL trained per alpha in {0.75, 0.85, 0.95} and per seed (train.py);
  4. everything evaluated on the same test episodes (held-apart days, usage redrawn from Gaussians):
     PM-Hot-R, C-Hot-R, S-Cores, satisfaction per alpha; the issue's targets are judged here;
  5. and again under the paper's own protocol (L369): the training weekdays' requests, each
     subscriber's hourly usage redrawn from Gaussians, fresh seeds apart from the tuning episodes'.
     The paper does not say its test requests differ from its training requests; this table shows
     how much of its result that reading explains.
Writes report.md, summary.json (agents/report.py schema), training-curve PNGs and per-case CSVs.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from agents.parallel import map_runs
from agents.report import Target, experiment_summary, markdown_table, prepare_out, refuse_repeats, write_summary

from .c2marl import DUAL_ESTIMATES, C2MarlConfig, anchor_level, check_budget_margin
from .settings import ALPHAS, RATES, get_setting, rate_grid

PAPER = {"title": "Learning Cooperative Oversubscription for Cloud by Chance-Constrained Multi-Agent RL (C2MARL)",
         "file": "c2marl-oversubscription.txt"}

# The paper's tables (PM-Hot-R %, S-Cores %; C-Hot-R % for Table 5), as printed.
PAPER_TABLES = {
    "internal-cold": {"Grid-0.2": (30.9, 80.0, 97.2), "Grid-0.4": (22.7, 60.0, 72.7), "Grid-0.6": (0.0, 40.0, 0.0),
                      "MA": (0.0, 49.2, 0.0), "SL": ("0.2±0.3", "49.9±3.3", "0.6±0.8"),
                      "C2MARL-0.75": ("9.8±0.6", "66.1±6.7", "21.9±0.3"),
                      "C2MARL-0.85": ("6.6±0.6", "61.7±9.2", "13.9±1.2"),
                      "C2MARL-0.95": ("3.5±0.5", "59.9±1.9", "4.7±0.1")},
    "internal-warm": {"Grid-0.2": (95.4, 80.0, None), "Grid-0.4": (100.0, 60.0, None), "Grid-0.6": (0.0, 40.0, None),
                      "MA": (0.0, 49.2, None), "SL": ("0.8±1.1", "49.9±3.3", None),
                      "C2MARL-0.75": ("11.6±10.6", "69.2±1.5", None), "C2MARL-0.85": ("6.8±6.8", "65.1±4.8", None),
                      "C2MARL-0.95": ("3.5±1.5", "69.0±1.4", None)},
    "azure-cold": {"Grid-0.2": (100.0, 80.0, None), "Grid-0.4": (100.0, 60.0, None), "Grid-0.6": (100.0, 40.0, None),
                   "MA": (0.0, 8.2, None), "SL": ("0.0±0.0", "7.6±2.2", None),
                   "C2MARL-0.75": ("19.0±3.8", "15.3±0.13", None), "C2MARL-0.85": ("8.3±3.1", "14.6±0.1", None),
                   "C2MARL-0.95": ("0.0±0.0", "10.4±0.2", None)},
}
PAPER_TABLE_OF = {"internal-cold": "Tables 1 and 5", "internal-warm": "Table 2", "azure-cold": "Table 3"}

# Evaluation protocols: the held-apart days, and the paper's literal one (L369).
HELD_APART, PAPER_PROTOCOL = "held-apart", "paper-protocol"
PROTOCOLS = (HELD_APART, PAPER_PROTOCOL)
PROTOCOL_TITLES = {
    HELD_APART: "held-apart days (the issue's test): weekday blocks of later weeks, usage redrawn from Gaussians",
    PAPER_PROTOCOL: "the paper's protocol (L369): the training weekdays' requests, usage redrawn from Gaussians",
}
PAPER_PROTOCOL_SEED = 60_000   # apart from the tuning episodes (seeds 0..) and the held-apart tests (50,000..)


@dataclass(frozen=True)
class Case:
    setting: str
    warm: bool

    @property
    def key(self) -> str:
        return f"{self.setting}-{'warm' if self.warm else 'cold'}"


FULL_CASES = (Case("azure", False), Case("internal", False), Case("internal", True))
QUICK_CASES = (Case("tiny", False),)


@dataclass(frozen=True)
class Budget:
    episodes_cold: int = 1800     # §6.5
    episodes_warm: int = 1200     # §6.6
    test_episodes: int = 300      # §6.5 "test ... with 300 episodes"
    tune_episodes: int = 20
    seeds: tuple = (1, 2, 3)      # §6.5 "3 different seeds"
    alphas: tuple = ALPHAS
    paper_protocol: bool = True   # also test under the paper's protocol (L369), beside the held-apart days

    @property
    def protocols(self) -> tuple[str, ...]:
        return PROTOCOLS if self.paper_protocol else (HELD_APART,)


FULL = Budget()
QUICK = Budget(episodes_cold=60, episodes_warm=60, test_episodes=6, tune_episodes=3, seeds=(1, 2))


def _train_one(args) -> dict:
    """One C2MARL training run + its evaluation under both protocols (a worker process)."""
    (case, alpha, seed, episodes, trace_seed, test_specs, n_paper, cfg_overrides, saved, validate_every,
     ensemble, tuned_anchor) = args
    import torch

    torch.set_num_threads(1)
    from .data import generate_trace
    from .train import ENSEMBLE_EVERY, evaluate_policy, train

    setting = get_setting(case.setting)
    trace = generate_trace(setting, trace_seed)
    if saved is not None:       # (policy, training seconds) of an earlier run, checked by load_saved_policies
        (policy, seconds), logs = saved, None
    else:
        cfg = replace(C2MarlConfig(alpha=alpha, seed=seed, episodes=episodes), **cfg_overrides)
        t0 = time.perf_counter()
        policy, logs = train(setting, cfg, trace=trace, warm=case.warm, progress=False, validate_every=validate_every,
                             ensemble=ensemble[0], ensemble_every=ensemble[1] or ENSEMBLE_EVERY,
                             ensemble_vote=ensemble[2] or "median", tuned_anchor=tuned_anchor)
        seconds = time.perf_counter() - t0
    metrics = {HELD_APART: evaluate_policy(policy.rates, setting, held_apart_episodes(trace, test_specs, case.warm),
                                           warm=case.warm)}
    if n_paper:     # 0: the held-apart days only (--held-apart-only)
        metrics[PAPER_PROTOCOL] = evaluate_policy(policy.rates, setting, paper_protocol_episodes(trace, n_paper, case.warm),
                                                  warm=case.warm)
    curve = None if logs is None else {
        "hot_cluster_steps": [l.hot_cluster_steps for l in logs], "s_cores": [l.s_cores for l in logs],
        "lam": [l.lam for l in logs], "reward": [l.reward for l in logs]}
    return {"case": case.key, "alpha": alpha, "seed": seed, "metrics": metrics, "train_seconds": seconds,
            "curve": curve, "policy": policy, "checkpoint_episode": kept_episode(policy),
            "ensemble": (policy.training or {}).get("ensemble"), "anchor": (policy.training or {}).get("anchor")}


def kept_episode(policy) -> int | None:
    """The training episode whose weights a saved policy holds (policies saved before checkpoints were
    chosen on the validation week kept their last weights)."""
    t = policy.training or {}
    return t.get("checkpoint_episode", t.get("episodes"))


def policy_name(case: Case, alpha: float, seed: int) -> str:
    """A run's policy folder under OUT/policies."""
    return f"{case.key}-a{alpha:.2f}-s{seed}"


def load_run_policy(saved: Path, case: Case, alpha: float, seed: int, trace_seed: int):
    """(policy, its training seconds) saved by an earlier run for this case, α and seed; a policy
    trained for another case, α, seed or trace is refused, so a table never mixes runs."""
    from .policy import OversubPolicy

    policy = OversubPolicy.load(saved)
    t = policy.training or {}
    cfg = t.get("config", {})
    want = {"alpha": alpha, "seed": seed, "warm": case.warm, "trace_seed": trace_seed, "setting": case.setting}
    have = {"alpha": cfg.get("alpha"), "seed": cfg.get("seed"), "warm": t.get("warm"),
            "trace_seed": t.get("trace_seed"), "setting": policy.setting.name}
    differ = {k: have[k] for k in want if have[k] != want[k]}
    if differ:
        raise ValueError(f"{saved}: trained with {differ}, not {({k: want[k] for k in differ})}")
    return policy, float(t.get("seconds", float("nan")))


def load_saved_policies(saved_policies: Path | None, case: Case, budget: Budget, trace_seed: int,
                        vote: str | None = None) -> dict:
    """(alpha, seed) -> (policy, training seconds) of every run `budget` asks for, from an earlier run's
    OUT/policies ({} without one); a missing or mismatched policy is refused, naming it. `vote`: the
    saved ensembles re-voted (None: as saved)."""
    saved = {}
    if saved_policies is None:
        return saved
    for a in budget.alphas:
        for s in budget.seeds:
            path = Path(saved_policies) / policy_name(case, a, s)
            if not path.is_dir():
                raise FileNotFoundError(f"no saved policy {path} (C2MARL-{a:.2f}, seed {s})")
            policy, seconds = load_run_policy(path, case, a, s, trace_seed)
            if vote is not None:
                try:
                    policy = policy.with_vote(vote)
                except ValueError as e:
                    raise ValueError(f"{path}: {e}") from None
            saved[a, s] = policy, seconds
    return saved


def _evaluate_baseline(args) -> dict:
    """One tuned baseline on one protocol's episodes (a worker process: the trace is rebuilt from
    its seed, the fitted context arrives pickled)."""
    case, trace_seed, name, params, ctx, protocol, specs, n = args
    from .baselines import make_rule
    from .data import generate_trace
    from .tuning import evaluate_rule

    setting = get_setting(case.setting)
    trace = generate_trace(setting, trace_seed)
    workloads = (held_apart_episodes(trace, specs, case.warm) if protocol == HELD_APART
                 else paper_protocol_episodes(trace, n, case.warm))
    return evaluate_rule(make_rule(name, ctx, **params), setting, workloads, case.warm)


def test_specs(trace, n: int, warm: bool) -> list[tuple[int, int]]:
    return [(i % trace.n_test_blocks, 50_000 + i) for i in range(n)]


# The test episodes are drawn one at a time as they are run: 300 internal-like episodes held as a
# list took about 5.5 GB per worker, and two experiments side by side ran out of the 24 GB (measured).
def held_apart_episodes(trace, specs, warm: bool) -> Iterator:
    return (trace.test_workload(i, s, warm=warm) for i, s in specs)


def paper_protocol_episodes(trace, n: int, warm: bool) -> Iterator:
    return (trace.train_redrawn(PAPER_PROTOCOL_SEED + i, warm=warm) for i in range(n))


def tune_and_test_baselines(case: Case, trace, trace_seed: int, alpha: float, tune_episodes: int, specs,
                            test_episodes: int, protocols=(HELD_APART,), workers: int = 2,
                            progress: bool = True) -> tuple[dict, dict[str, dict[str, dict]]]:
    """Every baseline tuned at level `alpha` on the training days only (the fixed Grid-rho rows have one
    "combination"), then tested on `specs` under each protocol: (tune_all's results, protocol -> method
    -> metrics). The experiment tunes at 0.95; benchmarks/oversub_baselines_at.py at other levels."""
    from .tuning import tune_all

    setting = get_setting(case.setting)
    results, ctx = tune_all(setting, trace, alpha, episodes=tune_episodes, warm=case.warm)
    evals = [(case, trace_seed, name, res.params, ctx, protocol, specs, test_episodes)
             for protocol in protocols for name, res in results.items()]
    tested: dict[str, dict[str, dict]] = {p: {} for p in protocols}
    for (_, _, name, _, _, protocol, _, _), metrics in zip(
            evals, map_runs(_evaluate_baseline, evals, workers, progress, desc=f"baselines {case.key}")):
        tested[protocol][name] = metrics
    return results, tested


def run_case(case: Case, budget: Budget, trace_seed: int = 0, workers: int = 2, progress: bool = True,
             cfg_overrides: dict | None = None, keep_policies: Path | None = None,
             saved_policies: Path | None = None, validate_every: int = 0,
             ensemble: tuple[int, int | None, str | None] = (0, None, None), loaded: dict | None = None) -> dict:
    """One case's table. With `saved_policies` (an earlier run's OUT/policies) its C2MARL policies are
    evaluated instead of trained: the test episodes can grow without training again. `validate_every`:
    train.py's checkpoint selection on the validation week (0: the last weights, the paper).
    `ensemble`: (K, N, vote) of train.py's `--ensemble K --ensemble-every N --ensemble-vote vote` (None:
    its default; K = 0: none). With `saved_policies` a vote other than None re-votes the saved
    ensembles (`OversubPolicy.with_vote`), their weights unchanged. `loaded`: `load_saved_policies`'s
    result for this case, when the caller has already checked them."""
    from .data import generate_trace

    # the saved policies are found and checked before the baselines' half hour, not after it
    saved = loaded if loaded is not None else load_saved_policies(saved_policies, case, budget, trace_seed,
                                                                  ensemble[2])
    setting = get_setting(case.setting)
    trace = generate_trace(setting, trace_seed)
    specs = test_specs(trace, budget.test_episodes, case.warm)
    t0 = time.perf_counter()
    results, tested = tune_and_test_baselines(case, trace, trace_seed, 0.95, budget.tune_episodes, specs,
                                              budget.test_episodes, budget.protocols, workers, progress)
    tuned = {name: {"params": res.params, "safe_on_training_days": res.safe, "training_days": res.metrics}
             for name, res in results.items()}
    rows: dict[str, dict[str, list[dict]]] = {p: {name: [m] for name, m in tested[p].items()}
                                              for p in budget.protocols}   # protocol -> method -> runs
    baseline_seconds = time.perf_counter() - t0
    episodes = budget.episodes_warm if case.warm else budget.episodes_cold
    n_paper = budget.test_episodes if budget.paper_protocol else 0
    from .train import ANCHOR_TUNE_EPISODES

    # the baselines were just tuned at 0.95 as an anchor is: a 0.95 anchor reuses them, not tunes them again
    same = {0.95: results} if budget.tune_episodes == ANCHOR_TUNE_EPISODES else {}
    anchors = tuned_anchors(case, setting, trace, budget.alphas, cfg_overrides or {}, same) if not saved else {}
    jobs = [(case, a, s, episodes, trace_seed, specs, n_paper, cfg_overrides or {}, saved.get((a, s)), validate_every,
             ensemble, anchors.get(a)) for a in budget.alphas for s in budget.seeds]
    results = map_runs(_train_one, jobs, workers, progress, desc=f"c2marl {case.key}")
    curves = {}
    for r in results:
        for protocol, metrics in r["metrics"].items():
            rows[protocol].setdefault(f"C2MARL-{r['alpha']:.2f}", []).append(
                metrics | {"train_seconds": r["train_seconds"], "seed": r["seed"],
                           "checkpoint_episode": r["checkpoint_episode"], "ensemble": r.get("ensemble"),
                           "anchor": r.get("anchor")})
        if r["curve"] is not None:
            curves.setdefault(r["alpha"], []).append(r["curve"])
        if keep_policies is not None:
            r["policy"].save(Path(keep_policies) / policy_name(case, r["alpha"], r["seed"]))
    return {"case": case.key, "setting": case.setting, "warm": case.warm, "rows": rows, "tuned": tuned,
            "curves": curves, "baseline_seconds": baseline_seconds,
            "trace": trace.describe() if hasattr(trace, "describe") else {}}


def tuned_anchors(case: Case, setting, trace, alphas, cfg_overrides: dict,
                  tuned: dict[float, dict] | None = None) -> dict[float, dict]:
    """alpha -> the headroom action's anchor tuned once for every seed of that level (train.anchor_spec,
    the same tuning each run would repeat); {} unless the runs act with headrooms over a tuned anchor.
    `tuned`: level -> {rule name: TuneResult} already tuned at that level on the anchor's episodes (the
    level an anchor is tuned at is alpha's, or stricter with an anchor margin: c2marl.anchor_level)."""
    from .train import anchor_spec, parse_anchor

    base = replace(C2MarlConfig(), **cfg_overrides)
    if base.action != "headroom" or parse_anchor(base.anchor) is not None:
        return {}
    cfgs = {a: replace(base, alpha=a) for a in alphas}
    return {a: anchor_spec(setting, c, trace, case.warm, (tuned or {}).get(anchor_level(c))) for a, c in cfgs.items()}


def _cell(values: list[float], scale: float = 100.0, digits: int = 1) -> str:
    v = np.asarray(values, dtype=float) * scale
    if len(v) == 1:
        return f"{v[0]:.{digits}f}"
    return f"{v.mean():.{digits}f} ± {v.std():.{digits}f}"


def _sat(rows: list[dict], alpha: float) -> str:
    ok = [r["satisfied"][f"{alpha:.2f}"] for r in rows]
    return "✓" if all(ok) else ("✗" if not any(ok) else f"{sum(ok)}/{len(ok)}")


def case_table(res: dict, protocol: str = HELD_APART) -> str:
    paper = PAPER_TABLES.get(res["case"], {})
    header = ["method", "PM-Hot-R %", "C-Hot-R %", "S-Cores %", "0.75", "0.85", "0.95", "paper PM-Hot-R / S-Cores"]
    out = []
    for name, rows in res["rows"][protocol].items():
        p = paper.get(name)
        out.append([name, _cell([r["pm_hot_r"] for r in rows]), _cell([r["c_hot_r"] for r in rows]),
                    _cell([r["s_cores"] for r in rows]), _sat(rows, 0.75), _sat(rows, 0.85), _sat(rows, 0.95),
                    f"{p[0]} / {p[1]}" if p else "–"])
    return markdown_table(header, out)


def per_seed(res: dict, protocol: str = HELD_APART) -> dict[str, list[dict]]:
    """Each C2MARL row's seeds one by one: whether every seed meets its level is what the mean hides."""
    return {name: [{"seed": r["seed"], "pm_hot_r": r["pm_hot_r"], "s_cores": r["s_cores"],
                    "satisfied": r["satisfied"][name.split("-")[1]],
                    "checkpoint_episode": r.get("checkpoint_episode"), "ensemble": r.get("ensemble"),
                    "anchor": r.get("anchor")} for r in rows]
            for name, rows in res["rows"][protocol].items() if name.startswith("C2MARL")}


def per_seed_table(res: dict, protocol: str = HELD_APART) -> str:
    runs = [(name, r) for name, rs in per_seed(res, protocol).items() for r in sorted(rs, key=lambda r: r["seed"])]
    anchors = any(r.get("anchor") for _, r in runs)
    out = [[name, r["seed"], f"{100 * r['pm_hot_r']:.1f}", f"{100 * r['s_cores']:.1f}",
            "✓" if r["satisfied"] else "✗", _weights(r)] + ([_anchor(r)] if anchors else []) for name, r in runs]
    return markdown_table(["method", "seed", "PM-Hot-R %", "S-Cores %", "own level met", "weights of episode"]
                          + (["anchor (rule: parameters, headroom)"] if anchors else []), out)


def _anchor(r: dict) -> str:
    from .shield import anchor_words

    return anchor_words(r["anchor"]) if r.get("anchor") else "–"


def _weights(r: dict) -> str:
    """The per-seed table's "weights of episode": one checkpoint's episode, or an ensemble's."""
    e = r.get("ensemble")
    if e:
        return f"{', '.join(map(str, e['episodes']))} ({e['vote']} vote)"
    return "–" if r["checkpoint_episode"] is None else str(r["checkpoint_episode"])


def best_safe_baseline(res: dict, alpha: float = 0.95, protocol: str = HELD_APART) -> tuple[str | None, float]:
    best, value = None, 0.0
    for name, rows in res["rows"][protocol].items():
        if name.startswith("C2MARL"):
            continue
        if all(r["satisfied"][f"{alpha:.2f}"] for r in rows):
            s = float(np.mean([r["s_cores"] for r in rows]))
            if s > value:
                best, value = name, s
    return best, value


def _figures(results: list[dict], out: Path) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    for res in results:
        if not res["curves"]:       # evaluated from saved policies: no training to draw
            continue
        fig, axes = plt.subplots(1, 3, figsize=(14, 3.6))
        for alpha, curves in sorted(res["curves"].items()):
            for ax, key, label in zip(axes, ("hot_cluster_steps", "s_cores", "lam"),
                                      ("hot-cluster steps per episode", "S-Cores (training)", "lambda")):
                arr = np.asarray([c[key] for c in curves], dtype=float)
                k = max(1, arr.shape[1] // 60)
                smooth = np.stack([np.convolve(a, np.ones(k) / k, mode="valid") for a in arr])
                x = np.arange(smooth.shape[1]) + k - 1
                m, s = smooth.mean(0), smooth.std(0)
                ax.plot(x, m, label=f"alpha={alpha:.2f}")
                ax.fill_between(x, m - s, m + s, alpha=0.2)
                ax.set_title(label)
                ax.set_xlabel("episode")
        axes[0].legend()
        fig.suptitle(f"C2MARL training, {res['case']} (mean ± std over seeds)")
        fig.tight_layout()
        name = f"training-{res['case']}.png"
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        names.append(name)
    return names


def run(out, quick: bool = False, seeds: Sequence[int] | None = None, cases: Sequence[str] | None = None,
        episodes: int | None = None, test_episodes: int | None = None, workers: int = 2, progress: bool = True,
        trace_seed: int = 0, policies: str | Path | None = None, alphas: Sequence[float] | None = None,
        threads: int = 1, held_apart_only: bool = False, validate_every: int = 0, ensemble: int = 0,
        ensemble_every: int | None = None, dual_estimate: str | None = None,
        budget_margin: float | None = None, ensemble_vote: str | None = None, rates: str | None = None,
        action: str | None = None, anchor: str | None = None, anchor_margin: float | None = None,
        anchor_tuned_at: float | None = None) -> dict:
    """`alphas`: a subset of the paper's safety levels (default all three). `threads`: torch threads
    per training run; 1 and 2 gave the same weights on our machine, only the time changed (e.g.
    `--workers 1 --threads 2` gives one run the two cores). `held_apart_only`: test on the held-apart
    days (the issue's test) only, not also under the paper's protocol: half the testing time.
    `dual_estimate`: U of the dual update (C2MarlConfig.dual_estimate; None: its default, "broken").
    `budget_margin`: train each level's agent to (1 - alpha) / F of its budget, every verdict still on
    alpha (C2MarlConfig.budget_margin; None: 1, the paper's). `ensemble_vote`: how an ensemble's
    members vote (network.VOTES; None: the median); with `policies`, the saved ensembles re-voted.
    `rates`: the agents' action set by name (settings.RATE_GRIDS; None: the paper's). `action`: what an
    action index means (settings.ACTIONS; None: "rate", the paper's); "headroom" (ours) scales a production
    predictor's forecast, its `anchor` "tuned" (N-sigma, the default), "tuned:Percentile", "tuned:Max",
    "tuned:best" or a given N-sigma "N,WINDOW,HEADROOM" (train.anchor_spec); `anchor_margin` F tunes
    a tuned anchor to (1 - alpha) / F of the budget (C2MarlConfig.anchor_margin; None: 1, at alpha);
    `anchor_tuned_at` tunes it at that level for every alpha instead (C2MarlConfig.anchor_tuned_at)."""
    started = time.perf_counter()
    budget = QUICK if quick else FULL
    if seeds:
        budget = replace(budget, seeds=tuple(int(s) for s in seeds))
        refuse_repeats(budget.seeds, "seeds")
    # NumPy refuses a negative seed: in the training workers, after the baselines' tuning
    for name, values in (("seeds", budget.seeds), ("trace_seed", (int(trace_seed),))):
        if any(v < 0 for v in values):
            raise ValueError(f"{name} must be >= 0, not {min(values)}")
    if alphas:
        wanted = {float(a) for a in alphas}
        if wanted - set(ALPHAS):
            raise ValueError(f"alpha {sorted(wanted - set(ALPHAS))} is not one of the paper's safety levels {list(ALPHAS)}")
        budget = replace(budget, alphas=tuple(a for a in ALPHAS if a in wanted))
    if held_apart_only:
        budget = replace(budget, paper_protocol=False)
    if int(threads) < 1:
        raise ValueError(f"threads must be at least 1, not {threads}")
    if int(validate_every) < 0:
        raise ValueError(f"validate_every must be >= 0, not {validate_every}")
    if int(validate_every) and policies is not None:   # else the saved weights were tabled as if chosen
        raise ValueError("validate_every is how runs are trained; --policies evaluates saved policies as they are")
    if int(ensemble) < 0 or (ensemble_every is not None and int(ensemble_every) < 1) or (
            int(ensemble) and int(validate_every)):
        raise ValueError(f"ensemble must be >= 0 and ensemble_every >= 1, and ensemble excludes validate_every "
                         f"(ensemble {ensemble}, ensemble_every {ensemble_every}, validate_every {validate_every})")
    if ensemble_vote is not None:
        from .network import VOTES

        if ensemble_vote not in VOTES:
            raise ValueError(f"ensemble_vote must be one of {list(VOTES)}, not {ensemble_vote!r}")
        if not int(ensemble) and policies is None:
            raise ValueError("ensemble_vote needs ensemble (runs trained as ensembles) or policies (saved ensembles)")
    if dual_estimate is not None and dual_estimate not in DUAL_ESTIMATES:
        raise ValueError(f"dual_estimate must be one of {list(DUAL_ESTIMATES)}, not {dual_estimate!r}")
    if dual_estimate is not None and policies is not None:
        raise ValueError("dual_estimate is how runs are trained; --policies evaluates saved policies as they are")
    if budget_margin is not None:
        budget_margin = check_budget_margin(budget_margin)
    if budget_margin is not None and policies is not None:
        raise ValueError("budget_margin is how runs are trained; --policies evaluates saved policies as they are")
    if rates is not None:
        rate_grid(rates)
        if policies is not None:
            raise ValueError("rates is how runs are trained; --policies evaluates saved policies as they are")
    if action is not None or anchor is not None:
        from .settings import check_action
        from .train import parse_anchor

        check_action(action or C2MarlConfig.action)
        parse_anchor(anchor or C2MarlConfig.anchor)
        if policies is not None:
            raise ValueError("action and anchor are how runs are trained; "
                             "--policies evaluates saved policies as they are")
        if anchor is not None and (action or C2MarlConfig.action) != "headroom":
            raise ValueError("anchor is the headroom action's; pass action='headroom'")
    if anchor_margin is not None or anchor_tuned_at is not None:
        from .train import parse_anchor

        anchor_level(C2MarlConfig(anchor_margin=1.0 if anchor_margin is None else anchor_margin,
                                  anchor_tuned_at=anchor_tuned_at))   # refuses a bad value or both given
        if policies is not None or (action or C2MarlConfig.action) != "headroom" or parse_anchor(
                anchor or C2MarlConfig.anchor) is not None:
            raise ValueError("anchor_margin and anchor_tuned_at tune the headroom action's anchor: they need "
                             "action='headroom', a tuned anchor, and runs to train (not --policies)")
    for name, value in (("episodes", episodes), ("test_episodes", test_episodes)):
        if value is not None and int(value) < 1:     # 0 would silently mean the default, < 0 fail in a worker
            raise ValueError(f"{name} must be at least 1, not {value}")
    known_cases = [c.key for c in FULL_CASES + QUICK_CASES]
    unknown_cases = sorted(set(cases or ()) - set(known_cases))
    if unknown_cases:       # not dropped: a table would silently miss the case asked for
        raise ValueError(f"unknown case {unknown_cases}; choose from {known_cases}")
    out = Path(out)
    if episodes:
        budget = replace(budget, episodes_cold=int(episodes), episodes_warm=int(episodes))
    if test_episodes:
        budget = replace(budget, test_episodes=int(test_episodes))
    chosen = QUICK_CASES if quick else FULL_CASES
    if cases:
        wanted = set(cases)
        chosen = tuple(c for c in FULL_CASES + QUICK_CASES if c.key in wanted)
        if not chosen:
            raise ValueError(f"no case among {sorted(wanted)}; choose from "
                             f"{[c.key for c in FULL_CASES + QUICK_CASES]}")
    if int(ensemble):        # refused now, not in the training workers after the baselines' tuning
        from .train import ENSEMBLE_EVERY, ensemble_episodes

        if policies is not None:
            raise ValueError("ensemble is how runs are trained; --policies evaluates saved policies as they are")
        for c in chosen:
            ensemble_episodes(budget.episodes_warm if c.warm else budget.episodes_cold, int(ensemble),
                              int(ensemble_every or ENSEMBLE_EVERY))
    saved = None
    if policies is not None:
        saved = Path(policies)
        saved = saved / "policies" if (saved / "policies").is_dir() else saved
        if saved.resolve() == (out / "policies").resolve():
            raise ValueError("--policies must name another run's directory than --out")
    # every case's saved policies found and checked now: a missing one of the last case used to
    # surface only after the earlier cases' baselines were tuned and tested (hours on the full cases)
    loaded = {c.key: load_saved_policies(saved, c, budget, trace_seed, ensemble_vote) for c in chosen}
    out = prepare_out(out)     # after every check: made and proved writable before the work
    overrides = {k: v for k, v in (("torch_threads", int(threads)), ("dual_estimate", dual_estimate),
                                   ("budget_margin", budget_margin), ("rates", rates), ("action", action),
                                   ("anchor", anchor), ("anchor_margin", anchor_margin),
                                   ("anchor_tuned_at", anchor_tuned_at))
                 if v is not None and v != getattr(C2MarlConfig, k)} or None
    results = [run_case(c, budget, trace_seed, workers, progress, cfg_overrides=overrides,
                        keep_policies=out / "policies", saved_policies=saved, validate_every=int(validate_every),
                        ensemble=(int(ensemble), ensemble_every, ensemble_vote), loaded=loaded[c.key])
               for c in chosen]
    figures = _figures(results, out)
    targets, methods = [], {}
    for res in results:
        for protocol in res["rows"]:
            # held-apart keys stay "case/method" (the test); the paper's protocol is named
            prefix = res["case"] if protocol == HELD_APART else f"{res['case']}/{protocol}"
            for name, rows in res["rows"][protocol].items():
                methods[f"{prefix}/{name}"] = {k: [r[k] for r in rows] for k in ("pm_hot_r", "c_hot_r", "s_cores")}
            # the targets are judged on held-apart days; the paper's protocol is reported beside them
            label = res["case"] if protocol == HELD_APART else f"{res['case']} ({protocol}, not the issue's test)"
            best, best_s = best_safe_baseline(res, 0.95, protocol)
            ours = res["rows"][protocol].get("C2MARL-0.95", [])
            ours_s = float(np.mean([r["s_cores"] for r in ours])) if ours else 0.0
            ours_ok = bool(ours) and all(r["satisfied"]["0.95"] for r in ours)
            ratio = ours_s / best_s if best_s > 0 else None
            targets.append(Target(f"{label}: C2MARL-0.95 S-Cores / best safe baseline ({best})",
                                  ratio, ">= 1.3 and constraint met",
                                  bool(ratio is not None and ratio >= 1.3 and ours_ok), digits=3))
            for a in budget.alphas:
                rows = res["rows"][protocol].get(f"C2MARL-{a:.2f}", [])
                ok = bool(rows) and all(r["satisfied"][f"{a:.2f}"] for r in rows)
                days = "on test days" if protocol == HELD_APART else "on redrawn training days"
                targets.append(Target(f"{label}: C2MARL-{a:.2f} satisfies alpha={a:.2f} {days} (all seeds)",
                                      ok, "true", ok))
        secs = [r["train_seconds"] for rows in res["rows"][HELD_APART].values() for r in rows if "train_seconds" in r]
        if secs:
            targets.append(Target(f"{res['case']}: training minutes per run (max)", max(secs) / 60,
                                  "<= 30", max(secs) <= 1800, digits=2))
    summary = experiment_summary(
        "oversubscription", PAPER,
        {"cases": [r["case"] for r in results], "budget": {k: v for k, v in budget.__dict__.items()},
         "quick": quick, "trace_seed": trace_seed,
         "rates": None if policies is not None or (action or C2MarlConfig.action) == "headroom"
         else list(rate_grid(rates or C2MarlConfig.rates)),
         "action": None if policies is not None else action or C2MarlConfig.action,
         "dual_estimate": None if policies is not None else dual_estimate or C2MarlConfig.dual_estimate,
         "budget_margin": None if policies is not None else float(budget_margin or C2MarlConfig.budget_margin),
         "differences": "synthetic traces calibrated to Azure's public distributions (the paper's internal and "
                        "subscription-level Azure data are not public); hourly steps and 120-step episodes (ours)"},
        methods, {k: {m: {"pm_hot_r": v[0], "s_cores": v[1], "c_hot_r": v[2]} for m, v in t.items()}
                  for k, t in PAPER_TABLES.items()},
        targets, figures, time.perf_counter() - started,
        tuned={r["case"]: r["tuned"] for r in results},
        per_seed={(r["case"] if p == HELD_APART else f"{r['case']}/{p}"): per_seed(r, p)
                  for r in results for p in r["rows"]})
    write_summary(out, summary)
    _report(out, results, summary)
    return summary


def _report(out: Path, results: list[dict], summary: dict) -> None:
    lines = ["# C2MARL oversubscription: ours beside the paper", "",
             "Command: `samm experiment c2marl --out DIR` (see docs/oversubscription.md for every choice).", ""]
    rates = summary["setting"].get("rates")
    if rates is not None:     # the baselines' rates are continuous; the agents choose from this set
        lines += [f"C2MARL's action set: {', '.join(f'{r:g}' for r in rates)}"
                  + (" (the paper's, §6.2)." if tuple(rates) == RATES else " (ours, not the paper's six rates)."), ""]
    if summary["setting"].get("action") == "headroom":
        lines += ["C2MARL's action (ours, not the paper's rates): each agent picks a multiple (5/6, 11/12, 1, 13/12, "
                  "7/6, 4/3) of its anchor rule's headroom over that rule's usage forecast for its subscriber "
                  "(N-sigma by default; Percentile or Max where the anchor listed under its case says so).", ""]
    for res in results:
        lines += [f"## {res['case']} ({PAPER_TABLE_OF.get(res['case'], 'ours only')})", ""]
        for protocol in PROTOCOLS:
            if res["rows"].get(protocol):
                lines += [f"### {PROTOCOL_TITLES[protocol]}", "", case_table(res, protocol), "",
                          "Each C2MARL seed on its own:", "", per_seed_table(res, protocol), ""]
        lines += ["Tuned baseline parameters (training days only, alpha = 0.95): "
                  + json.dumps({k: v["params"] for k, v in res["tuned"].items()}, default=str), ""]
    lines += ["## Targets", "", markdown_table(["target", "value", "goal", "met"],
                                               [[t["name"], "–" if t["value"] is None else t["value"], t["goal"],
                                                 "yes" if t["met"] else "NO"]
                                                for t in summary["targets"]]), ""]
    lines += [f"![{f}]({f})" for f in summary["figures"]]
    (out / "report.md").write_text("\n".join(lines) + "\n")
