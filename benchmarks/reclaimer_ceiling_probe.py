"""How much more could a headroom ceiling take from a Reclaimer policy? (docs/microservice-cores.md,
"How far a ceiling can go"): three probes on validation episodes only, never the experiment's.

1. Where the cores are: per load level and service, the policy's mean cores beside the cores its
   services use (with the policy's own ceiling, as shipped).
2. Each level's own floor: the smallest uniform H, scanned down from the policy's, that breaks no
   second at that level alone. A ceiling keyed on the load could go no lower than these.
3. A ceiling per service (`--descent`): from the policy's H, each service in turn lowered by 0.1
   while no validation second breaks and the mean cores fall, down to 1.2 (coordinate descent, the
   topology's order; a lower ceiling can raise the cores, through throttled seconds' use). It
   ends at the edge of the validation seeds with no margin, so it is an upper bound on what a
   per-service ceiling chosen this way saves, not a rule to ship.

    .venv/bin/python benchmarks/reclaimer_ceiling_probe.py --app hotel --seeds 101-120 --descent
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.microservice_cores.action_map import Ceiling  # noqa: E402
from agents.microservice_cores.episode import run_episodes  # noqa: E402
from agents.microservice_cores.experiment import FULL, levels  # noqa: E402
from agents.microservice_cores.hosting import make_policy  # noqa: E402
from agents.microservice_cores.validation import evaluate  # noqa: E402
from agents.report import writable_folder  # noqa: E402
from samm.cli.seeds import parse_seeds  # noqa: E402

#: the per-service descent's step and floor: the grid of ceiling.py
STEP, FLOOR = 0.1, 1.2


def per_service(policy, ceilings):
    """The policy under one H per service. Ceiling.cap broadcasts over the services, so an array
    works where a saved policy holds one number (check_ceiling refuses it; the probe never saves it)."""
    probe = policy.with_ceiling(None)
    probe.ceiling = Ceiling(multiple=np.asarray(ceilings, dtype=np.float64))
    return probe


def where_the_cores_are(policy, seeds) -> list[dict]:
    rows = []
    for users in levels(policy.topo, FULL.level_fractions):
        eps = run_episodes(policy.topo, None, users, seeds, batch=policy.batch())
        cores = np.mean([e.cores.mean(0) for e in eps], axis=0)
        used = np.mean([e.used.mean(0) for e in eps], axis=0)
        rows.append({"users": users, "cores": float(cores.sum()), "used": float(used.sum()),
                     "services": {n: [round(float(c), 3), round(float(u), 3)]
                                  for n, c, u in zip(policy.topo.services, cores, used)}})
    return rows


def level_floors(policy, seeds, start: float) -> dict:
    floors = {}
    for frac, users in zip(FULL.level_fractions, levels(policy.topo, FULL.level_fractions)):
        h, clean = start, None
        while h >= FLOOR - 1e-9:
            r = evaluate(policy.with_ceiling(h), policy.topo, seeds, fractions=[frac])
            lvl = next(iter(r["levels"].values()))
            print(f"    {users:g} users, H {h:.1f}: {lvl['mean_cores']:.3f} cores, {lvl['violation_rate']:.4%}", flush=True)
            if lvl["violation_rate"] > 0:
                break
            clean = {"ceiling": round(h, 1), "mean_cores": lvl["mean_cores"]}
            h = round(h - STEP, 1)
        floors[f"{users:g}"] = clean
    return floors


def descent(policy, seeds, start: float) -> dict:
    names = list(policy.topo.services)
    vec = np.full(len(names), start)
    best = evaluate(per_service(policy, vec), policy.topo, seeds)
    for i, name in enumerate(names):
        while vec[i] - STEP >= FLOOR - 1e-9:
            trial = vec.copy()
            trial[i] = round(trial[i] - STEP, 1)
            r = evaluate(per_service(policy, trial), policy.topo, seeds)
            if r["violation_rate"] > 0 or r["mean_cores"] >= best["mean_cores"]:
                break
            vec, best = trial, r
        print(f"    {name}: H {vec[i]:.1f}, mean {best['mean_cores']:.4f} cores", flush=True)
    return {"ceilings": dict(zip(names, vec.round(1).tolist())), "mean_cores": best["mean_cores"],
            "levels": {u: v["mean_cores"] for u, v in best["levels"].items()}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--app", default="hotel")
    p.add_argument("--policy", default=None, help="a policy directory (default: the shipped policy of --app)")
    p.add_argument("--seeds", default="101-120", help="validation seeds, apart from the experiment's 1-10 (default: %(default)s)")
    p.add_argument("--descent", action="store_true", help="also the per-service descent (about 4 min on Hotel)")
    p.add_argument("--out", default=None, help="write every figure to this JSON file")
    args = p.parse_args(argv)
    try:
        seeds = parse_seeds(args.seeds)
        policy = make_policy("reclaimer", args.policy, app=args.app)
        if args.out:  # before the work: a path that cannot take the file failed only at the end, losing it
            writable_folder(Path(args.out).parent)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    # from the policy's own H (a plain multiple), else from the grid's top
    start = policy.ceiling.multiple if policy.ceiling is not None and policy.ceiling.sqrt == 0 else 3.0
    t0 = time.perf_counter()
    print(f"{args.app}, policy {policy.version} (ceiling {policy.ceiling_json()}), seeds {args.seeds}")
    out = {"app": args.app, "policy": policy.version, "ceiling": policy.ceiling_json(), "seeds": seeds}
    out["where"] = where_the_cores_are(policy, seeds)
    print("| users | mean cores | cores used | cores / used |\n|---|---|---|---|")
    for r in out["where"]:
        print(f"| {r['users']:g} | {r['cores']:.2f} | {r['used']:.2f} | {r['cores'] / r['used']:.2f} |")
    whole = evaluate(policy, policy.topo, seeds)
    out["policy_mean_cores"] = whole["mean_cores"]
    print(f"  the policy: {whole['mean_cores']:.4f} mean cores, {whole['violation_rate']:.4%} violating")
    print("  each level's own floor (a uniform H at that level alone):")
    out["level_floors"] = level_floors(policy, seeds, start)
    if args.descent:
        print(f"  one ceiling per service, from H {start:g}:")
        out["descent"] = descent(policy, seeds, start)
        d = out["descent"]["mean_cores"]
        print(f"  per service at the edge: {d:.4f} mean cores, {d / whole['mean_cores']:.3f}x the policy's")
    out["seconds"] = round(time.perf_counter() - t0, 1)
    print(f"  {out['seconds']} s")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
