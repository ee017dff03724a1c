"""Each saved C2MARL policy of a `samm experiment c2marl` run on its own: the per-seed figures behind
the report's mean ± std (docs/oversubscription.md, "Three seeds of C2MARL-0.95"). Since session 50
the experiment's report and summary list each seed too; this script tests a policy on its own (for
runs made before, or a seed trained later) without the baselines' half hour.

    .venv/bin/python benchmarks/oversub_per_seed.py --policies DIR --case internal-warm --alpha 0.95 --seeds 1,2,3

The policies are found and checked as `--policies` does (`load_run_policy`); each one is tested on
the experiment's held-apart episodes (the same seeds, drawn one at a time). With `--votes`, a saved
ensemble (`--ensemble K`) is tested under each vote named, its weights unchanged. With `--checkpoints`, every
checkpoint a `--validate-every` run saved (`checkpoints/episode-E`) is tested too, beside its
validation-week figures: how well the validation week predicts the test weeks.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    from samm.cli.seeds import parse_seeds

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--policies", required=True, help="an experiment's --out or its policies/ folder")
    p.add_argument("--case", required=True, help="the experiment's case (setting-cold|warm), e.g. internal-warm")
    p.add_argument("--alpha", type=float, default=0.95)
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--test-episodes", type=int, default=300)
    p.add_argument("--trace-seed", type=int, default=0)
    p.add_argument("--checkpoints", action="store_true",
                   help="also test every validated checkpoint under each policy's checkpoints/ folder")
    p.add_argument("--votes", default=None,
                   help="comma-separated votes (median, p60, upper-quartile, mean-q, max): test a saved ensemble "
                        "under each, without training again (default: the vote it was saved with)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: session 52 saw two beside trainings run about 10x slower)")
    args = p.parse_args(argv)
    try:
        seeds = parse_seeds(args.seeds)
    except ValueError as e:
        p.error(f"--seeds: {e}")
    if args.test_episodes < 1:  # a verdict over no episode
        p.error("--test-episodes must be at least 1")
    # torch and the simulator load here, after the arguments: --help and a usage error took 4 s
    import torch

    from agents.oversubscription.data import generate_trace
    from agents.oversubscription.experiment import held_apart_episodes, test_specs
    from agents.oversubscription.network import C2MarlEnsemble
    from agents.oversubscription.settings import get_setting
    from agents.oversubscription.train import evaluate_policy

    torch.set_num_threads(max(1, args.threads))
    case = _case(p, args.case)
    # every seed's policies are loaded and checked before the first is tested: a missing or foreign
    # last seed failed only after minutes of testing the earlier ones
    tested_by_seed = [(seed, *_tested(p, args, case, seed)) for seed in seeds]
    setting = get_setting(case.setting)
    trace = generate_trace(setting, args.trace_seed)
    specs = test_specs(trace, args.test_episodes, case.warm)
    for seed, tested, n_kept, validated in tested_by_seed:
        for i, (episode, pol, secs) in enumerate(tested):
            m = evaluate_policy(pol.rates, setting, held_apart_episodes(trace, specs, case.warm), warm=case.warm)
            row = {"case": case.key, "alpha": args.alpha, "seed": seed, "episode": episode, "kept": i < n_kept,
                   "pm_hot_r": round(m["pm_hot_r"], 4), "s_cores": round(m["s_cores"], 4),
                   "satisfied": m["satisfied"], "train_seconds": round(secs)}
            if isinstance(pol.net, C2MarlEnsemble):
                row["vote"] = pol.net.how
            if episode in validated:
                row["validation"] = {k: round(validated[episode][k], 4) for k in ("pm_hot_r", "s_cores")}
            print(json.dumps(row), flush=True)
    return 0


def _case(p: argparse.ArgumentParser, key: str):
    """The experiment's case named `key`, or a usage error listing them."""
    from agents.oversubscription.experiment import FULL_CASES, QUICK_CASES

    cases = {c.key: c for c in FULL_CASES + QUICK_CASES}
    if key not in cases:
        p.error(f"argument --case: invalid choice: {key!r} (choose from {', '.join(sorted(cases))})")
    return cases[key]


def _tested(p: argparse.ArgumentParser, args, case, seed: int):
    """(the (episode, policy, training seconds) to test, how many are the kept weights, the
    validation history by episode) of one seed; a usage error for a missing or foreign policy."""
    from agents.oversubscription.experiment import kept_episode, load_run_policy, policy_name
    from agents.oversubscription.train import saved_checkpoints

    root = Path(args.policies)
    root = root / "policies" if (root / "policies").is_dir() else root
    saved = root / policy_name(case, args.alpha, seed)
    try:
        policy, seconds = load_run_policy(saved, case, args.alpha, seed, args.trace_seed)
    except (ValueError, OSError) as e:  # a missing or foreign policy folder
        p.error(str(e))
    kept = kept_episode(policy)
    validated = {h["episode"]: h for h in policy.training.get("validation", {}).get("history", [])}
    if args.votes:
        votes = [v.strip() for v in args.votes.split(",") if v.strip()]
        try:
            tested = [(kept, policy.with_vote(v), seconds) for v in votes]
        except ValueError as e:
            p.error(f"{saved}: {e}")
    else:
        tested = [(kept, policy, seconds)]
    n_kept = len(tested)
    if args.checkpoints:
        for _, d in saved_checkpoints(saved):
            try:
                cp, cp_seconds = load_run_policy(d, case, args.alpha, seed, args.trace_seed)
            except (ValueError, OSError) as e:
                p.error(str(e))
            tested.append((cp.training["checkpoint_episode"], cp, cp_seconds))
    return tested, n_kept, validated

if __name__ == "__main__":
    raise SystemExit(main())
