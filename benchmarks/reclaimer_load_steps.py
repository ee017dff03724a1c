"""What a jump of the load does to each controller (docs/microservice-cores.md, "A ceiling that
yields to latency"): the experiment's episodes keep their users for all 300 s, as the paper's do, so
they never ask how a controller follows a change. Here every episode starts at one of the app's
three load levels and jumps to another before second `--at`: low to middle, low to high, middle to
high, high to low. Per jump and method: mean cores over the episode, violating seconds in all and in
the 30 s after the jump. `--ramp S` spreads each change evenly over S seconds instead (a ramp of the
load, as a day's rise and fall; the count after it then covers the ramp and the 30 s after it).
`--floor` adds, per policy, "NAME+caps-after": the policy until the change and every service at its
cap from the second after the change begins, the best any controller can do once it has seen the
change (what is left is the price of the headroom it did not hold before).

    .venv/bin/python benchmarks/reclaimer_load_steps.py --app hotel --seeds 701-720
    .venv/bin/python benchmarks/reclaimer_load_steps.py --app hotel --policy candidate=DIR --policy shipped=DIR2

Methods: each `--policy NAME=DIR` (default: the shipped policy as "reclaimer"), each policy's weights
without its ceiling ("NAME-no-ceiling", when it has one; once for policies that share their weights),
and AutoScale.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.microservice_cores.autoscale import AutoScale  # noqa: E402
from agents.microservice_cores.episode import run_episodes  # noqa: E402
from agents.microservice_cores.experiment import FULL, levels  # noqa: E402
from agents.microservice_cores.policy import ReclaimerPolicy, shipped_policy  # noqa: E402
from agents.report import writable_folder  # noqa: E402
from samm.cli.seeds import parse_seeds  # noqa: E402

#: seconds after the jump counted apart (the controller's reaction)
AFTER_S = 30
#: the first seconds from the jump counted one by one (which second breaks QoS)
BY_SECOND = 5


class CapsAfter:
    """A batch controller's cores until control second `t` (counted from the first act after the
    warm-up), every service's cap from then on: the reaction floor of `--floor`."""

    def __init__(self, inner, t: int, caps, name: str):
        self.inner, self.t, self.caps, self.name = inner, int(t), np.asarray(caps, dtype=np.float64), name

    def reset(self, limits) -> None:
        self.second = 0
        self.inner.reset(limits)

    def observe_block(self, st) -> None:
        self.inner.observe_block(st)

    def act_block(self, st) -> np.ndarray:
        cores = self.inner.act_block(st)           # the policy keeps its memory of every second
        second, self.second = self.second, self.second + 1
        return np.broadcast_to(self.caps, cores.shape).copy() if second >= self.t else cores


def jumps_of(topo) -> list[tuple[float, float]]:
    lo, mid, hi = levels(topo, FULL.level_fractions)
    return [(lo, mid), (lo, hi), (mid, hi), (hi, lo)]


def weights_key(pol: ReclaimerPolicy) -> str:
    """A digest of the policy's weights: equal for the same weights under any ceiling or version
    (policies saved before training sets a version are all "unversioned")."""
    digest = hashlib.sha256()
    for name, tensor in pol.agent.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().float().numpy().tobytes())
    return digest.hexdigest()


def methods_of(policies: dict[str, ReclaimerPolicy], floor_at: int | None = None) -> dict:
    """name -> (batch controller factory or None, per-copy controller factory or None); with
    `floor_at` (the change's first second) also each policy's reaction floor (`CapsAfter`)."""
    out, weights = {}, set()
    for name, pol in policies.items():
        out[name] = (pol.batch, None)
        if floor_at is not None:
            out[f"{name}+caps-after"] = (lambda pol=pol, n=f"{name}+caps-after":
                                         CapsAfter(pol.batch(), floor_at + 1, pol.topo.caps, n), None)
        key = weights_key(pol)
        if pol.ceiling is not None and key not in weights:     # the same weights under two ceilings: once
            weights.add(key)
            raw = pol.with_ceiling(None)
            out[f"{name}-no-ceiling"] = (raw.batch, None)
    out["autoscale"] = (None, lambda i: AutoScale())
    return out


def run(topo, methods: dict, seeds, at: int, jumps=None, ramp: int = 0) -> list[dict]:
    rows = []
    after = slice(at, at + max(ramp, 1) - 1 + AFTER_S)
    for u0, u1 in jumps or jumps_of(topo):
        for name, (batch, make) in methods.items():
            eps = run_episodes(topo, make, u0, seeds, batch=batch() if batch else None,
                               load_step=(at, u1, max(ramp, 1)), method=name)
            viol = np.array([e.violations for e in eps])            # (seeds, steps)
            rows.append({"from": u0, "to": u1, "method": name, "mean_cores": float(np.mean([e.mean_cores for e in eps])),
                         "violating_s": int(viol.sum()), "violating_s_after_jump": int(viol[:, after].sum()),
                         "violating_s_by_second": viol[:, at:at + BY_SECOND].sum(axis=0).tolist(),
                         "seconds": int(viol.size), "ramp_s": ramp})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--app", default="hotel")
    ap.add_argument("--policy", action="append", default=[], metavar="NAME=DIR",
                    help="a saved Reclaimer policy for the app (repeatable; default: the shipped one)")
    ap.add_argument("--seeds", default="701-720", help="episode seeds (default: %(default)s)")
    ap.add_argument("--at", type=int, default=100, help="the control second of the jump (default: %(default)s)")
    ap.add_argument("--ramp", type=int, default=0, help="spread each change over this many seconds (default 0: a jump)")
    ap.add_argument("--floor", action="store_true",
                    help="also run each policy with every service at its cap from the second after the change")
    ap.add_argument("--json", default=None, help="also write the rows here")
    a = ap.parse_args(argv)
    try:
        seeds = parse_seeds(a.seeds)
        policies = {}
        for spec in a.policy:
            name, sep, d = spec.partition("=")
            if not sep or not name or not d:
                raise ValueError(f"--policy takes NAME=DIR, not {spec!r}")
            policies[name] = ReclaimerPolicy.load(d)
        if not policies:
            policies["reclaimer"] = shipped_policy(a.app)
        topo = next(iter(policies.values())).topo
        if topo.name != a.app or any(p.topo.name != topo.name for p in policies.values()):
            raise ValueError(f"every --policy must be for {a.app!r}")
        if not 0 <= a.at < 300 or not 0 <= a.ramp <= 300 - a.at:
            raise ValueError("--at and --at + --ramp must lie in the 300 control seconds")
        if a.json:  # before the work: a path that cannot take the file failed only at the end, losing it
            writable_folder(Path(a.json).parent)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    rows = run(topo, methods_of(policies, floor_at=a.at if a.floor else None), seeds, a.at, ramp=a.ramp)
    change = f"jump before second {a.at}" if a.ramp <= 1 else f"ramp over seconds {a.at}-{a.at + a.ramp - 1}"
    print(f"{topo.name}, seeds {seeds[0]}..{seeds[-1]} ({len(seeds)}), {change} of 300, "
          f"{time.perf_counter() - t0:.0f} s")
    print(f"| users | method | mean cores | violating seconds | in the {'ramp and the ' if a.ramp > 1 else ''}30 s after it "
          f"| in its first {BY_SECOND} s, one by one |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['from']:g} → {r['to']:g} | {r['method']} | {r['mean_cores']:.3f} | {r['violating_s']} of "
              f"{r['seconds']:,} | {r['violating_s_after_jump']} | {' '.join(map(str, r['violating_s_by_second']))} |")
    if a.json:
        Path(a.json).write_text(json.dumps({"app": topo.name, "seeds": list(seeds), "at": a.at, "ramp_s": a.ramp, "rows": rows,
                                            "versions": {n: p.version for n, p in policies.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
