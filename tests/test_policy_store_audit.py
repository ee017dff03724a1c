"""Audit of the policy store and the saved-policy loaders: a validated upload survives a service
restart (and only over the policy it replaced), replaced uploads do not pile up, request bodies
are bounded, and a saved policy's unknown kind, problem or format names its file. Each test once
failed: the service silently went back to its start-up policy after a restart, the store grew
by one folder per upload for ever, a body of any size was read into memory, or a bare
`KeyError`/`invalid literal for int()` named nothing."""
import base64
import http.client
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from agents.base import load_agent
from agents.factory import make_agent
from agents.ppo.agent import LstmPpoAgent
from agents.registry import load_policy, read_policy_metadata
from samm.localproc import AppInThread, free_port
from samm.plan.registry import POINTER_SUFFIX, PolicyRegistry
from samm.plan.service import create_app
from sim_bridge.config import SimConfig

TOKEN = "store-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}


def saved_candidate(tmp_path: Path, version: str) -> Path:
    agent = make_agent("lstm-ppo", SimConfig())
    folder = tmp_path / "candidates" / version
    LstmPpoAgent(agent.feature_names, action_mode=agent.action_mode, version=version).save(folder)
    return folder


def upload_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def started(store: Path, source: str = "") -> PolicyRegistry:
    """A registry as `samm serve --store STORE --agent lstm-ppo[=SOURCE]` builds it."""
    reg = PolicyRegistry(store)
    reg.host("lstm-ppo", make_agent("lstm-ppo", SimConfig()), source=source)
    return reg


def upload_folders(store: Path) -> list[Path]:
    return sorted(p for p in store.iterdir() if p.is_dir())


# -- a restart keeps the upload ------------------------------------------------------------------
def test_a_validated_upload_is_hosted_again_after_a_restart(tmp_path):
    store = tmp_path / "store"
    first = started(store)
    base_version = first.get("lstm-ppo").version
    first.upload("lstm-ppo", upload_files(saved_candidate(tmp_path, "cand-1")))
    assert (store / f"lstm-ppo{POINTER_SUFFIX}").is_file()

    again = started(store)
    lines = again.restore_uploads()
    assert again.get("lstm-ppo").version == "cand-1"
    assert len(lines) == 1 and "cand-1" in lines[0]
    # the start-up policy is the one a rollback returns to
    assert again.describe("lstm-ppo")["previous_version"] != "cand-1"
    assert again.rollback("lstm-ppo").version != "cand-1"
    assert not (store / f"lstm-ppo{POINTER_SUFFIX}").exists()
    third = started(store)
    assert third.restore_uploads() == []
    assert third.get("lstm-ppo").version != "cand-1" and base_version


def test_a_restart_naming_another_policy_hosts_that_one_and_keeps_the_upload(tmp_path):
    store = tmp_path / "store"
    started(store).upload("lstm-ppo", upload_files(saved_candidate(tmp_path, "cand-1")))
    again = started(store, source=str(saved_candidate(tmp_path, "deployed")))
    [line] = again.restore_uploads()
    assert "--agent now names" in line
    assert again.get("lstm-ppo").version != "cand-1"
    assert len(upload_folders(store)) == 1  # kept: an operator may still want it


def test_a_stored_upload_that_no_longer_loads_is_not_hosted_and_named(tmp_path):
    store = tmp_path / "store"
    started(store).upload("lstm-ppo", upload_files(saved_candidate(tmp_path, "cand-1")))
    [folder] = upload_folders(store)
    for weights in folder.glob("*.pt"):
        weights.write_bytes(b"garbage")
    again = started(store)
    [line] = again.restore_uploads()
    assert "not hosted again" in line and str(folder) in line
    assert again.get("lstm-ppo").version != "cand-1"


@pytest.mark.parametrize("pointer", ["{not json", '{"upload": 3, "base_source": ""}', '["x"]',
                                     '{"upload": "../../etc", "base_source": ""}', '{"base_source": ""}'])
def test_an_unreadable_pointer_keeps_the_start_up_policy(tmp_path, pointer):
    store = tmp_path / "store"
    reg = started(store)
    (store / f"lstm-ppo{POINTER_SUFFIX}").write_text(pointer)
    [line] = reg.restore_uploads()
    assert "unreadable" in line and POINTER_SUFFIX in line
    assert reg.get("lstm-ppo").version != "cand-1"


def test_replaced_uploads_do_not_pile_up_in_the_store(tmp_path):
    """Only the current upload and the one a rollback returns to are kept."""
    store = tmp_path / "store"
    reg = started(store)
    for i in range(4):
        reg.upload("lstm-ppo", upload_files(saved_candidate(tmp_path, f"cand-{i}")))
    folders = upload_folders(store)
    assert len(folders) == 2
    assert {json.loads((f / "metadata.json").read_text())["version"] for f in folders} == {"cand-2", "cand-3"}
    assert reg.rollback("lstm-ppo").version == "cand-2"
    # the pointer follows the rollback: a restart hosts cand-2
    again = started(store)
    again.restore_uploads()
    assert again.get("lstm-ppo").version == "cand-2"


def test_a_rollback_the_store_cannot_record_is_a_503_and_keeps_the_policy(tmp_path):
    reg = started(tmp_path / "store")
    reg.upload("lstm-ppo", upload_files(saved_candidate(tmp_path, "cand-1")))
    reg.upload("lstm-ppo", upload_files(saved_candidate(tmp_path, "cand-2")))
    pointer = reg.store_dir / f"lstm-ppo{POINTER_SUFFIX}"
    pointer.unlink()
    pointer.mkdir()  # os.replace onto a folder fails, as a read-only or full store would
    r = TestClient(create_app(reg, token=TOKEN)).post("/v1/agents/lstm-ppo/policy/rollback", headers=AUTH)
    assert r.status_code == 503 and "cand-2 kept" in r.json()["detail"]
    assert reg.get("lstm-ppo").version == "cand-2"


def test_samm_serve_restarted_on_its_store_serves_the_upload(tmp_path):
    """The whole path: upload over HTTP, the process stopped, a new one on the same --store."""
    store = tmp_path / "store"
    env = dict(os.environ, SAMM_SERVICE__TOKEN=TOKEN)
    body = {"files": {k: base64.b64encode(v).decode()
                      for k, v in upload_files(saved_candidate(tmp_path, "cand-http")).items()}}

    def serve():
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "samm.cli.main", "serve", "--port", str(port),
                                 "--store", str(store)], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    return proc, f"http://127.0.0.1:{port}"
            except httpx.HTTPError:
                time.sleep(0.2)
        proc.kill()
        pytest.fail("samm serve did not come up: " + proc.stderr.read().decode()[-2000:])

    proc, url = serve()
    try:
        r = httpx.put(f"{url}/v1/agents/lstm-ppo/policy", json=body, headers=AUTH, timeout=30)
        assert r.status_code == 200, r.text
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    proc, url = serve()
    try:
        assert httpx.get(f"{url}/v1/agents/lstm-ppo", timeout=5).json()["policy_version"] == "cand-http"
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert "hosting the upload cand-http again" in err.decode()


# -- request bodies are bounded -------------------------------------------------------------------
@pytest.fixture()
def small_app(tmp_path):
    return create_app(started(tmp_path / "store"), token=TOKEN, max_body_bytes=4096)


def test_a_body_over_the_limit_is_a_413_before_it_is_read(small_app):
    client = TestClient(small_app)
    r = client.put("/v1/agents/lstm-ppo/policy", json={"files": {"metadata.json": "A" * 10_000}}, headers=AUTH)
    assert r.status_code == 413 and "4,096 bytes" in r.json()["detail"]
    r = client.post("/v1/agents/lstm-ppo/decide", content=b"{" + b" " * 10_000 + b"}",
                    headers={"content-type": "application/json"})
    assert r.status_code == 413
    # anonymous callers still learn only that they are anonymous
    assert client.put("/v1/agents/lstm-ppo/policy", content=b"x" * 10_000).status_code == 401
    counted = [line for line in client.get("/metrics").text.splitlines() if line.startswith("samm_service_requests_total") and 'status="413"' in line]
    assert len(counted) == 2 and all(line.endswith(" 1.0") for line in counted)


def test_a_chunked_body_over_the_limit_is_cut_at_the_limit(small_app):
    """No Content-Length: the bytes are counted as they arrive (real uvicorn, real socket)."""
    with AppInThread(small_app) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        chunks = (b"{\"session_id\": \"s\", \"observation\": {" + b" " * 2000 for _ in range(5))
        conn.request("POST", "/v1/agents/lstm-ppo/decide", body=chunks,
                     headers={"content-type": "application/json", "transfer-encoding": "chunked"},
                     encode_chunked=True)
        resp = conn.getresponse()
        assert resp.status == 413, resp.read()
        assert "4,096" in json.loads(resp.read())["detail"]
        conn.close()


def test_samm_serve_refuses_a_nan_body_limit():
    from click.testing import CliRunner

    from samm.cli.main import cli

    res = CliRunner().invoke(cli, ["serve", "--port", str(free_port()), "--max-body-mb", "nan"])
    assert res.exit_code != 0 and "--max-body-mb" in res.output


# -- saved policies name their file ---------------------------------------------------------------
def test_an_unknown_agent_kind_names_the_metadata_file(tmp_path):
    folder = saved_candidate(tmp_path, "cand-1")
    meta = json.loads((folder / "metadata.json").read_text())
    for kind in ("lstm-ppp", ["x"]):
        (folder / "metadata.json").write_text(json.dumps(dict(meta, kind=kind)))
        with pytest.raises(ValueError, match=r"metadata\.json: unknown agent"):
            load_agent(folder)


@pytest.mark.parametrize("problem", ["no-such-problem", ["x"]])
def test_an_unknown_problem_names_the_metadata_file(tmp_path, problem):
    folder = saved_candidate(tmp_path, "cand-1")
    meta = json.loads((folder / "metadata.json").read_text())
    (folder / "metadata.json").write_text(json.dumps(dict(meta, problem=problem)))
    with pytest.raises(ValueError, match=r"metadata\.json: "):
        load_policy(folder)


@pytest.mark.parametrize("fmt", ["x", [1], True, 1.5, None])
def test_a_bad_policy_format_names_the_file(tmp_path, fmt):
    (tmp_path / "metadata.json").write_text(json.dumps({"kind": "k", "problem": "p", "format": fmt}))
    with pytest.raises(ValueError, match=r"metadata\.json: format .* is not 1"):
        read_policy_metadata(tmp_path, "k", "p", 1)
