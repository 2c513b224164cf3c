"""`kubetrain serve`'s event loop: uvloop's where it is installed (a dependency on
Linux), asyncio's own where it is not."""

from __future__ import annotations

import asyncio
import sys

import pytest
import uvloop

from kubetrain.cli import serve

pytestmark = pytest.mark.unit


def test_serve_runs_on_uvloop() -> None:
    factory = serve.event_loop_factory()
    assert factory is not None
    with asyncio.Runner(loop_factory=factory) as runner:
        assert isinstance(runner.get_loop(), uvloop.Loop)


def test_without_uvloop_serve_runs_on_asyncios_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # its import fails, as where not installed
    assert serve.event_loop_factory() is None
