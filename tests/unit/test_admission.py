"""Quota, LimitRange and Kueue refusals: names, numbers, and whether waiting helps."""

from __future__ import annotations

from decimal import Decimal

import pytest

from kubetrain.domain.admission import parse_admission_refusal, parse_kueue_message
from tests.unit.diagnosis_helpers import dump, items, recorded_kueue_message

pytestmark = pytest.mark.unit


def recorded_refusal(name: str) -> str:
    (event,) = [e for e in items(dump(name), "Event") if e["reason"] == "FailedCreate"]
    message: str = event["message"]
    return message


@pytest.mark.parametrize(
    ("fixture", "requested", "used", "limit", "waitable"),
    [("waiting-for-quota", 4, 0, 2, False), ("quota-busy", 4, 6, 8, True)],
)
def test_recorded_quota_refusals(
    fixture: str, requested: int, used: int, limit: int, waitable: bool
) -> None:
    refusal = parse_admission_refusal(recorded_refusal(fixture))
    assert (refusal.kind, refusal.name, refusal.waitable) == ("quota", "gpu-quota", waitable)
    (res,) = refusal.resources
    assert res.resource == "requests.nvidia.com/gpu"
    assert (res.requested, res.used, res.limit) == tuple(map(Decimal, (requested, used, limit)))


def test_several_resources_in_one_refusal() -> None:
    refusal = parse_admission_refusal(recorded_refusal("quota-several"))
    assert (refusal.kind, refusal.name) == ("quota", "compute")
    assert [r.resource for r in refusal.resources] == ["limits.memory", "requests.cpu"]
    memory, cpu = refusal.resources
    gib = Decimal(2**30)
    assert (memory.requested, memory.used, memory.limit) == (8 * gib, 60 * gib, 64 * gib)
    assert (cpu.requested, cpu.used, cpu.limit) == (Decimal(2), Decimal(15), Decimal(16))
    assert refusal.waitable is True  # each request alone fits under its limit


def test_a_quota_that_needs_declared_requests() -> None:
    unspecified = parse_admission_refusal(recorded_refusal("quota-unspecified"))
    assert (unspecified.kind, unspecified.name, unspecified.waitable) == (
        "quota-unspecified",
        "compute",
        False,
    )
    assert [r.resource for r in unspecified.resources] == ["limits.cpu", "requests.cpu"]


def test_the_older_wording_of_a_quota_that_needs_declared_requests() -> None:
    # pkg/quota/v1/evaluator/core/pods.go (podEvaluator.Constraints) before the
    # per-container wording that v1.33 writes (quota-unspecified.json): the missing
    # resources joined by ",".
    unspecified = parse_admission_refusal(
        'pods "x" is forbidden: failed quota: compute: must specify limits.cpu,requests.cpu'
    )
    assert (unspecified.kind, unspecified.waitable) == ("quota-unspecified", False)
    assert [r.resource for r in unspecified.resources] == ["limits.cpu", "requests.cpu"]


def test_a_limit_range_refusal() -> None:
    limit_range = parse_admission_refusal(recorded_refusal("limit-range"))
    assert (limit_range.kind, limit_range.waitable) == ("limit-range", False)
    (cpu,) = limit_range.resources
    assert (cpu.resource, cpu.requested, cpu.limit) == ("cpu", Decimal(4), Decimal(2))


def test_other_refusals_are_kept_verbatim() -> None:
    message = recorded_refusal("pod-security")
    assert 'violates PodSecurity "restricted:latest"' in message
    refusal = parse_admission_refusal(message)
    assert (refusal.kind, refusal.is_quota, refusal.waitable) == ("other", False, None)
    assert (refusal.message, refusal.resources) == (message, ())
    assert parse_admission_refusal(None).kind == "other"


def test_kueue_wordings() -> None:
    more = parse_kueue_message(recorded_kueue_message("kueue-waiting"))
    assert more is not None
    assert (more.waitable, more.name) == (True, "default-flavor")
    assert [r.resource for r in more.resources] == ["nvidia.com/gpu"]
    # pkg/scheduler/flavorassigner/flavorassigner.go before Kueue v0.14, which added the
    # earlier pod sets' requests (the wording kueue-never-fits.json records).
    old = parse_kueue_message(
        "couldn't assign flavors to pod set main: insufficient quota for nvidia.com/gpu in "
        "flavor gpu, request > maximum capacity (24 > 16)"
    )
    assert old is not None
    assert old.waitable is False
    assert old.resources[0].requested == Decimal(24)
    assert old.resources[0].limit == Decimal(16)
    new = parse_kueue_message(recorded_kueue_message("kueue-never-fits"))
    assert new is not None
    assert (new.name, new.waitable) == ("default-flavor", False)
    (gpus,) = new.resources
    assert (gpus.resource, gpus.requested, gpus.limit) == (
        "nvidia.com/gpu",
        Decimal(16),
        Decimal(8),
    )
    inactive = recorded_kueue_message("kueue-stopped-cluster-queue")
    assert inactive == "ClusterQueue stopped is inactive"
    assert parse_kueue_message(inactive) is None  # not about quota
