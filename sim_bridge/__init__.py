"""Python side of the simulator bridge: the JVM gateway, batched simulations, workloads and
Gymnasium environments over CloudSim Plus."""
from __future__ import annotations

import gymnasium as gym

ENV_ID = "samm/CloudSim-v0"


def register_envs() -> None:
    if ENV_ID not in gym.registry:
        gym.register(
            id=ENV_ID,
            entry_point="sim_bridge.envs:CloudSimEnv",
            vector_entry_point="sim_bridge.envs:CloudSimVectorEnv",
        )


register_envs()
