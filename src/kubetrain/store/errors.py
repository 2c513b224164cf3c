"""What the store refuses, as one tree, so callers catch at the level they care about
(its root is under kubetrain.errors.KubetrainError; kubetrain/errors.py draws the whole tree).

```
* StoreError
  x JobNotFound               - no such job (in that project)
  x IdempotencyConflict       - the key was used before with another spec (HTTP 409)
  x IllegalTransition         - the state machine forbids the move
    + TerminalStateError      - the job has finished; nothing leaves a terminal state
  x InvalidCursor             - a pagination cursor we did not issue (HTTP 400)
  x DatasetConflict           - that dataset version is registered with other contents
```

Database driver errors (`sqlalchemy.exc.*`) are not wrapped: they mean the
database is unreachable or broken, not that a request was wrong.
"""

from __future__ import annotations

from kubetrain.domain.states import BusinessState, ReasonCode
from kubetrain.errors import KubetrainError


class StoreError(KubetrainError):
    """Base of every refusal raised by the store."""


class JobNotFound(StoreError):
    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id} not found")
        self.job_id = job_id


class IdempotencyConflict(StoreError):
    """The same (project, idempotency key) was submitted before with a different spec."""

    def __init__(self, project: str, key: str, existing_job_id: str) -> None:
        super().__init__(
            f"idempotency key {key!r} in project {project!r} was already used for job "
            f"{existing_job_id} with a different spec"
        )
        self.project = project
        self.key = key
        self.existing_job_id = existing_job_id


class IllegalTransition(StoreError):
    def __init__(
        self,
        job_id: str,
        current: tuple[BusinessState, ReasonCode],
        target: tuple[BusinessState, ReasonCode],
        why: str | None = None,
    ) -> None:
        why = why or f"{current[0]} cannot move to {target[0]}"
        super().__init__(
            f"job {job_id}: refused {current[0]}/{current[1]} -> {target[0]}/{target[1]}: {why}"
        )
        self.job_id = job_id
        self.current = current
        self.target = target


class TerminalStateError(IllegalTransition):
    def __init__(
        self,
        job_id: str,
        current: tuple[BusinessState, ReasonCode],
        target: tuple[BusinessState, ReasonCode],
    ) -> None:
        super().__init__(
            job_id, current, target, f"{current[0]} is terminal; nothing leaves a terminal state"
        )


class InvalidCursor(StoreError):
    def __init__(self, cursor: str) -> None:
        super().__init__(f"invalid pagination cursor {cursor[:64]!r}")
        self.cursor = cursor


class DatasetConflict(StoreError):
    """Dataset versions are immutable: a job pinned to one must always get the same bytes."""

    def __init__(self, name: str, version: str) -> None:
        super().__init__(
            f"dataset {name}@{version} is already registered with a different claim, "
            "sub-path or checksums; register a new version instead"
        )
        self.name = name
        self.version = version
