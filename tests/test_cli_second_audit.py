"""The autoscaling verbs, a second pass: an option a run would not read is refused by name (it
looked applied), a bad option leaves no --out behind, an --out under a file is one line, and
Ctrl-C names what a long verb kept and exits 130; a re-run of `samm demo` into the same --out
that stops early leaves no summary of the run before.

Where a verb without the fix would go on to minutes of work, a second bad option (`--max-steps 0`,
`--ppo '[1]'`) stops it at once: the test then fails on the message, never on a timeout."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from samm.cli.main import cli

ROOT = Path(__file__).resolve().parents[1]
TRIPWIRE = ["--max-steps", "0"]  # refused by _sim_config, which every path below reaches first


def _one_error_line(res, *names):
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), (res.output, res.exception)
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.output, res.output
    for name in names:
        assert name in lines[0], res.output
    return lines[0]


# --- options the run would not read ----------------------------------------------------------

@pytest.mark.parametrize("extra, flag", [(["--seeds", "1-10"], "--seeds"), (["--agent", "threshold"], "--agent"),
                                         (["--workload", "seed-1551-short"], "--workload"),
                                         (["--stochastic"], "--stochastic"),
                                         (["--params", '{"upper": 0.8}'], "--params")])
def test_evaluate_suite_refuses_the_options_it_does_not_read(extra, flag):
    """`samm evaluate --suite generalisation --seeds 1-10` ran the suite's 3 seeds and said nothing."""
    # --initial x, not TRIPWIRE: --max-steps is itself refused with --suite
    res = CliRunner().invoke(cli, ["evaluate", "--suite", "generalisation", *extra, "--initial", "x"])
    _one_error_line(res, flag, "--suite")


@pytest.mark.parametrize("extra, flag", [(["--out", "OUT"], "--out"), (["--retune"], "--retune"),
                                         (["--rules", "RULES"], "--rules")])
def test_evaluate_without_suite_refuses_the_suites_options(tmp_path, extra, flag):
    """`samm evaluate --agent threshold --out DIR` evaluated, wrote nothing to DIR and said nothing."""
    rules = tmp_path / "rules.json"
    rules.write_text("{}")
    extra = [str(tmp_path / "out") if a == "OUT" else str(rules) if a == "RULES" else a for a in extra]
    res = CliRunner().invoke(cli, ["evaluate", "--agent", "threshold", *extra, *TRIPWIRE])
    _one_error_line(res, flag, "only with --suite")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("suite, extra, flag", [
    (True, ["--workload", "seed-1551-short"], "--workload"),
    (True, ["--window", "0:3600"], "--window"),
    (False, ["--window-tolerance", "1.2"], "--window-tolerance"),
])
def test_promote_refuses_options_its_gate_does_not_read(tmp_path, suite, extra, flag):
    """--suite gated on its own windows while `--workload MINE.swf` said otherwise; --window-tolerance
    without --suite was read by nothing."""
    pol = tmp_path / "pol"
    pol.mkdir()
    args = ["policy", "promote", "--candidate", str(pol), "--incumbent", str(pol)]
    res = CliRunner().invoke(cli, args + (["--suite", "generalisation"] if suite else []) + extra + TRIPWIRE)
    _one_error_line(res, flag)


@pytest.mark.parametrize("extra, flag", [(["--episodes", "50"], "--episodes"),
                                         (["--predictor", "synthetic"], "--predictor"),
                                         (["--rollout-workers", "4"], "--rollout-workers"),
                                         (["--validation", "0"], "--validation"),
                                         (["--validation", "-3"], "--validation")])
def test_train_autoscaling_refuses_options_it_does_not_read(tmp_path, extra, flag):
    """`samm train --episodes 50` (an lra-placement option) trained the full 600,000 steps;
    --rollout-workers without --ray was recorded as 0 workers; --validation -3 chose the
    fine-tuned snapshot by the mean of no windows."""
    out = tmp_path / "run"
    res = CliRunner().invoke(cli, ["train", "--out", str(out), "--quiet", *extra, "--ppo", "[1]"])
    _one_error_line(res, flag)
    assert not out.exists()


def test_train_a_bad_eval_seeds_leaves_no_out_behind(tmp_path):
    """--eval-seeds was parsed after --out was made (and a plan's validation episodes were run)."""
    out = tmp_path / "run"
    res = CliRunner().invoke(cli, ["train", "--out", str(out), "--quiet", "--eval-seeds", "1-"])
    _one_error_line(res, "--eval-seeds")
    assert not out.exists()


def test_evaluate_suite_out_under_a_file_is_one_line(tmp_path):
    """A NotADirectoryError traceback (exit 1)."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    res = CliRunner().invoke(cli, ["evaluate", "--suite", "generalisation", "--out", str(blocker / "suite")])
    _one_error_line(res, "--out", str(blocker / "suite"))


# --- Ctrl-C: what was kept, exit 130 -----------------------------------------------------------

def _long_trace(path: Path, jobs: int = 20000) -> Path:
    """An SWF trace whose simulation takes tens of seconds: still running when the signal comes."""
    rng, t, rows = random.Random(1), 0, ["; a long trace"]
    for i in range(1, jobs + 1):
        t += rng.randint(30, 200)
        cores = rng.choice([1, 2, 4])
        rows.append(f"{i} {t} 5 {rng.randint(60, 3600)} {cores} -1 -1 {cores} -1 -1 1 1 1 1 1 -1 -1 -1")
    path.write_text("\n".join(rows) + "\n")
    return path


def _interrupt(args: list[str], started, timeout: float = 90, settle_s: float = 1.0) -> subprocess.CompletedProcess:
    """`samm ARGS` in its own process, Ctrl-C (SIGINT) `settle_s` after `started(process)` holds."""
    p = subprocess.Popen([sys.executable, "-m", "samm.cli.main", *args], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + timeout
        while not started(p) and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert p.poll() is None, "the verb ended before it could be interrupted"
        time.sleep(settle_s)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


@pytest.mark.slow  # a real 20,000-job simulation, timed against a signal: tens of seconds, load-sensitive
@pytest.mark.jvm
def test_demo_sim_interrupted_exits_130_and_leaves_no_summary_of_the_run_before(tmp_path):
    """A re-run into the same --out stopped by Ctrl-C was click's "Aborted!" (exit 1), and the
    summary.json and report.md of the run before stayed, to be read as this run's."""
    out = tmp_path / "demo"
    out.mkdir()
    (out / "summary.json").write_text(json.dumps({"workload": "an earlier run"}))
    (out / "report.md").write_text("an earlier run\n")
    trace = _long_trace(tmp_path / "long.swf")
    r = _interrupt(["demo", "--sim", "--workload", str(trace), "--out", str(out)],
                   started=lambda p: (out / "demo.log").exists())
    # 130, or -2 when the interrupt also reaches a clean-up at exit (the conventional death by SIGINT)
    assert r.returncode in (130, -2), r.stderr[-2000:]
    assert "error: demo: interrupted" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert not (out / "summary.json").exists() and not (out / "report.md").exists()


def test_demo_refused_options_keep_the_run_before(tmp_path):
    """A bad option is no run: the last run's report stays."""
    out = tmp_path / "demo"
    out.mkdir()
    (out / "summary.json").write_text("{}")
    trace = tmp_path / "big.swf"
    trace.write_text("1 0 5 600 32 -1 -1 32 -1 -1 1 1 1 1 1 -1 -1 -1\n")
    res = CliRunner().invoke(cli, ["demo", "--sim", "--workload", str(trace), "--out", str(out)])
    _one_error_line(res, "--workload")
    assert (out / "summary.json").exists()


@pytest.mark.slow  # real training until its first log row, then a signal: up to minutes on a loaded machine
@pytest.mark.jvm
def test_train_interrupted_exits_130_naming_what_it_kept(tmp_path):
    """Ctrl-C ended `samm train` with click's "Aborted!" (exit 1), naming neither the logs kept nor
    --resume."""
    out = tmp_path / "run"
    ppo = json.dumps({"num_steps": 32, "bptt_chunk": 8, "num_minibatches": 2})
    r = _interrupt(["train", "--out", str(out), "--envs", "2", "--quiet", "--ppo", ppo],
                   started=lambda p: (out / "progress.csv").exists())
    assert r.returncode == 130, r.stderr[-2000:]
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("error: train: interrupted;") and str(out) in line and "--resume" in line, r.stderr[-2000:]
    assert (out / "progress.csv").exists()


@pytest.mark.parametrize("extra, flag", [(["--cores", "0"], "--cores"), (["--cores", "nan"], "--cores"),
                                         (["--pid", "-1"], "--pid")])
def test_collect_names_the_option_of_a_bad_cores_or_pid(extra, flag):
    """"error: cores must be positive and finite, got 0.0" named no option."""
    res = CliRunner().invoke(cli, ["collect", "--group", "S", "--once", *extra])
    assert _one_error_line(res, flag).startswith(f"error: {flag}: ")


@pytest.mark.parametrize("option, value", [("--margin", "nan"), ("--margin", "-inf"), ("--margin", "1"),
                                           ("--max-p", "nan"), ("--max-p", "-0.1"),
                                           ("--window-tolerance", "nan"), ("--window-tolerance", "0")])
def test_promote_refuses_a_gate_no_candidate_can_pass_or_fail(tmp_path, option, value):
    """--margin nan ran every episode, then "not promoted" (exit 3): NaN fails every comparison;
    --margin -inf promoted anything."""
    pol = tmp_path / "pol"
    pol.mkdir()
    suite = ["--suite", "generalisation"] if option == "--window-tolerance" else []
    res = CliRunner().invoke(cli, ["policy", "promote", "--candidate", str(pol), "--incumbent", str(pol), *suite,
                                   option, value, *TRIPWIRE])
    _one_error_line(res, option)


@pytest.mark.parametrize("containers", ["48-15", "abc", "0-5", "5-"])
def test_evaluate_placement_refuses_a_containers_range_it_cannot_mean(containers):
    """"48-15" evaluated batches of 15 containers and exited 0; "abc" named no option."""
    res = CliRunner().invoke(cli, ["evaluate", "--problem", "lra-placement", "--agent", "greedy", "--predictor",
                                   "synthetic", "--seeds", "1", "--containers", containers])
    _one_error_line(res, "--containers", repr(containers))


def test_evaluate_placement_still_reads_a_single_size():
    res = CliRunner().invoke(cli, ["evaluate", "--problem", "lra-placement", "--agent", "greedy", "--predictor",
                                   "synthetic", "--seeds", "1", "--containers", "12", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["episodes"][0]["containers"] == 12


def test_serve_on_a_port_in_use_or_an_unknown_host_is_one_line_before_loading():
    """uvicorn found out after the policies were loaded and "serving on ..." was printed, and
    exited 3."""
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        res = CliRunner().invoke(cli, ["serve", "--agent", "threshold", "--port", str(port)])
    line = _one_error_line(res, "--port", str(port), "cannot listen there")
    assert "serving" not in res.output, line
    res = CliRunner().invoke(cli, ["serve", "--agent", "threshold", "--host", "no-such-host.invalid"])
    _one_error_line(res, "--host no-such-host.invalid", "cannot resolve")


def test_a_testbed_that_runs_out_of_time_is_a_failure_of_the_work_not_of_usage(tmp_path):
    """The run's timeout exited 2, the status of a typo; `samm demo` shares the handling."""
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "samm.cli.main", "testbed", "--agent", "noop", "--timeout", "3",
                        "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 1, r.stderr[-2000:]
    line = r.stderr.strip().splitlines()[-1]
    assert "unfinished after 3 s" in line and "partial results in" in line and "Traceback" not in r.stderr, line


def test_promote_that_cannot_install_is_a_failure_of_the_work(tmp_path, monkeypatch):
    """A promotion whose install failed exited 2, the status of a typo."""
    import agents.promote
    from agents.factory import make_agent
    from sim_bridge.config import SimConfig

    pol = tmp_path / "pol"
    make_agent("threshold", SimConfig()).save(pol)
    live = tmp_path / "live"

    def disk_full(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(agents.promote.shutil, "copytree", disk_full)  # the fault: a disk that fills up
    # the same policy on both sides, a gate it passes: promoted, then the install fails
    res = CliRunner().invoke(cli, ["policy", "promote", "--candidate", str(pol), "--incumbent", str(pol),
                                   "--seeds", "1", "--max-steps", "5", "--margin", "-0.5", "--max-p", "1",
                                   "--install", str(live)])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), (res.output, res.exception)
    assert "promoted but not installed" in res.output.strip().splitlines()[-1], res.output
    assert not live.exists() and not list(tmp_path.glob(".incoming-*"))


@pytest.mark.parametrize("spec", ["threshold=", "lstm-ppo="])
def test_serve_refuses_an_agent_spec_without_a_directory_after_the_equals(spec):
    """`--agent threshold=` (a $POLICY left unset) served the default agent as if none were named."""
    import socket

    with socket.socket() as held:  # without the fix, the run stops at the port instead of serving
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        res = CliRunner().invoke(cli, ["serve", "--agent", spec, "--port", str(held.getsockname()[1])])
    _one_error_line(res, f"--agent {spec!r}", "NAME=POLICY_DIR")


def test_demo_sim_refuses_the_testbeds_compression(tmp_path):
    """`samm demo --sim --compression 60` ran the simulator's comparison as without it."""
    trace = tmp_path / "big.swf"  # without the fix, the run stops at this 32-core job instead
    trace.write_text("1 0 5 600 32 -1 -1 32 -1 -1 1 1 1 1 1 -1 -1 -1\n")
    res = CliRunner().invoke(cli, ["demo", "--sim", "--compression", "60", "--workload", str(trace),
                                   "--out", str(tmp_path / "d")])
    _one_error_line(res, "--compression", "--sim")
    assert not (tmp_path / "d").exists()


def test_install_replaces_whatever_holds_the_previous_slot_and_never_leaves_the_target_empty(tmp_path, monkeypatch):
    """A file at `<target>.previous` failed the install after the copy, leaving `.incoming-*` beside
    the target; a failed last rename left no policy at the target at all."""
    import os

    import agents.promote as promote

    cand, live = tmp_path / "cand", tmp_path / "live"
    cand.mkdir()
    (cand / "metadata.json").write_text('{"version": "new"}')
    live.mkdir()
    (live / "metadata.json").write_text('{"version": "old"}')
    (tmp_path / "live.previous").write_text("a stray file")
    promote.install(cand, live)
    assert (live / "metadata.json").read_text() == '{"version": "new"}'
    assert (tmp_path / "live.previous" / "metadata.json").read_text() == '{"version": "old"}'

    real = os.replace

    def last_rename_fails(src, dst):
        if os.path.basename(str(src)).startswith(".incoming-"):
            raise OSError(5, "Input/output error")
        return real(src, dst)

    monkeypatch.setattr(promote.os, "replace", last_rename_fails)
    (cand / "metadata.json").write_text('{"version": "newer"}')
    with pytest.raises(OSError):
        promote.install(cand, live)
    assert (live / "metadata.json").read_text() == '{"version": "new"}'  # the installed one is back
    assert not list(tmp_path.glob(".incoming-*"))


def test_a_static_agent_refuses_a_policy_it_would_not_read():
    """`--agent static:1,1,1 --policy DIR` ran the static counts and said nothing of DIR."""
    res = CliRunner().invoke(cli, ["evaluate", "--agent", "static:1,1,1", "--policy", "agents/policies/lstm-ppo-default",
                                   "--seeds", "1", "--max-steps", "3"])
    assert res.exit_code == 2 and "takes its counts from its name, not a saved policy" in res.output, res.output


def test_a_policy_of_another_problem_is_named_as_such():
    """It said "metadata.json: missing 'feature_names'", as if the file needed repair."""
    res = CliRunner().invoke(cli, ["evaluate", "--agent", "lstm-ppo", "--policy",
                                   "agents/deferrable_jobs/policies/osdec-default", "--seeds", "1", "--max-steps", "3"])
    assert res.exit_code == 2, res.output
    assert "a policy of the 'deferrable-jobs' problem, not an autoscaling agent (give --problem deferrable-jobs)" \
        in res.output, res.output


@pytest.mark.parametrize("verb", [["evaluate", "--suite", "generalisation"],
                                  ["policy", "promote", "--suite", "generalisation", "--candidate",
                                   "agents/policies/lstm-ppo-default", "--incumbent", "agents/policies/lstm-ppo-paper"]])
def test_the_suite_refuses_a_step_cap_it_would_not_use(verb):
    """promote ran the suite's 20,000-step episodes whatever --max-steps said; evaluate failed with a
    config-hash mismatch naming no option."""
    res = CliRunner().invoke(cli, [*verb, "--max-steps", "100"])
    assert res.exit_code == 2 and "--max-steps" in res.output and "does not apply to --suite" in res.output, res.output
