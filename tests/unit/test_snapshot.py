"""Snapshots from dumps: merging, narrowing, garbage, and diagnosis speed at cluster scale."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubetrain.domain.diagnosis import JobFacts, diagnose
from kubetrain.domain.snapshot import Snapshot, SnapshotError
from kubetrain.domain.states import BusinessState, ReasonCode
from tests.unit.diagnosis_helpers import NOW, SNAPSHOTS, dump, facts, items, the_job

pytestmark = pytest.mark.unit

R = ReasonCode


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ([], "array"),
        ("text", "str"),
        (None, "empty"),
        ({"hello": "world"}, "not a Kubernetes List or object"),
        ({"kind": "List", "items": "nope"}, "items is str"),
    ],
)
def test_garbage_is_a_clear_error(data: object, says: str) -> None:
    with pytest.raises(SnapshotError, match=says):
        Snapshot.from_list(data)


def test_unknown_kinds_and_non_objects_are_skipped_and_said() -> None:
    data = dump("running")
    job = facts(data)
    data["items"] += [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"}},
        {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "Job", "metadata": {"name": "y"}},
        42,
        {"metadata": {"name": "no-kind"}},
    ]
    snap = Snapshot.from_list(data)
    assert len(snap.jobs) == 1
    assert any("Deployment" in s and "Job (jobset.x-k8s.io/v1alpha2)" in s for s in snap.skipped)
    assert any("2 items" in s for s in snap.skipped)
    d = diagnose(job, snap, NOW)
    assert d.reason is R.TRAINING
    assert any("Deployment" in n for n in d.notes)


def test_typed_lists_and_single_objects_and_empty_lists() -> None:
    data = dump("running")
    pods = {
        "kind": "PodList",
        "apiVersion": "v1",
        "items": [
            {k: v for k, v in p.items() if k not in ("kind", "apiVersion")}
            for p in items(data, "Pod")
        ],
    }
    merged = Snapshot.from_lists([pods, the_job(data), {"kind": "List", "items": None}])
    assert (len(merged.pods), len(merged.jobs)) == (1, 1)


def test_several_dumps_merge_and_repeats_count_once() -> None:
    data = dump("gpu-busy")
    nodes = {"kind": "List", "items": items(data, "Node")}
    rest = {"kind": "List", "items": [i for i in data["items"] if i["kind"] != "Node"]}
    merged = Snapshot.from_lists([rest, nodes, copy.deepcopy(nodes)])
    whole = Snapshot.from_list(data)
    assert len(merged.nodes) == len(whole.nodes) == 4
    job = facts(data)
    assert diagnose(job, merged, NOW) == diagnose(job, whole, NOW)


def test_events_k8s_io_events_are_read_like_core_events() -> None:
    data = dump("real-mount-failed")
    for event in items(data, "Event"):
        if event["reason"] == "FailedMount":
            new = {
                "apiVersion": "events.k8s.io/v1",
                "kind": "Event",
                "metadata": event["metadata"],
                "regarding": event["involvedObject"],
                "reason": event["reason"],
                "note": event["message"],
                "type": event["type"],
                "eventTime": "2026-12-02T15:14:48.000000Z",
                "reportingController": "kubelet",
            }
            data["items"][data["items"].index(event)] = new
    d = diagnose(facts(data), Snapshot.from_list(data), NOW)
    assert d.reason is R.VOLUME_SOURCE_NOT_FOUND
    assert d.raw_message is not None
    assert "MountVolume.SetUp failed" in d.raw_message


def test_for_job_keeps_every_pods_usage_of_the_nodes() -> None:
    data = dump("gpu-busy")
    whole = Snapshot.from_list(data)
    job = facts(data)
    narrow = whole.for_job(job.k8s_name, job.namespace)
    assert [p["metadata"]["name"] for p in narrow.pods] == [
        p["metadata"]["name"] for p in whole.pods if p["metadata"]["name"].startswith("kt-")
    ]
    assert diagnose(job, narrow, NOW).waitable is True  # the other team's GPUs still count
    assert narrow.for_job(job.k8s_name, job.namespace).pods == narrow.pods


# -- odd fields never raise ---------------------------------------------------------------

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=8,
)


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    if isinstance(obj, dict):
        for key, value in obj.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(obj, list):
        for index, value in enumerate(obj):
            found += _paths(value, (*prefix, index))
    return found


_FIXTURES = sorted(p.stem for p in SNAPSHOTS.glob("*.json"))


def _read(dumped: dict[str, Any]) -> Snapshot | str:
    """The snapshot, or the words of its refusal."""
    try:
        return Snapshot.from_list(dumped)
    except SnapshotError as refused:
        return str(refused)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(_FIXTURES), st.data())
def test_any_field_replaced_by_anything_gives_a_diagnosis(name: str, data: st.DataObject) -> None:
    dumped = dump(name)
    job = facts(dumped)
    for _ in range(data.draw(st.integers(1, 4))):
        item = data.draw(st.sampled_from(dumped["items"]))
        paths = [p for p in _paths(item) if p[:1] != ("kind",)]
        if not paths:
            continue
        path = data.draw(st.sampled_from(paths))
        target = item
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = data.draw(_JSON)
    snapshot = _read(dumped)
    if isinstance(snapshot, str):
        assert snapshot  # a dump it cannot read is refused in words
        return
    diagnosis = diagnose(job, snapshot.for_job(job.k8s_name, job.namespace), NOW)
    said = json.loads(json.dumps(diagnosis.to_json(job.name)))
    assert said["job"] == job.name
    assert (BusinessState(said["business_status"]), ReasonCode(said["reason"])) == (
        diagnosis.state,
        diagnosis.reason,
    )
    assert said["explanation"]


def test_diagnosis_is_deterministic() -> None:
    data = dump("untolerated-taint")
    job = facts(data)
    first = diagnose(job, Snapshot.from_list(data), NOW)
    again = diagnose(job, Snapshot.from_list(dump("untolerated-taint")), NOW)
    assert first == again


# -- speed at cluster scale ---------------------------------------------------------------


def _scaled(nodes: int, pods: int) -> tuple[Snapshot, JobFacts]:
    """gpu-busy with `nodes` GPU nodes and `pods` other Pods bound across them."""
    data = dump("gpu-busy")
    node = next(n for n in items(data, "Node") if n["metadata"]["name"] == "gpu-h100-0")
    other = next(p for p in items(data, "Pod") if p["metadata"]["name"] == "other-team-0")
    objects: list[dict[str, Any]] = [i for i in data["items"] if i["kind"] not in ("Node", "Pod")]
    objects += [p for p in items(data, "Pod") if p["metadata"]["name"].startswith("kt-")]
    for n in range(nodes):
        copy_node = copy.deepcopy(node)
        copy_node["metadata"]["name"] = f"gpu-{n:04d}"
        objects.append(copy_node)
    for n in range(pods):
        pod = copy.deepcopy(other)
        pod["metadata"]["name"] = f"other-{n:05d}"
        pod["metadata"]["uid"] = f"uid-{n}"
        pod["spec"]["nodeName"] = f"gpu-{n % nodes:04d}"
        objects.append(pod)
    return Snapshot.from_list({"kind": "List", "items": objects}), facts(data)


def test_one_job_among_1000_nodes_and_10000_pods() -> None:
    # How long it takes is bench/diagnosis.py's (1,000 nodes, 1k-50k Pods, beside the
    # recorded 4-node dump in the same run); here, what it finds.
    snapshot, job = _scaled(1000, 10_000)
    narrow = snapshot.for_job(job.k8s_name, job.namespace)
    ours = [p["metadata"]["name"] for p in snapshot.pods if p["metadata"]["name"].startswith("kt-")]
    assert ours
    assert [p["metadata"]["name"] for p in narrow.pods] == ours  # not the 10,000 others
    diagnosis = diagnose(job, narrow, datetime.now(UTC))
    assert diagnosis.reason is R.INSUFFICIENT_GPU
    assert len(diagnosis.nodes) == 1000


def test_the_node_table_is_every_node_once_closest_first_then_by_name() -> None:
    # Nodes alike are grouped once per node list and their rows made on demand: the
    # table must still hold each node once, in the documented order, every time.
    snapshot, job = _scaled(50, 200)
    narrow = snapshot.for_job(job.k8s_name, job.namespace)
    every = sorted(n.name for n in snapshot.index.nodes)
    for _ in range(2):
        table = diagnose(job, narrow, NOW).nodes
        assert sorted(n.name for n in table) == every
        order = [(n.closeness, n.name) for n in table]
        assert order == sorted(order)
