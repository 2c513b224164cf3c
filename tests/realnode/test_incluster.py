"""kubetrain installed in the cluster as an operator installs it, and broken as one would.

`Testbed.install_kubetrain` (what `kubetrain testbed up --pool real --in-cluster` runs)
adds to the session's real pool what an in-cluster kubetrain needs: kube-proxy, Debian's
PostgreSQL on the Pod network's gateway, and `kubectl apply -k` of an overlay of
deploy/base (the testbed's image and database URL only). Two replicas then run as Pods on
the real kubelets with the ServiceAccount token the kubelet projects, the RBAC as
written, the Lease between them and the Service routed by kube-proxy; the training Pods
report to that Service. The tests drive it with the SDK from this machine, through the
Service's ClusterIP, as `kubetrain testbed env` says.
"""

from __future__ import annotations

import shlex
import subprocess
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import Client as Kube
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.batch_v1 import Job as KubeJob
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Pod

from kubetrain import Client
from kubetrain.client import ClientError
from kubetrain.domain.manifest import LABEL_JOB_ID
from kubetrain.local_server import CLI
from kubetrain.testbed import incluster
from kubetrain.testbed.cluster import Testbed
from kubetrain.testbed.images import TRAINER_IMAGE
from tests.kube import eventually
from tests.realnode.test_real_pool import kubectl

pytestmark = pytest.mark.realnode

NS = incluster.NAMESPACE
# tiny_training: real torch on CPU, a step every 0.5 s, reporting each to the Service;
# its checkpoints in the container's own /tmp (no volume: nothing here resumes).
STEPS = 40
TRAINING = [
    "sh",
    "-c",
    "KUBETRAIN_CHECKPOINT_DIR=/tmp/checkpoints exec python -m kubetrain.testbed.tiny_training"
    f" --steps {STEPS} --every 10 --step-seconds 0.5",
]


@pytest.fixture(scope="module")
def in_cluster(real_testbed: Testbed) -> Iterator[incluster.InCluster]:
    """kubetrain installed into the session's real pool for this module, then removed
    (an install the testbed was started with, --in-cluster, is left as it is)."""
    found = real_testbed.state().in_cluster
    if found is not None:
        yield found
        return
    installed = real_testbed.install_kubetrain()
    try:
        yield installed
    finally:
        real_testbed.uninstall_kubetrain()


@pytest.fixture
def client(real_testbed: Testbed, in_cluster: incluster.InCluster) -> Iterator[Client]:
    env = real_testbed.kubetrain_env()
    with Client(url=env["KUBETRAIN_URL"], token=env["KUBETRAIN_TOKEN"]) as sdk:
        yield sdk


def training_job(project: str) -> dict[str, Any]:
    return {
        "apiVersion": "kubetrain.io/v1",
        "kind": "TrainingJob",
        "metadata": {"name": "tiny", "project": project},
        "spec": {
            "image": TRAINER_IMAGE,
            "args": TRAINING,
            "resources": {"requests": {"cpu": "200m", "memory": "1Gi"}},  # torch
        },
    }


def lease_holder(kube: Kube) -> str:
    lease = kube.get(Lease, incluster.LEASE, namespace=NS)
    return str(lease.spec.holderIdentity or "")


def kubetrain_pods(kube: Kube) -> list[Pod]:
    return [
        p
        for p in kube.list(Pod, namespace=NS, labels={"app.kubernetes.io/name": "kubetrain"})
        if p.metadata.deletionTimestamp is None
    ]


def pod_of(holder: str, pods: list[Pod]) -> str | None:
    """The Pod whose replica holds the Lease: its identity is `<hostname>-<pid>-<random>`,
    and a Pod's hostname is its name."""
    for pod in pods:
        if holder.startswith(f"{pod.metadata.name}-"):
            return str(pod.metadata.name)
    return None


def ready(pod: Pod) -> bool:
    conditions = (pod.status and pod.status.conditions) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def test_two_replicas_run_as_deploy_base_says(real_testbed: Testbed, in_cluster, real_kube):
    pods = kubetrain_pods(real_kube)
    assert len(pods) == 2
    assert all(ready(p) for p in pods)
    assert {p.spec.nodeName for p in pods} <= {"real-0", "real-1"}
    for pod in pods:
        (container,) = pod.spec.containers
        assert container.image == "localhost/kubetrain:testbed"
        assert container.readinessProbe.httpGet.path == "/readyz"
        assert container.startupProbe.httpGet.path == "/healthz"
        assert pod.spec.serviceAccountName == "kubetrain"
    # The process runs as the base's user, on a read-only root file system: what the
    # kernel says of PID 1 in the container, and a write refused.
    name = pods[0].metadata.name
    status = exec_in(real_testbed, name, "cat", "/proc/1/status")
    uids = next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1:]
    assert set(uids) == {"10001"}
    refused = exec_in(real_testbed, name, "sh", "-c", "touch /probe 2>&1; echo rc=$?")
    assert "Read-only file system" in refused
    assert "rc=1" in refused
    # The ServiceAccount token the kubelet projects (admission's kube-api-access volume)
    # is what it talks to the API with: a replica holds the Lease, which only RBAC's
    # Role for the ServiceAccount `kubetrain` allows.
    sources = [
        src
        for v in pods[0].spec.volumes
        if v.projected is not None
        for src in v.projected.sources
        if src.serviceAccountToken is not None
    ]
    assert sources
    holder = eventually(lambda: lease_holder(real_kube), 30, what="a Lease holder")
    assert pod_of(holder, pods) is not None


def test_testbed_env_gives_the_services_url_and_an_admin_token(real_testbed: Testbed, in_cluster):
    done = subprocess.run(
        [*CLI, "testbed", "env", "--state-dir", str(real_testbed.state_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    exports = dict(
        shlex.split(line.removeprefix("export "))[0].split("=", 1)
        for line in done.stdout.splitlines()
    )
    assert exports["KUBETRAIN_URL"] == in_cluster.url
    # An admin's token: every project's jobs may be listed with it.
    with Client(url=exports["KUBETRAIN_URL"], token=exports["KUBETRAIN_TOKEN"]) as sdk:
        assert sdk.jobs(project=f"incluster-{uuid.uuid4().hex[:6]}") == []


def exec_in(testbed: Testbed, pod: str, *argv: str) -> str:
    return kubectl(testbed, "-n", NS, "exec", pod, "--", *argv)


def test_leader_pod_deleted_mid_training_the_job_succeeds_once(client: Client, real_kube: Kube):
    project = f"incluster-{uuid.uuid4().hex[:6]}"
    job = client.submit(training_job(project), project=project)
    client.wait(job.id, project, until="RUNNING", timeout=120, poll_interval=0.5)

    pods = kubetrain_pods(real_kube)
    leader = pod_of(lease_holder(real_kube), pods)
    assert leader is not None, "no replica holds the Lease"
    real_kube.delete(Pod, leader, namespace=NS)

    done = client.wait(job.id, project, timeout=180, poll_interval=1)
    assert done.state == "SUCCEEDED", (done.state, done.reason)
    lines = list(client.logs(job.id, project))
    assert lines[-1].startswith("final weights sha256 "), lines[-3:]
    assert any(line.startswith(f"step {STEPS} loss ") for line in lines)
    assert client.why(job.id, project).reason == "COMPLETED"
    # Its Pod reported every step to the in-cluster Service (kube-proxy routed them).
    assert_every_step_reported(client, job.id, project, done.progress)

    # The Lease went to the replica that was not deleted (or the one that replaced it).
    new_holder = lease_holder(real_kube)
    assert not new_holder.startswith(f"{leader}-")
    assert pod_of(new_holder, kubetrain_pods(real_kube)) is not None
    # Exactly one Kubernetes Job per attempt: the new leader did not dispatch again.
    # (A one-worker job's attempts are Pods of its one Job; a gang makes a Job for each.)
    jobs = list(real_kube.list(KubeJob, namespace=project, labels={LABEL_JOB_ID: job.id}))
    assert done.attempt == 1
    assert len(jobs) == 1
    # The Deployment brought itself back to two ready replicas.
    eventually(
        lambda: incluster.rolled_out(real_kube.get(Deployment, incluster.DEPLOYMENT, namespace=NS)),
        120,
        what="the Deployment back at 2 ready replicas",
    )


def test_a_rolling_update_with_a_job_running_loses_nothing(
    real_testbed: Testbed, client: Client, real_kube: Kube
):
    project = f"incluster-{uuid.uuid4().hex[:6]}"
    job = client.submit(training_job(project), project=project)
    client.wait(job.id, project, until="RUNNING", timeout=120, poll_interval=0.5)
    before = {p.metadata.name for p in kubetrain_pods(real_kube)}
    # The API asked all along, as users do while the platform team rolls out.
    asked, failed = [0], list[str]()
    stop = threading.Event()

    def ask() -> None:
        while not stop.is_set():
            try:
                client.get(job.id, project)
                asked[0] += 1
            except ClientError as exc:
                failed.append(str(exc))
            stop.wait(0.1)

    asking = threading.Thread(target=ask, daemon=True)
    asking.start()
    # What `kubectl rollout restart` does: a new template, every Pod replaced one by one
    # (the base's default strategy: one surge, none unavailable).
    exec_kubectl(real_testbed, "rollout", "restart", f"deployment/{incluster.DEPLOYMENT}")
    try:
        eventually(
            lambda: (
                incluster.rolled_out(real_kube.get(Deployment, incluster.DEPLOYMENT, namespace=NS))
                and not before & {p.metadata.name for p in kubetrain_pods(real_kube)}
            ),
            180,
            what="the rollout done",
        )
    finally:
        stop.set()
        asking.join()
    assert failed == []
    assert asked[0] > 0

    done = client.wait(job.id, project, timeout=240, poll_interval=1)
    assert done.state == "SUCCEEDED", (done.state, done.reason)
    assert_every_step_reported(client, job.id, project, done.progress)
    jobs = list(real_kube.list(KubeJob, namespace=project, labels={LABEL_JOB_ID: job.id}))
    assert done.attempt == 1
    assert len(jobs) == 1
    after = {p.metadata.name for p in kubetrain_pods(real_kube)}
    assert not before & after  # every replica was replaced
    assert pod_of(lease_holder(real_kube), kubetrain_pods(real_kube)) in after


def assert_every_step_reported(
    client: Client, job_id: str, project: str, progress: dict[str, Any] | None
) -> None:
    """The job's progress reached its last step; if not, what its Pod's reporter said
    (its warnings, on the container's log: an answer it got, a failure to send)."""
    if (progress or {}).get("step") != STEPS:
        said = [line for line in client.logs(job_id, project) if line.startswith("kubetrain:")]
        pytest.fail(f"progress {progress}, not step {STEPS}; the Pod's reporter said: {said}")


def exec_kubectl(testbed: Testbed, *args: str) -> str:
    return kubectl(testbed, "-n", NS, *args)


def iptables(*args: str) -> None:
    subprocess.run(["iptables", *args], check=True, capture_output=True, timeout=30)


def test_a_replica_cut_off_from_postgresql_leaves_the_service(
    real_testbed: Testbed, in_cluster: incluster.InCluster, client: Client, real_kube: Kube
):
    pods = kubetrain_pods(real_kube)
    leader = pod_of(lease_holder(real_kube), pods)
    (standby,) = [p for p in pods if p.metadata.name != leader]
    postgres = in_cluster.postgres
    # The network refuses that Pod's packets to PostgreSQL, established ones too.
    rule = ["INPUT", "-s", standby.status.podIP, "-d", postgres["address"], "-p", "tcp"]
    rule += ["--dport", str(postgres["port"]), "-j", "REJECT", "--reject-with", "tcp-reset"]
    iptables("-I", *rule)
    try:

        def unready() -> bool:
            pod = real_kube.get(Pod, standby.metadata.name, namespace=NS)
            return not ready(pod)

        # The readiness probe's 3 failures, 10 s apart.
        eventually(unready, 90, interval=1, what="the cut-off replica not Ready")
        # kube-proxy sends nothing more to it: every request is answered by the other
        # replica, whose /readyz says ready (the cut-off one would answer 503).
        url = real_testbed.kubetrain_env()["KUBETRAIN_URL"]

        def only_the_ready_one_answers() -> bool:
            return all(http_status(f"{url}/readyz") == 200 for _ in range(20))

        eventually(only_the_ready_one_answers, 30, interval=1, what="no request to it")
    finally:
        iptables("-D", *rule)
    eventually(
        lambda: ready(real_kube.get(Pod, standby.metadata.name, namespace=NS)),
        90,
        interval=1,
        what="the replica Ready again once it reaches PostgreSQL",
    )


def http_status(url: str) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
