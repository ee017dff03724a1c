"""`samm knowledge`: look after the daemon's Knowledge store (its size, its history)."""
from __future__ import annotations

import json
import math

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
