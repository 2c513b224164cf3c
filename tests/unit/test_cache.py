"""The watch cache's bookkeeping, fed recorded objects the way its reflectors would."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kubetrain.cluster.cache import ClusterCache

pytestmark = pytest.mark.unit

SNAPSHOTS = Path(__file__).parent.parent / "fixtures" / "snapshots"
RESOURCE = {
    "Job": "jobs",
    "Pod": "pods",
    "Event": "events",
    "Node": "nodes",
    "PersistentVolumeClaim": "pvcs",
    "ResourceQuota": "quotas",
}


def feed(cache: ClusterCache, name: str, job_id: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads((SNAPSHOTS / f"{name}.json").read_text())["items"]
    # Ours (job-id label) first, as the watches deliver Jobs before their events.
    for item in sorted(items, key=lambda i: i["kind"] == "Event"):
        if item["kind"] in ("Job", "Pod"):
            item["metadata"].setdefault("labels", {})["kubetrain.io/job-id"] = job_id
            item["metadata"]["labels"]["app.kubernetes.io/managed-by"] = "kubetrain"
        reflector = cache.reflectors[RESOURCE[item["kind"]]]
        reflector.items[item["metadata"]["uid"]] = item
        assert reflector.on_event is not None
        reflector.on_event("ADDED", item)
    return items


def test_listing_holds_every_cached_pod_but_only_our_events_and_forget_drops_them():
    marked: list[str | None] = []
    cache = ClusterCache(http=None, listener=lambda r, k, o, job_id: marked.append(job_id))
    items = feed(cache, "succeeded", "job-a")
    feed(cache, "running", "job-b")
    stranger = {
        "kind": "Event",
        "metadata": {"uid": "x", "namespace": "elsewhere"},
        "involvedObject": {"kind": "Pod", "name": "not-ours", "namespace": "elsewhere"},
    }
    cache.reflectors["events"].on_event("ADDED", stranger)  # type: ignore[misc]
    listing = cache.listing()
    kinds = [i["kind"] for i in listing["items"]]
    assert kinds.count("Pod") == 2  # both jobs' Pods: node usage must count them all
    assert all(i["metadata"]["uid"] != "x" for i in listing["items"])
    assert {"job-a", "job-b"} <= set(marked)
    job = next(i for i in items if i["kind"] == "Job")
    ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
    assert cache.job(ns, name) is job
    ours = [
        i
        for i in listing["items"]
        if i["kind"] == "Event" and i["involvedObject"]["namespace"] == ns
    ]
    assert ours
    pods = [i["metadata"]["name"] for i in items if i["kind"] == "Pod"]
    cache.forget(ns, name, pods)
    assert not [
        i
        for i in cache.listing()["items"]
        if i["kind"] == "Event" and i["involvedObject"]["namespace"] == ns
    ]


def test_a_deleted_job_is_remembered_as_deleted():
    cache = ClusterCache(http=None)
    items = feed(cache, "running", "job-c")
    job = next(i for i in items if i["kind"] == "Job")
    ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
    assert not cache.deleted(ns, name)
    cache.reflectors["jobs"].on_event("DELETED", job)  # type: ignore[misc]
    assert cache.deleted(ns, name)
    assert cache.job(ns, name) is None
