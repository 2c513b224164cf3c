"""The snapshot the diagnosis reads: plain Kubernetes objects, indexed once.

Its input is what `kubectl get job,pods,events,nodes,pvc,resourcequota -o json`
prints (a v1 `List`), and the live path (the syncer's watch caches) builds the
same thing, so a dump and the server give the same answer. Objects stay the
dicts the API returns; `Snapshot.index` groups them (Pods by Job and by node,
Events by the object they are about, Nodes parsed with what is requested on
them) once per snapshot, so diagnosing one job among 10,000 Pods looks up its
own objects instead of scanning.

Errors:

    * ValueError
      x SnapshotError     the input is not a List or an object at all

Items a snapshot cannot use (unknown kinds, non-objects) are skipped and said
in `Snapshot.skipped`; fields of the wrong type read as absent (objects.py).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from functools import cached_property
from typing import Any

from kubetrain.domain.nodes import NodeInfo, Taint, parse_node, pod_requests
from kubetrain.domain.objects import as_list, as_map, get, labels, meta_name, meta_namespace, text
from kubetrain.errors import KubetrainError

__all__ = [
    "JOB_NAME_LABELS",
    "NodeState",
    "Snapshot",
    "SnapshotError",
    "SnapshotIndex",
    "bound_requests",
]

# The labels the Job controller puts on its Pods (the short one before 1.27).
JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")

_KINDS: dict[str, str] = {
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
# API groups each kind must come from when the object names one; a `Job` of
# another group (a JobSet's, a CI system's) is not a batch/v1 Job.
_GROUPS: dict[str, frozenset[str]] = {
    "Job": frozenset({"batch"}),
    "Pod": frozenset({""}),
    "Event": frozenset({"", "events.k8s.io"}),
    "Node": frozenset({""}),
    "PersistentVolumeClaim": frozenset({""}),
    "PersistentVolume": frozenset({""}),
    "StorageClass": frozenset({"storage.k8s.io"}),
    "ResourceQuota": frozenset({""}),
    "LimitRange": frozenset({""}),
    "PriorityClass": frozenset({"scheduling.k8s.io"}),
    "Workload": frozenset({"kueue.x-k8s.io"}),
    "ClusterQueue": frozenset({"kueue.x-k8s.io"}),
    "LocalQueue": frozenset({"kueue.x-k8s.io"}),
    "ResourceFlavor": frozenset({"kueue.x-k8s.io"}),
}
_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
_CLUSTER_SCOPED = frozenset(
    {"Node", "PersistentVolume", "StorageClass", "PriorityClass", "ClusterQueue", "ResourceFlavor"}
)


class SnapshotError(KubetrainError, ValueError):
    """The input is not a Kubernetes List or object; the message says what it is."""


def _group(api_version: object) -> str | None:
    if not isinstance(api_version, str):
        return None
    return api_version.split("/", 1)[0] if "/" in api_version else ""


def _core_event(event: Mapping[str, Any]) -> dict[str, Any]:
    """An events.k8s.io/v1 Event in the core/v1 shape the diagnosis reads."""
    regarding = as_map(event, "regarding")
    series = as_map(event, "series")
    converted: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": dict(as_map(event, "metadata")),
        "involvedObject": dict(regarding),
        "reason": event.get("reason"),
        "message": event.get("note"),
        "type": event.get("type"),
        "eventTime": event.get("eventTime"),
        "firstTimestamp": event.get("deprecatedFirstTimestamp"),
        "lastTimestamp": series.get("lastObservedTime") or event.get("deprecatedLastTimestamp"),
        "count": series.get("count") or event.get("deprecatedCount"),
        "source": {"component": event.get("reportingController")},
    }
    return {k: v for k, v in converted.items() if v is not None}


def _identity(kind: str, obj: Mapping[str, Any]) -> tuple[str, str, str, str]:
    uid = text(obj, "metadata", "uid") or ""
    return (kind, meta_namespace(obj), meta_name(obj) or "", uid)


@dataclass(frozen=True)
class NodeState:
    """The Nodes parsed and what the Pods bound to each request: the part of an index
    that reads the whole cluster. A live cache keeps it up to date event by event
    (cluster/cache.py), so that a snapshot of a few jobs needs neither every Pod
    nor a fresh parse of every Node; `SnapshotIndex` computes the same from a dump.
    """

    nodes: tuple[NodeInfo, ...]  # sorted by name
    usage: Mapping[str, Mapping[str, Decimal]]
    problems: tuple[str, ...] = ()

    @classmethod
    def of(
        cls, parsed: Iterable[NodeInfo | None], usage: Mapping[str, Mapping[str, Decimal]]
    ) -> NodeState:
        """From `parse_node`'s results (None: a Node without a name) and the usage."""
        return cls.of_nodes(parsed).using(usage)

    @classmethod
    def of_nodes(cls, parsed: Iterable[NodeInfo | None]) -> NodeState:
        """The Nodes alone, no usage: what changes only when a Node does (`using` adds
        the usage, which changes with every Pod bound or ended)."""
        problems: list[str] = []
        nodes = []
        # Nodes of one pool share one allocatable and one taints object, and equal
        # usage one mapping: the fit analysis groups nodes by identity before it
        # compares values (hashing Decimals per node was most of its cost).
        allocatables: dict[tuple[tuple[str, Decimal], ...], Mapping[str, Decimal]] = {}
        taints: dict[tuple[Taint, ...], tuple[Taint, ...]] = {}
        for info in parsed:
            if info is None:
                problems.append("a Node without a name was left out")
                continue
            nodes.append(
                replace(
                    info,
                    allocatable=allocatables.setdefault(
                        tuple(sorted(info.allocatable.items())), info.allocatable
                    ),
                    taints=taints.setdefault(info.taints, info.taints),
                )
            )
            problems.extend(info.problems)
        return cls(tuple(sorted(nodes, key=lambda n: n.name)), {}, tuple(problems))

    def using(self, usage: Mapping[str, Mapping[str, Decimal]]) -> NodeState:
        """These Nodes with this usage, equal usages one mapping (as allocatables)."""
        shared: dict[tuple[tuple[str, Decimal], ...], Mapping[str, Decimal]] = {}
        interned = {
            node: shared.setdefault(tuple(sorted(used.items())), used)
            for node, used in usage.items()
        }
        return NodeState(self.nodes, interned, self.problems)


def bound_requests(pod: Mapping[str, Any]) -> tuple[str, dict[str, Decimal]] | None:
    """(node, requests) that the Pod holds on its node, or None: the scheduler counts
    every Pod bound to a node and not yet Succeeded/Failed, terminating ones included,
    until it is gone."""
    node = text(pod, "spec", "nodeName")
    if not node or text(pod, "status", "phase") in _TERMINAL_PHASES:
        return None
    return node, pod_requests(get(pod, "spec"))


@dataclass(frozen=True)
class Snapshot:
    """Plain Kubernetes objects (dicts as the API returns them), by kind."""

    jobs: tuple[dict[str, Any], ...]
    pods: tuple[dict[str, Any], ...]
    events: tuple[dict[str, Any], ...]
    nodes: tuple[dict[str, Any], ...]
    pvcs: tuple[dict[str, Any], ...] = ()
    pvs: tuple[dict[str, Any], ...] = ()
    storage_classes: tuple[dict[str, Any], ...] = ()
    quotas: tuple[dict[str, Any], ...] = ()
    limit_ranges: tuple[dict[str, Any], ...] = ()
    priority_classes: tuple[dict[str, Any], ...] = ()
    # Kueue's: every Workload (a job's place in its queue is among the others'), its
    # ClusterQueues, LocalQueues and ResourceFlavors.
    workloads: tuple[dict[str, Any], ...] = ()
    cluster_queues: tuple[dict[str, Any], ...] = ()
    local_queues: tuple[dict[str, Any], ...] = ()
    resource_flavors: tuple[dict[str, Any], ...] = ()
    # What from_list could not use, in words ("2 objects of kinds kubetrain does
    # not read: Deployment, Service").
    skipped: tuple[str, ...] = ()
    # The snapshot this one was narrowed from (for_job): node usage counts the
    # Pods of every job, so a narrowed snapshot reads it from the whole one.
    base: Snapshot | None = field(default=None, repr=False, compare=False)
    # Given by a live cache that keeps it (NodeState); then `pods` need only hold
    # the Pods of the jobs to diagnose, since node usage comes from here.
    node_state: NodeState | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_list(cls, data: object) -> Snapshot:
        """A snapshot from a v1 List (or a typed list, or one object)."""
        return cls.from_lists([data])

    @classmethod
    def from_lists(cls, documents: Iterable[object]) -> Snapshot:
        """One snapshot from several Lists (files), merged; a repeated object counts once."""
        sorted_items: dict[str, dict[tuple[str, str, str, str], dict[str, Any]]] = {
            name: {} for name in _KINDS.values()
        }
        unknown: dict[str, int] = defaultdict(int)
        unreadable: dict[str, int] = defaultdict(int)
        not_objects = 0
        for number, document in enumerate(documents, 1):
            for item, list_kind in _items(document, number):
                if not isinstance(item, Mapping):
                    not_objects += 1
                    continue
                kind = item.get("kind")
                if not isinstance(kind, str) and list_kind:
                    kind = list_kind
                if not isinstance(kind, str) or not kind:
                    not_objects += 1
                    continue
                group = _group(item.get("apiVersion"))
                if kind not in _KINDS or (group is not None and group not in _GROUPS[kind]):
                    unknown[f"{kind} ({item.get('apiVersion')})" if group else kind] += 1
                    continue
                if not _readable_metadata(item, namespaced=kind not in _CLUSTER_SCOPED):
                    # Never diagnose an object with no name: skip it, with a note.
                    unreadable[kind] += 1
                    continue
                obj = dict(item)
                if kind == "Event" and group == "events.k8s.io":
                    obj = _core_event(obj)
                sorted_items[_KINDS[kind]][_identity(kind, obj)] = obj
        skipped = []
        if unknown:
            kinds = ", ".join(f"{k} ({n})" if n > 1 else k for k, n in sorted(unknown.items()))
            total = sum(unknown.values())
            skipped.append(
                f"{total} object{'s' * (total != 1)} of kinds kubetrain does not read: {kinds}"
            )
        if unreadable:
            kinds = ", ".join(f"{k} ({n})" if n > 1 else k for k, n in sorted(unreadable.items()))
            total = sum(unreadable.values())
            skipped.append(
                f"{total} object{'s' * (total != 1)} without a readable metadata "
                f"(a name, and a namespace where the kind has one): {kinds}"
            )
        if not_objects:
            skipped.append(
                f"{not_objects} item{'s' * (not_objects != 1)} that "
                f"{'are' if not_objects != 1 else 'is'} not a Kubernetes object (no kind)"
            )
        grouped = {name: tuple(objs.values()) for name, objs in sorted_items.items()}
        return cls(
            jobs=grouped["jobs"],
            pods=grouped["pods"],
            events=grouped["events"],
            nodes=grouped["nodes"],
            pvcs=grouped["pvcs"],
            pvs=grouped["pvs"],
            storage_classes=grouped["storage_classes"],
            quotas=grouped["quotas"],
            limit_ranges=grouped["limit_ranges"],
            priority_classes=grouped["priority_classes"],
            workloads=grouped["workloads"],
            cluster_queues=grouped["cluster_queues"],
            local_queues=grouped["local_queues"],
            resource_flavors=grouped["resource_flavors"],
            skipped=tuple(skipped),
        )

    @cached_property
    def index(self) -> SnapshotIndex:
        return SnapshotIndex(self)

    def job(self, job_name: str, namespace: str) -> dict[str, Any] | None:
        return self.index.jobs.get((namespace, job_name))

    def for_job(self, job_name: str, namespace: str) -> Snapshot:
        """Narrowed to one Job: its Pods, Events, Workloads; all Nodes and Kueue queues;
        the namespace's quotas, PVCs and LimitRanges. Node usage and the queues' other
        Workloads (`index.all_workloads`) are still those of `self`."""
        root = self.base or self
        idx = root.index
        key = (namespace, job_name)
        job = idx.jobs.get(key)
        pods = tuple(idx.pods_by_job.get(key, ()))
        workloads = tuple(idx.workloads_by_job.get(key, ()))
        events: list[dict[str, Any]] = []
        # The narrowed index's events by object are the whole one's lists for the
        # objects taken, the very lists (read only, never changed): given to it rather
        # than grouped again (a gang of 256 ranks has ~1,000 events). An event is about
        # one object: each is taken once.
        taken: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
        by_object = idx.events_by_object

        def take(kind: str, name: str | None) -> None:
            if name:
                found = by_object.get((kind, namespace, name))
                if found and (kind, namespace, name) not in taken:
                    taken[(kind, namespace, name)] = found
                    events.extend(found)

        take("Job", job_name)
        # Per Pod (a gang's hundreds of ranks): its events and its claims, read inline.
        claims: set[str] = set()
        for pod in pods:
            meta, spec = pod.get("metadata"), pod.get("spec")
            name = meta.get("name") if type(meta) is dict else meta_name(pod)
            if type(name) is str and name:
                object_key = ("Pod", namespace, name)
                found = by_object.get(object_key)
                if found and object_key not in taken:
                    taken[object_key] = found
                    events.extend(found)
            volumes = spec.get("volumes") if type(spec) is dict else as_list(pod, "spec", "volumes")
            if type(volumes) is list:
                for volume in volumes:
                    if type(volume) is not dict or "persistentVolumeClaim" in volume:
                        claim = text(volume, "persistentVolumeClaim", "claimName")
                        if claim:
                            claims.add(claim)
        # Pods already deleted are named by the Job controller's events.
        for name in idx.created_pods.get(key, ()):
            if ("Pod", namespace, name) not in taken:
                take("Pod", name)
        if not pods and job:
            for volume in as_list(job, "spec", "template", "spec", "volumes"):
                if type(volume) is dict and "persistentVolumeClaim" not in volume:
                    continue  # most volumes: no claim to read
                claim = text(volume, "persistentVolumeClaim", "claimName")
                if claim:
                    claims.add(claim)
        for claim in claims:
            take("PersistentVolumeClaim", claim)
        for workload in workloads:
            take("Workload", meta_name(workload))
        narrowed = Snapshot(
            jobs=(job,) if job else (),
            pods=pods,
            events=tuple(events),
            nodes=root.nodes,
            pvcs=tuple(idx.pvcs_by_ns.get(namespace, ())),
            pvs=root.pvs,
            storage_classes=root.storage_classes,
            quotas=tuple(idx.quotas_by_ns.get(namespace, ())),
            limit_ranges=tuple(idx.limit_ranges_by_ns.get(namespace, ())),
            priority_classes=root.priority_classes,
            workloads=workloads,
            cluster_queues=root.cluster_queues,
            local_queues=root.local_queues,
            resource_flavors=root.resource_flavors,
            skipped=root.skipped,
            base=root,
        )
        created = idx.created_pods.get(key)
        seed = _Seed(
            pods_by_job={key: list(pods)} if pods else {},
            events_by_object=taken,
            created_pods={key: list(created)} if created else {},
        )
        # cached_property's own slot: the index is this one, not one built again.
        narrowed.__dict__["index"] = SnapshotIndex(narrowed, seed)
        return narrowed


def _readable_metadata(item: Mapping[str, Any], *, namespaced: bool) -> bool:
    """A name, and a namespace where the kind has one (as every dump of kubectl has)."""
    meta = item.get("metadata")
    if not isinstance(meta, Mapping):
        return False
    name, namespace = meta.get("name"), meta.get("namespace")
    if not namespaced:
        return isinstance(name, str) and bool(name)
    return isinstance(name, str) and bool(name) and isinstance(namespace, str) and bool(namespace)


def _items(document: object, number: int) -> Iterable[tuple[object, str | None]]:
    where = f"document {number}"
    if isinstance(document, list):
        raise SnapshotError(
            f"{where} is a JSON/YAML array; expected a Kubernetes List "
            "(what `kubectl get ... -o json` prints: an object with kind List and items)"
        )
    if not isinstance(document, Mapping):
        raise SnapshotError(
            f"{where} is {type(document).__name__ if document is not None else 'empty'}; "
            "expected a Kubernetes List (an object with kind List and items)"
        )
    kind = document.get("kind")
    if "items" in document:
        items = document.get("items")
        if items is None:  # an empty List serialised by Go: "items": null
            return
        if not isinstance(items, list):
            raise SnapshotError(f"{where}: items is {type(items).__name__}, expected a list")
        list_kind = (
            kind[: -len("List")] if isinstance(kind, str) and kind.endswith("List") else None
        )
        for item in items:
            if isinstance(item, Mapping) and "items" in item and item.get("kind") == "List":
                yield from ((inner, None) for inner in as_list(item, "items"))
            else:
                yield item, list_kind or None
        return
    if isinstance(kind, str) and kind and isinstance(document.get("metadata"), Mapping):
        yield document, None
        return
    keys = ", ".join(sorted(str(k) for k in document)[:6]) or "none"
    raise SnapshotError(
        f"{where} is not a Kubernetes List or object (its keys: {keys}); "
        "expected what `kubectl get ... -o json` prints"
    )


def _owner_job(pod: Mapping[str, Any]) -> str | None:
    for ref in as_list(pod, "metadata", "ownerReferences"):
        if text(ref, "kind") == "Job" and (text(ref, "apiVersion") or "batch/").startswith(
            "batch/"
        ):
            name = text(ref, "name")
            if name:
                return name
    found = labels(pod)
    for label in JOB_NAME_LABELS:
        if found.get(label):
            return found[label]
    return None


def _pvc_key(obj: Mapping[str, Any]) -> tuple[str, str]:
    return meta_namespace(obj), meta_name(obj) or ""


@dataclass(frozen=True)
class _Seed:
    """What a narrowed snapshot's index takes from the whole one's (`for_job`): the
    same groups its own objects would give, without reading each object again."""

    pods_by_job: dict[tuple[str, str], list[dict[str, Any]]]
    events_by_object: dict[tuple[str, str, str], list[dict[str, Any]]]
    created_pods: dict[tuple[str, str], list[str]]


class SnapshotIndex:
    """Lookups built once per snapshot (see the module docstring)."""

    def __init__(self, snap: Snapshot, seed: _Seed | None = None) -> None:
        self.problems: list[str] = []
        self.jobs: dict[tuple[str, str], dict[str, Any]] = {}
        for job in snap.jobs:
            name = meta_name(job)
            if name:
                self.jobs[(meta_namespace(job), name)] = job
        self.pods_by_job: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        self.events_by_object: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
        # Pod names from the Job controller's "Created pod: NAME" events: the
        # attempts whose Pods are gone (deadline, garbage collection).
        self.created_pods: dict[tuple[str, str], list[str]] = defaultdict(list)
        if seed is not None:
            self.pods_by_job.update(seed.pods_by_job)
            self.events_by_object.update(seed.events_by_object)
            self.created_pods.update(seed.created_pods)
        else:
            self._group(snap)
        self._rest(snap)

    def _group(self, snap: Snapshot) -> None:
        """Pods by their Job, events by their object, the Pods the Job controller made."""
        for pod in snap.pods:
            owner = _owner_job(pod)
            if owner:
                self.pods_by_job[(meta_namespace(pod), owner)].append(pod)
        for event in snap.events:
            involved = as_map(event, "involvedObject")
            kind, name = text(involved, "kind"), text(involved, "name")
            if not kind or not name:
                continue
            namespace = text(involved, "namespace") or meta_namespace(event)
            self.events_by_object[(kind, namespace, name)].append(event)
            message = text(event, "message") or ""
            if (
                kind == "Job"
                and text(event, "reason") == "SuccessfulCreate"
                and message.startswith("Created pod: ")
            ):
                self.created_pods[(namespace, name)].append(message[len("Created pod: ") :])

    def _rest(self, snap: Snapshot) -> None:
        # By the owning Job's name (a Job gone, or a dump without uids) and by its uid: a
        # gang's attempts are Jobs of one name, and the Workload of an ended attempt
        # lingers until the garbage collector removes it (readers match by uid first).
        self.workloads_by_job: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        self.workloads_by_job_uid: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for workload in snap.workloads:
            for ref in as_list(workload, "metadata", "ownerReferences"):
                if text(ref, "kind") == "Job" and text(ref, "name"):
                    self.workloads_by_job[
                        (meta_namespace(workload), str(text(ref, "name")))
                    ].append(workload)
                    if text(ref, "uid"):
                        self.workloads_by_job_uid[str(text(ref, "uid"))].append(workload)
        self.pvcs_by_ns: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.pvcs: dict[tuple[str, str], dict[str, Any]] = {}
        for pvc in snap.pvcs:
            self.pvcs_by_ns[meta_namespace(pvc)].append(pvc)
            self.pvcs[_pvc_key(pvc)] = pvc
        self.pvs = {meta_name(pv) or "": pv for pv in snap.pvs}
        self.storage_classes = {meta_name(sc) or "": sc for sc in snap.storage_classes}
        self.priority_classes = {meta_name(pc) or "": pc for pc in snap.priority_classes}
        self.quotas_by_ns: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for quota in snap.quotas:
            self.quotas_by_ns[meta_namespace(quota)].append(quota)
        self.limit_ranges_by_ns: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for limit_range in snap.limit_ranges:
            self.limit_ranges_by_ns[meta_namespace(limit_range)].append(limit_range)
        self.cluster_queues = {meta_name(cq) or "": cq for cq in snap.cluster_queues}
        self.local_queues = {
            (meta_namespace(lq), meta_name(lq) or ""): lq for lq in snap.local_queues
        }
        self.resource_flavors = {meta_name(rf) or "": rf for rf in snap.resource_flavors}
        if snap.base is not None:
            base = snap.base.index
            self.all_workloads: tuple[dict[str, Any], ...] = base.all_workloads
            self.nodes: tuple[NodeInfo, ...] = base.nodes
            self.usage: Mapping[str, Mapping[str, Decimal]] = base.usage
        else:
            self.all_workloads = snap.workloads
            state = snap.node_state or NodeState.of(map(parse_node, snap.nodes), _usage(snap))
            self.nodes, self.usage = state.nodes, state.usage
            self.problems.extend(state.problems)


def _usage(snap: Snapshot) -> dict[str, dict[str, Decimal]]:
    """What the Pods bound to each node request (see `bound_requests`)."""
    usage: dict[str, dict[str, Decimal]] = defaultdict(dict)
    for pod in snap.pods:
        bound = bound_requests(pod)
        if bound is None:
            continue
        requested = usage[bound[0]]
        for key, value in bound[1].items():
            requested[key] = requested.get(key, Decimal(0)) + value
    return usage
