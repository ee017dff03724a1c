"""A small saved Reclaimer policy (chain3, 16 hidden units, seed 0) for tests of the commands that
read one; saved in a second or so."""
from __future__ import annotations

from pathlib import Path


def tiny_reclaimer_policy(tmp_path: Path, name: str = "p") -> Path:
    import torch

    from agents.microservice_cores.features import ROW
    from agents.microservice_cores.policy import ReclaimerPolicy
    from agents.microservice_cores.sac import Sac
    from agents.microservice_cores.topology import load_topology
    from agents.microservice_cores.train import scaled_schedule, sim_config

    topo = load_topology("chain3")
    cfg = scaled_schedule(sim_config(n_envs=2, hidden=16), 1200)
    torch.manual_seed(0)
    sac = Sac(cfg.k * ROW + topo.n_services, cfg.k * ROW, topo.n_services, cfg)
    ReclaimerPolicy(sac, topo, cfg, version="test-1").save(tmp_path / name)
    return tmp_path / name
