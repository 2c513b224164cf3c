"""Quota, LimitRange and Kueue refusals: names, numbers, and whether waiting helps."""

from __future__ import annotations

from decimal import Decimal

import pytest

from kubetrain.domain.admission import parse_admission_refusal, parse_kueue_message
from tests.unit.diagnosis_helpers import dump, items

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
    message = (
        'pods "x" is forbidden: exceeded quota: compute, requested: '
        "limits.memory=8Gi,requests.cpu=2,"
        " used: limits.memory=60Gi,requests.cpu=10, limited: limits.memory=64Gi,requests.cpu=16"
    )
    refusal = parse_admission_refusal(message)
    assert [r.resource for r in refusal.resources] == ["limits.memory", "requests.cpu"]
    assert refusal.resources[0].limit == Decimal(64 * 2**30)
    assert refusal.waitable is True


def test_a_quota_that_needs_declared_requests_and_a_limit_range() -> None:
    unspecified = parse_admission_refusal(
        'pods "x" is forbidden: failed quota: compute: must specify limits.cpu,requests.cpu'
    )
    assert (unspecified.kind, unspecified.waitable) == ("quota-unspecified", False)
    assert [r.resource for r in unspecified.resources] == ["limits.cpu", "requests.cpu"]
    limit_range = parse_admission_refusal(
        'pods "x" is forbidden: maximum cpu usage per Container is 2, but limit is 4'
    )
    assert (limit_range.kind, limit_range.waitable) == ("limit-range", False)
    assert limit_range.resources[0].requested == Decimal(4)
    assert limit_range.resources[0].limit == Decimal(2)


def test_other_refusals_are_kept_verbatim() -> None:
    refusal = parse_admission_refusal(
        'pods "x" is forbidden: violates PodSecurity "restricted:latest"'
    )
    assert (refusal.kind, refusal.is_quota, refusal.waitable) == ("other", False, None)
    assert parse_admission_refusal(None).kind == "other"


def test_kueue_wordings() -> None:
    more = parse_kueue_message(
        "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu "
        "in flavor default-flavor, 4 more needed"
    )
    assert more is not None
    assert (more.waitable, more.name) == (True, "default-flavor")
    old = parse_kueue_message(
        "couldn't assign flavors to pod set main: insufficient quota for nvidia.com/gpu in "
        "flavor gpu, request > maximum capacity (24 > 16)"
    )
    assert old is not None
    assert old.waitable is False
    assert old.resources[0].requested == Decimal(24)
    assert old.resources[0].limit == Decimal(16)
    new = parse_kueue_message(
        "couldn't assign flavors to pod set w: insufficient quota for cpu in flavor f, "
        "previously considered podsets requests (16) + current podset request (8) > "
        "maximum capacity (16)"
    )
    assert new is not None
    assert (new.resources[0].requested, new.waitable) == (Decimal(24), False)
    assert parse_kueue_message("ClusterQueue cq is inactive") is None
