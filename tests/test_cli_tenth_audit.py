"""The command line, a tenth pass: Ctrl-C on the problem testbeds exits 130 like every other long
verb (it was click's "Aborted!", exit 1), a seed out of range is one line naming --seed, and a
placement batch larger than the evaluated cluster is refused instead of cut to its slots silently."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from samm.cli.main import cli
from test_problem_cli_audit import REFUSAL_TIMEOUT_S, _SilentEngine  # a Docker engine that never answers

REPO = Path(__file__).resolve().parents[1]


def _invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


# --- Ctrl-C on the microservice testbed ----------------------------------------------------------

def _start_samm(*args: str) -> subprocess.Popen:
    """`samm ARGS` in a process of its own, its output captured as text."""
    return subprocess.Popen([sys.executable, "-m", "samm.cli.main", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_microservices_interrupted_exits_130_naming_what_it_kept(tmp_path):
    """The testbed re-raised KeyboardInterrupt: click printed "Aborted!" and exited 1, the status
    of a failed run, where `samm train`, `samm testbed` and `samm demo` exit 130."""
    sock = Path("/tmp") / f"samm-tenth-{os.getpid()}.sock"   # AF_UNIX paths are short; tmp_path may not be
    sock.unlink(missing_ok=True)
    engine = _SilentEngine(sock)
    p = _start_samm("testbed-microservices", "--docker-host", f"unix://{sock}", "--seconds", "2", "--warmup", "0",
                    "--out", str(tmp_path / "run"))
    try:
        assert engine.connected.wait(REFUSAL_TIMEOUT_S), "the run never called the engine"
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=REFUSAL_TIMEOUT_S)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
        engine.close()
        sock.unlink(missing_ok=True)
    assert p.returncode == 130, err[-2000:]
    assert "interrupted" in err and "Aborted!" not in err and "Traceback" not in err, err[-2000:]


def test_oversub_interrupted_exits_130_and_writes_the_steps_run(tmp_path):
    """As the microservice testbed: "Aborted!" and exit 1 after the steps were written."""
    from samm.testbed.oversub.cgroups import unavailable_reason

    if unavailable_reason():
        pytest.skip(f"no writable cgroups: {unavailable_reason()}")
    out = tmp_path / "run"
    p = _start_samm("testbed-oversub", "--steps", "20", "--seconds-per-step", "5", "--pms", "1", "--max-vms", "4",
                    "--out", str(out))
    try:
        deadline = time.monotonic() + REFUSAL_TIMEOUT_S
        while not (out / "vms.log").exists() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert p.poll() is None, "the run ended before it was interrupted"
        time.sleep(3)  # into the steps (20 x 5 s: still running)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=REFUSAL_TIMEOUT_S)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 130, err[-2000:]
    assert "interrupted" in err and "Aborted!" not in err and "Traceback" not in err, err[-2000:]
    assert (out / "steps.csv").exists()


# --- seeds out of range ----------------------------------------------------------------------------

@pytest.mark.parametrize("seed", ["-1", str(2**32), str(10**23)])
def test_train_names_a_seed_out_of_range(tmp_path, seed):
    """"error: Seed must be between 0 and 2**32 - 1" and "error: Overflow when unpacking long long"
    (numpy's words) named no option."""
    res = _invoke("train", "--out", str(tmp_path / "run"), "--seed", seed, "--timesteps", "1")
    assert res.exit_code == 2 and "--seed" in res.output and seed in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1, res.output
    assert not (tmp_path / "run").exists()


# --- placement batches larger than the cluster --------------------------------------------------------

@pytest.mark.parametrize("args", [["--containers", "100"], ["--containers", "15-1000000"],
                                  ["--nodes", "2", "--containers", "17"]])
def test_evaluate_placement_refuses_a_batch_larger_than_the_cluster(args):
    """`--containers 100` on the 9 nodes (72 slots) evaluated batches of 72 and exited 0, as if 100
    had been placed."""
    res = _invoke("evaluate", "--problem", "lra-placement", "--agent", "greedy", "--predictor", "synthetic",
                  "--seeds", "1", *args)
    assert res.exit_code == 2 and "--containers" in res.output and "--nodes" in res.output, res.output
    assert "slots" in res.output and len(res.output.strip().splitlines()) == 1, res.output


def test_evaluate_placement_still_takes_a_batch_that_fills_the_cluster():
    res = _invoke("evaluate", "--problem", "lra-placement", "--agent", "greedy", "--predictor", "synthetic",
                  "--seeds", "1", "--nodes", "2", "--containers", "16", "--json")
    assert res.exit_code == 0, res.output
    assert '"containers": 16' in res.output


# --- `samm experiment c2marl --quick`: its budget's seeds ---------------------------------------------

def test_c2marl_quick_without_seeds_runs_the_quick_budgets_seeds(tmp_path):
    """The option's default 1-3 replaced the quick budget's seeds (1, 2): the smoke run trained a
    third of its runs more than --quick defines, as osdec's and reclaimer's --quick do not."""
    import json

    res = _invoke("experiment", "c2marl", "--out", str(tmp_path / "q"), "--quick", "--episodes", "2",
                  "--test-episodes", "1", "--held-apart-only", "--workers", "1", "--quiet", "--alphas", "0.95")
    assert res.exit_code == 0, res.output
    runs = json.loads((tmp_path / "q" / "summary.json").read_text())["per_seed"]["tiny-cold"]["C2MARL-0.95"]
    assert [r["seed"] for r in runs] == [1, 2]


def test_c2marl_without_quick_keeps_the_papers_three_seeds():
    from agents.oversubscription.experiment import FULL

    assert FULL.seeds == (1, 2, 3)  # what the option's default 1-3 gave, and its help names
