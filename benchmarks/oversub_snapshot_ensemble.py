"""Do C2MARL's last checkpoints, acting together, hold α's level on held-apart weeks more often than
one of them? (docs/oversubscription.md, "Snapshot ensembles of the last checkpoints")

Session 52 found the checkpoints of one run differ on the test weeks as much as seeds do, and no
validation week tells them apart. This script rolls an ensemble of a `--validate-every` run's last K
checkpoints (`checkpoints/episode-E`) out on the experiment's held-apart test episodes, beside the
last weights alone (the paper's policy), in the same run. How the members act together (`--how`;
`network.vote`, as `python -m agents.oversubscription.train --ensemble K` keeps them):

    median   each agent takes the median of the members' greedy rates (a vote)
    upper-quartile  the members' 75th-percentile rate (the 4th of 5), between median and max
    mean-q   each agent's action maximises the members' mean Q^i (a snapshot ensemble)
    max      each agent takes the highest (safest) of the members' greedy rates

    .venv/bin/python benchmarks/oversub_snapshot_ensemble.py --runs DIR [DIR ...] --last 5 \
        --how mean-q,median,max --test-episodes 300

One JSON line per run and method: PM-Hot-R, S-Cores, whether α's level holds, and the ratio of
S-Cores to the last weights'.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def ensemble_policy(members, how: str):
    """The members' nets as one OversubPolicy voting by `how` (network.vote), as `--ensemble` trains it."""
    from agents.oversubscription.network import C2MarlEnsemble
    from agents.oversubscription.policy import OversubPolicy

    first = members[0]
    return OversubPolicy(C2MarlEnsemble([m.net for m in members], how), first.setting, features=first.features,
                         shield=first.shield)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", nargs="+", required=True, help="training --out folders with a checkpoints/ folder")
    p.add_argument("--last", type=int, default=5, help="ensemble the last K checkpoints (the last weights included)")
    p.add_argument("--how", default=None,
                   help="comma-separated votes, of median, p60, upper-quartile, mean-q, max (default: every one)")
    p.add_argument("--test-episodes", type=int, default=300)
    p.add_argument("--threads", type=int, default=1, help="torch threads (one per process)")
    args = p.parse_args(argv)
    # torch and the simulator load here, after the arguments: --help and a usage error took 6 s
    import torch

    from agents.oversubscription.data import generate_trace
    from agents.oversubscription.experiment import held_apart_episodes, test_specs
    from agents.oversubscription.metrics import satisfied, summarise
    from agents.oversubscription.network import VOTES
    from agents.oversubscription.train import roll_out

    hows = list(VOTES) if args.how is None else args.how.split(",")
    if args.last < 1 or args.test_episodes < 1 or not set(hows) <= set(VOTES):
        p.error(f"--last and --test-episodes must be >= 1, --how of {VOTES}")
    torch.set_num_threads(max(1, args.threads))
    # every run's checkpoints are loaded and checked before the first run is tested: a run with too
    # few of them, or whose last one is not its last weights, failed after the earlier runs' minutes
    loaded = []
    for run in (Path(r) for r in args.runs):
        members = _members(run, args.last)
        if isinstance(members, str):
            print(f"error: {members}", file=sys.stderr)
            return 2
        loaded.append((run, *members))
    for run, episodes, members in loaded:
        last = members[-1]
        t = last.training
        setting, warm, alpha = last.setting, bool(t["warm"]), float(t["config"]["alpha"])
        trace = generate_trace(setting, t["trace_seed"])
        specs = test_specs(trace, args.test_episodes, warm)
        results = {}
        for how in ["last"] + hows:
            fn = last.rates if how == "last" else ensemble_policy(members, how).rates
            m = summarise(list(roll_out(fn, setting, held_apart_episodes(trace, specs, warm), warm)),
                          setting.delta_steps)
            results[how] = m
            print(json.dumps({
                "run": run.name, "how": how, "members": episodes if how != "last" else [t["episodes"]],
                "alpha": alpha, "test_episodes": args.test_episodes,
                "pm_hot_r": round(m["pm_hot_r"], 4), "s_cores": round(m["s_cores"], 4),
                "satisfied": satisfied(m["pm_hot_r"], alpha),
                "s_cores_vs_last": round(m["s_cores"] / results["last"]["s_cores"], 3)
                if results["last"]["s_cores"] > 0 else None}), flush=True)
    return 0


def _members(run: Path, last: int):
    """(episodes, policies) of the run's last `last` checkpoints, or why they cannot be ensembled."""
    from agents.oversubscription.policy import OversubPolicy
    from agents.oversubscription.train import saved_checkpoints

    saved = saved_checkpoints(run)
    if len(saved) < last:
        return f"{run} has {len(saved)} checkpoints/episode-E folders, fewer than --last {last}"
    try:
        members = [OversubPolicy.load(d) for _, d in saved[-last:]]
    except (ValueError, OSError) as e:
        return str(e)
    t = members[-1].training
    if t.get("checkpoint_episode") != t.get("episodes"):
        return f"{saved[-1][1]} is not the run's last weights"
    return [e for e, _ in saved[-last:]], members

if __name__ == "__main__":
    raise SystemExit(main())
