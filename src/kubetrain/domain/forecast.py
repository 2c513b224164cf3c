"""What a job would meet if it were submitted now: a forecast, writing nothing.

`forecast(job, facts, snapshot, now)` plays, on plain data, the first moments
Kubernetes would give the rendered batch/v1 Job, then asks the one
`diagnose()` what holds it, exactly as it would ask of the live objects:

1. Kueue (a `kueue.x-k8s.io/queue-name` label): the Workload Kueue would make,
   admitted when its ClusterQueue's unused quota holds the request, else
   `QuotaReserved=False` with Kueue's own wording (`Pending`: `insufficient
   unused quota … N more needed`, `insufficient quota … request > maximum
   capacity`; `Inadmissible` for a missing or inactive queue). Admitted, the
   Job runs on, with the flavor's node labels in its Pods' nodeSelector.
2. ResourceQuota admission, one Pod per worker in order as the Job controller
   creates them: a Pod the namespace's quotas refuse is the Job's
   `FailedCreate` event with the API server's message.
3. The scheduler, per created Pod: the fit table (domain/fit.py) over the
   nodes less what is bound there and what the workers placed before took;
   a Pod that fits is bound to a fitting node (the closest row that fits: the
   scheduler's scoring may pick another fitting node), one that does not gets
   `PodScheduled=False` with the scheduler's `0/N nodes are available: …`
   written from the same table (a missing or unbound claim: its PreFilter verdict).

The verdict: every worker bound, `starts-now`; else `waits` when waiting can
help by the diagnosis (`waitable` true or unknown) and `never-fits` when it
cannot. For `waits` it names what holds what the job needs: the jobs whose
Pods hold the short resource on the nodes that only lack free resources, the
namespace's Pods a quota counts, or the Workloads a ClusterQueue admitted,
each with the time its `activeDeadlineSeconds` (spec.maxRuntime) ends it.

Pure: no I/O, `now` is passed in.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from enum import StrEnum
from typing import Any

from kubetrain.domain.diagnosis import Diagnosis, JobFacts, diagnose
from kubetrain.domain.diagnosis.result import Blocker
from kubetrain.domain.fit import FitAnalysis, analyze_fit
from kubetrain.domain.nodes import pod_requests
from kubetrain.domain.objects import as_list, as_map, meta_name, meta_namespace, text, timestamp
from kubetrain.domain.quantity import QuantityError, format_quantity, parse_quantity
from kubetrain.domain.queues import flavor_quota, queued
from kubetrain.domain.scheduling import Filter
from kubetrain.domain.snapshot import NodeState, Snapshot, bound_requests
from kubetrain.domain.states import Link, ReasonCode

__all__ = ["Forecast", "Holder", "Placement", "Verdict", "forecast"]

R = ReasonCode
LABEL_QUEUE = "kueue.x-k8s.io/queue-name"
_INDEX = "batch.kubernetes.io/job-completion-index"
_TERMINAL = ("Succeeded", "Failed")
MAX_HOLDERS = 20  # a waiting job's answer names this many holders at most, soonest free first


class Verdict(StrEnum):
    STARTS_NOW = "starts-now"
    WAITS = "waits"
    NEVER_FITS = "never-fits"


@dataclass(frozen=True)
class Placement:
    rank: int
    node: str

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "node": self.node}


@dataclass(frozen=True)
class Holder:
    """A running job that holds what the forecast job waits for."""

    job: str  # the user's name (kubetrain.io/name), else the Kubernetes Job, else the Pod
    job_id: str | None  # kubetrain's, for a kubetrain job
    namespace: str
    kubernetes_job: str | None  # None: a Pod of no Job
    holds: Mapping[str, str]  # resource -> quantity it holds
    nodes: tuple[str, ...]
    # Its start plus activeDeadlineSeconds (a kubetrain job's spec.maxRuntime); None: no end known
    ends_by: datetime | None

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "job_id": self.job_id,
            "namespace": self.namespace,
            "kubernetes_job": self.kubernetes_job,
            "holds": dict(self.holds),
            "nodes": list(self.nodes),
            "ends_by": _iso(self.ends_by) if self.ends_by else None,
        }


@dataclass(frozen=True)
class Forecast:
    verdict: Verdict
    diagnosis: Diagnosis
    placements: tuple[Placement, ...] = ()  # starts-now: a node per worker
    # waits: who holds what it needs, soonest free first (the first MAX_HOLDERS of them)
    held_by: tuple[Holder, ...] = ()
    held_by_total: int = 0
    # waits under Kueue: the ClusterQueue, the position it would take (1: next), who is ahead
    queue: Mapping[str, Any] | None = None

    def to_json(self, job: str) -> dict[str, Any]:
        return {
            "verdict": str(self.verdict),
            "diagnosis": self.diagnosis.to_json(job),
            "placements": [p.to_json() for p in self.placements],
            "held_by": [h.to_json() for h in self.held_by],
            "held_by_total": self.held_by_total,
            "queue": dict(self.queue) if self.queue is not None else None,
        }


def forecast(
    job: Mapping[str, Any], facts: JobFacts, snapshot: Snapshot, now: datetime
) -> Forecast:
    """What the rendered Job `job` would meet if it were created now (module docstring)."""
    sim = _Simulation(copy.deepcopy(dict(job)), facts, snapshot, now)
    sim.run()
    hypothetical = sim.snapshot()
    diagnosis = diagnose(facts, hypothetical.for_job(facts.k8s_name, facts.namespace), now)
    if sim.placed and len(sim.placed) == sim.workers and not sim.refused:
        return Forecast(Verdict.STARTS_NOW, diagnosis, tuple(sim.placed))
    if diagnosis.waitable is False:
        return Forecast(Verdict.NEVER_FITS, diagnosis)
    primary = diagnosis.blockers[0] if diagnosis.blockers else None
    held, total = _holders(primary, sim, snapshot, MAX_HOLDERS)
    queue = None
    if primary is not None and primary.position is not None:
        queue = {
            "cluster_queue": primary.queue,
            "position": primary.position,
            "ahead": list(primary.ahead or ()),
        }
    return Forecast(Verdict.WAITS, diagnosis, held_by=held, held_by_total=total, queue=queue)


class _Simulation:
    def __init__(self, job: dict[str, Any], facts: JobFacts, base: Snapshot, now: datetime) -> None:
        self.job, self.facts, self.base = job, facts, base
        self.stamp = _iso(now)
        meta = self.job.setdefault("metadata", {})
        meta.setdefault("namespace", facts.namespace)
        meta["uid"] = f"forecast-{facts.k8s_name}"
        meta["creationTimestamp"] = self.stamp
        self.job["status"] = {}
        spec = as_map(self.job, "spec")
        parallelism = spec.get("parallelism")
        self.workers = parallelism if isinstance(parallelism, int) and parallelism > 0 else 1
        self.indexed = spec.get("completionMode") == "Indexed"
        self.pods: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.workloads: list[dict[str, Any]] = []
        self.placed: list[Placement] = []
        self.refused = False
        # Copied per node only where a worker is placed: the fit analysis groups nodes
        # by the identity of their usage mappings, so shared ones stay shared.
        self.usage: dict[str, Mapping[str, Decimal]] = dict(base.index.usage)
        self.extra_selector: dict[str, str] = {}

    # -- Kueue -----------------------------------------------------------------

    def _kueue(self, queue_name: str) -> bool:
        """Make the Workload Kueue would; whether it admits the job now."""
        ns = self.facts.namespace
        index = self.base.index
        template = as_map(self.job, "spec", "template")
        requests = pod_requests(as_map(template, "spec"))
        requests.pop("pods", None)
        total = {r: v * self.workers for r, v in requests.items()}
        workload: dict[str, Any] = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "metadata": {
                "name": f"job-{self.facts.k8s_name}-forecast",
                "namespace": ns,
                "uid": f"forecast-workload-{self.facts.k8s_name}",
                "creationTimestamp": self.stamp,
                "labels": {"kueue.x-k8s.io/job-uid": self.job["metadata"]["uid"]},
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": self.facts.k8s_name,
                        "uid": self.job["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "active": True,
                "queueName": queue_name,
                "priority": 0,
                "podSets": [{"name": "main", "count": self.workers, "template": template}],
            },
            "status": {
                "resourceRequests": [
                    {"name": "main", "resources": {r: format_quantity(v) for r, v in total.items()}}
                ]
            },
        }
        self.workloads.append(workload)
        local = index.local_queues.get((ns, queue_name))
        cq_name = text(local, "spec", "clusterQueue") if local else None
        cluster_queue = index.cluster_queues.get(cq_name or "")
        if local is None:
            return self._pending(workload, "Inadmissible", f"LocalQueue {queue_name} doesn't exist")
        if cluster_queue is None:
            return self._pending(workload, "Inadmissible", f"ClusterQueue {cq_name} doesn't exist")
        if _stopped(local) or _stopped(cluster_queue) or not _active(cluster_queue):
            return self._pending(workload, "Inadmissible", f"ClusterQueue {cq_name} is inactive")
        reserved: dict[tuple[str, str], Decimal] = {}
        for other in index.all_workloads:
            seen = queued(other, index.local_queues)
            if seen.reserved and not seen.finished and seen.cluster_queue == cq_name:
                for key, amount in seen.reserves.items():
                    reserved[key] = reserved.get(key, Decimal(0)) + amount
        flavors: dict[str, str] = {}
        for resource, need in total.items():
            flavor = _flavor_of(cluster_queue, resource)
            if flavor is None:
                return self._pending(
                    workload,
                    "Pending",
                    f"couldn't assign flavors to pod set main: resource {resource} unavailable "
                    f"in ClusterQueue",
                )
            quota = flavor_quota(cluster_queue, flavor, resource)
            most = quota.most if quota is not None else None
            nominal = quota.nominal if quota is not None else None
            if most is not None and need > most:
                return self._pending(
                    workload,
                    "Pending",
                    f"couldn't assign flavors to pod set main: insufficient quota for {resource} "
                    f"in flavor {flavor}, request > maximum capacity ({format_quantity(need)} > "
                    f"{format_quantity(most)})",
                )
            used = reserved.get((flavor, resource), Decimal(0))
            bound = most if most is not None else nominal
            if bound is not None and used + need > bound:
                return self._pending(
                    workload,
                    "Pending",
                    f"couldn't assign flavors to pod set main: insufficient unused quota for "
                    f"{resource} in flavor {flavor}, {format_quantity(used + need - bound)} "
                    "more needed",
                )
            flavors[resource] = flavor
        workload["status"]["admission"] = {
            "clusterQueue": cq_name,
            "podSetAssignments": [
                {
                    "name": "main",
                    "count": self.workers,
                    "flavors": flavors,
                    "resourceUsage": {r: format_quantity(v) for r, v in total.items()},
                }
            ],
        }
        workload["status"]["conditions"] = [
            _condition(
                "QuotaReserved", "True", "QuotaReserved", f"Quota reserved in {cq_name}", self.stamp
            ),
            _condition("Admitted", "True", "Admitted", "The workload is admitted", self.stamp),
        ]
        for flavor in dict.fromkeys(flavors.values()):
            labels = as_map(index.resource_flavors.get(flavor), "spec", "nodeLabels")
            self.extra_selector.update({k: v for k, v in labels.items() if isinstance(v, str)})
        return True

    def _pending(self, workload: dict[str, Any], reason: str, message: str) -> bool:
        workload["status"]["conditions"] = [
            _condition("QuotaReserved", "False", reason, message, self.stamp)
        ]
        return False

    # -- the Job controller and quota admission --------------------------------

    def run(self) -> None:
        labels = as_map(self.job, "metadata", "labels")
        queue_name = labels.get(LABEL_QUEUE)
        if isinstance(queue_name, str) and queue_name:
            if not self._kueue(queue_name):
                self.job["spec"]["suspend"] = True
                return
            self.job["spec"]["suspend"] = False
        for rank in range(self.workers):
            pod = self._pod(rank)
            refusal = self._limit_range_refusal(pod) or self._quota_refusal(pod)
            if refusal is not None:
                self.refused = True
                self.events.append(
                    self._event(
                        "Job",
                        self.facts.k8s_name,
                        "FailedCreate",
                        f'Error creating: pods "{meta_name(pod)}" is forbidden: {refusal}',
                    )
                )
                return  # the Job controller tries again later, in the same order
            self.pods.append(pod)
            self._schedule(pod, rank)
        self.job["status"] = {"active": len(self.pods), "startTime": self.stamp}

    def _pod(self, rank: int) -> dict[str, Any]:
        template = copy.deepcopy(as_map(self.job, "spec", "template"))
        meta = dict(as_map(template, "metadata"))
        labels = dict(as_map(meta, "labels"))
        labels.update(
            {"batch.kubernetes.io/job-name": self.facts.k8s_name, "job-name": self.facts.k8s_name}
        )
        annotations = dict(as_map(meta, "annotations"))
        name = f"{self.facts.k8s_name}-forecast"
        if self.indexed:
            labels[_INDEX] = str(rank)
            annotations[_INDEX] = str(rank)
            name = f"{self.facts.k8s_name}-{rank}-forecast"
        spec = dict(as_map(template, "spec"))
        if self.extra_selector:
            spec["nodeSelector"] = {**as_map(spec, "nodeSelector"), **self.extra_selector}
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": self.facts.namespace,
                "uid": f"forecast-pod-{rank}",
                "creationTimestamp": self.stamp,
                "labels": labels,
                "annotations": annotations,
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": self.facts.k8s_name,
                        "uid": self.job["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": spec,
            "status": {"phase": "Pending"},
        }

    def _limit_range_refusal(self, pod: dict[str, Any]) -> str | None:
        """LimitRanger's defaults put into `pod`'s containers, then its refusal in its
        words (per Container `max` and `min`); None: admitted."""
        containers = as_list(pod, "spec", "containers")
        for limit_range in self.base.index.limit_ranges_by_ns.get(self.facts.namespace, []):
            for item in as_list(limit_range, "spec", "limits"):
                if text(item, "type") != "Container":
                    continue
                for container in containers:
                    resources = container.setdefault("resources", {})
                    limits = resources.setdefault("limits", {})
                    requests = resources.setdefault("requests", {})
                    for resource, value in as_map(item, "default").items():
                        limits.setdefault(resource, value)
                    for resource, value in as_map(item, "defaultRequest").items():
                        requests.setdefault(resource, limits.get(resource, value))
                for container in containers:
                    limits = as_map(container, "resources", "limits")
                    requests = as_map(container, "resources", "requests")
                    for resource, most in as_map(item, "max").items():
                        limit, bound = _quantity(limits.get(resource)), _quantity(most)
                        if limit is not None and bound is not None and limit > bound:
                            return (
                                f"maximum {resource} usage per Container is {most}, but limit "
                                f"is {limits[resource]}"
                            )
                    for resource, least in as_map(item, "min").items():
                        asked, bound = _quantity(requests.get(resource)), _quantity(least)
                        if asked is not None and bound is not None and asked < bound:
                            return (
                                f"minimum {resource} usage per Container is {least}, but "
                                f"request is {requests[resource]}"
                            )
        return None

    def _quota_refusal(self, pod: dict[str, Any]) -> str | None:
        """The API server's ResourceQuota refusal of `pod`, in its words; None: admitted."""
        spec = as_map(pod, "spec")
        usage = _quota_usage(spec)
        for quota in self.base.index.quotas_by_ns.get(self.facts.namespace, []):
            hard = as_map(quota, "status", "hard") or as_map(quota, "spec", "hard")
            used = as_map(quota, "status", "used")
            missing = _undeclared(spec, hard)
            if missing:
                return f"failed quota: {meta_name(quota)}: must specify {missing}"
            asked: dict[str, Decimal] = {}
            over: list[str] = []
            for key, limit_text in hard.items():
                if key not in usage:
                    continue
                limit = _quantity(limit_text)
                amount = usage[key]
                now_used = _quantity(used.get(key, "0")) or Decimal(0)
                now_used += self._admitted(key)
                if limit is None:
                    continue
                asked[key] = amount
                if now_used + amount > limit:
                    over.append(key)
            if over:
                keys = sorted(over)

                def pairs(values: Mapping[str, Decimal], keys: Sequence[str] = keys) -> str:
                    return ",".join(f"{k}={format_quantity(values[k])}" for k in keys)

                used_now = {
                    k: (_quantity(used.get(k, "0")) or Decimal(0)) + self._admitted(k) for k in keys
                }
                limits = {k: _quantity(hard[k]) or Decimal(0) for k in keys}
                return (
                    f"exceeded quota: {meta_name(quota)}, "
                    f"requested: {pairs(asked)}, used: {pairs(used_now)}, limited: {pairs(limits)}"
                )
        return None

    def _admitted(self, key: str) -> Decimal:
        """What the workers admitted before this one add to a quota's use."""
        total = Decimal(0)
        for pod in self.pods:
            total += _quota_usage(as_map(pod, "spec")).get(key, Decimal(0))
        return total

    # -- the scheduler ---------------------------------------------------------

    def _schedule(self, pod: dict[str, Any], rank: int) -> None:
        spec = as_map(pod, "spec")
        if as_list(spec, "schedulingGates"):
            pod["status"]["conditions"] = [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "SchedulingGated",
                    "message": "Scheduling is blocked due to non-empty scheduling gates",
                    "lastTransitionTime": self.stamp,
                }
            ]
            return
        if (text(spec, "schedulerName") or "default-scheduler") != "default-scheduler":
            return  # no verdict: the scheduler it names is not the one the forecast plays
        prefilter = self._claims_verdict(spec)
        nodes = self.base.index.nodes
        if prefilter is not None:
            self._unschedulable(pod, f"0/{len(nodes)} nodes are available: {prefilter}.")
            return
        fit = analyze_fit(spec, pod_requests(spec), nodes, self.usage, self._volume_terms(spec))
        node = next((row.name for row in fit.nodes if row.fits), None)
        if node is None:
            self._unschedulable(pod, _scheduler_message(fit, len(nodes)))
            return
        # Bound, and (as a kubelet would soon have it) running: what holds a gang is
        # then its first rank that has no node, as it is on a cluster.
        pod["spec"] = {**spec, "nodeName": node}
        pod["status"] = {
            "phase": "Running",
            "startTime": self.stamp,
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": self.stamp}
            ],
            "containerStatuses": [
                {
                    "name": text(c, "name") or "",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "image": text(c, "image") or "",
                    "state": {"running": {"startedAt": self.stamp}},
                }
                for c in as_list(spec, "containers")
            ],
        }
        bound = bound_requests(pod)
        if bound is not None:
            held = dict(self.usage.get(node, {}))
            for key, value in bound[1].items():
                held[key] = held.get(key, Decimal(0)) + value
            self.usage[node] = held
        self.placed.append(Placement(rank, node))

    def _unschedulable(self, pod: dict[str, Any], message: str) -> None:
        pod["status"]["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
                "lastTransitionTime": self.stamp,
            }
        ]

    def _claims_verdict(self, spec: Mapping[str, Any]) -> str | None:
        for volume in as_list(spec, "volumes"):
            claim = text(volume, "persistentVolumeClaim", "claimName")
            if not claim:
                continue
            pvc = self.base.index.pvcs.get((self.facts.namespace, claim))
            if pvc is None:
                return f'persistentvolumeclaim "{claim}" not found'
            if text(pvc, "status", "phase") != "Bound" and not self._waits_for_consumer(pvc):
                return "pod has unbound immediate PersistentVolumeClaims"
        return None

    def _waits_for_consumer(self, pvc: Mapping[str, Any]) -> bool:
        storage_class = self.base.index.storage_classes.get(
            text(pvc, "spec", "storageClassName") or ""
        )
        return text(storage_class, "volumeBindingMode") == "WaitForFirstConsumer"

    def _volume_terms(self, spec: Mapping[str, Any]) -> list[tuple[str, Sequence[Any]]]:
        terms: list[tuple[str, Sequence[Any]]] = []
        for volume in as_list(spec, "volumes"):
            claim = text(volume, "persistentVolumeClaim", "claimName")
            pvc = self.base.index.pvcs.get((self.facts.namespace, claim or ""))
            pv = self.base.index.pvs.get(text(pvc, "spec", "volumeName") or "") if pvc else None
            required = as_list(pv, "spec", "nodeAffinity", "required", "nodeSelectorTerms")
            if claim and required:
                terms.append((claim, required))
        return terms

    def _event(self, kind: str, name: str, reason: str, message: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{name}.forecast", "namespace": self.facts.namespace},
            "involvedObject": {"kind": kind, "name": name, "namespace": self.facts.namespace},
            "reason": reason,
            "message": message,
            "type": "Warning",
            "firstTimestamp": self.stamp,
            "lastTimestamp": self.stamp,
            "count": 1,
        }

    def snapshot(self) -> Snapshot:
        """What the diagnosis reads of the cluster with the job in it: the job's objects as
        Kubernetes would have them now, every object of the kinds read whole, the claims'
        events, and the nodes with their usage (the workers placed included). Other jobs'
        Pods and Events are left out: usage already counts them, and indexing tens of
        thousands of them again would cost more than the whole forecast."""
        base = self.base
        index = base.index
        claims = tuple(
            e for e in base.events if text(e, "involvedObject", "kind") == "PersistentVolumeClaim"
        )
        return replace(
            base,
            jobs=(self.job,),
            pods=tuple(self.pods),
            events=(*claims, *self.events),
            workloads=(*index.all_workloads, *self.workloads),
            base=None,
            node_state=NodeState(index.nodes, self.usage, ()),
        )


def _scheduler_message(fit: FitAnalysis, total: int) -> str:
    """kube-scheduler's FitError message, from the table's first failing filter per node."""
    values = {t.key: t.value for t in fit.untolerated}
    parts = []
    for (token, key), count in fit.first_failures.items():
        if token is Filter.INSUFFICIENT:
            said = f"Insufficient {key}"
        elif token is Filter.TOO_MANY_PODS:
            said = "Too many pods"
        elif token is Filter.UNTOLERATED_TAINT:
            said = (
                f"node(s) had untolerated taint {{{key}: {values.get(key, '')}}}"
                if key
                else "node(s) had untolerated taint(s)"
            )
        elif token is Filter.NODE_AFFINITY:
            said = "node(s) didn't match Pod's node affinity/selector"
        elif token is Filter.NODE_NAME:
            said = "node(s) didn't match the requested node name"
        elif token is Filter.UNSCHEDULABLE:
            said = "node(s) were unschedulable"
        elif token is Filter.VOLUME_NODE_AFFINITY:
            said = "node(s) had volume node affinity conflict"
        else:
            continue
        parts.append(f"{count} {said}")
    body = ", ".join(sorted(parts))
    return (
        f"0/{total} nodes are available: {body}. preemption: 0/{total} nodes are available: "
        f"{total} Preemption is not helpful for scheduling."
    )


def _holders(
    primary: Blocker | None, sim: _Simulation, snap: Snapshot, limit: int
) -> tuple[tuple[Holder, ...], int]:
    """Who holds what the job waits for in `snap` (the cluster without the job), soonest
    free first (those with no end last): the first `limit`, and how many in all."""
    if primary is None:
        return (), 0
    index = snap.index
    # (namespace, Job or None, the Pod when it has no Job) -> (amounts, nodes, a Pod)
    holding: dict[
        tuple[str, str | None, str | None], tuple[dict[str, Decimal], set[str], list[Any]]
    ] = {}

    def hold(pod: Mapping[str, Any], resource: str, amount: Decimal) -> None:
        owner = _owner(pod)
        key = (meta_namespace(pod), owner, None if owner else meta_name(pod))
        amounts, nodes, pods = holding.setdefault(key, ({}, set(), []))
        pods.append(pod)
        node = text(pod, "spec", "nodeName")
        amounts[resource] = amounts.get(resource, Decimal(0)) + amount
        if node:
            nodes.add(node)

    requests = _Requests()
    if primary.link in (Link.SCHEDULER, Link.GPU_NODE) and primary.resource:
        resource = primary.resource
        waitable_nodes = {row.name for row in _fit_rows(snap, sim) if not row.fits and row.waitable}
        for pod in snap.pods:
            node = text(pod, "spec", "nodeName")
            if node not in waitable_nodes or text(pod, "status", "phase") in _TERMINAL:
                continue
            amount = requests.of(pod).get(resource)
            if amount:
                hold(pod, resource, amount)
    elif primary.link is Link.QUOTA and primary.queue:
        for workload in index.all_workloads:
            seen = queued(workload, index.local_queues)
            if seen.reserved and not seen.finished and seen.cluster_queue == primary.queue:
                if seen.job is None or seen.job == sim.facts.k8s_name:
                    continue
                stand_in = {
                    "metadata": {
                        "namespace": seen.namespace,
                        "ownerReferences": [{"kind": "Job", "name": seen.job}],
                    }
                }
                for (_, res), amount in seen.reserves.items():
                    hold(stand_in, res, amount)
    elif primary.link is Link.QUOTA and primary.resource:
        resource = primary.resource.removeprefix("requests.").removeprefix("limits.")
        for pod in snap.pods:
            if meta_namespace(pod) != sim.facts.namespace:
                continue
            if text(pod, "status", "phase") in _TERMINAL:
                continue
            amount = _quota_usage(as_map(pod, "spec")).get(primary.resource) or requests.of(
                pod
            ).get(resource)
            if amount:
                hold(pod, primary.resource, amount)
    far = datetime.max.replace(tzinfo=UTC)
    ordered = sorted(
        (
            (
                _ends_by(index.jobs.get((ns, name)) if name else held[2][0]) or far,
                ns,
                name or "",
                key,
            )
            for key, held in holding.items()
            for ns, name in [key[:2]]
        ),
        key=lambda row: row[:3],
    )
    found = []
    for ends, _, _, (namespace, name, pod_name) in ordered[:limit]:
        amounts, nodes, _pods = holding[(namespace, name, pod_name)]
        job = index.jobs.get((namespace, name)) if name else None
        labels = as_map(job, "metadata", "labels")
        found.append(
            Holder(
                job=str(labels.get("kubetrain.io/name") or name or pod_name),
                job_id=labels.get("kubetrain.io/job-id") if job else None,
                namespace=namespace,
                kubernetes_job=name,
                holds={k: format_quantity(v) for k, v in amounts.items()},
                nodes=tuple(sorted(nodes)),
                ends_by=None if ends == far else ends,
            )
        )
    return tuple(found), len(ordered)


class _Requests:
    """pod_requests, parsed once per distinct set of resources (Pods of one job are alike)."""

    def __init__(self) -> None:
        self.seen: dict[str, dict[str, Decimal]] = {}

    def of(self, pod: Mapping[str, Any]) -> dict[str, Decimal]:
        spec = as_map(pod, "spec")
        key = repr(
            (
                [as_map(c, "resources") for c in as_list(spec, "containers")],
                [
                    (as_map(c, "resources"), text(c, "restartPolicy"))
                    for c in as_list(spec, "initContainers")
                ],
                spec.get("overhead"),
            )
        )
        if key not in self.seen:
            self.seen[key] = pod_requests(spec)
        return self.seen[key]


def _fit_rows(snap: Snapshot, sim: _Simulation) -> Sequence[Any]:
    waiting = next((p for p in sim.pods if not text(p, "spec", "nodeName")), None)
    if waiting is None:
        return ()
    spec = as_map(waiting, "spec")
    return analyze_fit(spec, pod_requests(spec), snap.index.nodes, sim.usage).nodes


def _ends_by(owner: Mapping[str, Any] | None) -> datetime | None:
    """A Job's (or a bare Pod's) status.startTime plus its activeDeadlineSeconds."""
    deadline = as_map(owner, "spec").get("activeDeadlineSeconds")
    started = timestamp(owner, "status", "startTime")
    if not isinstance(deadline, int) or started is None:
        return None
    return started + timedelta(seconds=deadline)


def _owner(pod: Mapping[str, Any]) -> str | None:
    for ref in as_list(pod, "metadata", "ownerReferences"):
        if text(ref, "kind") == "Job":
            return text(ref, "name")
    labels = as_map(pod, "metadata", "labels")
    name = labels.get("batch.kubernetes.io/job-name") or labels.get("job-name")
    return name if isinstance(name, str) else None


def _quota_usage(spec: Mapping[str, Any]) -> dict[str, Decimal]:
    """What a Pod counts against a ResourceQuota, by the quota's own keys."""
    requests = pod_requests(spec)
    usage: dict[str, Decimal] = {"pods": Decimal(1), "count/pods": Decimal(1)}
    for resource, amount in requests.items():
        if resource == "pods":
            continue
        usage[f"requests.{resource}"] = amount
        if resource in ("cpu", "memory", "ephemeral-storage"):
            usage[resource] = amount
    limits: dict[str, Decimal] = {}
    for container in as_list(spec, "containers"):
        for resource, value in as_map(container, "resources", "limits").items():
            limit = _quantity(value)
            if limit is not None:
                limits[resource] = limits.get(resource, Decimal(0)) + limit
    for resource, total in limits.items():
        usage[f"limits.{resource}"] = total
    return usage


def _undeclared(spec: Mapping[str, Any], hard: Mapping[str, Any]) -> str:
    """ResourceQuota's "limits.cpu for: trainer; requests.cpu for: trainer" (v1.33) for
    the compute resources a quota tracks that a container does not declare."""
    missing: dict[str, list[str]] = {}
    for key in sorted(hard):
        kind, _, resource = key.rpartition(".")
        if resource not in ("cpu", "memory") or kind not in ("", "requests", "limits"):
            continue
        section = "limits" if kind == "limits" else "requests"
        for container in as_list(spec, "containers"):
            if resource not in as_map(container, "resources", section):
                missing.setdefault(f"{section}.{resource}", []).append(
                    text(container, "name") or ""
                )
    return "; ".join(f"{key} for: {','.join(names)}" for key, names in sorted(missing.items()))


def _flavor_of(cluster_queue: Mapping[str, Any], resource: str) -> str | None:
    for group in as_list(cluster_queue, "spec", "resourceGroups"):
        covered = as_list(group, "coveredResources")
        if resource in covered:
            flavors = as_list(group, "flavors")
            return text(flavors[0], "name") if flavors else None
    return None


def _stopped(queue: Mapping[str, Any]) -> bool:
    return (text(queue, "spec", "stopPolicy") or "None") != "None"


def _active(cluster_queue: Mapping[str, Any]) -> bool:
    for condition in as_list(cluster_queue, "status", "conditions"):
        if text(condition, "type") == "Active":
            return text(condition, "status") != "False"
    return True


def _condition(kind: str, status: str, reason: str, message: str, at: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": at,
    }


def _quantity(value: object) -> Decimal | None:
    try:
        return parse_quantity(str(value))
    except QuantityError:
        return None


def _iso(moment: datetime | None) -> str:
    if moment is None:
        return ""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
