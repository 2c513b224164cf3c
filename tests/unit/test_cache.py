"""The watch cache's bookkeeping, fed recorded objects the way its reflectors would."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from kubetrain.cluster.cache import ClusterCache, job_id_of
from kubetrain.domain.diagnosis import JobFacts, diagnose
from kubetrain.domain.snapshot import Snapshot

pytestmark = pytest.mark.unit

SNAPSHOTS = Path(__file__).parent.parent / "fixtures" / "snapshots"
NOW = datetime(2026, 12, 2, 16, 0, tzinfo=UTC)  # after every recording
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
        if (
            item["kind"] not in RESOURCE
        ):  # PVs, StorageClasses: dumps have them, the cache watches none
            continue
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


def test_a_deleted_job_is_dropped():
    cache = ClusterCache(http=None)
    items = feed(cache, "running", "job-c")
    job = next(i for i in items if i["kind"] == "Job")
    ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
    assert cache.job(ns, name) is not None
    cache.reflectors["jobs"].on_event("DELETED", job)  # type: ignore[misc]
    assert cache.job(ns, name) is None


def _diagnoses(snapshot_of: Any, jobs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {}
    for job in jobs:
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
        facts = JobFacts(name=name, k8s_name=name, namespace=ns, dispatched=True)
        out[name] = diagnose(facts, snapshot_of(job).for_job(name, ns), NOW).to_json(name)
    return out


def test_a_batch_snapshot_diagnoses_every_recorded_job_as_the_whole_listing_does():
    cache = ClusterCache(http=None)
    jobs = []
    for number, path in enumerate(sorted(SNAPSHOTS.glob("*.json"))):
        items = feed(cache, path.stem, f"job-{number}")
        jobs += [i for i in items if i["kind"] == "Job"]
    ids = [job_id_of(job) or "" for job in jobs]
    whole = Snapshot.from_list(cache.listing())
    expected = _diagnoses(lambda job: whole, jobs)
    # Every recorded Job (job-deleted.json records the Job's absence: it has none).
    assert len(expected) == len(jobs) >= len(list(SNAPSHOTS.glob("*.json"))) - 1
    # Node usage as the cache keeps it event by event = as the listing's index counts it.
    state = cache.node_state()
    assert state.nodes == whole.index.nodes
    assert {n: dict(u) for n, u in state.usage.items() if u} == {
        n: dict(u) for n, u in whole.index.usage.items() if u
    }
    batch = cache.snapshot(ids)
    assert _diagnoses(lambda job: batch, jobs) == expected
    alone = _diagnoses(lambda job: cache.snapshot([job_id_of(job) or ""]), jobs)
    assert alone == expected


def test_node_usage_follows_pods_binding_finishing_and_going():
    cache = ClusterCache(http=None)
    items = feed(cache, "running", "job-a")
    (pod,) = [i for i in items if i["kind"] == "Pod"]
    node = pod["spec"]["nodeName"]
    held = dict(cache.node_state().usage[node])
    assert held["cpu"] > 0
    pods = cache.reflectors["pods"]
    assert pods.on_event is not None
    finished = {**pod, "status": {**pod["status"], "phase": "Succeeded"}}
    pods.on_event("MODIFIED", finished)
    assert not cache.node_state().usage.get(node)
    pods.on_event("MODIFIED", pod)
    assert cache.node_state().usage[node] == held
    pods.on_event("DELETED", pod)
    assert not cache.node_state().usage.get(node)
    assert cache.snapshot(["job-a"]).pods == ()


def test_forget_keeps_only_stubs_of_a_finished_jobs_job_and_pods():
    cache = ClusterCache(http=None)
    items = feed(cache, "succeeded", "job-f")
    feed(cache, "running", "job-g")
    job = next(i for i in items if i["kind"] == "Job")
    pods = [i for i in items if i["kind"] == "Pod"]
    ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
    cache.forget(ns, name, [p["metadata"]["name"] for p in pods])
    assert cache.job(ns, name) is None
    assert job not in cache.jobs()
    listed = {i["metadata"]["uid"] for i in cache.listing()["items"]}
    assert not listed & {o["metadata"]["uid"] for o in [job, *pods]}
    assert [i for i in cache.listing()["items"] if i["kind"] == "Pod"]  # job-g's stays
    for resource, obj in [("jobs", job), *(("pods", p) for p in pods)]:
        kept = cache.reflectors[resource].items[obj["metadata"]["uid"]]
        assert set(kept) == {"metadata"}  # what a relist compares, and the job-id label
        assert kept["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"]
        assert job_id_of(kept) == "job-f"
    # Should the Job change again, it is followed anew.
    cache.reflectors["jobs"].on_event("MODIFIED", job)  # type: ignore[misc]
    assert cache.job(ns, name) is job
