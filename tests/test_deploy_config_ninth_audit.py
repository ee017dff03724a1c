"""Ninth audit of what an operator installs: the systemd README's instructions against what the
units and the daemon do (a microservice loop blind under the shipped hardening, the upload token
written where no command reads it, a watchdog rule the daemon no longer follows), and overrides
from the environment whose mistakes were blamed on the config file."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from samm.config import ConfigError, load_config
from test_systemd_unit import RUNNER_UNIT

ROOT = Path(__file__).resolve().parents[1]
SYSTEMD = ROOT / "deploy" / "systemd"
README = SYSTEMD / "README.md"
CONFIGS = ROOT / "deploy" / "configs"
PROD_BINARY = "/opt/samm/venv/bin/samm"


def unit_setting(unit: str, key: str) -> list[str]:
    return [line.partition("=")[2].strip() for line in (SYSTEMD / unit).read_text().splitlines()
            if line.startswith(f"{key}=")]


def readme_ini_blocks() -> list[str]:
    return re.findall(r"```ini\n(.*?)```", README.read_text(), re.S)


def microservice_drop_in() -> str:
    """The drop-in the README gives for a `problem: microservice-cores` loop under samm.service."""
    blocks = [b for b in readme_ini_blocks() if "microservice-cores" in b]
    assert len(blocks) == 1, "deploy/systemd/README.md gives no drop-in for a microservice-cores loop"
    return blocks[0]


# -- a microservice-cores loop under samm.service -------------------------------------------------

def test_the_microservice_drop_in_shows_the_loop_the_containers_processes():
    """The loop finds each container's cgroup through /proc/<pid>/cgroup (samm/monitor/cgroups.py),
    which the unit's ProtectProc=invisible hides: every service read 0 cores used, every second,
    with no error, and the controller took every limit to its floor. The README and the example
    config now give the drop-in that lets it see them (and reach the engine)."""
    assert unit_setting("samm.service", "ProtectProc") == ["invisible"]  # the hardening stays as scored
    drop_in = microservice_drop_in()
    assert "ProtectProc=default" in drop_in and "SupplementaryGroups=docker" in drop_in
    assert "ProtectProc=default" in (CONFIGS / "microservices.yaml").read_text()
    from samm.monitor.cgroups import CgroupReader
    assert "/proc" in str(CgroupReader().proc)  # the reader's way to a container, as the README says


STANDIN = r'''
"""Stand-in for a microservice loop's measurement under the unit: the real cgroup reader on a
root-owned process (a container's, as dockerd starts them)."""
import os, sys
sys.path.insert(0, "/opt/samm-test")
import sdnotify
from cgroups import CgroupReader

pid = int(open("/run/samm-test/pid").read())
try:
    reader = CgroupReader()
    counters = reader.read(reader.paths(pid))
    result = f"measured cpu_s={counters['cpu_s']}"
except Exception as exc:
    result = f"failed {type(exc).__name__}: {exc}"
with open(os.path.join(os.environ["STATE_DIRECTORY"], "marker"), "w") as f:
    f.write(f"uid={os.getuid()} {result}\n")
sdnotify.ready()
'''

RUNNER = r'''#!/bin/sh
out=/out/result.txt
getent group docker >/dev/null || groupadd --system docker
systemctl start victim.service
mkdir -p /run/samm-test
systemctl show victim.service -p MainPID --value > /run/samm-test/pid
chmod 644 /run/samm-test/pid
for unit in samm samm-ms; do
  systemctl start $unit.service; echo "$unit.start_rc=$?" >> $out
  sed "s/^/$unit.marker=/" /var/lib/samm/marker >> $out
  rm -f /var/lib/samm/marker
done
echo done >> $out
'''

def boot_runner(nspawn: str, units: Path, opt: Path, out: Path) -> tuple[str, dict[str, str]]:
    """Boot systemd in a volatile nspawn container of this host with `units` in /etc/systemd/system
    and `opt` at /opt/samm-test, run runner.service; its report and its KEY=VALUE lines."""
    (units / "runner.service").write_text(RUNNER_UNIT)
    binds = [f"--bind-ro={units / n}:/etc/systemd/system/{n}" for n in sorted(os.listdir(units))]
    cmd = [nspawn, "-q", "-D", "/", "--volatile=yes", "--register=no", "--keep-unit",
           f"--bind-ro={opt}:/opt/samm-test", f"--bind={out}:/out", *binds,
           "-b", "systemd.firstboot=off", "systemd.unit=runner.service"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    result = out / "result.txt"
    report = result.read_text() if result.exists() else ""
    assert "done" in report.splitlines(), f"nspawn rc={proc.returncode}\n{report}\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}"
    return report, dict(line.split("=", 1) for line in report.splitlines() if "=" in line)


@pytest.mark.slow
def test_the_shipped_unit_hides_the_containers_and_the_drop_in_lets_the_loop_measure_them(tmp_path):
    """Boots systemd in a volatile systemd-nspawn container: the shipped samm.service (ExecStart
    swapped for a stand-in that runs the real CgroupReader) cannot read the cgroup of a root
    process; the same unit with the README's drop-in reads its counters."""
    from samm.daemon import sdnotify
    from samm.monitor import cgroups

    nspawn = shutil.which("systemd-nspawn")
    if os.geteuid() != 0 or nspawn is None or not Path("/lib/systemd/systemd").exists():
        pytest.skip("needs root, systemd and systemd-nspawn (apt-get install systemd-container)")
    opt, units, out = tmp_path / "opt", tmp_path / "units", tmp_path / "out"
    for d in (opt, units / "samm-ms.service.d", out):
        d.mkdir(parents=True)
    opt.chmod(0o755)  # the DynamicUser must read the stand-in
    shutil.copy(Path(sdnotify.__file__), opt / "sdnotify.py")
    shutil.copy(Path(cgroups.__file__), opt / "cgroups.py")
    (opt / "standin.py").write_text(STANDIN)
    (opt / "runner.sh").write_text(RUNNER)
    for f in opt.iterdir():
        f.chmod(0o644)
    unit = (SYSTEMD / "samm.service").read_text()
    assert PROD_BINARY in unit
    unit = unit.replace(f"{PROD_BINARY} run --config /etc/samm/samm.yaml", "/usr/bin/python3 /opt/samm-test/standin.py")
    for name in ("samm.service", "samm-ms.service"):
        (units / name).write_text(unit)
    (units / "samm-ms.service.d" / "microservices.conf").write_text(microservice_drop_in())
    (units / "victim.service").write_text("[Service]\nExecStart=/bin/sleep 600\n")
    report, r = boot_runner(nspawn, units, opt, out)
    assert r["samm.start_rc"] == "0" and r["samm-ms.start_rc"] == "0", report
    assert "failed FileNotFoundError" in r["samm.marker"] and "/cgroup" in r["samm.marker"], report
    assert "measured cpu_s=" in r["samm-ms.marker"], report
    assert not r["samm-ms.marker"].startswith("uid=0 "), report  # still the dynamic user


# -- a deferrable-jobs loop's queue under samm.service -------------------------------------------

def deferrable_drop_in() -> str:
    blocks = [b for b in readme_ini_blocks() if "deferrable-jobs" in b]
    assert len(blocks) == 1, "deploy/systemd/README.md gives no drop-in for a deferrable-jobs loop"
    return blocks[0]


def drop_in_settings(drop_in: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in drop_in.splitlines() if "=" in line and not line.startswith("#"))


def deferrable_setup() -> list[str]:
    """The README's shell lines that make the shared queue folder and file (run as root, once)."""
    blocks = [b for b in re.findall(r"```sh\n(.*?)```", README.read_text(), re.S) if "samm-jobs" in b]
    assert len(blocks) == 1, "deploy/systemd/README.md does not say how to make the shared queue folder"
    return [re.sub(r"\s+#.*$", "", line) for line in blocks[0].splitlines() if line.strip()]


def test_the_deferrable_example_keeps_its_queue_where_the_workers_reach_it():
    """The example kept the queue in /var/lib/samm: under DynamicUser that is /var/lib/private/samm
    (0700), so every worker leasing from it got "Permission denied". The queue is now in the
    folder the README's drop-in opens to the daemon (ReadWritePaths=) and shares by group."""
    import yaml

    [loop] = yaml.safe_load((CONFIGS / "deferrable-jobs.yaml").read_text())["loops"]
    queue = Path(loop["queue"]["path"])
    [state] = unit_setting("samm.service", "StateDirectory")
    assert Path("/var/lib", state) not in queue.parents, queue
    settings = drop_in_settings(deferrable_drop_in())
    assert Path(settings["ReadWritePaths"]) in queue.parents
    group = settings["SupplementaryGroups"]
    assert group != "samm"  # a static group named like the unit clashes with its dynamic user
    setup = "\n".join(deferrable_setup())
    assert f"-g {group} {queue.parent}" in setup and f"-m 0660 -g {group} /dev/null {queue}" in setup


QUEUE_USER = r'''
"""Opens the job queue at argv[1] with the real JobQueue and submits a job (argv[2]: daemon or
worker). The daemon's side keeps it open, as the loop does, until SIGTERM."""
import os, signal, sys, time
sys.path.insert(0, "/opt/samm-test")
import sdnotify

path, who = sys.argv[1], sys.argv[2]
q = None
try:
    from samm_testbed.jobqueue import JobQueue
    q = JobQueue(path, busy_timeout_s=5)
    q.submit(1 if who == "daemon" else 2, 1, 1.0, time.time())
    result = f"wrote ({len(q.stats())} jobs)"
except Exception as exc:
    result = f"failed {type(exc).__name__}: {exc}"
with open(f"/run/samm-out/{who}", "w") as f:
    f.write(f"uid={os.getuid()} {result}\n")
sdnotify.ready()
if who == "daemon" and q is not None:
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.pause()
if q is not None:
    q.close()
'''

QUEUE_RUNNER = r"""#!/bin/sh
out=/out/result.txt
mkdir -p /run/samm-out && chmod 1777 /run/samm-out
. /opt/samm-test/setup.sh
for unit in samm samm-batch; do
  systemctl start $unit.service; echo "$unit.start_rc=$?" >> $out
  sed "s/^/$unit.daemon=/" /run/samm-out/daemon >> $out
  systemctl start worker-$unit.service; echo "$unit.worker_rc=$?" >> $out
  sed "s/^/$unit.worker=/" /run/samm-out/worker >> $out
  systemctl stop $unit.service
  rm -f /run/samm-out/*
done
echo done >> $out
"""


@pytest.mark.slow
def test_a_worker_reaches_the_queue_only_with_the_documented_drop_in(tmp_path):
    """Boots systemd in a volatile systemd-nspawn container, runs the README's set-up, and starts
    samm.service (ExecStart swapped for a stand-in opening the real JobQueue and holding it open)
    twice: as shipped with the old /var/lib/samm queue, where a worker of the shared group is
    refused, and with the README's drop-in and the example's path, where it submits beside the
    daemon."""
    import yaml

    from samm.daemon import sdnotify
    from samm.testbed import jobqueue, options

    nspawn = shutil.which("systemd-nspawn")
    if os.geteuid() != 0 or nspawn is None or not Path("/lib/systemd/systemd").exists():
        pytest.skip("needs root, systemd and systemd-nspawn (apt-get install systemd-container)")
    opt, units, out = tmp_path / "opt", tmp_path / "units", tmp_path / "out"
    for d in (opt / "samm_testbed", units / "samm-batch.service.d", out):
        d.mkdir(parents=True)
    for d in (opt, opt / "samm_testbed"):
        d.chmod(0o755)  # the DynamicUser must read the stand-in
    shutil.copy(Path(sdnotify.__file__), opt / "sdnotify.py")
    for mod in (jobqueue, options):
        shutil.copy(Path(mod.__file__), opt / "samm_testbed" / Path(mod.__file__).name)
    (opt / "samm_testbed" / "__init__.py").write_text("")
    (opt / "queue_user.py").write_text(QUEUE_USER)
    (opt / "setup.sh").write_text("set -e\n" + "\n".join(deferrable_setup()) + "\nset +e\n")
    (opt / "runner.sh").write_text(QUEUE_RUNNER)
    for f in [*opt.iterdir(), *(opt / "samm_testbed").iterdir()]:
        if f.is_file():
            f.chmod(0o644)
    [loop] = yaml.safe_load((CONFIGS / "deferrable-jobs.yaml").read_text())["loops"]
    drop_in = deferrable_drop_in()
    group = drop_in_settings(drop_in)["SupplementaryGroups"]
    shipped = (SYSTEMD / "samm.service").read_text()
    assert PROD_BINARY in shipped
    for unit, queue in (("samm", "/var/lib/samm/jobs.sqlite"), ("samm-batch", loop["queue"]["path"])):
        (units / f"{unit}.service").write_text(shipped.replace(
            f"{PROD_BINARY} run --config /etc/samm/samm.yaml", f"/usr/bin/python3 /opt/samm-test/queue_user.py {queue} daemon"))
        (units / f"worker-{unit}.service").write_text(  # a worker: another user, in the shared group
            f"[Service]\nType=oneshot\nUser=nobody\nSupplementaryGroups={group}\n"
            f"ExecStart=/usr/bin/python3 /opt/samm-test/queue_user.py {queue} worker\n")
    (units / "samm-batch.service.d" / "deferrable.conf").write_text(drop_in)
    report, r = boot_runner(nspawn, units, opt, out)
    assert r["samm.start_rc"] == "0" and "wrote (1 jobs)" in r["samm.daemon"], report
    assert "failed PermissionError" in r["samm.worker"], report
    assert r["samm-batch.start_rc"] == "0" and "wrote (1 jobs)" in r["samm-batch.daemon"], report
    assert "wrote (2 jobs)" in r["samm-batch.worker"] and r["samm-batch.worker"].startswith("uid=65534 "), report


# -- the upload token -----------------------------------------------------------------------------

def test_the_install_steps_put_the_upload_token_where_samm_serve_reads_it():
    """The install steps wrote SAMM_SERVICE__TOKEN into /etc/samm/samm.env, which only samm.service
    reads (and `samm run` uses no token), and left samm-serve's file empty: uploads stayed
    disabled for an operator who did as told."""
    install = re.search(r"## Install\n+```sh\n(.*?)```", README.read_text(), re.S).group(1)
    targets = re.findall(r"SAMM_SERVICE__TOKEN=\S*'?\s*>>\s*(\S+)", install)
    [serve_env] = unit_setting("samm-serve.service", "EnvironmentFile")
    [run_env] = unit_setting("samm.service", "EnvironmentFile")
    assert targets == [serve_env.lstrip("-")], targets
    assert run_env.lstrip("-") not in targets
    serve = unit_setting("samm-serve.service", "ExecStart")[0]
    assert "--token-env SAMM_SERVICE__TOKEN" in serve
    assert "SAMM_SERVICE__TOKEN" not in " ".join(line for line in (SYSTEMD / "samm.service").read_text().splitlines()
                                                 if line.startswith("#") and "Secrets" in line)


# -- the watchdog ---------------------------------------------------------------------------------

def test_the_watchdog_rule_the_docs_give_is_the_daemons():
    """The README and the unit said WATCHDOG=1 is sent only after an iteration completes, so
    WatchdogSec must exceed the interval (a drop-in of 900 s for a 300-s interval): the daemon's
    watchdog thread pings while each loop progressed within 2 intervals + 30 s, so a 900-s slot
    (deploy/configs/deferrable-jobs.yaml) runs under the shipped 180 s, and a hung loop is
    caught by that rule, not by WatchdogSec."""
    from samm.daemon.runner import DaemonRunner, _stuck_after

    text = README.read_text()
    assert "2 × timing.interval_s + 30" in text and "WatchdogSec=900" not in text
    assert "must exceed" not in text and "must exceed" not in (SYSTEMD / "samm.service").read_text()
    assert _stuck_after(60.0) == 150.0 and _stuck_after(900.0) == 2 * 900.0 + 30
    slot = SimpleNamespace(name="batch", config=SimpleNamespace(timing=SimpleNamespace(interval_s=900.0)))
    runner = SimpleNamespace(_starting=False, finished=set(), loops=[slot])
    watchdog_s = int(unit_setting("samm.service", "WatchdogSec")[0])
    slot.last_progress = time.monotonic() - 4 * watchdog_s  # mid-slot, four WatchdogSec after the last one
    assert DaemonRunner._stuck(runner) == []
    slot.last_progress = time.monotonic() - _stuck_after(900.0) - 1
    assert [name for name, _ in DaemonRunner._stuck(runner)] == ["loop batch"]


# -- overrides from the environment ---------------------------------------------------------------

EXAMPLE = CONFIGS / "samm.example.yaml"
MICRO = CONFIGS / "microservices.yaml"


def _error(path: Path, env: dict[str, str]) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(path, environ=env)
    return str(err.value)


def test_an_override_into_a_list_names_the_list():
    """SAMM_LOOPS__0__EXECUTOR__DRY_RUN said "loops.0.executor is not a section", a key that is a
    section in the file; what stops it is `loops`, a list."""
    msg = _error(MICRO, {"SAMM_LOOPS__0__EXECUTOR__DRY_RUN": "true"})
    assert msg == "SAMM_LOOPS__0__EXECUTOR__DRY_RUN: loops is a list (an override reaches mapping keys only)"
    msg = _error(EXAMPLE, {"SAMM_KNOWLEDGE__URL__X": "1"})
    assert msg == "SAMM_KNOWLEDGE__URL__X: knowledge.url is not a section"


@pytest.mark.parametrize("path, env, names", [
    # the example config's header suggests SAMM_EXECUTOR__DRY_RUN=true; with a `loops:` file the
    # error blamed the file, which has no top-level executor
    (MICRO, {"SAMM_EXECUTOR__DRY_RUN": "true"}, "SAMM_EXECUTOR__DRY_RUN"),
    (EXAMPLE, {"SAMM_HA__ENABLED": "true", "SAMM_SERVICE__PORT": "9000"}, "SAMM_HA__ENABLED"),
    (EXAMPLE, {"SAMM_HA__ENABLED": "true", "SAMM_KNOWLEDGE__URL": "sqlite:///x.db"},
     "SAMM_HA__ENABLED, SAMM_KNOWLEDGE__URL"),
])
def test_a_rule_across_sections_names_the_overrides_it_is_about(path, env, names):
    msg = _error(path, env)
    assert msg.startswith(f"{path} with {names} (environment): (top level): "), msg
    assert "\n" not in msg


def test_a_rule_broken_by_the_file_alone_still_names_the_file_alone(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(EXAMPLE.read_text().replace("  enabled: false ", "  enabled: true "))
    msg = _error(p, {"SAMM_SERVICE__PORT": "9000"})
    assert msg.startswith(f"{p}: (top level): Value error, ha.enabled needs a PostgreSQL"), msg


# -- addresses no request can use ------------------------------------------------------------------

@pytest.mark.parametrize("url", ["graphite.internal:8080", "127.0.0.1:8080", "htp://graphite", "http://",
                                 "http://[::1", "http://graphite:99999"])
def test_a_render_url_no_request_can_use_is_refused_at_the_check(tmp_path, url):
    """Written like carbon's HOST:PORT (SAMM_GRAPHITE=graphite.internal:2003 in the collector's
    file), `samm config check` passed it; `samm run` then ran with every snapshot stale ("No
    connection adapters were found"), a daemon that never acted."""
    from click.testing import CliRunner

    from samm.cli.main import cli
    from samm.monitor.graphite_client import GraphiteError, RenderClient

    with pytest.raises(GraphiteError):  # what every iteration met
        RenderClient(url, 0.5).render("samm.x", 0, 10)
    p = tmp_path / "c.yaml"
    p.write_text(EXAMPLE.read_text().replace("render_url: http://127.0.0.1:8080", f"render_url: '{url}'"))
    line = next(i for i, row in enumerate(p.read_text().splitlines(), 1) if "render_url" in row)
    assert _error(p, {}) == f"{p}:{line}: graphite.render_url: Value error, must be an http(s)://HOST[:PORT] URL"
    res = CliRunner().invoke(cli, ["config", "check", str(p)])
    assert res.exit_code == 2 and "graphite.render_url" in res.output and "Traceback" not in res.output


@pytest.mark.parametrize("path, env, key", [
    (EXAMPLE, {"SAMM_AGENT__MODE": "http", "SAMM_AGENT__SERVICE_URL": "127.0.0.1:8000"}, "agent.service_url"),
    (CONFIGS / "deferrable-jobs.yaml", {}, "loops.0.agent.service_url"),
])
def test_an_agent_service_url_no_request_can_use_is_refused(tmp_path, path, env, key):
    """The planner fell back to doing nothing on every call (a slot loop: C_t unused, no job started)."""
    if not env:
        p = tmp_path / "d.yaml"
        p.write_text(path.read_text().replace("      mode: in-process ", "      mode: http\n      service_url: "
                                              "'localhost:8000'\n      # "))
        path = p
    msg = _error(path, env)
    assert f"{key}: Value error, must be an http(s)://HOST[:PORT] URL" in msg and "8000" not in msg, msg


def test_every_url_form_the_daemon_takes_still_loads():
    for url in ("http://127.0.0.1:8080", "https://graf:pw@graphite.example/render-root/", "http://[::1]:8080",
                "http://localhost"):
        cfg = load_config(EXAMPLE, environ={"SAMM_GRAPHITE__RENDER_URL": url, "SAMM_AGENT__MODE": "http",
                                            "SAMM_AGENT__SERVICE_URL": url})
        assert cfg.graphite.render_url == url and cfg.agent.service_url == url


@pytest.mark.parametrize("url, message", [
    ("samm.db", "knowledge.url is not a database URL (scheme '(no scheme)')"),
    ("mysql://samm@db/samm", "knowledge.url: unsupported database 'mysql'"),
    ("postgresql://samm:hunter2@db:abc/samm", "its port is not a number"),
    ("postgresql://samm:hun@ter2@db/samm", "an '@' in the user name or password must be written %40"),
])
def test_a_knowledge_url_the_store_refuses_is_refused_at_the_check(tmp_path, url, message):
    """`samm config check` passed each; `samm run` then stopped at start ("cannot start: ..."), after
    the operator had checked the file as the systemd README says."""
    from click.testing import CliRunner

    from samm.cli.main import cli

    p = tmp_path / "c.yaml"
    p.write_text(EXAMPLE.read_text().replace("url: sqlite:////var/lib/samm/samm.db", f"url: '{url}'"))
    msg = _error(p, {})
    assert msg.startswith(f"{p}: (top level): Value error, knowledge.url") and message in msg, msg
    assert "hunter2" not in msg and "ter2" not in msg
    res = CliRunner().invoke(cli, ["config", "check", str(p)])
    assert res.exit_code == 2 and message in res.output and "ter2" not in res.output


def test_every_knowledge_url_the_store_takes_still_loads():
    for url in ("sqlite:///samm.db", "sqlite:////var/lib/samm/samm.db", "sqlite://", "postgres://samm@db/samm",
                "postgresql+psycopg://samm:hun%40ter2@db:5432/samm?sslmode=require"):
        assert load_config(EXAMPLE, environ={"SAMM_KNOWLEDGE__URL": url}).knowledge.url == url


@pytest.mark.parametrize("host", ["graphite.internal:2003", "127.0.0.1:2003", "tcp://graphite", "", "graph ite"])
def test_a_carbon_host_with_a_port_or_a_scheme_is_refused(tmp_path, host):
    """`carbon_host: graphite.internal:2003` (the collector's SAMM_GRAPHITE=HOST:PORT form) passed the
    check; the daemon then dropped every point it published ("carbon graphite.internal:2003:2003
    unreachable"): an empty dashboard, and a deferrable loop's queue metrics lost."""
    from samm.monitor.graphite_client import GraphiteSender

    if host:
        sender = GraphiteSender(host, 2003, timeout_s=0.5)
        sender.send("samm.probe", 1.0, time.time())
        assert sender.flush() == 0 and sender.dropped == 1  # what each iteration met
        sender.close()
    p = tmp_path / "c.yaml"
    p.write_text(EXAMPLE.read_text().replace("carbon_host: 127.0.0.1 ", f"carbon_host: '{host}' "))
    line = next(i for i, row in enumerate(p.read_text().splitlines(), 1) if "carbon_host" in row)
    assert _error(p, {}) == (f"{p}:{line}: graphite.carbon_host: Value error, must be a host name or address alone "
                             "(the port is graphite.carbon_port)")


def test_every_carbon_host_form_the_sender_takes_still_loads():
    for host in ("127.0.0.1", "::1", "graphite.internal", "localhost", "fe80::1%eth0"):
        assert load_config(EXAMPLE, environ={"SAMM_GRAPHITE__CARBON_HOST": host}).graphite.carbon_host == host


# -- what the control host installs ----------------------------------------------------------------

def test_the_control_hosts_install_step_installs_what_the_daemons_agents_import(tmp_path):
    """"pip install /path/to/samm  # add [train] if policies need torch": without torch, `samm run`
    stopped with a ModuleNotFoundError traceback whatever the agent (the registry imports the PPO
    agent with every lookup), and systemd restarted it five times. While that holds, the install
    step must install the `train` extra."""
    import sys

    p = tmp_path / "c.yaml"
    p.write_text(EXAMPLE.read_text().replace("  name: lstm-ppo ", "  name: threshold "))
    code = ("import sys; sys.modules['torch'] = None\n"  # an install without the train extra
            "from samm.config import load_config\nfrom samm.daemon.build import make_daemon_agent\n"
            f"make_daemon_agent(load_config({str(p)!r}, environ={{}}).control_loops()[0])\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    needs_torch = proc.returncode != 0
    assert not needs_torch or "torch" in proc.stderr, proc.stderr[-2000:]
    install = re.search(r"## Install\n+```sh\n(.*?)```", README.read_text(), re.S).group(1)
    [pip] = [re.sub(r"\s#.*$", "", line) for line in install.splitlines() if "pip install" in line]
    assert not needs_torch or "[train]" in pip, pip
