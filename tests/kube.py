"""Helpers for tests that talk to the testbed: polling, get-or-None, create from dicts."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from lightkube import ApiError, Client
from lightkube.codecs import from_dict

T = TypeVar("T")


def eventually(
    probe: Callable[[], T | None],
    timeout: float = 30.0,
    interval: float = 0.2,
    what: str = "condition",
) -> T:
    """Poll `probe` until it returns something truthy; fail with `what` otherwise."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


def get(kube: Client, kind: Any, name: str, namespace: str | None = None) -> Any:
    try:
        return kube.get(kind, name, namespace=namespace)
    except ApiError as exc:
        if exc.status.code == 404:
            return None
        raise


def create(kube: Client, manifest: dict[str, Any], namespace: str | None = None) -> Any:
    obj: Any = from_dict(manifest)
    return kube.create(obj, namespace=namespace)
