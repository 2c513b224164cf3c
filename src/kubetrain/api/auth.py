"""Bearer tokens, roles and project scopes: who may do what, and how a refusal reads.

    role       read   submit, cancel   admin (datasets, tokens)
    viewer      x
    submitter   x          x
    admin       x          x                 x

A token is scoped to one project or to `*` (all). The answers, in order:

* no token, or one that is unknown or revoked: 401 with `WWW-Authenticate: Bearer`;
* a job (or anything under one) in a project the token does not cover: 404,
  the same answer as for a job that does not exist, so ids and projects leak
  nothing;
* a project-wide request (list, submit) outside the token's scope, or a role
  that may not act: 403. Neither depends on what exists, so neither leaks.

The role is checked before the job is looked up: a viewer's cancel is a 403
whether the job exists or not.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from kubetrain.api.context import ApiContext, get_context
from kubetrain.api.principal import Action, Principal
from kubetrain.api.problems import ProblemError, not_found
from kubetrain.settings import ServerSettings
from kubetrain.store import (
    ALL_PROJECTS,
    authenticate_token,
    find_token,
    hash_token,
    use_is_stale,
)

# auto_error=False: a missing or malformed header is our 401 problem, not FastAPI's 403.
bearer = HTTPBearer(auto_error=False, description="An API token: `kubetrain token create`.")


def _unauthorized(detail: str, *, invalid: bool) -> ProblemError:
    challenge = 'Bearer realm="kubetrain"'
    if invalid:
        challenge += ', error="invalid_token"'
    return ProblemError(401, detail, headers={"WWW-Authenticate": challenge})


async def principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    context: Annotated[ApiContext, Depends(get_context)],
) -> Principal:
    """The authenticated caller; 401 otherwise.

    async, so a token verified in the last seconds (`ApiContext.tokens`, see
    token_cache.py for what that means for revocation) costs no worker thread
    and no transaction; only a lookup goes to a thread.
    """
    if credentials is None:
        header = request.headers.get("authorization")
        detail = (
            "send the API token as `Authorization: Bearer <token>`"
            if header
            else "an API token is required: `Authorization: Bearer <token>`"
        )
        raise _unauthorized(detail, invalid=bool(header))
    plaintext = credentials.credentials
    token_hash = hash_token(plaintext)
    caller = context.tokens.get(token_hash)
    if caller is None:
        caller = await run_in_threadpool(_look_up, context, plaintext)
        if caller is None:
            raise _unauthorized("the API token is unknown or revoked", invalid=True)
        context.tokens.put(token_hash, caller)
    return caller


def _look_up(context: ApiContext, plaintext: str) -> Principal | None:
    # A read-only lookup, so reads take no write lock; the use is recorded (a
    # write) at most once a minute per token.
    with context.db.read_only() as session:
        token = find_token(session, plaintext)
    if token is not None and use_is_stale(token, now=datetime.now(UTC)):
        with context.db.transaction() as session:
            token = authenticate_token(session, plaintext)
    if token is None:
        return None
    return Principal(token_id=token.id, name=token.name, role=token.role, project=token.project)


Caller = Annotated[Principal, Depends(principal)]


def role_may(caller: Principal, action: Action) -> None:
    if not caller.may(action):
        raise ProblemError(403, f"a {caller.role} token may not {action}")


def require_project(
    caller: Principal, project: str, action: Action, settings: ServerSettings
) -> None:
    """For project-wide requests (list, submit): 403 outside the scope or the role.

    A project whose namespace is not open to jobs (settings.project_open) is
    refused like one outside the token's scope, whatever the token covers.
    """
    if not caller.covers(project) or not settings.project_open(project):
        # One answer for both: which namespaces are open is not the caller's business.
        raise ProblemError(403, f"project {project!r} is outside the API token's scope")
    role_may(caller, action)


def require_job_access(
    caller: Principal, project: str, job_id: str, action: Action, settings: ServerSettings
) -> None:
    """For requests on one job: the role first (403), then the scope, as a 404."""
    role_may(caller, action)
    if not caller.covers(project) or not settings.project_open(project):
        raise job_not_found(project, job_id)


def visible_namespaces(caller: Principal, settings: ServerSettings) -> set[str] | None:
    """The namespaces whose cluster objects (quotas, nodes' Pods, pending queue entries)
    the caller may see; None: every one. A closed project's namespace is none of them
    (namespace_for refuses it)."""
    if caller.project == ALL_PROJECTS:
        return None
    try:
        return {settings.namespace_for(caller.project)}
    except ValueError:
        return set()


def require_global_admin(caller: Principal) -> None:
    """Datasets are shared by every project, so writing them takes an admin of `*`."""
    role_may(caller, Action.ADMIN)
    if caller.project != ALL_PROJECTS:
        raise ProblemError(
            403,
            "the dataset registry serves every project: registering takes an admin token "
            f"scoped to {ALL_PROJECTS!r}, not to {caller.project!r}",
        )


def job_not_found(project: str, job_id: str) -> ProblemError:
    return not_found(f"job {job_id!r} in project {project!r}")
