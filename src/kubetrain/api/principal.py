"""Who is calling and what each role may do: the caller as its token says.

Its own module because the request context caches principals and auth makes
them: both import this, neither the other's.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from kubetrain.store import ALL_PROJECTS, Role


class Action(StrEnum):
    READ = "read"
    SUBMIT = "submit"
    CANCEL = "cancel"
    ADMIN = "admin"


PERMISSIONS: dict[Role, frozenset[Action]] = {
    Role.VIEWER: frozenset({Action.READ}),
    Role.SUBMITTER: frozenset({Action.READ, Action.SUBMIT, Action.CANCEL}),
    Role.ADMIN: frozenset(Action),
}


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller, as its token says: never the token itself."""

    token_id: str
    name: str
    role: Role
    project: str  # or ALL_PROJECTS

    def covers(self, project: str) -> bool:
        return self.project in (ALL_PROJECTS, project)

    def may(self, action: Action) -> bool:
        return action in PERMISSIONS[self.role]
