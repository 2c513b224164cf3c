"""The direct commands' side of Kubernetes: plain synchronous, read-only lists.

`kubetrain why --kubeconfig` and `kubetrain nodes` read the cluster with the
kubeconfig's credentials and no server. Every failure (no kubeconfig, cluster
unreachable, no permission) is a ClusterError whose message is the one line the
CLI prints, never a traceback.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx2 as httpx
from lightkube.config.client_adapter import Client as adapter_client
from lightkube.config.client_adapter import ConnectionParams
from lightkube.config.kubeconfig import SingleConfig

from kubetrain.cluster.client import load_config
from kubetrain.cluster.errors import (
    ClusterConfigError,
    ClusterError,
    ClusterRefused,
    ClusterUnreachable,
)

TIMEOUT = 15.0  # seconds per request
KUEUE_GROUP = "kueue.x-k8s.io"
# Pods that hold resources on a node: bound, not finished (what the scheduler counts).
BOUND_PODS = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"

KINDS = {
    "jobs": ("batch/v1", "Job"),
    "pods": ("v1", "Pod"),
    "events": ("v1", "Event"),
    "nodes": ("v1", "Node"),
    "persistentvolumeclaims": ("v1", "PersistentVolumeClaim"),
    "persistentvolumes": ("v1", "PersistentVolume"),
    "storageclasses": ("storage.k8s.io/v1", "StorageClass"),
    "resourcequotas": ("v1", "ResourceQuota"),
    "limitranges": ("v1", "LimitRange"),
    "priorityclasses": ("scheduling.k8s.io/v1", "PriorityClass"),
    # Kueue's, at the version `served_version` finds (v0.17 serves v1beta2).
    "workloads": (f"{KUEUE_GROUP}/v1beta2", "Workload"),
    "clusterqueues": (f"{KUEUE_GROUP}/v1beta2", "ClusterQueue"),
    "localqueues": (f"{KUEUE_GROUP}/v1beta2", "LocalQueue"),
    "resourceflavors": (f"{KUEUE_GROUP}/v1beta2", "ResourceFlavor"),
}


class Kube:
    """A read-only client of one cluster, answering plain JSON objects."""

    def __init__(self, kubeconfig: str | None) -> None:
        self.config: SingleConfig = load_config(kubeconfig)
        self.server = str(getattr(self.config.cluster, "server", "") or "the cluster")
        try:
            self._http = adapter_client(self.config, ConnectionParams())
        except Exception as exc:  # bad certificate files, exec plugins, …
            raise ClusterConfigError(f"cannot use the kubeconfig: {_first_line(exc)}") from exc
        self._http.timeout = httpx.Timeout(TIMEOUT)

    @property
    def namespace(self) -> str:
        return str(getattr(self.config, "namespace", None) or "default")

    def __enter__(self) -> Kube:
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.close()

    def get(self, path: str, params: dict[str, str] | None = None) -> dict[str, Any] | None:
        """The object at `path`; None when it does not exist."""
        try:
            response = self._http.get(path, params=params)
        except httpx.ConnectError as exc:
            raise ClusterUnreachable(
                type(exc).__name__,
                f"cannot reach the Kubernetes API at {self.server} ({_first_line(exc)}); "
                "is the cluster up, and is the kubeconfig right?",
            ) from exc
        except httpx.TimeoutException as exc:
            raise ClusterUnreachable(
                type(exc).__name__,
                f"the Kubernetes API at {self.server} did not answer within {TIMEOUT:g} s",
            ) from exc
        except httpx.HTTPError as exc:
            raise ClusterUnreachable(
                type(exc).__name__,
                f"the request to the Kubernetes API at {self.server} failed: {_first_line(exc)}",
            ) from exc
        if response.status_code == 404:
            return None
        if response.status_code in (401, 403):
            raise ClusterRefused(
                response.status_code,
                response.reason_phrase,
                f"the Kubernetes API at {self.server} refused to show {path} "
                f"(HTTP {response.status_code}): {_message(response)}; "
                "your kubeconfig's user needs read access to it",
            )
        if not response.is_success:
            raise ClusterRefused(
                response.status_code,
                response.reason_phrase,
                f"the Kubernetes API at {self.server} answered HTTP {response.status_code} "
                f"for {path}: {_message(response)}",
            )
        try:
            body = response.json()
        except ValueError:
            raise ClusterError(
                "NotJSON",
                f"the Kubernetes API at {self.server} answered something not JSON for {path}",
            ) from None
        if not isinstance(body, dict):
            raise ClusterError(
                "NotAnObject", f"the Kubernetes API at {self.server} answered no object for {path}"
            )
        return body

    def served_version(self, group: str) -> str | None:
        """The version of API `group` the cluster prefers; None when it serves no such
        group (a CRD not installed)."""
        found = self.get(f"/apis/{quote(group, safe='.')}") or {}
        preferred = (found.get("preferredVersion") or {}).get("version")
        return preferred if isinstance(preferred, str) and preferred else None

    def list(
        self,
        resource: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        version: str | None = None,
    ) -> list[dict[str, Any]]:
        """Every object of `resource` (all pages), each with its apiVersion and kind;
        `version` replaces the version KINDS names (one discovery found)."""
        api_version, kind = KINDS[resource]
        if version is not None:
            api_version = f"{api_version.split('/', 1)[0]}/{version}"
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        where = f"/namespaces/{quote(namespace, safe='')}" if namespace else ""
        path = f"{base}{where}/{resource}"
        params: dict[str, str] = {"limit": "500"}
        if label_selector:
            params["labelSelector"] = label_selector
        if field_selector:
            params["fieldSelector"] = field_selector
        items: list[dict[str, Any]] = []
        while True:
            page = self.get(path, params) or {}
            items += [
                {"apiVersion": api_version, "kind": kind, **item}
                for item in page.get("items") or []
                if isinstance(item, dict)
            ]
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items
            params["continue"] = token

    def job(self, namespace: str, name: str) -> dict[str, Any] | None:
        path = f"/apis/batch/v1/namespaces/{quote(namespace, safe='')}/jobs/{quote(name, safe='')}"
        job = self.get(path)
        return None if job is None else {"apiVersion": "batch/v1", "kind": "Job", **job}


def as_list(items: list[dict[str, Any]]) -> dict[str, Any]:
    """The `kubectl get … -o json` shape: a `List`."""
    return {"apiVersion": "v1", "kind": "List", "items": items}


def _message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return str(body["message"])
    return " ".join(response.text.split())[:200] or "(no message)"


def _first_line(exc: Exception) -> str:
    return (str(exc) or type(exc).__name__).splitlines()[0]
