"""Train the LSTM-PPO agent in the CloudSim Plus simulation and save it as a policy directory."""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

import numpy as np

from samm.analyze import OBSERVATION_NAMES
from sim_bridge.config import SimConfig
from sim_bridge.envs import CloudSimVectorEnv
from sim_bridge.workloads import Workload

from .ppo.agent import LstmPpoAgent
from .ppo.config import PPOConfig
from .ppo.normalize import RunningMeanStd
from .ppo.train import train

POLICY_SUBDIR = "policy"


def train_lstm_ppo(sim: SimConfig, workload: Workload, ppo: PPOConfig, out_dir: str | Path,
                   resume: bool = False, progress: bool = True, eval_seeds=(), command: str | None = None,
                   on_eval=None) -> tuple[LstmPpoAgent, dict]:
    """Trains, saves `<out_dir>/policy` (the agent) and returns it with a summary. Training
    episodes are truncated at `ppo.max_episode_steps` (bootstrapped, not terminal)."""
    out = Path(out_dir)
    train_sim = sim.model_copy(update={"max_steps": ppo.max_episode_steps})
    type_names = tuple(t.name for t in sim.vm_types)
    evals: list[dict] = []
    best: dict = {}

    def make_envs(n: int, seed: int):
        return CloudSimVectorEnv(n, train_sim, workload)

    def on_update(update: int, net, obs_rms):
        if not eval_seeds or not ppo.eval_every or update % ppo.eval_every:
            return False
        from .evaluate import evaluate

        agent = LstmPpoAgent(OBSERVATION_NAMES, sim.action_mode, type_names, net=net, obs_rms=obs_rms,
                             params={"lstm_hidden": ppo.lstm_hidden})
        res = evaluate(agent, sim, workload, eval_seeds)
        net.train()
        row = {"update": update, "total_cost": res["summary"]["total_cost"]["mean"],
               "makespan_s": res["summary"]["makespan_s"]["mean"]}
        evals.append(row)
        if not best or row["total_cost"] < best["total_cost"]:
            # the normaliser keeps moving after this update: keep the statistics the snapshot
            # was evaluated with, or the saved policy is not the one that scored best
            best.update(row, state={k: v.detach().clone() for k, v in net.state_dict().items()},
                        obs_rms=None if obs_rms is None else RunningMeanStd.from_dict(obs_rms.to_dict()))
        return bool(on_eval and on_eval(row))

    result = train(ppo, make_envs, out, resume=resume, progress=progress, on_update=on_update)
    net, obs_rms = result.net, result.obs_rms
    if best:  # keep the best evaluated snapshot, not merely the last one
        net.load_state_dict(best["state"])
        obs_rms = best["obs_rms"]
    agent = LstmPpoAgent(
        OBSERVATION_NAMES, sim.action_mode, type_names, net=net, obs_rms=obs_rms,
        params={"lstm_hidden": ppo.lstm_hidden},
        env_config_hash=sim.config_hash(),
        training={
            "command": command or " ".join(shlex.quote(a) for a in sys.argv),
            "workload": workload.name,
            "workload_digest": workload.digest(),
            "sim_config": sim.model_dump(mode="json"),
            "ppo": ppo.to_dict(),
            "global_step": result.global_step,
            "wall_seconds": round(result.wall_seconds, 1),
            "episodes": len(result.episodes),
            "evaluations": evals,
            "selected_update": best.get("update"),
        },
    )
    agent.save(out / POLICY_SUBDIR)
    summary = {
        "global_step": result.global_step,
        "wall_seconds": round(result.wall_seconds, 1),
        "env_steps_per_second": round(result.global_step / max(result.wall_seconds, 1e-9), 1),
        "final_episode_return": float(np.mean([e["return"] for e in result.episodes[-20:]])) if result.episodes else None,
        "evaluations": evals,
        "selected_update": best.get("update"),
        "policy_dir": str(out / POLICY_SUBDIR),
    }
    return agent, summary
