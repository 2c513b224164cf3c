"""The real pool's default StorageClass: a claim that names no class is provisioned by
rancher's local-path-provisioner (a host process of the testbed) on the node where its
first Pod is scheduled, and mounted there by the real kubelet."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import PersistentVolume, PersistentVolumeClaim

from kubetrain.runtime import checkpoint_files
from kubetrain.testbed.cluster import Testbed
from tests.e2e.conftest import Server
from tests.e2e.test_lifecycle import assert_valid_path, business_path, get
from tests.kube import create
from tests.realnode.test_real_pool import job, submit, wait_for
from tests.realnode.test_recovery import made_namespace

pytestmark = pytest.mark.realnode

STEPS = 10
EVERY = 5


@pytest.fixture
def namespace(real_kube: Client, real_testbed: Testbed) -> Iterator[str]:
    # Deleting the claim with it releases the volume: the provisioner's teardown removes it.
    with made_namespace(real_kube, real_testbed) as name:
        yield name


def test_a_claim_without_a_class_is_provisioned_on_the_job_s_node_and_holds_its_checkpoints(
    real_server: Server, real_kube: Client, real_testbed: Testbed, namespace: str
) -> None:
    p = namespace
    create(
        real_kube,
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "checkpoints"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
        p,
    )
    pvc = real_kube.get(PersistentVolumeClaim, "checkpoints", namespace=p)
    # The admission gave it the default class; it waits for its first consumer.
    assert pvc.spec.storageClassName == "local-path"
    assert pvc.status.phase == "Pending"

    body = job(
        "on-local-path",
        p,
        args=[
            "python",
            "-m",
            "kubetrain.testbed.tiny_training",
            *("--steps", str(STEPS), "--every", str(EVERY)),
        ],
        resources={"requests": {"cpu": "1", "memory": "1Gi"}},
        checkpoints={"claim": "checkpoints"},
        retries=0,
    )
    job_id = submit(real_server, body)
    wait_for(real_server, p, job_id, "SUCCEEDED", "COMPLETED", timeout=180)
    assert_valid_path(business_path(real_server, p, job_id))
    [attempt] = get(real_server, p, job_id, "/attempts")["items"]
    node = attempt["node"]

    # Bound to a volume the provisioner made, on the node the job ran on.
    pvc = real_kube.get(PersistentVolumeClaim, "checkpoints", namespace=p)
    assert pvc.status.phase == "Bound"
    pv = real_kube.get(PersistentVolume, pvc.spec.volumeName)
    annotations = pv.metadata.annotations or {}
    assert annotations["pv.kubernetes.io/provisioned-by"] == "rancher.io/local-path"
    assert pv.spec.storageClassName == "local-path"
    [term] = pv.spec.nodeAffinity.required.nodeSelectorTerms
    assert [(e.key, e.values) for e in term.matchExpressions] == [
        ("kubernetes.io/hostname", [node])
    ]

    # Its directory is on this machine, in that node's part of the testbed's state
    # directory, and holds the checkpoints the training wrote through the mount.
    directory = Path(pv.spec.hostPath.path)
    assert directory.is_relative_to(real_testbed.state_dir / "nodes" / node / "local-path")
    assert directory.name == f"{pv.metadata.name}_{p}_checkpoints"
    newest = checkpoint_files.scan(directory, checksums=True)[0]
    assert (newest.step, newest.problem) == (STEPS, None)
    assert newest.manifest["pod"] == attempt["pod"]
