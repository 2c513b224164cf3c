"""HTTP to the outside world that is not Kubernetes: webhook receivers.

One client for every delivery: no redirects followed (a receiver that moved
must be updated, not followed wherever it points), a bounded wait, and no
proxy or credentials from the environment.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import httpx2 as httpx

TIMEOUT_SECONDS = 10.0
USER_AGENT = "kubetrain-webhooks/1"

# (url, body, headers) -> the receiver's HTTP status; raises when there is no answer.
Post = Callable[[str, bytes, dict[str, str]], Awaitable[int]]


@asynccontextmanager
async def webhook_poster() -> AsyncIterator[Post]:
    """A `post(url, body, headers) -> status` for the notifier, closed on exit."""
    async with httpx.AsyncClient(
        timeout=TIMEOUT_SECONDS, follow_redirects=False, trust_env=False
    ) as client:

        async def post(url: str, body: bytes, headers: dict[str, str]) -> int:
            response = await client.post(
                url, content=body, headers={**headers, "user-agent": USER_AGENT}
            )
            return response.status_code

        yield post
