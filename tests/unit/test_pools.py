import pytest

from kubetrain.testbed.pools import (
    KWOK_NODE_ANNOTATION,
    PoolError,
    builtin_pools,
    load_pool,
    parse_pool,
)

pytestmark = pytest.mark.unit

GOOD = """
apiVersion: testbed.kubetrain.io/v1
kind: NodePool
name: tiny
groups:
  - name: gpu
    count: 2
    labels: {accelerator: nvidia-h100}
    capacity: {cpu: "8", memory: 64Gi, pods: "110", nvidia.com/gpu: "4"}
    taints: [{key: nvidia.com/gpu, value: present, effect: NoSchedule}]
"""


def test_builtin_pools_are_shipped_and_valid():
    assert {"default", "no-gpu", "large"} <= set(builtin_pools())
    default = load_pool("default")
    gpu_nodes = [n for n in default.nodes() if "nvidia.com/gpu" in n["status"]["capacity"]]
    assert len(gpu_nodes) == 2
    assert all(n["status"]["allocatable"]["nvidia.com/gpu"] == "8" for n in gpu_nodes)
    assert all(
        n["spec"]["taints"]
        == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
        for n in gpu_nodes
    )
    assert default.node_count() == 4
    assert not any("nvidia.com/gpu" in n["status"]["capacity"] for n in load_pool("no-gpu").nodes())
    assert load_pool("large").node_count() >= 500


def test_nodes_are_kwok_managed_and_labelled():
    pool = parse_pool(GOOD)
    nodes = pool.nodes()
    assert [n["metadata"]["name"] for n in nodes] == ["gpu-0", "gpu-1"]
    assert nodes[0]["metadata"]["annotations"] == {KWOK_NODE_ANNOTATION: "fake"}
    assert nodes[0]["metadata"]["labels"]["accelerator"] == "nvidia-h100"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("count: 2", "count: 2\n    colour: red"), r"groups\.0\.colour: unknown field"),
        (
            ("memory: 64Gi", "memory: 64GB"),
            r"groups\.0\.capacity: .*capacity\.memory: '64GB' is not",
        ),
        (("memory: 64Gi", "memory: -1Gi"), r"capacity\.memory: must not be negative"),
        (("effect: NoSchedule", "effect: Sometimes"), r"groups\.0\.taints\.0\.effect"),
        (("name: gpu", "name: GPU_nodes"), r"groups\.0\.name"),
        (("kind: NodePool", "kind: Pool"), r"kind"),
        (('pods: "110", ', ""), r"capacity\.pods is required"),
    ],
)
def test_bad_pool_files_name_the_field(change, message):
    with pytest.raises(PoolError, match=message):
        parse_pool(GOOD.replace(*change), "tiny.yaml")


def test_unknown_pool_lists_the_known_ones():
    with pytest.raises(PoolError, match="use one of default, large, no-gpu"):
        load_pool("gpu-galore")


def test_not_yaml():
    with pytest.raises(PoolError, match="not valid YAML"):
        parse_pool("groups: [", "broken.yaml")


REAL = """
apiVersion: testbed.kubetrain.io/v1
kind: NodePool
name: mixed
groups:
  - name: real
    kind: real
    count: 2
    gpus: 2
    labels: {accelerator: testbed-no-gpu}
  - name: cpu
    count: 1
    capacity: {cpu: "8", memory: 64Gi, pods: "110"}
"""


def test_real_groups_are_started_not_created_as_node_objects():
    pool = parse_pool(REAL)
    assert [g.name for g in pool.real_groups()] == ["real"]
    assert pool.node_count() == 3
    # KWOK's Node objects only: real kubelets register their own.
    assert [n["metadata"]["name"] for n in pool.nodes()] == ["cpu-0"]
    labels = pool.labels(pool.real_groups()[0], "real-0")
    assert labels["type"] == "real"
    assert labels["testbed.kubetrain.io/pool"] == "mixed"
    assert load_pool("real").real_groups()[0].gpus == 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("gpus: 2", 'capacity: {cpu: "8"}'), r"groups\.0: .*capacity: a real node's capacity"),
        (("count: 1", "count: 1\n    gpus: 1"), r"groups\.1: .*gpus: only for kind: real"),
        (("count: 2", "count: 9"), r"count: at most 8 real nodes"),
        (("kind: real", "kind: virtual"), r"groups\.0\.kind"),
        (("name: cpu", "name: real"), r"two groups give nodes the same name"),
    ],
)
def test_bad_real_groups_name_the_field(change, message):
    with pytest.raises(PoolError, match=message):
        parse_pool(REAL.replace(*change), "mixed.yaml")
