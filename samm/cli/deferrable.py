"""`samm testbed-deferrable`: the deferrable-jobs (OSDEC) live path on the testbed.

A separate command, like `samm testbed-oversub`; `samm/cli/main.py` registers it with
`cli.add_command(testbed_deferrable)`. The run itself is samm/testbed/deferrable/run.py.
"""
from __future__ import annotations

import json
import math
import re
import sqlite3
import sys
from pathlib import Path

import click

#: the names testbed-microservices takes (samm/testbed/microservices/run.py): no space or "/" in a
#: Graphite path or a worker's instance name; at most 120 characters, as the run's `<run>-simg`
#: must still be a session name the plan service takes (128)
RUN_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,119}")


def _params(values: tuple[str, ...]) -> dict:
    out = {}
    for v in values:
        k, sep, x = v.partition("=")
        if not sep or not k:
            raise click.BadParameter(f"expected KEY=VALUE, got {v!r}", param_hint="--agent-param")
        try:
            out[k] = float(x)
        except ValueError:
            raise click.BadParameter(f"{k}={x!r}: the value must be a number", param_hint="--agent-param") from None
        if not math.isfinite(out[k]):
            raise click.BadParameter(f"{k}={x!r}: the value must be a finite number", param_hint="--agent-param")
    return out


@click.command("testbed-deferrable")
@click.option("--setting", type=click.Choice(["tiny", "default"]), default="tiny", show_default=True,
              help="The deferrable-jobs setting whose episode is replayed.")
@click.option("--seed", type=int, default=0, show_default=True, help="Episode seed.")
@click.option("--split", type=click.Choice(["train", "test"]), default="test", show_default=True)
@click.option("--slots", type=int, default=None, help="Replay only the first N slots (default: the whole episode).")
@click.option("--slot-seconds", type=float, default=0.5, show_default=True, help="Wall seconds per slot.")
@click.option("--agent", default="fifo", show_default=True,
              help="fifo, tetris, osdec (or another heuristic of agents/deferrable_jobs/baselines.py).")
@click.option("--policy", "policy_dir", type=click.Path(file_okay=False), default=None,
              help="A saved OSDEC policy directory (default: the shipped one).")
@click.option("--agent-param", multiple=True, help="KEY=VALUE for a heuristic (e.g. eps=16), repeatable.")
@click.option("--service-url", default=None, help="Ask this `samm serve` instead of hosting the agent in process.")
@click.option("--request-timeout", type=float, default=2.0, show_default=True, help="REST call timeout (s).")
@click.option("--workers", type=int, default=3, show_default=True, help="Worker processes (the fleet's VMs).")
@click.option("--worker-cores", type=int, default=None,
              help="Cores per worker (default: max(fleet / workers rounded up, widest job)).")
@click.option("--knowledge-url", default=None, help="Knowledge store URL (default: sqlite under --out).")
@click.option("--graphite", default=None, help="carbon HOST:PORT for the per-slot counters (default: none).")
@click.option("--run-name", default=None, help="Names the Knowledge loop deferrable-<run> (default: random).")
@click.option("--no-guard", is_flag=True, help="Disable the deadline guard (the agent alone decides).")
@click.option("--out", type=click.Path(file_okay=False), default="deferrable-run", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
def testbed_deferrable(setting, seed, split, slots, slot_seconds, agent, policy_dir, agent_param, service_url,
                       request_timeout, workers, worker_cores, knowledge_url, graphite, run_name, no_guard, out,
                       as_json) -> None:
    """Replay a deferrable-jobs episode live: worker processes lease jobs from a SQLite queue,
    a scheduling loop asks the hosted agent each slot which eligible jobs start on the fleet's
    leftover cores (C_t from the episode), a deadline guard starts jobs at their latest start
    that still fit, and every slot's decision goes to the Knowledge store. Writes slots.csv and
    summary.json (live vs simulator on the same episode) under --out."""
    import logging

    from samm.testbed.deferrable.run import DeferrableRunOptions, run_deferrable

    from samm.knowledge.engine import KnowledgeError

    if (not 0 < slot_seconds < float("inf") or workers < 1 or (slots is not None and slots < 1)
            or not 0 < request_timeout < float("inf") or (worker_cores is not None and worker_cores < 1)):
        click.echo("error: --slot-seconds and --request-timeout must be finite numbers > 0, --workers, --slots and "
                   "--worker-cores >= 1", err=True)
        sys.exit(2)
    _check_scale(setting, workers, slot_seconds)
    if problem := service_url_problem(service_url):
        click.echo(f"error: {problem}", err=True)
        sys.exit(2)
    if run_name is not None and not RUN_NAME.fullmatch(run_name):
        # it names the Graphite counters: "a b" had carbon refuse every one, the run still ending 0
        click.echo(f"error: --run-name {run_name!r} must match {RUN_NAME.pattern} (it names the Graphite "
                   "counters and the Knowledge loop)", err=True)
        sys.exit(2)
    agent_params = _params(agent_param)
    out_dir = Path(out).resolve()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "testbed.log").open("a").close()
    except OSError as exc:
        click.echo(f"error: testbed-deferrable: --out {out}: cannot write there: {exc}", err=True)
        sys.exit(2)
    logging.basicConfig(filename=str(out_dir / "testbed.log"), level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    opts = DeferrableRunOptions(setting=setting, seed=seed, split=split, slots=slots, slot_seconds=slot_seconds,
                                agent=agent, policy_dir=policy_dir, agent_params=agent_params,
                                service_url=service_url, request_timeout_s=request_timeout, workers=workers,
                                worker_cores=worker_cores, knowledge_url=knowledge_url, graphite=graphite,
                                out_dir=str(out_dir), run_name=run_name, guard=not no_guard)
    try:
        res = run_deferrable(opts)
    except (ValueError, OSError, KnowledgeError, sqlite3.Error) as exc:  # OSError: FileNotFoundError and co.
        click.echo(f"error: testbed-deferrable: {exc}", err=True)
        sys.exit(2)
    s = res.summary
    if s.get("interrupted"):
        click.echo(f"interrupted ({s.get('signal') or 'signal'}) after {s['slots']} slot(s); the report covers "
                   "those", err=True)
    if as_json:
        click.echo(json.dumps(s, default=float))
        if s.get("interrupted"):
            sys.exit(_interrupted_code(s))
        return
    lv, sm, sg, ph = s["live"], s["sim"], s["sim_guarded"], s["physical"]
    click.echo(f"run {s['run']}: {s['slots']} slots x {s['slot_seconds']} s, agent {s['agent']} ({s['via']}), "
               f"{s['jobs']} jobs, {s['workers']} workers x {s['worker_cores']} cores")
    for name, r in (("live", lv), ("simulator", sm), ("simulator + guard", sg)):
        click.echo(f"{name:>18}: utilisation {r['utilisation']:.0f}, started {r['started']}, missed {r['missed']}, "
                   f"violation slots {r['violation_slots']}, reward {r['total_reward']:.0f}")
    click.echo(f"deadline-rescued {lv['deadline_rescued']}, agent errors {lv['errors']}; same start slot as the "
               f"simulator for {s['same_start_slots_as_sim']}/{s['jobs']} jobs "
               f"({s['same_start_slots_as_sim_guarded']} with the guard)")
    click.echo(f"workers: {ph['completed']}/{ph['released']} released jobs completed, max attempts "
               f"{ph['max_attempts']}, start lag mean {ph['start_lag_s_mean'] or 0:.3f} s max "
               f"{ph['start_lag_s_max'] or 0:.3f} s")
    click.echo(f"wrote {res.files['slots']}, {res.files['summary']}; {s['decisions']} decisions in "
               f"{res.knowledge_url} (loop {res.loop})")
    if s.get("interrupted"):
        sys.exit(_interrupted_code(s))


def service_url_problem(url: str | None) -> str | None:
    """Why --service-url cannot reach a `samm serve` (None: it can try). A URL without a scheme or
    host failed every call of the run, each one counted as an agent error, and the run still ended 0."""
    from samm.config import http_url_problem

    if url is None or not (problem := http_url_problem(url)):
        return None
    return f"--service-url {url!r} {problem} of a `samm serve`"


def _check_scale(setting_name: str, workers: int, slot_seconds: float) -> None:
    """Refuses a worker count or slot length no replay can mean (exit 2): every worker is a process
    started before slot 0 (`--workers 100000` forked until the machine ran out, deaf to Ctrl-C), and
    a slot longer than its workload's own minutes replays slower than real time (a typo of `--slot-seconds`
    turned a minute's run into days)."""
    from agents.deferrable_jobs.settings import get_setting

    setting = get_setting(setting_name)
    if workers > setting.fleet_cores:
        click.echo(f"error: --workers {workers} is more than the {setting_name} fleet's {setting.fleet_cores:g} "
                   "cores (a worker is a VM of at least one core)", err=True)
        sys.exit(2)
    real_time_s = setting.slot_minutes * 60.0
    if slot_seconds > real_time_s:
        click.echo(f"error: --slot-seconds {slot_seconds:g} is slower than real time (a {setting_name} slot is "
                   f"{real_time_s:g} s of workload)", err=True)
        sys.exit(2)


def _interrupted_code(summary: dict) -> int:
    """128 + the signal's number, as a shell reports a process a signal stopped (130 for SIGINT)."""
    import signal

    try:
        return 128 + int(signal.Signals[summary.get("signal") or "SIGINT"])
    except KeyError:
        return 130
