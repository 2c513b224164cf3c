"""A fixture that keeps the caller's KUBETRAIN_* variables and config file out of a test.

Use from a conftest.py: `from tests.isolated import isolated_settings` (it is autouse).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def isolated_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Settings from the test alone: no KUBETRAIN_* of the caller's, no config file of theirs."""
    for name in list(os.environ):
        if name.startswith("KUBETRAIN_") and not name.startswith("KUBETRAIN_TEST_"):
            monkeypatch.delenv(name)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("KUBETRAIN_CONFIG", str(tmp_path / "no-config.toml"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))  # the default SQLite file
