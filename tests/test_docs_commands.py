"""Every command the docs print still parses: each `samm ...` line of README.md and docs/*.md (and the
Makefile's and the systemd units' command lines) names a verb and options the CLI has, and each
`benchmarks/X.py --opt` names a script that exists and an option it declares. The scripts of
benchmarks/ all answer --help and refuse bad values with one line before any work starts.

Nothing here runs a command: the `samm` lines are matched against click's command tree, the
benchmark scripts are asked for --help (or given a bad value) in one helper process."""
from __future__ import annotations

import contextlib
import importlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

from samm.cli.main import cli

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]  # docs/history/ records the past
# spans that start with `samm` but are no command: a Graphite event's tags (docs/metric-naming.md)
NOT_COMMANDS = {"samm scaling <group>"}
OPTION = re.compile(r"(?<![\w-])(--[a-z][\w-]*)")


# ---- the commands the docs print ------------------------------------------------------------------

def doc_command_lines(text: str) -> list[str]:
    """`samm ...` and `... benchmarks/X.py ...` lines of fenced blocks (continuations joined) and
    inline code spans."""
    found = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
        found += [line.strip() for line in block.replace("\\\n", " ").splitlines()
                  if re.match(r"^(\S*/)?samm\s", line.strip()) or "benchmarks/" in line]
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    found += [s for s in re.findall(r"`([^`\n]+)`", prose)
              if re.match(r"^(\.venv/bin/)?samm(\s|$)", s) or re.search(r"benchmarks/\w+\.py", s)]
    return [re.sub(r"\s#.*$", "", line) for line in found]  # a trailing shell comment


def _tokens(line: str) -> list[str]:
    """Words of a command as the docs write it: [optional] brackets and `a|b` alternatives kept apart."""
    return line.replace("[", " ").replace("]", " ").split()


@pytest.fixture(scope="module")
def trainer_options() -> dict[str, set[str]]:
    """Each problem's own trainer options, which `samm train --problem P` passes through."""
    from agents.registry import get_problem

    problems = next(p for p in cli.commands["train"].params if p.name == "problem").type.choices
    out = {}
    for problem in problems:
        if problem == "autoscaling":
            continue
        module = importlib.import_module(get_problem(problem).train.split(":")[0])
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), pytest.raises(SystemExit):
            module.main(["--help"])
        out[problem] = set(OPTION.findall(buf.getvalue()))
    return out


def samm_line_problems(line: str, trainer_options: dict[str, set[str]]) -> list[str]:
    """What of a `samm ...` line the CLI does not know: a verb, an option, or a choice value."""
    toks = _tokens(line)
    cmd, i = cli, 1
    while isinstance(cmd, click.Group) and i < len(toks) and toks[i] in cmd.commands:
        cmd, i = cmd.commands[toks[i]], i + 1
    if isinstance(cmd, click.Group) and i < len(toks) and not toks[i].startswith("-") and toks[i] != "...":
        verbs = toks[i].split("|")  # `samm experiment paper|lra|...`: each alternative a verb
        if not all(v in cmd.commands for v in verbs) and not getattr(cmd, "invoke_without_command", False):
            return [f"no verb {toks[i]!r} under {cmd.name!r}"]
        # an option after alternatives belongs to one of them (`... reclaimer|run --problem`)
        alternatives = [cmd.commands[v] for v in verbs if v in cmd.commands] or [cmd]
        cmd, i = alternatives[0], i + 1
    else:
        alternatives = [cmd]
    params = {o: p for c in alternatives for p in c.params for o in p.opts + p.secondary_opts}
    known = set(params)
    if cmd is cli.commands["train"]:
        given = toks[toks.index("--problem") + 1] if "--problem" in toks[:-1] else None
        # the docs shorten `samm train --problem P ...` to `samm train ... --app social`
        known |= trainer_options.get(given, set()) if given else set().union(*trainer_options.values())
    problems = []
    for opt, value in zip(toks[i:], toks[i + 1:] + [""]):
        if not opt.startswith("--"):
            continue
        name = opt.split("=")[0]
        if name not in known:
            problems.append(f"{cmd.name}: no option {name}")
            continue
        p = params.get(name)
        placeholder = re.search(r"[A-Z<]|\.\.\.", value) or value.startswith("-") or not value
        if p is not None and isinstance(p.type, click.Choice) and not placeholder:
            problems += [f"{cmd.name} {name}: {v!r} is not one of {list(p.type.choices)}"
                         for v in value.split("|") if v not in p.type.choices]
    return problems


def benchmark_refs(line: str) -> list[tuple[str, list[str]]]:
    """(script stem, options written after it) for each benchmarks/X.py the line names."""
    return [(m.group(1), OPTION.findall(m.group(2)))
            for m in re.finditer(r"benchmarks/(\w+)\.py((?:\s+[^\s`|;]+)*)", line)]


# ---- the benchmark scripts, asked in one helper process -------------------------------------------

PROBE = r"""
import contextlib, io, json, runpy, sys
sys.path[:0] = [sys.argv[1]]  # as `python benchmarks/X.py` puts the script's folder first
out = {}
for case in json.loads(sys.argv[2]):
    script, argv = case[0], case[1:]
    so, se, code = io.StringIO(), io.StringIO(), None
    sys.argv = [script.rsplit("/", 1)[-1], *argv]
    try:
        with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException as exc:
        code = "exception: " + type(exc).__name__ + ": " + str(exc)[:200]
    out[" ".join(case)] = {"code": code, "stdout": so.getvalue(), "stderr": se.getvalue()}
print(json.dumps(out))
"""


def probe(cases: list[list[str]], workdir: Path, timeout: float = 240) -> dict[str, dict]:
    """Runs each [script, *argv] in-process in one Python (imports shared), returning exit code and
    output per case; a case that goes past argument parsing shows as an exception or a timeout. It
    runs in `workdir`, so a script that wrongly starts work writes its output there, not in the repo."""
    r = subprocess.run([sys.executable, "-c", PROBE, str(BENCHMARKS), json.dumps(cases)], cwd=workdir,
                       capture_output=True, text=True, timeout=timeout,
                       env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "HOME": str(workdir)})
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


SCRIPTS = sorted(BENCHMARKS.glob("*.py"))


def test_every_benchmark_script_answers_help(helps):
    bad = {name: (r["code"], (r["stderr"] or r["stdout"])[-300:]) for name, r in helps.items()
           if r["code"] != 0 or "usage:" not in r["stdout"]}
    assert not bad, f"benchmarks that do not answer --help: {bad}"


def _refusal(result: dict) -> str:
    """The one error line of an argparse refusal (exit 2, no traceback), or why it is not one."""
    if result["code"] != 2 or "Traceback" in result["stderr"]:
        return f"not refused: exit {result['code']}: {result['stderr'][-300:]}"
    return result["stderr"].strip().splitlines()[-1]


# bad values each refused before the benchmark starts anything (a Graphite, containers, an episode)
BAD_VALUES = [
    ("loopback_roundtrip", ["--trips", "0"], "--trips and --repeats must be at least 1"),
    ("loopback_roundtrip", ["--repeats", "0"], "--trips and --repeats must be at least 1"),
    ("graphite_render_forms", ["--repeats", "0"], "--instances and --repeats must be at least 1"),
    ("graphite_render_forms", ["--instances", "-1"], "--instances and --repeats must be at least 1"),
    ("lra_plan_time", ["--seeds", "1", "-1"], "--seeds must be non-negative integers, got -1"),
    ("loop_iteration", ["--graphite-timeout", "0"], "--graphite-timeout must be > 0"),
    ("loop_iteration", ["--retentions", "10s"], "--retentions must be carbon's PRECISION:RETENTION"),
    ("microservice_feature_gap", ["--policy", "/nonexistent/policy"], "no metadata.json"),
    ("microservice_feature_gap", ["--users", "0"], "users must be a whole number >= 1"),
    ("microservice_feature_gap", ["--skip", "30"], "--skip must be in 0..29"),
    ("microservice_sim", ["--seconds", "0"], "--seconds and every --envs must be at least 1"),
    ("microservice_sim", ["--apps", "nope"], "--apps: unknown application 'nope'"),
    ("microservice_testbed_pool", ["--method", "nope"], "no runs of method 'nope'"),
    ("microservice_testbed_pool", ["--users", "x"], "--users must be comma-separated whole numbers"),
    ("microservice_testbed_pool", ["--runs", "/nonexistent/runs.csv"], "--runs /nonexistent/runs.csv: [Errno 2]"),
    ("microservice_twin_tail", ["--chains", "x"], "--users and --chains must be comma-separated numbers"),
    ("microservice_twin_tail", ["--fit", "nope"], "--fit/--check nope: microservice-cores has no controller 'nope'"),
    ("microservice_twin_tail", ["--seeds", "0"], "--users and --seeds must be at least 1"),
    ("oversub_baselines_at", ["--case", "tiny-cold", "--tune-alpha", "0.9", "--test-episodes", "0"],
     "--test-episodes and --tune-episodes must be at least 1"),
    ("oversub_per_seed", ["--policies", "/nonexistent", "--case", "tiny-cold"], "no metadata.json"),
    ("oversub_per_seed", ["--policies", "/nonexistent", "--case", "tiny-cold", "--seeds", "x"], "--seeds:"),
    ("oversub_blocks", ["--setting", "nope"], "unknown oversubscription setting 'nope'"),
    ("oversub_blocks", ["--policy", "/nonexistent"], "no metadata.json"),
    ("oversub_blocks", ["--episodes", "0"], "--episodes must be at least 1"),
    ("oversub_hindsight", ["--setting", "nope"], "unknown oversubscription setting 'nope'"),
    ("oversub_shield_frontier", ["--episodes", "0"], "--episodes must be at least 1"),
    ("oversub_shield_frontier", ["--setting", "tiny", "--policies", "/nonexistent"], "no metadata.json"),
    ("oversub_margin_scan", ["--policy", "/nonexistent"], "no metadata.json"),
    ("oversub_sim", ["--settings", "nope"], "--settings among ['azure', 'internal', 'tiny']"),
    ("oversub_sim", ["--episodes", "0"], "--episodes must be at least 1"),
    ("reclaimer_action_scale", ["--app", "nope"], "unknown application 'nope'"),
    ("reclaimer_headroom", ["--windows", "x"], "invalid literal for int() with base 10: 'x'"),
    ("reclaimer_keyed_oracle", ["--seeds", "x"], "invalid literal for int() with base 10: 'x'"),
    ("reclaimer_static_oracle", ["--users", "x"], "could not convert string to float: 'x'"),
    ("reclaimer_per_service", ["--policy", "/nonexistent"], "no metadata.json"),
    ("reclaimer_transfer", ["--policy", "a=/nonexistent"], "no metadata.json"),
    ("reclaimer_validation", ["--apps", "nope"], "unknown application 'nope'"),
    ("microservice_twin_replay", ["/nonexistent"], "/nonexistent: no steps.csv"),
    ("microservice_twin_replay", ["--topology", "{bad", "/nonexistent"], "--topology: Expecting property name"),
    ("microservice_testbed_compare", ["--users", "x", "--out", "/nonexistent/never-made"],
     "--users / --sim-seeds: invalid literal for int()"),
    ("ray_rollouts", ["--workers", "x"], "--workers must be comma-separated whole numbers"),
    ("service_latency", ["--rate", "0"], "--rate and --seconds must be > 0 and make at least one request"),
    ("service_latency", ["--sessions", "x"], "--sessions must be comma-separated whole numbers"),
    ("osdec_schedule", ["--seconds", "0"], "--rate and --seconds must be > 0 and make at least one request"),
    ("reclaimer_allocate", ["--seconds", "0"], "--rate and --seconds must be > 0 and make at least one request"),
    ("reclaimer_update", ["--apps", "nope"], "--apps: unknown application 'nope'"),
]


BAD_CASES = [[str(BENCHMARKS / f"{name}.py"), *argv] for name, argv, _ in BAD_VALUES]
UNKNOWN_CASES = [[str(s), "--no-such-option"] for s in SCRIPTS]


@pytest.fixture(scope="module")
def probed(tmp_path_factory) -> dict[str, dict]:
    """Every script's --help, bad values and an unknown option, in one process (torch imported once)."""
    return probe([[str(s), "--help"] for s in SCRIPTS] + BAD_CASES + UNKNOWN_CASES,
                 tmp_path_factory.mktemp("benchmarks-cwd"))


@pytest.fixture(scope="module")
def helps(probed) -> dict[str, dict]:
    return {s.stem: probed[f"{s} --help"] for s in SCRIPTS}


def test_benchmarks_refuse_bad_values_with_one_line(probed):
    res, cases, unknown = probed, BAD_CASES, UNKNOWN_CASES
    for (name, argv, expected), case in zip(BAD_VALUES, cases):
        assert expected in _refusal(res[" ".join(case)]), (name, argv, _refusal(res[" ".join(case)]))
    for case in unknown:
        refusal = _refusal(res[" ".join(case)])  # a required positional may be named first
        assert re.search(r"error: (unrecognized arguments: --no-such-option|the following arguments are required)",
                         refusal), (case[0], refusal)


# ---- the docs ----------------------------------------------------------------------------------------

def _doc_lines() -> list[tuple[str, str]]:
    return [(doc.relative_to(ROOT).as_posix(), line) for doc in DOCS
            for line in doc_command_lines(doc.read_text(encoding="utf-8"))]


def test_the_docs_print_many_commands():
    """A guard against the extraction silently finding nothing (then every other check passes)."""
    lines = _doc_lines()
    assert sum(1 for _, line in lines if "samm" in line.split()[0]) > 150
    assert sum(1 for _, line in lines if benchmark_refs(line)) > 40


def test_every_samm_command_of_the_docs_parses(trainer_options):
    problems = [f"{doc}: `{line}`: {p}" for doc, line in _doc_lines()
                if line.split()[0].rsplit("/", 1)[-1] == "samm" and line not in NOT_COMMANDS
                for p in samm_line_problems(line, trainer_options)]
    assert not problems, "\n".join(problems)


def test_every_benchmark_command_of_the_docs_names_real_options(helps):
    problems = []
    for doc, line in _doc_lines():
        for stem, options in benchmark_refs(line):
            if stem not in helps:
                problems.append(f"{doc}: no script benchmarks/{stem}.py")
                continue
            problems += [f"{doc}: benchmarks/{stem}.py has no option {o}" for o in options
                         if o not in OPTION.findall(helps[stem]["stdout"])]
    assert not problems, "\n".join(problems)


def test_the_checks_catch_a_stale_command(trainer_options):
    assert samm_line_problems("samm evaluate --agent queue --no-such-flag", trainer_options) == \
        ["evaluate: no option --no-such-flag"]
    assert samm_line_problems("samm sim walk --json", trainer_options) == ["no verb 'walk' under 'sim'"]
    assert samm_line_problems("samm demo --sim --workload seed-1551", trainer_options) == []
    assert samm_line_problems("samm train --problem oversubscription --out D --setting azure --alpha 0.95",
                              trainer_options) == []
    assert samm_line_problems("samm train --problem oversubscription --out D --app hotel", trainer_options) == \
        ["train: no option --app"]
    assert samm_line_problems("samm sim run --preset lavish", trainer_options)[0].startswith(
        "run --preset: 'lavish' is not one of")
    assert benchmark_refs("`.venv/bin/python benchmarks/oversub_per_seed.py --policies DIR --case x`") == \
        [("oversub_per_seed", ["--policies", "--case"])]


def test_makefile_and_systemd_command_lines_parse(trainer_options):
    """`make bench` and the units' ExecStart run `samm` with options the CLI must still have."""
    makefile = (ROOT / "Makefile").read_text()
    lines = [re.sub(r"^\$\(VENV\)/", "", m) for m in re.findall(r"^\t(\$\(VENV\)/samm .*)$", makefile, re.M)]
    for unit in sorted((ROOT / "deploy" / "systemd").glob("*.service")):
        lines += [m.rsplit("/", 1)[-1] for m in re.findall(r"^ExecStart=(\S+/samm(?: .*)?)$", unit.read_text(), re.M)]
    assert len(lines) >= 4
    problems = [f"`{line}`: {p}" for line in lines for p in samm_line_problems(line, trainer_options)]
    assert not problems, "\n".join(problems)


def test_the_make_targets_the_readme_names_exist():
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    named = set(re.findall(r"(?:`|^)make ([\w-]+)", (ROOT / "README.md").read_text(), re.M))
    assert named and named <= targets, named - targets


# ---- the Grafana dashboard under another prefix ------------------------------------------------------

@pytest.mark.graphite
def test_dashboard_legends_name_the_series_under_a_dotted_prefix(graphite, graphite_prefix):
    """graphite.prefix may hold dots, and a loop other than `default` publishes its daemon series
    under <prefix>.loops.<loop> (the collectors and the queue stay under <prefix>): with the prefix
    typed into the dashboard's box, every legend must still name the group, metric or stage (and
    the loop, in brackets), not a node of the prefix (which made every line read `daemon`)."""
    import time

    from samm.monitor.graphite_client import GraphiteSender, RenderClient

    dash = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / "samm.json").read_text())
    prefix = f"{graphite_prefix}.team.prod"
    series = {f"{prefix}.loops.hotel.daemon.groups.S.live": "S.live [hotel]",
              f"{prefix}.daemon.groups.M.desired": "M.desired",
              f"{prefix}.loops.hotel.daemon.metrics.cpu_mean": "cpu_mean [hotel]",
              f"{prefix}.daemon.actions.S.succeeded": "S.succeeded",
              f"{prefix}.loops.hotel.daemon.stage_ms.plan": "plan [hotel]",
              f"{prefix}.groups.S.instances.i-01.cpu_percent": "S.i-01",
              f"{prefix}.groups.M.instances.i-02.ram_used_gb": "M.i-02"}
    now = int(time.time())
    sender = GraphiteSender(graphite.carbon_host, graphite.carbon_port)
    for name in series:
        sender.send(name, 1.0, now - 30)
    assert sender.flush() == len(series)
    queries = [t["target"].replace("$prefix", prefix) for p in dash["panels"] for t in p["targets"]
               if t["target"].startswith(("aliasByNode(", "aliasSub("))]
    assert len(queries) >= 5
    render, want = RenderClient(graphite.render_url), set(series.values())
    legends: set[str] = set()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not want <= legends:
        legends = {s.target for s in render.render(queries, now - 600, now + 1) if s.values()}
        time.sleep(0.3)  # new whisper files take about a second to appear
    assert want <= legends, f"legends {sorted(legends)}, wanted {sorted(want)}"
