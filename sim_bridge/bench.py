"""Throughput of the bridge against the same simulation stepped in a Java-only loop.

All loops run the same workload, config, seeds and action sequence in the same JVM, after the
same JIT warm-up, so their ratio is the bridge's overhead, not a difference in the simulated
work. `bridge` = one round trip per batched step over the gateway's raw-socket step channel +
decoding the packed reply; `with analyzer` adds the seven metrics for every env (what
`CloudSimVectorEnv.step` does); `py4j step` sends the same step as a Py4J call instead.
"""
from __future__ import annotations

import base64
import os
import platform
import struct
import time

import numpy as np

from samm.analyze import compute_metrics

from .batch import SimBatch
from .config import SimConfig
from .gateway import shared_gateway
from .workloads import Workload


def bench_actions(steps: int, n_envs: int, n_types: int, seed: int) -> np.ndarray:
    """Mostly-keep random per-type deltas: the fleet random-walks within its bounds."""
    rng = np.random.default_rng(seed)
    return rng.choice(np.array([-1, 0, 1], dtype=np.int8), p=[0.1, 0.8, 0.1], size=(steps, n_envs, n_types))


def python_loop(config: SimConfig, workload: Workload, n_envs: int, actions: np.ndarray, seed: int,
                analyze: bool = True, fast: bool = True) -> tuple[float, int]:
    batch = SimBatch(config, workload, n_envs, fast=fast)
    try:
        batch.reset(np.arange(n_envs), seed + np.arange(n_envs))
        ended = np.zeros(n_envs, dtype=np.int64)
        started = time.perf_counter()
        for step_actions in actions:
            s = batch.step(step_actions)
            if analyze:
                compute_metrics(s.raw, batch.fleet, warmup_s=config.warmup_s)
            done = np.nonzero(s.terminated)[0]
            if len(done):
                ended[done] += 1
                batch.reset(done, seed + done + n_envs * ended[done])
        return time.perf_counter() - started, len(actions) * n_envs
    finally:
        batch.close()


def java_loop(config: SimConfig, workload: Workload, n_envs: int, actions: np.ndarray, seed: int) -> tuple[float, int]:
    gw = shared_gateway()
    wid = gw.call("loadWorkload", bytearray(workload.pack()))
    try:
        reply = gw.call("benchJavaLoop", config.java_json(), wid, n_envs, len(actions),
                        bytearray(actions.astype(np.int8).tobytes()), int(seed))
    finally:
        gw.call("closeWorkload", wid)
    elapsed, env_steps = struct.unpack("<2d", base64.b64decode(reply))
    return elapsed, int(env_steps)


def run_bench(config: SimConfig, workload: Workload, n_envs: int, steps: int, seed: int = 0,
              warmup_steps: int = 1000, repeats: int = 3) -> dict:
    actions = bench_actions(steps, n_envs, config.n_types, seed)
    warm = bench_actions(warmup_steps, n_envs, config.n_types, seed + 1)
    python_loop(config, workload, n_envs, warm, seed)
    java_loop(config, workload, n_envs, warm, seed)
    py_rates, env_rates, java_rates, py4j_rates = [], [], [], []
    for _ in range(repeats):  # interleaved, so drift on the machine hits all alike
        t, n = java_loop(config, workload, n_envs, actions, seed)
        java_rates.append(n / t)
        t, n = python_loop(config, workload, n_envs, actions, seed, analyze=False)
        py_rates.append(n / t)
        t, n = python_loop(config, workload, n_envs, actions, seed, analyze=True)
        env_rates.append(n / t)
        t, n = python_loop(config, workload, n_envs, actions, seed, analyze=False, fast=False)
        py4j_rates.append(n / t)
    bridge, java, env = float(np.median(py_rates)), float(np.median(java_rates)), float(np.median(env_rates))
    return {
        "workload": workload.name,
        "envs": n_envs,
        "steps_per_env": steps,
        "repeats": repeats,
        "bridge_env_steps_per_s": round(bridge, 1),
        "java_only_env_steps_per_s": round(java, 1),
        "bridge_over_java": round(bridge / java, 3),
        "with_analyzer_env_steps_per_s": round(env, 1),
        "py4j_step_env_steps_per_s": round(float(np.median(py4j_rates)), 1),
        "with_analyzer_over_java": round(env / java, 3),
        "bridge_runs": [round(x, 1) for x in py_rates],
        "with_analyzer_runs": [round(x, 1) for x in env_rates],
        "java_runs": [round(x, 1) for x in java_rates],
        "threads": config.threads,
        "machine": f"{platform.machine()} cpus={os.cpu_count()}",
    }
