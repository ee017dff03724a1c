"""Where a Reclaimer policy puts its cores, service by service, at one load (docs/microservice-cores.md,
"Where the entropy is measured"): the deterministic policy steps the simulator env for 300 s at the
given users; over the last 200 s it prints each service's cap, mean cores, mean cores used, action a
(on the policy's action space) and the actor's σ of u. A policy with a headroom ceiling acts under
it (a windowed one with its memory, as in `samm experiment reclaimer`) unless --no-ceiling.

    .venv/bin/python benchmarks/reclaimer_per_service.py --app hotel --users 500 [--policy DIR] [--seed 3] [--no-ceiling]
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.microservice_cores.env import MicroserviceCoresEnv  # noqa: E402
from agents.microservice_cores.features import ROW, USED_COLUMN  # noqa: E402
from agents.microservice_cores.policy import SHIPPED_DIR, ReclaimerPolicy  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--app", default="hotel")
    ap.add_argument("--users", type=float, default=500.0)
    ap.add_argument("--policy", default=None, help="a saved policy (default: the shipped one of --app)")
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--no-ceiling", action="store_true", help="the policy's weights without its headroom ceiling")
    a = ap.parse_args(argv)
    if not (math.isfinite(a.users) and a.users >= 0):  # else the env's traceback after loading the policy
        ap.error(f"--users must be a user count >= 0, not {a.users:g}")
    try:  # a missing policy (or --app without a shipped one) as one line
        pol = ReclaimerPolicy.load(a.policy or SHIPPED_DIR / f"reclaimer-{a.app}")
    except (ValueError, OSError) as exc:
        ap.error(str(exc))
    if a.no_ceiling:
        pol = pol.with_ceiling(None)
    # the policy turns its action into cores as `samm experiment reclaimer` does (ReclaimerPolicy.cores,
    # a windowed ceiling with its memory of earlier seconds); the env, which applies only a memoryless
    # ceiling and refused the shipped Hotel policy's windowed one, steps those cores on its "cap" space
    env = MicroserviceCoresEnv(a.app, k=pol.cfg.k, id_width=pol.cfg.id_width, observe_queue=pol.cfg.observe_queue)
    obs, _ = env.reset(seed=a.seed, options={"users": a.users})
    means, sigmas, cores, used, violations, memory = [], [], [], [], 0, None
    for _ in range(300):
        with torch.no_grad():
            mu, log_std = pol.agent.actor(pol.agent.norm(torch.as_tensor(obs[None], dtype=torch.float32)))
        act = torch.sigmoid(mu)[0].numpy()
        memory = pol.remember(memory, obs[None])
        c = pol.cores(act, obs, memory)
        means.append(act), sigmas.append(log_std.exp()[0].numpy()), cores.append(c)
        obs, _, _, _, info = env.step(c / env.topo.caps)
        used.append(obs[:, (env.k - 1) * ROW + USED_COLUMN] * env.topo.caps)   # the second just run
        violations += info["violated"]
    act, sig, c, u = (np.array(x[100:]) for x in (means, sigmas, cores, used))
    print(f"{a.app}, {a.users:g} users, seed {a.seed}: {c.sum(axis=1).mean():.3f} mean cores over the last 200 s, "
          f"{violations} violating seconds in 300")
    print(f"{'service':<22}{'cap':>6}{'cores':>8}{'used':>8}{'a':>7}{'sigma_u':>9}")
    for i, name in enumerate(env.topo.service_names):
        print(f"{name:<22}{env.topo.caps[i]:>6.2f}{c[:, i].mean():>8.3f}{u[:, i].mean():>8.3f}{act[:, i].mean():>7.3f}"
              f"{sig[:, i].mean():>9.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
