"""A Pod's logs through the API server (the Pod `log` subresource), and whether a node is
one of KWOK's fake nodes, which run no containers and so have no logs.

Every call raises ClusterError (cluster/errors.py), never the client library's own.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass

from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Node

from kubetrain.cluster.client import ClusterConfig, typed_client
from kubetrain.cluster.errors import kube_errors

# What KWOK's controller sets on the nodes it manages (and the testbed's pools carry).
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
FAKE_NODE_VALUE = "fake"


@dataclass(frozen=True, slots=True)
class LogRequest:
    namespace: str
    pod: str
    container: str | None = None
    follow: bool = False
    tail: int | None = None  # the last N lines
    since_seconds: int | None = None
    timestamps: bool = False


class PodLogs:
    """Reads Pods' logs; made from the kubeconfig of a process that runs the control loops.

    The client is made on first use, on the event loop that serves the requests.
    """

    def __init__(self, config: ClusterConfig) -> None:
        self._config = config
        self._client: AsyncClient | None = None

    def _typed(self) -> AsyncClient:
        if self._client is None:
            self._client = typed_client(self._config)
        return self._client

    async def is_fake_node(self, name: str) -> bool:
        """Whether `name` is a KWOK fake node (False for a node that is gone)."""
        client = self._typed()
        with kube_errors():
            try:
                node = await client.get(Node, name)
            except ApiError as exc:
                if exc.status.code == 404:
                    return False
                raise
        annotations = (node.metadata.annotations if node.metadata else None) or {}
        return annotations.get(FAKE_NODE_ANNOTATION) == FAKE_NODE_VALUE

    async def lines(self, request: LogRequest) -> AsyncGenerator[str]:
        """The log's lines, each ending in a newline; with `follow`, until the container
        ends or the caller stops reading. The request is made on the first line."""
        client = self._typed()
        stream = client.log(
            request.pod,
            namespace=request.namespace,
            container=request.container,
            follow=request.follow,
            since=request.since_seconds,
            tail_lines=request.tail,
            timestamps=request.timestamps,
        )
        with kube_errors():
            async for line in stream:
                yield line
