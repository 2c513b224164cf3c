"""Rendered Jobs against the real API server: each passes a server-side dry-run create and
comes back with every field we set (a field the server does not know, or a disabled
feature's field, would be dropped without an error). And what a missing priority class
really does: nothing at the Job, a refusal when the Job controller makes the Pod."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import ApiError, Client
from lightkube.codecs import from_dict
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Event, Pod
from lightkube.resources.scheduling_v1 import PriorityClass

from kubetrain.domain.datasets import parse_dataset_version, resolve_dataset
from kubetrain.domain.manifest import RenderOptions, job_name, render_job
from kubetrain.domain.spec import parse_training_job
from tests.kube import eventually

pytestmark = pytest.mark.testbed

JOB_ID = "01J9ZK3T7Q8W2X4Y6A0B1C2D3E"


def training_job(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kubetrain.io/v1",
        "kind": "TrainingJob",
        "metadata": {"name": "train", "project": "ai-training"},
        "spec": {
            "image": "registry.example/trainer:1",
            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
            **spec,
        },
    }


GPU = {"requests": {"cpu": "8", "memory": "64Gi"}}
EXAMPLE = training_job(
    command=["python", "train.py"],
    args=[],
    env=[
        {"name": "EPOCHS", "value": "10"},
        {"name": "WANDB_API_KEY", "secretRef": {"name": "wandb", "key": "token"}},
    ],
    resources={
        "requests": {"cpu": "4", "memory": "16Gi"},
        "limits": {"cpu": "8", "memory": "32Gi"},
        "gpus": 1,
        "gpuType": "nvidia-h100",
    },
    dataset={"name": "imagenet", "version": "v3", "claim": "dataset-imagenet", "subPath": "v3"},
    checkpoints={"claim": "ckpt-train-policy"},
    output={"claim": "out-train-policy"},
    cache={"size": "100Gi"},
    priorityClass="batch-normal",
    maxRuntime="24h",
    retries=3,
)
EXAMPLE["metadata"].update(
    labels={"team": "vision", "app.kubernetes.io/name": "policy"},
    annotations={"note": "first run\nof v12", "example.com/ticket": "ML-1234"},
)
REGISTERED = parse_dataset_version(
    {
        "name": "imagenet",
        "version": "v3",
        "claim": "datasets",
        "subPath": "imagenet/v3",
        "checksums": "SHA256SUMS",
        "checksumsSha256": "ab" * 32,
    }
)
STATUS = RenderOptions(status_url="http://kubetrain.kubetrain.svc:8080")
LONG = training_job(dataset={"name": "d" * 63, "version": "v" * 63, "claim": "c" * 253})
LONG["metadata"].update(name="n" * 60, labels={"example.com/" + "k" * 63: "v" * 63})

# name: (TrainingJob, job id, dataset entry or None to resolve the ref itself, options)
MATRIX: dict[str, tuple[dict[str, Any], str, Any, RenderOptions]] = {
    "cpu-only": (training_job(), JOB_ID, None, RenderOptions()),
    "cpu-fractional-burstable": (
        training_job(
            resources={"requests": {"cpu": 0.5, "memory": "1e9"}, "limits": {"cpu": "2500m"}}
        ),
        JOB_ID,
        None,
        RenderOptions(),
    ),
    "one-gpu-with-type": (
        training_job(resources={**GPU, "gpus": 1, "gpuType": "nvidia-h100"}),
        JOB_ID,
        None,
        RenderOptions(),
    ),
    "eight-gpus-any-type": (
        training_job(resources={**GPU, "gpus": 8}),
        JOB_ID,
        None,
        RenderOptions(),
    ),
    "other-vendor-gpus": (
        training_job(resources={**GPU, "gpus": 2, "gpuType": "mi300x"}),
        JOB_ID,
        None,
        RenderOptions(gpu_resource="amd.com/gpu", accelerator_label="amd.com/gpu.product"),
    ),
    "volumes-and-cache": (
        training_job(
            dataset={"name": "imagenet", "version": "v3", "claim": "ds", "subPath": "v3"},
            checkpoints={"claim": "ckpt"},
            output={"claim": "out"},
            cache={"size": "100Gi"},
        ),
        JOB_ID,
        None,
        RenderOptions(),
    ),
    "registered-dataset": (
        training_job(dataset={"name": "imagenet", "version": "v3"}),
        JOB_ID,
        REGISTERED,
        RenderOptions(),
    ),
    "secrets-in-env": (
        training_job(
            env=[
                {"name": "HF_TOKEN", "secretRef": {"name": "hf", "key": "token"}},
                {"name": "DATA", "value": "$(KUBETRAIN_DATASET_PATH)/train"},
                {"name": "EMPTY", "value": ""},
            ]
        ),
        JOB_ID,
        None,
        RenderOptions(),
    ),
    "status-reporting": (training_job(), JOB_ID, None, STATUS),
    "script-in-args": (
        training_job(command=["bash", "-c"], args=['set -e\n\tpython train.py "$@"\n', "--"]),
        JOB_ID,
        None,
        RenderOptions(),
    ),
    "deadline-and-retries": (
        training_job(maxRuntime="1h30m", retries=100),
        JOB_ID,
        None,
        RenderOptions(),
    ),
    "priority-class-not-existing": (
        training_job(priorityClass="no-such-class"),
        JOB_ID,
        None,
        RenderOptions(),
    ),
    "longest-names": (LONG, "x" * 60, None, RenderOptions()),
    "uuid-job-id": (training_job(), str(uuid.UUID(int=7)), None, RenderOptions()),
    "the-issues-example": (EXAMPLE, JOB_ID, None, STATUS),
}


def render(case: str, namespace: str) -> dict[str, Any]:
    data, job_id, entry, options = MATRIX[case]
    job = parse_training_job(copy.deepcopy(data))
    dataset = entry
    if dataset is None and job.spec.dataset is not None:
        dataset = resolve_dataset(job.spec.dataset, None)
    return render_job(job_id, job, namespace, dataset=dataset, options=options)


def obj(manifest: dict[str, Any]) -> Any:
    """A lightkube object from a dict (typed Any: from_dict's union does not fit create)."""
    return from_dict(manifest)


def missing(expected: Any, actual: Any, path: str = "") -> list[str]:
    """What of `expected` is not in `actual` (which may hold more: the server's defaults)."""
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return [f"{path}: expected a mapping, got {actual!r}"]
        found: list[str] = []
        for key, value in expected.items():
            if key not in actual:
                found.append(f"{path}.{key}: dropped")
            else:
                found += missing(value, actual[key], f"{path}.{key}")
        return found
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            return [f"{path}: expected {expected!r}, got {actual!r}"]
        return [
            problem
            for index, (e, a) in enumerate(zip(expected, actual, strict=True))
            for problem in missing(e, a, f"{path}[{index}]")
        ]
    return [] if expected == actual else [f"{path}: expected {expected!r}, got {actual!r}"]


@pytest.mark.parametrize("case", list(MATRIX))
def test_rendered_jobs_pass_a_server_side_dry_run(kube: Client, namespace: str, case: str):
    manifest = render(case, namespace)
    job = obj(manifest)
    # lightkube's models would silently drop a field they do not know.
    assert job.to_dict() == manifest
    created = kube.create(job, namespace=namespace, dry_run=True)
    assert missing(manifest, created.to_dict()) == []
    assert created.metadata is not None
    assert created.metadata.name == job_name(MATRIX[case][1])


def test_a_dry_run_creates_nothing(kube: Client, namespace: str):
    kube.create(obj(render("cpu-only", namespace)), namespace=namespace, dry_run=True)
    assert list(kube.list(Job, namespace=namespace)) == []


def pod_of(manifest: dict[str, Any], name: str) -> Any:
    template = manifest["spec"]["template"]
    return obj(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, **template["metadata"]},
            "spec": template["spec"],
        }
    )


def failed_create(kube: Client, namespace: str, job: str) -> str | None:
    for event in kube.list(Event, namespace=namespace):
        if event.involvedObject.name == job and event.reason == "FailedCreate":
            return event.message
    return None


def test_a_missing_priority_class_is_refused_only_when_the_pod_is_made(
    kube: Client, namespace: str
):
    manifest = render("priority-class-not-existing", namespace)
    # The Job passes (see the matrix); the same Pod is refused by the Priority admission...
    with pytest.raises(ApiError) as info:
        kube.create(pod_of(manifest, "probe"), namespace=namespace, dry_run=True)
    assert info.value.status.code == 403
    assert "no PriorityClass with name no-such-class was found" in (info.value.status.message or "")
    # ...and so a real Job exists, and its controller reports FailedCreate on it.
    kube.create(obj(manifest), namespace=namespace)
    message = eventually(
        lambda: failed_create(kube, namespace, manifest["metadata"]["name"]),
        30,
        what="the Job controller's FailedCreate event",
    )
    assert "no PriorityClass with name no-such-class was found" in message


@pytest.fixture
def priority_class(kube: Client) -> Iterator[str]:
    name = f"batch-{uuid.uuid4().hex[:6]}"
    kube.create(PriorityClass(metadata=ObjectMeta(name=name), value=1000))
    yield name
    kube.delete(PriorityClass, name)


def test_an_existing_priority_class_reaches_the_pod(
    kube: Client, namespace: str, priority_class: str
):
    job = parse_training_job(training_job(priorityClass=priority_class))
    manifest = render_job(JOB_ID, job, namespace, dataset=None)
    kube.create(obj(manifest), namespace=namespace)
    pods = eventually(
        lambda: list(kube.list(Pod, namespace=namespace, labels={"kubetrain.io/job-id": JOB_ID})),
        30,
        what="the Job's Pod",
    )
    assert pods[0].spec.priorityClassName == priority_class
    assert pods[0].spec.priority == 1000
