"""The paper's transfer experiment (§5.3, Figure 8), in the simulator: Social Network policies
trained on limited data, from a random initialisation (RI) and from the Hotel Reservation policy
(TL), beside the policy trained on the full budget, on the same episodes.

    .venv/bin/python benchmarks/reclaimer_transfer.py --app social \
        --policy full=runs/rc-social/policy --policy tl=runs/tl-social/policy --policy ri=runs/ri-social/policy \
        --out runs/transfer.json

Each policy runs the experiment's protocol (`samm experiment reclaimer`: 60 s at the caps, 300
control seconds) at the three load levels of the app's user range × 5 seeds; reported per policy:
mean cores, violation rate, and mean cores relative to the first policy (the paper: RI +322 % and
38 % violations, TL +56.6 % and none, both after 46.1 % of the full budget's data).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--app", default="social")
    ap.add_argument("--policy", action="append", required=True, help="NAME=POLICY_DIR; the first is the reference")
    ap.add_argument("--seeds", default="1,2,3,4,5")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from agents.microservice_cores.policy import ReclaimerPolicy
    from agents.microservice_cores.topology import load_topology
    from samm.cli.seeds import parse_seeds
    from agents.microservice_cores.validation import evaluate
    from agents.report import writable_folder

    try:  # a bad option as one line, before the first policy's episodes
        topo = load_topology(args.app)
        seeds = parse_seeds(args.seeds)
        specs = [spec.partition("=")[::2] for spec in args.policy]  # (name, path)
        bad = [spec for spec, (name, path) in zip(args.policy, specs) if not name or not path]
        if bad:  # `--policy DIR` loaded "" (the working folder) under the name DIR
            raise ValueError(f"--policy takes NAME=POLICY_DIR, not {bad[0]!r}")
        loaded = [(name, path, ReclaimerPolicy.load(path)) for name, path in specs]
        if args.out:  # before the work: a path that cannot take the file failed only at the end, losing it
            writable_folder(Path(args.out).parent)
    except (ValueError, OSError) as exc:
        ap.error(str(exc))
    started = time.time()
    rows = {}
    for name, path, policy in loaded:
        res = evaluate(policy, topo, seeds)
        rows[name] = {"policy": path, "levels": res["levels"], "mean_cores": res["mean_cores"],
                      "violation_rate": res["violation_rate"]}
    ref = rows[args.policy[0].partition("=")[0]]["mean_cores"]
    for r in rows.values():
        r["mean_cores_vs_reference_pct"] = round(100.0 * (r["mean_cores"] - ref) / ref, 1)
    out = {"app": args.app, "seeds": seeds, "seconds": round(time.time() - started, 1), "policies": rows}
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
