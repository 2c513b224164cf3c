"""The client library's errors become kubetrain's at the cluster boundary, the original kept
as the cause; what the dispatcher records (reason, message, outage or not) is unchanged."""

from __future__ import annotations

import asyncio

import httpx2 as httpx
import pytest
from lightkube import ApiError
from lightkube.models.meta_v1 import Status

from kubetrain.cluster.errors import (
    ClusterError,
    ClusterRefused,
    ClusterUnreachable,
    JobConflictError,
    kube_errors,
)
from kubetrain.cluster.jobs import delete_job
from kubetrain.errors import KubetrainError

pytestmark = pytest.mark.unit

# Not a Kubernetes message: only its passing through is under test.
MESSAGE = "the API server's message"


def refused(code: int, reason: str | None) -> ApiError:
    return ApiError(status=Status(code=code, reason=reason, message=MESSAGE))


@pytest.mark.parametrize(
    ("code", "unreachable"), [(403, False), (409, False), (429, True), (503, True)]
)
def test_a_refusal_keeps_the_servers_reason_and_says_whether_it_is_an_outage(
    code: int, unreachable: bool
) -> None:
    original = refused(code, "SomeReason")
    with pytest.raises(ClusterRefused) as caught, kube_errors():
        raise original
    assert (caught.value.code, caught.value.reason, caught.value.message) == (
        code,
        "SomeReason",
        MESSAGE,
    )
    assert caught.value.unreachable is unreachable
    assert caught.value.__cause__ is original
    assert isinstance(caught.value, KubetrainError)


def test_a_refusal_without_a_reason_is_named_by_its_status() -> None:
    with pytest.raises(ClusterRefused) as caught, kube_errors():
        raise refused(500, None)
    assert caught.value.reason == "HTTP500"


@pytest.mark.parametrize(
    "original",
    [httpx.ConnectError("[Errno 111] Connection refused"), ConnectionResetError(104, "reset")],
)
def test_no_answer_is_unreachable_named_by_its_class(original: Exception) -> None:
    with pytest.raises(ClusterUnreachable) as caught, kube_errors():
        raise original
    assert caught.value.reason == type(original).__name__
    assert caught.value.message == str(original)
    assert caught.value.unreachable
    assert caught.value.__cause__ is original


def test_other_http_errors_are_cluster_errors_but_not_an_outage() -> None:
    with pytest.raises(ClusterError) as caught, kube_errors():
        raise httpx.DecodingError("bad gzip")
    assert type(caught.value) is ClusterError
    assert (caught.value.reason, caught.value.unreachable) == ("DecodingError", False)


def test_a_name_conflict_is_a_cluster_error_named_for_the_dispatcher() -> None:
    conflict = JobConflictError("a Job named kt-x exists in ns and is not this kubetrain job's")
    assert (conflict.reason, conflict.unreachable) == ("NameConflict", False)
    assert str(conflict) == conflict.message


def test_the_job_calls_raise_only_cluster_errors() -> None:
    class Refusing:
        async def delete(self, *_: object, **__: object) -> None:
            raise refused(403, "Forbidden")

    with pytest.raises(ClusterRefused) as caught:
        asyncio.run(delete_job(Refusing(), "ns", "kt-x"))
    assert isinstance(caught.value.__cause__, ApiError)
