"""deploy/base against the real API server: every object passes a server-side dry-run,
and `kubetrain serve` running with nothing but the ServiceAccount's RBAC takes a job
to SUCCEEDED and cancels another, while what the RBAC does not grant is Forbidden.

The server authenticates with a token the API server issued to that
ServiceAccount (TokenRequest), the same credential a Pod of the Deployment gets;
impersonation would need the admin credential inside the server process.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
import yaml
from lightkube import ApiError, Client
from lightkube.codecs import from_dict
from lightkube.config.kubeconfig import KubeConfig
from lightkube.models.core_v1 import Container, PodSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.batch_v1 import Job
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import ConfigMap, Namespace, Pod, Secret, ServiceAccount
from prometheus_client.parser import text_string_to_metric_families

from kubetrain.domain.manifest import LABEL_JOB_ID, job_name
from kubetrain.local_server import LocalServer
from kubetrain.testbed.cluster import Testbed
from tests.kube import account_kubeconfig, account_token, bound_token, eventually, get

pytestmark = pytest.mark.testbed

BASE = Path(__file__).resolve().parents[2] / "deploy/base"
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
RBAC_KINDS = {"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}


def base(namespace: str, suffix: str) -> list[dict[str, Any]]:
    """The base's objects moved to `namespace` and cluster-wide names given `suffix`,
    as `kustomize edit set namespace` and `nameSuffix` would (tests share a cluster)."""
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    out = []
    for name in kustomization["resources"]:
        for doc in yaml.safe_load_all((BASE / name).read_text()):
            doc = copy.deepcopy(doc)
            meta = doc["metadata"]
            if doc["kind"] in CLUSTER_SCOPED:
                meta["name"] += suffix
            else:
                meta["namespace"] = namespace
            for subject in doc.get("subjects", []):
                subject["namespace"] = namespace
            if doc["kind"] == "ClusterRoleBinding":
                doc["roleRef"]["name"] += suffix
            out.append(doc)
    return out


def test_every_object_of_the_base_passes_a_server_side_dry_run(kube: Client, namespace: str):
    documents = base(namespace, f"-{uuid.uuid4().hex[:6]}")
    assert {d["kind"] for d in documents} >= {
        "Namespace",
        "Deployment",
        "Service",
        "ConfigMap",
        *RBAC_KINDS,
    }
    for doc in documents:
        obj: Any = from_dict(doc)
        created = kube.create(obj, dry_run=True)
        assert created.metadata.name == doc["metadata"]["name"]
    # A dry run writes nothing.
    assert get(kube, ServiceAccount, "kubetrain", namespace) is None


@pytest.fixture
def service_account(kube: Client, namespace: str) -> Iterator[str]:
    """The base's ServiceAccount and RBAC, applied for real in `namespace`."""
    suffix = f"-{namespace}"
    applied = [d for d in base(namespace, suffix) if d["kind"] in RBAC_KINDS]
    for doc in applied:
        kube.create(from_dict(doc))
    yield "kubetrain"
    for doc in applied:
        if doc["kind"] in CLUSTER_SCOPED:
            kind = type(from_dict(doc))
            kube.delete(kind, doc["metadata"]["name"])


def token_kubeconfig(testbed: Testbed, kube: Client, namespace: str, account: str, path: Path):
    token = account_token(kube, namespace, account)
    account_kubeconfig(testbed, account, {"token": token}, path)
    return token


def wait_for(http: httpx.Client, project: str, job_id: str, state: str) -> dict[str, Any]:
    last: dict[str, Any] = {}

    def probe() -> dict[str, Any] | None:
        last.update(http.get(f"/api/v1/projects/{project}/jobs/{job_id}").json())
        return last if last["business_status"] == state else None

    return eventually(probe, 90, what=f"{job_id} {state} (last {last})")


def training_job(name: str, project: str, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "kubetrain.io/v1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "project": project},
        "spec": {
            "image": "registry.example/trainer:2026-08",
            "command": ["python", "train.py"],
            "resources": {"requests": {"cpu": "2", "memory": "8Gi"}, "gpus": gpus},
        },
    }


def test_kubetrain_runs_on_its_service_accounts_rbac_alone(
    testbed: Testbed,
    kube: Client,
    namespace: str,
    service_account: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
):
    kubeconfig = tmp_path / "sa.kubeconfig"
    sa_token = token_kubeconfig(testbed, kube, namespace, service_account, kubeconfig)
    project = f"sa-{uuid.uuid4().hex[:8]}"  # its namespace does not exist yet
    log = tmp_path / "serve.log"
    monkeypatch.setenv("KUBETRAIN_LOG_FORMAT", "json")
    server = LocalServer(
        database_url=f"sqlite:///{tmp_path / 'kubetrain.db'}",
        log=log,
        kubeconfig=kubeconfig,
        args=["--lease-namespace", namespace],
    )
    # As deployed: every Pod reports with a projected token, checked by a TokenReview.
    server.extra_env["KUBETRAIN_STATUS_URL"] = server.url
    try:
        with server.start(), server.client() as http:
            jobs = f"/api/v1/projects/{project}/jobs"
            done = http.post(jobs, json=training_job("fits", project, gpus=1))
            assert done.status_code == 201, done.text
            waiting = http.post(jobs, json=training_job("waits", project, gpus=64))
            waiting_id = waiting.json()["id"]
            wait_for(http, project, waiting_id, "QUEUED")
            assert http.post(f"{jobs}/{waiting_id}/cancel").status_code == 200
            job = wait_for(http, project, done.json()["id"], "SUCCEEDED")
            assert job["exit_code"] == 0
            # the logs read the Pod's node (`get` nodes): a KWOK node is said to have none
            logs = http.get(f"{jobs}/{job['id']}/logs")
            assert logs.status_code == 409, logs.text
            assert "fake nodes run no containers" in logs.json()["detail"]
            # the cancelled job's Job is deleted, which takes the `delete` verb
            eventually(
                lambda: get(kube, Job, job_name(waiting_id), project) is None,
                60,
                what="the cancelled job's Job deleted",
            )
            assert get(kube, Lease, "kubetrain-controller", namespace) is not None
            # No Secret for a job: the RBAC has no rule on Secrets. Its Pod's reports
            # are checked by a TokenReview, which the RBAC grants: the finished job's
            # Pod is found to be its (a refused review would be a 503, an unknown Pod a
            # 401) and told that the job's record is final.
            assert (
                list(kube.list(Secret, namespace=project, labels={LABEL_JOB_ID: waiting_id})) == []
            )
            pod = next(iter(kube.list(Pod, namespace=project, labels={LABEL_JOB_ID: job["id"]})))
            pod_token = bound_token(kube, project, pod)
            report = http.post(
                f"/api/v1/jobs/{job['id']}/reports",
                json={"pod": pod.metadata.name, "events": []},
                headers={"Authorization": f"Bearer {pod_token}"},
            )
            assert report.status_code == 410, report.text
            assert report.json()["type"] == "urn:kubetrain:problem:job-finished"
            metrics = {
                (s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(http.get("/metrics").text)
                for s in family.samples
            }
            assert metrics[("kubetrain_leader", ())] == 1
            assert metrics[("kubetrain_watch_connected", (("resource", "pods"),))] == 1
            assert metrics[("kubetrain_dispatcher_jobs_created_total", ())] == 2
            assert (
                metrics[
                    ("kubetrain_watch_relists_total", (("cause", "start"), ("resource", "jobs")))
                ]
                == 1
            )
            # What the history says happened, the metrics count: each job the syncer
            # changed is one lag at least (a fast job may go QUEUED -> SUCCEEDED in one
            # round), and each state left is one stay.
            history = {
                job_id: [
                    row
                    for row in http.get(f"{jobs}/{job_id}/history").json()["items"]
                    if row["kind"] == "business"
                ]
                for job_id in (waiting_id, job["id"])
            }
            synced = [
                j for j, rows in history.items() if any(r["source"] == "syncer" for r in rows)
            ]
            assert synced, history
            assert metrics[("kubetrain_sync_lag_seconds_count", ())] >= len(synced), history
            # A state is left by a row that moves to another (a reason's change
            # within the state stays in it).
            left = Counter(
                r["from_state"]
                for rows in history.values()
                for r in rows
                if r["from_state"] and r["from_state"] != r["to_state"]
            )
            assert {"CREATED", "QUEUED"} <= set(left), history
            for state, times in left.items():
                assert (
                    metrics[("kubetrain_job_state_seconds_count", (("state", state),))] >= times
                ), history
            assert (
                metrics[("kubetrain_jobs", (("reason", "COMPLETED"), ("state", "SUCCEEDED")))] == 1
            )
            assert http.get("/readyz").status_code == 200
    finally:
        server.stop()
        try:
            kube.delete(Namespace, project)
        except ApiError as exc:
            if exc.status.code != 404:
                raise

    # Nothing outside the RBAC: the same credential is refused the rest.
    as_account = Client(config=KubeConfig.from_file(kubeconfig))
    for refused in (
        lambda: list(as_account.list(Secret, namespace=namespace)),
        lambda: list(as_account.list(ConfigMap, namespace=namespace)),
        lambda: as_account.create(
            Pod(
                metadata=ObjectMeta(name="x", namespace=namespace),
                spec=PodSpec(containers=[Container(name="x", image="x")]),
            )
        ),
        lambda: as_account.delete(Namespace, namespace),
        lambda: as_account.get(Lease, "someone-elses-lease", namespace=namespace),
        lambda: list(as_account.list(Lease, namespace="kube-system")),
    ):
        with pytest.raises(ApiError) as refusal:
            refused()
        assert refusal.value.status.code == 403

    # The log: one JSON object a line, job ids as fields, no credential anywhere.
    text = log.read_text()
    entries = [json.loads(line) for line in text.splitlines() if line.strip()]
    assert any(e.get("job_id") == waiting_id for e in entries)
    assert any("attempt" in e for e in entries)
    assert sa_token not in text
    assert server.token not in text
