"""What the real API server answers a log request it refuses, as the logs endpoint
translates it: options it finds invalid become a 422 naming kubetrain's parameter, never a
503 carrying Kubernetes' text (the endpoint checks its parameters first; this is the net
below those checks)."""

from __future__ import annotations

import asyncio

import pytest

from kubetrain.api.logs import why_no_logs
from kubetrain.cluster.client import load_config
from kubetrain.cluster.errors import ClusterError, ClusterRefused
from kubetrain.cluster.logs import LogRequest, PodLogs
from kubetrain.store import Attempt
from kubetrain.testbed.cluster import Testbed

pytestmark = pytest.mark.testbed


def refusal(testbed: Testbed, request: LogRequest) -> ClusterError:
    async def read() -> ClusterError:
        lines = PodLogs(load_config(testbed.kubeconfig)).lines(request)
        try:
            await anext(lines, None)
        except ClusterError as exc:
            return exc
        finally:
            await lines.aclose()
        pytest.fail("the API server streamed a log it should have refused")

    return asyncio.run(read())


def test_options_the_api_server_finds_invalid_are_a_422_naming_ours(testbed: Testbed) -> None:
    # The API server checks PodLogOptions before it looks for the Pod.
    asked = LogRequest(namespace="default", pod="kt-none", since_seconds=0, tail=-1)
    exc = refusal(testbed, asked)
    assert isinstance(exc, ClusterRefused)
    assert exc.code == 422
    answer = why_no_logs(exc, Attempt(pod_name="kt-none", number=1))
    assert answer.status == 422
    assert sorted(e.field for e in answer.errors) == ["query.since", "query.tail"]
    assert "PodLogOptions" not in (answer.detail or "")
