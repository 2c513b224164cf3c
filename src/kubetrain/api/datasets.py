"""`/api/v1/datasets`: the dataset registry, read by any valid token, written by admins.

The registry is shared by every project, so registering takes an admin token
scoped to `*`; a project's admin could otherwise take a name others rely on.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Response

from kubetrain.api.auth import Caller, require_global_admin, role_may
from kubetrain.api.body import json_body
from kubetrain.api.context import ApiContext, get_context
from kubetrain.api.principal import Action, Principal
from kubetrain.api.problems import (
    DATASET_CONFLICT,
    ProblemError,
    problem_responses,
    validation_error,
)
from kubetrain.api.schemas import DatasetEntry, DatasetList
from kubetrain.domain.datasets import parse_dataset_version
from kubetrain.domain.spec import SpecError
from kubetrain.store import DatasetConflict, list_datasets, register_dataset_version

router = APIRouter(
    prefix="/api/v1/datasets",
    tags=["datasets"],
    responses=problem_responses(401, 403, 422, 500, 503),
)

Context = Annotated[ApiContext, Depends(get_context)]

DATASET_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "A DatasetVersion: name, version, claim, and optionally subPath, "
        "checksums (the manifest's path in the dataset) and checksumsSha256.",
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/DatasetVersion"}}
        },
    }
}


async def _may_read(caller: Caller) -> Principal:
    role_may(caller, Action.READ)
    return caller


async def _may_register(caller: Caller) -> Principal:
    require_global_admin(caller)
    return caller


@router.get("", summary="Registered dataset versions", response_model=DatasetList)
def list_registered(
    caller: Annotated[Principal, Depends(_may_read)],
    context: Context,
    name: Annotated[str | None, Query(description="only the versions of this dataset")] = None,
) -> DatasetList:
    with context.db.read_only() as session:
        rows = list_datasets(session, name=name)
        return DatasetList(items=[DatasetEntry.of(row) for row in rows])


@router.post(
    "",
    status_code=201,
    summary="Register a dataset version (idempotent; versions never change)",
    response_model=DatasetEntry,
    responses={
        200: {"model": DatasetEntry, "description": "Registered before, with these contents"},
        201: {"description": "Registered now"},
        **problem_responses(400, 409, 413, 415),
    },
    openapi_extra=DATASET_BODY,
)
def register(
    caller: Annotated[Principal, Depends(_may_register)],
    context: Context,
    response: Response,
    body: Annotated[Any, Depends(json_body)],
) -> DatasetEntry:
    try:
        version = parse_dataset_version(body)
    except SpecError as exc:
        raise validation_error(exc.problems, "the dataset version is refused") from None
    with context.db.transaction() as session:
        try:
            row, created = register_dataset_version(session, version, created_by=caller.name)
        except DatasetConflict as exc:
            raise ProblemError(
                409, str(exc), type=DATASET_CONFLICT, title="Dataset version already registered"
            ) from None
        entry = DatasetEntry.of(row)
    if not created:
        response.status_code = 200
    return entry
