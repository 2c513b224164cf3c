"""Typed results: one class per answer of the API (kubetrain/api/schemas.py), from its JSON.

Each keeps the answer as the server sent it in `raw` (what `kubetrain ... -o json`
prints) and has its fields as attributes, under the API's names but for `state`
(`business_status`); times are timezone-aware datetimes. A field an older server
does not send is None. tests/unit/test_client_results.py checks each class against
its schema, so a field the API adds is added here too.

Plain classes, not dataclasses: `kubetrain get jobs` builds them, and importing
`dataclasses` alone would cost it a tenth of its start (bench/cli_start.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, ClassVar

__all__ = [
    "TERMINAL_STATES",
    "Diagnosis",
    "GpuSeconds",
    "HistoryEntry",
    "Job",
    "Reason",
    "Result",
    "Usage",
    "UsageEntry",
]

# Nothing leaves these (domain/states.py TERMINAL, named here without importing the domain).
TERMINAL_STATES = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})


Converters = Mapping[str, Callable[[Any], Any]]


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text)


class Result:
    """An answer of the API with its fields as attributes; `raw` is the JSON itself."""

    __slots__ = ("raw",)
    _FIELDS: ClassVar[Mapping[str, str]] = {}  # the API's field -> the attribute
    _CONVERT: ClassVar[Converters] = {}  # attribute -> from JSON
    _SHOWN: ClassVar[tuple[str, ...]] = ()  # what the repr shows

    raw: dict[str, Any]

    def __init__(self, raw: Mapping[str, Any]) -> None:
        self.raw = dict(raw)
        for field, attribute in self._FIELDS.items():
            value = raw.get(field)
            convert = self._CONVERT.get(attribute)
            setattr(self, attribute, convert(value) if convert and value is not None else value)

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={_shown(getattr(self, name))}" for name in self._SHOWN)
        return f"{type(self).__name__}({shown})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # IPython's pretty printer
        printer.text(repr(self))

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.raw == self.raw

    __hash__ = None  # type: ignore[assignment]  # equal by a dict: not hashable


def _shown(value: Any) -> str:
    if isinstance(value, datetime):
        return repr(value.isoformat().replace("+00:00", "Z"))
    return repr(value)


def _table(title: str, rows: list[tuple[str, Any]]) -> str:
    """A small HTML table for a notebook: one row per field, the values escaped."""
    import html

    cells = "".join(
        f"<tr><th style='text-align:left'>{html.escape(label)}</th>"
        f"<td style='text-align:left'>{html.escape(_plain(value))}</td></tr>"
        for label, value in rows
        if value not in (None, "", [])
    )
    return f"<table><caption style='text-align:left'>{html.escape(title)}</caption>{cells}</table>"


def _plain(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    return str(value)


_REASON = {name: name for name in ("code", "link", "explanation", "action", "actor")}


class Reason(Result):
    """A reason code with the catalog's words: its link of the chain, what it means,
    the next step and who takes it (`user`, `platform`, `none`)."""

    __slots__ = tuple(_REASON.values())
    _FIELDS = _REASON
    _SHOWN = ("code", "link", "actor")

    code: str
    link: str
    explanation: str
    action: str
    actor: str


_DIAGNOSIS = {
    "job": "job",
    "business_status": "state",
    "reason": "reason",
    "link": "link",
    "waitable": "waitable",
    "actor": "actor",
    "explanation": "explanation",
    "action": "action",
    "since": "since",
    "raw_reason": "raw_reason",
    "raw_message": "raw_message",
    "blockers": "blockers",
    "chain": "chain",
    "nodes": "nodes",
    "constraints": "constraints",
    "attempts": "attempts",
    "notes": "notes",
    "restart": "restart",
    "preempted": "preempted",
}


class Diagnosis(Result):
    """Why a job is or is not running (docs/diagnosis.md): the link that holds it, in
    plain words, the next step and who takes it, Kubernetes' own words beside them.
    `blockers`, `chain`, `nodes`, `constraints`, `attempts` are lists of the JSON's
    objects; `job_id` is the job's id when the diagnosis came from `Client.why`."""

    __slots__ = (*_DIAGNOSIS.values(), "job_id")
    _FIELDS = _DIAGNOSIS
    _CONVERT: ClassVar[Converters] = {"since": _time}
    _SHOWN = ("job", "state", "reason", "link", "actor", "explanation")

    job: str
    state: str
    reason: str
    link: str
    waitable: bool | None
    actor: str
    explanation: str
    action: str
    since: datetime | None
    raw_reason: str | None
    raw_message: str | None
    blockers: list[dict[str, Any]]
    chain: list[dict[str, Any]]
    nodes: list[dict[str, Any]]
    constraints: list[dict[str, Any]]
    attempts: list[dict[str, Any]]
    notes: list[str]
    restart: dict[str, Any] | None
    preempted: list[str]
    job_id: str | None

    def __init__(self, raw: Mapping[str, Any], *, job_id: str | None = None) -> None:
        super().__init__(raw)
        self.job_id = job_id

    def _repr_html_(self) -> str:
        chain = " → ".join(f"{link['link']}: {link['state']}" for link in self.chain or [])
        raw = ": ".join(part for part in (self.raw_reason, self.raw_message) if part)
        return _table(
            f"why {self.job}: {self.state} / {self.reason}",
            [
                ("link", self.link),
                ("explanation", self.explanation),
                ("next step", f"{self.action} [{self.actor}]"),
                ("waitable", self.waitable),
                ("since", self.since),
                ("Kubernetes", raw),
                ("chain", chain),
            ],
        )


_JOB = {
    "id": "id",
    "name": "name",
    "project": "project",
    "namespace": "namespace",
    "owner": "owner",
    "business_status": "state",
    "reason": "reason",
    "reason_detail": "reason_detail",
    "message": "message",
    "raw_reason": "raw_reason",
    "raw_message": "raw_message",
    "attempt": "attempt",
    "workers": "workers",
    "gpus": "gpus",
    "retries_used": "retries_used",
    "node": "node",
    "exit_code": "exit_code",
    "runtime": "runtime",
    "kubernetes_job": "kubernetes_job",
    "cancel_requested": "cancel_requested",
    "created_at": "created_at",
    "updated_at": "updated_at",
    "finished_at": "finished_at",
    # Only in one job's detail (Client.get, wait); None in a listing:
    "spec": "spec",
    "diagnosis": "diagnosis",
    "progress": "progress",
    "gpu_seconds": "gpu_seconds",
}


class Job(Result):
    """A training job: its business `state` and `reason` (with the catalog's words in
    `reason_detail`), Kubernetes' `raw_reason` and `raw_message`, the current attempt's
    `runtime`; from `get` and `wait` also its `spec`, `diagnosis`, `progress` and
    `gpu_seconds` (None in a listing). `runtime`, `progress` and `gpu_seconds` are the
    API's JSON objects (docs/api.md)."""

    __slots__ = tuple(_JOB.values())
    _FIELDS = _JOB
    _CONVERT: ClassVar[Converters] = {
        "reason_detail": Reason,
        "diagnosis": Diagnosis,
        "created_at": _time,
        "updated_at": _time,
        "finished_at": _time,
    }
    _SHOWN = ("name", "id", "project", "state", "reason", "node", "created_at")

    id: str
    name: str
    project: str
    namespace: str
    owner: str
    state: str
    reason: str
    reason_detail: Reason
    message: str | None
    raw_reason: str | None
    raw_message: str | None
    attempt: int
    workers: int
    gpus: int
    retries_used: int
    node: str | None
    exit_code: int | None
    runtime: dict[str, Any] | None
    kubernetes_job: str | None
    cancel_requested: bool
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    spec: dict[str, Any] | None
    diagnosis: Diagnosis | None
    progress: dict[str, Any] | None
    gpu_seconds: dict[str, Any] | None

    @property
    def done(self) -> bool:
        """SUCCEEDED, FAILED or CANCELLED: nothing changes it any more."""
        return self.state in TERMINAL_STATES

    @property
    def explanation(self) -> str:
        """In plain words, why the job is where it is: the diagnosis's words with this
        job's numbers when there is one for the current reason, else the catalog's."""
        if self.diagnosis is not None and self.diagnosis.reason == self.reason:
            return self.diagnosis.explanation
        return self.reason_detail.explanation

    def _repr_html_(self) -> str:
        raw = ": ".join(part for part in (self.raw_reason, self.raw_message) if part)
        return _table(
            f"{self.name} ({self.id}, project {self.project})",
            [
                ("state", self.state),
                ("reason", f"{self.reason} (link: {self.reason_detail.link})"),
                ("explanation", self.explanation),
                ("next step", f"{self.reason_detail.action} [{self.reason_detail.actor}]"),
                ("message", self.message),
                ("Kubernetes", raw),
                ("node", self.node),
                ("attempt", self.attempt or None),
                ("exit code", self.exit_code),
                ("created", self.created_at),
                ("finished", self.finished_at),
            ],
        )


_HISTORY = {
    name: name
    for name in (
        "id",
        "at",
        "kind",
        "source",
        "from_state",
        "to_state",
        "from_reason",
        "to_reason",
        "raw_reason",
        "raw_message",
        "attempt",
        "rank",
        "detail",
    )
}


class HistoryEntry(Result):
    """One change of a job, in order: `kind` `business` (state and reason) or `runtime`
    (a Pod's phase), who saw it (`source`) and what Kubernetes said."""

    __slots__ = tuple(_HISTORY.values())
    _FIELDS = _HISTORY
    _CONVERT: ClassVar[Converters] = {"at": _time}
    _SHOWN = ("at", "kind", "from_state", "to_state", "to_reason", "raw_reason")

    id: int
    at: datetime
    kind: str
    source: str
    from_state: str | None
    to_state: str | None
    from_reason: str | None
    to_reason: str | None
    raw_reason: str | None
    raw_message: str | None
    attempt: int | None
    rank: int | None
    detail: dict[str, Any] | None


_GPU_SECONDS = {name: name for name in ("before_training", "training", "total")}


class GpuSeconds(Result):
    """GPU-seconds held, split at the Pods' TRAINING report (docs/api.md)."""

    __slots__ = tuple(_GPU_SECONDS.values())
    _FIELDS = _GPU_SECONDS
    _SHOWN = ("before_training", "training", "total")

    before_training: float
    training: float
    total: float


_USAGE_ENTRY = {
    **_GPU_SECONDS,
    **{name: name for name in ("project", "gpu_type", "jobs", "gpu_hours")},
}


class UsageEntry(Result):
    """One project's GPU time on one GPU type."""

    __slots__ = tuple(_USAGE_ENTRY.values())
    _FIELDS = _USAGE_ENTRY
    _SHOWN = ("project", "gpu_type", "jobs", "gpu_hours")

    project: str
    gpu_type: str
    jobs: int
    gpu_hours: float
    before_training: float
    training: float
    total: float


def _entries(items: list[dict[str, Any]]) -> list[UsageEntry]:
    return [UsageEntry(item) for item in items]


_USAGE = {name: name for name in ("since", "until", "items", "total")}


class Usage(Result):
    """GPU time per project and GPU type in a window (`since` None: from the start)."""

    __slots__ = tuple(_USAGE.values())
    _FIELDS = _USAGE
    _CONVERT: ClassVar[Converters] = {
        "since": _time,
        "until": _time,
        "items": _entries,
        "total": GpuSeconds,
    }
    _SHOWN = ("since", "until", "items", "total")

    since: datetime | None
    until: datetime
    items: list[UsageEntry]
    total: GpuSeconds
