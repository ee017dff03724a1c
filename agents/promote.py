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


def sign_test_p(wins: int, losses: int) -> float:
    """One-sided exact sign test: P(at least `wins` successes of wins+losses fair coin flips)."""
    n = wins + losses
    if n == 0:
        return 1.0
    return sum(math.comb(n, k) for k in range(wins, n + 1)) / 2**n


def compare(candidate_dir, incumbent_dir, sim: SimConfig, workload: Workload, seeds, margin: float = 0.02,
            max_p: float = 0.1) -> dict:
    cand, inc = load_agent(candidate_dir), load_agent(incumbent_dir)
    rc = evaluate(cand, sim, workload, seeds)
    ri = evaluate(inc, sim, workload, seeds)
    c = np.array([e["total_cost"] for e in rc["episodes"]])
    i = np.array([e["total_cost"] for e in ri["episodes"]])
    rel = 1.0 - c / i  # per pair: the candidate's relative saving
    wins, losses = int((c < i).sum()), int((c > i).sum())
    mean_rel = float(rel.mean())
    p = sign_test_p(wins, losses)
    promote = mean_rel >= margin and p <= max_p
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
        "rule": f"promote iff mean paired saving >= {margin:.1%} and one-sided sign-test p <= {max_p}",
        "promote": bool(promote),
    }


def install(candidate_dir, target_dir) -> None:
    """Replace `target_dir` with a copy of the candidate; the old version is kept as
    `<target>.previous` and the swap is a rename, so readers never see a half-written policy."""
    target = Path(target_dir)
    tmp = Path(tempfile.mkdtemp(prefix=".incoming-", dir=target.parent))
    shutil.copytree(candidate_dir, tmp, dirs_exist_ok=True)
    previous = target.with_name(target.name + ".previous")
    if previous.exists():
        shutil.rmtree(previous)
    if target.exists():
        os.replace(target, previous)
    os.replace(tmp, target)
