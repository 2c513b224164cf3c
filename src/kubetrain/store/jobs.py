"""Jobs: submission with idempotency, lookups and pages, one job's business changes.

All functions but one take a `Session` inside a transaction the caller owns
(`with db.transaction() as session: ...`), so several changes can commit
together, and none of them commits. The exception, `submit_many_and_commit`, is the
API's submissions: a batch of them in a transaction of its own on the driver's cursor
(store/_driver.py), with the same statements as `submit_job`. The rules of a change are
transitions.py's, which the syncer's batches (sync.py) apply too.

Every writer of a job's state or history first locks the job's row (`SELECT ...
FOR UPDATE` on PostgreSQL; SQLite's write transactions are serialised already),
so two writers never interleave on one job and its history stays in order.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from typing import Any

from sqlalchemy import (
    Dialect,
    Select,
    bindparam,
    func,
    insert,
    inspect,
    select,
    tuple_,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine.interfaces import DBAPICursor
from sqlalchemy.orm import (
    ClassManager,
    Session,
    configure_mappers,
    defer,
    make_transient_to_detached,
)

from kubetrain.domain.states import TERMINAL, BusinessState, ReasonCode
from kubetrain.store import transitions
from kubetrain.store._driver import Compiled, compile_for, execute, execute_many, wrap_errors
from kubetrain.store._unique import INSERT_TRIES
from kubetrain.store.db import Database
from kubetrain.store.errors import (
    IdempotencyConflict,
    InvalidCursor,
    JobNotFound,
)
from kubetrain.store.in_lists import in_chunks, padded
from kubetrain.store.metrics import note_state_durations
from kubetrain.store.models import Attempt, Job, Source, Transition, TransitionKind, Webhook
from kubetrain.store.webhooks import deliveries, delivery_insert, note_business_rows

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500  # a page is one query; beyond this, paginate


def _now(now: datetime | None) -> datetime:
    return now if now is not None else datetime.now(UTC)


def state_entered(session: Session, job_ids: Sequence[str]) -> dict[str, datetime]:
    """When each job entered its business state, for the jobs that ever moved (one that
    never did is in it since its `created_at`): one query per `IN_CHUNK` ids."""
    entered: dict[str, datetime] = {}
    for chunk in in_chunks(job_ids):
        query = (
            select(Transition.job_id, func.max(Transition.at))
            .where(
                Transition.job_id.in_(chunk),
                Transition.kind == TransitionKind.BUSINESS,
                Transition.from_state != Transition.to_state,
            )
            .group_by(Transition.job_id)
        )
        entered.update({job_id: at for job_id, at in session.execute(query)})
    return entered


# -- submission ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Submission:
    job: Job
    replayed: bool  # True: the idempotency key matched an earlier identical submission


def submit_job(
    session: Session,
    *,
    project: str,
    name: str,
    owner: str,
    namespace: str,
    spec: Mapping[str, Any],
    idempotency_key: str | None = None,
    job_id: str | None = None,
    source: Source = Source.API,
    digest: str,
    now: datetime | None = None,
) -> Submission:
    """Store a new job in `CREATED`/`JOB_NOT_CREATED`, with its first history row, in the
    caller's transaction; `submit_and_commit` is the same in a transaction of its own.

    With an idempotency key, a second submission of the same spec in the same
    project returns the first job (`replayed=True`), and one with another spec
    raises `IdempotencyConflict`. Concurrent submissions with one key make one
    job: the unique constraint on (project, key) decides, not timing.

    `digest` is the spec's identity for that comparison: `domain.spec.spec_digest`
    of the parsed TrainingJob (it equates `cpu: 1` with `cpu: 1000m`).

    The returned job is attached to the session as if it had been read.
    """
    connection = session.connection()
    pooled = connection.connection

    def insert(values: dict[str, Any], first_row: dict[str, Any]) -> bool:
        with wrap_errors(connection.engine, pooled):
            cursor = pooled.cursor()
            try:
                return _insert_new_job(cursor, _statements(connection.dialect), values, first_row)
            finally:
                cursor.close()

    submission = _submit(
        insert,
        lambda: _by_key(session, project, idempotency_key),
        _new_job_values(
            NewSubmission(
                project=project,
                name=name,
                owner=owner,
                namespace=namespace,
                spec=spec,
                digest=digest,
                idempotency_key=idempotency_key,
                source=source,
                now=now,
            ),
            job_id,
        ),
    )
    if not submission.replayed:
        session.add(submission.job)
    return submission


@dataclass(frozen=True, slots=True)
class NewSubmission:
    """One submission for `submit_and_commit` and `submit_many_and_commit`: what
    `submit_job` takes."""

    project: str
    name: str
    owner: str
    namespace: str
    spec: Mapping[str, Any]
    digest: str
    idempotency_key: str | None = None
    source: Source = Source.API
    now: datetime | None = None


def submit_and_commit(db: Database, submission: NewSubmission) -> Submission:
    """`submit_job` in a transaction of its own, committed on return: one submission
    through `submit_many_and_commit`, its error raised."""
    [outcome] = submit_many_and_commit(db, [submission])
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


def submit_many_and_commit(
    db: Database, batch: Sequence[NewSubmission]
) -> list[Submission | Exception]:
    """Each submission's outcome, in order: its `Submission`, or the error it alone would
    have met (`IdempotencyConflict`, SQLAlchemy's). The API's path (api/submissions.py
    queues its requests here, a batch at a time).

    All the batch's inserts commit in one transaction (one `BEGIN IMMEDIATE`/`COMMIT`
    and one turn of SQLite's writer lock; one BEGIN and one COMMIT on PostgreSQL), on
    the driver's cursor (store/_driver.py, a third of the CPU of the same statements
    through an ORM session). The result is what the same submissions one after another
    would give: a key taken by an earlier submission of the batch (or by anyone) is
    looked up after the commit, a replay when its spec is the same and a conflict
    otherwise. A failing statement rolls the whole batch back; then, unless the
    database is unreachable (`OperationalError`: each alone would fail the same way,
    SQLite's only after its busy timeout), each is written alone, so that one bad
    submission fails only itself and nothing is ever half-written. A replayed job is
    read in a read-only transaction of its own (the winner has committed then) and
    returned detached, as a new one is.
    """
    if not batch:
        return []
    rows = [_new_job_values(submission, None)() for submission in batch]
    try:
        with db.driver_transaction() as cursor:
            statements = _statements(db.engine.dialect)
            inserted = [_insert_new_job(cursor, statements, job, first) for job, first in rows]
    except sa_exc.OperationalError as exc:
        return [exc] * len(batch)
    except Exception as exc:
        if len(batch) == 1:
            return [exc]
        return [outcome for one in batch for outcome in submit_many_and_commit(db, [one])]
    outcomes: list[Submission | Exception] = []
    for submission, (job, _), new in zip(batch, rows, inserted, strict=True):
        if new:
            outcomes.append(Submission(_as_loaded(job), replayed=False))
            continue
        try:
            outcomes.append(_taken(db, submission, job))
        except Exception as exc:  # its own outcome; the others' stand
            outcomes.append(exc)
    return outcomes


def _taken(db: Database, submission: NewSubmission, tried: dict[str, Any]) -> Submission:
    """The outcome of a submission whose insert (`tried`: its values) found its key
    taken: the key's job read back, as `_submit` goes on after a taken key."""

    def insert(values: dict[str, Any], first_row: dict[str, Any]) -> bool:
        with db.driver_transaction() as cursor:
            return _insert_new_job(cursor, _statements(db.engine.dialect), values, first_row)

    def existing() -> Job | None:
        with db.read_only() as session:
            return _by_key(session, submission.project, submission.idempotency_key)

    if (held := _holder(existing, tried)) is not None:
        return held
    return _submit(insert, existing, _new_job_values(submission, None))


NewValues = Callable[[], tuple[dict[str, Any], dict[str, Any]]]


def _submit(
    insert: Callable[[dict[str, Any], dict[str, Any]], bool],
    existing: Callable[[], Job | None],
    new_values: NewValues,
) -> Submission:
    """Insert the job (`insert(job's values, first history row's)`: False if its key is
    taken, and nothing written), or else find the job that holds the key (`existing`).

    `INSERT ... ON CONFLICT (project, key) DO NOTHING` lets the constraint decide
    without a lookup first or a savepoint (on PostgreSQL it waits for a concurrent
    insert of the same key to commit, and the lookup after it, at READ COMMITTED,
    sees the winner).
    """
    for _ in range(INSERT_TRIES):
        values, first_row = new_values()
        if insert(values, first_row):
            return Submission(_as_loaded(values), replayed=False)
        if (held := _holder(existing, values)) is not None:
            return held
    raise RuntimeError(f"the idempotency key {values['idempotency_key']!r} kept changing hands")


def _holder(existing: Callable[[], Job | None], values: dict[str, Any]) -> Submission | None:
    """After an insert of `values` found its key taken: the job that holds the key, as
    a replay (the same spec) or IdempotencyConflict (another); None when no job holds it
    any more (the winner's row went away since), for the insert to be tried again."""
    key = values["idempotency_key"]
    assert key is not None  # without a key nothing can conflict
    found = existing()
    if found is None:
        return None
    if found.spec_digest != values["spec_digest"]:
        raise IdempotencyConflict(values["project"], key, found.id)
    return Submission(found, replayed=True)


def _by_key(session: Session, project: str, idempotency_key: str | None) -> Job | None:
    return session.scalars(
        select(Job).where(Job.project == project, Job.idempotency_key == idempotency_key)
    ).one_or_none()


def _new_job_values(submission: NewSubmission, job_id: str | None) -> NewValues:
    """What each try inserts: every column of the new job (but `diagnosis`: None would be
    stored as JSON null, not NULL, so the object handed back has nothing left to load),
    with a fresh id unless `job_id` is given, and its first history row's columns (the
    others are NULL)."""
    now = _now(submission.now)
    spec_copy = json.loads(json.dumps(submission.spec))  # detach from the caller's object
    first_row = {
        "first_at": now,
        "first_source": submission.source,
        "first_kind": TransitionKind.BUSINESS,
        "first_to_state": BusinessState.CREATED,
        "first_to_reason": ReasonCode.JOB_NOT_CREATED,
    }
    project, key = submission.project, submission.idempotency_key

    def values() -> tuple[dict[str, Any], dict[str, Any]]:
        job = {
            "id": job_id or str(uuid.uuid4()),
            "project": project,
            "name": submission.name,
            "owner": submission.owner,
            "spec": spec_copy,
            "spec_digest": submission.digest,
            "idempotency_key": key,
            "namespace": submission.namespace,
            "k8s_job_name": None,
            "business_state": BusinessState.CREATED,
            "reason": ReasonCode.JOB_NOT_CREATED,
            "reason_message": None,
            "raw_reason": None,
            "raw_message": None,
            "current_attempt": 0,
            "cancel_requested": False,
            "retries_used": 0,
            "restart_job_uid": None,
            "dispatch_attempts": 0,
            "next_dispatch_at": now,  # due for the dispatcher at once
            "last_dispatch_error": None,
            "created_at": now,
            "updated_at": now,
            "finished_at": None,
        }
        return job, first_row

    return values


def _as_loaded(values: dict[str, Any]) -> Job:
    """The inserted job as if read back: a row the database holds, not one to insert.

    Filled the way SQLAlchemy's loader fills an object, not through `Job(...)`,
    whose per-attribute change tracking cost ~10x as much (0.15 ms here).
    """
    job: Job = _job_class_manager().new_instance()
    job.__dict__.update(values, diagnosis=None)
    make_transient_to_detached(job)  # the identity from the primary key; no history
    return job


@cache
def _job_class_manager() -> ClassManager[Job]:
    configure_mappers()  # what `Job(...)` would do first: the attributes' machinery
    return inspect(Job).class_manager


def _insert_new_job(
    cursor: DBAPICursor, statements: _Statements, job: dict[str, Any], first_row: dict[str, Any]
) -> bool:
    """Insert the job, its first history row and that row's webhook deliveries; False
    (and nothing written) if the job's idempotency key is taken."""
    if statements.job_and_first_row is not None:  # PostgreSQL: one round trip
        params = {**job, **first_row, "hooks_project": job["project"]}
        rows = execute(cursor, statements.job_and_first_row, params)
        if not rows:
            return False
        row_id, hooks = rows[0]
        hooks = hooks or []
    else:
        assert statements.job is not None
        assert statements.first_row is not None
        if not execute(cursor, statements.job, job):
            return False
        [(row_id,)] = execute(cursor, statements.first_row, {**first_row, "job_id": job["id"]})
        hooks = [hook for (hook,) in execute(cursor, statements.hooks, job)]
    if hooks:  # most projects have none
        execute_many(cursor, statements.delivery, deliveries(int(row_id), hooks))
    return True


@dataclass(frozen=True, slots=True)
class _Statements:
    """The submission's statements, compiled for one dialect."""

    hooks: Compiled  # the project's webhooks (`project`)
    delivery: Compiled
    job_and_first_row: Compiled | None = None  # PostgreSQL
    job: Compiled | None = None  # SQLite: the job, then its first row
    first_row: Compiled | None = None


_CONFLICT_ON = ["project", "idempotency_key"]
# The first history row's columns; the others are NULL (`detail` too: None given
# explicitly would be stored as JSON null).
_FIRST_ROW_COLUMNS = ("at", "source", "kind", "to_state", "to_reason")


def _statements(dialect: Dialect) -> _Statements:
    """The submission's statements for this dialect: compiled at the first submission."""
    statements = _COMPILED.get(dialect.name)
    if statements is None:
        statements = _COMPILED[dialect.name] = _compile_statements(dialect)
    return statements


_COMPILED: dict[str, _Statements] = {}


def _compile_statements(dialect: Dialect) -> _Statements:
    jobs = Job.__table__.c
    history = Transition.__table__.c
    # Every column but `diagnosis` (None would be stored as JSON null, not NULL).
    job_values = {c.name: bindparam(c.name, type_=c.type) for c in jobs if c.name != "diagnosis"}
    first_row = {
        name: bindparam(f"first_{name}", type_=history[name].type) for name in _FIRST_ROW_COLUMNS
    }
    hooks = select(Webhook.id).where(
        Webhook.project == bindparam("project", type_=jobs.project.type)
    )
    delivery = compile_for(delivery_insert(), dialect)
    if dialect.name == "postgresql":
        return _Statements(
            compile_for(hooks, dialect),
            delivery,
            job_and_first_row=compile_for(_postgresql_submission(job_values, first_row), dialect),
        )
    new_job = (
        sqlite.insert(Job)
        .values(job_values)
        .on_conflict_do_nothing(index_elements=_CONFLICT_ON)
        .returning(Job.id)
    )
    first = (
        insert(Transition)
        .values(job_id=bindparam("job_id", type_=history.job_id.type), **first_row)
        .returning(Transition.id)
    )
    return _Statements(
        compile_for(hooks, dialect),
        delivery,
        job=compile_for(new_job, dialect),
        first_row=compile_for(first, dialect),
    )


def _postgresql_submission(job_values: dict[str, Any], first_row: dict[str, Any]) -> Select[Any]:
    """WITH new_job AS (INSERT INTO jobs ... ON CONFLICT DO NOTHING RETURNING id),
    first_row AS (INSERT INTO transitions ... SELECT new_job.id, ... FROM new_job
    RETURNING id) SELECT first_row.id, (the project's webhooks' ids) FROM first_row:
    no row back (and none written) on a taken key."""
    new_job = (
        postgresql.insert(Job)
        .values(job_values)
        .on_conflict_do_nothing(index_elements=_CONFLICT_ON)
        .returning(Job.id)
        .cte("new_job")
    )
    written = (
        insert(Transition)
        .from_select(["job_id", *_FIRST_ROW_COLUMNS], select(new_job.c.id, *first_row.values()))
        .returning(Transition.id)
        .cte("first_row")
    )
    project = Job.__table__.c.project
    hooks = (
        select(func.array_agg(Webhook.id))
        .where(Webhook.project == bindparam("hooks_project", type_=project.type))
        .scalar_subquery()
    )
    return select(written.c.id, hooks)


# -- reads ---------------------------------------------------------------------


def get_job(session: Session, project: str, job_id: str) -> Job | None:
    """The job, or None if there is none with that id *in that project* (no existence leak)."""
    return session.scalars(
        select(Job).where(Job.id == job_id, Job.project == project)
    ).one_or_none()


def get_job_any_project(session: Session, job_id: str) -> Job | None:
    """For the control loops, which know a job only by the id on its Kubernetes labels."""
    return session.get(Job, job_id)


def list_unfinished_jobs(session: Session, *, project: str | None = None) -> list[Job]:
    """Every job not yet terminal, oldest first: what the syncer must account for on resync."""
    query = select(Job).where(Job.business_state.not_in(list(TERMINAL)))
    if project is not None:
        query = query.where(Job.project == project)
    return list(session.scalars(query.order_by(Job.created_at, Job.id)))


def list_projects(session: Session) -> list[str]:
    """Every project that has a job, sorted (the dashboard's choice for a `*` token)."""
    return list(session.scalars(select(Job.project).distinct().order_by(Job.project)))


def count_jobs(session: Session, project: str) -> list[tuple[BusinessState, ReasonCode, int]]:
    """How many of the project's jobs are in each (business state, reason): one grouped query."""
    rows = session.execute(
        select(Job.business_state, Job.reason, func.count())
        .where(Job.project == project)
        .group_by(Job.business_state, Job.reason)
    )
    return [(state, reason, count) for state, reason, count in rows]


@dataclass(frozen=True, slots=True)
class JobPage:
    jobs: list[Job]
    next_cursor: str | None  # None on the last page


def list_jobs(
    session: Session,
    project: str,
    *,
    states: Collection[BusinessState] | None = None,
    reasons: Collection[ReasonCode] | None = None,
    name: str | None = None,
    limit: int = DEFAULT_PAGE_SIZE,
    cursor: str | None = None,
    diagnosis: bool = True,
) -> JobPage:
    """A page of a project's jobs, newest first, optionally filtered.

    Keyset pagination on (created_at, id): a cursor names the last job of the
    previous page, so jobs submitted while a client pages through appear before
    its first page and never shift, repeat or hide the rest. `limit` is clamped
    to 1..MAX_PAGE_SIZE. `diagnosis=False` leaves each job's stored diagnosis
    unread (the API's list shows none; it is most of a finished job's row).
    """
    limit = max(1, min(limit, MAX_PAGE_SIZE))
    query = select(Job).where(Job.project == project)
    if not diagnosis:
        query = query.options(defer(Job.diagnosis, raiseload=True))
    if states:
        query = query.where(Job.business_state.in_(list(states)))
    if reasons:
        query = query.where(Job.reason.in_(list(reasons)))
    if name is not None:
        query = query.where(Job.name == name)
    if cursor is not None:
        created_at, last_id = _decode_cursor(cursor)
        # As a row value, which both databases walk the (project, created_at, id)
        # index from: written as `a < x OR (a = x AND b < y)` it is the same rows, but
        # SQLite then scanned the project's index from its newest job to the cursor
        # (a page 100,000 jobs deep cost ~10x the first).
        query = query.where(tuple_(Job.created_at, Job.id) < tuple_(created_at, last_id))
    rows = list(
        session.scalars(query.order_by(Job.created_at.desc(), Job.id.desc()).limit(limit + 1))
    )
    more = len(rows) > limit
    rows = rows[:limit]
    return JobPage(rows, _encode_cursor(rows[-1]) if more else None)


def _encode_cursor(job: Job) -> str:
    raw = json.dumps([job.created_at.isoformat(), job.id], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


_CURSOR_ID = re.compile(r"[0-9A-Za-z_.-]{1,64}")


def _decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_at, last_id = json.loads(raw)
        when = datetime.fromisoformat(created_at)
        if when.tzinfo is None:
            raise InvalidCursor(cursor)
        # In UTC, as stored: a crafted time past UTC's range (0001-01-01T00:00+01:00)
        # fails here, not in the database driver.
        when = when.astimezone(UTC)
    except (binascii.Error, ValueError, TypeError, UnicodeDecodeError, OverflowError) as exc:
        raise InvalidCursor(cursor) from exc
    # Ids are what this store issues (UUIDs); anything else, a NUL that PostgreSQL
    # would refuse among them, is no cursor of ours.
    if not isinstance(last_id, str) or not _CURSOR_ID.fullmatch(last_id):
        raise InvalidCursor(cursor)
    return when, last_id


def job_history(
    session: Session, project: str, job_id: str, *, kind: TransitionKind | None = None
) -> list[Transition]:
    """The job's history in the order it happened; empty if the job is not in the project."""
    query = (
        select(Transition)
        .join(Job, Job.id == Transition.job_id)
        .where(Job.id == job_id, Job.project == project)
    )
    if kind is not None:
        query = query.where(Transition.kind == kind)
    return list(session.scalars(query.order_by(Transition.id)))


def list_attempts(session: Session, job_id: str) -> list[Attempt]:
    """Every attempt row, by number and, in a gang's attempt, by rank."""
    query = select(Attempt).where(Attempt.job_id == job_id)
    return list(session.scalars(query.order_by(Attempt.number, Attempt.rank, Attempt.id)))


def current_attempts(session: Session, jobs: Collection[Job]) -> dict[str, Attempt]:
    """The current attempt of each job that has one, by job id (a gang's: its lowest
    rank's row, as `get_attempt`): one query for a page."""
    wanted = {job.id: job.current_attempt for job in jobs if job.current_attempt > 0}
    if not wanted:
        return {}
    query = select(Attempt).where(Attempt.job_id.in_(padded(list(wanted))))
    rows = session.scalars(query.order_by(Attempt.rank.desc(), Attempt.id.desc()))
    return {row.job_id: row for row in rows if wanted[row.job_id] == row.number}


def get_attempt(session: Session, job_id: str, number: int) -> Attempt | None:
    """Attempt `number` of the job (e.g. `job.current_attempt`), a gang's by its lowest
    rank seen; None before the first Pod."""
    return session.scalars(
        select(Attempt)
        .where(Attempt.job_id == job_id, Attempt.number == number)
        .order_by(Attempt.rank, Attempt.id)
        .limit(1)
    ).one_or_none()


# -- business state ------------------------------------------------------------


def lock_job(session: Session, job_id: str, project: str | None = None) -> Job:
    """Read the job and hold its row until the transaction ends (PostgreSQL; SQLite's
    write transaction holds the whole database already). Raises `JobNotFound`."""
    query = select(Job).where(Job.id == job_id)
    if project is not None:
        query = query.where(Job.project == project)
    job = session.scalars(
        # populate_existing: the locked row, not a copy the session read earlier
        query.with_for_update().execution_options(populate_existing=True)
    ).one_or_none()
    if job is None:
        raise JobNotFound(job_id)
    return job


def lock_jobs(session: Session, job_ids: Collection[str]) -> dict[str, Job]:
    """`lock_job` for a batch, by id, in one query per `IN_CHUNK` ids; missing ids are
    left out. The rows are locked in id order, as the syncer's batches lock theirs, so
    that two batches at worst wait for each other and never deadlock."""
    jobs: dict[str, Job] = {}
    for chunk in in_chunks(sorted(job_ids)):
        query = select(Job).where(Job.id.in_(chunk)).order_by(Job.id).with_for_update()
        for job in session.scalars(query.execution_options(populate_existing=True)):
            jobs[job.id] = job
    return jobs


def apply_business_change(
    session: Session,
    job_id: str,
    state: BusinessState,
    reason: ReasonCode,
    raw_reason: str | None = None,
    raw_message: str | None = None,
    *,
    source: Source,
    attempt: int | None = None,
    detail: Mapping[str, Any] | None = None,
    message: str | None = None,
    now: datetime | None = None,
) -> Transition | None:
    """Move the job to (state, reason); return the new history row, or None if nothing changed.

    A history row is written only when (state, reason) changes, so replaying an
    observation writes nothing; the raw reason and message (and the plain
    `message`) are still refreshed on the job, as the latest word from
    Kubernetes. Moves the state machine forbids raise `IllegalTransition`, and
    any change to a finished job raises `TerminalStateError` (a replay of its
    final (state, reason) is a no-op).
    """
    return apply_locked_business_change(
        session,
        lock_job(session, job_id),
        state,
        reason,
        raw_reason,
        raw_message,
        source=source,
        attempt=attempt,
        detail=detail,
        message=message,
        now=now,
    )


def apply_locked_business_change(
    session: Session,
    job: Job,
    state: BusinessState,
    reason: ReasonCode,
    raw_reason: str | None = None,
    raw_message: str | None = None,
    *,
    source: Source,
    attempt: int | None = None,
    detail: Mapping[str, Any] | None = None,
    message: str | None = None,
    now: datetime | None = None,
    entered: Mapping[str, datetime] | None = None,
) -> Transition | None:
    """`apply_business_change` for a job whose row the caller holds already, such as one
    of a batch read by `lock_jobs`. `entered`: `state_entered` of that batch, read once
    for all of it rather than here for each job that changes state."""
    now = _now(now)
    job_id = job.id
    current = (job.business_state, job.reason)
    target = (state, reason)
    refused = transitions.refusal(job_id, current, target)
    if refused is not None:
        raise refused
    if current == target:
        stored = {key: getattr(job, key) for key in ("reason_message", "raw_reason", "raw_message")}
        word = transitions.latest_word(
            stored, message=message, raw_reason=raw_reason, raw_message=raw_message
        )
        _set(job, now, word)
        return None
    if state != job.business_state:
        if entered is None:
            entered = state_entered(session, [job_id])
        note_state_durations(session, [(job_id, job.business_state, job.created_at)], now, entered)
    values = transitions.moved(
        target,
        message=message,
        raw_reason=raw_reason,
        raw_message=raw_message,
        cancel_requested=job.cancel_requested,
        k8s_job_name=job.k8s_job_name,
        now=now,
    )
    _set(job, now, values)
    row = Transition(
        **transitions.business_row(
            job_id,
            current,
            target,
            source=source,
            raw_reason=raw_reason,
            raw_message=raw_message,
            attempt=attempt,
            detail=detail,
            now=now,
        )
    )
    session.add(row)
    note_business_rows(session, [row])  # the webhooks' outbox, when the transaction commits
    return row


def _set(job: Job, now: datetime, values: Mapping[str, Any]) -> None:
    """Set the changed columns on the job (and `updated_at`, if any)."""
    for key, value in values.items():
        setattr(job, key, value)
    if values:
        job.updated_at = now


def request_cancel(
    session: Session, project: str, job_id: str, *, now: datetime | None = None
) -> Job | None:
    """Flag the job for cancellation (idempotent); None if it is not in the project.

    The flag is what the API promises; the control loop deletes the Kubernetes
    Job and then records `CANCELLED`. A finished job is returned unchanged.
    """
    try:
        job = lock_job(session, job_id, project)
    except JobNotFound:
        return None
    if job.business_state not in TERMINAL and not job.cancel_requested:
        _flag_cancel(job, _now(now))
    return job


def cancel_stalled_job(
    session: Session, job_id: str, *, message: str, now: datetime | None = None
) -> bool:
    """Cancel a job the syncer found NO_PROGRESS past its spec.cancelAfterStall (or
    LOSS_NOT_FINITE with spec.cancelOnNonFiniteLoss), as a
    user's cancel does: the flag, then `CANCELLED` (the dispatcher deletes the
    Kubernetes Job). Nothing happens to a job no longer NO_PROGRESS (a step came since
    the syncer read it) or already being cancelled. True if it was cancelled."""
    now = _now(now)
    job = lock_job(session, job_id)
    if job.reason not in (ReasonCode.NO_PROGRESS, ReasonCode.LOSS_NOT_FINITE) or (
        job.cancel_requested
    ):
        return False
    _flag_cancel(job, now)
    apply_locked_business_change(
        session,
        job,
        BusinessState.CANCELLED,
        ReasonCode.CANCELLED,
        source=Source.SYNCER,
        detail={"message": message},  # the history row says why, not only the job
        message=message,
        now=now,
    )
    return True


def _flag_cancel(job: Job, now: datetime) -> None:
    job.cancel_requested = True
    job.updated_at = now
    if job.k8s_job_name is not None:
        # Back into the outbox: the dispatcher deletes the Kubernetes Job.
        job.next_dispatch_at = now
