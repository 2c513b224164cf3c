"""The reflector's paginated list when its continue token expires (410 Gone)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx2 as httpx
import pytest

from kubetrain.cluster.reflector import Reflector

pytestmark = pytest.mark.unit


def pod(name: str) -> dict[str, Any]:
    return {"metadata": {"uid": name, "name": name, "resourceVersion": "1"}}


def test_an_expired_continue_token_is_retried_with_growing_jittered_backoff() -> None:
    requests: list[dict[str, str]] = []
    gone_left = 3

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal gone_left
        params = dict(request.url.params)
        requests.append(params)
        if "continue" not in params:
            return httpx.Response(200, json={"items": [pod("a")], "metadata": {"continue": "t1"}})
        if gone_left:
            gone_left -= 1
            return httpx.Response(410, json={"kind": "Status", "code": 410})
        return httpx.Response(200, json={"items": [pod("b")], "metadata": {"resourceVersion": "9"}})

    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    jitters = iter([0.0, 0.9, 0.5])

    async def main() -> Reflector:
        async with httpx.AsyncClient(
            transport=httpx.MockTransport(handler), base_url="https://k8s"
        ) as http:
            reflector = Reflector(
                http, "/api/v1/pods", backoff=1.0, sleep=sleep, jitter=lambda: next(jitters)
            )
            await reflector._list()
            return reflector

    reflector = asyncio.run(main())
    assert set(reflector.items) == {"a", "b"}
    assert reflector.resource_version == "9"
    # Each 410 waits before the list starts over: 1 s, then 2 s, then 4 s, each
    # times a jitter factor in [0.5, 1.5); never at once.
    assert slept == pytest.approx([0.5, 2.8, 4.0])
    assert len(requests) == 1 + 3 * 2 + 1
