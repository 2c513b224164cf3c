"""kubetrain's Python SDK: `Client` and what it returns and raises (docs/sdk.md).

`from kubetrain import Client` finds it here. The CLI's client commands are built on
the same Client. Standard library only at import (the CLI's start-up depends on it);
nothing of the server side (the import contract `client`, pyproject.toml).
"""

from kubetrain.client.api import Client, Reply
from kubetrain.client.errors import ApiError, ClientError, JobEnded, NotFound, WaitTimeout
from kubetrain.client.results import (
    Diagnosis,
    GpuSeconds,
    HistoryEntry,
    Job,
    Reason,
    Usage,
    UsageEntry,
)

__all__ = [
    "ApiError",
    "Client",
    "ClientError",
    "Diagnosis",
    "GpuSeconds",
    "HistoryEntry",
    "Job",
    "JobEnded",
    "NotFound",
    "Reason",
    "Reply",
    "Usage",
    "UsageEntry",
    "WaitTimeout",
]
