"""The KUBETRAIN_* variables the manifest sets in every training container, read in one place."""

from __future__ import annotations

from collections.abc import Mapping


def pod_name(environ: Mapping[str, str]) -> str | None:
    """This Pod's name: the downward API's KUBETRAIN_POD_NAME, else the hostname Kubernetes sets."""
    return environ.get("KUBETRAIN_POD_NAME") or environ.get("HOSTNAME") or None


def termination_log(environ: Mapping[str, str], default: str) -> str:
    return environ.get("KUBETRAIN_TERMINATION_LOG") or default
