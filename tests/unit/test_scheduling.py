"""The scheduler-message parser: real wordings of 1.2x-1.3x, and properties over generated ones."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubetrain.domain.scheduling import Filter, parse_scheduling_message, reason_of
from kubetrain.domain.states import ReasonCode
from tests.unit.diagnosis_helpers import dump, items

pytestmark = pytest.mark.unit

R = ReasonCode

Parts = list[tuple[Filter, int | None, str | None]]  # (filter, count, resource/taint/claim)


def recorded_verdict(name: str) -> str:
    """kube-scheduler's (v1.33) first FailedScheduling message in a recorded dump."""
    (first, *_) = [e for e in items(dump(name), "Event") if e["reason"] == "FailedScheduling"]
    message: str = first["message"]
    return message


# Verdicts recorded from the testbed's kube-scheduler (v1.33): (fixture, total, parts).
RECORDED: list[tuple[str, int, Parts]] = [
    (
        "untolerated-taint",
        4,
        [
            (Filter.INSUFFICIENT, 2, "nvidia.com/gpu"),
            (Filter.UNTOLERATED_TAINT, 2, "nvidia.com/gpu"),
        ],
    ),
    # PreFilter verdicts carry no count (1.23+).
    ("pvc-not-found", 4, [(Filter.PVC_NOT_FOUND, None, "dataset-imagenet")]),
    ("pvc-unbound", 4, [(Filter.PVC_UNBOUND, None, None)]),
    ("node-selector-mismatch", 4, [(Filter.NODE_AFFINITY, 4, None)]),
    ("cordoned", 4, [(Filter.INSUFFICIENT, 2, "nvidia.com/gpu"), (Filter.UNSCHEDULABLE, 2, None)]),
    (
        "placement-rules",
        4,
        [(Filter.POD_AFFINITY, 2, None), (Filter.UNTOLERATED_TAINT, 2, "nvidia.com/gpu")],
    ),
    (
        "volume-node-conflict",
        4,
        [(Filter.INSUFFICIENT, 2, "nvidia.com/gpu"), (Filter.VOLUME_NODE_AFFINITY, 2, None)],
    ),
    (
        "node-not-ready",
        4,
        [
            (Filter.INSUFFICIENT, 2, "nvidia.com/gpu"),
            (Filter.UNTOLERATED_TAINT, 2, "node.kubernetes.io/not-ready"),
        ],
    ),
    (
        "insufficient-cpu",
        4,
        [(Filter.INSUFFICIENT, 2, "cpu"), (Filter.UNTOLERATED_TAINT, 2, "nvidia.com/gpu")],
    ),
]

# Wordings the testbed cannot produce: other releases, plugins its scenarios do not
# reach. Typed from where kube-scheduler writes them (files under kubernetes/kubernetes
# pkg/scheduler/framework/plugins/ unless named), each with its release: "v1.33" is
# checked against the v1.33.13 source the testbed builds; older releases are as first
# noted here, not pinned to a tag.
WORDINGS: list[tuple[str, int | None, Parts]] = [
    (  # tainttoleration/taint_toleration.go, v1.18-v1.24: the taint named, then
        # ", that the pod didn't tolerate"; noderesources/fit.go's "Insufficient cpu"
        "0/3 nodes are available: 1 node(s) had taint {node-role.kubernetes.io/master: }, that the "
        "pod didn't tolerate, 2 Insufficient cpu.",
        3,
        [
            (Filter.UNTOLERATED_TAINT, 1, "node-role.kubernetes.io/master"),
            (Filter.INSUFFICIENT, 2, "cpu"),
        ],
    ),
    (  # tainttoleration/taint_toleration.go ErrReasonNotMatch, before 2020 (the constant
        # is still declared in v1.33, where nothing writes it)
        "0/3 nodes are available: 3 node(s) had taints that the pod didn't tolerate.",
        3,
        [(Filter.UNTOLERATED_TAINT, 3, None)],
    ),
    (  # taint_toleration.go after v1.33, which no longer names the taint (clusters of
        # late 2025; v1.33 writes "{key: value}"); the double dot after the preemption
        # tail is the v1.26 era's
        "0/5 nodes are available: 2 node(s) had untolerated taint(s), 3 Insufficient memory. "
        "preemption: 0/5 nodes are available: 5 Preemption is not helpful for scheduling..",
        5,
        [(Filter.UNTOLERATED_TAINT, 2, None), (Filter.INSUFFICIENT, 3, "memory")],
    ),
    (  # node affinity in two older wordings ("didn't match node selector", "didn't
        # match Pod's node affinity") and v1.33's nodeaffinity/node_affinity.go ErrReasonPod;
        # nodeunschedulable/node_unschedulable.go, nodeports/node_ports.go and
        # noderesources/fit.go ("Too many pods"), v1.33
        "0/6 nodes are available: 1 node(s) didn't match node selector, 1 node(s) didn't match "
        "Pod's node affinity, 1 node(s) didn't match Pod's node affinity/selector, 1 node(s) were "
        "unschedulable, 1 node(s) didn't have free ports for the requested pod ports, 1 Too "
        "many pods.",
        6,
        [
            (Filter.NODE_AFFINITY, 1, None),
            (Filter.NODE_AFFINITY, 1, None),
            (Filter.NODE_AFFINITY, 1, None),
            (Filter.UNSCHEDULABLE, 1, None),
            (Filter.HOST_PORTS, 1, None),
            (Filter.TOO_MANY_PODS, 1, None),
        ],
    ),
    (  # v1.33: interpodaffinity/filtering.go's three, podtopologyspread/plugin.go's two
        # (ErrReasonConstraintsNotMatch, ErrReasonNodeLabelNotMatch), volumebinding/binder.go
        # ErrReasonBindConflict; "had volume node affinity conflict" is binder.go's
        # ErrReasonNodeConflict before v1.33 (v1.33 writes "didn't match PersistentVolume's
        # node affinity", volume-node-conflict.json)
        "0/7 nodes are available: 1 node(s) didn't match pod affinity rules, 1 node(s) didn't "
        "match "
        "pod anti-affinity rules, 1 node(s) didn't satisfy existing pods anti-affinity rules, 1 "
        "node(s) didn't match pod topology spread constraints, 1 node(s) didn't match pod topology "
        "spread constraints (missing required label), 1 node(s) had volume node affinity conflict, "
        "1 node(s) didn't find available persistent volumes to bind.",
        7,
        [
            (Filter.POD_AFFINITY, 1, None),
            (Filter.POD_ANTI_AFFINITY, 1, None),
            (Filter.EXISTING_ANTI_AFFINITY, 1, None),
            (Filter.TOPOLOGY_SPREAD, 1, None),
            (Filter.TOPOLOGY_SPREAD, 1, None),
            (Filter.VOLUME_NODE_AFFINITY, 1, None),
            (Filter.VOLUME_BIND, 1, None),
        ],
    ),
    (  # volumebinding, before v1.23: the unbound-claims verdict was counted per node
        # (pvc-unbound.json records v1.33's PreFilter wording, uncounted)
        "0/3 nodes are available: 3 pod has unbound immediate PersistentVolumeClaims.",
        3,
        [(Filter.PVC_UNBOUND, 3, None)],
    ),
    (  # defaultpreemption/default_preemption.go (v1.33) for a Pod whose PriorityClass has
        # preemptionPolicy Never; the not-ready taint as node-not-ready.json records it
        "0/2 nodes are available: 2 node(s) had untolerated taint "
        "{node.kubernetes.io/not-ready: }. "
        "preemption: not eligible due to preemptionPolicy=Never.",
        2,
        [(Filter.UNTOLERATED_TAINT, 2, "node.kubernetes.io/not-ready")],
    ),
    # scheduler.go ErrNoNodesAvailable (v1.33): a cluster without nodes.
    ("no nodes available to schedule pods", None, [(Filter.NO_NODES, None, None)]),
]
NEVER = WORDINGS[6][0]


def _key(part: object) -> str | None:
    return (
        getattr(part, "resource", None)
        or getattr(part, "taint_key", None)
        or getattr(part, "claim", None)
    )


def _parts_of(message: str) -> tuple[int | None, Parts]:
    verdict = parse_scheduling_message(message)
    assert verdict.unknown == ()
    return verdict.total_nodes, [(p.filter, p.count, _key(p)) for p in verdict.parts]


@pytest.mark.parametrize(("fixture", "total", "parts"), RECORDED, ids=[r[0] for r in RECORDED])
def test_recorded_wordings(fixture: str, total: int, parts: Parts) -> None:
    assert _parts_of(recorded_verdict(fixture)) == (total, parts)


@pytest.mark.parametrize(("message", "total", "parts"), WORDINGS)
def test_wordings_of_other_releases(message: str, total: int | None, parts: Parts) -> None:
    assert _parts_of(message) == (total, parts)


def test_preemption_tail_is_read_and_kept() -> None:
    verdict = parse_scheduling_message(recorded_verdict("untolerated-taint"))
    assert [(p.filter, p.count) for p in verdict.preemption] == [
        (Filter.PREEMPTION_NO_VICTIMS, 2),
        (Filter.PREEMPTION_NOT_HELPFUL, 2),
    ]
    assert verdict.preemption_text is not None
    assert verdict.preemption_text.startswith("0/4 nodes are available")
    never = parse_scheduling_message(NEVER)
    assert [p.filter for p in never.preemption] == [Filter.PREEMPTION_NOT_ELIGIBLE]


def test_taint_value_is_read() -> None:
    part = parse_scheduling_message(recorded_verdict("untolerated-taint")).parts[1]
    assert (part.taint_key, part.taint_value) == ("nvidia.com/gpu", "present")


# One part each, in the plugins' v1.33 wordings (noderesources/fit.go "Insufficient %v" and
# "Too many pods", tainttoleration/taint_toleration.go, nodeunschedulable/
# node_unschedulable.go, podtopologyspread/plugin.go), but for binder.go's "had volume node
# affinity conflict" (before v1.33) and the StorageClass lister's NotFound error that
# volumebinding passes on for a claim naming a missing class.
@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("1 Insufficient nvidia.com/gpu", R.INSUFFICIENT_GPU),
        ("1 Insufficient nvidia.com/mig-1g.10gb", R.INSUFFICIENT_GPU),
        ("1 Insufficient amd.com/gpu", R.INSUFFICIENT_GPU),
        ("1 Insufficient cpu", R.INSUFFICIENT_CPU),
        ("1 Insufficient memory", R.INSUFFICIENT_MEMORY),
        ("1 Insufficient ephemeral-storage", R.INSUFFICIENT_RESOURCE),
        ("1 Insufficient hugepages-1Gi", R.INSUFFICIENT_RESOURCE),
        ("1 Too many pods", R.INSUFFICIENT_RESOURCE),
        ("1 node(s) had untolerated taint {node.kubernetes.io/unreachable: }", R.NODE_NOT_READY),
        ("1 node(s) had untolerated taint {dedicated: infra}", R.UNTOLERATED_TAINT),
        ("1 node(s) were unschedulable", R.NODE_NOT_READY),
        ("1 node(s) had volume node affinity conflict", R.VOLUME_NODE_CONFLICT),
        ("1 node(s) didn't match pod topology spread constraints", R.PLACEMENT_RULES),
        ('storageclass.storage.k8s.io "fast" not found', R.PVC_UNBOUND),
    ],
)
def test_parts_map_to_catalog_codes(text: str, code: ReasonCode) -> None:
    (part,) = parse_scheduling_message(f"0/1 nodes are available: {text}.").parts
    assert reason_of(part) is code


def test_no_gpu_nodes_when_no_node_advertises_the_resource() -> None:
    (part,) = parse_scheduling_message(recorded_verdict("no-gpu-nodes")).parts
    assert (part.filter, part.count, part.resource) == (Filter.INSUFFICIENT, 4, "nvidia.com/gpu")
    assert reason_of(part, gpu_advertised=False) is R.NO_GPU_NODES
    assert reason_of(part, gpu_advertised=True) is R.INSUFFICIENT_GPU


# -- properties -------------------------------------------------------------------------

_LABEL = st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,20}[a-z0-9])?", fullmatch=True)
_TAINT_KEY = st.one_of(_LABEL, st.builds(lambda a, b: f"{a}/{b}", _LABEL, _LABEL))
_RESOURCE = st.sampled_from(
    [
        "cpu",
        "memory",
        "nvidia.com/gpu",
        "amd.com/gpu",
        "ephemeral-storage",
        "hugepages-2Mi",
        "nvidia.com/mig-3g.40gb",
        "example.com/fpga",
    ]
)
_FIXED = st.sampled_from(
    [
        (Filter.NODE_AFFINITY, "node(s) didn't match Pod's node affinity/selector"),
        (Filter.UNSCHEDULABLE, "node(s) were unschedulable"),
        (Filter.HOST_PORTS, "node(s) didn't have free ports for the requested pod ports"),
        (Filter.POD_AFFINITY, "node(s) didn't match pod affinity rules"),
        (Filter.POD_ANTI_AFFINITY, "node(s) didn't match pod anti-affinity rules"),
        (Filter.TOPOLOGY_SPREAD, "node(s) didn't match pod topology spread constraints"),
        (Filter.VOLUME_NODE_AFFINITY, "node(s) had volume node affinity conflict"),
        (Filter.TOO_MANY_PODS, "Too many pods"),
        (Filter.UNTOLERATED_TAINT, "node(s) had untolerated taint(s)"),
    ]
)


@st.composite
def reason(draw: st.DrawFn) -> tuple[Filter, str, str | None, str | None]:
    """(token, reason text as the scheduler writes it, resource, taint key)."""
    kind = draw(st.sampled_from(["resource", "taint", "old-taint", "fixed"]))
    if kind == "resource":
        resource = draw(_RESOURCE)
        return Filter.INSUFFICIENT, f"Insufficient {resource}", resource, None
    if kind in ("taint", "old-taint"):
        key, value = draw(_TAINT_KEY), draw(st.one_of(st.just(""), _LABEL))
        body = f"{{{key}: {value}}}"
        text = (
            f"node(s) had untolerated taint {body}"
            if kind == "taint"
            else f"node(s) had taint {body}, that the pod didn't tolerate"
        )
        return Filter.UNTOLERATED_TAINT, text, None, key
    token, text = draw(_FIXED)
    return token, text, None, None


@st.composite
def verdict_message(
    draw: st.DrawFn,
) -> tuple[str, int, list[tuple[Filter, int, str | None, str | None]]]:
    reasons = draw(st.lists(reason(), min_size=1, max_size=6, unique_by=lambda r: r[1]))
    counted = [(draw(st.integers(1, 5000)), r) for r in reasons]
    total = max(n for n, _ in counted) + draw(st.integers(0, 100))
    # FitError.Error: "COUNT REASON" strings sorted as strings, joined by ", ".
    histogram = sorted(f"{n} {r[1]}" for n, r in counted)
    message = f"0/{total} nodes are available: {', '.join(histogram)}."
    tail = draw(
        st.sampled_from(
            [
                "",
                " preemption: 0/{t} nodes are available: {t} Preemption is not helpful for "
                "scheduling.",
                " preemption: not eligible due to preemptionPolicy=Never.",
            ]
        )
    )
    message += tail.format(t=total)
    if tail and draw(st.booleans()):
        message += "."  # releases before 1.27
    expected = sorted((n, r) for n, r in counted)
    return (
        message,
        total,
        [(r[0], n, r[2], r[3]) for n, r in sorted(expected, key=lambda x: f"{x[0]} {x[1][1]}")],
    )


@settings(max_examples=300, deadline=None)
@given(verdict_message())
def test_generated_verdicts_round_trip(
    case: tuple[str, int, list[tuple[Filter, int, str | None, str | None]]],
) -> None:
    message, total, expected = case
    verdict = parse_scheduling_message(message)
    assert verdict.total_nodes == total
    got = [(p.filter, p.count, p.resource, p.taint_key) for p in verdict.parts]
    assert got == expected
    assert verdict.unknown == ()


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=400))
def test_any_text_parses_without_raising_and_keeps_every_part(text: str) -> None:
    verdict = parse_scheduling_message(text)
    for part in verdict.parts:
        assert part.text.strip() == part.text
        assert part.text in text
        assert reason_of(part) is None or isinstance(reason_of(part), ReasonCode)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.text(
            alphabet=st.characters(blacklist_characters=",.", blacklist_categories=["Cs"]),
            min_size=1,
            max_size=40,
        ).filter(str.strip),
        min_size=1,
        max_size=5,
    ),
    st.integers(1, 999),
)
def test_unknown_parts_are_kept_verbatim_with_their_counts(parts: list[str], count: int) -> None:
    texts = [f"{count} zz {p.strip()}" for p in parts]
    verdict = parse_scheduling_message(f"0/{count} nodes are available: {', '.join(texts)}.")
    kept = [p for p in verdict.parts if p.filter is Filter.UNKNOWN]
    assert [p.text for p in kept] == texts
    assert all(p.count == count for p in kept)
