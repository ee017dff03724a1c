"""The `samm` command line. Every verb has `--help`."""
from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import click

from samm import __version__
from samm.cli.seeds import parse_seeds


def _problem_choices() -> list[str]:
    from agents.registry import problem_names

    return problem_names()


def _learner_choices() -> list[str]:
    from agents.registry import learner_names

    return learner_names()


def _fail(msg: str, code: int = 2) -> None:
    """One line on stderr and the exit status: 2 for bad usage, 1 for a failure of the work."""
    click.echo(f"error: {msg}", err=True)
    sys.exit(code)


@contextlib.contextmanager
def _simulating(verb: str, kept: str):
    """The simulation of a verb that runs episodes. Ctrl-C: one line naming what it kept or wrote,
    exit 130, as `samm train` and `samm demo` do (click's bare "Aborted!" exited 1 and named
    nothing). The simulator failing (no jar, the JVM gone): one line, exit 1 (a traceback)."""
    from sim_bridge.errors import BridgeError

    try:
        yield
    except KeyboardInterrupt:
        click.echo(f"error: {verb}: interrupted; {kept}", err=True)
        sys.exit(130)
    except BridgeError as exc:
        _fail(f"{verb}: the simulator: {exc}; {kept}", code=1)


def _one_line(exc: Exception, whole: str, fields: dict[str, str] | None = None) -> str:
    """`exc` as one line: pydantic's errors through the service's own flattening (each field
    named, the input left out), a field that came from an option named as that option, and an
    error of the whole model (no field) named `whole`."""
    from pydantic import ValidationError

    if not isinstance(exc, ValidationError):
        return " ".join(str(exc).split())
    from samm.plan.schemas import validation_detail

    fields = fields or {}
    errors = []
    for e in exc.errors():
        loc = tuple(e.get("loc") or ())
        head = fields.get(str(loc[0]), loc[0]) if loc else whole
        errors.append({**e, "loc": (head, *loc[1:])})
    return validation_detail(errors)


def _sim_config(config_path: str | None, preset: str, initial: str | None, action_mode: str | None,
                max_steps: int | None):
    from pydantic import ValidationError

    from sim_bridge.config import load_sim_config

    # a value given as an option is named as that option, not as the field of the config file
    given = {"max_steps": "--max-steps"} if max_steps is not None else {}
    try:
        cfg = load_sim_config(config_path, preset=preset, action_mode=action_mode, max_steps=max_steps)
    except (ValidationError, ValueError, OSError) as exc:
        # the file's own problems name it already; a field's value may come from it
        where = f" {config_path}" if config_path and isinstance(exc, ValidationError) else ""
        _fail(f"invalid simulation config{where}: {_one_line(exc, 'config', given)}")
    if initial:
        try:
            cfg = cfg.with_initial([int(x) for x in initial.split(",")])
        except (ValidationError, ValueError) as exc:
            _fail(f"--initial {initial!r}: {_one_line(exc, 'initial')}")
    return cfg


#: the parameters of workload_options (a run that reads no workload refuses them)
SWF_OPTIONS_PARAMS = ("workload", "window", "time_compression", "mips_per_core", "max_jobs")
CONFIG_OPTIONS_PARAMS = ("config_path", "preset", "initial", "action_mode", "max_steps")
NUMPY_MAX_SEED = 2**32 - 1  # the training plan seeds numpy's legacy generator with `samm train --seed`
#: slots per node of `samm evaluate --problem lra-placement` (the placement evaluation's cluster)
PLACEMENT_SLOTS = 8
TUNABLE = ("threshold", "target-tracking", "queue")  # autoscaling's baselines with a grid (agents/tune.py)
SWF_OPTIONS = {"window_start_s": "--window", "window_end_s": "--window", "time_compression": "--time-compression",
               "mips_per_core": "--mips-per-core", "max_jobs": "--max-jobs"}


def _workload(spec: str, cfg, window: str | None, compression: float | None, mips: float | None, max_jobs: int | None):
    import math

    from pydantic import ValidationError

    from sim_bridge.workloads import SwfTransform, load_workload

    # checked for every verb here: a 0 was once taken for "not given" and silently ignored
    for flag, value in (("--time-compression", compression), ("--mips-per-core", mips), ("--max-jobs", max_jobs)):
        if value is not None and not (math.isfinite(value) and value > 0):
            _fail(f"{flag} must be a finite number > 0, got {value}")
    opts = {}
    if window:
        try:
            start, _, end = window.partition(":")
            opts["window_start_s"] = float(start or 0)
            if end:
                opts["window_end_s"] = float(end)
        except ValueError:
            _fail(f"--window must be START:END in seconds, got {window!r}")
        if not all(math.isfinite(v) for v in opts.values()):
            _fail(f"--window must be START:END in finite seconds, got {window!r}")
    for key, value in (("time_compression", compression), ("mips_per_core", mips), ("max_jobs", max_jobs)):
        if value is not None:
            opts[key] = value
    try:
        transform = SwfTransform(**opts) if opts else None
    except ValidationError as exc:
        _fail(f"workload {spec!r}: {_one_line(exc, '--window', SWF_OPTIONS)}")
    try:
        return load_workload(spec, transform, core_cap=cfg.job_core_cap)
    except (ValidationError, ValueError, OSError) as exc:
        msg = _one_line(exc, "workload")
        _fail(msg if msg.startswith(f"workload {spec!r}") else f"workload {spec!r}: {msg}")


def workload_options(f):
    for opt in reversed([
        click.option("--workload", default="seed-1551", show_default=True,
                     help="`seed-1551` (the paper's synthetic workload) or a path to an SWF trace (.swf or .swf.gz)."),
        click.option("--window", default=None, help="SWF only: keep jobs submitted in START:END seconds from the trace start."),
        click.option("--time-compression", type=float, default=None, help="SWF only: divide arrivals and run times by this factor."),
        click.option("--mips-per-core", type=float, default=None, help="SWF only: MIPS the trace's run times were measured at (default 4400)."),
        click.option("--max-jobs", type=int, default=None, help="SWF only: keep at most this many jobs of the window."),
    ]):
        f = opt(f)
    return f


def config_options(f):
    for opt in reversed([
        click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False), default=None,
                     help="YAML/JSON simulation config (unknown keys are rejected)."),
        click.option("--preset", type=click.Choice(["paper", "realistic"]), default="paper", show_default=True,
                     help="`paper`: no cool-down (the paper's simulator); `realistic`: ASG-like cool-down and warm-up."),
        click.option("--initial", default=None, help="Initial VMs per type, e.g. 10,10,10."),
        click.option("--action-mode", type=click.Choice(["paper", "per-type"]), default=None,
                     help="`paper`: Discrete(1+2n); `per-type`: remove/keep/add for every type at once."),
        click.option("--max-steps", type=int, default=None, help="Truncate episodes after this many steps."),
    ]):
        f = opt(f)
    return f


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="samm")
def cli() -> None:
    """SAMM: a MAPE-K monitoring and management daemon that scales cloud resources with learned
    policies, trained in a CloudSim Plus simulation."""


@cli.group()
def sim() -> None:
    """Run the CloudSim Plus simulation of the paper's heterogeneous autoscaling problem."""


@sim.command("run")
@workload_options
@config_options
@click.option("--policy", default="noop", show_default=True, help="noop, random, or static:S,M,L (hold that fleet).")
@click.option("--seed", type=click.IntRange(0, 2**62 - 1), default=0, show_default=True,
              help="Simulation seed (boot delays).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def sim_run(workload, window, time_compression, mips_per_core, max_jobs, config_path, preset, initial, action_mode,
            max_steps, policy, seed, as_json) -> None:
    """Run one episode with a built-in policy and print its cost report."""
    from agents.builtin import make_builtin_policy
    from sim_bridge.errors import BridgeError
    from sim_bridge.runner import run_episodes

    # checked here: 0 would otherwise be taken for "not given" and silently ignored
    for flag, value in (("--time-compression", time_compression), ("--mips-per-core", mips_per_core),
                        ("--max-jobs", max_jobs), ("--max-steps", max_steps)):
        if value is not None and not value > 0:
            _fail(f"{flag} must be positive, got {value}")
    cfg = _sim_config(config_path, preset, initial, action_mode, max_steps)
    wl = _workload(workload, cfg, window, time_compression, mips_per_core, max_jobs)
    try:
        agent = make_builtin_policy(policy, cfg.action_mode, tuple(t.name for t in cfg.vm_types), seed=seed)
    except ValueError as exc:
        _fail(str(exc))
    try:
        result = run_episodes(cfg, wl, agent, [seed])[0]
    except BridgeError as exc:
        _fail(str(exc))
    result["policy"] = policy
    if as_json:
        click.echo(json.dumps(result))
    else:
        click.echo(format_report([result]))


@sim.command("bench")
@click.option("--envs", type=click.IntRange(min=1), default=8, show_default=True, help="Environments stepped per batched call.")
@click.option("--steps", type=click.IntRange(min=1), default=4000, show_default=True, help="Batched steps per timed run.")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True,
              help="Timed runs of each loop (median reported).")
@click.option("--threads", type=click.IntRange(min=0), default=0, show_default=True,
              help="Java threads per batch (0 = one per CPU).")
@click.option("--seed", type=click.IntRange(0, 2**62 - 1), default=0, show_default=True,
              help="Seeds the actions and the boot delays.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def sim_bench(envs, steps, repeats, threads, seed, as_json) -> None:
    """Env-steps/s through the bridge vs the same simulation in a Java-only loop (seed-1551)."""
    from sim_bridge.bench import run_bench
    from sim_bridge.config import SimConfig
    from sim_bridge.errors import BridgeError
    from sim_bridge.workloads import seed_1551

    try:
        result = run_bench(SimConfig(threads=threads), seed_1551(), envs, steps, seed=seed, repeats=repeats)
    except BridgeError as exc:
        _fail(str(exc))
    if as_json:
        click.echo(json.dumps(result))
    else:
        for k, v in result.items():
            click.echo(f"{k:28s} {v}")


def format_report(results: list[dict]) -> str:
    cols = [("policy", "policy", "{}"), ("steps", "steps", "{}"), ("total cost $", "total_cost", "{:.2f}"),
            ("VM cost $", "vm_cost", "{:.2f}"), ("wait penalty $", "wait_penalty", "{:.2f}"),
            ("makespan min", "makespan_s", "{:.1f}"), ("mean wait s", "mean_wait_s", "{:.1f}"),
            ("p95 wait s", "p95_wait_s", "{:.1f}"), ("mean cores", "mean_allocated_cores", "{:.1f}"),
            ("mean CPU", "mean_cpu_util", "{:.2f}")]
    rows = []
    for r in results:
        row = []
        for _, key, fmt in cols:
            v = r.get(key)
            if key == "makespan_s" and v is not None:
                v = v / 60.0
            row.append("-" if v is None else fmt.format(v))
        rows.append(row)
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, (h, _, _) in enumerate(cols)]
    line = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([line([h for h, _, _ in cols]), line(["-" * w for w in widths]), *map(line, rows)])


PAPER_THRESHOLD = {"upper": 0.75, "lower": 0.75, "cooldown_steps": 5}  # the paper's best ASG rule


def _demo_agents():
    from agents.shipped import shipped_policy_dir

    runs = [("threshold (paper, T=75%)", "threshold", PAPER_THRESHOLD)]
    if shipped_policy_dir():
        runs.insert(0, ("lstm-ppo (shipped)", "lstm-ppo", None))
    return runs


def _sim_results(workload: str, seed: int, runs) -> list[tuple[str, dict]]:
    from agents.factory import make_agent
    from sim_bridge.config import SimConfig
    from sim_bridge.runner import run_episodes
    from sim_bridge.workloads import load_workload

    cfg = SimConfig(action_mode="per-type")
    wl = load_workload(workload)
    out = []
    for label, kind, params in runs:
        r = run_episodes(cfg, wl, make_agent(kind, cfg, params), [seed], traces=False)[0]
        out.append((label, r))
    return out


@cli.command()
@click.option("--sim", "sim_only", is_flag=True, help="Only the CloudSim Plus comparison (seconds), no testbed.")
@click.option("--workload", default=None,
              help="Workload (default: seed-1551-short on the testbed, the full seed-1551 with --sim).")
@click.option("--compression", type=float, default=30.0, show_default=True,
              help="Testbed: workload seconds per wall second (not with --sim).")
@click.option("--seed", type=click.IntRange(0, 2**62 - 1), default=1, show_default=True,
              help="Seeds the boot delays (the simulator's seed space).")
@click.option("--out", type=click.Path(file_okay=False), default="demo-report", show_default=True,
              help="Report directory (report.md, summary.json, PNG figures).")
def demo(sim_only, workload, compression, seed, out) -> None:
    """The main job on embedded defaults: the shipped LSTM-PPO policy and the paper's threshold
    rule each manage the emulated cloud (moto ASGs, real worker processes, real Graphite, the
    SAMM daemon) through the paper's workload; then a comparison like the paper's and a report
    with figures. `--sim` runs the same comparison in CloudSim Plus only."""
    import math
    import signal
    import threading

    from tqdm import tqdm

    from samm.testbed.report import table, write_report
    from sim_bridge.config import SimConfig
    from sim_bridge.errors import BridgeError
    from sim_bridge.workloads import load_workload

    if sim_only:  # the simulator steps a minute at a time: `--sim --compression 60` changed nothing
        _refuse_given(click.get_current_context(), {"compression"}, "applies to the testbed, not --sim")
    runs = _demo_agents()
    if not (math.isfinite(compression) and compression > 0):
        _fail(f"--compression must be a finite number > 0, got {compression}")
    workload = workload or ("seed-1551" if sim_only else "seed-1551-short")
    try:
        wl = load_workload(workload)
    except (KeyError, ValueError, OSError) as exc:
        _fail(f"--workload: {exc}")
    if wl.n_jobs < 1:
        _fail(f"--workload {workload!r} has no jobs")
    # the comparison in CloudSim Plus (_sim_results) runs last, after the testbed's minutes: a job
    # larger than its largest VM type stopped it there with a traceback and no summary written
    cap = SimConfig(action_mode="per-type").job_core_cap
    if int(wl.cores.max()) > cap:
        _fail(f"--workload {workload!r} has a {int(wl.cores.max())}-core job; the demo's largest VM type has "
              f"{cap} cores")
    out_dir = Path(out)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with open(out_dir / "demo.log", "a"):
            pass
    except OSError as exc:
        _fail(f"--out {out}: cannot write there: {exc}")
    if sim_only:
        click.echo(f"SAMM demo (CloudSim Plus only): {workload}, one-minute steps, S/M/L = 2/4/8 cores at "
                   "$0.2/0.4/0.8 per hour, penalty $0.036 per waiting job-hour.")
        _clear_last_report(out_dir)
        try:
            rows = _sim_results(workload, seed, tqdm(runs, desc="simulating", unit="policy"))
        except KeyboardInterrupt:  # was click's bare "Aborted!" (exit 1), unlike the testbed's 130
            click.echo("error: demo: interrupted; nothing written", err=True)
            sys.exit(130)
        except BridgeError as exc:  # e.g. the JVM, in Ctrl-C's process group, gone first
            _fail(f"demo: the simulator: {exc}", code=1)
        click.echo(table(rows))
        (out_dir / "summary.json").write_text(json.dumps({"workload": workload, "sim": dict(rows)}, indent=2))
        click.echo(f"wrote {out_dir / 'summary.json'}")
        return

    import logging

    from samm.testbed.run import TestbedOptions, TestbedOptionsError, check_options

    planned = []
    for label, kind, params in runs:  # every run's options and agent, before the first one starts
        opts = TestbedOptions(agent=kind, params=params, workload=workload, workload_obj=wl,
                              compression=compression, seed=seed, out_dir=str(out_dir / f"testbed-{kind}"))
        try:
            opts.agent_obj = check_options(opts)
        except TestbedOptionsError as exc:
            _fail(f"demo: {label}: {exc}")
        planned.append((label, kind, opts))
    _clear_last_report(out_dir)
    # the daemon's and the testbed's logs go to a file; the terminal shows progress
    logging.basicConfig(filename=str(out_dir / "demo.log"), level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    click.echo(f"SAMM demo: {workload} on the emulated cloud testbed at {compression:g}x time compression "
               f"(one daemon interval = {60 / compression:g} s wall). The workload is the first 6 batches (600 "
               "jobs) of the paper's seed-1551, cut so both runs fit in ten minutes; `samm demo --workload "
               "seed-1551` runs the full one (its workload runs about 2.8 times as long).")
    tb_rows, figures, results = [], [], {}

    def on_sigterm(signum, _frame):  # stop like Ctrl-C: the fleet is stopped and partial results kept
        raise KeyboardInterrupt(f"signal {signum}")

    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, on_sigterm) if in_main else None
    try:
        for label, kind, opts in planned:
            try:
                res, figure = _testbed_run(label, opts, out_dir / f"vms_vs_waiting_{kind}.png")
            except TimeoutError as exc:
                _fail(f"demo: {label}: {exc}; partial results in {opts.out_dir}", code=1)  # the work failed
            tb_rows.append((label, res.summary))
            results[label] = {"summary": res.summary, "wall_s": round(res.wall_s, 1),
                              "daemon_iterations": res.daemon_iterations}
            figures.append(figure)
        click.echo("\nTestbed (the daemon managing moto ASGs and real worker processes):")
        click.echo(table(tb_rows))
        # inside the try: a Ctrl-C here was "Aborted!" with the testbed's minutes unnamed
        sim_rows = _sim_results(workload, seed, runs)
    except KeyboardInterrupt:
        click.echo(f"error: demo: interrupted; partial results in {out_dir}", err=True)
        sys.exit(130)
    except BridgeError as exc:
        _fail(f"demo: the simulator: {exc}; the testbed's results in {out_dir}", code=1)
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)
    click.echo("\nThe same in CloudSim Plus:")
    click.echo(table(sim_rows))
    notes = [f"compression {compression:g}x; collectors report every wall second ({compression:g} workload s)",
             "worker CPU = share of the instance's cores held by jobs (the simulator's definition); jobs burn "
             "a small real CPU slice so 30 instances fit on two cores"]
    report = write_report(out_dir, workload, tb_rows, sim_rows, figures, notes)
    (out_dir / "summary.json").write_text(json.dumps({"workload": workload, "testbed": results,
                                                       "sim": dict(sim_rows)}, indent=2))
    click.echo(f"\nwrote {report} and {len(figures)} figure(s) in {out_dir}")


def _clear_last_report(out_dir: Path) -> None:
    """A re-run into the same --out that stops early must not leave the last run's summary and
    report beside its partial results, to be read as this run's (as `samm testbed` does)."""
    for name in ("summary.json", "report.md"):
        (out_dir / name).unlink(missing_ok=True)


def _testbed_run(label: str, opts, figure_path: Path):
    """One policy on the testbed with a progress bar; returns the result and its Fig. 11 PNG."""
    from tqdm import tqdm

    from samm.testbed.report import figure_vms_vs_waiting
    from samm.testbed.run import run_testbed
    from sim_bridge.workloads import load_workload

    n = opts.workload_obj.n_jobs if opts.workload_obj is not None else load_workload(opts.workload).n_jobs
    bar = tqdm(total=n, desc=f"testbed: {label}", unit="job")

    def progress(row):
        bar.n = row["completed"]
        bar.set_postfix(t_min=f"{row['t_s'] / 60:.0f}", vms=f"{row['S_vms']}/{row['M_vms']}/{row['L_vms']}",
                        waiting=row["waiting"])
        bar.refresh()

    try:
        res = run_testbed(opts, progress=progress)
        bar.n = res.summary["jobs_finished"]
    finally:
        bar.close()
    figure = figure_vms_vs_waiting(res.timeline, f"{label}: VMs per type vs waiting jobs (testbed)", figure_path)
    return res, figure


@cli.group("testbed", invoke_without_command=True)
@click.option("--agent", "agent_kind", type=click.Choice(["lstm-ppo", "threshold", "target-tracking", "queue", "noop"]),
              default="lstm-ppo", show_default=True)
@click.option("--params", "params_json", default=None, help="JSON object of the agent's parameters (baselines).")
@click.option("--policy", "policy_dir", type=click.Path(exists=True, file_okay=False), default=None,
              help="Saved policy directory (default for lstm-ppo: the shipped policy).")
@click.option("--workload", default="seed-1551-short", show_default=True,
              help="seed-1551, seed-1551-short or a path to an SWF trace.")
@click.option("--compression", type=float, default=30.0, show_default=True, help="Workload seconds per wall second.")
@click.option("--cooldown", "cooldown_s", type=float, default=0.0, show_default=True,
              help="Daemon cool-down per group, in workload seconds.")
@click.option("--seed", type=int, default=1, show_default=True, help="Seeds the instances' boot delays.")
@click.option("--timeout", "timeout_s", type=float, default=1200.0, show_default=True,
              help="Wall seconds before giving up.")
@click.option("--out", type=click.Path(file_okay=False), default="testbed-run", show_default=True,
              help="Directory for the run (queue, knowledge store, logs, timeline.csv, summary.json, PNG).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
@click.pass_context
def testbed_cmd(ctx, agent_kind, params_json, policy_dir, workload, compression, cooldown_s, seed, timeout_s, out,
                as_json) -> None:
    """Run ONE policy on the emulated cloud testbed: moto's Auto Scaling Groups, a worker process
    per instance, a durable job queue, a real Graphite and the SAMM daemon (production code);
    prints billing and SLA figures in the simulator's units. `samm demo` runs two of these and
    compares them.

    The other problems' testbeds are its subcommands (`samm testbed microservices --agent ...`,
    also `samm testbed-microservices`; likewise `oversub` and `deferrable`)."""
    if ctx.invoked_subcommand is not None:  # another problem's testbed: its own options
        return
    import logging
    import signal
    import threading

    from samm.testbed.report import table
    from samm.testbed.run import TestbedOptions, TestbedOptionsError, check_options
    from sim_bridge.workloads import load_workload

    try:
        wl = load_workload(workload)
    except (KeyError, ValueError, FileNotFoundError) as exc:
        _fail(f"--workload: {exc}")
    if not 0 < compression < float("inf"):  # NaN passes `<= 0`
        _fail(f"--compression must be a positive number, got {compression}")
    if wl.n_jobs < 1:
        _fail(f"--workload {workload!r} has no jobs")
    opts = TestbedOptions(agent=agent_kind, params=_params(params_json), policy_dir=policy_dir, workload=workload,
                          workload_obj=wl, compression=compression, cooldown_s=cooldown_s, seed=seed, timeout_s=timeout_s)
    try:  # every option, the agent and its policy, before anything starts
        opts.agent_obj = check_options(opts)
    except TestbedOptionsError as exc:
        flag = {"compression": "--compression", "timeout_s": "--timeout", "cooldown_s": "--cooldown",
                "seed": "--seed", "agent": "--agent/--params/--policy", "workload": "--workload"}.get(exc.option or "")
        _fail(f"{flag}: {exc}" if flag else f"testbed: {exc}")
    out_dir = Path(out).resolve()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "summary.json").unlink(missing_ok=True)  # a failed run must not leave an old summary
        with open(out_dir / "testbed.log", "a"):
            pass
    except OSError as exc:
        _fail(f"--out {out}: cannot write there: {exc}")
    opts.out_dir = str(out_dir)
    logging.basicConfig(filename=str(out_dir / "testbed.log"), level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    def on_sigterm(signum, _frame):  # stop like Ctrl-C: the fleet is stopped and partial results kept
        raise KeyboardInterrupt(f"signal {signum}")

    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, on_sigterm) if in_main else None
    partial = out_dir / "summary.partial.json"
    try:
        res, figure = _testbed_run(agent_kind, opts, out_dir / "vms_vs_waiting.png")
    except TestbedOptionsError as exc:  # another testbed holds --out, or runs in this process
        _fail(f"--out {out}: {exc}" if exc.option == "out_dir" else f"testbed: {exc}")
    except TimeoutError as exc:
        _fail(f"testbed: {exc}; partial results in {partial if partial.exists() else out_dir} (logs in {out_dir})",
              code=1)  # the work failed, not its usage
    except KeyboardInterrupt:
        click.echo(f"error: testbed: interrupted; partial results in {partial if partial.exists() else out_dir}",
                   err=True)
        sys.exit(130)
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)
    summary = {"agent": agent_kind, "workload": workload, "compression": compression, "wall_s": round(res.wall_s, 1),
               "daemon_iterations": res.daemon_iterations, "summary": res.summary, "figure": str(figure)}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    if as_json:
        click.echo(json.dumps(summary))
    else:
        click.echo(table([(agent_kind, res.summary)]))
        click.echo(f"wrote {out_dir / 'summary.json'}, {out_dir / 'timeline.csv'} and {figure}")


def _seeds(text: str, flag: str = "--seeds") -> list[int]:
    from samm.cli.seeds import SeedsOutOfBounds

    try:
        return parse_seeds(text)
    except SeedsOutOfBounds as exc:
        _fail(f"{flag}: {exc}")
    except ValueError:
        _fail(f"{flag} must be a list like 1,2,3 or a range like 1-5, got {text!r}")
    return []


def _floats(text: str, flag: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        _fail(f"{flag} must be a comma-separated list of numbers, got {text!r}")
        return []


def _params(text: str | None, flag: str = "--params") -> dict | None:
    if not text:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        _fail(f"{flag} must be a JSON object: {exc}")
    except RecursionError:  # "[[[[..." thousands deep: the decoder recurses per level
        _fail(f"{flag} must be a JSON object: nested too deeply")
    if not isinstance(value, dict):
        _fail(f"{flag} must be a JSON object")
    return value


def _given_options(ctx: click.Context, skip: set[str]) -> list[str]:
    """The options typed on the command line, as flags for a problem's own trainer: `samm train`
    declares some (e.g. --init-policy, --envs) for autoscaling, and click would otherwise keep them
    from the trainer that reads the same flag; one the trainer does not know is its clear error."""
    from click.core import ParameterSource

    out: list[str] = []
    for p in ctx.command.params:
        if p.name in skip or not isinstance(p, click.Option) or \
                ctx.get_parameter_source(p.name) != ParameterSource.COMMANDLINE:
            continue
        flag = max(p.opts, key=len)
        value = ctx.params[p.name]
        if p.is_flag:
            out += [flag] if value else []
        else:
            for v in (value if p.multiple else [value]):
                out += [flag, str(v)]
    return out


def _refuse_given(ctx: click.Context, names: set[str], why: str) -> None:
    """Exit 2 naming the first option of `names` typed on the command line: an option the run
    would ignore must not look as if it had been applied."""
    from click.core import ParameterSource

    for p in ctx.command.params:
        if p.name in names and ctx.get_parameter_source(p.name) == ParameterSource.COMMANDLINE:
            _fail(f"{max(p.opts, key=len)} {why}")


@cli.command("train", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.option("--problem", type=click.Choice(_problem_choices()), default="autoscaling", show_default=True,
              help="Other problems take their own options after these, passed to their trainer, e.g. "
                   "`samm train --problem oversubscription --out DIR --setting azure --alpha 0.95` "
                   "(`python -m agents.oversubscription.train --help` lists them).")
@click.option("--agent", "agent_kind", type=click.Choice(_learner_choices()), default=None,
              help="The problem's learning agent (default: lstm-ppo for autoscaling, lra-reinforce for lra-placement).")
@click.option("--episodes", type=int, default=None, help="lra-placement: training episodes (batches placed).")
@click.option("--predictor", default="metis", show_default=True,
              help="lra-placement: metis (the random forest on Metis's data) or synthetic[:SEED].")
@workload_options
@config_options
@click.option("--timesteps", type=int, default=600_000, show_default=True, help="Environment steps in total.")
@click.option("--envs", type=int, default=16, show_default=True, help="Simulations stepped per batched call.")
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--out", type=click.Path(file_okay=False), required=True, help="Run directory (logs, checkpoint, policy/).")
@click.option("--resume", is_flag=True, help="Continue from <out>/checkpoint.pt (without it, an --out that holds "
              "a run is refused). Reproducible for a checkpoint, but the episodes restart at the resume, so not "
              "bit-identical to an uninterrupted run.")
@click.option("--eval-every", type=int, default=20, show_default=True, help="Evaluate every N updates (0 = never).")
@click.option("--eval-seeds", default="101-103", show_default=True,
              help="Seeds of the periodic evaluations that pick the saved snapshot (keep them apart from the final evaluation seeds).")
@click.option("--ppo", "ppo_json", default=None, help="JSON object overriding PPOConfig fields, e.g. '{\"learning_rate\": 1e-4}'.")
@click.option("--device", default="auto", show_default=True, help="auto (CUDA when present), cpu or cuda.")
@click.option("--workload-mix", "mix_path", default=None,
              help="Train on a workload distribution: a mix YAML (docs/workloads.md) or `default` (the shipped mix); "
                   "each episode replays a fresh sample. Replaces --workload.")
@click.option("--features", type=click.Choice(["paper", "extended"]), default=None,
              help="Observation: the paper's seven metrics, or those plus the queue features the rules see "
                   "(default: extended with --workload-mix or --init-policy of an extended policy, else paper).")
@click.option("--reward", "reward_kind", type=click.Choice(["cost", "waste"]), default=None,
              help="cost: -(VM cost + waiting penalty) per step (the paper); waste: only avoidable cost (idle cores, "
                   "lost work, waiting), same ranking of policies, no incentive to postpone work (default with a mix).")
@click.option("--reward-scale", type=click.Choice(["none", "work"]), default=None,
              help="work: divide rewards by the episode's workload's work cost, so every workload weighs alike "
                   "(default with a mix or with windows of a trace).")
@click.option("--init-policy", type=click.Path(exists=True, file_okay=False), default=None,
              help="Start from this lstm-ppo policy (fine-tuning, e.g. the shipped one on your own trace) instead of scratch.")
@click.option("--validation", "n_validation", type=int, default=12, show_default=True,
              help="With a mix or trace windows: training-split workloads (at least 1) that pick the saved snapshot.")
@click.option("--ray", "ray_address", default=None, metavar="local|auto|ADDRESS",
              help="Run the simulations on Ray rollout workers (pip install samm[ray]): `local` starts a cluster in "
                   "this process, `auto` joins the one `ray start --head` runs, else a cluster address. The learner "
                   "stays in this process; the same seeds give the same run as without --ray.")
@click.option("--rollout-workers", type=int, default=2, show_default=True,
              help="With --ray: Ray actors, each with its own gateway JVM and a share of the --envs.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.pass_context
def train_cmd(ctx, problem, agent_kind, episodes, predictor, workload, window, time_compression, mips_per_core, max_jobs, config_path, preset, initial,
              action_mode, max_steps, timesteps, envs, seed, out, resume, eval_every, eval_seeds, ppo_json, device,
              mix_path, features, reward_kind, reward_scale, init_policy, n_validation, ray_address, rollout_workers,
              quiet) -> None:
    """Train a problem's learning agent. Autoscaling: LSTM-PPO in the CloudSim Plus simulation
    (progress bar, TensorBoard + CSV logs, checkpoints, resume; the policy is saved to
    <out>/policy). Placement: the REINFORCE policy trained across batches (progress bar, CSV log;
    the policy is saved to <out>)."""
    from agents.registry import get_problem
    from sim_bridge.errors import BridgeError

    spec = get_problem(problem)
    if agent_kind is not None and agent_kind != spec.learner:
        _fail(f"--agent {agent_kind} is not the learning agent of problem {problem!r} ({spec.learner})")
    if problem == "lra-placement":
        from agents.lra_placement.train import main as train_placement

        # a given --episodes goes through even when 0 or negative: the trainer refuses it by name, where
        # dropping it ran the default 200,000 episodes; options of its own (--lr, --nodes ...) follow
        argv = ["--out", out, "--seed", str(seed), "--predictor", predictor]
        argv += ["--episodes", str(episodes)] if episodes is not None else []
        argv += ["--quiet"] if quiet else []
        sys.exit(train_placement(argv + _given_options(ctx, skip={"problem", "agent_kind", "out", "seed", "episodes",
                                                                  "quiet", "predictor"}) + list(ctx.args)))
    if problem != "autoscaling":
        # any other problem: its trainer's own argparse main, with the shared options first (a
        # plug-in without one, or whose reference cannot be imported, was a ValueError traceback)
        trainer = _problem_hook(problem, "train", "trainer for `samm train`")
        argv = ["--out", out, "--seed", str(seed)] + (["--episodes", str(episodes)] if episodes is not None else [])
        argv += ["--quiet"] if quiet else []
        sys.exit(trainer(argv + _given_options(ctx, skip={"problem", "agent_kind", "out", "seed", "episodes", "quiet"})
                         + list(ctx.args)))
    if ctx.args:
        _fail(f"unknown options for problem autoscaling: {' '.join(ctx.args)}")
    # each of these once went unread: `--episodes 50` trained the full --timesteps
    _refuse_given(ctx, {"episodes", "predictor"}, "applies to problem lra-placement, not autoscaling")
    if ray_address is None:
        _refuse_given(ctx, {"rollout_workers"}, "applies only with --ray")
    if n_validation < 1:  # fine-tuning picked its snapshot by the mean of no windows (NaN)
        _fail(f"--validation must be at least 1, got {n_validation}")
    if not 0 <= seed <= NUMPY_MAX_SEED:  # was numpy's "Seed must be between ..." or "Overflow ...", naming no option
        _fail(f"--seed must be an integer in 0..{NUMPY_MAX_SEED} (numpy's seeds), got {seed}")
    from agents.ppo.config import PPOConfig
    from agents.ppo.train import CHECKPOINT_FILE, refuse_existing_run
    from agents.train_log import TrainingDiverged
    from agents.training import train_lstm_ppo

    if not resume:
        try:  # before the plan's validation episodes, which take a while
            refuse_existing_run(Path(out))
        except ValueError as exc:
            _fail(str(exc))
    eval_seed_list = _seeds(eval_seeds, "--eval-seeds")  # before --out is made and the plan is built

    cfg = _sim_config(config_path, preset, initial, action_mode or "per-type", max_steps)
    overrides = _params(ppo_json, "--ppo") or {}
    plan = _training_plan(cfg, workload, window, time_compression, mips_per_core, max_jobs, mix_path, features,
                          reward_kind, reward_scale, init_policy, n_validation, seed)
    try:
        ppo = PPOConfig(**{"total_timesteps": timesteps, "num_envs": envs, "seed": seed, "eval_every": eval_every,
                           "device": device, **plan.ppo_defaults, **overrides}).validate()
    except (TypeError, ValueError) as exc:
        _fail(f"invalid PPO settings: {exc}")
    try:
        Path(out).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _fail(f"--out {out}: {exc}")
    try:
        _, summary = train_lstm_ppo(cfg, plan.workload, ppo, out, resume=resume, progress=not quiet,
                                    eval_seeds=eval_seed_list, features=plan.features,
                                    sampler_factory=plan.sampler_factory, reward_scale=plan.reward_scale,
                                    reward=plan.reward, validation=plan.validation, init_policy=init_policy,
                                    training_info=plan.info, ray_address=ray_address, rollout_workers=rollout_workers)
    except KeyboardInterrupt:  # click's bare "Aborted!" named neither what was kept nor how to go on
        kept = "its logs and checkpoint" if (Path(out) / CHECKPOINT_FILE).exists() else "its logs (no checkpoint yet)"
        click.echo(f"error: train: interrupted; {out} keeps {kept}; `--resume` continues the run", err=True)
        sys.exit(130)
    except ImportError as exc:
        _fail(f"--ray needs the ray package (pip install samm[ray]): {exc}")
    except TrainingDiverged as exc:  # a failure of the work, not of its usage
        _fail(str(exc), code=1)
    except ValueError as exc:
        _fail(str(exc))
    except BridgeError as exc:  # the simulator refused the config, or (--ray) a rollout worker could not start
        _fail(f"the simulator: {exc}")
    click.echo(json.dumps(summary))


def _training_plan(cfg, workload, window, time_compression, mips_per_core, max_jobs, mix_path, features, reward_kind,
                   reward_scale, init_policy, n_validation, seed):
    """What `samm train` trains on: one workload (the paper), a workload mix, or random windows of
    the user's own trace (fine-tuning); with the defaults each of these wants."""
    from agents.training import TrainingPlan

    try:
        return TrainingPlan.build(cfg, workload=workload, workload_loader=lambda: _workload(
            workload, cfg, window, time_compression, mips_per_core, max_jobs), mix_path=mix_path, features=features,
            reward=reward_kind, reward_scale=reward_scale, init_policy=init_policy, n_validation=n_validation,
            seed=seed)
    except (ValueError, OSError) as exc:
        _fail(str(exc))


@cli.command("evaluate")
@click.option("--problem", type=click.Choice(_problem_choices()), default="autoscaling", show_default=True,
              help="The problem (its agents and simulator).")
@click.option("--suite", type=click.Choice(["generalisation"]), default=None,
              help="autoscaling: run a whole suite instead of one agent. `generalisation`: the policy (--policy, "
                   "default the shipped one) and the three rules tuned on the training split, over the fixed "
                   "test-split windows plus seed-1551, 3 seeds each; cost relative to the best rule per window.")
@click.option("--rules", "rules_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="--suite: tuned-rules JSON (default: agents/policies/generalisation-rules.json).")
@click.option("--retune", is_flag=True, help="--suite: tune the rules on the training split now (minutes).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="--suite: write suite.json, suite.md (and tuned rules with --retune) here.")
@click.option("--agent", "agent_kind", default=None,
              help="autoscaling: noop, random, static:S,M,L, threshold, target-tracking, queue or lstm-ppo. "
                   "lra-placement: lra-reinforce, lra-reinforce-per-batch, optimum, greedy-ls, greedy, k8s-default, "
                   "least-loaded, round-robin or random. Another problem: an agent its `evaluate` accepts.")
@click.option("--nodes", type=int, default=9, show_default=True,
              help=f"lra-placement: nodes ({PLACEMENT_SLOTS} slots each).")
@click.option("--containers", default="15-48", show_default=True,
              help="lra-placement: batch size range LO-HI (1 <= LO <= HI), or one size N.")
@click.option("--predictor", type=click.Choice(["forest", "synthetic"]), default="forest", show_default=True,
              help="lra-placement: the interference model.")
@click.option("--policy", "policy_dir", type=click.Path(exists=True, file_okay=False), default=None,
              help="Saved policy directory (default for lstm-ppo: the shipped policy).")
@click.option("--params", "params_json", default=None, help="Baseline parameters as JSON.")
@workload_options
@config_options
@click.option("--seeds", default="1-5", show_default=True, help="Episode seeds: 1,2,3 or 1-5.")
@click.option("--stochastic", is_flag=True, help="Sample actions instead of taking the most likely one.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def evaluate_cmd(problem, suite, rules_path, retune, out_dir, agent_kind, nodes, containers, predictor, policy_dir,
                 params_json, workload, window, time_compression, mips_per_core, max_jobs, config_path, preset, initial,
                 action_mode, max_steps, seeds, stochastic, as_json) -> None:
    """Evaluate an agent over several seeded episodes. Autoscaling: per-episode and mean ± std of
    cost, makespan, waits, allocated cores and CPU utilisation; or a whole suite (`--suite
    generalisation`). Placement: mean normalised throughput per seeded batch beside the batch's
    exact optimum. Deferrable jobs (`--agent osdec` or a heuristic, e.g. tetris): total reward and
    its parts on held-apart test episodes."""
    ctx = click.get_current_context()
    if suite is not None:
        if problem != "autoscaling":
            _fail("--suite applies to problem autoscaling")
        # the suite fixes its agents, windows and seeds: `--suite ... --seeds 1-10` ran 3 seeds
        _refuse_given(ctx, {"agent_kind", "params_json", "seeds", "stochastic", "nodes", "containers", "predictor",
                            "max_steps", *SWF_OPTIONS_PARAMS},
                      "does not apply to --suite (it runs its own agents, windows and seeds)")
        written = f"no suite.json or suite.md written to {out_dir}" if out_dir else "nothing written"
        with _simulating("evaluate", written):
            _suite_cmd(_sim_config(config_path, preset, initial, action_mode or "per-type", max_steps), policy_dir,
                       rules_path, retune, out_dir, as_json)
        return
    if agent_kind is None:
        _fail("--agent is required (or --suite)")
    # without --suite these were read by nothing: `--out DIR` wrote no file and said nothing
    _refuse_given(ctx, {"rules_path", "retune", "out_dir"}, "applies only with --suite")
    if problem == "lra-placement":
        from agents.lra_placement.evaluate import evaluate as evaluate_placement

        size_range = _containers_range(containers)
        capacity = nodes * PLACEMENT_SLOTS
        if nodes >= 1 and size_range[1] > capacity:  # the batches were cut to the slots silently: 100 placed 72
            _fail(f"--containers {containers}: a batch of {size_range[1]} containers does not fit --nodes {nodes} "
                  f"({capacity} slots)")
        try:
            with _simulating("evaluate", "nothing written"):
                res = evaluate_placement(agent_kind, _seeds(seeds), policy_dir=policy_dir, n_nodes=nodes,
                                         slots=PLACEMENT_SLOTS, size_range=size_range, predictor=predictor)
        except (ValueError, FileNotFoundError) as exc:
            _fail(str(exc))
        if as_json:
            click.echo(json.dumps(res))
            return
        for e in res["episodes"]:
            click.echo(f"seed {e['seed']}: {e['containers']} containers, score {e['score']:.4f}, optimum "
                       f"{e['optimum']:.4f} (ratio {e['ratio_to_optimum']:.4f}), {e['seconds']:.2f} s")
        r = res["summary"]["ratio_to_optimum"]
        click.echo(f"{agent_kind}: mean ratio to optimum {r['mean']:.4f} ± {r['std']:.4f} over {r['n']} batches")
        return
    if problem == "deferrable-jobs":
        from agents.deferrable_jobs.evaluate import evaluate as evaluate_jobs

        try:
            with _simulating("evaluate", "nothing written"):
                res = evaluate_jobs(agent_kind, _seeds(seeds), policy_dir=policy_dir, params=_params(params_json))
        except (ValueError, FileNotFoundError, TypeError) as exc:
            _fail(str(exc))
        if as_json:
            click.echo(json.dumps(res))
            return
        for e in res["episodes"]:
            click.echo(f"seed {e['seed']}: total reward {e['total_reward']:.1f} (utilisation {e['utilisation']:.1f}, "
                       f"delay {e['delay_penalty']:.1f}, violation {e['violation_penalty']:.1f}), missed {e['missed']}")
        r = res["summary"]["total_reward"]
        click.echo(f"{agent_kind} ({res['version']}): mean total reward {r['mean']:.1f} ± {r['std']:.1f} over {r['n']} "
                   f"test episodes")
        return
    if problem != "autoscaling":
        # any other problem (a plug-in's too): the evaluator its spec names, with the shared options
        hook = _problem_hook(problem, "evaluate", "evaluator for `samm evaluate`")
        _refuse_given(ctx, {"nodes", "containers", "predictor", "stochastic", *SWF_OPTIONS_PARAMS, *CONFIG_OPTIONS_PARAMS},
                      f"applies to problems autoscaling and lra-placement, not {problem}")
        res = _run_hook(hook, problem, "evaluate", "nothing written", agent_kind, _seeds(seeds), policy_dir=policy_dir,
                        params=_params(params_json))
        click.echo(json.dumps(res, default=str) if as_json else
                   f"{agent_kind} on {problem}: " + json.dumps(res.get("summary", res), default=str))
        return
    from agents.evaluate import evaluate
    from agents.factory import make_agent

    cfg = _sim_config(config_path, preset, initial, action_mode, max_steps)
    wl = _workload(workload, cfg, window, time_compression, mips_per_core, max_jobs)
    try:
        agent = make_agent(agent_kind, cfg, _params(params_json), policy_dir)
    except (ValueError, FileNotFoundError, TypeError) as exc:  # TypeError: a --params value of the wrong type
        _fail(f"--agent {agent_kind}: {exc}")
    from samm.analyze import FleetSpec
    from samm.analyze.features import known_features

    unknown = sorted(set(agent.feature_names) - set(known_features(FleetSpec.from_vm_types(cfg.vm_types))))
    if unknown:  # a policy of another feature set or fleet
        _fail(f"--agent {agent_kind}: the policy reads feature(s) {unknown} that this simulation does not produce")
    seed_list = _seeds(seeds)
    with _simulating("evaluate", "nothing written"):
        res = evaluate(agent, cfg, wl, seed_list, deterministic=not stochastic)
    if as_json:
        click.echo(json.dumps(res))
        return
    click.echo(f"{agent_kind} ({agent.version}) on {wl.name}, seeds {res['seeds']}")
    for e in res["episodes"]:
        e["policy"] = f"seed {e['seed']}"
    click.echo(format_report(res["episodes"]))
    summ = res["summary"]
    click.echo("mean ± std: " + ", ".join(f"{k} {v['mean']:.3f} ± {v['std']:.3f}" for k, v in summ.items()
                                          if isinstance(v, dict) and k in ("total_cost", "vm_cost", "wait_penalty", "makespan_s")))


def _problem_hook(problem: str, verb: str, lacks: str):
    """The `evaluate` or `tune` entry point of a problem's spec (a plug-in's too): a problem
    without one is one line saying what it `lacks` and naming the missing field, exit 2; a
    reference that cannot be imported is one line naming it."""
    from agents.registry import entry, get_problem

    spec = get_problem(problem)
    if not getattr(spec, verb):
        _fail(f"problem {problem!r} has no {lacks}: its ProblemSpec names no `{verb}` entry point "
              "(docs/adding-a-problem.md)")
    try:
        return entry(spec, verb)
    except ValueError as exc:
        _fail(f"samm {verb} --problem {problem}: {exc}")


def _run_hook(hook, problem: str, verb: str, kept: str, *args, **kw) -> dict:
    """Runs a problem's `evaluate`/`tune`: its refusals (ValueError, FileNotFoundError, TypeError)
    are one line, exit 2; what it returns must be a JSON object."""
    try:
        with _simulating(verb, kept):
            res = hook(*args, **kw)
    except (ValueError, FileNotFoundError, TypeError) as exc:
        _fail(f"{verb} {problem}: {_one_line(exc, problem)}")
    if not isinstance(res, dict):
        _fail(f"{verb} {problem}: its `{verb}` returned a {type(res).__name__}, not a JSON object", code=1)
    from agents.report import finite_json

    return finite_json(res)  # --json prints strict JSON: a NaN of the plug-in's is null


def _containers_range(text: str) -> tuple[int, int]:
    """--containers LO-HI (or N): "48-15" once placed batches of 15 silently, and "abc" was an
    error that named no option."""
    lo, sep, hi = text.partition("-")
    try:
        bounds = (int(lo), int(hi if sep else lo))
    except ValueError:
        bounds = (0, -1)
    if not 1 <= bounds[0] <= bounds[1]:
        _fail(f"--containers must be LO-HI (or N) with 1 <= LO <= HI, got {text!r}")
    return bounds


def _suite_cmd(cfg, policy_dir, rules_path, retune, out_dir, as_json) -> None:
    from agents.generalisation import run_suite, suite_json, suite_markdown, suite_workloads
    from agents.generalisation_agents import suite_agents
    from agents.generalisation_stats import check_targets

    out = Path(out_dir) if out_dir else None
    if out:
        try:  # before the suite's minutes: a path under a file was a NotADirectoryError traceback
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            _fail(f"--out {out_dir}: cannot write there: {exc.strerror or exc}")
    try:
        agents, provenance = suite_agents(cfg, policy_dir, rules_path=rules_path, retune=retune,
                                          write_to=out / "rules.json" if (out and retune) else None,
                                          progress=not as_json)
        workloads = suite_workloads(cfg)
        result = run_suite(agents, cfg, workloads, progress=not as_json)  # its arithmetic's refusals are one line too
    except (ValueError, FileNotFoundError) as exc:
        _fail(str(exc))
    result["provenance"] = provenance
    result["targets"] = check_targets(result)
    if out:
        (out / "suite.json").write_text(suite_json(result))
        (out / "suite.md").write_text(suite_markdown(result) + "\n")
    if as_json:
        click.echo(suite_json(result))
        return
    click.echo(suite_markdown(result))
    click.echo(f"\npolicy: {provenance['policy']} ({provenance['policy_version']}); rules: {provenance['rules']}")
    click.echo("targets: " + json.dumps(result["targets"], default=str))


@cli.command("tune")
@click.option("--problem", type=click.Choice(_problem_choices()), default="autoscaling", show_default=True)
@click.option("--agent", "agent_kind", required=True,
              help=f"autoscaling: {', '.join(TUNABLE)}; another problem: an agent its `tune` accepts.")
@workload_options
@config_options
@click.option("--seeds", default="101-103", show_default=True,
              help="Tuning episode seeds (apart from `samm evaluate`'s default 1-5: a rule tuned on the seeds it is "
                   "scored on looks better than it is; the paper experiment tunes on 101-103 too).")
@click.option("--out", type=click.Path(file_okay=False), default=None, help="Save the tuned agent here.")
@click.option("--json", "as_json", is_flag=True)
def tune_cmd(problem, agent_kind, workload, window, time_compression, mips_per_core, max_jobs, config_path, preset, initial,
             action_mode, max_steps, seeds, out, as_json) -> None:
    """Grid-search a baseline's parameters in simulation: fewest episodes cut at the step cap with
    jobs queued, then lowest mean total cost."""
    ctx = click.get_current_context()
    if problem != "autoscaling":
        hook = _problem_hook(problem, "tune", "tunable baselines")
        _refuse_given(ctx, {*SWF_OPTIONS_PARAMS, *CONFIG_OPTIONS_PARAMS}, f"applies to problem autoscaling, not {problem}")
        res = _run_hook(hook, problem, "tune", f"nothing saved to {out}" if out else "nothing saved", agent_kind,
                        _seeds(seeds), out=out, progress=not as_json)
        click.echo(json.dumps(res, default=str) if as_json else
                   f"best {agent_kind}: " + json.dumps(res.get("best_params", res), default=str))
        return
    if agent_kind not in TUNABLE:  # was click's choice: a plug-in's agent must get through to its problem
        _fail(f"--agent: {agent_kind!r} is not a tunable baseline of autoscaling ({', '.join(TUNABLE)})")
    from agents.tune import tune

    cfg = _sim_config(config_path, preset, initial, action_mode, max_steps)
    wl = _workload(workload, cfg, window, time_compression, mips_per_core, max_jobs)
    seed_list = _seeds(seeds)
    if out:
        held = Path(out) / "metadata.json"
        if held.is_file():  # saving over another kind's policy would leave its weights under our metadata
            try:
                kind = json.loads(held.read_text()).get("kind")
            except (ValueError, AttributeError, OSError):
                kind = None
            if kind != agent_kind:
                _fail(f"--out {out} holds a {kind!r} policy, not a {agent_kind} one; choose another folder")
    made = bool(out) and not Path(out).exists()
    if out:
        try:  # before the grid search: minutes of tuning are not lost to a bad --out
            Path(out).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            _fail(f"--out {out}: {exc}")
    try:
        with _simulating("tune", f"nothing saved to {out}" if out else "nothing saved"):
            res = tune(agent_kind, cfg, wl, seed_list, progress=not as_json)
    except SystemExit:
        if made:  # interrupted or failed: not an empty folder that looks like a run's output
            with contextlib.suppress(OSError):
                Path(out).rmdir()
        raise
    agent = res.pop("agent")
    if out:
        agent.save(out)
    res["results"] = res["results"][:10]
    click.echo(json.dumps(res) if as_json else f"best {agent_kind}: {res['best_params']} "
               f"(mean total cost ${res['best_total_cost']:.3f})")


@cli.group()
def experiment() -> None:
    """Reproduce the papers' experiments in simulation."""


@experiment.command("paper")
@click.option("--out", type=click.Path(file_okay=False), required=True, help="Report directory.")
@click.option("--policy", "policy_dir", type=click.Path(exists=True, file_okay=False), default=None,
              help="Evaluate this LSTM-PPO policy instead of training one.")
@click.option("--timesteps", type=int, default=600_000, show_default=True, help="Training steps when training.")
@click.option("--seeds", default="1-5", show_default=True, help="Evaluation seeds.")
@click.option("--tune-seeds", default="101-103", show_default=True, help="Baseline tuning seeds.")
@click.option("--ppo", "ppo_json", default=None, help="JSON object overriding PPOConfig fields.")
@click.option("--no-swf", is_flag=True, help="Skip the generalisation suite (test-split windows of real traces).")
@click.option("--fast-tuning", is_flag=True, help="Halve every baseline grid (for smoke runs).")
@click.option("--quiet", is_flag=True)
def experiment_paper(out, policy_dir, timesteps, seeds, tune_seeds, ppo_json, no_swf, fast_tuning, quiet) -> None:
    """Train (or load) LSTM-PPO, tune the baselines, evaluate all on seed-1551 and real traces;
    write report.md, summary.json and PNG figures."""
    from agents.experiment import run_paper_experiment
    from agents.ppo.config import PPOConfig

    overrides = _params(ppo_json, "--ppo")
    try:  # before the experiment starts, not at its training step
        PPOConfig(**{"total_timesteps": timesteps, **(overrides or {})}).validate()
    except (TypeError, ValueError) as exc:
        _fail(f"invalid PPO settings: {exc}")
    try:
        summary = run_paper_experiment(out, policy_dir, timesteps, _seeds(seeds), _seeds(tune_seeds, "--tune-seeds"),
                                       ppo_overrides=overrides, swf=not no_swf, progress=not quiet,
                                       fast_tuning=fast_tuning)
    except (ValueError, OSError) as exc:
        _fail(str(exc))
    click.echo(json.dumps(summary["targets"]))
    click.echo(f"wrote {Path(out) / 'report.md'}")


@experiment.command("lra")
@click.option("--out", type=click.Path(file_okay=False), required=True, help="Report directory.")
@click.option("--quick", is_flag=True, help="Small cases, few seeds and short budgets (a smoke run in about a minute).")
@click.option("--seeds", default=None, help="Batch seeds per case (default: 1-5; with --quick: 1,2).")
@click.option("--predictor", type=click.Choice(["forest", "synthetic"]), default="forest", show_default=True,
              help="forest: the random forest on Metis's measurements (the default); synthetic: the data-free model.")
@click.option("--quiet", is_flag=True)
def experiment_lra(out, quick, seeds, predictor, quiet) -> None:
    """Long-running container placement (DRL-Scheduler): every planner on batches at the
    paper's scale and larger, against the exact optimum; writes report.md, summary.json, PNGs."""
    _run_problem_experiment("lra-placement", out, quick=quick, seeds=None if seeds is None else _seeds(seeds),
                            predictor=predictor, progress=not quiet)


@experiment.command("c2marl")
@click.option("--out", type=click.Path(file_okay=False), required=True, help="Report directory.")
@click.option("--quick", is_flag=True, help="The tiny setting, short training (a smoke run in about a minute).")
@click.option("--cases", default=None, help="Comma-separated cases: azure-cold, internal-cold, internal-warm (default: all).")
@click.option("--seeds", default=None,
              help="Training seeds per alpha (default: 1-3, the paper's 3; with --quick: 1,2).")
@click.option("--episodes", type=click.IntRange(min=1), default=None,
              help="Training episodes per run (default: 1800 cold, 1200 warm).")
@click.option("--test-episodes", type=click.IntRange(min=1), default=None,
              help="Test episodes per method (default: 300, the paper's).")
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True,
              help="Training runs in parallel processes.")
@click.option("--policies", type=click.Path(exists=True, file_okay=False), default=None,
              help="Evaluate the C2MARL policies an earlier run saved (its --out or its policies/ folder) "
                   "instead of training them, e.g. on more --test-episodes.")
@click.option("--alphas", default=None, help="Comma-separated safety levels among 0.75, 0.85, 0.95 (default: all).")
@click.option("--threads", type=int, default=1, show_default=True,
              help="Torch threads per training run (1 and 2 gave the same weights on our machine; --workers 1 "
                   "--threads 2 gives one run the two cores).")
@click.option("--held-apart-only", is_flag=True,
              help="Test on the held-apart days (the issue's test) only, not also under the paper's protocol.")
@click.option("--validate-every", type=click.IntRange(min=0), default=0, show_default=True,
              help="Ours: keep the checkpoint chosen on the validation week (the week before training), "
                   "validated every N episodes once epsilon is at its floor; 0 keeps the last weights (the paper). "
                   "Measured on the internal-like setting: the week ranks checkpoints no better than chance "
                   "(docs/oversubscription.md).")
@click.option("--ensemble", type=click.IntRange(min=0), default=0, show_default=True, metavar="K",
              help="Ours: the last weights and those of every --ensemble-every episodes before them, K in all, "
                   "act as one policy by a median vote of their rates; 0 keeps the last weights (the paper). "
                   "Excludes --validate-every (docs/oversubscription.md, snapshot ensembles).")
@click.option("--ensemble-every", type=click.IntRange(min=1), default=None, metavar="N",
              help="Episodes between the ensemble's members (default: train.py's, 100).")
@click.option("--ensemble-vote", type=click.Choice(["median", "p60", "upper-quartile", "mean-q", "max"]), default=None,
              help="Ours: how an ensemble's members vote (default median); with --policies, the saved "
                   "ensembles are tested under this vote, their weights unchanged (docs/oversubscription.md).")
@click.option("--dual-estimate", type=click.Choice(["broken", "pm-max"]), default=None,
              help="Ours: what the dual update of lambda measures. broken (the default): PMs broken per episode "
                   "against 1 - alpha, which every alpha exceeds on our traces, so alpha hardly changes the "
                   "policy; pm-max: the worst PM's break share over the last 20 episodes against 1 - alpha, so "
                   "alpha orders the policies, but they break PMs on held-apart days far more often "
                   "(docs/oversubscription.md).")
@click.option("--budget-margin", type=click.FloatRange(min=1.0), default=None, metavar="F",
              help="Ours: train each level's agents to (1 - alpha) / F of its budget; every verdict stays on "
                   "alpha (default 1, the paper's; docs/oversubscription.md, a budget margin).")
@click.option("--rates", type=click.Choice(["paper", "tenths"]), default=None,
              help="The agents' action set: paper (the default, §6.2's 0.2-0.6 and 1) or tenths (ours: adds 0.7, "
                   "0.8 and 0.9; docs/oversubscription.md, the action set).")
@click.option("--action", type=click.Choice(["rate", "headroom"]), default=None,
              help="What an agent's action means: rate (the default, the paper's) or headroom (ours: a multiple "
                   "5/6 ... 4/3 of a tuned production predictor's headroom over its usage forecast; "
                   "docs/oversubscription.md, the headroom action).")
@click.option("--anchor", default=None, metavar="tuned[:NSigma|:Percentile|:Max|:best]|N,WINDOW,HEADROOM",
              help="The headroom action's anchor: N-sigma tuned on the training days at each alpha (tuned, the "
                   "default), the percentile or max predictor tuned so (tuned:Percentile, tuned:Max), the one of "
                   "the three that saves most there while safe (tuned:best), or N-sigma given.")
@click.option("--anchor-margin", type=click.FloatRange(min=1.0), default=None, metavar="F",
              help="Ours: tune the headroom action's anchor to (1 - alpha) / F of the budget on the training days; "
                   "every verdict stays on alpha (default 1: tuned at alpha, as the baselines; "
                   "docs/oversubscription.md, an anchor margin).")
@click.option("--anchor-tuned-at", type=click.FloatRange(min=0.0, max=1.0, min_open=True, max_open=True),
              default=None, metavar="LEVEL",
              help="Ours: tune the headroom action's anchor at this safety level for every alpha instead of at "
                   "alpha (e.g. 0.85 under 0.95 agents); excludes --anchor-margin (docs/oversubscription.md, "
                   "a looser anchor).")
@click.option("--quiet", is_flag=True)
def experiment_c2marl(out, quick, cases, seeds, episodes, test_episodes, workers, policies, alphas, threads,
                      held_apart_only, validate_every, ensemble, ensemble_every, ensemble_vote, dual_estimate,
                      budget_margin, rates, action, anchor, anchor_margin, anchor_tuned_at, quiet) -> None:
    """VM oversubscription (C2MARL): the paper's Tables 1, 2, 3 and 5 (PM-Hot-R, C-Hot-R, S-Cores,
    satisfaction per safety level) with ours beside them; baselines tuned on training days; every
    method tested on held-apart days and under the paper's protocol (the training weekdays'
    requests, usage redrawn); writes report.md, summary.json, training-curve PNGs and the policies."""
    levels = _floats(alphas, "--alphas") if alphas is not None else None
    if levels == []:    # "," or "": not every level silently
        _fail(f"--alphas names no safety level, got {alphas!r}")
    # None: the budget's own seeds (a default of 1-3 here ran --quick's smoke run on 3, not its 2)
    _run_problem_experiment("oversubscription", out, quick=quick, seeds=_seeds(seeds) if seeds is not None else None,
                            cases=[c.strip() for c in cases.split(",")] if cases is not None else None,
                            episodes=episodes, test_episodes=test_episodes, workers=workers, policies=policies,
                            alphas=levels, threads=threads,
                            held_apart_only=held_apart_only, validate_every=validate_every, ensemble=ensemble,
                            ensemble_every=ensemble_every, ensemble_vote=ensemble_vote,
                            dual_estimate=dual_estimate, budget_margin=budget_margin, rates=rates,
                            action=action, anchor=anchor, anchor_margin=anchor_margin,
                            anchor_tuned_at=anchor_tuned_at, progress=not quiet)


@experiment.command("osdec")
@click.option("--out", type=click.Path(file_okay=False), required=True, help="Report directory.")
@click.option("--quick", is_flag=True, help="The tiny setting, two variants, short training (seconds).")
@click.option("--seeds", default=None, help="Training seeds per learned row (default: 1-5; with --quick: 1,2).")
@click.option("--steps", type=click.IntRange(min=1), default=None,
              help="Slots of experience per training run (default 40,960).")
@click.option("--settings", default=None,
              help="Comma-separated settings (default: default, realtime, core1-3, dur1-3).")
@click.option("--variants", default=None,
              help="Comma-separated Table 1 variants (default: all: reinforce, ppo, pointer, ppo-att, "
                   "ppo-att-auxh, ppo-att-auxl, osdec).")
@click.option("--test-episodes", type=click.IntRange(min=1), default=None,
              help="Test episodes per method (default: 100, the paper's).")
@click.option("--mapping", type=click.Choice(["prefix", "skip"]), default="prefix", show_default=True,
              help="Action mapping of the learned rows: prefix (the paper's) or skip (ours: pack past misfits, "
                   "negative scores wait); skip rows are named VARIANT+skip.")
@click.option("--merge", multiple=True, type=click.Path(exists=True, file_okay=False),
              help="An earlier `samm experiment osdec` folder whose learned runs join this report (repeatable).")
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True,
              help="Training runs in parallel processes.")
@click.option("--quiet", is_flag=True)
def experiment_osdec(out, quick, seeds, steps, settings, variants, test_episodes, mapping, merge, workers,
                     quiet) -> None:
    """Deferrable-job scheduling (OSDEC): the paper's Table 1 (with its ablations), Table 2
    (deferrable vs real-time) and Table 4 (six sensitivity settings), ours beside theirs;
    heuristics tuned on training episodes; writes report.md, summary.json, training curves and
    the trained OSDEC policies."""
    def split(text: str | None, flag: str) -> list[str] | None:
        names = [x.strip() for x in text.split(",") if x.strip()] if text is not None else None
        if names == []:     # "," or "": not the default list silently
            _fail(f"{flag} names nothing, got {text!r}")
        return names

    # None: the budget's own seeds; a typed --seeds 1-5 is run as typed, --quick or not
    _run_problem_experiment("deferrable-jobs", out, quick=quick, seeds=_seeds(seeds) if seeds is not None
                            else None, steps=steps, settings=split(settings, "--settings"),
                            variants=split(variants, "--variants"),
                            test_episodes=test_episodes, mapping=mapping, merge=list(merge), workers=workers,
                            progress=not quiet)


@experiment.command("reclaimer")
@click.option("--out", type=click.Path(file_okay=False), required=True, help="Report directory.")
@click.option("--quick", is_flag=True, help="The 3-service chain, 2 seeds, short episodes, a short training (a smoke run).")
@click.option("--seeds", default=None, help="Episode seeds per load level (default: 1-5; with --quick: 1,2).")
@click.option("--apps", default=None, help="Comma-separated applications (default: hotel,social).")
@click.option("--policy", "policy_specs", multiple=True,
              help="APP=DIR: evaluate this saved Reclaimer policy for APP (default: the shipped one). Repeatable.")
@click.option("--train-steps", type=click.IntRange(min=1), default=None,
              help="Train Reclaimer in this run for this many transitions instead of loading a policy.")
@click.option("--methods", default=None,
              help="Comma-separated subset of reclaimer, reclaimer-no-ceiling (the policy without its headroom "
                   "ceiling, when it has one), autoscale, sinan, vpa, static-max, static-best (default: all), e.g. "
                   "reclaimer,autoscale over many --seeds to count rare violating seconds.")
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True,
              help="Processes for the (application, load level) cells, one thread each; the figures do not "
                   "depend on it. A run that trains uses one.")
@click.option("--quiet", is_flag=True)
def experiment_reclaimer(out, quick, seeds, apps, policy_specs, train_steps, methods, workers, quiet) -> None:
    """Microservice CPU cores (Reclaimer): every method (Reclaimer, AutoScale, the Sinan-style model,
    the VPA-style recommender, static-max, the best static allocation) per application and load
    level; mean and max cores, p99 and QoS violations, the paper's relative figures beside ours;
    writes report.md, summary.json and PNGs."""
    policy_dirs = {}
    for spec in policy_specs:
        app, sep, d = spec.partition("=")
        if not sep or not d:
            _fail(f"--policy {spec!r}: expected APP=DIR")
        policy_dirs[app] = d
    chosen = [m.strip() for m in methods.split(",") if m.strip()] if methods is not None else None
    if chosen == []:    # "," or "": not every method silently
        _fail(f"--methods names no method, got {methods!r}")
    _run_problem_experiment("microservice-cores", out, quick=quick,
                            seeds=_seeds(seeds) if seeds is not None else None,    # None: the budget's
                            apps=[a.strip() for a in apps.split(",")] if apps is not None else None,
                            policy_dirs=policy_dirs,
                            train_steps=train_steps, progress=not quiet,
                            methods=chosen, workers=workers)


@experiment.command("run")
@click.option("--problem", type=click.Choice(_problem_choices()), required=True, help="The problem's experiment.")
@click.option("--out", type=click.Path(file_okay=False), required=True, help="Report directory.")
@click.option("--quick", is_flag=True, help="The problem's short smoke version.")
@click.option("--quiet", is_flag=True)
def experiment_run(problem, out, quick, quiet) -> None:
    """Run any registered problem's experiment (`samm experiment paper` and `lra` are shortcuts
    with more options)."""
    if problem == "autoscaling":
        from agents.experiment import run_paper_experiment
        from agents.shipped import shipped_policy_dir

        try:
            summary = run_paper_experiment(out, shipped_policy_dir(), 600_000, [1, 2, 3, 4, 5], [101, 102, 103],
                                           swf=not quick, progress=not quiet, fast_tuning=quick)
        except (ValueError, OSError) as exc:
            _fail(str(exc))
        click.echo(json.dumps(summary["targets"]))
        return
    _run_problem_experiment(problem, out, quick=quick, progress=not quiet)


def _run_problem_experiment(problem: str, out: str, **kw) -> None:
    from agents.registry import entry, get_problem

    from agents.parallel import WorkerDied

    spec = get_problem(problem)
    try:
        summary = entry(spec, "experiment")(out, **kw)
    except (ValueError, OSError, WorkerDied) as exc:  # OSError: an --out that cannot be created or written
        _fail(str(exc))
    click.echo(json.dumps(summary.get("targets", []), default=str))
    click.echo(f"wrote {Path(out) / 'report.md'}")


@cli.command("place")
@click.option("--cluster", "cluster_file", type=click.Path(exists=True, dir_okay=False), required=True,
              help="Cluster YAML: nodes, slots, apps (image per app), optional constraints CSV "
                   "(see agents/lra_placement/data/example-cluster.yaml).")
@click.option("--batch", "batch_file", type=click.Path(exists=True, dir_okay=False), required=True,
              help="Containers to place: CSV `app,count` or a YAML mapping app -> count.")
@click.option("--out", type=click.Path(file_okay=False), required=True,
              help="Writes plan.csv, summary.json, docker-compose.yml and kubernetes/ here.")
@click.option("--planner", default="lra-reinforce", show_default=True,
              help="lra-reinforce (the shipped policy), optimum (exact, integer programming), greedy-ls, greedy, "
                   "k8s-default, least-loaded, round-robin or random.")
@click.option("--constraints", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Operation rules CSV (app_a,app_b,rule,limit); overrides the cluster file's.")
@click.option("--predictor", type=click.Choice(["forest", "synthetic"]), default="forest", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print summary.json.")
def place_cmd(cluster_file, batch_file, out, planner, constraints, predictor, seed, as_json) -> None:
    """Plan a batch of long-running containers on a cluster and write the files an orchestrator
    applies (Docker Compose/Swarm placement constraints, Kubernetes node affinity)."""
    from agents.lra_placement.place import run_place

    try:
        res = run_place(cluster_file, batch_file, out, planner=planner, seed=seed,
                        predictor="synthetic" if predictor == "synthetic" else None, constraints=constraints)
    except (ValueError, FileNotFoundError) as exc:
        _fail(str(exc))
    for w in res.warnings:
        click.echo(f"warning: {w}", err=True)
    summary = res.summary()
    if as_json:
        click.echo(json.dumps(summary))
        return
    click.echo(f"{planner}: {summary['n_containers']} containers on {summary['nodes_used']}/{summary['nodes']} nodes, "
               f"mean normalised throughput {summary['score']:.4f}, {summary['constraint_violations']} constraint "
               f"violations, planned in {summary['seconds']:.2f} s")
    click.echo(f"wrote {Path(out) / 'plan.csv'}, docker-compose.yml and kubernetes/")


@cli.group()
def policy() -> None:
    """Manage saved policies."""


@policy.command("promote")
@click.option("--candidate", type=click.Path(exists=True, file_okay=False), required=True)
@click.option("--incumbent", type=click.Path(exists=True, file_okay=False), required=True)
@workload_options
@config_options
@click.option("--seeds", default="1-10", show_default=True, help="Paired episode seeds.")
@click.option("--margin", type=float, default=0.02, show_default=True, help="Required mean paired cost saving.")
@click.option("--max-p", type=float, default=0.1, show_default=True,
              help="Largest one-sided sign-test p-value (with --suite, checked only when given).")
@click.option("--suite", type=click.Choice(["generalisation"]), default=None,
              help="Gate on the generalisation suite instead of one workload: pairs by (window, seed) over the test "
                   "windows and seed-1551 (seeds 1-3 unless --seeds is given); promote iff the geometric-mean paired "
                   "cost ratio <= 1 - margin, no window's ratio above --window-tolerance, and no job left unfinished "
                   "where the incumbent finished them all.")
@click.option("--window-tolerance", type=float, default=1.05, show_default=True,
              help="--suite: the largest cost ratio candidate/incumbent allowed on any one window.")
@click.option("--install", "install_to", type=click.Path(file_okay=False), default=None,
              help="On promotion, atomically replace this directory with the candidate.")
def policy_promote(candidate, incumbent, workload, window, time_compression, mips_per_core, max_jobs, config_path,
                   preset, initial, action_mode, max_steps, seeds, margin, max_p, suite, window_tolerance,
                   install_to) -> None:
    """Evaluate candidate and incumbent on the same workloads and seeds; promote only if the
    candidate is cheaper by the margin on paired episodes (one workload, or the generalisation
    suite's windows with --suite). Prints the evidence; exit status 0 when promoted, 3 when not."""
    import math
    import os

    from agents.promote import compare, compare_on_suite, install

    # NaN failed every comparison: minutes of episodes, then "not promoted" (exit 3) for a typo
    if not (math.isfinite(margin) and -1 < margin < 1):
        _fail(f"--margin must be a fraction of the cost in (-1, 1), got {margin}")
    if not 0 <= max_p <= 1:
        _fail(f"--max-p must be a p-value in [0, 1], got {max_p}")
    if not (math.isfinite(window_tolerance) and window_tolerance > 0):
        _fail(f"--window-tolerance must be a finite ratio > 0, got {window_tolerance}")
    ctx = click.get_current_context()
    if suite:  # the suite pairs on its own windows: `--suite ... --workload MINE.swf` gated on others
        # --max-steps too: the suite's episodes run its own 20,000-step cap whatever was asked
        _refuse_given(ctx, {"max_steps", *SWF_OPTIONS_PARAMS},
                      "does not apply to --suite (it pairs on the suite's own windows and episodes)")
    else:
        _refuse_given(ctx, {"window_tolerance"}, "applies only with --suite")
    if install_to:  # checked before the evaluation, which takes minutes, not after it
        parent = Path(install_to).absolute().parent
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            _fail(f"--install {install_to}: {parent} is not a writable directory")
    # the incumbent is replaced only after the evidence, so a Ctrl-C in it leaves --install alone
    unchanged = f"not promoted; {install_to} left as it was" if install_to else "not promoted"
    try:
        with _simulating("policy promote", unchanged):
            if suite:
                from agents.generalisation import suite_workloads

                cfg = _sim_config(config_path, preset, initial, action_mode or "per-type", max_steps)
                given = ctx.get_parameter_source
                seed_list = _seeds(seeds) if given("seeds").name != "DEFAULT" else None
                # the suite's sign test is weak evidence with few windows: required only when --max-p is given
                res = compare_on_suite(candidate, incumbent, cfg, suite_workloads(cfg), seed_list, margin=margin,
                                       tolerance=window_tolerance,
                                       max_p=max_p if given("max_p").name != "DEFAULT" else None)
            else:
                cfg = _sim_config(config_path, preset, initial, action_mode, max_steps)
                wl = _workload(workload, cfg, window, time_compression, mips_per_core, max_jobs)
                res = compare(candidate, incumbent, cfg, wl, _seeds(seeds), margin, max_p)
    except (ValueError, FileNotFoundError) as exc:
        _fail(str(exc))
    if res["promote"] and install_to:
        try:
            install(candidate, install_to)
        except OSError as exc:
            click.echo(json.dumps(res, indent=2))
            _fail(f"--install {install_to}: promoted but not installed ({exc.strerror or exc}: {exc.filename})",
                  code=1)  # the evidence is printed; the work, not its usage, failed
        res["installed_to"] = install_to
    click.echo(json.dumps(res, indent=2))
    sys.exit(0 if res["promote"] else 3)


@cli.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Bind address (loopback by default).")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.option("--agent", "agents", multiple=True, default=("lstm-ppo",), show_default=True,
              help="Hosted agent of any problem: NAME (shipped policy or default parameters) or NAME=POLICY_DIR; "
                   "repeatable (e.g. --agent lstm-ppo --agent lra-reinforce).")
@click.option("--token-env", default="SAMM_SERVICE__TOKEN", show_default=True,
              help="Environment variable holding the bearer token for policy uploads (unset: uploads disabled).")
@click.option("--session-ttl", type=click.FloatRange(min=0, min_open=True), default=3600.0, show_default=True,
              help="Seconds before an idle session's state is dropped (every agent's sessions).")
@click.option("--max-sessions", type=click.IntRange(min=1), default=10_000, show_default=True,
              help="Live sessions kept by each session store (the decide routes share one, each problem's routes have "
                   "their own); past it the least recently used is dropped.")
@click.option("--store", type=click.Path(file_okay=False), default=None,
              help="Where uploaded policies are kept (default: a fresh temporary folder). A validated upload kept here "
                   "is hosted again after a restart, unless --agent names another policy for that name.")
@click.option("--agent-param", "agent_params", multiple=True,
              help="NAME:KEY=VALUE, a hosting parameter of one agent, e.g. lra-reinforce:nodes=81; repeatable.")
@click.option("--max-body-mb", type=click.FloatRange(min=0, min_open=True, max=4096), default=64.0, show_default=True,
              help="Largest request body accepted (policy uploads included); a larger one is a 413.")
@click.option("--body-timeout", type=click.FloatRange(min=0, min_open=True, max=86400), default=120.0, show_default=True,
              help="Seconds after its headers within which a request body must be whole (a trickled body: 408).")
@click.option("--header-timeout", type=click.FloatRange(min=0, min_open=True, max=3600), default=10.0, show_default=True,
              help="Seconds within which a request's headers must be whole, from the connection or the request's "
                   "first byte (an idle or trickling client, slowloris: 408 and the connection closed).")
@click.option("--max-header-kb", type=click.IntRange(min=1, max=1024), default=64, show_default=True,
              help="Largest request head (request line and headers) accepted; a larger one is a 431.")
def serve(host, port, agents, token_env, session_ttl, max_sessions, store, agent_params, max_body_mb, body_timeout,
          header_timeout, max_header_kb) -> None:
    """Run the Policy Evaluation Service (FastAPI on uvicorn; OpenAPI at /openapi.json)."""
    import os

    import uvicorn

    from agents.registry import make_policy
    from samm.plan.registry import PolicyRegistry
    from samm.plan.service import create_app

    params: dict[str, dict] = {}
    for item in agent_params:
        agent, _, kv = item.partition(":")
        key, eq, value = kv.partition("=")
        if not agent or not key or not eq:
            _fail(f"--agent-param {item!r}: expected NAME:KEY=VALUE")
        params.setdefault(agent, {})[key] = value
    if not session_ttl > 0:  # click's FloatRange lets NaN through: every session would expire at once
        _fail(f"--session-ttl must be a positive number of seconds, got {session_ttl}")
    if not 0 < max_body_mb <= 4096:  # as --session-ttl: NaN passes the FloatRange
        _fail(f"--max-body-mb must be a number of megabytes in (0, 4096], got {max_body_mb}")
    if not 0 < body_timeout <= 86400:
        _fail(f"--body-timeout must be a number of seconds in (0, 86400], got {body_timeout}")
    if not 0 < header_timeout <= 3600:
        _fail(f"--header-timeout must be a number of seconds in (0, 3600], got {header_timeout}")
    for spec in agents:  # `--agent lstm-ppo=$POLICY` with $POLICY unset served the shipped policy
        name, sep, policy_dir = spec.partition("=")
        if not name or (sep and not policy_dir):
            _fail(f"--agent {spec!r}: expected NAME or NAME=POLICY_DIR")
    hosted = [spec.partition("=")[0] for spec in agents]
    twice = sorted({n for n in hosted if hosted.count(n) > 1})
    if twice:
        _fail(f"--agent {twice[0]} is given more than once; each name is hosted once")
    unhosted = sorted(set(params) - set(hosted))
    if unhosted:
        _fail(f"--agent-param {unhosted[0]}:...: no --agent {unhosted[0]} is hosted (hosted: {', '.join(hosted)})")
    _check_listen(host, port)
    try:
        registry = PolicyRegistry(store)
    except OSError as exc:
        _fail(f"--store {store}: cannot create the policy store ({exc.strerror or exc})")
    for spec in agents:
        name, _, policy_dir = spec.partition("=")
        try:
            registry.host(name, make_policy(name, policy_dir or None, **params.get(name, {})), source=policy_dir)
        except (ValueError, FileNotFoundError, TypeError) as exc:
            _fail(f"--agent {spec}: {exc}")
        except Exception as exc:  # noqa: BLE001 - e.g. corrupt weights (torch's UnpicklingError): one line
            first_line = (str(exc).splitlines() or [""])[0][:300]
            _fail(f"--agent {spec}: cannot load the policy: {type(exc).__name__}: {first_line}")
    for line in registry.restore_uploads():
        click.echo(line, err=True)
    token = (os.environ.get(token_env) or "").strip() or None  # as create_app takes it (a trailing newline)
    import torch

    torch.set_num_threads(1)  # one decision at a time is tiny: extra threads only contend
    click.echo(f"serving {registry.names()} on http://{host}:{port} (uploads {'enabled' if token else 'disabled'})", err=True)
    try:
        app = create_app(registry, token=token, session_ttl_s=session_ttl, max_sessions=max_sessions,
                         max_body_bytes=int(max_body_mb * 2**20), body_timeout_s=body_timeout)
    except ValueError as exc:  # a hosted plug-in problem whose routes cannot be imported
        _fail(f"cannot build the service: {exc}", code=1)
    import gc

    # everything loaded so far (torch, the policies) lives as long as the process: keep it out of
    # the collector's full passes, which otherwise stall a decision for tens of milliseconds
    gc.collect()
    gc.freeze()
    from samm.plan.service import server_config

    # uvicorn alone bounds neither how long nor how much a client may send as headers (an idle
    # connection was held for good, 200 MB of headers read into memory): 408 / 431 past the limits
    uvicorn.Server(server_config(app, host, port, header_timeout_s=header_timeout, max_header_bytes=max_header_kb * 2**10,
                                 log_level="warning", access_log=False)).run()


def _check_listen(host: str, port: int) -> None:
    """Exit 2 naming --host/--port when the service could not listen there. uvicorn found out only
    after the policies were loaded and "serving on ..." was printed, then exited 3 (the status
    `samm policy promote` gives "not promoted")."""
    import socket

    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError) as exc:
        _fail(f"--host {host}: cannot resolve it ({getattr(exc, 'strerror', None) or exc})")
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind(addr)
        except OSError as exc:
            _fail(f"--host {host} --port {port}: cannot listen there ({exc.strerror or exc})")


@cli.command("collect")
@click.option("--graphite", "graphite_addr", default="127.0.0.1:2003", show_default=True, help="Carbon plaintext HOST:PORT.")
@click.option("--prefix", default="samm", show_default=True, help="Metric prefix (docs/metric-naming.md).")
@click.option("--group", required=True, help="Resource group (VM type) this instance belongs to.")
@click.option("--instance", default=None, help="Instance id as the executor knows it (default: the host name).")
@click.option("--interval", type=float, default=10.0, show_default=True, help="Seconds between reports.")
@click.option("--cores", type=float, default=None, help="Express CPU as a share of this many cores (default: all online CPUs).")
@click.option("--pid", type=int, default=None, help="Measure this process and its children instead of the whole host.")
@click.option("--cgroup", "use_cgroup", is_flag=True,
              help="Measure a cgroup instead of /proc: the collector's own (inside a container: the container's), "
                   "or the one holding --pid. CPU is the group's, RAM its memory in use as `docker stats` counts it, "
                   "and the cores its CPU quota unless --cores.")
@click.option("--once", is_flag=True, help="Send one report (after a 1 s measurement) and exit.")
@click.option("--duration", type=float, default=None, help="Stop after this many seconds (default: run until killed).")
def collect(graphite_addr, prefix, group, instance, interval, cores, pid, use_cgroup, once, duration) -> None:
    """Report this instance's CPU busy share, RAM in use and heartbeat to Graphite every
    --interval seconds (a dead Graphite is logged, never fatal). SIGTERM finishes the report
    under way and exits 0."""
    import logging
    import signal
    import socket
    import threading

    import psutil

    from samm.monitor.collector import (CgroupSampler, HostSampler, InstanceReporter, check_group, check_prefix,
                                        parse_host_port, run_collector)
    from samm.monitor.graphite_client import GraphiteSender

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        host, port = parse_host_port(graphite_addr)
    except ValueError as exc:
        _fail(f"--graphite: {exc}")
    try:
        check_prefix(prefix)
    except ValueError as exc:
        _fail(f"--prefix: {exc}")
    try:
        check_group(group)
    except ValueError as exc:
        _fail(f"--group: {exc}")
    try:
        sampler = (CgroupSampler if use_cgroup else HostSampler)(cores=cores, pid=pid)
    except ValueError as exc:  # "cores must be ..." (ours) or "pid must be ..." (psutil's): name the option
        _fail(f"{'--pid' if str(exc).startswith('pid') else '--cores'}: {exc}")
    except psutil.NoSuchProcess:
        _fail(f"--pid {pid}: no such process")
    except (OSError, psutil.Error) as exc:  # /proc or the cgroup file system not mounted, or not ours to read
        what = f"--pid {pid}" if pid is not None else ("this process" if use_cgroup else "this host")
        _fail(f"cannot read the CPU and RAM of {f'the cgroup of {what}' if use_cgroup else what}: {exc}")
    # NaN and inf pass `> 0` alone; beyond a day, sleeping overflows the platform's timeout
    if not 0 < interval <= 86400:
        _fail(f"--interval must be a positive number of seconds up to 86400, got {interval}")
    if duration is not None and not 0 < duration < float("inf"):
        _fail(f"--duration must be a positive number, got {duration}")
    if duration is not None and not once and duration < interval:
        _fail(f"--duration {duration:g} is shorter than --interval {interval:g}: no report would be sent")
    instance = instance or socket.gethostname()
    sender = GraphiteSender(host, port)
    reporter = InstanceReporter(sender, prefix, group, instance)
    # without a handler, SIGTERM kills the collector mid-report, and as a container's PID 1
    # (where the default action is ignored) it is not stopped at all until SIGKILL
    stop = threading.Event()
    in_main_thread = threading.current_thread() is threading.main_thread()  # signal() works only there
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set()) if in_main_thread else None
    try:
        n = run_collector(reporter, sampler, interval, once=once, duration_s=duration, stop=stop)
    except KeyboardInterrupt:
        n = sender.sent // 3
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
    click.echo(f"sent {n} report(s) for {group}/{instance} to {host}:{port} ({sender.dropped} point(s) dropped)", err=True)
    if once and sender.sent == 0:  # a one-shot check (cron, a probe) must fail when nothing arrived
        _fail(f"no point reached carbon at {host}:{port}", code=1)


@cli.command("run")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), required=True,
              help="Daemon config YAML (see deploy/configs/samm.example.yaml).")
@click.option("--iterations", type=click.IntRange(min=1), default=None,
              help="Stop after this many iterations (default: run until SIGTERM).")
@click.option("--dry-run", is_flag=True, help="Decide and record, never act (overrides executor.dry_run).")
@click.option("--log-level", default="INFO", show_default=True, type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON line per iteration.")
def run_cmd(config_path, iterations, dry_run, log_level, as_json) -> None:
    """Run the MAPE-K daemon in the foreground: monitor -> analyze -> plan -> execute -> record,
    once per interval. SIGTERM finishes the current iteration and exits 0."""
    import json
    import logging

    from samm.daemon.build import ConfigurationProblem
    from samm.daemon.runner import run_daemon
    from samm.knowledge.store import KnowledgeError

    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = _daemon_config(config_path)
    if dry_run:
        cfg = cfg.model_copy(update={"executor": cfg.executor.model_copy(update={"dry_run": True})})
        if cfg.loops:
            cfg = cfg.model_copy(update={"loops": [lp.model_copy(update={
                "executor": lp.executor.model_copy(update={"dry_run": True})}) for lp in cfg.loops]})

    def show(rep):
        if as_json:
            click.echo(json.dumps({"loop": rep.loop, "key": rep.key, "status": rep.status, "reasons": rep.reasons,
                                   "features": rep.features, "action": rep.plan.action if rep.plan else None,
                                   "action_name": rep.plan.action_name if rep.plan else None,
                                   "source": rep.plan.source if rep.plan else "none",
                                   "actions": [{k: a.get(k) for k in ("group", "status", "target", "error")}
                                               for a in rep.actions],
                                   "inventory": rep.inventory, "iteration_ms": round(rep.iteration_ms, 3)}), nl=True)

    try:
        code, runner = run_daemon(cfg, max_iterations=iterations, on_iteration=show)
    except (ConfigurationProblem, KnowledgeError) as exc:
        click.echo(f"cannot start: {exc}", err=True)
        sys.exit(2)
    system = runner.daemon.system
    if system is not None and system.last is not None:
        click.echo(json.dumps({"simulation": system.totals()}) if as_json else f"simulation: {system.totals()}", err=not as_json)
    sys.exit(code)


@cli.group("config")
def config_group() -> None:
    """Daemon configuration (YAML + SAMM_... environment overrides)."""


@config_group.command("check")
@click.argument("path", type=click.Path(dir_okay=False))
def config_check(path) -> None:
    """Validate a daemon config file and print the effective settings (secrets masked)."""
    click.echo(_daemon_config(path).model_dump_json(indent=2))


def _daemon_config(path: str):
    """The daemon's config (`samm run`, `samm config check`); every problem is exit 2 (load_config
    bounds what it reads and names files nested too deeply)."""
    from samm.config import ConfigError, load_config

    try:
        return load_config(path)
    except ConfigError as exc:
        click.echo(f"invalid config:\n{exc}", err=True)
        sys.exit(2)


from samm.cli.oversub import testbed_oversub  # noqa: E402  (samm testbed-oversub)

cli.add_command(testbed_oversub)
testbed_cmd.add_command(testbed_oversub, "oversub")

from samm.cli.deferrable import testbed_deferrable  # noqa: E402  (samm testbed-deferrable)

cli.add_command(testbed_deferrable)
testbed_cmd.add_command(testbed_deferrable, "deferrable")

from samm.cli.microservices import reclaimer_ceiling, testbed_microservices  # noqa: E402  (samm testbed-microservices)

cli.add_command(testbed_microservices)
testbed_cmd.add_command(testbed_microservices, "microservices")  # the issue's `samm testbed microservices`
cli.add_command(reclaimer_ceiling)

from samm.cli.knowledge import knowledge_group  # noqa: E402  (samm knowledge stats|prune)

cli.add_command(knowledge_group)

if __name__ == "__main__":  # pragma: no cover
    cli()

