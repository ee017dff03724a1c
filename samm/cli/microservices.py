"""`samm testbed-microservices`: a controller right-sizes the CPU limits of a real containerised
application every second (issue 18's "Real containers"). `samm reclaimer-ceiling`: a headroom
ceiling chosen for a trained Reclaimer policy on validation episodes (agents/microservice_cores/ceiling.py).

Separate commands, like `samm testbed-deferrable`; `samm/cli/main.py` registers them with
`cli.add_command`. The testbed run itself is samm/testbed/microservices/run.py.
"""
from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import click

#: seconds of load before step 0: an hour is no warm-up, a value past it a typo
#: how far beyond the topology's declared users range --users may go
MAX_USERS_OVER_RANGE = 4
MAX_WARMUP_S = 3600


def _params(values: tuple[str, ...]) -> dict:
    out: dict = {}
    for v in values:
        k, sep, x = v.partition("=")
        if not sep or not k:
            raise click.BadParameter(f"expected KEY=VALUE, got {v!r}", param_hint="--agent-param")
        try:
            out[k] = json.loads(x)
        except ValueError:
            out[k] = x
    return out


@click.command("testbed-microservices")
@click.option("--agent", default="autoscale", show_default=True,
              help="The controller: reclaimer (the policy shipped for the app, trained in simulation), "
                   "autoscale, sinan (the shipped Sinan-style model; model_dir=DIR for another), sinan-explore (Sinan's data collection: out=DIR), vpa, static-max or static.")
@click.option("--agent-param", multiple=True,
              help="KEY=VALUE (JSON values) passed to the controller, e.g. fraction=0.5 for static, or for any agent scale_down_window=5 (a limit falls only to the highest decision of the last 5 s) and headroom_floor=4 (no limit below 4x the mean use of the last 5 s) and throttle_guard=0.2 (a service throttled in over a fifth of the last second's CFS periods gets at least its limit x 1.1, throttle_step=0.1); repeatable.")
@click.option("--users", type=int, default=8, show_default=True,
              help="Closed-loop Locust users (the topology's `users` range is what fits the machine).")
@click.option("--seconds", type=int, default=60, show_default=True, help="Control steps (one per second).")
@click.option("--out", type=click.Path(file_okay=False), default="microservices-run", show_default=True,
              help="Output directory.")
@click.option("--topology", default="testbed", show_default=True,
              help="A topology name under agents/microservice_cores/topologies or a YAML file.")
@click.option("--fault", "faults", multiple=True,
              help="kill-service | restart-engine | stall-load, optionally NAME@SECOND; repeatable.")
@click.option("--fault-at", type=float, default=None,
              help="When a fault without @ fires, in seconds after step 0 (default: half the run).")
@click.option("--fault-service", default=None, help="The service kill-service kills (default: rate).")
@click.option("--stall-seconds", type=float, default=5.0, show_default=True, help="How long stall-load freezes Locust.")
@click.option("--docker-host", default=None,
              help="Use this engine (e.g. unix:///var/run/docker.sock) instead of starting a private dockerd.")
@click.option("--base-port", type=int, default=None, help="Port of the first service (default: first free block from 18100).")
@click.option("--initial", default="cap", show_default=True, help="Starting limits: cap or fraction=<f> of the caps.")
@click.option("--warmup", type=float, default=2.0, show_default=True, help="Seconds of load before step 0.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the services' and users' draws.")
@click.option("--knowledge-url", default=None, help="Knowledge store URL (default: sqlite under --out).")
@click.option("--run-name", default=None, help="Names the Knowledge loop microservices-<run> (default: random).")
@click.option("--no-plots", is_flag=True, help="Skip cores.png and p99.png.")
@click.option("--cpu-burst", type=click.FloatRange(0.0, 1.0), default=None,
              help="Give each container a CFS burst of this share of its quota with every limit (ours; "
                   "Linux >= 5.14, a local engine and root): quota left unused while idle may be spent on a "
                   "later burst of calls instead of throttling it. Default: the topology's cfs_burst (none in testbed).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
def testbed_microservices(agent, agent_param, users, seconds, out, topology, faults, fault_at, fault_service,
                          stall_seconds, docker_host, base_port, initial, warmup, seed, knowledge_url, run_name,
                          no_plots, cpu_burst, as_json) -> None:
    """Run a controller live on the real-container microservice testbed.

    The application (default `testbed`: 7 Python HTTP services - frontend, search, geo, rate,
    profile, a cache and a SQLite database - in a call graph) runs one busybox container per
    service on a local Docker engine, with the host's Python bind-mounted read-only and no image
    registry. Locust (headless, its own process) drives closed-loop users with exponential think
    time and reports each second's end-to-end latency percentiles. Every second the loop measures
    each container (CPU, memory, IO from its cgroup; the CPU limit from the engine; network from
    the service's own counters), asks the controller for cores per service, and applies them
    through the Docker executor behind a guard: limits stay in [floor, cap], nothing is done on
    stale or unknown latency or while the engine is unreachable, one apply per step, and every
    decision is recorded in the Knowledge store.

    Faults: kill-service (a container is SIGKILLed; it is started again and its limit
    re-applied), restart-engine (the private dockerd is restarted; errors are recorded, the
    containers come back), stall-load (Locust is frozen; stale latency -> no action).

    Writes under --out: steps.csv (per second: cores per service and in total, use, p99, p50,
    requests/s, failures/s, the action or why none), summary.json (mean/max total cores, p99
    statistics, violation rate = share of seconds with a known p99 above the QoS target, seconds
    with unknown latency, actions, restarts), cores.png, p99.png, load.jsonl (Locust's seconds),
    locust.log and knowledge.db. Needs root (for the private dockerd) and Locust (`pip install
    -e .[testbed]`)."""
    import logging

    from samm.testbed.microservices.run import MicroservicesRunOptions, run_microservices

    if seconds < 1 or users < 1:
        click.echo("error: --seconds and --users must be >= 1", err=True)
        sys.exit(2)
    if warmup > MAX_WARMUP_S:
        # the engine, the containers and Locust were started, then step 0 waited for years
        click.echo(f"error: --warmup {warmup:g} is more than {MAX_WARMUP_S} s of load before step 0", err=True)
        sys.exit(2)
    topo = _check_topology(topology)
    if users > MAX_USERS_OVER_RANGE * topo.users[1]:
        # Locust spawns every user in the first second: 10**6 exhausted memory after the engine and
        # the containers had started. A modest overshoot of the declared range is a fair experiment.
        click.echo(f"error: --users {users} is more than {MAX_USERS_OVER_RANGE}x the {topo.users[1]} users the "
                   f"topology {topo.name!r} declares as fitting the machine (its `users` range)", err=True)
        sys.exit(2)
    out_dir = Path(out).resolve()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        logging.basicConfig(filename=str(out_dir / "testbed.log"), level=logging.INFO,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    except OSError as exc:
        click.echo(f"error: testbed-microservices: --out {out}: cannot write there: {exc}", err=True)
        sys.exit(2)
    opts = MicroservicesRunOptions(agent=agent, agent_params=_params(agent_param), users=users, seconds=seconds,
                                   out_dir=str(out_dir), topology=topology, faults=tuple(faults), fault_at=fault_at,
                                   fault_service=fault_service, stall_seconds=stall_seconds, docker_host=docker_host,
                                   base_port=base_port, knowledge_url=knowledge_url, run_name=run_name,
                                   warmup_s=warmup, initial=initial, seed=seed, plots=not no_plots,
                                   cpu_burst=cpu_burst)
    # SIGTERM unwinds like Ctrl-C: without it the containers, Locust and the private dockerd were
    # left running and the seconds already measured were never written
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        res = run_microservices(opts)
    except (ValueError, FileNotFoundError) as exc:
        click.echo(f"error: testbed-microservices: {exc}", err=True)
        sys.exit(2)
    except (KeyboardInterrupt, SystemExit) as exc:
        click.echo(f"testbed-microservices: interrupted; the seconds run so far are in {out_dir}", err=True)
        if isinstance(exc, KeyboardInterrupt):  # click's "Aborted!" exited 1, not Ctrl-C's 130 of the other verbs
            sys.exit(130)
        raise
    except Exception as exc:  # noqa: BLE001 - e.g. no root for dockerd, Locust missing
        click.echo(f"error: testbed-microservices: {type(exc).__name__}: {exc}", err=True)
        sys.exit(1)
    finally:
        signal.signal(signal.SIGTERM, previous)
    s = res.summary
    if as_json:
        click.echo(json.dumps(s, default=float))
        return
    tc, p = s["total_cores"], s["p99_ms"]
    vr = s["violation_rate"]
    click.echo(f"run {s['run']}: {s['agent']} on {s['topology']}, {s['users']} users, {s['seconds']} s "
               f"(QoS p99 <= {s['qos_ms']:g} ms)")
    click.echo(f"cores: mean {tc['mean']:.3f}, max {tc['max']:.3f} (caps {tc['caps']:.2f}); used {s['used_cores_mean']:.3f}")
    if p["n"]:
        click.echo(f"p99: mean {p['mean']:.1f} ms, median {p['median']:.1f}, p95 {p['p95']:.1f}, max {p['max']:.1f}; "
                   f"violation rate {vr * 100:.1f} % ({s['violation_seconds']}/{s['known_latency_seconds']} s)")
    click.echo(f"unknown latency {s['unknown_latency_seconds']} s (stale {s['stale_seconds']}); "
               f"{s['requests_per_s_mean']:.1f} requests/s, {s['failures_total']:.0f} failures; "
               f"{s['actions']['limit_changes']} limit changes, {s['actions']['no_action_steps']} no-action steps")
    for r in s["restarts"]:
        click.echo(f"step {r['step']}: restarted {' '.join(r['services'])}")
    click.echo(f"wrote {', '.join(str(f) for f in res.files.values())}; {s['decisions']} decisions in "
               f"{res.knowledge_url} (loop {res.loop})")


def _check_topology(topology: str):
    """The topology, or exit 2 with one line naming --topology: a malformed YAML file printed
    pydantic's report of 20-odd lines that named neither the option nor the file."""
    from agents.microservice_cores.topology import load_topology

    try:
        return load_topology(topology)
    except ValueError as exc:   # one line naming the file and the field (load_topology's own)
        click.echo(f"error: testbed-microservices: --topology {topology}: {' '.join(str(exc).split())}", err=True)
        sys.exit(2)


@click.command("reclaimer-ceiling")
@click.option("--policy", "policy_dir", required=True, type=click.Path(exists=True, file_okay=False),
              help="A saved Reclaimer policy directory (e.g. a training run's best-policy).")
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="Where the policy with its ceiling is saved (the weights unchanged).")
@click.option("--recipe", type=click.Choice(["shipped"]), default=None,
              help="Fill every option below that is left out from a recipe. shipped: the ceilings shipped since "
                   "session 88 (--eval-seeds 101-170 --rule sqrt --margin 0.01 --pick fewest --window 60 "
                   "--release 0.8 --hold 60 --panic 2; Social's adds --pinned 0.98).")
@click.option("--eval-seeds", default=None,
              help="Validation seeds, apart from the experiment's 1-5 and 6-10 (default: 101-120).")
@click.option("--rule", type=click.Choice(["multiple", "sqrt", "max-multiple"]), default=None,
              help="multiple (the default): every limit at most H times the service's mean use; sqrt: at most "
                   "u + β√u (square-root staffing); max-multiple: at most the smaller of u + β√u (β from --sqrt) "
                   "and H times u.")
@click.option("--grid", default=None,
              help="Values to try, comma-separated (default: H 3 down to 1.2 by 0.1; β 0.3, 0.25, 0.2 down to 0.05 "
                   "by 0.01; max-multiple's H 3, 2.5, 2.25, 2, 1.75, 1.5).")
@click.option("--sqrt", "sqrt_beta", type=click.FloatRange(min=0.0), default=None,
              help="With --rule max-multiple: the β of the square-root ceiling it bounds.")
@click.option("--max-multiple", type=click.FloatRange(min=0.0), default=None,
              help="With --rule sqrt: also at most this many times the use (default 0: no bound; ours).")
@click.option("--max-violations", type=float, default=0.0, show_default=True,
              help="The largest share of violating validation seconds allowed.")
@click.option("--no-worse-than-policy", is_flag=True,
              help="Also count a value clean when it breaks no more validation seconds than the policy without a "
                   "ceiling (for a policy that already breaks rare ones; otherwise it gets no ceiling).")
@click.option("--margin", type=float, default=None,
              help="Raise the rule's value by this much (default 0).")
@click.option("--pick", type=click.Choice(["smallest", "fewest"]), default=None,
              help="Of the clean values: the smallest (the default), or the one with the fewest mean cores.")
@click.option("--window", type=click.IntRange(min=0), default=None,
              help="The use the ceiling scales: the larger of the 5-s mean and the mean over this many seconds "
                   "(default 0: the 5-s mean alone).")
@click.option("--release", type=click.FloatRange(min=0.0), default=None,
              help="Lift every service's ceiling after a second whose p99 reached this share of the QoS target "
                   "(default 0: never).")
@click.option("--hold", type=click.IntRange(min=0), default=None,
              help="With --release or --pinned: keep the ceiling lifted this many seconds more (default 0).")
@click.option("--pinned", type=click.FloatRange(min=0.0, max=1.0), default=None,
              help="Also lift one service's ceiling while its use reached this share of its limit (default 0: never).")
@click.option("--panic", type=click.IntRange(min=0), default=None,
              help="Every service at its cap for this many seconds after a second whose p99 broke the QoS target "
                   "(default 0: never).")
def reclaimer_ceiling(policy_dir, out, recipe, eval_seeds, rule, grid, sqrt_beta, max_multiple, max_violations,
                      no_worse_than_policy, margin, pick, window, release, hold, pinned, panic) -> None:
    """Choose a headroom ceiling for a Reclaimer policy (ours): the smallest value on the grid (H, or
    β with --rule sqrt) such that the policy with every limit capped at H times the service's mean
    use u (or at u + β√u) breaks QoS in no validation second, at that value and every larger one of
    the grid (agents/microservice_cores/ceiling.py); with --pick fewest, the clean value with the
    fewest mean cores. --window, --release and --hold give the ceiling a memory (a slow mean of the
    use; lifted after a slow second); --panic puts every service at its cap for a few seconds after
    a violating one. --recipe shipped is the shipped ceilings' recipe. --rule max-multiple --sqrt β
    then bounds a square-root ceiling at H times the use (Social's second stage). Prints each value's
    mean cores and violations; saves the policy with the chosen ceiling to --out."""
    from agents.microservice_cores.ceiling import main as ceiling_main

    _check_ceiling_inputs(eval_seeds, grid)
    argv = ["--policy", policy_dir, "--out", out, "--max-violations", str(max_violations)]
    given = {"--recipe": recipe, "--eval-seeds": eval_seeds, "--rule": rule, "--grid": grid, "--sqrt": sqrt_beta,
             "--max-multiple": max_multiple, "--margin": margin,
             "--pick": pick, "--window": window, "--release": release, "--hold": hold, "--pinned": pinned,
             "--panic": panic}
    argv += [x for flag, v in given.items() if v is not None for x in (flag, str(v))]
    argv += ["--no-worse-than-policy"] if no_worse_than_policy else []
    rc = ceiling_main(argv)
    if rc:
        sys.exit(rc)


#: the experiment's seeds (1-5) and its check seeds (6-10): the help's "apart from" (validation.py)
def _check_ceiling_inputs(eval_seeds: str | None, grid: str | None) -> None:
    """Exit 2 naming the option, before any episode runs: validation seeds that are the experiment's
    ran and chose a ceiling on the very episodes it is then reported on, and a grid value that is not
    a number said only "could not convert string to float"."""
    from agents.microservice_cores.ceiling import parse_grid
    from samm.cli.seeds import parse_seeds, require_apart_from_reported

    try:
        if eval_seeds is not None:
            try:
                seeds = parse_seeds(eval_seeds)
            except ValueError:
                seeds = []      # malformed: agents/microservice_cores/ceiling.py names it
            require_apart_from_reported(seeds, f"--eval-seeds {eval_seeds!r}")
        parse_grid(grid or "")
    except ValueError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
