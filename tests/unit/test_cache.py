"""The watch cache's bookkeeping, fed recorded objects the way its reflectors would."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Collection
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from kubetrain.cluster.cache import ClusterCache, job_id_of
from kubetrain.domain.diagnosis import JobFacts, diagnose
from kubetrain.domain.snapshot import Snapshot, bound_requests

pytestmark = pytest.mark.unit

SNAPSHOTS = Path(__file__).parent.parent / "fixtures" / "snapshots"
NOW = datetime(2026, 12, 2, 16, 0, tzinfo=UTC)  # after every recording
RESOURCE = {
    "Job": "jobs",
    "Pod": "pods",
    "Event": "events",
    "Node": "nodes",
    "PersistentVolumeClaim": "pvcs",
    "PersistentVolume": "pvs",
    "StorageClass": "storage_classes",
    "ResourceQuota": "quotas",
    "LimitRange": "limit_ranges",
    "PriorityClass": "priority_classes",
    "Workload": "workloads",
    "ClusterQueue": "cluster_queues",
    "LocalQueue": "local_queues",
    "ResourceFlavor": "resource_flavors",
}


def _deliver(cache: ClusterCache, resource: str, item: dict[str, Any]) -> None:
    reflector = cache.reflectors[resource]
    reflector.items[item["metadata"]["uid"]] = item
    assert reflector.on_event is not None
    reflector.on_event("ADDED", item)


def feed(
    cache: ClusterCache, name: str, job_id: str, *, ours: Collection[str] | None = None
) -> list[dict[str, Any]]:
    """A recorded dump into the cache as its watches deliver it. Every Pod counts as
    a job's (job-id label) unless `ours` names the Jobs whose Pods alone are."""
    items: list[dict[str, Any]] = json.loads((SNAPSHOTS / f"{name}.json").read_text())["items"]
    # Ours (job-id label) first, as the watches deliver Jobs before their events (and
    # before Kueue's Workloads, which the cache routes by the Job that owns them).
    for item in sorted(items, key=lambda i: i["kind"] in ("Event", "Workload")):
        labels = item["metadata"].setdefault("labels", {})
        owner = item["metadata"]["name"] if item["kind"] == "Job" else labels.get("job-name")
        mine = item["kind"] == "Job" or (
            item["kind"] == "Pod" and (ours is None or labels.get("job-name") in ours)
        )
        if mine:
            # Kueue's fixtures hold other Jobs of the queue: each Job its own id.
            others = owner not in (None, f"kt-{name}")
            labels["kubetrain.io/job-id"] = f"{job_id}-{owner}" if others else job_id
            labels["app.kubernetes.io/managed-by"] = "kubetrain"
        if item["kind"] == "Pod" and not mine:
            # The cluster-wide watch of bound Pods sees every other Pod holding a node;
            # the watch of our Pods (by label) never sees another's.
            if bound_requests(item) is not None:
                _deliver(cache, "bound_pods", item)
            continue
        _deliver(cache, RESOURCE[item["kind"]], item)
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


def test_a_pod_ending_keeps_the_parsed_nodes_and_a_node_changing_parses_them_anew():
    cache = ClusterCache(http=None)
    items = feed(cache, "running", "job-a")
    (pod,) = [i for i in items if i["kind"] == "Pod"]
    node = pod["spec"]["nodeName"]
    (node_obj,) = [i for i in items if i["kind"] == "Node" and i["metadata"]["name"] == node]
    before = cache.node_state()
    pods = cache.reflectors["pods"]
    assert pods.on_event is not None
    pods.on_event("MODIFIED", {**pod, "status": {**pod["status"], "phase": "Succeeded"}})
    ended = cache.node_state()
    assert before.usage.get(node)
    assert not ended.usage.get(node)
    # Only the usage changed: the Nodes are not parsed, interned and sorted again.
    assert ended.nodes is before.nodes
    nodes = cache.reflectors["nodes"]
    assert nodes.on_event is not None
    labels = {**node_obj["metadata"].get("labels", {}), "pool": "changed"}
    nodes.on_event("MODIFIED", {**node_obj, "metadata": {**node_obj["metadata"], "labels": labels}})
    relabelled = cache.node_state()
    assert relabelled.nodes is not ended.nodes
    (info,) = [n for n in relabelled.nodes if n.name == node]
    assert info.labels["pool"] == "changed"
    assert relabelled.usage == ended.usage


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
        # Of the labels, only the one the cache routes by (the Job controller's are many).
        assert set(kept["metadata"]["labels"]) == {"kubetrain.io/job-id"}
    # Should the Job change again, it is followed anew.
    cache.reflectors["jobs"].on_event("MODIFIED", job)  # type: ignore[misc]
    assert cache.job(ns, name) is job


# job-deleted.json records the Job's absence: the server has no Job to diagnose there.
WITH_A_JOB = sorted(p.stem for p in SNAPSHOTS.glob("*.json") if p.stem != "job-deleted")


@pytest.mark.parametrize("name", WITH_A_JOB)
def test_the_server_diagnoses_each_recorded_job_as_its_dump_does(name: str) -> None:
    # Only the Job's own Pods carry kubetrain's label: other teams' Pods (holding
    # GPUs), PersistentVolumes, StorageClasses, LimitRanges, PriorityClasses, the
    # volume binder's events and those about Pods already gone reach the server
    # through its cluster-wide watches, as they reach a dump. Kueue's fixtures hold
    # other kubetrain Jobs of the same queue: each is its own job, with its own Pods,
    # and every Workload, queue and flavor comes through the Kueue watches.
    data = json.loads((SNAPSHOTS / f"{name}.json").read_text())
    jobs = [i for i in data["items"] if i["kind"] == "Job"]
    cache = ClusterCache(http=None)
    fed = feed(cache, name, "job-x", ours={job["metadata"]["name"] for job in jobs})
    from_dump = _diagnoses(lambda job: Snapshot.from_list(data), jobs)
    fed_jobs = [i for i in fed if i["kind"] == "Job"]
    assert {job_id_of(job) for job in fed_jobs} >= {"job-x"}
    by_id = _diagnoses(lambda job: cache.snapshot([job_id_of(job) or ""]), fed_jobs)
    assert by_id == from_dump


def test_events_are_listed_only_once_jobs_and_pods_are() -> None:
    # An Event listed before its Job is known cannot be told ours and is dropped.
    cache = ClusterCache(http=None)
    order: list[str] = []
    events_listed = asyncio.Event()
    synced_before: list[str] = []  # the resources listed in full when the events list

    def fake_run(name: str) -> Any:
        async def run() -> None:
            order.append(f"{name} lists")
            if name == "events":
                synced_before.extend(n for n, r in cache.reflectors.items() if r.synced.is_set())
                events_listed.set()
            else:
                await asyncio.sleep(0.05 if name == "pods" else 0)
                cache.reflectors[name].synced.set()
            await asyncio.Event().wait()

        return run

    for name, reflector in cache.reflectors.items():
        reflector.run = fake_run(name)  # type: ignore[method-assign]

    async def no_kueue() -> None:
        return None

    cache.discover_kueue = no_kueue  # type: ignore[method-assign]

    async def main() -> None:
        task = asyncio.create_task(cache.run())
        await asyncio.wait_for(events_listed.wait(), 30)  # 30 s: a hang guard
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
    # By the time the events list, every other resource has listed, once (Kueue's
    # kinds only where the cluster serves them: here it does not).
    kueue = {"workloads", "cluster_queues", "local_queues", "resource_flavors"}
    assert sorted(order) == sorted(
        f"{name} lists" for name in cache.reflectors if name not in kueue
    )
    assert order[-1] == "events lists"
    assert {"jobs", "pods"} <= set(synced_before)


def _cache_over(served: dict[str, Any] | None, seen: list[str]) -> ClusterCache:
    """A cache whose API server serves `served` as Kueue's discovery document (None:
    no such group) and answers every list empty, every watch with nothing, ever."""

    async def nothing() -> AsyncIterator[bytes]:
        await asyncio.Event().wait()
        yield b""

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        if request.url.path == "/apis/kueue.x-k8s.io":
            return httpx.Response(404) if served is None else httpx.Response(200, json=served)
        if request.url.params.get("watch"):
            return httpx.Response(200, content=nothing())
        return httpx.Response(200, json={"metadata": {"resourceVersion": "1"}, "items": []})

    http = httpx.AsyncClient(transport=httpx.MockTransport(answer), base_url="https://k8s")
    return ClusterCache(http)


def _run_until_synced(cache: ClusterCache) -> None:
    async def main() -> None:
        task = asyncio.create_task(cache.run())
        try:
            await cache.wait_synced(timeout=5)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())


def test_without_kueue_its_kinds_are_a_note_and_count_as_listed() -> None:
    seen: list[str] = []
    cache = _cache_over(None, seen)
    _run_until_synced(cache)  # readiness waits on nothing that is not there
    assert cache.notes == [
        "Kueue is not installed (the cluster serves no kueue.x-k8s.io API): "
        "its Workloads and queues are not watched"
    ]
    assert not [path for path in seen if path.startswith("/apis/kueue.x-k8s.io/")]
    assert cache.snapshot([]).workloads == ()


def test_kueue_is_watched_at_the_version_the_cluster_serves() -> None:
    seen: list[str] = []
    served = {
        "kind": "APIGroup",
        "name": "kueue.x-k8s.io",
        "versions": [{"groupVersion": "kueue.x-k8s.io/v1beta1", "version": "v1beta1"}],
        "preferredVersion": {"groupVersion": "kueue.x-k8s.io/v1beta1", "version": "v1beta1"},
    }
    cache = _cache_over(served, seen)
    _run_until_synced(cache)
    assert cache.notes == []
    for plural in ("workloads", "clusterqueues", "localqueues", "resourceflavors"):
        assert f"/apis/kueue.x-k8s.io/v1beta1/{plural}" in seen
    assert cache.kinds["workloads"] == ("kueue.x-k8s.io/v1beta1", "Workload")


def test_a_workload_marks_the_job_that_owns_it() -> None:
    marked: list[tuple[str, str | None]] = []
    cache = ClusterCache(http=None, listener=lambda r, k, o, job_id: marked.append((r, job_id)))
    feed(cache, "kueue-waiting", "job-w")
    workloads = {job_id for resource, job_id in marked if resource == "workloads"}
    assert workloads == {"job-w", "job-w-first-in-line"}


def test_the_cache_lets_go_of_what_the_diagnosis_read_of_its_pods() -> None:
    from kubetrain.domain.diagnosis import reading

    cache = ClusterCache(http=None)
    gone = feed(cache, "running", "job-d")
    kept = feed(cache, "succeeded", "job-e")
    jobs = [i for i in [*gone, *kept] if i["kind"] == "Job"]
    _diagnoses(lambda job: cache.snapshot(["job-d", "job-e"]), jobs)
    deleted = next(i for i in gone if i["kind"] == "Pod")
    finished = next(i for i in kept if i["kind"] == "Pod")
    assert {deleted["metadata"]["uid"], finished["metadata"]["uid"]} <= set(reading._glances)
    cache.reflectors["pods"].on_event("DELETED", deleted)  # type: ignore[misc]
    assert deleted["metadata"]["uid"] not in reading._glances
    job = next(i for i in kept if i["kind"] == "Job")
    cache.forget(job["metadata"]["namespace"], job["metadata"]["name"], [])
    assert finished["metadata"]["uid"] not in reading._glances


def test_what_comes_after_forget_is_dropped_again():
    # The watches run apart: the Job controller's `Completed` Event, or a last change of
    # the Job, can arrive after the syncer recorded the job and forgot it.
    cache = ClusterCache(http=None)
    items = feed(cache, "succeeded", "job-f")
    job = next(i for i in items if i["kind"] == "Job")
    pods = [i for i in items if i["kind"] == "Pod"]
    ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
    cache.forget(ns, name, [p["metadata"]["name"] for p in pods])
    assert not cache.forget_again("job-f")  # nothing held since
    late = next(i for i in items if i["kind"] == "Event")
    cache.reflectors["events"].on_event(
        "ADDED", {**late, "metadata": {**late["metadata"], "uid": "late"}}
    )  # type: ignore[misc]
    cache.reflectors["jobs"].on_event("MODIFIED", job)  # type: ignore[misc]
    assert cache.job(ns, name) is job
    assert cache.snapshot(["job-f"]).events
    assert cache.forget_again("job-f")
    assert cache.job(ns, name) is None
    assert not cache.snapshot(["job-f"]).events
    assert not [i for i in cache.listing()["items"] if i["metadata"]["uid"] == "late"]
    assert set(cache.reflectors["jobs"].items[job["metadata"]["uid"]]) == {"metadata"}
    assert "job-f" not in cache._event_keys


def test_a_pod_unchanged_between_the_syncers_rounds_is_read_once() -> None:
    """Each round diagnoses from a new snapshot of the cache (`snapshot`): an unchanged
    Pod's reading is the one kept from the round before; a Pod's new version is read anew."""
    from kubetrain.domain.diagnosis import reading

    cache = ClusterCache(http=None)
    items = feed(cache, "gang-running", "job-g")
    jobs = [i for i in items if i["kind"] == "Job"]
    pods = [i for i in items if i["kind"] == "Pod"]
    first = _diagnoses(lambda job: cache.snapshot(["job-g"]), jobs)
    kept = {p["metadata"]["uid"]: reading._glances[p["metadata"]["uid"]] for p in pods}
    assert _diagnoses(lambda job: cache.snapshot(["job-g"]), jobs) == first
    assert all(reading._glances[uid] is glance for uid, glance in kept.items())
    changed = json.loads(json.dumps(pods[0]))  # a watch's new version: new objects
    changed["metadata"]["resourceVersion"] = "999999"
    cache.reflectors["pods"].on_event("MODIFIED", changed)  # type: ignore[misc]
    _diagnoses(lambda job: cache.snapshot(["job-g"]), jobs)
    assert reading._glances[pods[0]["metadata"]["uid"]] is not kept[pods[0]["metadata"]["uid"]]
    assert reading._glances[pods[1]["metadata"]["uid"]] is kept[pods[1]["metadata"]["uid"]]


def test_the_jobs_waiting_for_room_are_known_as_their_pods_change() -> None:
    """`unplaced` (what the syncer marks after room is taken or freed) follows the Pods:
    a Pod the scheduler found no room for marks its job; placed, gone or forgotten, not."""
    cache = ClusterCache(http=None)
    items = feed(cache, "untolerated-taint", "job-u")
    feed(cache, "running", "job-r")  # a placed Pod waits on its node, not on room
    (job,) = [i for i in items if i["kind"] == "Job"]
    (pod,) = [i for i in items if i["kind"] == "Pod"]

    def unplaced() -> list[str | None]:
        return [job_id_of(j) for j in cache.unplaced()]

    assert unplaced() == ["job-u"]
    pods = cache.reflectors["pods"]
    assert pods.on_event is not None
    conditions = [
        {**c, "status": "True"} if c["type"] == "PodScheduled" else c
        for c in pod["status"]["conditions"]
    ]
    pods.on_event("MODIFIED", {**pod, "status": {**pod["status"], "conditions": conditions}})
    assert unplaced() == []
    pods.on_event("MODIFIED", pod)
    assert unplaced() == ["job-u"]
    pods.on_event("DELETED", pod)
    assert unplaced() == []
    pods.on_event("ADDED", pod)
    assert unplaced() == ["job-u"]
    cache.forget(job["metadata"]["namespace"], job["metadata"]["name"], [pod["metadata"]["name"]])
    assert unplaced() == []


def test_a_snapshot_holds_the_nodes_as_they_are_at_its_round() -> None:
    """The Nodes, with their kind, are made once for the rounds between two Node changes
    and anew after one, a heartbeat included (the reflector holds the newer object)."""
    cache = ClusterCache(http=None)
    items = feed(cache, "running", "job-a")
    first = cache.snapshot(["job-a"]).nodes
    assert {n["kind"] for n in first} == {"Node"}
    assert cache.snapshot(["job-a"]).nodes is first
    node = next(i for i in items if i["kind"] == "Node")
    labels = {**node["metadata"].get("labels", {}), "pool": "changed"}
    changed = {**node, "metadata": {**node["metadata"], "labels": labels}}
    _deliver(cache, "nodes", changed)
    (seen,) = [
        n
        for n in cache.snapshot(["job-a"]).nodes
        if n["metadata"]["uid"] == node["metadata"]["uid"]
    ]
    assert seen["metadata"]["labels"]["pool"] == "changed"
    added = {**node, "metadata": {**node["metadata"], "uid": "new-node", "name": "new-node"}}
    _deliver(cache, "nodes", added)
    assert len(cache.snapshot(["job-a"]).nodes) == len(first) + 1
