import os
import time

import psutil
import pytest

from sim_bridge.gateway import close_shared_gateway, find_jar


def _our_gateways(since: float) -> list[psutil.Process]:
    """Gateway JVMs started by this test session (their --parent-pid is us, or one of our
    subprocesses that has since died: an orphan)."""
    found = []
    for p in psutil.process_iter(["cmdline", "create_time"]):
        cmd = p.info["cmdline"] or []
        if "--parent-pid" not in cmd or not any("samm-gateway" in c for c in cmd):
            continue
        if p.info["create_time"] < since - 1:
            continue
        parent = int(cmd[cmd.index("--parent-pid") + 1])
        if parent == os.getpid() or not psutil.pid_exists(parent):
            found.append(p)
    return found


@pytest.fixture(scope="session", autouse=True)
def no_jvm_survives():
    """The test session must not leave a gateway JVM behind (checked at the very end)."""
    since = time.time()
    yield
    close_shared_gateway()
    deadline = time.time() + 10
    while time.time() < deadline and _our_gateways(since):
        time.sleep(0.1)
    leftover = _our_gateways(since)
    for p in leftover:
        p.kill()
    assert not leftover, f"gateway JVMs survived the test session: {[p.pid for p in leftover]}"


@pytest.fixture(scope="session")
def gateway_jar():
    return find_jar()


@pytest.fixture()
def no_uvicorn(monkeypatch):
    """`samm serve` must stop before serving: record it if it would have served instead."""
    import uvicorn

    served = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: served.append(kw))
    monkeypatch.setattr("gc.freeze", lambda: None)
    return served


from fixtures_graphite import graphite, graphite_prefix  # noqa: E402,F401  (real Graphite fixtures)
from fixtures_postgres import knowledge_url, pg_url, postgres_server_url  # noqa: E402,F401  (real PostgreSQL)
