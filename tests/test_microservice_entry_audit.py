"""The microservice-cores problem's entry points: topology files, `samm train --problem
microservice-cores` / `python -m agents.microservice_cores.train`, and the headroom ceiling's
`python -m agents.microservice_cores.ceiling` (audit, session 98)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agents.microservice_cores.topology import load_topology
from fixtures_reclaimer import tiny_reclaimer_policy

ROOT = Path(__file__).resolve().parents[1]
HEAD = "name: t\nqos_ms: 50\nusers: [1, 10]\nrate_per_user: 1\n"
SERVICES = "services:\n  a: {cpu_ms: 1, cap: 1}\n  b: {cpu_ms: 1, cap: 1}\n"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "app.yaml"
    path.write_text(text)
    return path


def _refusal(path: Path) -> str:
    """load_topology's error for `path`: a plain one-line ValueError that names the file."""
    with pytest.raises(ValueError) as exc:
        load_topology(path)
    assert type(exc.value) is ValueError, type(exc.value)      # not pydantic's report
    text = str(exc.value)
    assert len(text.splitlines()) == 1 and text.startswith(f"{path}: "), text
    return text


# -- topology files ---------------------------------------------------------------------------------
@pytest.mark.parametrize("body, field", [
    (SERVICES.replace("cap: 1}\n  b", "cap: 0}\n  b") + "requests:\n  r: {weight: 1, call: a}\n",
     "services.a.cap: Input should be greater than 0"),
    (SERVICES.replace("cap: 1}\n  b", "cap: -2}\n  b") + "requests:\n  r: {weight: 1, call: a}\n",
     "services.a.cap"),
    (SERVICES.replace("cpu_ms: 1, cap: 1}\n  b", "cpu_ms: 1, cap: 1, workers: 0}\n  b")
     + "requests:\n  r: {weight: 1, call: a}\n", "services.a.workers"),
    (SERVICES + "requests: {}\n", "at least one request type"),
    (SERVICES + "requests:\n  r: {weight: 1, call: c}\n", "unknown service 'c'"),
    (SERVICES + "requests:\n  r: {weight: 0, call: a}\n", "requests.r.weight"),
    (SERVICES + "requests:\n  r: {weight: 1, call: a, stages: nope}\n", "requests.r.stages"),
    (SERVICES + "requests:\n  r: &n {weight: 1, call: a, stages: [[*n]]}\n", "requests.r.stages.0.0"),
    ("colour: red\n" + SERVICES + "requests:\n  r: {weight: 1, call: a}\n", "colour: Extra inputs"),
], ids=["cap-0", "cap-negative", "workers-0", "no-requests", "unknown-service", "weight-0", "stages-not-a-list",
        "recursive-alias", "unknown-key"])
def test_a_malformed_topology_is_one_line_naming_the_file_and_the_field(tmp_path, body, field):
    # before: pydantic's ValidationError, 3-4 lines per problem with a link each, naming no file
    assert field in _refusal(_write(tmp_path, HEAD + body))


def test_a_topology_with_many_problems_is_still_one_line(tmp_path):
    services = "services:\n" + "".join(f"  s{i}: {{cpu_ms: -1, cap: 0}}\n" for i in range(8))
    text = _refusal(_write(tmp_path, HEAD + services + "requests:\n  r: {weight: 1, call: s0}\n"))
    assert "services.s0.cpu_ms" in text and "more" in text


def test_a_service_given_twice_is_one_line_naming_the_file(tmp_path):
    text = _refusal(_write(tmp_path, HEAD + SERVICES + "  a: {cpu_ms: 5, cap: 9}\nrequests:\n  r: {weight: 1, call: a}\n"))
    assert "duplicate key 'a'" in text


@pytest.mark.parametrize("stages, path", [
    ("[[{call: a}]]", "a -> a"),
    ("[[{call: b, stages: [[{call: a}]]}]]", "a -> b -> a"),
    ("[[{call: b}], [{call: b, stages: [[{call: b}]]}]]", "b -> b"),
])
def test_a_call_that_waits_on_its_own_service_is_refused_at_load(tmp_path, stages, path):
    # a call holds a worker of its service while it waits for its calls: with `workers: 1`, a
    # self-call failed every request at the timeout on the testbed's real service (app.py), while
    # the simulator ran the same file as if nothing were wrong
    text = _refusal(_write(tmp_path, HEAD + SERVICES + f"requests:\n  r: {{weight: 1, call: a, stages: {stages}}}\n"))
    assert f"request 'r': {path}:" in text and "cycle" in text


def test_calls_that_do_not_wait_on_their_own_service_still_load(tmp_path):
    # the same service in two branches, after itself, or behind a detached (queued) call is no cycle
    stages = "[[{call: b}, {call: b}], [{call: b, stages: [[{call: a, detached: true}]]}]]"
    topo = load_topology(_write(tmp_path, HEAD + SERVICES + f"requests:\n  r: {{weight: 1, call: a, stages: {stages}}}\n"))
    assert topo.visits.tolist() == [[2.0, 3.0]]
    for name in ("chain3", "hotel", "social", "testbed"):     # the shipped applications hold none
        load_topology(name)


# -- the seeds a checkpoint or a ceiling is chosen on -----------------------------------------------
@pytest.mark.parametrize("extra", [["--eval-every", "600"], ["--eval-every", "600", "--seeds", "1,2"]])
@pytest.mark.parametrize("seeds", ["1-5", "10,101"])
def test_training_refuses_the_experiments_seeds_as_validation_seeds(tmp_path, capsys, seeds, extra):
    from agents.microservice_cores.train import main

    out = tmp_path / "run"
    # before: accepted, the best checkpoint picked on the seeds the experiment then reports it on
    assert main(["--app", "chain3", "--steps", "600", "--envs", "2", "--eval-seeds", seeds, "--out", str(out),
                 "--quiet", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--eval-seeds" in err and "6-10" in err, err
    assert not out.exists()


def test_train_refuses_them_before_any_episode():
    from agents.microservice_cores.train import scaled_schedule, sim_config, train

    with pytest.raises(ValueError, match="eval_seeds holds seed"):
        train("chain3", scaled_schedule(sim_config(n_envs=2), 600), progress=False, eval_every=600, eval_seeds=(3,))


def test_the_training_module_runs_as_a_program(tmp_path):
    # before: `python -m agents.microservice_cores.train ...` ran nothing and exited 0, whatever the options
    base = [sys.executable, "-m", "agents.microservice_cores.train"]
    shown = subprocess.run(base + ["--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and "--eval-seeds" in shown.stdout, shown.stderr
    bad = subprocess.run(base + ["--steps", "0", "--out", str(tmp_path / "r")], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "--steps must be >= 1" in bad.stderr, bad.stdout + bad.stderr


@pytest.fixture
def policy_dir(tmp_path) -> Path:
    return tiny_reclaimer_policy(tmp_path)


def _ceiling(policy_dir: Path, out: Path, *extra: str) -> tuple[int, str, str]:
    import contextlib
    import io

    from agents.microservice_cores.ceiling import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        rc = main(["--policy", str(policy_dir), "--out", str(out), "--grid", "3", "--max-violations", "1", *extra])
    return rc, stdout.getvalue(), stderr.getvalue()


@pytest.mark.parametrize("extra", [["--eval-seeds", "1-5"], ["--eval-seeds", "6,101"],
                                   ["--recipe", "shipped", "--eval-seeds", "3"]])
def test_the_ceiling_module_refuses_the_experiments_seeds(tmp_path, policy_dir, extra):
    # before: `python -m agents.microservice_cores.ceiling --eval-seeds 1-5` chose and saved a ceiling
    rc, out, err = _ceiling(policy_dir, tmp_path / "q", *extra)
    assert rc == 2 and "--eval-seeds holds seed" in err and out == "", out + err
    assert not (tmp_path / "q").exists()


def test_choose_ceiling_refuses_them_before_any_episode():
    from agents.microservice_cores.ceiling import choose_ceiling

    ran = []

    class Policy:
        def with_ceiling(self, ceiling):
            return ceiling

    with pytest.raises(ValueError, match="validation seeds holds seed"):
        choose_ceiling(Policy(), None, [101, 2], [3.0], evaluate_fn=lambda *a: ran.append(a))
    assert ran == []


@pytest.mark.parametrize("grid", ["a,b", "3,nan", "inf"])
def test_the_ceiling_module_names_a_grid_value_that_is_not_a_number(tmp_path, policy_dir, grid):
    from agents.microservice_cores.ceiling import main

    # before: "could not convert string to float: 'a'", or a Ceiling's field list for nan
    rc = main(["--policy", str(policy_dir), "--out", str(tmp_path / "q"), "--eval-seeds", "101", "--grid", grid])
    assert rc == 2 and not (tmp_path / "q").exists()


def test_the_ceiling_module_names_a_grid_value_in_its_error(tmp_path, policy_dir, capsys):
    from agents.microservice_cores.ceiling import main

    assert main(["--policy", str(policy_dir), "--out", str(tmp_path / "q"), "--eval-seeds", "101",
                 "--grid", "3,a"]) == 2
    err = capsys.readouterr().err
    assert "--grid '3,a': 'a' is not a finite number" in err, err


@pytest.mark.parametrize("under", [False, True], ids=["a-file", "under-a-file"])
def test_the_ceiling_module_refuses_an_out_it_cannot_save_to_before_any_episode(tmp_path, policy_dir, under):
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    out = blocker / "sub" if under else blocker
    # before: every validation episode ran (minutes for the shipped recipe), then "cannot save": the choice lost
    rc, stdout, err = _ceiling(policy_dir, out, "--eval-seeds", "101")
    assert rc == 2 and "--out" in err and "not a directory" in err, stdout + err
    assert "seeds 101" not in stdout       # refused before the validation began
    assert blocker.read_text() == "x"


def test_the_ceiling_module_still_saves_to_a_new_nested_out(tmp_path, policy_dir):
    rc, stdout, err = _ceiling(policy_dir, tmp_path / "a" / "b", "--eval-seeds", "101", "--window", "0")
    assert rc == 0, stdout + err
    assert (tmp_path / "a" / "b" / "metadata.json").is_file()
