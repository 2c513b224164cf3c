"""Field problems: what a refusal says, and pydantic's errors translated into it.

A field is a dotted path (`spec.resources.requests.cpu`, `spec.env[1].name`,
`metadata.labels["team"]`); the empty path is the whole document. Checks raise
`fail(message)` (a value refused where it stands) or `raise_at` (a model
validator blaming the fields concerned); `problems_from_validation_error` turns
what pydantic collected into FieldProblems whose messages say what is allowed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import NoneType, UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from kubetrain.errors import KubetrainError

__all__ = [
    "MAX_PROBLEMS",
    "FieldProblem",
    "SpecError",
    "fail",
    "problems_from_validation_error",
    "raise_at",
]

MAX_PROBLEMS = 50  # problems listed in one SpecError


@dataclass(frozen=True, slots=True)
class FieldProblem:
    """One refused field: its dotted path and what is allowed there."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


class SpecError(KubetrainError, ValueError):
    """A TrainingJob (or dataset registration) that is refused; `problems` names each field."""

    def __init__(self, problems: Sequence[FieldProblem]) -> None:
        self.problems: list[FieldProblem] = list(problems)
        super().__init__("; ".join(str(p) for p in self.problems) or "invalid TrainingJob")

    @classmethod
    def single(cls, field: str, message: str) -> SpecError:
        return cls([FieldProblem(field, message)])


def fail(message: str) -> PydanticCustomError:
    # PydanticCustomError keeps the message as written ("Value error, " is not prepended).
    return PydanticCustomError("kubetrain_spec", message)


def raise_at(model: str, problems: list[tuple[tuple[str | int, ...], str, object]]) -> None:
    """Raise problems found by a model validator at the paths of the fields concerned."""
    if problems:
        raise ValidationError.from_exception_data(
            model,
            [
                InitErrorDetails(type=fail(msg), loc=loc, input=value)
                for loc, msg, value in problems
            ],
        )


_TYPE_MESSAGES = {
    "string_type": 'must be a string (quote it in YAML: "10", "1.10", "no")',
    "int_type": "must be a whole number",
    "model_type": "must be a mapping",
    "model_attributes_type": "must be a mapping",
    "dict_type": "must be a mapping",
    "list_type": "must be a list",
}


def _unwrap(annotation: Any) -> Any:
    """The model class (if any) behind Annotated, Optional and list[...] wrappers."""
    while True:
        origin = get_origin(annotation)
        if origin is Annotated or origin is list:
            annotation = get_args(annotation)[0]
        elif origin is Union or origin is UnionType:
            annotation = next(a for a in get_args(annotation) if a is not NoneType)
        else:
            return annotation


def _model_at(root: type[BaseModel], loc: Sequence[str | int]) -> type[BaseModel] | None:
    current: Any = root
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        by_alias = {info.alias or name: info for name, info in current.model_fields.items()}
        if part not in by_alias:
            return None
        current = _unwrap(by_alias[part].annotation)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _dict_fields(root: type[BaseModel]) -> set[tuple[str, ...]]:
    """Paths (by alias) of the dict-valued fields, whose next path part is a key."""
    found: set[tuple[str, ...]] = set()

    def walk(model: type[BaseModel], prefix: tuple[str, ...]) -> None:
        for name, info in model.model_fields.items():
            path = (*prefix, info.alias or name)
            annotation = info.annotation
            while get_origin(annotation) is Annotated:
                annotation = get_args(annotation)[0]
            if get_origin(annotation) is dict:
                found.add(path)
                continue
            inner = _unwrap(annotation)
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                walk(inner, path)

    walk(root, ())
    return found


def _path(loc: Sequence[str | int], dict_fields: set[tuple[str, ...]]) -> str:
    out = ""
    named: tuple[str, ...] = ()
    after_dict = False
    for part in loc:
        if part == "[key]":
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        elif after_dict:
            out += f"[{json.dumps(part)}]"
            after_dict = False
            continue
        else:
            out = f"{out}.{part}" if out else part
            named = (*named, part)
            after_dict = named in dict_fields
    return out


def problems_from_validation_error(
    exc: ValidationError,
    root: type[BaseModel],
    prefix: str = "",
    *,
    missing_hints: Mapping[str, str] | None = None,
) -> list[FieldProblem]:
    """Turn pydantic's errors into FieldProblems whose messages say what is allowed.

    `missing_hints` gives, by field path without list positions, what to say of a
    required field that is absent instead of a bare "required".
    """
    hints = missing_hints or {}
    dict_fields = _dict_fields(root)
    problems: list[FieldProblem] = []
    for error in exc.errors(include_url=False, include_input=False):
        loc = error["loc"]
        field = _path(loc, dict_fields)
        bare = re.sub(r"\[[^\]]*\]", "", field)  # hints do not depend on list positions
        kind = error["type"]
        if kind == "kubetrain_spec":
            message = error["msg"]
        elif kind == "missing":
            message = hints.get(bare, "required")
        elif kind == "extra_forbidden":
            model = _model_at(root, loc[:-1])
            allowed = (
                ", ".join(info.alias or name for name, info in model.model_fields.items())
                if model
                else ""
            )
            message = f"unknown field; allowed here: {allowed}" if allowed else "unknown field"
        elif kind == "literal_error":
            message = "must be " + error["ctx"]["expected"] if "ctx" in error else error["msg"]
        else:
            message = _TYPE_MESSAGES.get(kind, error["msg"])
        if "[key]" in loc and kind != "kubetrain_spec":
            message = f"key {message}"
        full = f"{prefix}.{field}" if prefix and field else prefix or field
        problems.append(FieldProblem(full, message))
    if len(problems) > MAX_PROBLEMS:
        hidden = len(problems) - MAX_PROBLEMS
        problems = [*problems[:MAX_PROBLEMS], FieldProblem("", f"and {hidden} more problems")]
    return problems
