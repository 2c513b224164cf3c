"""Real headless Chromium (Debian's `chromium`, driven by Playwright; tests/chromium.py)
against a real `kubetrain serve` on the testbed. Screenshots go to artifacts/browser/
(git-ignored; KUBETRAIN_TEST_ARTIFACTS moves them)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kubetrain.local_server import LocalServer
from kubetrain.testbed.cluster import Testbed
from tests.chromium import artifacts, browser, page  # noqa: F401 (shared with tests/realnode)


@pytest.fixture(scope="module")
def server(testbed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    tmp = tmp_path_factory.mktemp("web")
    srv = LocalServer(
        database_url=f"sqlite:///{tmp / 'kubetrain.db'}",
        log=tmp / "serve.log",
        kubeconfig=testbed.kubeconfig,
    )
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()
