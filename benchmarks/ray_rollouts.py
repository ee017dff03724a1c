"""Env-steps/s of the whole LSTM-PPO training loop with the simulations in this process and on
1, 2, ... Ray rollout workers (`sim_bridge.ray_batch`), same seeds, same config, one run.

    .venv/bin/python benchmarks/ray_rollouts.py --workers 0,1,2 --envs 8 --timesteps 40960 --json

`0` is the single-process path (one `SimBatch` on this process's JVM). Each case builds its
environments (Ray actors and their JVMs) outside the timer, as `agents.ppo.train` does; the
figure is `global_step / wall_seconds` of `train`. Every case must reach the same final losses
as the single-process run (the same seeds give the same run): the script says when one does not.
Ray runs a local cluster in this process (`--ray local`) unless `--address` is given.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def run_case(workers: int, envs: int, timesteps: int, seed: int) -> dict:
    from agents.ppo.config import PPOConfig
    from agents.ppo.train import train
    from sim_bridge.config import SimConfig
    from sim_bridge.envs import CloudSimVectorEnv
    from sim_bridge.ray_batch import ray_batch_factory
    from sim_bridge.workloads import seed_1551

    ppo = PPOConfig(num_envs=envs, num_steps=128, bptt_chunk=16, num_minibatches=4, update_epochs=4,
                    total_timesteps=timesteps, device="cpu", seed=seed, checkpoint_every=10**9).validate()
    sim = SimConfig().model_copy(update={"max_steps": ppo.max_episode_steps})
    factory = ray_batch_factory(workers) if workers else None
    res = train(ppo, lambda n, s: CloudSimVectorEnv(n, sim, seed_1551(), batch_factory=factory), progress=False)
    return {"workers": workers, "envs": envs, "global_step": res.global_step, "wall_s": round(res.wall_seconds, 2),
            "env_steps_per_s": round(res.global_step / res.wall_seconds, 1),
            "final_pg_loss": res.history[-1]["pg_loss"], "final_v_loss": res.history[-1]["v_loss"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", default="0,1,2", help="comma-separated; 0 = no Ray")
    ap.add_argument("--envs", type=int, default=8)
    ap.add_argument("--timesteps", type=int, default=8 * 128 * 40)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--address", default="local", help="Ray: local (a cluster in this process), auto, or an address")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    try:
        cases = [int(w) for w in args.workers.split(",")]
    except ValueError:
        ap.error(f"--workers must be comma-separated whole numbers, got {args.workers!r}")
    if min(cases) < 0 or args.envs < 1 or args.timesteps < 1:
        ap.error("--workers must be >= 0, --envs and --timesteps >= 1")
    if max(cases) > args.envs:  # checked here, not after the earlier cases' minutes of work
        ap.error(f"--workers must be <= --envs ({args.envs}): a rollout worker holds at least one env, got {max(cases)}")
    if any(cases):
        from sim_bridge.ray_batch import connect

        connect(args.address)
    t0 = time.time()
    rows = [run_case(w, args.envs, args.timesteps, args.seed) for w in cases]
    base = next((r for r in rows if r["workers"] == 0), rows[0])
    for r in rows:
        r["ratio_to_single_process"] = round(r["env_steps_per_s"] / base["env_steps_per_s"], 3)
        r["same_run_as_single_process"] = (r["final_pg_loss"], r["final_v_loss"]) == (base["final_pg_loss"],
                                                                                       base["final_v_loss"])
        print(f"workers {r['workers']}: {r['env_steps_per_s']:>8.1f} env-steps/s  x{r['ratio_to_single_process']:.3f}  "
              f"same run: {r['same_run_as_single_process']}", file=sys.stderr)
    if args.json:
        print(json.dumps({"command": "python " + " ".join(sys.argv), "rows": rows, "total_s": round(time.time() - t0, 1),
                          "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                      "load_after": os.getloadavg()}}))


if __name__ == "__main__":
    main()
