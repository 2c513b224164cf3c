"""The syncer's writes for a whole batch of jobs: one transaction, a few statements.

Through the ORM, one job at a time, a locked read per call and a flush per row
cost ~15 ms a job on SQLite with 520 nodes' worth of jobs, all on the single
writer the API needs for submissions. Here the rows of a batch are read at once
(locked, on PostgreSQL, in id order so that two batches cannot deadlock), what
changed is worked out by the rules of transitions.py (the ones the one-job path
of jobs.py applies), and only the changes are written with executemany: a
replayed observation writes nothing at all.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from datetime import datetime
from typing import Any

import msgspec
from sqlalchemy import (
    Dialect,
    Insert,
    RowMapping,
    Select,
    Table,
    Update,
    bindparam,
    insert,
    select,
    update,
)
from sqlalchemy.orm import Session

from kubetrain.domain.diagnosis.result import GangRestart
from kubetrain.domain.spec import duration_seconds
from kubetrain.domain.states import TERMINAL, BusinessState, ReasonCode
from kubetrain.store import transitions
from kubetrain.store._driver import Compiled, compile_for, execute_many, wrap_errors
from kubetrain.store.errors import IllegalTransition
from kubetrain.store.in_lists import IDS, in_chunks
from kubetrain.store.jobs import state_entered
from kubetrain.store.metrics import note_state_durations
from kubetrain.store.models import Attempt, Job, Source, Transition, TransitionKind
from kubetrain.store.transitions import OBSERVED, PodObservation
from kubetrain.store.webhooks import enqueue_deliveries, webhooks_of

# What a plan is worked out from: the jobs' rows by id, and their attempts' rows by job
# id and Pod uid.
_Read = tuple[dict[str, dict[str, Any]], dict[str, dict[str, dict[str, Any]]]]


@dataclass(frozen=True, slots=True)
class SyncedJob:
    """Everything the syncer concluded about one job in one pass (the whole truth)."""

    job_id: str
    pods: Sequence[PodObservation]  # oldest first: new Pods get the next attempt numbers
    state: BusinessState
    reason: ReasonCode
    raw_reason: str | None
    raw_message: str | None
    message: str | None
    attempt: int | None
    detail: Mapping[str, Any] | None
    diagnosis: Mapping[str, Any]
    restart: GangRestart | None = None  # a gang's next attempt: the dispatcher's to make


@dataclass(frozen=True, slots=True)
class SyncResult:
    """What `record_synced` did for one job."""

    changed: bool  # a business history row was written
    refused: IllegalTransition | None = None  # the move the state machine refused, if any
    missing: bool = False  # no such job: nothing written


@dataclass
class SyncPlan:
    """The rows a batch of syncs would write, worked out from what the database holds."""

    results: dict[str, SyncResult]
    new_attempts: list[dict[str, Any]]
    changed_attempts: list[dict[str, Any]]
    history: list[dict[str, Any]]
    job_updates: list[dict[str, Any]]
    leaving: list[tuple[str, BusinessState, datetime]]  # (job id, state it leaves, created)
    now: datetime
    read: _Read  # what the plan was worked out from

    @property
    def empty(self) -> bool:
        """Nothing to write: every job of the batch is recorded as observed already."""
        return not (self.new_attempts or self.changed_attempts or self.history or self.job_updates)

    def write(self, session: Session) -> None:
        """Write the plan in the caller's transaction (one made with `lock=True`)."""
        if self.leaving:
            entered = state_entered(session, [job_id for job_id, _, _ in self.leaving])
            note_state_durations(session, self.leaving, self.now, entered)
        # On the driver's cursor, compiled once for each set of columns (store/_driver.py):
        # the attempts' and the jobs' rows, and the history unless a webhook needs its
        # rows' ids. Through `Session.execute` the ORM's bulk paths wrapped each, and an
        # executemany through SQLAlchemy builds each row's parameters in Python: most of
        # the syncer's CPU in the database (docs/benchmarks.md).
        connection = session.connection()
        driven = [
            (table, group)
            for table, rows in (
                (_ATTEMPTS, self.new_attempts),
                (_ATTEMPTS, self.changed_attempts),
                (_JOBS, self.job_updates),
            )
            for group in _same_keys(rows)
        ]
        # The history in list order, so that each job's rows keep their order.
        business = {row["job_id"] for row in self.history if row["kind"] == _BUSINESS}
        hooks = webhooks_of(session, business)
        if hooks:
            # The outbox needs the business rows' ids: SQLAlchemy's INSERT ... RETURNING
            # in parameter order (on SQLite, one statement per row).
            written = connection.execute(_HISTORY_INSERT, self.history)
            ids = [(row.id, row.job_id) for row in written if row.kind == _BUSINESS]
            enqueue_deliveries(session, ids, hooks)
        else:
            driven += [(_HISTORY, run) for run in _runs(self.history)]
        if not driven:
            return
        pooled = connection.connection
        with wrap_errors(connection.engine, pooled):
            cursor = pooled.cursor()
            try:
                for table, rows in driven:
                    statement = _statement(connection.dialect, table, tuple(rows[0]))
                    execute_many(cursor, statement, _keyed(rows))
            finally:
                cursor.close()


_ATTEMPTS: Table = Attempt.__table__  # type: ignore[assignment]  # a Table, typed FromClause
_JOBS: Table = Job.__table__  # type: ignore[assignment]
_HISTORY: Table = Transition.__table__  # type: ignore[assignment]
_BUSINESS = TransitionKind.BUSINESS
# `render_nulls`: a None is written as NULL rather than its column left out, so that
# every row has the same columns and a batch is one statement. Left out, each run of
# rows with other columns was a statement of its own, and the history's rows
# (RETURNING) one statement each, their results spliced one by one: CPU quadratic in
# the batch (docs/benchmarks.md).
_HISTORY_INSERT = (
    insert(_HISTORY)
    .returning(_HISTORY.c.id, _HISTORY.c.job_id, _HISTORY.c.kind, sort_by_parameter_order=True)
    .execution_options(render_nulls=True)
)
_COMPILED: dict[tuple[str, str, tuple[str, ...]], Compiled] = {}


def _statement(dialect: Dialect, table: Table, columns: tuple[str, ...]) -> Compiled:
    """For rows of these columns (`_keyed`'s names): an UPDATE by id if they hold the id
    (an attempt's or a job's changes), else an INSERT (new attempts, history rows).
    Compiled once."""
    key = (dialect.name, table.name, columns)
    compiled = _COMPILED.get(key)
    if compiled is None:
        values = {
            name: bindparam(f"{name}_", type_=table.c[name].type)
            for name in columns
            if name != "id"
        }
        if "id" in columns:
            by_id = table.c.id == bindparam("id_", type_=table.c.id.type)
            statement: Insert | Update = update(table).where(by_id).values(values)
        else:
            statement = insert(table).values(values)
        compiled = _COMPILED[key] = compile_for(statement, dialect)
    return compiled


def _runs(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """`rows` in runs of the same columns, in their order (in practice one run: every
    history row has every column, a None where it has no value)."""
    runs: list[list[dict[str, Any]]] = []
    for row in rows:
        if runs and runs[-1][0].keys() == row.keys():
            runs[-1].append(row)
        else:
            runs.append([row])
    return runs


def _keyed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # A bind may not bear the name of the column it sets.
    return [{f"{name}_": value for name, value in row.items()} for row in rows]


def record_synced(
    session: Session, batch: Collection[SyncedJob], *, now: datetime
) -> dict[str, SyncResult]:
    """Record a batch of syncs in the caller's transaction; one result per job id."""
    plan = plan_synced(session, batch, now=now)
    plan.write(session)
    return plan.results


def record_planned(
    session: Session, batch: Collection[SyncedJob], plan: SyncPlan
) -> dict[str, SyncResult]:
    """`record_synced` for a batch already planned by a read (`lock=False`): the rows are
    read again under the lock and, where nothing changed since, the plan is written as
    it is rather than worked out again (most of a plan's CPU); else it is planned anew."""
    ids = sorted(job.job_id for job in batch)
    read = _read(session, ids, lock=True)
    if read != plan.read:
        plan = plan_synced(session, batch, now=plan.now, read=read)
    plan.write(session)
    return plan.results


def plan_synced(
    session: Session,
    batch: Collection[SyncedJob],
    *,
    now: datetime,
    lock: bool = True,
    read: _Read | None = None,
) -> SyncPlan:
    """What recording a batch of syncs would write. With `lock`, the jobs' rows are held
    (PostgreSQL) until the caller's transaction ends, so the plan stays true until
    written; without, it is a read (a read-only transaction may take no lock) that
    tells whether a write transaction is needed at all: a replay needs none.

    A refused move (`IllegalTransition`, or `TerminalStateError` for a job
    that finished meanwhile) writes no business change but still records the
    Pods and the diagnosis, as the one-job path did; runtime state is kept even
    after a job finished, since a Pod's last details can trail the verdict.
    """
    by_id = {synced.job_id: synced for synced in batch}
    ids = sorted(by_id)
    if read is None:
        read = _read(session, ids, lock=lock)
    jobs, attempts = read
    results: dict[str, SyncResult] = {}
    new_attempts: list[dict[str, Any]] = []
    changed_attempts: list[dict[str, Any]] = []
    history: list[dict[str, Any]] = []
    job_updates: list[dict[str, Any]] = []
    leaving: list[tuple[str, BusinessState, datetime]] = []
    for job_id in ids:
        synced, job = by_id[job_id], jobs.get(job_id)
        if job is None:
            results[job_id] = SyncResult(changed=False, missing=True)
            continue
        current = (job["business_state"], job["reason"])
        target = (synced.state, synced.reason)
        via = transitions.passage(current, target)
        refused = transitions.refusal(job_id, via or current, target)
        values: dict[str, Any] = {}
        rows: list[dict[str, Any]] = []

        # Runtime state, attempt by attempt.
        own = attempts.get(job_id, {})
        highest = max((a["number"] for a in own.values()), default=0)
        current_attempt = job["current_attempt"]
        for pod in synced.pods:
            stored = transitions.known_attempt(own, pod)
            if stored is not None and not pod.pod_uid:
                pod = replace(pod, pod_uid=stored["pod_uid"])
            observed = {name: getattr(pod, name) for name in OBSERVED}
            if stored is None:
                number = transitions.next_attempt(highest, current_attempt, pod)
                highest = max(highest, number)
                if number > current_attempt:
                    current_attempt = values["current_attempt"] = number
                new_attempts.append(
                    {"job_id": job_id, "number": number, **observed}
                    | {"created_at": now, "updated_at": now}
                )
            else:
                number = stored["number"]
                if any(stored[name] != observed[name] for name in OBSERVED):
                    changed_attempts.append({"id": stored["id"], **observed, "updated_at": now})
            row = transitions.runtime_row(
                job_id, pod, stored, number=number, source=Source.SYNCER, now=now
            )
            if row is not None:
                rows.append(row)

        # A gang's next attempt, once: into the dispatcher's outbox (delete this Job,
        # create the next). A replay of the ended attempt finds it recorded already.
        restart = synced.restart
        if restart is not None and refused is None and restart.attempt > current_attempt:
            values |= transitions.restart_due(restart, now=now)

        # Business state.
        changed = current != target and refused is None
        if changed:
            if synced.state != current[0]:
                leaving.append((job_id, current[0], job["created_at"]))
            values |= transitions.moved(
                target,
                message=synced.message,
                raw_reason=synced.raw_reason,
                raw_message=synced.raw_message,
                cancel_requested=job["cancel_requested"],
                k8s_job_name=job["k8s_job_name"],
                now=now,
            )
            if via is not None:
                rows.append(
                    transitions.business_row(
                        job_id,
                        current,
                        via,
                        source=Source.SYNCER,
                        raw_reason=None,
                        raw_message=None,
                        attempt=None,
                        detail=None,
                        now=now,
                    )
                )
            rows.append(
                transitions.business_row(
                    job_id,
                    via or current,
                    target,
                    source=Source.SYNCER,
                    raw_reason=synced.raw_reason,
                    raw_message=synced.raw_message,
                    attempt=synced.attempt,
                    detail=synced.detail,
                    now=now,
                )
            )
        elif refused is None:
            values |= transitions.latest_word(
                job,
                message=synced.message,
                raw_reason=synced.raw_reason,
                raw_message=synced.raw_message,
            )

        diagnosis = _as_stored(synced.diagnosis)
        if job["diagnosis"] != diagnosis:
            values["diagnosis"] = diagnosis
        if values:
            job_updates.append({"id": job_id, **values, "updated_at": now})
        history.extend(rows)
        results[job_id] = SyncResult(changed=changed, refused=refused)
    return SyncPlan(
        results, new_attempts, changed_attempts, history, job_updates, leaving, now, read
    )


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


def _as_stored(value: Any) -> Any:
    """`value` as the JSON column returns it (tuples as lists, enums as their values), to
    compare with what is stored; msgspec's round trip, ~5x the standard library's."""
    return _decode(_encode(value))


def _same_keys(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    # A bulk UPDATE sets the same columns on every row of one executemany.
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(sorted(row)), []).append(row)
    return list(groups.values())


_JOB_COLUMNS = (
    Job.id,
    Job.business_state,
    Job.reason,
    Job.reason_message,
    Job.raw_reason,
    Job.raw_message,
    Job.current_attempt,
    Job.cancel_requested,
    Job.k8s_job_name,
    Job.diagnosis,
    Job.created_at,
)


# The syncer's reads, built once with an expanding IN (`in_chunks` pads its lists):
# built per call, their expressions and cache keys were ~10 % of the serve process's
# interpreter through a backlog's whole way to Running (docs/benchmarks.md).
_JOBS_READ = select(*_JOB_COLUMNS).where(Job.id.in_(IDS)).order_by(Job.id)
_JOBS_LOCKED = _JOBS_READ.with_for_update()
_ATTEMPTS_READ = select(
    Attempt.id, Attempt.job_id, Attempt.number, *(getattr(Attempt, n) for n in OBSERVED)
).where(Attempt.job_id.in_(IDS))


def _read(session: Session, ids: Sequence[str], *, lock: bool) -> _Read:
    """The batch's job rows (held until the transaction ends, with `lock`) and their
    attempts' rows, read on the session's connection after what the session holds."""
    session.flush()
    jobs = {
        row["id"]: dict(row) for row in _rows(session, _JOBS_LOCKED if lock else _JOBS_READ, ids)
    }
    attempts: dict[str, dict[str, dict[str, Any]]] = {}
    for row in _rows(session, _ATTEMPTS_READ, ids):
        attempts.setdefault(row["job_id"], {})[row["pod_uid"]] = dict(row)
    return jobs, attempts


def _rows(session: Session, query: Select[Any], ids: Sequence[str]) -> Iterator[RowMapping]:
    """`query`'s rows for `ids`, one statement per `in_chunks` list."""
    connection = session.connection()
    for chunk in in_chunks(ids):
        yield from connection.execute(query, {"ids": chunk}).mappings()


@dataclass(frozen=True, slots=True)
class SyncFacts:
    """What the syncer reads of a job's record before diagnosing it."""

    id: str
    name: str
    namespace: str
    k8s_job_name: str | None
    business_state: BusinessState
    cancel_requested: bool
    last_dispatch_error: str | None
    restart_job_uid: str | None  # a gang restart the dispatcher has still to make
    stall_after: int | None = None  # seconds, from spec.stallAfter
    cancel_after_stall: int | None = None  # seconds, from spec.cancelAfterStall
    cancel_on_non_finite_loss: bool = False  # spec.cancelOnNonFiniteLoss


# Durations of the spec the syncer needs: read in the database rather than loading every spec.
_SPEC_DURATIONS = {"stall_after": "stallAfter", "cancel_after_stall": "cancelAfterStall"}


_FACT_NAMES = [
    f.name
    for f in fields(SyncFacts)
    if f.name not in _SPEC_DURATIONS and f.name != "cancel_on_non_finite_loss"
]
_FACTS_READ = select(
    *(getattr(Job, n) for n in _FACT_NAMES),
    *(Job.spec["spec"][key].as_string().label(name) for name, key in _SPEC_DURATIONS.items()),
    Job.spec["spec"]["cancelOnNonFiniteLoss"].as_boolean().label("cancel_on_non_finite_loss"),
).where(Job.id.in_(IDS))


def sync_facts(session: Session, ids: Sequence[str]) -> dict[str, SyncFacts]:
    """The records of `ids` that exist, in one query per `IN_CHUNK` ids (not one per job)."""
    out: dict[str, SyncFacts] = {}
    for row in _rows(session, _FACTS_READ, ids):
        values: dict[str, Any] = {name: row[name] for name in _FACT_NAMES}
        for name in _SPEC_DURATIONS:
            values[name] = duration_seconds(row[name]) if row[name] else None
        values["cancel_on_non_finite_loss"] = bool(row["cancel_on_non_finite_loss"])
        out[row["id"]] = SyncFacts(**values)
    return out


def unfinished_job_ids(session: Session) -> list[str]:
    """Every job not yet terminal, oldest first (`list_unfinished_jobs`' ids, without
    loading each spec and diagnosis): what the syncer's resync marks."""
    query = (
        select(Job.id)
        .where(Job.business_state.not_in(list(TERMINAL)))
        .order_by(Job.created_at, Job.id)
    )
    return list(session.scalars(query))
