"""Compare a candidate policy with the incumbent on paired episodes (same workload, same seeds)
and promote only on clear evidence: the paper's missing "compare before deploying" step."""
from __future__ import annotations

import math
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from sim_bridge.config import SimConfig
from sim_bridge.workloads import Workload

from .base import load_agent
from .evaluate import evaluate
from .report import refuse_repeats


def sign_test_p(wins: int, losses: int) -> float:
    """One-sided exact sign test: P(at least `wins` successes of wins+losses fair coin flips)."""
    n = wins + losses
    if n == 0:
        return 1.0
    return sum(math.comb(n, k) for k in range(wins, n + 1)) / 2**n


def compare(candidate_dir, incumbent_dir, sim: SimConfig, workload: Workload, seeds, margin: float = 0.02,
            max_p: float = 0.1) -> dict:
    # listed once: a generator was spent by the candidate's run, the incumbent's then ran no seeds
    seeds = [int(s) for s in seeds]
    refuse_repeats(seeds, "seeds")  # a repeated seed is one pair counted twice in the sign test
    cand, inc = load_agent(candidate_dir), load_agent(incumbent_dir)
    rc = evaluate(cand, sim, workload, seeds)
    ri = evaluate(inc, sim, workload, seeds)
    c = np.array([e["total_cost"] for e in rc["episodes"]])
    i = np.array([e["total_cost"] for e in ri["episodes"]])
    rel = 1.0 - c / i  # per pair: the candidate's relative saving
    wins, losses = int((c < i).sum()), int((c > i).sum())
    mean_rel = float(rel.mean())
    p = sign_test_p(wins, losses)
    # an episode cut at the step cap with jobs queued stops paying when it stops: a candidate that
    # leaves work undone looked cheaper and was promoted (as suite_gate refuses it, by the same rule)
    lost = [int(s) for s, a, b in zip(seeds, rc["episodes"], ri["episodes"]) if _all_jobs(b) and not _all_jobs(a)]
    promote = mean_rel >= margin and p <= max_p and not lost
    return {
        "candidate": {"dir": str(candidate_dir), "version": cand.version, "mean_total_cost": float(c.mean())},
        "incumbent": {"dir": str(incumbent_dir), "version": inc.version, "mean_total_cost": float(i.mean())},
        "workload": workload.name,
        "seeds": [int(s) for s in seeds],
        "pairs": [{"seed": int(s), "candidate": float(a), "incumbent": float(b), "saving": float(r)}
                  for s, a, b, r in zip(seeds, c, i, rel)],
        "mean_saving": round(mean_rel, 4),
        "wins": wins, "losses": losses, "ties": len(seeds) - wins - losses,
        "sign_test_p": round(p, 4),
        "jobs_lost": [{"seed": s} for s in lost],
        "rule": f"promote iff mean paired saving >= {margin:.1%}, one-sided sign-test p <= {max_p}, and the "
                "candidate finishes every job wherever the incumbent does",
        "promote": bool(promote),
    }


def _all_jobs(episode: dict) -> bool:
    return episode["jobs_finished"] == episode["jobs_total"]


def install(candidate_dir, target_dir) -> None:
    """Replace `target_dir` with a copy of the candidate; the old version is kept as
    `<target>.previous` and the swap is a rename, so readers never see a half-written policy."""
    target = Path(target_dir)
    tmp = Path(tempfile.mkdtemp(prefix=".incoming-", dir=target.parent))
    try:
        shutil.copytree(candidate_dir, tmp, dirs_exist_ok=True)
    except BaseException:  # a half-copied policy must not be left next to the installed one
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    previous = target.with_name(target.name + ".previous")
    moved = False
    try:
        if previous.is_symlink() or previous.is_file():
            previous.unlink()
        elif previous.exists():
            shutil.rmtree(previous)
        if target.exists():
            os.replace(target, previous)
            moved = True
        os.replace(tmp, target)
    except BaseException:
        # the copy left beside the target was never cleaned up, and a failed last rename left no
        # policy at the target at all: the installed one goes back
        if moved and not target.exists():
            os.replace(previous, target)
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# -- gating on the generalisation suite (paired windows and seeds) ---------------------------------
SUITE_WINDOW_TOLERANCE = 1.05


def suite_gate(pairs: list[dict], margin: float = 0.0, tolerance: float = SUITE_WINDOW_TOLERANCE,
               max_p: float | None = None) -> dict:
    """The suite's promotion rule on paired episodes, plain numbers only. Each pair is
    {"window", "seed", "candidate", "incumbent"} (total costs, $) with optional
    "candidate_all_jobs"/"incumbent_all_jobs" (bools: every job finished in that episode).

    Promote iff the geometric mean of the per-pair ratios candidate/incumbent is <= 1 - margin,
    no window's ratio (the geometric mean of its pairs) exceeds `tolerance`, and the candidate
    finished every job in every pair where the incumbent did. Ratios, not savings in $, so a
    heavy window cannot buy a loss on a light one; the per-window cap refuses a policy that is
    better on average but worse somewhere. The one-sided sign test is reported (and required
    only when `max_p` is given): with a handful of windows it is weak evidence either way."""
    if not pairs:
        raise ValueError("no pairs to compare")
    # one episode listed twice is one piece of evidence counted twice: the sign test and the
    # geometric mean would weigh a repeated (window, seed) as if it were another draw
    refuse_repeats([(p["window"], int(p["seed"])) for p in pairs], "the pairs' (window, seed)")
    rows, by_window = [], {}
    for p in pairs:
        c, i = float(p["candidate"]), float(p["incumbent"])
        if not (c > 0 and i > 0):
            raise ValueError(f"costs must be positive, got {p}")
        r = c / i
        rows.append({**p, "ratio": r})
        by_window.setdefault(p["window"], []).append(math.log(r))
    logs = [math.log(r["ratio"]) for r in rows]
    geo = math.exp(sum(logs) / len(logs))
    windows = {w: math.exp(sum(v) / len(v)) for w, v in by_window.items()}
    worst_w = max(windows, key=windows.__getitem__)
    lost_jobs = [{"window": r["window"], "seed": r["seed"]} for r in rows
                 if r.get("incumbent_all_jobs", True) and not r.get("candidate_all_jobs", True)]
    wins = sum(r["ratio"] < 1 for r in rows)
    losses = sum(r["ratio"] > 1 for r in rows)
    p = sign_test_p(wins, losses)
    checks = {"geomean": geo <= 1.0 - margin, "windows": windows[worst_w] <= tolerance, "jobs": not lost_jobs}
    if max_p is not None:
        checks["sign_test"] = p <= max_p
    rule = (f"promote iff the geometric-mean paired cost ratio candidate/incumbent <= {1.0 - margin:.4g}, "
            f"no window's ratio > {tolerance:.4g}, and the candidate finishes every job wherever the incumbent does"
            + (f", and one-sided sign-test p <= {max_p}" if max_p is not None else ""))
    return {
        "pairs": rows,
        "geomean_ratio": round(geo, 6),
        "window_ratios": {w: round(v, 6) for w, v in windows.items()},
        "worst_window": worst_w, "worst_window_ratio": round(windows[worst_w], 6),
        "jobs_lost": lost_jobs,
        "wins": wins, "losses": losses, "ties": len(rows) - wins - losses,
        "sign_test_p": round(p, 4),
        "checks": checks,
        "rule": rule,
        "promote": all(checks.values()),
    }


def compare_on_suite(candidate_dir, incumbent_dir, sim: SimConfig, workloads: list[Workload], seeds=None,
                     margin: float = 0.0, tolerance: float = SUITE_WINDOW_TOLERANCE, max_p: float | None = None,
                     max_steps: int | None = None) -> dict:
    """Candidate and incumbent on every suite window and seed (default: the suite's seeds and
    step cap), paired by (window, seed), judged by `suite_gate`."""
    from .generalisation import SUITE_MAX_STEPS, SUITE_SEEDS, run_together

    seeds = [int(s) for s in (seeds or SUITE_SEEDS)]
    cand, inc = load_agent(candidate_dir), load_agent(incumbent_dir)
    pairs = []
    for wl in workloads:
        ec, ei = run_together(sim, wl, [cand, inc], seeds, max_steps=max_steps or SUITE_MAX_STEPS)
        for a, b in zip(ec, ei):
            pairs.append({"window": wl.name, "seed": int(a["seed"]), "candidate": float(a["total_cost"]),
                          "incumbent": float(b["total_cost"]),
                          "candidate_all_jobs": a["jobs_finished"] == a["jobs_total"],
                          "incumbent_all_jobs": b["jobs_finished"] == b["jobs_total"]})
    verdict = suite_gate(pairs, margin, tolerance, max_p)
    return {"candidate": {"dir": str(candidate_dir), "version": cand.version},
            "incumbent": {"dir": str(incumbent_dir), "version": inc.version},
            "seeds": seeds, "windows": [w.name for w in workloads], **verdict}
