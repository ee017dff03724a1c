"""Training throughput of SAMM's LSTM-PPO against sb3-contrib's RecurrentPPO, same run.

Both learn on the same CloudSim Plus environment (seed-1551, per-type actions, 8 envs stepped
through the same batched bridge), the same rollout size (8 envs × 128 steps), the same network
size (one LSTM layer of 128 cells, linear heads), 4 epochs, on the same machine, one after the
other. Reported: env-steps/s of the whole training loop (rollout + update) and the final mean
training episode return of each.

Both are timed alike: the JVM is started and warmed up (JIT) with random actions before either
run, torch's lazily imported optimizer machinery is loaded before either, and each learner's
environment is built outside its timer (SB3's model construction is outside too). Before this,
SAMM, run first, paid the JVM start, the cold JIT and a ~2 s import inside its timer.

    .venv/bin/pip install -e .[bench]
    .venv/bin/python benchmarks/train_throughput.py --timesteps 100000 --json
"""
from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np
import torch


class BatchedVecEnv:
    """SB3 VecEnv over `CloudSimVectorEnv` (one Py4J round trip per step for all envs), so both
    learners see the same bridge."""

    def __new__(cls, venv):
        from stable_baselines3.common.vec_env import VecEnv

        class _Adapter(VecEnv):
            def __init__(self, venv):
                self.venv = venv
                super().__init__(venv.num_envs, venv.single_observation_space, venv.single_action_space)
                self._actions = None

            def reset(self):
                obs, _ = self.venv.reset(seed=int(np.random.randint(2**31)))
                return obs

            def step_async(self, actions):
                self._actions = actions

            def step_wait(self):
                obs, rew, term, trunc, info = self.venv.step(self._actions)
                done = term | trunc
                infos = [{} for _ in range(self.num_envs)]
                for i in np.nonzero(done)[0]:
                    infos[i]["terminal_observation"] = info["final_obs"][i]
                    infos[i]["TimeLimit.truncated"] = bool(trunc[i] and not term[i])
                return obs, rew.astype(np.float32), done, infos

            def close(self):
                self.venv.close()

            def get_attr(self, name, indices=None):
                return [getattr(self.venv, name, None)] * self.num_envs

            def set_attr(self, name, value, indices=None):
                pass

            def env_method(self, method_name, *args, indices=None, **kwargs):
                return [None] * self.num_envs

            def env_is_wrapped(self, wrapper_class, indices=None):
                return [False] * self.num_envs

            def seed(self, seed=None):
                return [seed] * self.num_envs

        return _Adapter(venv)


def returns_of(episodes) -> float:
    return float(np.mean(episodes[-20:])) if episodes else float("nan")


def warm_up(steps: int = 1000) -> None:
    """Start the shared JVM and let its JIT compile the step path, and import what torch loads
    lazily at the first optimizer, so that neither timed run pays for them."""
    from sim_bridge.config import SimConfig
    from sim_bridge.envs import CloudSimVectorEnv

    torch.optim.Adam([torch.zeros(1, requires_grad=True)])
    env = CloudSimVectorEnv(8, SimConfig(action_mode="per-type", max_steps=400), "seed-1551")
    env.reset(seed=0)
    env.action_space.seed(0)
    for _ in range(steps):
        env.step(env.action_space.sample())
    env.close()


def run_samm(timesteps: int, seed: int) -> dict:
    from agents.ppo.config import PPOConfig
    from agents.ppo.train import train
    from sim_bridge.config import SimConfig
    from sim_bridge.envs import CloudSimVectorEnv

    sim = SimConfig(action_mode="per-type", max_steps=400)
    cfg = PPOConfig(total_timesteps=timesteps, seed=seed, num_envs=8, num_steps=128, update_epochs=4,
                    num_minibatches=4, initial_noop_prob=0.8)
    venv = CloudSimVectorEnv(cfg.num_envs, sim, "seed-1551")
    t = time.perf_counter()
    res = train(cfg, lambda n, s: venv, progress=False)
    wall = time.perf_counter() - t
    return {"env_steps": res.global_step, "wall_s": round(wall, 1), "env_steps_per_s": round(res.global_step / wall, 1),
            "final_return": round(returns_of([e["return"] for e in res.episodes]), 3)}


def run_sb3(timesteps: int, seed: int) -> dict:
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.callbacks import BaseCallback

    from sim_bridge.config import SimConfig
    from sim_bridge.envs import CloudSimVectorEnv

    sim = SimConfig(action_mode="per-type", max_steps=400)
    env = BatchedVecEnv(CloudSimVectorEnv(8, sim, "seed-1551"))
    episodes: list[float] = []

    class Track(BaseCallback):
        def __init__(self):
            super().__init__()
            self.acc = np.zeros(8)

        def _on_step(self):
            self.acc += self.locals["rewards"]
            for i in np.nonzero(self.locals["dones"])[0]:
                episodes.append(float(self.acc[i]))
                self.acc[i] = 0.0
            return True

    model = RecurrentPPO("MlpLstmPolicy", env, n_steps=128, batch_size=256, n_epochs=4, learning_rate=3e-4,
                         gamma=0.99, gae_lambda=0.95, ent_coef=0.01, seed=seed, device="cpu",
                         policy_kwargs={"lstm_hidden_size": 128, "n_lstm_layers": 1, "net_arch": [],
                                        "shared_lstm": True, "enable_critic_lstm": False})
    t = time.perf_counter()
    model.learn(total_timesteps=timesteps, callback=Track())
    wall = time.perf_counter() - t
    env.close()
    return {"env_steps": int(model.num_timesteps), "wall_s": round(wall, 1),
            "env_steps_per_s": round(model.num_timesteps / wall, 1), "final_return": round(returns_of(episodes), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timesteps", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    warm_up()
    samm = run_samm(args.timesteps, args.seed)
    sb3 = run_sb3(args.timesteps, args.seed)
    out = {"samm_lstm_ppo": samm, "sb3_recurrent_ppo": sb3,
           "throughput_ratio": round(samm["env_steps_per_s"] / sb3["env_steps_per_s"], 2),
           "timesteps": args.timesteps, "machine": f"{platform.machine()} cpus={torch.get_num_threads()}t"}
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
