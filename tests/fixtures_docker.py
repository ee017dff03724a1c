"""A real Docker engine for tests (a private dockerd with the busybox image), and the Locust check.

Test modules build their own fixture scope around `real_engine`, e.g.

    @pytest.fixture(scope="module")
    def engine(tmp_path_factory):
        yield from real_engine(tmp_path_factory, "msd")
"""
from __future__ import annotations

import importlib.util

import pytest

from samm.execute.local_dockerd import DockerdUnavailable, LocalDockerd, ensure_busybox_image


def real_engine(tmp_path_factory, name: str):
    """Start a private engine with the busybox image and yield it; skip the tests without root/dockerd."""
    try:
        with LocalDockerd(tmp_path_factory.mktemp(name)) as engine:
            client = engine.client()
            ensure_busybox_image(client)
            client.close()
            yield engine
    except DockerdUnavailable as exc:
        pytest.skip(f"no real Docker engine here: {exc}")


@pytest.fixture(scope="module")
def locust_installed():
    # find_spec, not import: importing Locust here would gevent-patch the test process
    if importlib.util.find_spec("locust") is None:
        pytest.skip("Locust is not installed (pip install -e .[testbed])")
