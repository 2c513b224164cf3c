"""The runtime's errors (the tree is drawn in the package docstring)."""

from __future__ import annotations

from kubetrain.errors import KubetrainError


class RuntimeFailure(KubetrainError):
    """Something kubetrain.runtime cannot do; the message says what and why."""


class CheckpointError(RuntimeFailure):
    """A checkpoint could not be saved or resumed."""


class CorruptCheckpoint(CheckpointError):
    """A checkpoint is partial, truncated or fails its checksum."""


class IncompatibleCheckpoint(CheckpointError):
    """A valid checkpoint bound to another dataset version, code version, hyper-parameters
    or world size."""


class CacheError(RuntimeFailure):
    """A dataset cache entry could not be fetched or does not fit."""
