"""How many validation episodes does choosing a C2MARL checkpoint need? (docs/oversubscription.md,
"How large a validation week")

A `--validate-every` run (agents/oversubscription/train.py) keeps the checkpoint that meets α's level
on the validation week and saves most there, judged on `--validate-episodes` episodes (40 by default,
so PM-Hot-R moves in steps of 2.5 points). This script rolls every saved checkpoint of the given runs
out on more validation episodes (the same episodes the training drew, then more) and on the
experiment's held-apart test episodes, then replays the choice with the first K validation episodes
for each K of `--sizes`: which checkpoint each K keeps, its test figures, and how well validation
ranks the checkpoints (Spearman ρ over PM-Hot-R).

    .venv/bin/python benchmarks/oversub_validation_size.py --runs DIR [DIR ...] --cache CACHE \
        --validation-episodes 200 --test-episodes 300 --sizes 40,100,200

Each checkpoint's per-episode, per-PM outcomes are cached under CACHE (one .npz per checkpoint), so
two processes can measure disjoint runs side by side and a last call with `--report` only reads them.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _outcomes(policy, setting, workloads, warm: bool, total: int, desc: str) -> tuple[np.ndarray, np.ndarray]:
    """Per episode: which PMs broke (hot on delta or more steps) and the episode's S-Cores."""
    from tqdm import tqdm

    from agents.oversubscription.train import roll_out

    over, saved = [], []
    bar = tqdm(workloads, total=total, desc=desc, unit="ep", file=sys.stderr, mininterval=2.0)
    for rec in roll_out(policy.rates, setting, bar, warm):
        over.append(rec.hot_counts >= setting.delta_steps)
        saved.append(rec.s_cores)
    return np.stack(over), np.asarray(saved, dtype=float)


def _figures(over: np.ndarray, saved: np.ndarray) -> tuple[float, float]:
    """(PM-Hot-R, S-Cores) of a set of episodes, as metrics.summarise computes them."""
    return float(over.mean(axis=0).max()), float(saved.mean())


def _spearman(a, b) -> float:
    from scipy.stats import spearmanr

    if np.ptp(a) == 0 or np.ptp(b) == 0:    # a constant side ranks nothing
        return float("nan")
    return float(spearmanr(a, b).statistic)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", nargs="+", required=True, help="training --out folders with a checkpoints/ folder")
    p.add_argument("--cache", required=True, help="folder for each checkpoint's per-episode outcomes")
    p.add_argument("--validation-episodes", type=int, default=200)
    p.add_argument("--test-episodes", type=int, default=300)
    p.add_argument("--sizes", default="40,100,200", help="validation sizes K to replay the choice with")
    p.add_argument("--report", action="store_true", help="only read the cache; measure nothing")
    p.add_argument("--threads", type=int, default=1, help="torch threads (one per process: run two side by side)")
    args = p.parse_args(argv)
    # each refused before a checkpoint is measured (minutes each): `--sizes x` and an unmakeable
    # --cache raised, --test-episodes 0 failed on the empty test set after measuring
    try:
        sizes = [int(k) for k in args.sizes.split(",")]
    except ValueError:
        p.error(f"--sizes must be comma-separated whole numbers, got {args.sizes!r}")
    if max(sizes) > args.validation_episodes or min(sizes) < 1:
        p.error("--sizes must lie in 1..--validation-episodes")
    if args.test_episodes < 1:
        p.error("--test-episodes must be at least 1")
    from agents.report import writable_folder

    try:
        # --report only reads: a cache it cannot write to is still one to report on
        cache = Path(args.cache) if args.report and Path(args.cache).is_dir() else writable_folder(args.cache)
    except OSError as exc:
        p.error(f"--cache: {exc}")
    import torch

    from agents.oversubscription.data import generate_trace
    from agents.oversubscription.experiment import held_apart_episodes, test_specs
    from agents.oversubscription.metrics import satisfied
    from agents.oversubscription.policy import OversubPolicy
    from agents.oversubscription.train import choose_checkpoint, saved_checkpoints, validation_episodes

    torch.set_num_threads(max(1, args.threads))

    traces: dict = {}
    summary = []
    # every run's checkpoints found before the first is measured: a run without them (a typo)
    # failed only after the earlier runs' checkpoints were measured, minutes each
    checkpoints = [(run, saved_checkpoints(run)) for run in (Path(r) for r in args.runs)]
    empty = [run for run, saved in checkpoints if not saved]
    if empty:
        print(f"error: {empty[0]} has no checkpoints/episode-E folders", file=sys.stderr)
        return 2
    for run, saved in checkpoints:
        rows = []
        for episode, d in saved:
            f = cache / f"{run.name}-{d.name}.npz"
            if not f.exists():
                if args.report:
                    print(f"error: {f} not measured yet", file=sys.stderr)
                    return 2
                policy = OversubPolicy.load(d)
                t = policy.training
                setting = policy.setting
                key = (setting.name, t["trace_seed"])
                if key not in traces:
                    traces[key] = generate_trace(setting, t["trace_seed"])
                trace, warm = traces[key], bool(t["warm"])
                v_over, v_saved = _outcomes(policy, setting, validation_episodes(
                    trace, args.validation_episodes, warm), warm, args.validation_episodes, f"{f.stem} validation")
                specs = test_specs(trace, args.test_episodes, warm)
                t_over, t_saved = _outcomes(policy, setting, held_apart_episodes(trace, specs, warm), warm,
                                            args.test_episodes, f"{f.stem} test")
                np.savez_compressed(f, v_over=v_over, v_saved=v_saved, t_over=t_over, t_saved=t_saved,
                                    alpha=t["config"]["alpha"], checkpoint=str(d.resolve()))
            z = np.load(f)
            row = {"run": run.name, "episode": episode, "alpha": float(z["alpha"])}
            if str(z["checkpoint"]) != str(d.resolve()):     # two runs of one folder name share a cache name
                print(f"error: {f} was measured for {z['checkpoint']}, not {d.resolve()}; use another --cache",
                      file=sys.stderr)
                return 2
            for kind, have, want in (("validation", len(z["v_saved"]), max(sizes)),
                                     ("test", len(z["t_saved"]), args.test_episodes)):
                if have < want:
                    print(f"error: {f} holds {have} {kind} episodes, fewer than {want}", file=sys.stderr)
                    return 2
            for k in sizes:
                row[f"val{k}"] = _figures(z["v_over"][:k], z["v_saved"][:k])
            row["test"] = _figures(z["t_over"][:args.test_episodes], z["t_saved"][:args.test_episodes])
            rows.append(row)
            print(json.dumps({"checkpoint": row}), flush=True)
        alpha = rows[0]["alpha"]
        for k in sizes:
            history = [{"pm_hot_r": r[f"val{k}"][0], "s_cores": r[f"val{k}"][1]} for r in rows]
            kept = rows[choose_checkpoint(history, alpha)]
            summary.append({
                "run": run.name, "validation_episodes": k, "kept_episode": kept["episode"],
                "kept_validation": [round(x, 4) for x in kept[f"val{k}"]],
                "kept_test": [round(x, 4) for x in kept["test"]],
                "kept_test_satisfied": satisfied(kept["test"][0], alpha),
                "spearman_pm_hot_r": round(_spearman([r[f"val{k}"][0] for r in rows],
                                                     [r["test"][0] for r in rows]), 3),
            })
            print(json.dumps({"choice": summary[-1]}), flush=True)
    for k in sizes:
        chosen = [s for s in summary if s["validation_episodes"] == k]
        print(json.dumps({"size": k, "runs": len(chosen),
                          "kept_meet_alpha_on_test": sum(s["kept_test_satisfied"] for s in chosen),
                          "mean_kept_test_pm_hot_r": round(float(np.mean([s["kept_test"][0] for s in chosen])), 4),
                          "mean_kept_test_s_cores": round(float(np.mean([s["kept_test"][1] for s in chosen])), 4)}),
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
