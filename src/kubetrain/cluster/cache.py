"""Watch caches of everything the diagnosis reads, and snapshots built from them.

Jobs and Pods are watched by our labels; Events cluster-wide but kept only
when they are about one of our Jobs or Pods; Nodes, PersistentVolumes and
their claims, StorageClasses, ResourceQuotas, LimitRanges and PriorityClasses
whole (they decide scheduling and admission), so that the server reads what a
dump of the same cluster shows. Kueue's Workloads, ClusterQueues, LocalQueues and
ResourceFlavors are watched whole too, at the version the cluster serves, when
Kueue is installed: without its CRDs there is nothing to watch, which is a note,
not a failure (the group is looked for again now and then). A snapshot for one
job is the same `List` shape that `kubectl get … -o json` prints, so the live path and
`kubetrain why --from-file` feed the diagnosis alike.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable
from decimal import Decimal
from typing import Any

import httpx2 as httpx

from kubetrain.cluster.reflector import Obj, Reflector, interned, served_version
from kubetrain.domain.diagnosis.reading import forget_pods
from kubetrain.domain.manifest import LABEL_JOB_ID, LABEL_MANAGED_BY, MANAGED_BY
from kubetrain.domain.nodes import NodeInfo, parse_node
from kubetrain.domain.snapshot import NodeState, Snapshot, bound_requests

log = logging.getLogger(__name__)

KUEUE_GROUP = "kueue.x-k8s.io"
# The version the paths name until discovery says which one the cluster serves
# (Kueue v0.17 serves v1beta2, earlier releases v1beta1; the fields read are in both).
KUEUE_VERSION = "v1beta2"
KUEUE_RECHECK = 300.0  # seconds between looks for a Kueue installed after start
_KUEUE = ("workloads", "cluster_queues", "local_queues", "resource_flavors")

# (name, path, label selector) — order matters only for start-up logging.
_RESOURCES: tuple[tuple[str, str, str | None], ...] = (
    ("jobs", "/apis/batch/v1/jobs", f"{LABEL_MANAGED_BY}={MANAGED_BY}"),
    ("pods", "/api/v1/pods", LABEL_JOB_ID),
    # Every other Pod that holds resources on a node (the scheduler counts them all; a
    # dump holds them too): only what each requests is kept. Ours are left out, as the
    # watch above delivers them already: each of their changes is decoded once.
    ("bound_pods", "/api/v1/pods", f"!{LABEL_JOB_ID}"),
    ("events", "/api/v1/events", None),
    ("nodes", "/api/v1/nodes", None),
    ("pvcs", "/api/v1/persistentvolumeclaims", None),
    ("pvs", "/api/v1/persistentvolumes", None),
    ("storage_classes", "/apis/storage.k8s.io/v1/storageclasses", None),
    ("quotas", "/api/v1/resourcequotas", None),
    ("limit_ranges", "/api/v1/limitranges", None),
    ("priority_classes", "/apis/scheduling.k8s.io/v1/priorityclasses", None),
    # Kueue's, all of them: a job's place in its queue is among everyone's Workloads.
    ("workloads", f"/apis/{KUEUE_GROUP}/{KUEUE_VERSION}/workloads", None),
    ("cluster_queues", f"/apis/{KUEUE_GROUP}/{KUEUE_VERSION}/clusterqueues", None),
    ("local_queues", f"/apis/{KUEUE_GROUP}/{KUEUE_VERSION}/localqueues", None),
    ("resource_flavors", f"/apis/{KUEUE_GROUP}/{KUEUE_VERSION}/resourceflavors", None),
)
_FIELD_SELECTORS = {"bound_pods": "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"}
# Kinds whose change can alter the verdict of every waiting job.
CLUSTER_WIDE = frozenset(
    {
        "nodes",
        "bound_pods",
        "pvcs",
        "pvs",
        "storage_classes",
        "quotas",
        "limit_ranges",
        "priority_classes",
        *_KUEUE,  # an admission or a queue's change moves every job behind it
    }
)
# Held whole and put in every snapshot as they are (Nodes go through the node state).
_WHOLE = (
    "pvcs",
    "pvs",
    "storage_classes",
    "quotas",
    "limit_ranges",
    "priority_classes",
    *_KUEUE,
)

_KIND = {
    "jobs": ("batch/v1", "Job"),
    "pods": ("v1", "Pod"),
    "events": ("v1", "Event"),
    "nodes": ("v1", "Node"),
    "pvcs": ("v1", "PersistentVolumeClaim"),
    "pvs": ("v1", "PersistentVolume"),
    "storage_classes": ("storage.k8s.io/v1", "StorageClass"),
    "quotas": ("v1", "ResourceQuota"),
    "limit_ranges": ("v1", "LimitRange"),
    "priority_classes": ("scheduling.k8s.io/v1", "PriorityClass"),
    "workloads": (f"{KUEUE_GROUP}/{KUEUE_VERSION}", "Workload"),
    "cluster_queues": (f"{KUEUE_GROUP}/{KUEUE_VERSION}", "ClusterQueue"),
    "local_queues": (f"{KUEUE_GROUP}/{KUEUE_VERSION}", "LocalQueue"),
    "resource_flavors": (f"{KUEUE_GROUP}/{KUEUE_VERSION}", "ResourceFlavor"),
}

# Called with (resource name, watch event type, object, job id or None). "bound_pods"
# says room taken or freed on a node: by another's Pod (its watch), or by one of ours
# (said besides "pods" when the Pod's claim changed).
Listener = Callable[[str, str, Obj, str | None], None]


def job_id_of(obj: Obj) -> str | None:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    value = labels.get(LABEL_JOB_ID)
    return value if isinstance(value, str) else None


class ClusterCache:
    def __init__(self, http: httpx.AsyncClient, listener: Listener | None = None) -> None:
        self.http = http
        self.listener = listener
        self.kinds = dict(_KIND)  # Kueue's apiVersion: the one discovery finds
        # What is not watched and why ("Kueue is not installed ..."): said, not failed on.
        self.notes: list[str] = []
        self.reflectors: dict[str, Reflector] = {}
        # (namespace, involved object name) -> events, for our Jobs and Pods only
        self._events: dict[tuple[str, str], dict[str, Obj]] = defaultdict(dict)
        # (namespace, claim name) -> the events about that PersistentVolumeClaim
        self._claim_events: dict[tuple[str, str], dict[str, Obj]] = defaultdict(dict)
        self._job_by_name: dict[tuple[str, str], str] = {}  # (ns, k8s Job name) -> job id
        self._pod_job: dict[tuple[str, str], str] = {}  # (ns, pod name) -> job id
        self._jobs: dict[tuple[str, str], Obj] = {}  # (ns, Job name) -> Job
        # Kept as events arrive, so that a snapshot costs what its jobs hold, not
        # what the cluster holds: a job's Pods and the keys of its kept events,
        # each Node parsed once per change, each Pod's claim on its node.
        self._job_keys: dict[str, tuple[str, str]] = {}  # job id -> (ns, Job name)
        self._pods: dict[str, dict[str, Obj]] = defaultdict(dict)  # job id -> uid -> Pod
        self._event_keys: dict[str, set[tuple[str, str]]] = defaultdict(set)  # job id -> keys
        self._parsed: dict[str, NodeInfo | None] = {}  # Node uid -> parsed
        self._bound: dict[str, tuple[str, dict[str, Decimal]]] = {}  # Pod uid -> its claim
        self._by_node: dict[str, set[str]] = defaultdict(set)  # node name -> Pod uids
        self._usage: dict[str, dict[str, Decimal]] = {}  # node name -> requested
        self._stale_usage: set[str] = set()  # node names whose usage must be summed again
        # The Nodes alone (parsed, interned, sorted), anew only when a Node changed; the
        # usage, which every Pod bound or ended changes, is added to it in `node_state`.
        self._nodes: NodeState | None = None
        self._node_state: NodeState | None = None
        # The Nodes as a snapshot's items, anew only when a Node changed: copied with
        # their kind for every round, they were ~4 % of the serve process (520 Nodes).
        self._typed_nodes: tuple[Obj, ...] | None = None
        # Jobs with a Pod the scheduler found no room for, kept as their Pods change:
        # `unplaced` was a walk of every Pod's conditions after each room change.
        self._unplaced: set[str] = set()
        for name, path, selector in _RESOURCES:
            self.reflectors[name] = Reflector(
                http,
                path,
                label_selector=selector,
                field_selector=_FIELD_SELECTORS.get(name),
                on_event=self._handler(name),
                # Events carry no labels, so every Event of the cluster is listed;
                # `_events` keeps those about our jobs, the reflector only stubs.
                # Bound Pods: their claims on nodes are kept, the reflector stubs.
                slim=name in ("events", "bound_pods"),
            )

    def _handler(self, resource: str) -> Callable[[str, Obj], None]:
        def handle(kind: str, obj: Obj) -> None:
            meta = obj.get("metadata") or {}
            ns = meta.get("namespace", "")
            job_id = job_id_of(obj)
            if resource == "jobs" and job_id:
                key = (ns, meta.get("name", ""))
                self._job_by_name[key] = job_id
                self._job_keys[job_id] = key
                if kind == "DELETED":
                    self._jobs.pop(key, None)
                else:
                    self._jobs[key] = obj
            elif resource == "pods":
                uid = meta.get("uid", "")
                room = self._claim(uid, None if kind == "DELETED" else bound_requests(obj))
                if room and self.listener is not None:
                    self.listener("bound_pods", kind, obj, job_id)
                if job_id and kind == "DELETED":
                    self._pod_job.pop((ns, meta.get("name", "")), None)
                    pods = self._pods.get(job_id, {})
                    pods.pop(uid, None)
                    forget_pods((uid,))  # what the diagnosis read of it
                    if not pods:
                        self._pods.pop(job_id, None)
                    self._note_unplaced(job_id)
                elif job_id:
                    self._pod_job[(ns, meta.get("name", ""))] = job_id
                    self._pods[job_id][uid] = obj
                    self._note_unplaced(job_id)
            elif resource == "bound_pods":
                # A Pod that stops matching (finished, gone) arrives as DELETED.
                self._claim(meta.get("uid", ""), None if kind == "DELETED" else bound_requests(obj))
            elif resource == "nodes":
                uid = meta.get("uid", "")
                self._typed_nodes = None  # the reflector holds the new object
                if kind == "DELETED":
                    self._parsed.pop(uid, None)
                else:
                    parsed = parse_node(obj)
                    if kind == "MODIFIED" and self._parsed.get(uid) == parsed:
                        # A heartbeat (the kubelet's status times): nothing a diagnosis
                        # reads of a node changed, so no job's verdict can.
                        return
                    self._parsed[uid] = parsed
                self._nodes = self._node_state = None
            elif resource == "workloads":
                job_id = self._job_of_workload(ns, obj)
            elif resource == "events":
                involved = obj.get("involvedObject") or {}
                key = (involved.get("namespace") or ns, involved.get("name") or "")
                if involved.get("kind") == "PersistentVolumeClaim":
                    # The volume binder's words about a claim (FailedBinding): kept
                    # while they exist, as a dump holds them, for any job that mounts it.
                    claim = self._claim_events[key]
                    if kind == "DELETED":
                        claim.pop(meta.get("uid", ""), None)
                        if not claim:
                            del self._claim_events[key]
                    else:
                        claim[meta.get("uid", "")] = obj
                    return
                job_id = (
                    self._job_by_name.get(key)
                    or self._pod_job.get(key)
                    or (self._job_of_pod_name(key) if involved.get("kind") == "Pod" else None)
                )
                if job_id is None:
                    return  # not about one of ours
                if kind == "DELETED":
                    # Events expire after an hour; what they said still explains the
                    # job, so the cache keeps them until the job's objects go.
                    return
                # Decoded alone, as each watch event is: its strings shared when kept.
                self._events[key][meta.get("uid", "")] = interned(obj)
                self._event_keys[job_id].add(key)
            if self.listener is not None:
                self.listener(resource, kind, obj, job_id)

        return handle

    def _job_of_workload(self, namespace: str, workload: Obj) -> str | None:
        """Our job whose Workload this is: Kueue makes one per Job, owned by it."""
        for ref in (workload.get("metadata") or {}).get("ownerReferences") or []:
            if ref.get("kind") == "Job" and str(ref.get("apiVersion", "")).startswith("batch/"):
                return self._job_by_name.get((namespace, ref.get("name") or ""))
        return None

    def _job_of_pod_name(self, key: tuple[str, str]) -> str | None:
        """Our job whose Pod this name is, from the name alone (the Job controller
        names a Pod `<job>-<random>`, or `<job>-<index>-<random>` when indexed): an
        event about a Pod this cache never saw (gone before it started) still tells
        why that attempt ended, as it does in a dump."""
        ns, name = key
        for cut in (1, 2):
            parts = name.rsplit("-", cut)
            if len(parts) == cut + 1:
                job_id = self._job_by_name.get((ns, parts[0]))
                if job_id is not None:
                    return job_id
        return None

    async def run(self) -> None:
        # Events are routed by the Job or Pod they name, so they are listed only once
        # the Jobs and Pods are: an Event listed first would be dropped as not ours
        # (and a Job controller's "Created pod" lost for good, though a dump holds it).
        others = [
            r for name, r in self.reflectors.items() if name != "events" and name not in _KUEUE
        ]
        running = [asyncio.create_task(r.run()) for r in others]
        running.append(asyncio.create_task(self._run_kueue()))
        try:
            await asyncio.gather(*(self.reflectors[n].synced.wait() for n in ("jobs", "pods")))
            running.append(asyncio.create_task(self.reflectors["events"].run()))
            await asyncio.gather(*running)
        finally:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    async def discover_kueue(self) -> str | None:
        """The version of Kueue's API the cluster serves; None when it is not installed."""
        return await served_version(self.http, KUEUE_GROUP)

    async def _run_kueue(self) -> None:
        """Watch Kueue's kinds at the version the cluster serves, once it serves one.
        Until then they count as listed (empty), so that readiness does not wait on a
        Kueue that is not there, and the group is looked for again every few minutes."""
        delay = 0.5
        while True:
            try:
                version = await self.discover_kueue()
            except (httpx.HTTPError, OSError, ValueError) as exc:
                log.warning("cannot read the %s API group, retrying: %s", KUEUE_GROUP, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
                continue
            if version is not None:
                break
            if not self.notes:
                note = (
                    f"Kueue is not installed (the cluster serves no {KUEUE_GROUP} API): "
                    "its Workloads and queues are not watched"
                )
                log.info("%s", note)
                self.notes.append(note)
            for name in _KUEUE:
                self.reflectors[name].synced.set()
            await asyncio.sleep(KUEUE_RECHECK)
        if self.notes:
            log.info("Kueue is installed now: watching its Workloads and queues")
        self.notes.clear()
        for name in _KUEUE:
            reflector = self.reflectors[name]
            reflector.path = reflector.path.replace(
                f"/{KUEUE_GROUP}/{KUEUE_VERSION}/", f"/{KUEUE_GROUP}/{version}/"
            )
            self.kinds[name] = (f"{KUEUE_GROUP}/{version}", self.kinds[name][1])
        await asyncio.gather(*(self.reflectors[name].run() for name in _KUEUE))

    async def wait_synced(self, timeout: float = 30.0) -> None:
        await asyncio.wait_for(
            asyncio.gather(*(r.synced.wait() for r in self.reflectors.values())), timeout
        )

    def jobs(self) -> list[Obj]:
        """Our Jobs, but for those finished, recorded and forgotten."""
        return list(self._jobs.values())

    def job(self, namespace: str, name: str) -> Obj | None:
        return self._jobs.get((namespace, name))

    def unplaced(self) -> list[Obj]:
        """Our Jobs (unfinished or not) with a Pod the scheduler found no room for
        (PodScheduled False): room freed or taken on the nodes can change its verdict. A
        Pod not tried yet will be, and says so itself; one placed waits on its node, not
        on room. Only the jobs with Pods are looked at: through a backlog, most of the
        Jobs made have none yet, and room changes many times a second."""
        out = []
        for job_id in self._unplaced:
            key = self._job_keys.get(job_id)
            job = self._jobs.get(key) if key is not None else None
            if job is not None:
                out.append(job)
        return out

    def _note_unplaced(self, job_id: str) -> None:
        if any(
            c.get("type") == "PodScheduled" and c.get("status") == "False"
            for pod in self._pods.get(job_id, {}).values()
            for c in (pod.get("status") or {}).get("conditions") or ()
        ):
            self._unplaced.add(job_id)
        else:
            self._unplaced.discard(job_id)

    def listing(self) -> dict[str, Any]:
        """Everything cached, as one `List`: the syncer diagnoses a whole batch of
        jobs from it (`Snapshot.for_job` narrows it per job while node usage
        still counts every Pod), instead of re-reading every node per job."""
        items: list[Obj] = [self._typed("jobs", o) for o in self._jobs.values()]
        items += [self._typed("pods", o) for pods in self._pods.values() for o in pods.values()]
        items += [
            self._typed(r, o) for r in ("nodes", *_WHOLE) for o in self.reflectors[r].items.values()
        ]
        items += [self._typed("events", e) for kept in self._events.values() for e in kept.values()]
        items += self._claim_event_items()
        return {"apiVersion": "v1", "kind": "List", "items": items}

    def _claim_event_items(self) -> list[Obj]:
        return [
            self._typed("events", e) for kept in self._claim_events.values() for e in kept.values()
        ]

    def snapshot(self, job_ids: Iterable[str]) -> Snapshot:
        """A snapshot to diagnose these jobs: their Jobs, Pods and kept Events, every
        Node and every object of the kinds held whole, and the node usage the cache
        keeps. For these jobs, `for_job` reads the same as from `listing()`, at the
        cost of their own objects instead of the cluster's."""
        items: list[Obj] = []
        for job_id in job_ids:
            key = self._job_keys.get(job_id)
            job = self._jobs.get(key) if key is not None else None
            if job is not None:
                items.append(self._typed("jobs", job))
            items += (self._typed("pods", pod) for pod in self._pods.get(job_id, {}).values())
            for involved in self._event_keys.get(job_id, ()):
                items += (self._typed("events", e) for e in self._events.get(involved, {}).values())
        items += self._claim_event_items()
        for resource in _WHOLE:
            items += (self._typed(resource, o) for o in self.reflectors[resource].items.values())
        snapshot = Snapshot.from_list({"apiVersion": "v1", "kind": "List", "items": items})
        # The diagnosis reads Nodes parsed, from the node state; no need to copy each.
        if self._typed_nodes is None:
            nodes = self.reflectors["nodes"].items.values()
            self._typed_nodes = tuple(self._typed("nodes", o) for o in nodes)
        return dataclasses.replace(snapshot, nodes=self._typed_nodes, node_state=self.node_state())

    def _typed(self, resource: str, obj: Obj) -> Obj:
        # Watch and list items carry no apiVersion/kind; a List's items do.
        api_version, kind = self.kinds[resource]
        if obj.get("kind") == kind:
            return obj
        return {"apiVersion": api_version, "kind": kind, **obj}

    def _claim(self, uid: str, claim: tuple[str, dict[str, Decimal]] | None) -> bool:
        """Record what a Pod holds on its node (None: nothing, or gone); True when that
        changed (room taken or freed)."""
        before = self._bound.get(uid)
        if before == claim:
            return False
        if before is not None:
            self._by_node[before[0]].discard(uid)
            self._stale_usage.add(before[0])
            del self._bound[uid]
        if claim is not None:
            self._bound[uid] = claim
            self._by_node[claim[0]].add(uid)
            self._stale_usage.add(claim[0])
        self._node_state = None
        return True

    def node_state(self) -> NodeState:
        """Nodes and their usage, recomputed only for what changed since the last call."""
        for node in self._stale_usage:
            total: dict[str, Decimal] = {}
            for uid in self._by_node.get(node, ()):
                for key, value in self._bound[uid][1].items():
                    total[key] = total.get(key, Decimal(0)) + value
            if total or self._by_node.get(node):
                self._usage[node] = total
            else:
                self._usage.pop(node, None)
                self._by_node.pop(node, None)
        self._stale_usage.clear()
        if self._nodes is None:
            self._nodes = NodeState.of_nodes(self._parsed.values())
        if self._node_state is None:
            # A copy of the outer dict only: a node's totals are replaced, never changed.
            self._node_state = self._nodes.using(dict(self._usage))
        return self._node_state

    def forget(self, namespace: str, k8s_name: str, pod_names: list[str]) -> None:
        """Drop what is kept of a job once it is finished and recorded: its events, and
        its Job and Pods but for a stub in their reflectors (what a relist compares).
        A finished job's objects rarely change again; if one does, it is kept anew."""
        for involved in [k8s_name, *pod_names]:
            self._events.pop((namespace, involved), None)
        job = self._jobs.pop((namespace, k8s_name), None)
        if job is not None:
            self.reflectors["jobs"].stub(job["metadata"].get("uid", ""))
        job_id = self._job_by_name.get((namespace, k8s_name))
        if job_id is not None:
            self._event_keys.pop(job_id, None)
            self._stub_pods(job_id)

    def forget_again(self, job_id: str) -> bool:
        """Drop what the cache took in of a job after `forget`: an Event that came late
        (the watches run apart: the Job controller's `Completed` often arrives after the
        job is recorded), or a Job or Pod that changed again. Kept, they stayed for good:
        the syncer reads no finished job again. True if anything was held."""
        held = False
        for involved in self._event_keys.pop(job_id, ()):
            held |= self._events.pop(involved, None) is not None
        key = self._job_keys.get(job_id)
        job = self._jobs.pop(key, None) if key is not None else None
        if job is not None:
            held = True
            self.reflectors["jobs"].stub(job["metadata"].get("uid", ""))
        return self._stub_pods(job_id) or held

    def _stub_pods(self, job_id: str) -> bool:
        """The job's Pods let go but for their stubs, and what the diagnosis read of
        them; True if any was held."""
        pods = self._pods.pop(job_id, {})
        self._unplaced.discard(job_id)
        for uid in pods:
            self.reflectors["pods"].stub(uid)
        forget_pods(pods)
        return bool(pods)
