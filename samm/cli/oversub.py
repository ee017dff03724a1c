"""`samm testbed-oversub`: the oversubscription live path on the emulated cloud testbed.

A separate command (not `samm testbed oversub`) because `samm testbed` is a command, not a
group; `samm/cli/main.py` registers it with `cli.add_command(testbed_oversub)`.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

#: a step replays one hour of the workload; more wall seconds than that replay it slower than it ran
SECONDS_PER_EMULATED_HOUR = 3600


@click.command("testbed-oversub")
@click.option("--agent", "agent_spec", default="c2marl", show_default=True,
              help="NAME[=DIR]: the oversubscription agent to host (a saved policy directory optional).")
@click.option("--setting", default=None,
              help="tiny, azure or internal (PM size, subscribers). Default: a learned agent's own setting "
                   "(the shipped C2MARL policy's is azure), else tiny.")
@click.option("--pms", type=int, default=4, show_default=True, help="Emulated PMs (cgroups).")
@click.option("--steps", type=int, default=8, show_default=True, help="Steps (emulated hours) to replay.")
@click.option("--seconds-per-step", type=int, default=1, show_default=True, help="Wall seconds per step (whole).")
@click.option("--seed", type=int, default=0, show_default=True, help="Workload seed.")
@click.option("--max-vms", type=int, default=40, show_default=True, help="At most this many VMs (processes).")
@click.option("--host-cores", type=float, default=1.2, show_default=True,
              help="Host cores the whole emulated cluster may use (sets the CPU scale).")
@click.option("--service-url", default=None, help="Use this `samm serve` instead of serving the agent in process.")
@click.option("--knowledge-url", default=None, help="Knowledge store URL (default: sqlite under --out).")
@click.option("--run-name", default=None, help="Names the Graphite series and the Knowledge loop oversub-<run>.")
@click.option("--admit-mode", type=click.Choice(["batch", "per-vm"]), default="batch", show_default=True,
              help="One REST call per step (the paper's per-subscriber decision) or one per VM request.")
@click.option("--out", type=click.Path(file_okay=False), default="oversub-run", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
def testbed_oversub(agent_spec, setting, pms, steps, seconds_per_step, seed, max_vms, host_cores, service_url,
                    knowledge_url, run_name, admit_mode, out, as_json) -> None:
    """Replay an oversubscription workload on emulated PMs sharing REAL CPU: each PM a cgroup
    with a CPU quota, each VM a worker process burning its usage trace, each request admitted
    by the hosted agent over REST and placed by best fit, PM usage read back from a real
    Graphite, decisions and hot events in the Knowledge store. Needs root (cgroup v1) and the
    Graphite Debian packages. Writes steps.csv, usage.png and summary.json under --out."""
    import logging
    import signal

    from samm.cli.deferrable import service_url_problem
    from samm.knowledge.store import KnowledgeError
    from samm.monitor.local_graphite import GraphiteUnavailable
    from samm.testbed.oversub.cgroups import CgroupError, unavailable_reason
    from samm.testbed.oversub.run import OversubRunOptions, run_oversub

    def fail(msg: str) -> None:
        click.echo(f"error: {msg}", err=True)
        sys.exit(2)

    reason = unavailable_reason()
    if reason:
        fail(f"testbed-oversub needs writable cgroups: {reason}")
    if steps < 1 or pms < 1 or max_vms < 1 or seconds_per_step < 1 or not 0 < host_cores < float("inf"):
        fail("--steps, --pms, --max-vms and --seconds-per-step must be >= 1 and --host-cores > 0")
    if seed < 0:
        fail(f"--seed must be >= 0, got {seed}")
    if problem := service_url_problem(service_url):
        fail(problem)
    if seconds_per_step > SECONDS_PER_EMULATED_HOUR:
        # slower than real time: a typo (`--seconds-per-step 100000000`) slept through step 0 for years
        fail(f"--seconds-per-step {seconds_per_step} is slower than real time (a step is an emulated hour, "
             f"at most {SECONDS_PER_EMULATED_HOUR})")
    agent, _, policy_dir = agent_spec.partition("=")
    out_dir = Path(out).resolve()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "testbed.log").open("a").close()
    except OSError as exc:
        fail(f"--out {out}: cannot write there: {exc.strerror or exc}")
    logging.basicConfig(filename=str(out_dir / "testbed.log"), level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    opts = OversubRunOptions(agent=agent, policy_dir=policy_dir or None, setting=setting, pms=pms, steps=steps,
                             seconds_per_step=seconds_per_step, seed=seed, max_vms=max_vms, host_cores=host_cores,
                             out_dir=str(out_dir), run_name=run_name, service_url=service_url,
                             knowledge_url=knowledge_url, admit_mode=admit_mode)
    # SIGTERM unwinds like Ctrl-C, so the cgroups, workers and Graphite are cleaned up
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        res = run_oversub(opts)
    except (ValueError, OSError, KnowledgeError, CgroupError, GraphiteUnavailable) as exc:
        fail(f"testbed-oversub: {exc}")
    except (KeyboardInterrupt, SystemExit) as exc:
        click.echo(f"testbed-oversub: interrupted; the steps run so far are in {out_dir}", err=True)
        if isinstance(exc, KeyboardInterrupt):  # click's "Aborted!" exited 1, not Ctrl-C's 130 of the other verbs
            sys.exit(130)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    s = res.summary
    if as_json:
        click.echo(json.dumps(s))
        return
    g = s["gap"]
    click.echo(f"run {res.run_name}: {s['requests']} requests, {s['placed']} placed, {s['rejected']} rejected, "
               f"{s['fallbacks']} admitted without oversubscription after a failed call")
    click.echo(f"S-Cores {s['s_cores']:.3f}; hot steps per PM {s['hot_steps_per_pm']} "
               f"(simulator {s['hot_steps_per_pm_sim']})")
    if g["mean_abs_cores"] is not None:
        click.echo(f"PM usage, live (Graphite) vs simulator: mean |gap| {g['mean_abs_cores']:.2f} cores, "
                   f"max {g['max_abs_cores']:.2f}, {g['pm_steps_measured']} PM-steps measured")
    d = s.get("graphite_delivery", {})
    if g["pm_steps_missing"] or any(d.values()):
        click.echo(f"Graphite delivery: {g['pm_steps_missing']} PM-steps without a point, {d.get('late_reads', 0)} "
                   f"steps complete only on the end-of-run read, {d.get('collector_seconds_filled', 0)} seconds "
                   f"filled after a stalled collector, {d.get('points_dropped', 0)} points carbon refused")
    click.echo(f"simulator replays the same placements: {s['sim_placements_match']}")
    if s.get("decisions_conflicting"):
        click.echo(f"warning: {s['decisions_conflicting']} decision(s) of run {res.run_name} were recorded earlier "
                   f"with another action or agent; the earlier records stand (this run's: steps.json)", err=True)
    if s.get("decisions_unrecorded"):
        click.echo(f"warning: the Knowledge store refused {s['decisions_unrecorded']} decision(s) to the end: "
                   f"saved in {res.files['unrecorded']}", err=True)
    click.echo(f"wrote {', '.join(str(p) for p in res.files.values())}; decisions in {res.knowledge_url} "
               f"(loop {res.loop})")
