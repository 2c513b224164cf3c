"""Parsing: a decoded document (a JSON body) or YAML text, through the strict loader.

The YAML is screened before anything is built (no anchors or aliases, one
document, bounded depth and size) and loaded with a SafeLoader that refuses
duplicate keys; YAML's own coercions are not undone, so `version: 1.10` arrives
as a float and is refused by the strict models.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml
from pydantic import ValidationError

from kubetrain.domain.spec.fields import utf8_size
from kubetrain.domain.spec.models import API_VERSION, KIND, TrainingJob
from kubetrain.domain.spec.problems import FieldProblem, SpecError, problems_from_validation_error

__all__ = ["MAX_YAML_BYTES", "MAX_YAML_DEPTH", "parse_training_job", "parse_training_job_yaml"]

# The whole document; the API refuses larger bodies before they get here.
MAX_YAML_BYTES = 256 * 1024
# Deeper nesting than any TrainingJob needs; PyYAML builds nodes recursively.
MAX_YAML_DEPTH = 32

# Hints for required fields whose absence needs more than "required".
_MISSING_HINTS = {
    "apiVersion": f"required: {API_VERSION}",
    "kind": f"required: {KIND}",
    "spec.resources": "required: every job requests cpu and memory, e.g. "
    '{requests: {cpu: "4", memory: 16Gi}}',
    "spec.resources.requests": "required: every job requests cpu and memory, e.g. "
    '{cpu: "4", memory: 16Gi}',
    "spec.resources.requests.cpu": 'required: every job requests cpu (e.g. "4" or 500m); '
    "a GPU alone leaves the scheduler without the whole need",
    "spec.resources.requests.memory": "required: every job requests memory (e.g. 16Gi); "
    "a GPU alone leaves the scheduler without the whole need",
}


def parse_training_job(data: object, *, project: str | None = None) -> TrainingJob:
    """Validate a decoded TrainingJob (a JSON body, a YAML document); SpecError if refused.

    `project`, when given (the project of the API path or `--project`), fills a
    missing `metadata.project` and must equal one that is given.
    """
    problems: list[FieldProblem] = []
    if project is not None and isinstance(data, Mapping):
        metadata = data.get("metadata")
        if isinstance(metadata, Mapping):
            given = metadata.get("project")
            if given is None:
                data = {**data, "metadata": {**metadata, "project": project}}
            elif given != project:
                problems.append(
                    FieldProblem(
                        "metadata.project",
                        f"is {given!r} but the job is submitted to project {project!r}; "
                        "leave it out or make them equal",
                    )
                )
    try:
        job = TrainingJob.model_validate(data)
    except ValidationError as exc:
        problems.extend(
            problems_from_validation_error(exc, TrainingJob, missing_hints=_MISSING_HINTS)
        )
        raise SpecError(problems) from None
    except RecursionError:
        raise SpecError.single("", "the document is nested too deeply") from None
    if problems:
        raise SpecError(problems)
    return job


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys instead of silently keeping the last."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key; construct_mapping reports it
                break
            if duplicate:
                mark = key_node.start_mark
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"not valid YAML: {exc.problem} (line {mark.line + 1}, column {mark.column + 1})"
    return f"not valid YAML: {exc}"


def _screen_yaml(text: str) -> None:
    """Refuse, before anything is built, what a TrainingJob never needs: aliases, several
    documents, deep nesting. Aliases are how small YAML expands into huge objects."""
    documents = 0
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            line = event.start_mark.line + 1 if event.start_mark else 0
            raise SpecError.single(
                "", f"YAML anchors and aliases (& and *) are not accepted (line {line})"
            )
        if isinstance(event, yaml.DocumentStartEvent):
            documents += 1
            if documents > 1:
                raise SpecError.single(
                    "", "one TrainingJob per document: found a second YAML document (---)"
                )
        elif isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                raise SpecError.single("", f"nested deeper than {MAX_YAML_DEPTH} levels")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def parse_training_job_yaml(text: str, *, project: str | None = None) -> TrainingJob:
    """Parse one YAML document into a TrainingJob; SpecError for anything refused."""
    if not isinstance(text, str):
        raise SpecError.single("", f"expected YAML text, got {type(text).__name__}")
    if len(text) > MAX_YAML_BYTES or utf8_size(text) > MAX_YAML_BYTES:
        raise SpecError.single("", f"the document is larger than {MAX_YAML_BYTES} bytes")
    try:
        _screen_yaml(text)
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise SpecError.single("", _yaml_problem(exc)) from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer of 5,000 digits
        raise SpecError.single("", f"not a usable YAML value: {exc}") from None
    if data is None:
        raise SpecError.single("", "the document is empty: expected a TrainingJob")
    if not isinstance(data, dict):
        raise SpecError.single(
            "", f"expected a mapping (apiVersion, kind, metadata, spec), got {type(data).__name__}"
        )
    return parse_training_job(data, project=project)
