"""kubetrain: a control plane for AI training jobs on Kubernetes.

`from kubetrain import Client` is the Python SDK (kubetrain/client, docs/sdk.md),
loaded on first use: the runtime inside training containers imports this package
too, with the standard library alone, and must not pay for the client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubetrain.client import Client

__version__ = "0.1.0"
__all__ = ["Client", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "Client":
        from kubetrain.client import Client

        return Client
    raise AttributeError(f"module 'kubetrain' has no attribute {name!r}")
