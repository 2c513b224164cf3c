"""Which namespaces a project may map to.

A project is a namespace that the platform opened to training jobs. Without
this, a token for every project could run jobs in kubetrain's own namespace
(whose Secrets hold the database's password) or in any system namespace.
Reserved patterns win over allowed ones: an operator who allows `*` still
does not open `kube-system`.
"""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatchcase

__all__ = ["DEFAULT_RESERVED_NAMESPACES", "namespace_refusal"]

# Kubernetes' own namespaces, kubetrain's (deploy/ installs it into `kubetrain`),
# and the usual homes of cluster add-ons, whose Secrets and ServiceAccounts a
# training Pod must never be given.
DEFAULT_RESERVED_NAMESPACES: tuple[str, ...] = (
    "default",
    "kube-*",
    "kubetrain",
    "kubetrain-*",
    "*-system",
    "cert-manager",
    "monitoring",
    "ingress-nginx",
    "local-path-storage",
    "gpu-operator",
    "nvidia-*",
    "openshift",
    "openshift-*",
)


def _matches(namespace: str, patterns: Iterable[str]) -> str | None:
    return next((p for p in patterns if fnmatchcase(namespace, p)), None)


def namespace_refusal(
    namespace: str, *, allowed: Iterable[str], reserved: Iterable[str]
) -> str | None:
    """Why jobs may not run in `namespace`, or None when they may."""
    if (pattern := _matches(namespace, reserved)) is not None:
        return f"namespace {namespace!r} is reserved for the platform ({pattern!r})"
    if _matches(namespace, allowed) is None:
        return f"namespace {namespace!r} is not among the namespaces open to jobs"
    return None
