"""Choose, per level and seed, between C2MARL policies trained with different anchors (or any other
recipe) by the validation week alone, then test the kept one on the held-apart weeks.

    .venv/bin/python benchmarks/oversub_choose_anchor.py --case azure-cold --alphas 0.75,0.85,0.95 --seeds 1,2,3 \\
        --candidate tuned=DIR_A --candidate margin=DIR_B [--test kept|all]

Each DIR holds the policies as `samm experiment c2marl` names them (`azure-cold-a0.85-s2`); every
candidate of one (α, seed) must exist. The rule is the one `--validate-every` applies to a run's
checkpoints (`train.choose_checkpoint`): of the candidates whose PM-Hot-R on the validation week (the
week before training, usage redrawn; 40 episodes as training validates) meets α, keep the one that
saves most; when none does, the one breaking PMs in fewest episodes. The test weeks play no part in
the choice. Prints one JSON line per (α, seed), then one summary line per α (mean ± population std of
the kept ones over the seeds, and on how many seeds the kept one meets α on the test weeks).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _candidate(text: str) -> tuple[str, Path]:
    name, sep, folder = text.partition("=")
    if not sep or not name or not folder:
        raise argparse.ArgumentTypeError(f"--candidate wants NAME=DIR, got {text!r}")
    return name, Path(folder)


def _load(p: argparse.ArgumentParser, name: str, folder: Path, case, alpha: float, seed: int, trace_seed: int):
    """(folder, policy) of candidate `name` for (alpha, seed); a usage error when it is missing or
    was trained for another case, alpha, seed or trace."""
    from agents.oversubscription.experiment import load_run_policy, policy_name

    saved = folder / policy_name(case, alpha, seed)
    if not saved.is_dir():
        p.error(f"candidate {name}: no policy {saved}")
    try:
        return saved, load_run_policy(saved, case, alpha, seed, trace_seed)[0]
    except (ValueError, OSError) as e:
        p.error(f"candidate {name}: {e}")


def main(argv=None) -> int:
    from samm.cli.seeds import parse_seeds

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", required=True, help="the experiment's case (setting-cold|warm), e.g. azure-cold")
    p.add_argument("--candidate", type=_candidate, action="append", required=True,
                   help="NAME=DIR, a folder of saved policies; give two or more")
    p.add_argument("--alphas", default="0.75,0.85,0.95")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--validation-episodes", type=int, default=None,
                   help="validation-week episodes (default: the 40 training validates with)")
    p.add_argument("--test-episodes", type=int, default=300)
    p.add_argument("--test", choices=("kept", "all", "none"), default="kept",
                   help="which candidates to test on the held-apart weeks (default: the kept one)")
    p.add_argument("--trace-seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    names = [n for n, _ in args.candidate]
    if len(set(names)) != len(names) or len(names) < 2:
        p.error(f"give two or more candidates with distinct names, got {names}")
    try:
        alphas = [float(a) for a in args.alphas.split(",")]
        seeds = parse_seeds(args.seeds)
    except ValueError as e:
        p.error(f"--alphas / --seeds: {e}")
    # torch and the simulator load here, after the arguments: --help and a usage error took 4 s
    import torch

    from agents.oversubscription.data import generate_trace
    from agents.oversubscription.experiment import FULL_CASES, QUICK_CASES, held_apart_episodes, test_specs
    from agents.oversubscription.metrics import satisfied
    from agents.oversubscription.settings import get_setting
    from agents.oversubscription.train import (VALIDATION_EPISODES, choose_checkpoint, evaluate_policy,
                                               validation_episodes)

    cases = {c.key: c for c in FULL_CASES + QUICK_CASES}
    if args.case not in cases:
        p.error(f"argument --case: invalid choice: {args.case!r} (choose from {', '.join(sorted(cases))})")
    n_validation = VALIDATION_EPISODES if args.validation_episodes is None else args.validation_episodes
    torch.set_num_threads(max(1, args.threads))
    case = cases[args.case]
    # every candidate of every (alpha, seed) is loaded and checked before the first is measured: a
    # missing or foreign one of the last seed failed only after minutes on the earlier ones
    policies = {(alpha, seed, name): _load(p, name, folder, case, alpha, seed, args.trace_seed)
                for alpha in alphas for seed in seeds for name, folder in args.candidate}
    setting = get_setting(case.setting)
    trace = generate_trace(setting, args.trace_seed)
    specs = test_specs(trace, args.test_episodes, case.warm)
    kept_rows: dict[float, list[dict]] = {a: [] for a in alphas}
    for alpha in alphas:
        for seed in seeds:
            rows = []
            for name, _ in args.candidate:
                saved, policy = policies[(alpha, seed, name)]
                m = evaluate_policy(policy.rates, setting, validation_episodes(trace, n_validation, case.warm),
                                    warm=case.warm)
                rows.append({"candidate": name, "policy": str(saved), "_policy": policy,
                             "pm_hot_r": m["pm_hot_r"], "s_cores": m["s_cores"]})
            kept = choose_checkpoint(rows, alpha)
            out = {"alpha": alpha, "seed": seed, "kept": rows[kept]["candidate"], "candidates": []}
            for i, r in enumerate(rows):
                c = {"candidate": r["candidate"], "policy": r["policy"],
                     "validation": {"pm_hot_r": round(r["pm_hot_r"], 4), "s_cores": round(r["s_cores"], 4),
                                    "met": satisfied(r["pm_hot_r"], alpha)}}
                if args.test == "all" or (args.test == "kept" and i == kept):
                    t = evaluate_policy(r["_policy"].rates, setting, held_apart_episodes(trace, specs, case.warm),
                                        warm=case.warm)
                    c["held_apart"] = {"pm_hot_r": round(t["pm_hot_r"], 4), "s_cores": round(t["s_cores"], 4),
                                       "met": satisfied(t["pm_hot_r"], alpha)}
                    if i == kept:
                        kept_rows[alpha].append(c["held_apart"])
                out["candidates"].append(c)
            print(json.dumps(out), flush=True)
    for alpha in alphas:
        got = kept_rows[alpha]
        if not got:
            continue
        hot = np.array([g["pm_hot_r"] for g in got]) * 100
        cores = np.array([g["s_cores"] for g in got]) * 100
        print(json.dumps({"alpha": alpha, "summary": "kept on the validation week, tested held apart",
                          "pm_hot_r_pct": [round(float(hot.mean()), 1), round(float(hot.std()), 1)],
                          "s_cores_pct": [round(float(cores.mean()), 1), round(float(cores.std()), 1)],
                          "met": f"{sum(bool(g['met']) for g in got)} of {len(got)}"}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
