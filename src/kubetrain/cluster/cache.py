"""Watch caches of everything the diagnosis reads, and snapshots built from them.

Jobs and Pods are watched by our labels; Events cluster-wide but kept only
when they are about one of our Jobs or Pods; Nodes, PVCs and ResourceQuotas
whole (they decide scheduling). A snapshot for one job is the same `List`
shape that `kubectl get … -o json` prints, so the live path and
`kubetrain why --from-file` feed the diagnosis alike.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import httpx2 as httpx

from kubetrain.cluster.reflector import Obj, Reflector
from kubetrain.domain.manifest import LABEL_JOB_ID, LABEL_MANAGED_BY, MANAGED_BY

# (name, path, label selector) — order matters only for start-up logging.
_RESOURCES: tuple[tuple[str, str, str | None], ...] = (
    ("jobs", "/apis/batch/v1/jobs", f"{LABEL_MANAGED_BY}={MANAGED_BY}"),
    ("pods", "/api/v1/pods", LABEL_JOB_ID),
    ("events", "/api/v1/events", None),
    ("nodes", "/api/v1/nodes", None),
    ("pvcs", "/api/v1/persistentvolumeclaims", None),
    ("quotas", "/api/v1/resourcequotas", None),
)
# Kinds whose change can alter the verdict of every waiting job.
CLUSTER_WIDE = frozenset({"nodes", "pvcs", "quotas"})

_KIND = {
    "jobs": ("batch/v1", "Job"),
    "pods": ("v1", "Pod"),
    "events": ("v1", "Event"),
    "nodes": ("v1", "Node"),
    "pvcs": ("v1", "PersistentVolumeClaim"),
    "quotas": ("v1", "ResourceQuota"),
}

# Called with (resource name, watch event type, object, job id or None).
Listener = Callable[[str, str, Obj, str | None], None]


def job_id_of(obj: Obj) -> str | None:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    value = labels.get(LABEL_JOB_ID)
    return value if isinstance(value, str) else None


class ClusterCache:
    def __init__(self, http: httpx.AsyncClient, listener: Listener | None = None) -> None:
        self.listener = listener
        self.reflectors: dict[str, Reflector] = {}
        # (namespace, involved object name) -> events, for our Jobs and Pods only
        self._events: dict[tuple[str, str], dict[str, Obj]] = defaultdict(dict)
        self._job_by_name: dict[tuple[str, str], str] = {}  # (ns, k8s Job name) -> job id
        self._pod_job: dict[tuple[str, str], str] = {}  # (ns, pod name) -> job id
        self._deleted_jobs: set[tuple[str, str]] = set()  # (ns, Job name) seen deleted
        self._jobs: dict[tuple[str, str], Obj] = {}  # (ns, Job name) -> Job
        for name, path, selector in _RESOURCES:
            self.reflectors[name] = Reflector(
                http, path, label_selector=selector, on_event=self._handler(name)
            )

    def _handler(self, resource: str) -> Callable[[str, Obj], None]:
        def handle(kind: str, obj: Obj) -> None:
            meta = obj.get("metadata") or {}
            ns = meta.get("namespace", "")
            job_id = job_id_of(obj)
            if resource == "jobs" and job_id:
                key = (ns, meta.get("name", ""))
                self._job_by_name[key] = job_id
                if kind == "DELETED":
                    self._deleted_jobs.add(key)
                    self._jobs.pop(key, None)
                else:
                    self._deleted_jobs.discard(key)
                    self._jobs[key] = obj
            elif resource == "pods" and job_id:
                if kind == "DELETED":
                    self._pod_job.pop((ns, meta.get("name", "")), None)
                else:
                    self._pod_job[(ns, meta.get("name", ""))] = job_id
            elif resource == "events":
                involved = obj.get("involvedObject") or {}
                key = (involved.get("namespace") or ns, involved.get("name") or "")
                job_id = self._job_by_name.get(key) or self._pod_job.get(key)
                if job_id is None:
                    return  # not about one of ours
                if kind == "DELETED":
                    # Events expire after an hour; what they said still explains the
                    # job, so the cache keeps them until the job's objects go.
                    return
                self._events[key][meta.get("uid", "")] = obj
            if self.listener is not None:
                self.listener(resource, kind, obj, job_id)

        return handle

    async def run(self) -> None:
        await asyncio.gather(*(r.run() for r in self.reflectors.values()))

    async def wait_synced(self, timeout: float = 30.0) -> None:
        await asyncio.wait_for(
            asyncio.gather(*(r.synced.wait() for r in self.reflectors.values())), timeout
        )

    def jobs(self) -> list[Obj]:
        return list(self.reflectors["jobs"].items.values())

    def job(self, namespace: str, name: str) -> Obj | None:
        return self._jobs.get((namespace, name))

    def listing(self) -> dict[str, Any]:
        """Everything cached, as one `List`: the syncer diagnoses a whole batch of
        jobs from it (`Snapshot.for_job` narrows it per job while node usage
        still counts every Pod), instead of re-reading every node per job."""
        items: list[Obj] = [
            _typed(r, o)
            for r in ("jobs", "pods", "nodes", "pvcs", "quotas")
            for o in self.reflectors[r].items.values()
        ]
        items += [_typed("events", e) for kept in self._events.values() for e in kept.values()]
        return {"apiVersion": "v1", "kind": "List", "items": items}

    def deleted(self, namespace: str, name: str) -> bool:
        """True when this cache saw the Job go (a watch DELETED or a relist's difference)."""
        return (namespace, name) in self._deleted_jobs

    def forget(self, namespace: str, k8s_name: str, pod_names: list[str]) -> None:
        """Drop kept events once a job is finished and recorded."""
        for involved in [k8s_name, *pod_names]:
            self._events.pop((namespace, involved), None)


def _typed(resource: str, obj: Obj) -> Obj:
    # Watch and list items carry no apiVersion/kind; a List's items do.
    api_version, kind = _KIND[resource]
    if obj.get("kind") == kind:
        return obj
    return {"apiVersion": api_version, "kind": kind, **obj}
