"""An install without the `train` extra (no torch) runs the rule agents; a learned agent's loop
stops in one line naming the extra. The registry imported the PPO agent with every lookup, so
`samm run` with a threshold agent stopped with a ModuleNotFoundError traceback, restarted by systemd."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "deploy/configs/samm.example.yaml"

NO_TORCH = """
import sys; sys.modules['torch'] = None   # as an install without the train extra
from samm.config import load_config
from samm.daemon.build import ConfigurationProblem, make_daemon_agent
try:
    agent = make_daemon_agent(load_config({path!r}, environ={{}}).control_loops()[0])
    print("agent", type(agent).__name__)
except ConfigurationProblem as e:
    print("problem", e)
"""


def _daemon_agent_without_torch(tmp_path, name: str) -> subprocess.CompletedProcess:
    p = tmp_path / f"{name}.yaml"
    text = EXAMPLE.read_text()
    assert "  name: lstm-ppo " in text
    p.write_text(text.replace("  name: lstm-ppo ", f"  name: {name} "))
    return subprocess.run([sys.executable, "-c", NO_TORCH.format(path=str(p))], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)


def test_a_rule_agent_runs_on_an_install_without_torch(tmp_path):
    proc = _daemon_agent_without_torch(tmp_path, "threshold")
    assert proc.returncode == 0 and proc.stdout.strip() == "agent ThresholdAgent", proc.stderr[-2000:]


def test_a_learned_agent_without_torch_is_one_line_naming_the_extra(tmp_path):
    proc = _daemon_agent_without_torch(tmp_path, "lstm-ppo")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout.strip()
    assert out.startswith("problem loop ") and "needs PyTorch" in out and "samm[train]" in out
    assert "Traceback" not in proc.stderr


def test_a_broken_module_of_ours_is_not_taken_for_a_missing_extra(tmp_path):
    """Only torch's absence is the extra's; another import error of the PPO agent stays an error."""
    code = ("import sys; sys.modules['agents.ppo.network'] = None\n"
            "from agents.base import agent_kinds\nagent_kinds()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode != 0 and "agents.ppo.network" in proc.stderr
