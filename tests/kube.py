"""Helpers for tests that talk to the testbed: polling, get-or-None, create from dicts."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from lightkube import ApiError, Client
from lightkube.codecs import from_dict

from kubetrain.testbed.cluster import Testbed

T = TypeVar("T")


def eventually(
    probe: Callable[[], T | None],
    timeout: float = 30.0,
    interval: float = 0.2,
    what: str | Callable[[], str] = "condition",
) -> T:
    """Poll `probe` until it returns something truthy; fail with `what` otherwise (a
    callable is asked at the end, so that it can say what was last seen)."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    said = what() if callable(what) else what
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {said} (last: {last!r})")


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


def compact_etcd(testbed: Testbed) -> int:
    """Compact etcd at its current revision through its HTTP gateway; returns the revision.
    Every older resourceVersion is then gone from etcd (a watch from one is `410 Gone`)."""
    base = f"http://127.0.0.1:{testbed.state().ports.etcd_client}/v3/kv"

    def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(  # noqa: S310 - loopback etcd
            f"{base}/{path}", data=json.dumps(body).encode(), method="POST"
        )
        with urllib.request.urlopen(request, timeout=10) as resp:  # noqa: S310
            return dict(json.load(resp))

    revision = int(post("range", {"key": "AA=="})["header"]["revision"])
    post("compaction", {"revision": str(revision), "physical": True})
    return revision
