"""The real pool's default StorageClass and its provisioner's configuration."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubetrain.testbed import realnode as real
from kubetrain.testbed.cluster import Ports, State
from kubetrain.testbed.images import TRAINER_IMAGE

pytestmark = pytest.mark.unit


def node(tmp_path: Path, name: str, index: int) -> real.RealNode:
    return real.RealNode(
        name=name,
        index=index,
        directory=str(tmp_path / "nodes" / name),
        ip=f"10.244.0.{10 + index}",
        kubelet_port=1,
        healthz_port=2,
        stream_port=3,
        gpus=2,
        labels={},
        taints=[],
        cgroup=f"kubetrain-x-{name}",
    )


def test_each_real_node_gets_volumes_in_its_own_directory_and_no_other_node_any(tmp_path):
    nodes = [node(tmp_path, "real-0", 0), node(tmp_path, "real-1", 1)]
    assert real.provisioner_config(nodes) == {
        "nodePathMap": [
            {"node": "real-0", "paths": [str(tmp_path / "nodes" / "real-0" / "local-path")]},
            {"node": "real-1", "paths": [str(tmp_path / "nodes" / "real-1" / "local-path")]},
        ]
    }


def test_the_storage_class_is_the_default_waits_for_its_consumer_on_real_nodes(tmp_path):
    nodes = [node(tmp_path, "real-0", 0), node(tmp_path, "real-1", 1)]
    [sc] = [o for o in real.storage_objects(nodes) if o["kind"] == "StorageClass"]
    assert sc["metadata"]["name"] == "local-path"
    assert sc["metadata"]["annotations"] == {"storageclass.kubernetes.io/is-default-class": "true"}
    assert sc["provisioner"] == "rancher.io/local-path"
    assert sc["volumeBindingMode"] == "WaitForFirstConsumer"
    [term] = sc["allowedTopologies"]
    assert term["matchLabelExpressions"] == [
        {"key": "kubernetes.io/hostname", "values": ["real-0", "real-1"]}
    ]


def test_the_helper_pod_uses_the_imported_trainer_image_and_never_pulls():
    [container] = real.helper_pod()["spec"]["containers"]
    assert (container["image"], container["imagePullPolicy"]) == (TRAINER_IMAGE, "Never")


def test_a_real_pool_s_provisioner_is_a_component_the_testbed_starts_and_stops(tmp_path):
    state = State(name="t", pool="real", bin_dir=str(tmp_path), ports=Ports(1, 2, 3, 4, 5, 6))
    assert "local-path-provisioner" not in state.components()
    state.network = real.Network(bridge="kt0", cidr="10.244.0.0/16", gateway="10.244.0.1")
    assert state.components()["local-path-provisioner"] == tmp_path / "local-path-provisioner"
