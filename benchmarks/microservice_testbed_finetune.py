"""Fine-tune a simulator-trained Reclaimer policy on the real-container testbed (issue 18: "the
policy trained in simulation, fine-tuned on the testbed if needed: say how long").

One `OnlineReclaimer` (agents/microservice_cores/online.py) drives consecutive testbed runs, one per
user level in --users, repeated --rounds times; its replay of live transitions and its networks
carry over from run to run. Each run is `run_microservices` (what `samm testbed-microservices`
runs), so the guard, the Knowledge records and the outputs are the usual ones, under
OUT/round<r>-u<U>/. The fine-tuned policy is written to OUT/policy (with its `online.csv`) after
every run, and its metadata records the live seconds and updates it took.

    .venv/bin/python benchmarks/microservice_testbed_finetune.py \
        --policy agents/microservice_cores/policies/reclaimer-testbed --users 6,14 --seconds 300 --out runs/ft
then compare it with the baselines on fresh runs:
    .venv/bin/python benchmarks/microservice_testbed_compare.py \
        --agents reclaimer@runs/ft/policy,autoscale --users 6 --seconds 600 --out runs/ft-compare
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", default=str(ROOT / "agents/microservice_cores/policies/reclaimer-testbed"))
    ap.add_argument("--users", default="6,14", help="user levels, one live run each per round")
    ap.add_argument("--seconds", type=int, default=300, help="control seconds per run")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--updates-per-step", type=int, default=2)
    ap.add_argument("--start-after", type=int, default=100)
    ap.add_argument("--lr", type=float, default=None,
                    help="actor and critic learning rate while fine-tuning (default: the policy's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/ft")
    a = ap.parse_args(argv)

    from agents.microservice_cores.online import OnlineConfig, OnlineReclaimer
    from agents.microservice_cores.policy import ReclaimerPolicy
    from agents.report import writable_folder
    from samm.testbed.microservices.run import MicroservicesRunOptions, check_options, run_microservices

    # every refusal as one line before the output folder is made and the first run starts
    try:
        levels = [int(x) for x in a.users.split(",") if x]
    except ValueError as exc:
        ap.error(f"--users must be comma-separated whole numbers: {exc}")
    if a.rounds < 1 or not levels:  # no run: an empty finetune.json read as a finished fine-tune
        ap.error("--rounds must be at least 1 and --users name a level")
    try:
        for u in levels:
            check_options(MicroservicesRunOptions(agent="reclaimer-online", users=u, seconds=a.seconds))
        policy = ReclaimerPolicy.load(a.policy)
        cfg = OnlineConfig(updates_per_step=a.updates_per_step, start_after=a.start_after, lr=a.lr, seed=a.seed)
        out = writable_folder(Path(a.out).resolve())
    except (ValueError, OSError) as exc:
        ap.error(str(exc))
    logging.basicConfig(filename=str(out / "testbed.log"), level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    learner = OnlineReclaimer(policy, cfg, out=out)
    runs = []
    t0 = time.time()
    for r in range(a.rounds):
        for u in levels:
            o = MicroservicesRunOptions(agent="reclaimer-online", users=u, seconds=a.seconds,
                                        out_dir=str(out / f"round{r}-u{u}"), seed=a.seed + r, plots=False)
            res = run_microservices(o, controller=learner)
            s = res.summary
            row = {"round": r, "users": u, "mean_cores": s["total_cores"]["mean"],
                   "violation_rate": s["violation_rate"], "p99_mean_ms": s["p99_ms"].get("mean"),
                   "transitions": learner.transitions, "updates": learner.updates}
            runs.append(row)
            print(json.dumps(row), flush=True)
    meta = {"argv": sys.argv, "policy": a.policy, "wall_s": round(time.time() - t0, 1), "runs": runs,
            "finished_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}
    (out / "finetune.json").write_text(json.dumps(meta, indent=1, default=float))
    print(f"fine-tuned policy: {out / 'policy'} ({learner.transitions} live transitions, "
          f"{learner.updates} updates, {meta['wall_s']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
