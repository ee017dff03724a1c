"""Operating the Knowledge store: history retention (`KnowledgeStore.prune`, `samm knowledge
prune|stats`, the daemon's hourly prune: what a restart needs, cool-downs, leases, policy versions
and open actions, is never deleted) and inspection (`samm knowledge decisions|cooldowns`)."""
import json
import time

import pytest
from click.testing import CliRunner

from samm.cli.main import cli
from samm.knowledge.store import MIN_RETENTION_S, KnowledgeStore
from samm.config import ConfigError, load_config
from tests.fixtures_postgres import pg_url, postgres_server_url  # noqa: F401
from tests.test_config_daemon import EXAMPLE

DAY = 86_400.0
NOW = 100 * DAY


def _iteration(store, t, key, *, status="succeeded", cooldown_until=None):
    """One daemon iteration at time t: snapshot, observation, decision, one action."""
    snap = store.record_snapshot(t - 60, t, "ok", raw={"n": 1}, now=t)
    obs = store.record_observation(snap, {"cpu_mean": 0.5}, now=t)
    dec, _ = store.record_decision(key, agent="a", action=1, source="agent", observation_id=obs, now=t)
    store.begin_action(dec, f"{key}:S", "sim", "S", {"delta": 1}, now=t)
    if status != "in_flight":
        store.finish_action(f"{key}:S", status, cooldown_until=cooldown_until, now=t)
    return snap, obs, dec


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path):
    url = f"sqlite:///{tmp_path}/k.db" if request.param == "sqlite" else request.getfixturevalue("pg_url")
    with KnowledgeStore(url) as s:
        yield s


def test_prune_deletes_old_history_and_keeps_the_recent(store):
    old = [_iteration(store, NOW - 40 * DAY + i, f"old{i}") for i in range(5)]
    recent = _iteration(store, NOW - DAY, "recent")
    deleted = store.prune(30 * DAY, now=NOW, batch=2)  # several batches
    assert deleted == {"decisions": 5, "actions": 5, "observations": 5, "snapshots": 5}
    assert store.counts()["decisions"] == 1 and store.decision("recent") is not None
    assert store.snapshot(recent[0]) is not None and store.observation(recent[1]) is not None
    assert all(store.snapshot(s) is None and store.observation(o) is None for s, o, _ in old)
    assert store.prune(30 * DAY, now=NOW) == {"decisions": 0, "actions": 0, "observations": 0, "snapshots": 0}


def test_prune_keeps_an_open_action_its_decision_and_what_they_refer_to(store):
    snap, obs, dec = _iteration(store, NOW - 40 * DAY, "stuck", status="in_flight")
    store.prune(30 * DAY, now=NOW)
    assert [a.idempotency_key for a in store.in_flight_actions()] == ["stuck:S"]
    assert store.decision("stuck") is not None and store.observation(obs) is not None
    assert store.snapshot(snap) is not None


def test_prune_never_touches_cooldowns_leases_or_policy_versions(store):
    _iteration(store, NOW - 40 * DAY, "acted", cooldown_until=NOW + 600)  # a cool-down far in the future
    store.acquire_lease("daemon", "host:1", 60.0, now=NOW - 40 * DAY)
    store.register_policy_version("lstm-ppo", "v1", now=NOW - 40 * DAY)
    store.prune(30 * DAY, now=NOW)
    assert store.cooldowns() == {"S": NOW + 600}
    assert store.lease("daemon") is not None and store.active_policy("lstm-ppo").version == "v1"
    assert store.counts()["decisions"] == 0


def test_a_snapshot_without_a_decision_is_pruned_by_when_it_was_written(store):
    # a stale window records a snapshot and no decision
    store.record_snapshot(NOW - 40 * DAY - 60, NOW - 40 * DAY, "stale", now=NOW - 40 * DAY)
    kept = store.record_snapshot(NOW - 60, NOW, "stale", now=NOW)
    # a simulated loop's windows count from 0: written now, its snapshot is young
    simulated = store.record_snapshot(0.0, 60.0, "ok", now=NOW)
    assert store.prune(30 * DAY, now=NOW)["snapshots"] == 1
    assert store.snapshot(kept) is not None and store.snapshot(simulated) is not None


@pytest.mark.parametrize("older_than", [0.0, MIN_RETENTION_S - 1, float("nan"), -DAY])
def test_prune_refuses_less_than_a_day_of_history(tmp_path, older_than):
    with KnowledgeStore(f"sqlite:///{tmp_path}/k.db") as s:
        _iteration(s, NOW - 1, "young")
        with pytest.raises(ValueError, match="at least 86400 s"):
            s.prune(older_than, now=NOW)
        assert s.counts()["decisions"] == 1


def test_cli_prune_and_stats(tmp_path):
    url = f"sqlite:///{tmp_path}/k.db"
    with KnowledgeStore(url) as s:  # history written 40 days before the clock the CLI reads
        _iteration(s, time.time() - 40 * DAY, "old")
        _iteration(s, time.time() - 60, "new")
    run = CliRunner().invoke
    res = run(cli, ["knowledge", "stats", "--url", url])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["decisions"] == 2
    res = run(cli, ["knowledge", "prune", "--url", url, "--older-than-days", "30"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output) == {"actions": 1, "decisions": 1, "observations": 1, "snapshots": 1}
    assert json.loads(run(cli, ["knowledge", "stats", "--url", url]).output)["decisions"] == 1


@pytest.mark.parametrize("args, message", [
    (["--older-than-days", "0.5"], "at least 1"),
    (["--older-than-days", "nan"], "at least 1"),
    ([], "required"),
])
def test_cli_prune_refuses_bad_retention(tmp_path, args, message):
    url = f"sqlite:///{tmp_path}/k.db"
    KnowledgeStore(url).close()
    res = CliRunner().invoke(cli, ["knowledge", "prune", "--url", url, *args])
    assert res.exit_code == 2 and message in res.output


def test_cli_names_a_missing_store_and_creates_nothing(tmp_path):
    res = CliRunner().invoke(cli, ["knowledge", "stats", "--url", f"sqlite:///{tmp_path}/none.db"])
    assert res.exit_code == 2 and "no knowledge store at" in res.output
    assert not (tmp_path / "none.db").exists()


def test_cli_takes_retention_from_the_config(tmp_path):
    url = f"sqlite:///{tmp_path}/k.db"
    with KnowledgeStore(url) as s:
        _iteration(s, time.time() - 3 * DAY, "old")
    env = {"SAMM_KNOWLEDGE__URL": url, "SAMM_KNOWLEDGE__RETENTION_DAYS": "2"}
    res = CliRunner().invoke(cli, ["knowledge", "prune", "--config", str(EXAMPLE)], env=env)
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["decisions"] == 1


def test_retention_below_a_day_is_refused_at_load():
    with pytest.raises(ConfigError, match="retention_days"):
        load_config(EXAMPLE, environ={"SAMM_KNOWLEDGE__RETENTION_DAYS": "0.5"})


def test_the_daemon_prunes_at_start_when_the_config_keeps_n_days(tmp_path):
    from samm.config import SammConfig
    from samm.daemon.build import build_daemon
    from samm.daemon.runner import DaemonRunner
    from tests.test_leadership import GROUPS

    url = f"sqlite:///{tmp_path}/k.db"
    with KnowledgeStore(url) as s:
        _iteration(s, time.time() - 10 * DAY, "ten-days-ago")
        _iteration(s, time.time() - 3600, "an-hour-ago")

    def run(retention):
        cfg = SammConfig.model_validate({
            "groups": GROUPS, "agent": {"name": "static:2,1,1"}, "executor": {"kind": "sim"},
            "timing": {"interval_s": 0.2, "warmup_s": 0, "cooldown_s": 0}, "simulation": {"seed": 1},
            "knowledge": {"url": url, "retention_days": retention}})
        assert DaemonRunner(build_daemon(cfg), max_iterations=3).run(install_signals=False) == 0
        with KnowledgeStore(url) as s:
            return s.decision("ten-days-ago"), s.decision("an-hour-ago")

    old, recent = run(None)  # unset: everything kept, as before
    assert old is not None and recent is not None
    old, recent = run(7)
    assert old is None and recent is not None


def test_cli_decisions_show_the_newest_with_what_became_of_them(tmp_path):
    url = f"sqlite:///{tmp_path}/k.db"
    now = time.time()
    with KnowledgeStore(url) as s:
        _iteration(s, now - 7200, "two-hours-ago")
        _iteration(s, now - 120, "two-minutes-ago", status="blocked")
        _iteration(s, now - 60, "a-minute-ago")
        dec, _ = s.record_decision("fallback", agent="a", action=None, source="fallback",
                                   reason="service http://x unreachable:\nTimeout", now=now - 30)
    run = CliRunner().invoke
    res = run(cli, ["knowledge", "decisions", "--url", url, "--limit", "2"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert len(lines) == 2 and " fallback " in lines[0] and "[service http://x unreachable: Timeout]" in lines[0]
    assert "no action" in lines[0] and " a-minute-ago " in lines[1] and "S succeeded" in lines[1]
    res = run(cli, ["knowledge", "decisions", "--url", url, "--json"])  # the last hour: three
    rows = [json.loads(line) for line in res.output.splitlines()]
    assert [r["iteration_key"] for r in rows] == ["fallback", "a-minute-ago", "two-minutes-ago"]
    assert rows[2]["actions"][0]["status"] == "blocked"
    res = run(cli, ["knowledge", "decisions", "--url", url, "--loop", "other"])
    assert res.exit_code == 0 and "no decisions in the last 60 minutes for loop 'other'" in res.output


@pytest.mark.parametrize("args", [["--since-minutes", "0"], ["--since-minutes", "nan"], ["--limit", "0"]])
def test_cli_decisions_refuse_bad_windows(tmp_path, args):
    url = f"sqlite:///{tmp_path}/k.db"
    KnowledgeStore(url).close()
    res = CliRunner().invoke(cli, ["knowledge", "decisions", "--url", url, *args])
    assert res.exit_code == 2 and "must be" in res.output


def test_cli_cooldowns_show_what_a_restart_honours(tmp_path):
    url = f"sqlite:///{tmp_path}/k.db"
    now = time.time()
    with KnowledgeStore(url) as s:
        _iteration(s, now - 10, "acted", cooldown_until=now + 290)
    res = CliRunner().invoke(cli, ["knowledge", "cooldowns", "--url", url])
    assert res.exit_code == 0, res.output
    assert res.output.startswith("S  until ") and " s left" in res.output and "acted:S" in res.output
    left = int(res.output.split(" s left")[0].split()[-1])
    assert 280 <= left <= 290
    res = CliRunner().invoke(cli, ["knowledge", "cooldowns", "--url", url, "--loop", "none"])
    assert "no cool-downs recorded for loop 'none'" in res.output


def test_cli_needs_exactly_one_source(tmp_path):
    res = CliRunner().invoke(cli, ["knowledge", "stats"])
    assert res.exit_code == 2 and "exactly one of --config and --url" in res.output
