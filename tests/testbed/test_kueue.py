"""Kueue for real on the testbed (`up --kueue`): jobs rendered by kubetrain with a queue go
through Kueue's webhooks and admission, and are diagnosed from Kueue's own Workloads.

The session's Kueue testbed; each test a ClusterQueue of its own of 8 `nvidia.com/gpu` (the
size of one node) with a LocalQueue in the test's namespace (`queue_namespace`).
"""

from __future__ import annotations

import contextlib
import json
import os
import ssl
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError, Client
from lightkube.codecs import from_dict
from lightkube.config.kubeconfig import KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Namespace, Pod, ServiceAccount

from kubetrain.domain.diagnosis import Diagnosis, JobFacts, diagnose
from kubetrain.domain.manifest import LABEL_QUEUE, render_job
from kubetrain.domain.snapshot import Snapshot
from kubetrain.domain.spec import parse_training_job
from kubetrain.domain.states import BusinessState, ReasonCode
from kubetrain.testbed.cluster import Testbed
from kubetrain.testbed.processes import log_tail
from tests.fixtures.record import ClusterQueue, cluster_queue, kueue_snapshot, local_queue, seen
from tests.kube import KUEUE_STATE_ENV, eventually, get

pytestmark = pytest.mark.testbed

FATE = "testbed.kubetrain.io/fate"


@pytest.fixture(scope="module")
def kueue_bed(kueue_testbed: Testbed) -> Testbed:
    """The session's Kueue testbed (tests/conftest.py), its queues already made."""
    return kueue_testbed


@pytest.fixture(scope="module")
def kk(kueue_bed: Testbed) -> Client:
    return Client(config=KubeConfig.from_file(kueue_bed.kubeconfig), field_manager="tests")


def _kueue_seen() -> str:
    """Whether the session's Kueue still runs, and what it last logged as an error."""
    if not (state_dir := os.environ.get(KUEUE_STATE_ENV)):
        return ""
    bed = Testbed(Path(state_dir))
    alive = bed.running().get("kueue")
    errors = [
        line[:400]
        for line in log_tail(bed.log_path("kueue"), 400).splitlines()
        if '"error"' in line.lower() or "level=error" in line.lower() or line.startswith("E")
    ][-5:]
    return f"; kueue running: {alive}; its last errors: {errors}"


def _active(kube: Client, name: str) -> bool:
    status: Any = kube.get(ClusterQueue, name).status or {}
    return any(
        c.get("type") == "Active" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def _seen(kube: Client, ns: str) -> str:
    """What ClusterQueue `ns` (each test's own) and namespace `ns` showed: a wait that
    times out says it, for the next run to be read."""
    status: Any = kube.get(ClusterQueue, ns).status or {}
    counts = {
        k: status.get(k) for k in ("admittedWorkloads", "reservingWorkloads", "pendingWorkloads")
    }
    # What Kueue's cache counts as reserved: quota held by no Workload shows here.
    reserved = [
        f"{r.get('name')}={r.get('total')}"
        for flavor in status.get("flavorsReservation") or []
        for r in flavor.get("resources") or []
        if r.get("total") not in (None, "0")
    ]
    return f"{ns} {counts} reserved {reserved}; {seen(kube, ns, kueue=True)}{_kueue_seen()}"


@contextlib.contextmanager
def queue_namespace(kk: Client, prefix: str = "kueue") -> Iterator[str]:
    """A namespace with LocalQueue `team` of a ClusterQueue of its own, of the same name
    (8 GPUs, as `gpus`), once Kueue holds it active; both deleted after.

    Not the shared `gpus`: Kueue's counts on a ClusterQueue can outlive the Workloads
    they count (seen in CI: `gpus` said 1 pending for minutes with no Workload left in
    any namespace, once the namespace of its LocalQueue was deleted), and one test's
    leftovers then held the next test's job. Each test's quota is its own; the recorded
    scenarios keep `gpus` to themselves."""
    name = f"{prefix}-{datetime.now(UTC).strftime('%H%M%S%f')}"
    own: Any = from_dict(cluster_queue(name, 8))
    kk.create(own)
    try:
        eventually(lambda: _active(kk, name), 60, what=f"ClusterQueue {name} to be active")
        kk.create(Namespace(metadata=ObjectMeta(name=name)))
        eventually(lambda: get(kk, ServiceAccount, "default", name), 30, what="default SA")
        queue: Any = from_dict(local_queue("team", name))
        kk.create(queue, namespace=name)
        yield name
        kk.delete(Namespace, name)
        # Its Pods leave the nodes' GPUs to the next test only once they are gone.
        eventually(
            lambda: get(kk, Namespace, name) is None,
            120,
            what=lambda: f"namespace {name} to go ({_seen(kk, name)})",
        )
    finally:
        # Kueue holds it (a finalizer) until its last Workload is gone: not waited for.
        with contextlib.suppress(ApiError):
            kk.delete(ClusterQueue, name)


@pytest.fixture
def queue_ns(kk: Client) -> Iterator[str]:
    with queue_namespace(kk) as name:
        yield name


def submit(kube: Client, ns: str, job_id: str, gpus: int, priority: str | None = None) -> str:
    spec: dict[str, Any] = {
        "image": "registry.example/trainer:1",
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "gpus": gpus},
        "queue": "team",
    }
    if priority:
        spec["priorityClass"] = priority
    training = parse_training_job(
        {
            "apiVersion": "kubetrain.io/v1",
            "kind": "TrainingJob",
            "metadata": {"name": job_id, "project": ns, "annotations": {FATE: "hang"}},
            "spec": spec,
        }
    )
    manifest = render_job(job_id, training, ns, dataset=None)
    created: Any = from_dict(manifest)
    kube.create(created, namespace=ns)
    name: str = manifest["metadata"]["name"]
    return name


def why(kube: Client, ns: str, name: str) -> Diagnosis:
    facts = JobFacts(name=name, k8s_name=name, namespace=ns, dispatched=True)
    dump = Snapshot.from_list(kueue_snapshot(kube, ns))
    return diagnose(facts, dump.for_job(name, ns), datetime.now(UTC))


def get_raw(bed: Testbed, path: str) -> dict[str, Any]:
    context = ssl.create_default_context(cafile=str(bed.pki.ca_cert))
    context.load_cert_chain(str(bed.pki.admin_cert), str(bed.pki.admin_key))
    with urllib.request.urlopen(bed.server + path, context=context, timeout=10) as resp:  # noqa: S310
        return dict(json.load(resp))


def running(kube: Client, ns: str, name: str) -> bool:
    pods = kube.list(Pod, namespace=ns, labels={"job-name": name})
    return any(p.status and p.status.phase == "Running" for p in pods)


def test_kueue_admits_one_job_queues_the_next_and_never_fits_a_larger_one(
    kueue_bed: Testbed, kk: Client, queue_ns: str
) -> None:
    first = submit(kk, queue_ns, "first", 8)
    eventually(
        lambda: running(kk, queue_ns, first),
        60,
        what=lambda: f"the first job to run ({_seen(kk, queue_ns)})",
    )

    second = submit(kk, queue_ns, "second", 8)
    job = kk.get(Job, second, namespace=queue_ns)
    assert job.spec is not None
    assert job.spec.suspend is True
    assert job.metadata is not None
    assert (job.metadata.labels or {})[LABEL_QUEUE] == "team"

    def pending() -> Diagnosis | None:
        # Kueue's own verdict (its Workload's QuotaReserved=False, reason Pending), not the
        # Job controller's "Job suspended" read before Kueue has made the Workload.
        d = why(kk, queue_ns, second)
        return d if d.raw_reason == "Pending" else None

    d = eventually(pending, 30, what="Kueue's verdict on the second job")
    assert (d.state, d.reason, d.waitable) == (
        BusinessState.QUEUED,
        ReasonCode.WAITING_FOR_QUOTA,
        True,
    )
    assert "insufficient unused quota for nvidia.com/gpu in flavor default-flavor" in (
        d.raw_message or ""
    )
    # Kueue's numbers and the queue: first in line, the first job holding the quota.
    blocker = d.blockers[0]
    assert (blocker.queue, blocker.flavor, blocker.requested, blocker.nominal, blocker.used) == (
        queue_ns,
        "default-flavor",
        "8",
        "8",
        "8",
    )
    assert (blocker.position, blocker.ahead) == (1, ())
    assert f"reserved by {first}" in d.explanation

    # The visibility API, through the API server's aggregator: the second job is first
    # in line (position 0) behind the admitted one.
    pending_workloads = get_raw(
        kueue_bed,
        f"/apis/visibility.kueue.x-k8s.io/v1beta2/clusterqueues/{queue_ns}/pendingworkloads",
    )["items"]
    assert [
        (w["metadata"]["namespace"], w["positionInClusterQueue"]) for w in pending_workloads
    ] == [(queue_ns, 0)]
    assert pending_workloads[0]["metadata"]["ownerReferences"][0]["name"] == second
    # kubetrain's position, from the Workloads alone, is Kueue's (counted from 1).
    assert blocker.position == pending_workloads[0]["positionInClusterQueue"] + 1

    big = submit(kk, queue_ns, "big", 16)

    def never() -> Diagnosis | None:
        d = why(kk, queue_ns, big)
        return d if d.raw_reason == "Pending" else None

    d = eventually(never, 30, what="Kueue's verdict on the 16-GPU job")
    assert (d.state, d.reason, d.waitable) == (
        BusinessState.QUEUED,
        ReasonCode.WAITING_FOR_QUOTA,
        False,
    )
    assert "maximum capacity" in (d.raw_message or "")


def test_a_high_priority_job_preempts_a_low_priority_one(kk: Client, queue_ns: str) -> None:
    low = submit(kk, queue_ns, "low", 8, priority="fixture-low")
    eventually(lambda: running(kk, queue_ns, low), 60, what="the low-priority job to run")
    high = submit(kk, queue_ns, "high", 8, priority="fixture-high")
    eventually(lambda: running(kk, queue_ns, high), 90, what="the high-priority job to run")
    d = why(kk, queue_ns, low)
    assert (d.state, d.reason) == (BusinessState.QUEUED, ReasonCode.PREEMPTED)
    assert d.raw_reason == "Preempted"
    assert f"ClusterQueue {queue_ns} preempted the job for {high} (a higher-priority job" in (
        d.explanation
    )
    job = kk.get(Job, low, namespace=queue_ns)
    assert job.spec is not None
    assert job.spec.suspend is True


def test_every_served_version_of_kueues_kinds_lists(kueue_bed: Testbed, kk: Client) -> None:
    """Each version the API server serves of Kueue's kinds lists: a conversion webhook
    named for a kind the binary does not convert fails every list of the other version,
    and the API server's watch cache of it retries every second."""
    crds = [c for c in kk.list(CustomResourceDefinition) if c.spec.group == "kueue.x-k8s.io"]
    assert any(c.spec.names.plural == "resourceflavors" for c in crds)
    for crd in crds:
        for version in crd.spec.versions:
            if version.served:
                path = f"/apis/kueue.x-k8s.io/{version.name}/{crd.spec.names.plural}"
                listed = get_raw(kueue_bed, path)
                assert listed["kind"].endswith("List"), (path, listed)
