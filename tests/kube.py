"""Helpers for tests that talk to the testbed: polling, get-or-None, create from dicts."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
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


def account_token(kube: Client, namespace: str, account: str, seconds: int = 3600) -> str:
    """A token of the ServiceAccount issued by the API server (TokenRequest), for its own
    audience: what a Pod of that account presents."""
    from lightkube.models.authentication_v1 import TokenRequestSpec
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import ServiceAccount

    request = ServiceAccount.Token(
        metadata=ObjectMeta(name=account, namespace=namespace),
        spec=TokenRequestSpec(audiences=[], expirationSeconds=seconds),
    )
    token: str = kube.create(request, account, namespace=namespace).status.token
    return token


def account_kubeconfig(
    testbed: Testbed, account: str, credentials: dict[str, str], path: Path
) -> Path:
    """A kubeconfig (mode 0600) for the testbed's API server as `account`, with its
    `credentials` as a kubeconfig's user has them ({"token": ...}, {"tokenFile": ...})."""
    server = {"server": testbed.server, "certificate-authority": str(testbed.pki.ca_cert)}
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "testbed", "cluster": server}],
        "users": [{"name": account, "user": credentials}],
        "contexts": [{"name": "sa", "context": {"cluster": "testbed", "user": account}}],
        "current-context": "sa",
    }
    path.write_text(yaml.safe_dump(document))
    path.chmod(0o600)
    return path


def bound_token(kube: Client, namespace: str, pod: Any, audience: str | None = "kubetrain") -> str:
    """A token of the Pod's ServiceAccount bound to `pod` (its name and uid), issued by
    the API server (TokenRequest) as the kubelet asks for the one it projects; for
    `audience`, or None: the API server's own."""
    from lightkube.models.authentication_v1 import BoundObjectReference, TokenRequestSpec
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import ServiceAccount

    account = pod.spec.serviceAccountName or "default"
    bound = BoundObjectReference(
        kind="Pod", apiVersion="v1", name=pod.metadata.name, uid=pod.metadata.uid
    )
    request = ServiceAccount.Token(
        metadata=ObjectMeta(name=account, namespace=namespace),
        spec=TokenRequestSpec(
            audiences=[audience] if audience else [], expirationSeconds=600, boundObjectRef=bound
        ),
    )
    token: str = kube.create(request, account, namespace=namespace).status.token
    return token


# Set by the session's Kueue testbed fixture (tests/conftest.py) to its state dir, for a
# wait that times out to say whether Kueue still ran.
KUEUE_STATE_ENV = "KUBETRAIN_TEST_KUEUE_STATE"
