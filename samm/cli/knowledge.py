"""`samm knowledge`: look after the daemon's Knowledge store: what it decided lately and why, the
cool-downs a restart honours, its size, and its history's retention."""
from __future__ import annotations

import dataclasses
import json
import math
import time
from datetime import datetime, timezone

import click

SECONDS_PER_DAY = 86_400.0


def _open(config_path: str | None, url: str | None):
    """The store of `--url`, else of the config's `knowledge.url`, opened without migrating: an
    operator's tool must not upgrade a schema the daemon reads, nor create a database that is not
    there."""
    from samm.cli.main import _daemon_config, _fail
    from samm.knowledge.engine import KnowledgeError, normalize_url, sqlite_path
    from samm.knowledge.store import KnowledgeStore

    if (config_path is None) == (url is None):
        _fail("give exactly one of --config and --url")
    cfg = _daemon_config(config_path) if config_path else None
    url = cfg.knowledge.url if cfg else url
    try:
        path = sqlite_path(normalize_url(url))
        if path is not None and not path.is_file():
            _fail(f"no knowledge store at {path} (knowledge.url {url.split('?')[0]!r})")
        return cfg, KnowledgeStore(url, migrate=False)
    except (KnowledgeError, ValueError) as exc:
        _fail(str(exc))


_SOURCE = [
    click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False), default=None,
                 help="The daemon's YAML config: its knowledge.url (and knowledge.retention_days)."),
    click.option("--url", default=None, help="A knowledge store URL instead of a config."),
]


def _source(f):
    for opt in reversed(_SOURCE):
        f = opt(f)
    return f


@click.group("knowledge")
def knowledge_group() -> None:
    """Inspect and prune the Knowledge store (what the daemon saw, decided and did)."""


@knowledge_group.command("stats")
@_source
def knowledge_stats(config_path, url) -> None:
    """Rows per table, as one JSON object."""
    _, store = _open(config_path, url)
    with store:
        click.echo(json.dumps(store.counts(), sort_keys=True))


@knowledge_group.command("prune")
@_source
@click.option("--older-than-days", type=float, default=None,
              help="Delete history older than this (at least 1 day). Default: the config's knowledge.retention_days.")
def knowledge_prune(config_path, url, older_than_days) -> None:
    """Delete snapshots, observations, decisions and their actions older than N days, as the
    daemon does hourly with knowledge.retention_days. Kept whatever their age: a decision whose
    action is still open and what a kept row refers to; cool-downs, leases and policy versions
    are never deleted. Safe while the daemon runs (short transactions). Prints the rows deleted."""
    from samm.cli.main import _fail
    from samm.knowledge.engine import KnowledgeError

    cfg, store = _open(config_path, url)
    with store:
        days = older_than_days if older_than_days is not None else (cfg.knowledge.retention_days if cfg else None)
        if days is None:
            _fail("--older-than-days: required (the config sets no knowledge.retention_days)")
        if not (math.isfinite(days) and days >= 1):
            _fail(f"--older-than-days must be at least 1, not {days}")
        try:
            deleted = store.prune(days * SECONDS_PER_DAY)
        except KnowledgeError as exc:
            _fail(str(exc), code=1)
    click.echo(json.dumps(deleted, sort_keys=True))


def _when(t: float | None) -> str:
    return "-" if t is None else datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@knowledge_group.command("decisions")
@_source
@click.option("--loop", default=None, help="Only this loop's decisions (default: every loop's).")
@click.option("--since-minutes", type=float, default=60.0, show_default=True, help="How far back to look.")
@click.option("--limit", type=int, default=50, show_default=True, help="The newest this many.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line: the decision and its actions.")
def knowledge_decisions(config_path, url, loop, since_minutes, limit, as_json) -> None:
    """What the daemon decided lately and what became of it, newest first: when, loop, the
    agent's choice, its source (agent, fallback, none) and reason, and each action's target and
    status (succeeded, blocked by the guard, failed, dry_run, still in flight)."""
    from samm.cli.main import _fail

    if not (math.isfinite(since_minutes) and since_minutes > 0):
        _fail(f"--since-minutes must be a positive number, not {since_minutes}")
    if not 1 <= limit <= 100_000:
        _fail(f"--limit must be in [1, 100000], not {limit}")
    _, store = _open(config_path, url)
    with store:
        decisions = store.decisions(since=time.time() - since_minutes * 60, limit=limit, loop=loop, newest_first=True)
        rows = [(d, store.actions(d.id)) for d in decisions]
    for d, actions in rows:
        if as_json:
            click.echo(json.dumps({**dataclasses.asdict(d), "actions": [dataclasses.asdict(a) for a in actions]},
                                  sort_keys=True, default=str))
            continue
        done = "; ".join(f"{a.group_name} {a.status}" + (f" ({_short(a.error)})" if a.error else "") for a in actions)
        why = f" [{_short(d.reason)}]" if d.reason else ""
        click.echo(f"{_when(d.created_at)}  {d.loop}  {d.iteration_key}  {d.agent}: {d.action_name or d.action} "
                   f"({d.source}){why}  -> {done or 'no action'}")
    if not rows and not as_json:
        click.echo(f"no decisions in the last {since_minutes:g} minutes" + (f" for loop {loop!r}" if loop else ""))


@knowledge_group.command("cooldowns")
@_source
@click.option("--loop", default="default", show_default=True, help="The loop whose targets to show.")
def knowledge_cooldowns(config_path, url, loop) -> None:
    """Each target's cool-down as the daemon will honour it after a restart: until when, how long
    is left, and the action that set it."""
    _, store = _open(config_path, url)
    with store:
        states = store.group_states(loop=loop)
    now = time.time()
    for name, st in sorted(states.items()):
        left = st.cooldown_until - now
        click.echo(f"{name}  until {_when(st.cooldown_until) if math.isfinite(st.cooldown_until) else 'never'}  "
                   + (f"{left:.0f} s left" if left > 0 else "over")
                   + f"  last action {_when(st.last_action_at)} {st.last_action_key or ''}".rstrip())
    if not states:
        click.echo(f"no cool-downs recorded for loop {loop!r}")


def _short(text: str, limit: int = 160) -> str:
    one = " ".join(str(text).split())
    return one if len(one) <= limit else one[:limit - 3] + "..."
