"""Reproducibility regressions found by the determinism audit: "every simulation and training run
takes a seed and is reproducible", also across processes (PYTHONHASHSEED differs from one process to
the next unless pinned, so nothing a run writes may depend on the iteration order of a set of str)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HASH_SEEDS = ("0", "1", "2")


def _run_with_hash_seeds(code: str, seeds=HASH_SEEDS, timeout: float = 120.0) -> list[str]:
    """stdout of `code` run in a fresh interpreter under each PYTHONHASHSEED."""
    outs = []
    for hs in seeds:
        env = {**os.environ, "PYTHONHASHSEED": hs, "OMP_NUM_THREADS": "1"}
        res = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=timeout)
        assert res.returncode == 0, res.stderr[-2000:]
        outs.append(res.stdout.strip().splitlines()[-1])
    return outs


# --- deferrable jobs: the experiment summary's method order -------------------------------------------
_OSDEC_SUMMARY = """
    import json
    from agents.deferrable_jobs.experiment import METRICS, QUICK, _summarise

    settings, variants = ("tiny", "default"), ("reinforce", "ppo", "pointer", "osdec")
    runs = [{"setting": st, "variant": v, "seed": s, "train_seconds": 1.0, "steps": 8,
             **{k: float(i + s) for i, k in enumerate(METRICS)}}
            for st in settings for v in variants for s in (1, 2)]
    heur = {st: {"fifo": {"params": {}, **{k: 0.5 for k in METRICS}}} for st in settings}
    summary = _summarise(runs, heur, QUICK, "tiny", [], 0.0, True)
    print(json.dumps(list(summary["methods"])))
"""


def test_osdec_summary_method_order_is_the_same_in_every_process():
    outs = _run_with_hash_seeds(_OSDEC_SUMMARY)
    assert len(set(outs)) == 1, outs
    # the runs' own order (heuristics first), not a set's
    assert json.loads(outs[0]) == ["tiny/fifo", "default/fifo"] + [
        f"{st}/{v}" for st in ("tiny", "default") for v in ("reinforce", "ppo", "pointer", "osdec")]


# --- lra placement: the scorer's initial weights ------------------------------------------------------
def test_lra_scorer_init_does_not_depend_on_torch_threads():
    """nn.init.orthogonal_ runs a QR whose last bits follow torch's thread count (MKL), so a seed gave
    other weights (and another trained policy) on 2 threads than under OMP_NUM_THREADS=1."""
    import torch

    from agents.lra_placement.reinforce import ReinforceConfig, new_scorer

    config = ReinforceConfig().scorer_config(7)
    before = torch.get_num_threads()
    weights = {}
    try:
        for n in (1, 2, 4):
            torch.set_num_threads(n)
            weights[n] = {k: v.clone() for k, v in new_scorer(config, 3).state_dict().items()}
            assert torch.get_num_threads() == n          # the caller's thread count is left alone
    finally:
        torch.set_num_threads(before)
    for n in (2, 4):
        for k in weights[1]:
            assert torch.equal(weights[1][k], weights[n][k]), (n, k)
    assert not torch.equal(new_scorer(config, 3).state_dict()["hidden.0.weight"],
                           new_scorer(config, 4).state_dict()["hidden.0.weight"])


# --- autoscaling: sampled actions follow the episode's seed, not its batch ----------------------------
def _episode_key(ep: dict) -> tuple:
    return ep["seed"], ep["steps"], ep["total_cost"], ep["vm_cost"], ep["jobs_finished"]


def test_sampling_agents_replay_an_episode_alone_as_in_a_batch():
    """`samm evaluate --stochastic --seeds 3` and `--seeds 1-3` gave seed 3 other costs: the stochastic
    LSTM-PPO policy (and the random agent) drew every row from one shared stream."""
    from agents.factory import make_agent
    from sim_bridge.config import SimConfig
    from sim_bridge.runner import run_episodes
    from sim_bridge.workloads import load_workload

    sim = SimConfig(max_steps=40)
    wl = load_workload("seed-1551")
    for kind in ("lstm-ppo", "random"):
        agent = make_agent(kind, sim)
        many = run_episodes(sim, wl, agent, [1, 2, 3], deterministic=False)
        alone = run_episodes(sim, wl, agent, [3], deterministic=False)      # the same agent object again
        other_order = run_episodes(sim, wl, make_agent(kind, sim), [3, 1], deterministic=False)
        assert _episode_key(alone[0]) == _episode_key(many[2]) == _episode_key(other_order[0]), kind
        assert _episode_key(other_order[1]) == _episode_key(many[0]), kind
        assert len({ep["total_cost"] for ep in many}) > 1, kind              # the seeds still differ
        # outside run_episodes the agent samples from its one stream as before
        assert getattr(agent, "_row_rngs", None) is None and getattr(agent, "_row_seeds", None) is None


# --- every Python simulator: one seed, one stream, in any process --------------------------------------
_ENV_STREAMS = """
    import hashlib, json
    import numpy as np

    def digest(env, seed, steps):
        m = hashlib.sha256()
        def feed(o):
            if isinstance(o, dict):
                for k in sorted(o):
                    if k != "episode_record":
                        m.update(str(k).encode()); feed(o[k])
            elif isinstance(o, (list, tuple)):
                for x in o: feed(x)
            elif isinstance(o, np.ndarray): m.update(np.ascontiguousarray(o).tobytes())
            else: m.update(repr(o).encode())
        rng = np.random.default_rng(0)
        space = env.action_space
        obs, info = env.reset(seed=seed); feed((obs, info))
        for _ in range(steps):
            if hasattr(space, "n"):
                allowed = np.flatnonzero(info["action_mask"])
                a = int(allowed[rng.integers(len(allowed))])
            elif hasattr(space, "nvec"):
                a = rng.integers(0, space.nvec)
            else:
                a = rng.uniform(space.low, space.high).astype(space.dtype)
            obs, r, term, trunc, info = env.step(a); feed((obs, r, term, trunc, info))
            if term or trunc:
                obs, info = env.reset(); feed((obs, info))
        return m.hexdigest()[:16]

    from agents.deferrable_jobs.env import DeferrableJobsEnv
    from agents.lra_placement.env import LraPlacementEnv
    from agents.microservice_cores.env import MicroserviceCoresEnv
    from agents.oversubscription.env import OversubscriptionEnv
    makers = {"lra": (LraPlacementEnv, 30), "deferrable": (lambda: DeferrableJobsEnv("tiny"), 20),
              "microservice": (lambda: MicroserviceCoresEnv("chain3", warmup=3, episode_steps=8), 12),
              "oversub": (lambda: OversubscriptionEnv("tiny", split="test"), 6)}
    print(json.dumps({k: [digest(make(), s, n) for s in (1, 2)] for k, (make, n) in makers.items()}))
"""


def test_env_streams_are_the_same_in_every_process_and_differ_by_seed():
    """The four Gymnasium envs under a fixed action sequence (reset(seed) then autoresets): the same
    observation/reward/info stream in two interpreters with other PYTHONHASHSEEDs; seeds 1 and 2 differ."""
    outs = _run_with_hash_seeds(_ENV_STREAMS, seeds=("0", "1"))
    assert outs[0] == outs[1], outs
    for name, (one, two) in json.loads(outs[0]).items():
        assert one != two, name
