"""Audit of what SAMM exposes and reads: secrets in `samm config check` and in the knowledge
store's URL, secrets given through the environment, the service's bearer token, and what the
systemd units leave writable. Each test once failed: a database or Graphite password printed
by `samm config check`, a part of a database password shown in every log line (or a traceback
from `samm run`), a token of digits that made `samm run` refuse its config, a token file's
trailing newline that refused every upload, or a daemon that could not import its own kernels
under the shipped unit."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from agents.factory import make_agent
from samm.cli.main import cli
from samm.config import load_config
from samm.knowledge.engine import KnowledgeError, normalize_url, redacted
from samm.plan.registry import PolicyRegistry
from samm.plan.service import create_app
from sim_bridge.config import SimConfig

REPO = Path(__file__).resolve().parents[1]
UNIT_DIR = REPO / "deploy" / "systemd"
GROUPS = "groups:\n  - {name: S, cores: 1, ram_gb: 1, price_per_hour: 0.1, min: 0, max: 3}\n"


def config_file(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "samm.yaml"
    path.write_text(GROUPS + extra)
    return path


# -- secrets in `samm config check` ----------------------------------------------------------------
def test_config_check_masks_passwords_in_urls(tmp_path):
    """`config check` says "secrets masked", yet printed knowledge.url with its password (and a
    Graphite, service or AWS endpoint's basic-auth password)."""
    path = config_file(tmp_path, 'knowledge: {url: "postgresql://samm:hunter2@db.example/samm"}\n'
                                 'graphite: {render_url: "http://graf:gpass@graphite:8080"}\n'
                                 'agent: {mode: http, service_url: "http://a:apass@svc:8000"}\n'
                                 'executor: {endpoint_url: "https://k:epass@aws.local"}\n')
    res = CliRunner().invoke(cli, ["config", "check", str(path)])
    assert res.exit_code == 0, res.output
    for secret in ("hunter2", "gpass", "apass", "epass"):
        assert secret not in res.output
    assert '"url": "postgresql://samm:***@db.example/samm"' in res.output
    assert '"render_url": "http://graf:***@graphite:8080"' in res.output
    # the loaded config keeps the password, and a dump meant to be loaded again can ask for it
    cfg = load_config(path, environ={})
    assert cfg.knowledge.url == "postgresql://samm:hunter2@db.example/samm"
    assert cfg.model_dump(mode="json", context={"secrets": "keep"})["knowledge"]["url"] == cfg.knowledge.url


def test_config_check_masks_the_password_of_a_loop_agent(tmp_path):
    path = tmp_path / "loops.yaml"
    path.write_text("loops:\n  - name: a\n    " + GROUPS.replace("\n  -", "\n      -").strip() + "\n"
                    '    agent: {mode: http, service_url: "http://a:apass@svc:8000"}\n')
    res = CliRunner().invoke(cli, ["config", "check", str(path)])
    assert res.exit_code == 0, res.output
    assert "apass" not in res.output and '"service_url": "http://a:***@svc:8000"' in res.output


# -- secrets from the environment ------------------------------------------------------------------
@pytest.mark.parametrize("token", ["12345678", "0777", "true", "ab: cd", "x #y", "[a"])
def test_a_token_from_the_environment_is_taken_as_written(tmp_path, token):
    """SAMM_SERVICE__TOKEN was read as YAML: a token of digits became a number and the daemon
    refused its config ("service.token: Input should be a valid string"), " #y" was cut off."""
    cfg = load_config(config_file(tmp_path), environ={"SAMM_SERVICE__TOKEN": token})
    assert cfg.service.token.get_secret_value() == token


def test_a_database_url_from_the_environment_is_taken_as_written(tmp_path):
    url = "postgresql://samm:pa #ss@db/samm"
    cfg = load_config(config_file(tmp_path), environ={"SAMM_KNOWLEDGE__URL": url, "SAMM_SERVICE__PORT": "9100"})
    assert cfg.knowledge.url == url and cfg.service.port == 9100   # other keys are still YAML values


# -- the knowledge store's URL -----------------------------------------------------------------------
def test_a_raw_at_in_the_database_password_is_refused_without_showing_it():
    """The parser ends the password at its first '@': the rest was taken for the host and shown
    in every log line ("postgresql+psycopg://samm:***@ter2@db/samm") and connection error."""
    with pytest.raises(KnowledgeError, match="%40") as err:
        normalize_url("postgresql://samm:hun@ter2@db/samm")
    assert "ter2" not in str(err.value)
    assert "ter2" not in redacted("postgresql://samm:hun@ter2@db/samm")
    # written as %40 it is a password like any other
    assert normalize_url("postgresql://samm:hun%40ter2@db/samm").password == "hun@ter2"
    # a user name holding '@' before the password's ':' (Azure's user@server) stays valid
    assert normalize_url("postgresql://samm@srv:pw@db/samm").host == "db"


def test_a_port_that_is_not_a_number_is_one_line_without_the_password(tmp_path):
    """A ValueError escaped normalize_url: `samm run` ended in a traceback, and past an '@' in
    the password the 'port' it quoted was part of the password."""
    for url, hidden in (("postgresql://samm:hunter2@db:abc/samm", "hunter2"),
                        ("postgresql://samm:p@ss:zq9x@db:5432/samm", "zq9x")):
        with pytest.raises(KnowledgeError) as err:
            normalize_url(url)
        assert hidden not in str(err.value)
        assert redacted(url) == "(invalid URL)"
    path = config_file(tmp_path, 'knowledge: {url: "postgresql://samm:hunter2@db:abc/samm"}\n'
                                 "executor: {kind: sim, dry_run: true}\n")
    res = CliRunner().invoke(cli, ["run", "--config", str(path), "--iterations", "1"])
    assert res.exit_code == 2 and not isinstance(res.exception, ValueError), res.output
    assert "port is not a number" in res.output and "hunter2" not in res.output


# -- the service's token -----------------------------------------------------------------------------
@pytest.mark.parametrize("configured", ["tok\n", " tok ", "tok"])
def test_a_token_with_surrounding_whitespace_accepts_its_uploads(tmp_path, configured):
    """A token read from a file or a Kubernetes secret ends in a newline no client can send: every
    upload and rollback was refused as "invalid token"."""
    reg = PolicyRegistry(tmp_path / "store")
    reg.host("lstm-ppo", make_agent("lstm-ppo", SimConfig()))
    client = TestClient(create_app(reg, token=configured))
    rollback = "/v1/agents/lstm-ppo/policy/rollback"
    assert client.post(rollback, headers={"authorization": "Bearer tok"}).status_code == 409   # authorised
    assert client.post(rollback, headers={"authorization": "Bearer tok2"}).status_code == 403


def test_a_blank_token_leaves_uploads_disabled(tmp_path):
    reg = PolicyRegistry(tmp_path / "store")
    reg.host("lstm-ppo", make_agent("lstm-ppo", SimConfig()))
    client = TestClient(create_app(reg, token=" \n"))
    res = client.post("/v1/agents/lstm-ppo/policy/rollback", headers={"authorization": "Bearer x"})
    assert res.status_code == 403 and "disabled" in res.json()["detail"]


# -- what the systemd units leave writable ----------------------------------------------------------
from test_systemd_unit import unit_settings  # noqa: E402  (one reader of the unit files)


@pytest.mark.parametrize("unit", ["samm.service", "samm-serve.service"])
def test_the_units_give_numba_a_writable_cache(unit):
    """numba caches its kernels beside the source or in ~/.cache, both read-only under
    ProtectSystem=strict: importing samm.analyze.metrics (the daemon, the autoscaling agents)
    failed with "no locator available"."""
    s = unit_settings(unit)
    env = dict(item.split("=", 1) for line in s.get("Environment", []) for item in line.split())
    assert "NUMBA_CACHE_DIR" in env, f"{unit} sets no NUMBA_CACHE_DIR"
    assert env["NUMBA_CACHE_DIR"] == f"/var/cache/{s['CacheDirectory'][0]}"


@pytest.mark.skipif(os.name != "posix" or not hasattr(os, "geteuid") or os.geteuid() != 0
                    or shutil.which("unshare") is None, reason="needs root and unshare (a private mount namespace)")
def test_a_read_only_install_imports_its_kernels_only_with_the_units_cache(tmp_path):
    """What the units' cache is for, on the real numba: the project mounted read-only and a
    read-only home (as ProtectSystem=strict leaves them)."""
    home = REPO / "no-such-home"   # inside the read-only mount
    code = "import samm.analyze.metrics; print('imported')"

    def import_read_only(extra_env: dict) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "XDG_CACHE_HOME")}
        env |= {"HOME": str(home), "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"} | extra_env
        script = (f"mount --bind {REPO} {REPO} && mount -o remount,bind,ro {REPO} && "
                  f"cd {tmp_path} && exec {sys.executable} -c \"{code}\"")
        return subprocess.run(["unshare", "-m", "sh", "-c", script], env=env, capture_output=True, text=True,
                              timeout=120)

    without = import_read_only({})
    if "imported" not in without.stdout and "no locator available" not in without.stderr:
        pytest.skip(f"no private read-only mount here: {without.stderr[-300:]}")   # e.g. no CAP_SYS_ADMIN
    assert "no locator available" in without.stderr
    with_cache = import_read_only({"NUMBA_CACHE_DIR": str(tmp_path / "numba")})
    assert "imported" in with_cache.stdout, with_cache.stderr[-2000:]


# -- what an uploaded policy names itself ------------------------------------------------------------
@pytest.mark.parametrize("version", [12345, {"a": 1}, ["v"], "x" * 129, "v2\nFORGED log line"])
def test_an_upload_whose_version_is_not_a_short_printable_string_is_rejected(tmp_path, version):
    """A number or an object as metadata.json's version was swapped in, the upload answered 500,
    and every agent listing (the daemon's HTTP planner reads it first) was a 500 until a rollback;
    a newline in it forged lines in the service's log."""
    import base64
    import json

    from agents.ppo.agent import LstmPpoAgent

    reg = PolicyRegistry(tmp_path / "store")
    base = make_agent("lstm-ppo", SimConfig())
    reg.host("lstm-ppo", base)
    client = TestClient(create_app(reg, token="tok"), raise_server_exceptions=False)
    LstmPpoAgent(base.feature_names, action_mode=base.action_mode, version="v2").save(tmp_path / "cand")
    files = {p.name: p.read_bytes() for p in (tmp_path / "cand").iterdir()}
    meta = json.loads(files["metadata.json"]) | {"version": version}
    files["metadata.json"] = json.dumps(meta).encode()
    res = client.put("/v1/agents/lstm-ppo/policy", headers={"authorization": "Bearer tok"},
                     json={"files": {k: base64.b64encode(v).decode() for k, v in files.items()}})
    # a string that is not printable: the registry's check; not a string at all: the loader's
    assert res.status_code == 422 and re.search("version must be a (printable )?string", res.json()["detail"]), res.text
    assert client.get("/v1/agents").status_code == 200
    assert reg.get("lstm-ppo") is base


# -- labels of the docker executor -------------------------------------------------------------------
@pytest.mark.parametrize("label", ["samm.group=L", " samm.namespace = other", "samm.request"])
def test_a_docker_label_replacing_samms_own_is_refused(tmp_path, label):
    """A group's docker_label "samm.group=L" replaced the label the executor finds the group's
    containers by (measured on a real engine: S stayed at 0 while each iteration started two more
    containers, which group L counted past its max)."""
    from samm.config import DOCKER_LABELS_OF_SAMM, ConfigError
    from samm.execute.docker_exec import LABEL_GROUP, LABEL_NAMESPACE, LABEL_REQUEST

    path = tmp_path / "docker.yaml"
    path.write_text("groups:\n  - {name: S, cores: 1, ram_gb: 1, price_per_hour: 0.1, min: 0, max: 3, "
                    f"docker_image: busybox, docker_label: {label!r}}}\nexecutor: {{kind: docker}}\n")
    with pytest.raises(ConfigError, match="would replace SAMM's own label") as err:
        load_config(path, environ={})
    assert f"{path}:2" in str(err.value)
    assert {LABEL_GROUP, LABEL_NAMESPACE, LABEL_REQUEST} == set(DOCKER_LABELS_OF_SAMM)
    path.write_text(path.read_text().replace(label.strip().split("=")[0].strip(), "team"))   # any other key is fine
    assert load_config(path, environ={}).groups[0].docker_label is not None


def test_an_upload_of_thousands_of_files_is_rejected_before_writing_any(tmp_path):
    """The body limit bounds bytes, not files: 200,000 empty files (2.8 MB of JSON) were all
    written to the store before the policy was rejected (12 s; millions fit within 64 MB, enough
    to use up the store's inodes)."""
    import json

    from samm.plan.registry import MAX_UPLOAD_FILES

    reg = PolicyRegistry(tmp_path / "store")
    reg.host("lstm-ppo", make_agent("lstm-ppo", SimConfig()))
    client = TestClient(create_app(reg, token="tok"))
    files = {f"f{i}": "" for i in range(5000)} | {"metadata.json": "e30="}
    res = client.put("/v1/agents/lstm-ppo/policy", content=json.dumps({"files": files}),
                     headers={"authorization": "Bearer tok", "content-type": "application/json"})
    assert res.status_code == 422 and f"at most {MAX_UPLOAD_FILES} files" in res.json()["detail"], res.text
    assert list((tmp_path / "store").iterdir()) == []


def test_an_uploaded_lstm_ppo_policy_declaring_a_huge_network_is_refused_before_it_is_built(tmp_path):
    """metadata.json's lstm_hidden of 20,000 built a ~6-GB network for hours (orthogonal init) before
    the weights could be compared with it; the bound refuses it at once."""
    import json

    from agents.factory import make_agent
    from agents.ppo.agent import MAX_LSTM_HIDDEN, LstmPpoAgent
    from samm.plan.registry import PolicyRegistry, PolicyRejected
    from sim_bridge.config import SimConfig

    agent = make_agent("lstm-ppo", SimConfig())
    LstmPpoAgent(agent.feature_names, action_mode=agent.action_mode, version="huge").save(tmp_path / "p")
    meta = json.loads((tmp_path / "p" / "metadata.json").read_text())
    meta.setdefault("params", {})["lstm_hidden"] = 20_000
    (tmp_path / "p" / "metadata.json").write_text(json.dumps(meta))
    reg = PolicyRegistry(tmp_path / "store")
    reg.host("lstm-ppo", agent)
    files = {p.name: p.read_bytes() for p in (tmp_path / "p").iterdir() if p.is_file()}
    with pytest.raises(PolicyRejected, match=f"lstm_hidden.*{MAX_LSTM_HIDDEN}"):
        reg.upload("lstm-ppo", files)


def test_the_daemons_planner_never_shows_a_service_password(caplog):
    """A `service_url` with user:password reached the daemon's warnings and the decision reasons it
    records in the knowledge store."""
    import logging

    from samm.plan.client import HttpPlanner

    from samm.localproc import free_port

    port = free_port()  # nothing listens: the agent list cannot be read
    planner = HttpPlanner(f"http://samm:s3cret@127.0.0.1:{port}", "lstm-ppo", "sess", timeout_s=0.5)
    with caplog.at_level(logging.WARNING, logger="samm.plan.client"):
        assert planner.feature_names is None
    assert "s3cret" not in planner.spec_error and "samm:***@" in planner.spec_error
    assert caplog.records and all("s3cret" not in r.getMessage() for r in caplog.records)
