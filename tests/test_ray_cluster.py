"""`samm train --ray ADDRESS` on a real two-node Ray cluster on loopback: `ray start --head`
and one worker node process, one CPU each, so the two rollout workers (one CPU each) must run
on different nodes. Slow: two raylets and two JVMs start."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e .[ray])")

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent
TINY_PPO = {"num_steps": 16, "bptt_chunk": 8, "num_minibatches": 2, "update_epochs": 2, "lstm_hidden": 16,
            "max_episode_steps": 40}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray(*args, check=True) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.run([str(BIN / "ray"), *args], env=env, capture_output=True, text=True, timeout=120, check=check)


@pytest.fixture
def two_node_cluster():
    port = _free_port()
    address = f"127.0.0.1:{port}"
    common = ["--node-ip-address=127.0.0.1", "--num-cpus=1", "--disable-usage-stats"]
    try:
        _ray("start", "--head", f"--port={port}", "--include-dashboard=false", *common)
        _ray("start", f"--address={address}", *common)
        yield address
    finally:
        _ray("stop", "--force", check=False)


def test_training_on_a_two_node_cluster(two_node_cluster, tmp_path):
    import ray

    def cmd(out: Path, *extra: str) -> list[str]:
        return [str(BIN / "samm"), "train", *extra, "--envs", "2", "--timesteps", "96", "--eval-every", "0",
                "--quiet", "--seed", "4", "--ppo", json.dumps(TINY_PPO), "--out", str(out)]

    out = tmp_path / "run"
    done = subprocess.run(cmd(out, "--ray", two_node_cluster, "--rollout-workers", "2"), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["global_step"] == 96 and summary["rollout_workers"] == 2 and summary["rollouts_discarded"] == 0
    meta = json.loads((out / "policy" / "metadata.json").read_text())
    assert meta["training"]["rollout_workers"] == 2

    ray.init(address=two_node_cluster)
    try:
        nodes = [n for n in ray.nodes() if n["Alive"]]
        assert len(nodes) == 2 and all(n["Resources"].get("CPU") == 1.0 for n in nodes)
    finally:
        ray.shutdown()

    # the same seed on one process gives the same run
    alone = subprocess.run(cmd(tmp_path / "alone"), capture_output=True, text=True, timeout=600)
    assert alone.returncode == 0, alone.stderr[-3000:]
    a = (tmp_path / "alone" / "progress.csv").read_text().splitlines()
    b = (out / "progress.csv").read_text().splitlines()
    col = a[0].split(",").index("pg_loss")
    assert [r.split(",")[col] for r in a[1:]] == [r.split(",")[col] for r in b[1:]]
    shutil.rmtree(tmp_path / "alone", ignore_errors=True)
