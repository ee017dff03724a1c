"""Audit of the benchmark scripts (benchmarks/*.py): a bad value is refused with one line before any
work starts, including the values that failed only at the end of a long run (an --out/--json path
that cannot take the file, an unknown agent or topology met by the simulator's part after every real
run), and every command the docs print parses with the values it is written with.

Nothing here runs a benchmark: the scripts are run in one helper process (`test_docs_commands.probe`)
with values each refuses before starting anything, so a script that wrongly starts work shows as a
timeout or an exception, not as minutes of CPU."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from test_docs_commands import BENCHMARKS, DOCS, ROOT, _refusal, probe

SOCIAL = str(ROOT / "agents" / "microservice_cores" / "policies" / "reclaimer-social")


def _cases(tmp: Path) -> list[tuple[str, list[str], str]]:
    """(script, argv, the refusal's expected words); BLOCK is a regular file, so BLOCK/x cannot be made."""
    block, out = tmp / "BLOCK", tmp / "never-made"
    bad_json = str(block / "x.json")
    return [
        # the simulator's part ran only after every real run (hours), then raised
        ("microservice_testbed_compare", ["--agents", "autoscale,nope", "--out", str(out)],
         "microservice-cores has no controller 'nope'"),
        ("microservice_testbed_compare", ["--agents", "autoscale+bogus", "--out", str(out)],
         "unknown modifier +bogus"),
        ("microservice_testbed_compare", ["--topology", "nope", "--out", str(out)], "unknown application 'nope'"),
        ("microservice_testbed_compare", ["--seconds", "0", "--out", str(out)],
         "--seconds and every --users must be at least 1"),
        ("microservice_testbed_compare", ["--users", "0", "--out", str(out)],
         "--seconds and every --users must be at least 1"),
        ("microservice_testbed_compare", ["--out", str(block / "d")], "is a file (or lies under one)"),
        # the fine-tune made its folder and loaded the policy first, then raised (or wrote an empty result)
        ("microservice_testbed_finetune", ["--rounds", "0", "--out", str(out)], "--rounds must be at least 1"),
        ("microservice_testbed_finetune", ["--users", "x", "--out", str(out)],
         "--users must be comma-separated whole numbers"),
        ("microservice_testbed_finetune", ["--seconds", "0", "--out", str(out)], "seconds must be a whole number >= 1"),
        ("microservice_testbed_finetune", ["--policy", "/nonexistent", "--out", str(out)], "no metadata.json"),
        ("microservice_testbed_finetune", ["--out", str(block / "d")], "is a file (or lies under one)"),
        # a file written only after the whole run
        ("microservice_twin_tail", ["--out", bad_json], "is a file (or lies under one)"),
        ("oversub_hindsight", ["--setting", "tiny", "--episodes", "1", "--json", bad_json],
         "is a file (or lies under one)"),
        ("oversub_baselines_at", ["--case", "tiny-cold", "--tune-alpha", "0.9", "--json", bad_json],
         "is a file (or lies under one)"),
        ("oversub_rate_grid", ["--case", "tiny-cold", "--rule", "Max", "--json", bad_json],
         "is a file (or lies under one)"),
        ("reclaimer_ceiling_probe", ["--out", bad_json], "is a file (or lies under one)"),
        ("reclaimer_keyed_oracle", ["--out", bad_json], "is a file (or lies under one)"),
        ("reclaimer_load_steps", ["--json", bad_json], "is a file (or lies under one)"),
        ("reclaimer_transfer", ["--policy", f"a={SOCIAL}", "--out", bad_json], "is a file (or lies under one)"),
        ("microservice_testbed_pool", ["--json", bad_json], "is a file (or lies under one)"),
        ("sinan_live_crossfit", ["--samples", "/nonexistent", "--samples", "/nonexistent", "--out", bad_json],
         "cannot read the samples"),
        ("sinan_live_crossfit", ["--samples", "a", "--samples", "b", "--weights", "x"],
         "every --weights must be whole numbers of at least 1"),
        ("sinan_live_crossfit", ["--samples", "a", "--samples", "b", "--twin-seconds", "0"],
         "--twin-seconds and every --weights"),
        # a candidate twin refused by the topology only after the first candidate's runs
        ("microservice_twin_tail", ["--jitter-p", "2"], "--chains/--jitter-p/--jitter-ms (chain 0.15): ValidationError"),
        # the engine started, then time.sleep refused it as "cannot measure here"
        ("docker_update_cost", ["--idle-s", "-1"], "--idle-s must be a number of seconds >= 0"),
        # `samm serve` died with the reason on a discarded stderr: a RuntimeError traceback
        ("osdec_schedule", ["--agent", "nope"], "--agent nope: unknown agent 'nope'"),
        ("osdec_schedule", ["--agent", "osdec=/nonexistent"], "--agent osdec=/nonexistent: /nonexistent: no metadata.json"),
        ("osdec_schedule", ["--eligible", "-1"], "--eligible must be at least 0"),
        ("service_latency", ["--agent", "nope", "--seconds", "1"], "samm serve --agent nope exited with 2"),
        ("reclaimer_allocate", ["--policy", "/nonexistent"], "--policy: /nonexistent: no metadata.json"),
        ("microservice_twin_replay", ["--copies", "0", "/nonexistent"], "--copies must be at least 1, not 0"),
        ("oversub_threshold_margin", ["--settings", "tiny", "nope"], "unknown oversubscription setting 'nope'"),
        ("reclaimer_headroom", ["--windows", "0"], "every --windows must be at least 1 and every --headrooms > 0"),
        ("reclaimer_action_scale", ["--seconds", "0"], "--seconds must be at least 1, not 0"),
        ("reclaimer_validation", ["--threads", "0"], "--threads must be at least 1, not 0"),
        ("reclaimer_per_service", ["--app", "hotel", "--users", "-5"], "--users must be a user count >= 0, not -5"),
        ("reclaimer_validation", ["--apps", "chain3"], "no shipped Reclaimer policy for 'chain3'"),
        ("reclaimer_transfer", ["--policy", SOCIAL], f"--policy takes NAME=POLICY_DIR, not {SOCIAL!r}"),
        ("reclaimer_static_oracle", ["--users", "500,-1"], "--users must be user counts >= 0, not 500,-1"),
        ("reclaimer_headroom", ["--headrooms", "1.2,-1"], "every --windows must be at least 1"),
        ("oversub_validation_size", ["--runs", "r", "--cache", str(tmp / "c"), "--sizes", "x"],
         "--sizes must be comma-separated whole numbers, got 'x'"),
        ("oversub_validation_size", ["--runs", "r", "--cache", str(tmp / "c"), "--test-episodes", "0"],
         "--test-episodes must be at least 1"),
        ("oversub_validation_size", ["--runs", "r", "--cache", str(block / "c")], "is a file (or lies under one)"),
        # oversub_hindsight ran the N-sigma tuning first, then scanned nothing or raised on unpacking
        ("oversub_hindsight", ["--setting", "tiny", "--alpha", "2"], "--alpha must lie in (0, 1), not 2.0"),
        ("oversub_hindsight", ["--setting", "tiny", "--h"], "--h must name one or more multiples > 0"),
        ("oversub_hindsight", ["--setting", "tiny", "--h", "-1"], "--h must name one or more multiples > 0"),
        ("oversub_hindsight", ["--setting", "tiny", "--variants", "bad"], "--variants must be AGG:STAT pairs"),
        ("oversub_hindsight", ["--setting", "tiny", "--variants", "p90:max"], "not 'p90:max'"),
    ]


@pytest.fixture(scope="module")
def refused(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench-audit")
    (tmp / "BLOCK").write_text("a file, not a folder\n")
    cases = _cases(tmp)
    argvs = [[str(BENCHMARKS / f"{name}.py"), *argv] for name, argv, _ in cases]
    (tmp / "cwd").mkdir()
    return tmp, cases, argvs, probe(argvs, tmp / "cwd", timeout=300)


def test_bad_values_are_refused_with_one_line_before_any_work(refused):
    tmp, cases, argvs, res = refused
    problems = []
    for (name, argv, expected), case in zip(cases, argvs):
        line = _refusal(res[" ".join(case)])
        if expected not in line:
            problems.append(f"{name} {' '.join(argv)}: {line!r}")
        elif res[" ".join(case)]["stdout"].strip():  # a row printed: work began before the refusal
            problems.append(f"{name} {' '.join(argv)}: printed {res[' '.join(case)]['stdout'][:200]!r}")
    assert not problems, "\n".join(problems)


def test_a_refused_compare_or_finetune_leaves_no_output_folder(refused):
    tmp = refused[0]
    assert not (tmp / "never-made").exists()
    assert (tmp / "BLOCK").read_text() == "a file, not a folder\n"
    assert not list((tmp / "cwd").glob("runs*"))


# ---- the docs' commands with their values ----------------------------------------------------------

PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*(=[A-Z][A-Z0-9_]*)?(\.\.\.)?")


def doc_benchmark_commands() -> list[tuple[str, str, list[str]]]:
    """(doc, script stem, argv) of each `benchmarks/X.py ...` the docs print, in fenced blocks and in
    inline spans, a span broken over lines included (test_docs_commands reads a span on one line)."""
    found = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        lines = [line for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
                 for line in block.replace("\\\n", " ").splitlines()]
        lines += [" ".join(s.split()) for s in re.findall(r"`([^`]+)`", re.sub(r"```.*?```", "", text, flags=re.S))]
        for line in lines:
            for m in re.finditer(r"benchmarks/(\w+)\.py((?:\s+[^\s`;]+)*)", line):
                found.append((doc.relative_to(ROOT).as_posix(), m.group(1), documented_argv(m.group(2).split())))
    return found


def documented_argv(words: list[str]) -> list[str]:
    """The words as a command line: [optional] brackets dropped, the first of `a|b` alternatives, up
    to a shell comment or `...`; an option whose value is a placeholder (DIR, A, NAME=DIR, RUN...)
    is left out, since only its name is what the docs claim."""
    argv = []
    for w in (w.replace("[", "").replace("]", "") for w in words):
        if w in ("#", "..."):
            break
        argv.append(w.split("|")[0])
    kept, i = [], 0
    while i < len(argv):
        if argv[i].startswith("--") and i + 1 < len(argv) and PLACEHOLDER.fullmatch(argv[i + 1]):
            i += 2
            continue
        kept.append(argv[i])
        i += 1
    return kept


def test_documented_argv_keeps_values_and_drops_placeholders():
    assert documented_argv(["--case", "internal-warm|internal-cold", "--alpha", "A", "--seeds", "1,2"]) == \
        ["--case", "internal-warm", "--seeds", "1,2"]
    assert documented_argv(["--runs", "RUN...", "--sizes", "40,80", "[--ramp", "60]", "#", "29", "s"]) == \
        ["--sizes", "40,80", "--ramp", "60"]


def test_every_documented_benchmark_command_parses_with_its_values(tmp_path):
    """Each documented command, with --help appended, goes through the script's argparse: an option
    renamed or dropped, a choice (--case, --rule, --test) or a typed value (--episodes 300) the script
    no longer takes fails here, before --help is reached."""
    commands = doc_benchmark_commands()
    assert len(commands) > 60
    argvs = [[str(BENCHMARKS / f"{stem}.py"), *argv, "--help"] for _, stem, argv in commands]
    res = probe(argvs, tmp_path)
    problems = [f"{doc}: benchmarks/{stem}.py {' '.join(argv)}: exit {res[' '.join(case)]['code']}: "
                f"{res[' '.join(case)]['stderr'].strip()[-200:]}"
                for (doc, stem, argv), case in zip(commands, argvs) if res[" ".join(case)]["code"] != 0]
    assert not problems, "\n".join(problems)


def test_a_multiline_doc_span_is_read_whole():
    keyed = [argv for doc, stem, argv in doc_benchmark_commands() if stem == "reclaimer_keyed_oracle"]
    assert ["--app", "hotel", "--scales", "1,1.03,1.05,1.08"] in keyed


# ---- what the scripts import -----------------------------------------------------------------------

def _declared() -> tuple[set[str], set[str]]:
    """(distributions a benchmark may need: install_requires and the train, bench, testbed and ray
    extras; those only the dev extra (the test tools) declares)."""
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    names = lambda text: {re.split(r"[\s\[<>=!~;]", line.strip(), maxsplit=1)[0].lower().replace("_", "-")
                          for line in text.splitlines() if line.strip()}
    extras = cfg["options.extras_require"]
    usable = names(cfg["options"]["install_requires"]).union(*(names(extras[k]) for k in extras if k != "dev"))
    return usable, names(extras["dev"]) - usable


def _third_party_imports(path: Path) -> set[str]:
    import ast
    import sys

    mods = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            mods |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            mods.add(node.module.split(".")[0])
    local = {"agents", "samm", "sim_bridge", "__future__"} | {p.stem for p in BENCHMARKS.glob("*.py")}
    return {m for m in mods if m not in local and m not in sys.stdlib_module_names}


def test_benchmarks_import_only_what_the_package_declares_outside_the_test_tools():
    """A benchmark run after `pip install .[bench]` (or [train], [testbed], [ray]) must not need a test
    tool: service_latency.py imported httpx, which only the dev extra declares."""
    from importlib.metadata import packages_distributions

    usable, dev_only = _declared()
    dists = packages_distributions()
    problems = []
    for script in sorted(BENCHMARKS.glob("*.py")):
        for mod in sorted(_third_party_imports(script)):
            names = {d.lower().replace("_", "-") for d in dists.get(mod, [mod])}
            if not names & usable:
                problems.append(f"{script.name} imports {mod} ({', '.join(sorted(names))}): "
                                f"{'only the dev extra declares it' if names & dev_only else 'not declared'}")
    assert not problems, "\n".join(problems)


# ---- an earlier comparison's figures ---------------------------------------------------------------

def test_a_compare_rerun_moves_the_earlier_figures_aside(tmp_path):
    """A --skip-real rerun on the folder of a real comparison wrote compare.json over its real figures
    (the load and wall times --reuse takes from it, the rows of runs whose folders were later removed);
    now the earlier compare.json and compare.md are kept as compare.previous.*."""
    import json
    import subprocess
    import sys

    out = tmp_path / "cmp"
    out.mkdir()
    earlier = {"meta": {"seconds": 600}, "rows": [{"agent": "autoscale", "users": 6,
                                                   "real": {"mean_cores": 2.5, "load_before": [0.1]}}]}
    (out / "compare.json").write_text(json.dumps(earlier))
    (out / "compare.md").write_text("| the real runs |\n")
    r = subprocess.run([sys.executable, str(BENCHMARKS / "microservice_testbed_compare.py"), "--agents", "autoscale",
                        "--users", "6", "--seconds", "3", "--sim-seeds", "0", "--skip-real", "--out", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((out / "compare.previous.json").read_text()) == earlier
    assert (out / "compare.previous.md").read_text() == "| the real runs |\n"
    now = json.loads((out / "compare.json").read_text())
    assert now["rows"][0]["real"]["skipped"] and now["rows"][0]["sim"]["seeds"] == [0]
