"""Audit of the deployment artefacts and the daemon config: values `samm config check` passed and
`samm run` then died on (or ran blind with), YAML that silently lost or multiplied values, and a
Grafana dashboard that showed nothing for a loop other than `default`."""
from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from samm.config import MAX_PERIOD_S, ConfigError, load_config

ROOT = Path(__file__).resolve().parents[1]
GROUP = "{name: S, cores: 2, ram_gb: 8, price_per_hour: 0.2, min: 1, max: 10}"
SIM = f"groups: [{GROUP}]\nexecutor: {{kind: sim}}\n"


def _write(tmp_path, text: str) -> Path:
    p = tmp_path / "samm.yaml"
    p.write_text(text)
    return p


def _error(tmp_path, text: str) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, text), environ={})
    return str(err.value)


# -- YAML that said two things, or billions ------------------------------------------------------

@pytest.mark.parametrize("text, line, first, key", [
    (f"groups: [{GROUP}]\ntiming: {{interval_s: 10}}\ntiming: {{interval_s: 600}}\n", 3, 2, "timing"),
    (f"groups: [{GROUP}]\ntiming:\n  cooldown_s: 0\n  cooldown_s: 300\n", 4, 3, "cooldown_s"),
    ("groups:\n  - {name: S, cores: 2, ram_gb: 8, price_per_hour: 0.2, min: 1, max: 10, max: 3}\n", 2, 2, "max"),
    ("loops:\n  - name: a\n    groups: [" + GROUP + "]\n    executor: {kind: sim, dry_run: true}\n"
     "    executor: {kind: sim}\n", 5, 4, "executor"),
])
def test_a_key_given_twice_is_refused_naming_its_lines(tmp_path, text, line, first, key):
    """YAML keeps the last of two equal keys: a second `timing:` section replaced the first one
    whole, and `dry_run: true` could vanish behind a later `executor:` without a word."""
    msg = _error(tmp_path, text)
    assert msg == f"{tmp_path / 'samm.yaml'}:{line}: duplicate key {key!r} (first on line {first}): YAML would keep only the last one"
    res = CliRunner().invoke(_cli(), ["config", "check", str(tmp_path / "samm.yaml")])
    assert res.exit_code == 2 and "duplicate key" in res.output


def test_merge_keys_may_still_be_overridden(tmp_path):
    text = ("x-group: &g {cores: 2, ram_gb: 8, price_per_hour: 0.2, min: 1, max: 10}\n"
            "groups:\n  - <<: *g\n    name: S\n    max: 4\n")
    with pytest.raises(ConfigError, match="unknown key 'x-group'"):  # the anchor's own key, not a duplicate
        load_config(_write(tmp_path, text), environ={})
    cfg = load_config(_write(tmp_path, "groups:\n  - <<: {name: S, cores: 2, ram_gb: 8, price_per_hour: 0.2, "
                                       "min: 1, max: 10}\n    max: 4\n"), environ={})
    assert cfg.groups[0].max == 4


def _laughs(depth: int) -> str:
    rows = ['    a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefghij"[:depth - 1], "bcdefghijk"[:depth - 1]):
        rows.append(f"    {name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    return f"groups: [{GROUP}]\nagent:\n  name: noop\n  params:\n" + "\n".join(rows) + "\n"


def test_aliases_that_expand_to_billions_of_values_under_a_valid_key_are_refused(tmp_path):
    """Under `agent.params` (any mapping) the 1-KB "billion laughs" validated, and `samm config
    check` then wrote it out in JSON until memory ran out (a 4-GB allocation abort)."""
    msg = _error(tmp_path, _laughs(9))
    assert "once its YAML aliases (*name) are expanded" in msg and "\n" not in msg
    res = CliRunner().invoke(_cli(), ["config", "check", str(tmp_path / "samm.yaml")])
    assert res.exit_code == 2 and "expanded" in res.output
    assert load_config(_write(tmp_path, _laughs(3)), environ={}).agent.params["c"][0][0] == ["lol"] * 9


@pytest.mark.parametrize("params", ["{a: &a [1, *a]}", "&p {a: *p}"])
def test_an_alias_inside_its_own_value_is_refused(tmp_path, params):
    """A recursive alias validated, and `samm config check` died in pydantic's JSON dump
    ("Circular reference detected") with a traceback."""
    msg = _error(tmp_path, f"groups: [{GROUP}]\nagent:\n  name: noop\n  params: {params}\n")
    assert "refers to a value that contains it" in msg


def test_an_environment_value_is_bounded_the_same_way(tmp_path):
    env = {"SAMM_AGENT__PARAMS": "{a: &a [1, *a]}"}
    with pytest.raises(ConfigError, match="contains it"):
        load_config(_write(tmp_path, f"groups: [{GROUP}]\n"), environ=env)


# -- values that passed the check and then crashed or blinded `samm run` ------------------------

def test_a_lease_ttl_beyond_a_threads_wait_is_refused(tmp_path):
    """ha.lease_ttl_s is used by every daemon (its single-daemon lease too); 1e12 passed the
    check, and `samm run` printed an OverflowError traceback from the lease keeper's wait."""
    msg = _error(tmp_path, f"{SIM}ha: {{lease_ttl_s: 1.0e+12}}\n")
    assert "ha.lease_ttl_s: Input should be less than or equal to" in msg
    assert MAX_PERIOD_S / 3 < threading.TIMEOUT_MAX
    assert load_config(_write(tmp_path, f"{SIM}ha: {{lease_ttl_s: {MAX_PERIOD_S}}}\n"), environ={}).ha.lease_ttl_s == MAX_PERIOD_S


def test_a_render_timeout_a_socket_cannot_take_is_refused(tmp_path):
    """graphite.timeout_s: 1e10 passed; every render then raised OverflowError before connecting,
    which the monitor logged as a stale snapshot: a daemon that ran and never saw a metric."""
    with socket.socket() as s:
        with pytest.raises(OverflowError):
            s.settimeout(1e10)
        s.settimeout(MAX_PERIOD_S)  # the bound is one a socket holds
    msg = _error(tmp_path, f"groups: [{GROUP}]\ngraphite: {{timeout_s: 1.0e+10}}\n")
    assert "graphite.timeout_s: Input should be less than or equal to" in msg


@pytest.mark.parametrize("field, value", [("cores", 10**20), ("max", 10**20), ("cores", 2**20 + 1), ("max", 2**31)])
def test_group_sizes_beyond_what_the_fleet_arrays_hold_are_refused(tmp_path, field, value):
    """cores or max of 1e20 passed the check and `samm run` stopped with "OverflowError: Python
    int too large to convert to C long" building the fleet (any executor)."""
    group = GROUP.replace(f"{field}: {2 if field == 'cores' else 10}", f"{field}: {value}")
    msg = _error(tmp_path, f"groups: [{group}]\nexecutor: {{kind: aws-asg}}\n")
    assert f"groups.0.{field}: Input should be less than or equal to" in msg


def test_the_largest_groups_still_give_a_positive_fleet_capacity(tmp_path):
    from samm.analyze import FleetSpec

    groups = ", ".join(f"{{name: G{i}, cores: {2**20}, ram_gb: 8, price_per_hour: 0.2, min: 0, max: {2**31 - 1}, "
                       f"asg_name: a{i}}}" for i in range(3))
    cfg = load_config(_write(tmp_path, f"groups: [{groups}]\nexecutor: {{kind: aws-asg}}\n"), environ={})
    assert FleetSpec.from_vm_types(cfg.groups).max_fleet_cores == 3 * 2**20 * (2**31 - 1)


@pytest.mark.parametrize("simulation, message", [
    ("{initial: {X: 3}}", "simulation.initial names no group: ['X'] (groups: ['S'])"),
    ("{initial: {S: -3}}", "simulation.initial.S: -3 is outside the group's min..max (1..10)"),
    ("{initial: {S: 100000000000000000000}}", "simulation.initial.S: 100000000000000000000 is outside"),
    ("{seed: 100000000000000000000}", "simulation.seed: Input should be less than or equal to"),
    ("{seed: -1}", "simulation.seed: Input should be greater than or equal to 0"),
    ("{host_mips: 0.5}", "the simulator (executor sim) would refuse this config: host_mips must be >= 1"),
])
def test_a_simulation_section_the_simulator_refuses_is_a_config_error(tmp_path, simulation, message):
    """Each passed `samm config check`; `samm run` then stopped with a pydantic or simulator
    traceback (initial out of range), ran every iteration stale (a seed beyond int64), or started
    the misspelt group at the default count without a word."""
    assert message in _error(tmp_path, f"{SIM}simulation: {simulation}\n")


@pytest.mark.parametrize("group, message", [
    ("{name: S, cores: 2, ram_gb: 8, price_per_hour: 0.2, min: 1, max: 100001}", "the sum of max (VM slots)"),
    ("{name: S, cores: 1048576, ram_gb: 8, price_per_hour: 0.2, min: 1, max: 10}", "simulated PEs"),
])
def test_groups_beyond_the_simulators_limits_are_a_config_error(tmp_path, group, message):
    for text in (f"groups: [{group}]\nexecutor: {{kind: sim}}\n",
                 f"loops:\n  - name: a\n    groups: [{group}]\n    executor: {{kind: sim}}\n"):
        msg = _error(tmp_path, text)
        assert "would refuse this config" in msg and message in msg
    # the same groups on AWS are not the simulator's business
    load_config(_write(tmp_path, f"groups: [{group[:-1]}, asg_name: a}}]\nexecutor: {{kind: aws-asg}}\n"), environ={})


def test_the_shipped_daemon_configs_still_pass_the_check():
    for name in ("samm.example.yaml", "deferrable-jobs.yaml", "microservices.yaml"):
        res = CliRunner().invoke(_cli(), ["config", "check", str(ROOT / "deploy" / "configs" / name)])
        assert res.exit_code == 0, (name, res.output)


def _cli():
    from samm.cli.main import cli

    return cli


# -- the Grafana dashboard shows every loop -------------------------------------------------------

def _publish_one_iteration(graphite, prefix: str, loop: str, ts: float) -> None:
    """One iteration published as the daemon does: GraphitePublisher under the prefix that
    samm/daemon/build.py gives the loop."""
    from samm.daemon.loop import IterationReport
    from samm.daemon.publish import GraphitePublisher
    from samm.monitor.graphite_client import GraphiteSender
    from samm.plan.client import PlanOutcome

    rep = IterationReport(key=f"k{ts}", window_start=ts - 60, window_end=ts, status="ok", reasons=[],
                          features={"cpu_mean": 0.5, "allocated_cores_ratio": 0.7},
                          plan=PlanOutcome(deltas={"S": 1}, action=1, action_name="S+1", latency_ms=3.0),
                          actions=[{"group": "S", "status": "succeeded", "from": 1, "target": 2}],
                          inventory={"S": {"desired": 2, "live": 1}}, iteration_ms=12.0, loop=loop,
                          stage_ms={"monitor": 1.0, "analyze": 1.0, "plan": 3.0, "execute": 5.0})
    sender = GraphiteSender(graphite.carbon_host, graphite.carbon_port)
    try:
        daemon_prefix = prefix if loop == "default" else f"{prefix}.loops.{loop}"
        GraphitePublisher(sender, None, daemon_prefix).publish(rep)
    finally:
        sender.close()


@pytest.mark.graphite
def test_every_daemon_panel_shows_a_loop_other_than_default(graphite, graphite_prefix):
    """A loop other than `default` publishes under <prefix>.loops.<loop>.daemon, while the
    collectors and the queue stay under <prefix>: no value of the dashboard's one variable made
    both show (prefix=samm: the daemon panels were empty; prefix=samm.loops.web: the instance and
    queue panels were). Every daemon panel now shows both loops, the other one marked [web]."""
    from samm.monitor.graphite_client import RenderClient

    dash = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / "samm.json").read_text())
    daemon_targets = [(p["title"], t["target"].replace("$prefix", graphite_prefix))
                      for p in dash["panels"] for t in p["targets"] if "$prefix.daemon." in t["target"]]
    assert len(daemon_targets) >= 8
    now = int(time.time())
    for ts in (now - 120, now - 60):
        _publish_one_iteration(graphite, graphite_prefix, "default", ts)
        _publish_one_iteration(graphite, graphite_prefix, "web", ts)
    render = RenderClient(graphite.render_url)
    todo, labels = list(daemon_targets), {}
    deadline = time.monotonic() + 30
    while todo and time.monotonic() < deadline:
        for title, target in list(todo):
            names = [s.target for s in render.render(target, now - 600, now + 1) if s.values()]
            if any(n.endswith(" [web]") for n in names) and any(not n.endswith("]") for n in names):
                labels.setdefault(title, set()).update(names)
                todo.remove((title, target))
        if todo:
            time.sleep(0.3)  # new whisper files take about a second to appear
    assert not todo, f"daemon panels without both loops: {todo}"
    assert {"S.live", "S.live [web]", "S.desired [web]"} <= labels["VMs per group vs waiting jobs"]
    assert {"iteration", "iteration [web]", "plan [web]", "decision (Plan) [web]"} <= labels["Iteration and decision latency"]
    assert {"S.succeeded", "S.succeeded [web]"} <= labels["Action outcomes"]


# -- an override's mistake is the override's ------------------------------------------------------

EXAMPLE = ROOT / "deploy" / "configs" / "samm.example.yaml"


@pytest.mark.parametrize("name, value, message", [
    ("SAMM_TIMING__INTERVAL_S", "abc", "SAMM_TIMING__INTERVAL_S (environment): timing.interval_s: Input should be a valid number"),
    ("SAMM_TIMING__INTERVAL_S", "", "SAMM_TIMING__INTERVAL_S (environment): timing.interval_s: Input should be a valid number"),
    ("SAMM_TIMING__INTERVALS", "5", "SAMM_TIMING__INTERVALS (environment): unknown key 'timing.intervals'"),
    ("SAMM_HA__LEASE_TTL_S", "1.0e+12", "SAMM_HA__LEASE_TTL_S (environment): ha.lease_ttl_s: Input should be less"),
])
def test_a_bad_environment_override_is_named_not_the_files_line(name, value, message):
    """The error named the file's line of the key (`timing.interval_s: 60`, a good value) or of
    its section (for a key the file does not have), never the variable that set the bad value."""
    with pytest.raises(ConfigError) as err:
        load_config(EXAMPLE, environ={name: value})
    assert str(err.value) == message or str(err.value).startswith(message), str(err.value)
    assert "samm.example.yaml" not in str(err.value)


def test_the_files_own_mistakes_keep_their_lines_beside_an_override(tmp_path):
    text = EXAMPLE.read_text().replace("  cooldown_s: 300 ", "  cooldown_s: -1 ")
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, text), environ={"SAMM_TIMING__INTERVAL_S": "abc"})
    line = next(i for i, row in enumerate(text.splitlines(), 1) if row.startswith("  cooldown_s: -1"))
    assert f"{tmp_path / 'samm.yaml'}:{line}: timing.cooldown_s" in str(err.value)
    assert "SAMM_TIMING__INTERVAL_S (environment): timing.interval_s" in str(err.value)
