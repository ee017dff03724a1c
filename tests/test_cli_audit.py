"""The CLI's shared option helpers (simulation config, workload options, seeds, JSON parameters),
the daemon config verbs, `samm demo`'s options, and the daemon's remote-agent wiring: each bad
input is one line naming the option, field or file, never a traceback, a silent default or a
read without end."""
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from samm.cli.main import cli

ROOT = Path(__file__).resolve().parents[1]
SWF = "\n".join(["; a small trace",
                 "1 0 5 600 4 -1 -1 4 -1 -1 1 1 1 1 1 -1 -1 -1",
                 "2 60 5 1200 32 -1 1048576 32 -1 -1 1 1 1 1 1 -1 -1 -1",
                 "3 120 5 60 1 -1 -1 1 -1 -1 1 1 1 1 1 -1 -1 -1"]) + "\n"


def _one_error_line(res, *names):
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), (res.output, res.exception)
    lines = res.output.strip().splitlines()
    assert len(lines) == 1, res.output
    assert "Traceback" not in res.output and "errors.pydantic.dev" not in res.output, res.output
    for name in names:
        assert name in lines[0], res.output
    return lines[0]


# --- the simulation config and the workload options: one line each --------------------------

def test_a_sim_config_files_errors_are_one_line_naming_file_and_fields(tmp_path):
    p = tmp_path / "sim.yaml"
    p.write_text("bogus_key: 1\nhost_mips: -3\n")
    res = CliRunner().invoke(cli, ["evaluate", "--agent", "threshold", "--config", str(p)])
    _one_error_line(res, str(p), "bogus_key", "host_mips")
    res = CliRunner().invoke(cli, ["tune", "--agent", "threshold", "--max-steps", "0"])
    _one_error_line(res, "--max-steps")
    res = CliRunner().invoke(cli, ["evaluate", "--agent", "threshold", "--initial", "20,1,1"])
    _one_error_line(res, "--initial", "min <= initial <= max")


@pytest.mark.parametrize("window", ["5:1", "-5:10", "abc:", "inf:", "nan:"])
def test_a_bad_window_is_one_line_naming_the_option(tmp_path, window):
    trace = tmp_path / "t.swf"
    trace.write_text(SWF)
    res = CliRunner().invoke(cli, ["evaluate", "--agent", "threshold", "--workload", str(trace), f"--window={window}"])
    _one_error_line(res, "--window")


VERBS = {
    "evaluate": ["evaluate", "--agent", "threshold"],
    "tune": ["tune", "--agent", "threshold"],
    "train": ["train", "--out", "OUT", "--quiet"],
    "promote": ["policy", "promote", "--candidate", "POLICY", "--incumbent", "POLICY"],
}


@pytest.mark.parametrize("verb", sorted(VERBS))
@pytest.mark.parametrize("option, value", [("--time-compression", "0"), ("--mips-per-core", "0"),
                                           ("--max-jobs", "0"), ("--time-compression", "-2"),
                                           ("--mips-per-core", "inf")])
def test_a_zero_or_negative_workload_option_is_an_error_in_every_verb(tmp_path, verb, option, value):
    """`if compression:` took a 0 for "not given": the run went on with the default."""
    (tmp_path / "policy").mkdir()
    args = [str(tmp_path / "out") if a == "OUT" else str(tmp_path / "policy") if a == "POLICY" else a
            for a in VERBS[verb]]
    res = CliRunner().invoke(cli, args + ["--workload", str(tmp_path / "missing.swf"), option, value])
    _one_error_line(res, option, "> 0")
    assert not (tmp_path / "out").exists()


def test_a_workload_that_is_not_a_regular_file_is_refused_not_read(tmp_path):
    """--workload /dev/zero was read whole: a MemoryError traceback, or the host's memory."""
    from sim_bridge.workloads import load_workload

    for spec in ("/dev/zero", str(tmp_path)):
        with pytest.raises(ValueError, match="not a regular file"):
            load_workload(spec)
        res = CliRunner().invoke(cli, ["tune", "--agent", "threshold", "--workload", spec])
        line = _one_error_line(res, spec, "not a regular file")
        assert line.count(spec) == 1, line  # named once, not "workload X: workload X: ..."


def test_a_huge_or_deeply_nested_sim_config_is_refused(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (2 << 20))  # all comment: it parsed as {} after reading it whole
    res = CliRunner().invoke(cli, ["tune", "--agent", "threshold", "--config", str(big)])
    _one_error_line(res, str(big), "larger than")
    deep = tmp_path / "deep.yaml"
    deep.write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")
    res = CliRunner().invoke(cli, ["tune", "--agent", "threshold", "--config", str(deep)])
    _one_error_line(res, str(deep), "nested too deeply")


def _limited_samm(args, timeout=60):
    """`samm ARGS` with 4 GiB of address space: a read without end fails in seconds, not the host."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    return subprocess.run([sys.executable, "-m", "samm.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, preexec_fn=limit, cwd=ROOT, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize("args", [["config", "check", "/dev/zero"], ["run", "--config", "/dev/zero"],
                                  ["sim", "run", "--config", "/dev/zero"]])
def test_an_endless_config_file_is_refused_not_read(args):
    out = _limited_samm(args)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "/dev/zero" in out.stderr and "Traceback" not in out.stderr, out.stderr[-2000:]


def test_the_daemon_config_verbs_refuse_huge_and_deeply_nested_files(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (2 << 20))
    deep = tmp_path / "deep.yaml"
    deep.write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")
    for verb in (["config", "check"], ["run", "--iterations", "1", "--config"]):
        res = CliRunner().invoke(cli, verb + [str(big)])
        assert res.exit_code == 2 and "larger than" in res.output and str(big) in res.output, res.output
        res = CliRunner().invoke(cli, verb + [str(deep)])
        assert res.exit_code == 2 and "nested too deeply" in res.output, (res.output, res.exception)
    assert CliRunner().invoke(cli, ["config", "check", str(ROOT / "deploy/configs/samm.example.yaml")]).exit_code == 0


# --- seeds and JSON parameters ----------------------------------------------------------------

def test_seed_lists_are_bounded_in_count_and_value():
    from samm.cli.seeds import MAX_SEED, MAX_SEEDS, SeedsOutOfBounds, parse_seeds

    assert parse_seeds(f"1-{MAX_SEEDS}")[-1] == MAX_SEEDS and parse_seeds(f"{MAX_SEED}") == [MAX_SEED]
    # "0-10^20" once raised OverflowError; "1-10^10" a MemoryError after trying to build the list
    for bad in (f"1-{MAX_SEEDS + 1}", "0-99999999999999999999", "99999999999999999999", f"{MAX_SEED + 1}", "-1,2"):
        with pytest.raises(SeedsOutOfBounds):
            parse_seeds(bad)


def test_the_seeds_option_names_why_a_list_is_out_of_bounds(capsys):
    from samm.cli.main import _seeds

    with pytest.raises(SystemExit) as exc:
        _seeds("1-10000000000", "--eval-seeds")
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--eval-seeds" in err and "at most" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("args", [["evaluate", "--agent", "threshold", "--params"],
                                  ["train", "--out", "OUT", "--quiet", "--ppo"]])
def test_deeply_nested_json_parameters_are_an_error_not_a_traceback(tmp_path, args):
    args = [str(tmp_path / "out") if a == "OUT" else a for a in args]
    res = CliRunner().invoke(cli, args + ["[" * 100_000 + "]" * 100_000])
    _one_error_line(res, args[-1], "nested too deeply")
    assert not (tmp_path / "out").exists()


# --- samm demo --------------------------------------------------------------------------------

def test_demo_refuses_a_seed_outside_the_simulators_seed_space(tmp_path):
    res = CliRunner().invoke(cli, ["demo", "--sim", "--seed", "99999999999999999999", "--out", str(tmp_path / "d")])
    assert res.exit_code == 2 and "--seed" in res.output and "Traceback" not in res.output, res.output
    assert not (tmp_path / "d").exists()


def test_demo_refuses_a_workload_its_simulator_cannot_run_before_it_starts(tmp_path):
    """The CloudSim Plus comparison runs last: a 32-core job stopped it with a traceback after the
    testbed's minutes, and no summary was written."""
    trace = tmp_path / "t.swf"
    trace.write_text(SWF)
    for extra in (["--sim"], []):
        res = CliRunner().invoke(cli, ["demo", *extra, "--workload", str(trace), "--out", str(tmp_path / "d")])
        _one_error_line(res, "--workload", "32-core")
    assert not (tmp_path / "d").exists()


# --- the daemon's remote agent: its VM types must be the configured groups -------------------

GROUPS = [{"name": n, "cores": c, "ram_gb": 4 * c, "price_per_hour": 0.1 * c, "min": int(i == 0), "max": 10}
          for i, (n, c) in enumerate([("S", 2), ("M", 4), ("L", 8)])]


@pytest.fixture(scope="module")
def remote_agents(tmp_path_factory):
    from agents.factory import make_agent
    from samm.localproc import AppInThread
    from samm.plan.registry import PolicyRegistry
    from samm.plan.service import create_app
    from sim_bridge.config import SimConfig

    reg = PolicyRegistry(tmp_path_factory.mktemp("store"))
    reg.host("threshold", make_agent("threshold", SimConfig(action_mode="per-type")))
    reg.host("lstm-ppo", make_agent("lstm-ppo", SimConfig()))
    with AppInThread(create_app(reg)) as server:
        yield server.url


def _http_config(url, names, agent="threshold", knowledge="sqlite://"):
    from samm.config import SammConfig

    groups = [dict(g, name=n) for g, n in zip(GROUPS, names)]
    return SammConfig.model_validate({
        "groups": groups, "agent": {"name": agent, "mode": "http", "service_url": url}, "executor": {"kind": "sim"},
        "timing": {"interval_s": 1, "warmup_s": 0, "cooldown_s": 0}, "simulation": {"seed": 1},
        "knowledge": {"url": knowledge}})


@pytest.mark.parametrize("names", [("A", "B", "C"), ("L", "M", "S")])
def test_a_remote_agent_for_other_vm_types_is_a_do_nothing_decision_naming_both(remote_agents, names, caplog):
    import numpy as np

    from samm.daemon.build import make_planner

    lp = _http_config(remote_agents, names).control_loops()[0]
    planner = make_planner(lp, timeout_s=10)
    assert planner.feature_names is None  # not the remote's "vm_running_frac:S": unknown to this fleet
    out = planner.decide(np.zeros(1, dtype=np.float32))
    assert out.source == "fallback" and out.deltas == {}
    assert "['S', 'M', 'L']" in out.reason and str(list(names)) in out.reason, out.reason
    assert out.reason in caplog.text  # logged, not only recorded
    good = make_planner(_http_config(remote_agents, ("S", "M", "L")).control_loops()[0], timeout_s=10)
    assert good.feature_names == ("cpu_mean",) and good.decide(np.array([0.5], dtype=np.float32)).source == "agent"


@pytest.mark.jvm
def test_the_daemon_records_the_remote_agents_mismatch_and_keeps_iterating(remote_agents, tmp_path):
    """With the shipped policy's per-type features every iteration raised "unknown feature(s)"
    (no decision recorded); with the threshold rule it decided for groups it does not manage."""
    from samm.daemon.build import build_daemon

    daemon = build_daemon(_http_config(remote_agents, ("A", "B", "C"), agent="lstm-ppo",
                                       knowledge=f"sqlite:///{tmp_path}/k.db"))
    try:
        for _ in range(2):
            rep = daemon.loop.run_once()
            assert rep.decided and rep.plan.source == "fallback" and not rep.actions, rep
            assert "['A', 'B', 'C']" in rep.plan.reason
        decision = daemon.store.decision(rep.key, loop=daemon.loop.name)
        assert decision.source == "fallback" and "['S', 'M', 'L']" in decision.reason
    finally:
        daemon.close()


def test_a_config_of_nested_aliases_is_refused_without_expanding_them(tmp_path):
    """The "billion laughs": 1 KB of nested YAML aliases. Naming each unknown key's line walked
    every alias again (9^9 nodes): a minute, then MemoryError."""
    rows = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi"):
        rows.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    laughs = tmp_path / "laughs.yaml"
    laughs.write_text("\n".join(rows) + "\n")
    out = _limited_samm(["config", "check", str(laughs)], timeout=120)
    assert out.returncode == 2 and "unknown key 'i'" in out.stderr, out.stderr[-2000:]


def test_load_config_itself_bounds_what_it_reads():
    from samm.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="larger than"):
        load_config("/dev/zero")
