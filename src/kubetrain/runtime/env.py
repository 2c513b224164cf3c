"""The variables the manifest sets in every training container, read in one place.

A gang (a job of several workers) also gets the torchrun environment Kubeflow
Trainer v2's torch runtime sets, which torchrun reads as the defaults of its
flags (`PET_<FLAG>`): PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK (the Pod's
completion index), PET_MASTER_ADDR (rank 0's stable DNS name) and
PET_MASTER_PORT; kubetrain adds KUBETRAIN_WORKERS and KUBETRAIN_WORKER_INDEX.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

# torchrun's own default for --master-port (and Kubeflow Trainer's ContainerTrainerPort).
DEFAULT_MASTER_PORT = 29500


def pod_name(environ: Mapping[str, str]) -> str | None:
    """This Pod's name: the downward API's KUBETRAIN_POD_NAME, else the hostname Kubernetes sets."""
    return environ.get("KUBETRAIN_POD_NAME") or environ.get("HOSTNAME") or None


def termination_log(environ: Mapping[str, str], default: str) -> str:
    return environ.get("KUBETRAIN_TERMINATION_LOG") or default


@dataclass(frozen=True)
class Gang:
    """This Pod's place in a job of several workers (one Pod each)."""

    workers: int
    rank: int  # this worker's index: torchrun's node rank
    master_addr: str | None
    master_port: int


def gang(environ: Mapping[str, str]) -> Gang | None:
    """The gang this Pod belongs to; None for a single worker.

    Raises ValueError naming the variable when one is malformed, out of range, or
    contradicts its counterpart (KUBETRAIN_WORKERS and PET_NNODES, KUBETRAIN_WORKER_INDEX
    and PET_NODE_RANK must agree when both are set)."""
    workers = _agreed(environ, "KUBETRAIN_WORKERS", "PET_NNODES", _nodes)
    if workers is None or workers <= 1:
        return None
    rank = _agreed(environ, "KUBETRAIN_WORKER_INDEX", "PET_NODE_RANK", _whole)
    if rank is None:
        raise ValueError(f"PET_NODE_RANK is not set in a gang of {workers} workers")
    if rank >= workers:
        raise ValueError(f"PET_NODE_RANK is {rank}, not below the {workers} workers")
    port_text = _value(environ, "PET_MASTER_PORT")
    port = DEFAULT_MASTER_PORT if port_text is None else _whole("PET_MASTER_PORT", port_text)
    if not 1 <= port <= 65535:
        raise ValueError(f"PET_MASTER_PORT must be a port (1-65535), not {port}")
    return Gang(workers, rank, _value(environ, "PET_MASTER_ADDR"), port)


def _value(environ: Mapping[str, str], name: str) -> str | None:
    return environ.get(name, "").strip() or None


def _whole(name: str, text: str) -> int:
    if not text.isdigit():
        raise ValueError(f"{name} must be a whole number, not {text!r}")
    return int(text)


def _nodes(name: str, text: str) -> int:
    """torchrun's --nnodes is N or, for an elastic job, MIN:MAX: up to MAX workers."""
    low, _, high = text.partition(":")
    return _whole(name, high) if high else _whole(name, low)


def _agreed(
    environ: Mapping[str, str], ours: str, torchrun: str, parse: Callable[[str, str], int]
) -> int | None:
    values = {
        name: parse(name, text)
        for name in (ours, torchrun)
        if (text := _value(environ, name)) is not None
    }
    if len(set(values.values())) > 1:
        raise ValueError(f"{ours} is {values[ours]} but {torchrun} is {values[torchrun]}")
    return next(iter(values.values()), None)
