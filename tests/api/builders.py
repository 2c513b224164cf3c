"""Small constructors for the API tests: TrainingJob documents and one token per role and scope."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2 as httpx
from fastapi.testclient import TestClient

from kubetrain.cluster.errors import ClusterError, ClusterRefused
from kubetrain.cluster.logs import LogRequest
from kubetrain.cluster.tokenreview import PodIdentity
from kubetrain.domain.manifest import job_name
from kubetrain.store import ALL_PROJECTS, Database, PodObservation, Role, create_token
from tests.store.builders import observe

SNAPSHOTS = Path(__file__).parent.parent / "fixtures" / "snapshots"
PROJECT = "ai-training"
OTHER = "other-team"
JOBS = f"/api/v1/projects/{PROJECT}/jobs"

BASE_JOB: dict[str, Any] = {
    "apiVersion": "kubetrain.io/v1",
    "kind": "TrainingJob",
    "metadata": {"name": "train-policy"},
    "spec": {
        "image": "registry.example/trainer:1",
        "command": ["python", "train.py"],
        "resources": {"requests": {"cpu": "4", "memory": "16Gi"}, "gpus": 1},
    },
}


def training_job(name: str = "train-policy", **spec: Any) -> dict[str, Any]:
    """A valid TrainingJob document; keyword arguments replace fields of `spec`."""
    document = copy.deepcopy(BASE_JOB)
    document["metadata"]["name"] = name
    document["spec"].update(spec)
    return document


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@dataclass(frozen=True)
class Tokens:
    """Plaintext tokens by (role, project); `*` is every project."""

    by_scope: dict[tuple[Role, str], str]

    def __call__(self, role: Role | str, project: str = PROJECT) -> dict[str, str]:
        return bearer(self.by_scope[(Role(role), project)])

    @property
    def admin(self) -> dict[str, str]:
        return self(Role.ADMIN, ALL_PROJECTS)


def make_tokens(db: Database) -> Tokens:
    made: dict[tuple[Role, str], str] = {}
    with db.transaction() as session:
        for role in Role:
            for project in (PROJECT, OTHER, ALL_PROJECTS):
                _token, plaintext = create_token(
                    session, name=f"{role}-{project}", role=role, project=project
                )
                made[(role, project)] = plaintext
    return Tokens(made)


def submit(
    client: TestClient,
    tokens: Tokens,
    document: dict[str, Any] | None = None,
    *,
    key: str | None = None,
) -> httpx.Response:
    """POST a job as the project's submitter; returns the response."""
    headers = tokens(Role.SUBMITTER)
    if key is not None:
        headers["Idempotency-Key"] = key
    return client.post(
        JOBS, json=document if document is not None else training_job(), headers=headers
    )


def submitted(client: TestClient, tokens: Tokens, name: str = "train-policy", **spec: Any) -> str:
    """The id of a newly submitted job."""
    response = submit(client, tokens, training_job(name, **spec))
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


class FakeLogs:
    """PodLogs' two calls: what they were asked, and answers set per Pod and node."""

    def __init__(self) -> None:
        self.asked: list[LogRequest] = []
        self.output: dict[str, list[str]] = {}
        self.fake_nodes: set[str] = set()
        self.refusals: dict[str, ClusterError] = {}  # what reading a Pod's log raises
        # Pods whose followed log never ends by itself (a lost node's kubelet).
        self.endless: set[str] = set()

    async def is_fake_node(self, name: str) -> bool:
        return name in self.fake_nodes

    async def lines(self, request: LogRequest) -> AsyncGenerator[str]:
        self.asked.append(request)
        if request.pod in self.refusals:
            raise self.refusals[request.pod]
        if request.pod not in self.output:
            # A Pod that is gone: the API server's 404 (only the code is read).
            raise ClusterRefused(404, "NotFound", "")
        for line in self.output[request.pod]:
            yield line
        if request.follow and request.pod in self.endless:
            await asyncio.Event().wait()


class FakeReviewer:
    """TokenReviewer's one call, faked at its boundary: the Pod each token is bound to.
    What the API server's TokenReview answers is tested on the testbed
    (tests/testbed/test_tokenreview.py) and with the kubelets' own tokens (tests/realnode)."""

    def __init__(self) -> None:
        self.pods: dict[str, PodIdentity] = {}
        self.reviews = 0

    async def review(self, token: str) -> PodIdentity | None:
        self.reviews += 1
        return self.pods.get(token)


def enrol(
    db: Database,
    reviewer: FakeReviewer,
    job_id: str,
    suffix: str = "abcde",
    *,
    namespace: str = PROJECT,
    **observed: Any,
) -> str:
    """A token of the job's Pod `<job>-<suffix>`, which the syncer has recorded as an
    attempt (`observed`: the PodObservation's other fields, e.g. a gang's rank)."""
    name = f"{job_name(job_id)}-{suffix}"
    uid = f"uid-{name}"
    with db.transaction() as session:
        observe(session, job_id, PodObservation(pod_name=name, pod_uid=uid, **observed))
    token = f"token-of-{name}"
    reviewer.pods[token] = PodIdentity(namespace, "default", name, uid)
    return token


# Three dumps recorded from the real Kueue, whose Workloads share ClusterQueue `gpus`:
# in WAITING's namespace one job admitted (8 GPUs) and one pending behind it; in
# NEVER_FITS' one asking for 16; in STOPPED's one held by the stopped ClusterQueue.
KUEUE_DUMPS = ("kueue-waiting", "kueue-never-fits", "kueue-stopped-cluster-queue")
WAITING_NAMESPACE = "fixture-kueue-waiting-a775"
NEVER_FITS_NAMESPACE = "fixture-kueue-never-fits-b504"
STOPPED_NAMESPACE = "fixture-kueue-stopped-cluster-queue-9f99"


def kueue_cluster() -> dict[str, Any]:
    """The three dumps as one List, as the watch caches hold them: the objects without a
    namespace (ClusterQueues, ResourceFlavors, Nodes) once."""
    items: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    for name in KUEUE_DUMPS:
        for item in json.loads((SNAPSHOTS / f"{name}.json").read_text())["items"]:
            meta = item["metadata"]
            if "namespace" not in meta:
                if (item["kind"], meta["name"]) in seen:
                    continue
                seen.add((item["kind"], meta["name"]))
            items.append(item)
    return {"apiVersion": "v1", "kind": "List", "items": items}


def own(listing: dict[str, Any], namespace: str, k8s_name: str, job_id: str) -> None:
    """Make a recorded Job the Kubernetes Job of kubetrain job `job_id` (the recorder
    labels every Job with the id `fixture`)."""
    (job,) = [
        i
        for i in listing["items"]
        if i["kind"] == "Job"
        and i["metadata"]["namespace"] == namespace
        and i["metadata"]["name"] == k8s_name
    ]
    job["metadata"]["labels"]["kubetrain.io/job-id"] = job_id
