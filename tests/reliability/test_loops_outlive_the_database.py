"""The control loops wait for a database that does not answer instead of ending the process."""

from __future__ import annotations

import asyncio
import socket

import pytest
from lightkube import AsyncClient
from lightkube.config.kubeconfig import KubeConfig

from kubetrain.cluster.client import http_client
from kubetrain.control.dispatcher import Dispatcher
from kubetrain.store import Database

pytestmark = pytest.mark.db


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_dispatcher_keeps_retrying_while_the_database_is_unreachable() -> None:
    db = Database(f"postgresql+psycopg://kubetrain@127.0.0.1:{_closed_port()}/kubetrain")
    # Never reached: every round fails at its first database read.
    config = KubeConfig.from_dict(
        {
            "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
            "users": [{"name": "u", "user": {}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        }
    )
    client = AsyncClient(config=config)
    dispatcher = Dispatcher(db, client, http=http_client(config.get()), poll_interval=0.05)

    async def run_for_a_while() -> None:
        with pytest.raises(TimeoutError):  # still running: no error got out of the loop
            await asyncio.wait_for(dispatcher.run(), timeout=1.0)

    try:
        asyncio.run(run_for_a_while())
    finally:
        db.dispose()
    assert dispatcher.failures >= 3
