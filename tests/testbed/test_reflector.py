"""The list+watch cache against the real API server: events, bookmarks, and a
relist after etcd compaction makes the watch's resourceVersion `410 Gone`."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from lightkube import Client

from kubetrain.cluster.client import http_client, load_config
from kubetrain.cluster.reflector import Reflector
from kubetrain.testbed.cluster import Testbed
from tests.kube import compact_etcd, create

pytestmark = pytest.mark.testbed


def configmap(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name},
        # Not ASCII: the decoder's strings must come out as the server's.
        "data": {"k": name, "text": "Größe: 日本語 ✓"},
    }


def configmaps(http: Any, namespace: str, on_event: Any, **options: Any) -> Reflector:
    """A reflector of the test namespace's ConfigMaps (not the API server's own)."""
    return Reflector(
        http,
        f"/api/v1/namespaces/{namespace}/configmaps",
        field_selector="metadata.name!=kube-root-ca.crt",
        on_event=on_event,
        **options,
    )


async def until(predicate: Any, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.05)


def test_list_then_watch_then_relist_after_compaction(
    testbed: Testbed, kube: Client, namespace: str
):
    for name in ("a", "b", "c"):
        create(kube, configmap(name), namespace)
    seen: list[tuple[str, str]] = []
    handed: dict[str, dict[str, Any]] = {}  # the last object handed on, by name

    def on_event(kind: str, obj: dict[str, Any]) -> None:
        seen.append((kind, obj["metadata"]["name"]))
        handed[obj["metadata"]["name"]] = obj

    async def scenario() -> Reflector:
        http = http_client(load_config(testbed.kubeconfig))
        reflector = configmaps(
            http,
            namespace,
            on_event,
            page_size=2,  # exercises the paginated list
        )
        task = asyncio.create_task(reflector.run())
        await asyncio.wait_for(reflector.synced.wait(), 20)
        assert sorted(seen) == [("ADDED", "a"), ("ADDED", "b"), ("ADDED", "c")]
        await asyncio.to_thread(create, kube, configmap("d"), namespace)
        await until(lambda: ("ADDED", "d") in seen)
        from lightkube.resources.core_v1 import ConfigMap

        async def away(change: Any) -> None:
            nonlocal task
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await asyncio.to_thread(change)
            seen.clear()

        # A short absence: the watch resumes from our resourceVersion and the API
        # server's watch cache replays what we missed; no relist is needed.
        await away(
            lambda: (
                kube.delete(ConfigMap, "a", namespace=namespace),
                create(kube, configmap("e"), namespace),
            )
        )
        task = asyncio.create_task(reflector.run())
        await until(lambda: ("ADDED", "e") in seen and ("DELETED", "a") in seen)
        assert reflector.stats.relists_410 == 0
        # A long absence: etcd compacted and our version is older than anything the
        # server keeps (410 Gone). Only a relist can tell what was deleted meanwhile.
        await away(
            lambda: (kube.delete(ConfigMap, "b", namespace=namespace), compact_etcd(testbed))
        )
        reflector.resource_version = "1"
        task = asyncio.create_task(reflector.run())
        await until(lambda: reflector.stats.relists_410 >= 1 and ("DELETED", "b") in seen)
        assert sorted(o["metadata"]["name"] for o in reflector.items.values()) == ["c", "d", "e"]
        # The server's bookkeeping of who set which field is not kept (memory).
        served = (await http.get(f"/api/v1/namespaces/{namespace}/configmaps/c")).json()
        assert served["metadata"]["managedFields"]
        assert all("managedFields" not in o["metadata"] for o in reflector.items.values())
        # Otherwise the objects are the server's, as the standard library's json reads
        # them: c handed on from the first list, d from a watch event; all kept from the
        # relist (a list's items name no kind).
        for name in ("c", "d"):
            path = f"/api/v1/namespaces/{namespace}/configmaps/{name}"
            served = (await http.get(path)).json()
            del served["metadata"]["managedFields"]
            listed = {k: v for k, v in served.items() if k not in ("apiVersion", "kind")}
            assert handed[name] == (served if name == "d" else listed)
            assert reflector.items[served["metadata"]["uid"]] == listed
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await http.aclose()
        return reflector

    reflector = asyncio.run(scenario())
    assert reflector.stats.lists == 2  # the first start and the 410, nothing else


def test_a_slim_reflector_keeps_stubs_and_hands_on_whole_objects(
    testbed: Testbed, kube: Client, namespace: str
):
    create(kube, configmap("a"), namespace)
    handed: list[tuple[str, dict[str, Any]]] = []

    async def scenario() -> Reflector:
        http = http_client(load_config(testbed.kubeconfig))
        reflector = configmaps(
            http, namespace, lambda kind, obj: handed.append((kind, obj)), slim=True
        )
        task = asyncio.create_task(reflector.run())
        await asyncio.wait_for(reflector.synced.wait(), 20)
        await asyncio.to_thread(create, kube, configmap("b"), namespace)
        await until(lambda: any(obj["metadata"]["name"] == "b" for _, obj in handed))
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.to_thread(create, kube, configmap("c"), namespace)
        await reflector._list()  # a relist hands on what it found, whole
        await http.aclose()
        return reflector

    reflector = asyncio.run(scenario())
    assert [(kind, obj["metadata"]["name"], obj["data"]) for kind, obj in handed] == [
        ("ADDED", "a", configmap("a")["data"]),  # the list
        ("ADDED", "b", configmap("b")["data"]),  # the watch
        ("ADDED", "c", configmap("c")["data"]),  # the relist
    ]
    assert sorted(reflector.items) == sorted(obj["metadata"]["uid"] for _, obj in handed)
    assert all(
        set(o["metadata"]) <= {"uid", "name", "namespace", "resourceVersion"}
        for o in reflector.items.values()
    )
    assert all(set(o) == {"metadata"} for o in reflector.items.values())
