"""The `samm` command line. Every verb has `--help`."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from samm import __version__


def _fail(msg: str) -> None:
    click.echo(f"error: {msg}", err=True)
    sys.exit(2)


def _sim_config(config_path: str | None, preset: str, initial: str | None, action_mode: str | None,
                max_steps: int | None):
    from pydantic import ValidationError

    from sim_bridge.config import load_sim_config

    try:
        cfg = load_sim_config(config_path, preset=preset, action_mode=action_mode, max_steps=max_steps)
        if initial:
            cfg = cfg.with_initial([int(x) for x in initial.split(",")])
    except (ValidationError, ValueError, OSError) as exc:
        _fail(f"invalid simulation config: {exc}")
    return cfg


def _workload(spec: str, cfg, window: str | None, compression: float | None, mips: float | None, max_jobs: int | None):
    from pydantic import ValidationError

    from sim_bridge.workloads import SwfTransform, load_workload

    opts = {}
    if window:
        try:
            start, _, end = window.partition(":")
            opts["window_start_s"] = float(start or 0)
            if end:
                opts["window_end_s"] = float(end)
        except ValueError:
            _fail(f"--window must be START:END in seconds, got {window!r}")
    if compression:
        opts["time_compression"] = compression
    if mips:
        opts["mips_per_core"] = mips
    if max_jobs:
        opts["max_jobs"] = max_jobs
    try:
        transform = SwfTransform(**opts) if opts else None
        return load_workload(spec, transform, core_cap=cfg.job_core_cap)
    except (ValidationError, ValueError, OSError) as exc:
        _fail(f"workload {spec!r}: {exc}")


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
@click.option("--seed", type=int, default=0, show_default=True, help="Simulation seed (boot delays).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def sim_run(workload, window, time_compression, mips_per_core, max_jobs, config_path, preset, initial, action_mode,
            max_steps, policy, seed, as_json) -> None:
    """Run one episode with a built-in policy and print its cost report."""
    from agents.builtin import make_builtin_policy
    from sim_bridge.errors import BridgeError
    from sim_bridge.runner import run_episodes

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
@click.option("--envs", type=int, default=8, show_default=True, help="Environments stepped per batched call.")
@click.option("--steps", type=int, default=4000, show_default=True, help="Batched steps per timed run.")
@click.option("--repeats", type=int, default=3, show_default=True, help="Timed runs of each loop (median reported).")
@click.option("--threads", type=int, default=0, show_default=True, help="Java threads per batch (0 = one per CPU).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def sim_bench(envs, steps, repeats, threads, seed, as_json) -> None:
    """Env-steps/s through the bridge vs the same simulation in a Java-only loop (seed-1551)."""
    from sim_bridge.bench import run_bench
    from sim_bridge.config import SimConfig
    from sim_bridge.workloads import seed_1551

    result = run_bench(SimConfig(threads=threads), seed_1551(), envs, steps, seed=seed, repeats=repeats)
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


@cli.command()
@click.option("--sim", "sim_only", is_flag=True, default=True, show_default=True,
              help="Run in the CloudSim Plus simulation (the only mode until the daemon exists).")
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--out", type=click.Path(file_okay=False), default=None, help="Also write summary.json here.")
def demo(sim_only, seed, out) -> None:
    """The main job on embedded defaults: the paper's workload (seed-1551) in CloudSim Plus under
    baseline policies, with the paper's cost report."""
    from tqdm import tqdm

    from agents.builtin import make_builtin_policy
    from sim_bridge.config import SimConfig
    from sim_bridge.runner import run_episodes
    from sim_bridge.workloads import seed_1551

    runs = [("noop (fleet 1/1/1)", "noop"), ("static 5/5/5", "static:5,5,5"), ("static 10/10/10", "static:10,10,10")]
    click.echo("SAMM demo: seed-1551 (1551 jobs, 155 core-hours) in CloudSim Plus, one-minute steps, "
               "S/M/L = 2/4/8 cores at $0.2/0.4/0.8 per hour, penalty $0.036 per waiting job-hour.")
    cfg = SimConfig(action_mode="per-type")
    names = tuple(t.name for t in cfg.vm_types)
    results = []
    for label, spec in tqdm(runs, desc="simulating", unit="run"):
        r = run_episodes(cfg, seed_1551(), make_builtin_policy(spec, "per-type", names, seed=seed), [seed])[0]
        r["policy"] = label
        results.append(r)
    click.echo(format_report(results))
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "summary.json").write_text(json.dumps(results, indent=2))
        click.echo(f"wrote {Path(out) / 'summary.json'}")


if __name__ == "__main__":  # pragma: no cover
    cli()
