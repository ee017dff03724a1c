"""Every 600-s real-container run pooled per method and load, and what the runs can tell about the
issue-18 target (docs/microservice-testbed.md, "All the 600-s runs pooled"): a method uses fewer
mean cores than a baseline at an equal or lower violation rate.

One 600-s pair decides on a handful of violating seconds and on AutoScale's resting point, which
moves from run to run; pooled, the question has two parts the data can answer separately:
- cores: the runs' mean cores, method against baseline (Welch's t-test on the per-run means);
- violations: the violating seconds over all seconds of each side, compared as two Poisson rates
  (the exact conditional binomial test: given k1 + k2 violations, k1 ~ Binomial(k1 + k2, T1 / (T1 + T2))
  under equal rates). Violating seconds come in bursts, so this test is optimistic about its own
  precision; the Mann-Whitney test on the per-run counts is shown beside it and assumes nothing of the kind.

    .venv/bin/python benchmarks/microservice_testbed_pool.py [--runs CSV] [--summary LABEL=DIR ...] \
        [--method reclaimer+window5] [--baselines autoscale,sinan-live] [--machine amd,intel] [--json OUT]

`--summary LABEL=DIR` adds a run of `samm testbed-microservices --out DIR` under the method LABEL.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

RUNS_CSV = Path(__file__).resolve().parent / "data" / "microservice_testbed_runs.csv"


@dataclass(frozen=True)
class Run:
    session: str
    method: str
    users: int
    seed: int
    seconds: int
    mean_cores: float
    violating_seconds: int
    machine: str = ""


def load_runs(path: str | Path = RUNS_CSV) -> list[Run]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    runs = []
    for i, r in enumerate(rows, start=1):
        try:
            run = Run(session=r["session"], method=r["method"], users=int(r["users"]), seed=int(r["seed"]),
                      seconds=int(r["seconds"]), mean_cores=float(r["mean_cores"]),
                      violating_seconds=int(r["violating_seconds"]), machine=r.get("machine", ""))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: data row {i}: {e!r}") from None
        if run.seconds <= 0 or not 0 <= run.violating_seconds <= run.seconds or not math.isfinite(run.mean_cores):
            raise ValueError(f"{path}: data row {i}: seconds, violating seconds or cores out of range: {r}")
        runs.append(run)
    return runs


def run_from_summary(label: str, out_dir: str | Path, session: str = "new") -> Run:
    """A run of `samm testbed-microservices --out DIR` from its summary.json, as the method `label`."""
    s = json.loads((Path(out_dir) / "summary.json").read_text())
    return Run(session=session, method=label, users=int(s["users"]), seed=int(s.get("seed", -1)),
               seconds=int(s["known_latency_seconds"]), mean_cores=float(s["total_cores"]["mean"]),
               violating_seconds=int(s["violation_seconds"]))


@dataclass(frozen=True)
class Pooled:
    method: str
    users: int
    runs: int
    cores_mean: float
    cores_std: float           # population std over the runs
    violating_seconds: int
    seconds: int

    @property
    def rate(self) -> float:
        return self.violating_seconds / self.seconds


def pool(runs: list[Run]) -> dict[tuple[str, int], Pooled]:
    groups: dict[tuple[str, int], list[Run]] = defaultdict(list)
    for r in runs:
        groups[(r.method, r.users)].append(r)
    out = {}
    for (method, users), rs in sorted(groups.items()):
        cores = [r.mean_cores for r in rs]
        m = sum(cores) / len(cores)
        out[(method, users)] = Pooled(method, users, len(rs), m, math.sqrt(sum((c - m) ** 2 for c in cores) / len(cores)),
                                      sum(r.violating_seconds for r in rs), sum(r.seconds for r in rs))
    return out


def rate_test(k1: int, t1: int, k2: int, t2: int) -> float:
    """Two-sided p of equal Poisson rates given k1 events in t1 and k2 in t2 (exact, conditional)."""
    from scipy.stats import binomtest

    if k1 + k2 == 0:
        return 1.0
    return float(binomtest(k1, k1 + k2, t1 / (t1 + t2)).pvalue)


def compare(method_runs: list[Run], base_runs: list[Run]) -> dict:
    """The pooled comparison of one method with one baseline at one load."""
    from scipy.stats import mannwhitneyu, ttest_ind

    a, b = pool(method_runs), pool(base_runs)
    (pa,), (pb,) = a.values(), b.values()
    ca, cb = [r.mean_cores for r in method_runs], [r.mean_cores for r in base_runs]
    va = [r.violating_seconds / r.seconds for r in method_runs]
    vb = [r.violating_seconds / r.seconds for r in base_runs]
    fewer_cores = pa.cores_mean < pb.cores_mean
    no_more_violations = pa.rate <= pb.rate
    return {
        "cores_ratio": pa.cores_mean / pb.cores_mean,
        "cores_p_welch": float(ttest_ind(ca, cb, equal_var=False).pvalue) if min(len(ca), len(cb)) >= 2 else None,
        "rate_ratio": pa.rate / pb.rate if pb.rate > 0 else (math.inf if pa.rate > 0 else 1.0),
        "rate_p_poisson": rate_test(pa.violating_seconds, pa.seconds, pb.violating_seconds, pb.seconds),
        "rate_p_mannwhitney": float(mannwhitneyu(va, vb).pvalue) if min(len(va), len(vb)) >= 2 else None,
        "met_pooled": fewer_cores and no_more_violations,
    }


def same_session_pairs(runs: list[Run], method: str, baseline: str, users: int) -> tuple[int, int]:
    """(met, pairs) over the (session, seed) that ran both at this load."""
    idx = {(r.session, r.seed, r.method): r for r in runs if r.users == users}
    met = pairs = 0
    for (session, seed, m), r in idx.items():
        b = idx.get((session, seed, baseline))
        if m != method or b is None:
            continue
        pairs += 1
        met += r.mean_cores < b.mean_cores and r.violating_seconds <= b.violating_seconds
    return met, pairs


def _p(x: float | None) -> str:
    return "–" if x is None else (f"{x:.3f}" if x >= 0.001 else "< 0.001")


def report(runs: list[Run], method: str, baselines: list[str], users: list[int]) -> tuple[str, dict]:
    pooled = pool(runs)
    lines = ["| method | users | runs | mean cores ± std | violating seconds | rate |", "|---|---:|---:|---:|---:|---:|"]
    for (m, u), p in pooled.items():
        if u in users and m in [method, *baselines]:
            lines.append(f"| {m} | {u} | {p.runs} | {p.cores_mean:.3f} ± {p.cores_std:.3f} | "
                         f"{p.violating_seconds} / {p.seconds} | {100 * p.rate:.2f} % |")
    lines += ["", f"| {method} against | users | cores ratio | p (Welch) | violation-rate ratio | p (Poisson) | "
              "p (Mann-Whitney) | pooled: fewer cores at ≤ rate | same-session pairs met |",
              "|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    out: dict = {"pooled": [asdict(p) | {"rate": p.rate} for p in pooled.values()], "comparisons": []}
    for base in baselines:
        for u in users:
            mr = [r for r in runs if r.method == method and r.users == u]
            br = [r for r in runs if r.method == base and r.users == u]
            if not mr or not br:
                continue
            c = compare(mr, br)
            met, pairs = same_session_pairs(runs, method, base, u)
            out["comparisons"].append({"method": method, "baseline": base, "users": u, **c,
                                       "pairs_met": met, "pairs": pairs})
            lines.append(f"| {base} | {u} | {c['cores_ratio']:.3f} | {_p(c['cores_p_welch'])} | "
                         f"{c['rate_ratio']:.2f} | {_p(c['rate_p_poisson'])} | {_p(c['rate_p_mannwhitney'])} | "
                         f"{'yes' if c['met_pooled'] else 'no'} | {met} of {pairs} |")
    return "\n".join(lines), out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default=str(RUNS_CSV), help="the recorded runs (CSV)")
    ap.add_argument("--summary", action="append", default=[], metavar="LABEL=DIR",
                    help="add a testbed run's folder under the method LABEL; repeat")
    ap.add_argument("--method", default="reclaimer+window5")
    ap.add_argument("--baselines", default="autoscale,sinan-live")
    ap.add_argument("--users", default="6,14")
    ap.add_argument("--machine", default=None, help="keep only runs on these machines (comma-separated)")
    ap.add_argument("--json", default=None, help="write the figures here")
    a = ap.parse_args(argv)
    from agents.report import writable_folder

    try:
        users = [int(u) for u in a.users.split(",")]
    except ValueError:
        ap.error(f"--users must be comma-separated whole numbers, got {a.users!r}")
    try:
        runs = load_runs(a.runs)
    except (OSError, ValueError) as e:
        ap.error(f"--runs {a.runs}: {e}")
    try:  # before the work: a path that cannot take the file failed only at the end, losing it
        if a.json:
            writable_folder(Path(a.json).parent)
    except OSError as e:
        ap.error(f"--json {a.json}: {e}")
    for spec in a.summary:
        label, sep, folder = spec.partition("=")
        if not sep or not label:
            ap.error(f"--summary wants LABEL=DIR, got {spec!r}")
        try:
            runs.append(run_from_summary(label, folder))
        except (OSError, KeyError, ValueError) as e:
            ap.error(f"--summary {spec}: {e!r}")
    # a misspelt method otherwise prints an empty table and exits 0 (checked before --machine, which may leave a
    # baseline without runs on purpose)
    missing = [m for m in [a.method, *a.baselines.split(",")] if m not in {r.method for r in runs}]
    if missing:
        ap.error(f"no runs of method {missing[0]!r} (known: {', '.join(sorted({r.method for r in runs}))})")
    if a.machine:
        keep = set(a.machine.split(","))
        runs = [r for r in runs if r.machine in keep or r.session == "new"]
    text, out = report(runs, a.method, a.baselines.split(","), users)
    print(text)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
