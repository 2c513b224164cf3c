"""The tables: jobs, their attempts, the append-only transition history, API tokens, datasets,
and what the in-container runtime reports (progress).

SQLAlchemy 2 typed declarative models. The business state lives on `jobs`, the
runtime state of each Pod on `attempts`, and every change of either appends a
`transitions` row, so the two states are never folded into one column.

Decisions worth knowing:

* Job names may repeat within a project (a user resubmits `train-policy` after a
  failure); the id is the identity, and "by name" means the newest job of that
  name. Retries of one submission are deduplicated by the idempotency key, which
  is unique per project.
* Enum-valued columns are plain strings (no database enum types), so a new reason
  code needs no migration.
* Timestamps are stored as UTC and always come back timezone-aware (SQLite has no
  timezone type; PostgreSQL uses `timestamptz`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, TypeVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    event,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from kubetrain.domain.states import BusinessState, ReasonCode

# Deterministic constraint names: Alembic can then alter or drop them by name on
# both databases, and SQLite's batch mode can recreate them.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# Kubernetes limits: a namespace (our project) is a DNS label, object names are
# DNS subdomains.
PROJECT_LENGTH = 63
NAME_LENGTH = 253
ENUM_LENGTH = 32  # the longest reason code is 23 characters
ALL_PROJECTS = "*"  # a token scoped to every project


class Source(StrEnum):
    """Who wrote a history row."""

    API = "api"
    DISPATCHER = "dispatcher"
    SYNCER = "syncer"
    CLI = "cli"


class TransitionKind(StrEnum):
    BUSINESS = "business"  # the job's (state, reason) changed
    RUNTIME = "runtime"  # an attempt's Pod changed materially


class Role(StrEnum):
    """What a token may do; the API maps each to its permissions."""

    VIEWER = "viewer"
    SUBMITTER = "submitter"
    ADMIN = "admin"


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC datetime on every backend; naive datetimes are refused.

    A naive value is ambiguous (local time? UTC?), and SQLite would store it
    without complaint, so it is rejected at the boundary instead.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"naive datetime {value!r}: pass a timezone-aware one")
        value = value.astimezone(UTC)
        # SQLite's DATETIME stores a fixed-width string; dropping the (always UTC)
        # offset keeps it sortable and comparable as text.
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


E = TypeVar("E", bound=StrEnum)


class StrEnumType(TypeDecorator[E]):
    """A `StrEnum` stored as its value in a VARCHAR; unknown values fail loudly on read."""

    impl = String(ENUM_LENGTH)
    cache_ok = True

    def __init__(self, enum: type[E]) -> None:
        super().__init__()
        self.enum = enum

    def process_bind_param(self, value: E | str | None, dialect: Dialect) -> str | None:
        return None if value is None else self.enum(value).value

    def process_result_value(self, value: str | None, dialect: Dialect) -> E | None:
        return None if value is None else self.enum(value)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {  # noqa: RUF012 - SQLAlchemy reads this class attribute
        datetime: UTCDateTime(),
        dict[str, Any]: JSON(),
    }


class Job(Base):
    """A training job: its spec, owner and business state, plus the dispatcher's outbox fields."""

    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("project", "idempotency_key"),
        Index(None, "project", "business_state"),
        # Keyset pagination walks (created_at, id) newest first within a project.
        Index(None, "project", "created_at", "id"),
        Index(None, "project", "name", "created_at"),
        # The dispatcher's claim; NULL once the Kubernetes Job exists.
        Index(None, "next_dispatch_at"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    project: Mapped[str] = mapped_column(String(PROJECT_LENGTH))
    name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    owner: Mapped[str] = mapped_column(String(255))
    spec: Mapped[dict[str, Any]]
    spec_digest: Mapped[str] = mapped_column(String(64))
    # NULLs are distinct in unique constraints on both databases, so jobs
    # submitted without a key never collide.
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    namespace: Mapped[str] = mapped_column(String(PROJECT_LENGTH))
    k8s_job_name: Mapped[str | None] = mapped_column(String(63))

    business_state: Mapped[BusinessState] = mapped_column(StrEnumType(BusinessState))
    reason: Mapped[ReasonCode] = mapped_column(StrEnumType(ReasonCode))
    reason_message: Mapped[str | None] = mapped_column(Text)
    raw_reason: Mapped[str | None] = mapped_column(Text)
    raw_message: Mapped[str | None] = mapped_column(Text)
    current_attempt: Mapped[int] = mapped_column(Integer, default=0)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    # A gang's attempts that failed and counted against `retries` (a disruption does not).
    retries_used: Mapped[int] = mapped_column(Integer, default=0)
    # The outbox of a gang restart: the uid of the ended attempt's Job, which the
    # dispatcher deletes before it creates attempt `current_attempt`; NULL when none is due.
    restart_job_uid: Mapped[str | None] = mapped_column(String(64))

    dispatch_attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_dispatch_at: Mapped[datetime | None]
    last_dispatch_error: Mapped[str | None] = mapped_column(Text)

    diagnosis: Mapped[dict[str, Any] | None]  # the syncer's latest, so any replica can answer

    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]

    def __repr__(self) -> str:
        return f"<Job {self.id} {self.project}/{self.name} {self.business_state}/{self.reason}>"


class Attempt(Base):
    """The runtime state of one Pod of a job, as Kubernetes last reported it.

    A single-Pod job's attempts are its Pods, numbered in the order they appeared. A
    gang's attempt is one Job of N workers: one row per worker (`rank`), all with the
    attempt's number, which the Job carries (`kubetrain.io/attempt`).
    """

    __tablename__ = "attempts"
    __table_args__ = (UniqueConstraint("job_id", "pod_uid"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"))
    number: Mapped[int] = mapped_column(Integer)  # 1-based
    rank: Mapped[int | None] = mapped_column(Integer)  # the worker's index; None for one Pod
    pod_name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    pod_uid: Mapped[str] = mapped_column(String(64))
    node: Mapped[str | None] = mapped_column(String(NAME_LENGTH))
    pod_phase: Mapped[str | None] = mapped_column(String(ENUM_LENGTH))
    container_state: Mapped[str | None] = mapped_column(Text)
    scheduling_reason: Mapped[str | None] = mapped_column(Text)
    raw_reason: Mapped[str | None] = mapped_column(Text)
    raw_message: Mapped[str | None] = mapped_column(Text)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    termination_message: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    bound_at: Mapped[datetime | None]  # the scheduler bound the Pod: its GPUs are held from then
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]

    def __repr__(self) -> str:
        return f"<Attempt {self.job_id}#{self.number} {self.pod_name} {self.pod_phase}>"


class Transition(Base):
    """One row of the append-only history; never updated or deleted.

    Business rows carry the job's states and reason codes. Runtime rows carry the
    Pod phase in `from_state`/`to_state`, leave the reason codes empty, keep the
    raw Kubernetes reason, and list the changed fields in `detail`.
    """

    __tablename__ = "transitions"
    __table_args__ = (Index(None, "job_id", "id"),)

    # BIGINT on PostgreSQL; SQLite only autoincrements a column declared INTEGER.
    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"))
    at: Mapped[datetime]
    source: Mapped[Source] = mapped_column(StrEnumType(Source))
    kind: Mapped[TransitionKind] = mapped_column(StrEnumType(TransitionKind))
    from_state: Mapped[str | None] = mapped_column(String(ENUM_LENGTH))
    to_state: Mapped[str | None] = mapped_column(String(ENUM_LENGTH))
    from_reason: Mapped[ReasonCode | None] = mapped_column(StrEnumType(ReasonCode))
    to_reason: Mapped[ReasonCode | None] = mapped_column(StrEnumType(ReasonCode))
    raw_reason: Mapped[str | None] = mapped_column(Text)
    raw_message: Mapped[str | None] = mapped_column(Text)
    attempt: Mapped[int | None] = mapped_column(Integer)
    # None is SQL NULL when given (not JSON null): the syncer's batches give every column
    # of every row, so that they are written in one statement (store/sync.py).
    detail: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))

    def __repr__(self) -> str:
        return (
            f"<Transition {self.id} {self.job_id} {self.kind} "
            f"{self.from_state}/{self.from_reason} -> {self.to_state}/{self.to_reason}>"
        )


@event.listens_for(Transition, "before_update")
@event.listens_for(Transition, "before_delete")
def _history_is_append_only(_mapper: Any, _connection: Any, row: Transition) -> None:
    # What happened stays as it was recorded; a correction is a new row.
    raise TypeError(f"transitions are append-only: refusing to change or delete {row!r}")


class Token(Base):
    """An API bearer token. Only its SHA-256 is stored; the plaintext is shown once."""

    __tablename__ = "tokens"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    name: Mapped[str] = mapped_column(String(255))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))  # enough to recognise it in a list
    role: Mapped[Role] = mapped_column(StrEnumType(Role))
    project: Mapped[str] = mapped_column(String(PROJECT_LENGTH))  # or ALL_PROJECTS
    created_at: Mapped[datetime]
    last_used_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]

    def __repr__(self) -> str:
        return f"<Token {self.id} {self.name} {self.prefix}… {self.role}@{self.project}>"


class Webhook(Base):
    """A receiver of a project's job events (domain/notifications.py).

    The secret signs each delivery, so it is kept, not hashed; it is shown once,
    at creation, and never logged. What it still has to receive is its rows of
    `webhook_deliveries`, written with the history rows themselves.
    """

    __tablename__ = "webhooks"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    project: Mapped[str] = mapped_column(String(PROJECT_LENGTH), index=True)
    url: Mapped[str] = mapped_column(Text)
    secret: Mapped[str] = mapped_column(String(64))
    events: Mapped[list[str]] = mapped_column(JSON)  # empty: every type
    created_at: Mapped[datetime]
    created_by: Mapped[str] = mapped_column(String(255))
    delivered: Mapped[int] = mapped_column(BigInteger, default=0)
    failures: Mapped[int] = mapped_column(Integer, default=0)  # in a row
    failing_since: Mapped[datetime | None]
    next_attempt_at: Mapped[datetime | None]
    last_error: Mapped[str | None] = mapped_column(Text)

    def __repr__(self) -> str:
        return f"<Webhook {self.id} {self.project}>"


class WebhookDelivery(Base):
    """A business history row one webhook still has to receive: the outbox.

    Written in the transaction that writes the history row, for every webhook of
    the job's project then, and deleted once the receiver answered 2xx; so a row
    that commits late (after rows with higher ids) is delivered all the same, and
    no cursor can pass it. `event_key` is random: the events' ids, stable across
    retries, that tell a receiver nothing of other projects' activity.
    """

    __tablename__ = "webhook_deliveries"

    webhook_id: Mapped[str] = mapped_column(
        ForeignKey("webhooks.id", ondelete="CASCADE"), primary_key=True
    )
    transition_id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"),
        ForeignKey("transitions.id"),
        primary_key=True,
    )
    event_key: Mapped[str] = mapped_column(String(32))


class Installation(Base):
    """This installation's identity, one row made by the migration that adds the table:
    the CloudEvents `source` of its webhooks' events. A restored database keeps it."""

    __tablename__ = "installation"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    created_at: Mapped[datetime]


class WebSession(Base):
    """A dashboard sign-in, kept server-side so that signing out ends it: the signed
    cookie names the session, and a session without its row is no session.

    Only the SHA-256 of the session id is stored (as for tokens), so a copy of
    the table opens no dashboard.
    """

    __tablename__ = "web_sessions"
    __table_args__ = (Index(None, "expires_at"),)

    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    token_id: Mapped[str] = mapped_column(ForeignKey("tokens.id"))
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime]


class Dataset(Base):
    """A registered dataset version: where its bytes live (a PVC and a sub-path)."""

    __tablename__ = "datasets"
    __table_args__ = (UniqueConstraint("name", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    version: Mapped[str] = mapped_column(String(128))
    claim: Mapped[str] = mapped_column(String(NAME_LENGTH))
    sub_path: Mapped[str | None] = mapped_column(String(1024))
    checksums: Mapped[dict[str, Any] | None]
    created_at: Mapped[datetime]
    created_by: Mapped[str] = mapped_column(String(255))

    def __repr__(self) -> str:
        return f"<Dataset {self.name}@{self.version} {self.claim}:{self.sub_path or ''}>"


class Report(Base):
    """One event the runtime inside a Pod reported (phase, step, checkpoint, resume).

    (job, pod, seq) is unique, so a batch the reporter retries after a lost
    response is stored once.
    """

    __tablename__ = "reports"
    __table_args__ = (
        UniqueConstraint("job_id", "pod", "seq"),
        Index(None, "job_id", "kind", "id"),
    )

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"))
    pod: Mapped[str] = mapped_column(String(NAME_LENGTH))
    seq: Mapped[int] = mapped_column(BigInteger)
    kind: Mapped[str] = mapped_column(String(ENUM_LENGTH))
    data: Mapped[dict[str, Any]]
    reported_at: Mapped[datetime]  # the Pod's clock
    received_at: Mapped[datetime]  # ours


class Progress(Base):
    """The latest of what a job's runtime reported, one row per job (the read model)."""

    __tablename__ = "progress"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    pod: Mapped[str] = mapped_column(String(NAME_LENGTH))  # the Pod that reported last
    phase: Mapped[str | None] = mapped_column(String(ENUM_LENGTH))
    phase_since: Mapped[datetime | None]
    step: Mapped[int | None] = mapped_column(BigInteger)
    step_at: Mapped[datetime | None]
    metrics: Mapped[dict[str, Any] | None]
    checkpoint: Mapped[dict[str, Any] | None]  # {step, sizeBytes, durationSeconds, at}
    dropped: Mapped[int] = mapped_column(BigInteger, default=0)  # events the reporter dropped
    updated_at: Mapped[datetime]
