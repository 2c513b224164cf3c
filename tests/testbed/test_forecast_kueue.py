"""The forecast under Kueue, on the session's Kueue testbed: each job is forecast from a
dump of the cluster (as the server's caches hold it), then created for real, and the
forecast's verdict, reason and queue position must be what Kueue then does with it.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from lightkube import Client
from lightkube.codecs import from_dict
from lightkube.config.kubeconfig import KubeConfig

from kubetrain.domain.diagnosis import Diagnosis, JobFacts
from kubetrain.domain.forecast import Forecast, Verdict, forecast
from kubetrain.domain.manifest import render_job
from kubetrain.domain.snapshot import Snapshot
from kubetrain.domain.spec import parse_training_job
from kubetrain.domain.states import ReasonCode
from kubetrain.testbed.cluster import Testbed
from tests.fixtures.record import kueue_snapshot
from tests.kube import eventually
from tests.testbed.test_kueue import queue_namespace, running, why

pytestmark = pytest.mark.testbed

FATE = "testbed.kubetrain.io/fate"


@pytest.fixture(scope="module")
def kk(kueue_testbed: Testbed) -> Client:
    return Client(config=KubeConfig.from_file(kueue_testbed.kubeconfig), field_manager="tests")


@pytest.fixture
def queue_ns(kk: Client) -> Iterator[str]:
    with queue_namespace(kk, "forecast") as name:
        yield name


def manifest(ns: str, job_id: str, gpus: int) -> dict[str, Any]:
    training = parse_training_job(
        {
            "apiVersion": "kubetrain.io/v1",
            "kind": "TrainingJob",
            "metadata": {"name": job_id, "project": ns, "annotations": {FATE: "hang"}},
            "spec": {
                "image": "registry.example/trainer:1",
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "gpus": gpus},
                "queue": "team",
            },
        }
    )
    return render_job(job_id, training, ns, dataset=None)


def predict(kube: Client, ns: str, job: dict[str, Any]) -> Forecast:
    name = job["metadata"]["name"]
    facts = JobFacts(name=name, k8s_name=name, namespace=ns, dispatched=True)
    return forecast(job, facts, Snapshot.from_list(kueue_snapshot(kube, ns)), datetime.now(UTC))


def create(kube: Client, ns: str, job: dict[str, Any]) -> str:
    made: Any = from_dict(job)
    kube.create(made, namespace=ns)
    name: str = job["metadata"]["name"]
    return name


def met(kube: Client, ns: str, name: str) -> Diagnosis:
    def verdict() -> Diagnosis | None:
        # Kueue's own (QuotaReserved=False, reason Pending), not the Job controller's "Job
        # suspended" read before Kueue has made the Workload.
        d = why(kube, ns, name)
        return d if d.raw_reason == "Pending" else None

    found: Diagnosis = eventually(verdict, 30, what=f"Kueue's verdict on {name}")
    return found


def test_kueue_forecasts_agree_with_what_kueue_does(kk: Client, queue_ns: str) -> None:
    first = manifest(queue_ns, "first", 8)
    assert predict(kk, queue_ns, first).verdict is Verdict.STARTS_NOW
    create(kk, queue_ns, first)
    eventually(lambda: running(kk, queue_ns, "kt-first"), 60, what="the first job to run")

    second = manifest(queue_ns, "second", 4)
    predicted = predict(kk, queue_ns, second)
    assert predicted.verdict is Verdict.WAITS
    assert predicted.diagnosis.reason is ReasonCode.WAITING_FOR_QUOTA
    assert predicted.queue == {"cluster_queue": queue_ns, "position": 1, "ahead": []}
    assert [h.kubernetes_job for h in predicted.held_by] == ["kt-first"]
    create(kk, queue_ns, second)
    d = met(kk, queue_ns, "kt-second")
    assert (d.reason, d.waitable) == (predicted.diagnosis.reason, predicted.diagnosis.waitable)
    assert d.blockers[0].position == 1

    larger = manifest(queue_ns, "larger", 16)
    predicted = predict(kk, queue_ns, larger)
    assert predicted.verdict is Verdict.NEVER_FITS
    create(kk, queue_ns, larger)
    d = met(kk, queue_ns, "kt-larger")
    assert (d.reason, d.waitable) == (ReasonCode.WAITING_FOR_QUOTA, False)
    assert predicted.diagnosis.reason is d.reason
