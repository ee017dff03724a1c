"""Which gateway jar runs: an operator's `SAMM_GATEWAY_JAR` is taken at its word."""
from pathlib import Path

import pytest

from sim_bridge.errors import GatewayError
from sim_bridge.gateway import find_jar


def test_a_named_jar_that_is_missing_is_an_error_not_the_checkouts_build(monkeypatch, tmp_path):
    missing = tmp_path / "typo-gateway.jar"
    monkeypatch.setenv("SAMM_GATEWAY_JAR", str(missing))
    with pytest.raises(GatewayError, match="SAMM_GATEWAY_JAR names .*typo-gateway.jar, which is not a file"):
        find_jar()


def test_a_named_directory_is_not_a_jar(monkeypatch, tmp_path):
    monkeypatch.setenv("SAMM_GATEWAY_JAR", str(tmp_path))
    with pytest.raises(GatewayError, match="not a file"):
        find_jar()


def test_a_named_jar_that_exists_is_used(monkeypatch, tmp_path):
    jar = tmp_path / "other.jar"
    jar.write_bytes(b"PK")
    monkeypatch.setenv("SAMM_GATEWAY_JAR", str(jar))
    assert find_jar() == jar


def test_without_the_variable_the_checkouts_build_is_found(monkeypatch):
    monkeypatch.delenv("SAMM_GATEWAY_JAR", raising=False)
    built = Path(__file__).resolve().parent.parent / "java" / "target" / "samm-gateway.jar"
    if not built.is_file():
        with pytest.raises(GatewayError, match="mvn package"):
            find_jar()
    else:
        assert find_jar() == built


@pytest.mark.jvm
def test_the_jvm_leads_its_own_session_so_a_terminals_ctrl_c_reaches_python_alone():
    import os

    from sim_bridge.gateway import Gateway

    gw = Gateway()
    try:
        assert os.getsid(gw.proc.pid) == gw.proc.pid != os.getsid(0)
    finally:
        gw.close()
