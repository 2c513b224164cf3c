"""Dispatcher rounds against the testbed's API server and a real database (SQLite and
PostgreSQL): each claimed job of a round ends in its own state, and the round's
database work is the same two transactions however many jobs it holds."""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.batch_v1 import Job as K8sJob
from lightkube.resources.core_v1 import Secret
from sqlalchemy import event
from sqlalchemy import exc as sa_exc

from kubetrain.cluster.client import load_config, typed_client
from kubetrain.control.dispatcher import Dispatcher
from kubetrain.domain.manifest import LABEL_JOB_ID, RenderOptions, job_name, render_job
from kubetrain.domain.spec import parse_training_job
from kubetrain.domain.states import BusinessState, ReasonCode
from kubetrain.store import (
    Database,
    Source,
    apply_business_change,
    get_job_any_project,
    request_cancel,
    submit_job,
)
from kubetrain.testbed.cluster import Testbed
from tests.kube import create, eventually, get
from tests.pg import backend, db, postgres_server
from tests.store.builders import digest_of

__all__ = ["backend", "db", "postgres_server"]  # fixtures, re-exported for pytest

pytestmark = [pytest.mark.testbed, pytest.mark.db]

PROJECT = "dispatch"
OPTIONS = RenderOptions(status_url="http://127.0.0.1:8000")  # so each Pod gets a reporting token


def body(name: str) -> dict[str, Any]:
    return parse_training_job(
        {
            "apiVersion": "kubetrain.io/v1",
            "kind": "TrainingJob",
            "metadata": {"name": name, "project": PROJECT},
            "spec": {
                "image": "registry.example/trainer:2026-08",
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
            },
        }
    ).model_dump(mode="json")


def submit(db: Database, namespace: str, name: str, spec: dict[str, Any] | None = None) -> str:
    with db.transaction() as session:
        return submit_job(
            session,
            project=PROJECT,
            name=name,
            owner="tests",
            namespace=namespace,
            spec=spec or body(name),
            digest=digest_of(spec or body(name)),
        ).job.id


def cancel(db: Database, job_id: str, *, with_state: bool) -> None:
    """As the API cancels: the flag, and CANCELLED once nothing more is to be created."""
    with db.transaction() as session:
        request_cancel(session, PROJECT, job_id)
        if with_state:
            apply_business_change(
                session, job_id, BusinessState.CANCELLED, ReasonCode.CANCELLED, source=Source.API
            )


@contextmanager
def counting_commits(db: Database) -> Iterator[list[int]]:
    commits: list[int] = []

    def count(conn: Any) -> None:
        commits.append(1)

    event.listen(db.engine, "commit", count)
    try:
        yield commits
    finally:
        event.remove(db.engine, "commit", count)


@asynccontextmanager
async def dispatcher_on(
    db: Database, testbed: Testbed, dispatched: list[str] | None = None
) -> AsyncIterator[Dispatcher]:
    """A Dispatcher on the testbed's API server (its client closed after); the ids of the
    jobs whose Jobs it made go to `dispatched`."""
    client = typed_client(load_config(testbed.kubeconfig))
    try:
        yield Dispatcher(
            db,
            client,
            render_options=OPTIONS,
            on_dispatched=dispatched.append if dispatched is not None else None,
        )
    finally:
        await client.close()


def one_round(db: Database, testbed: Testbed, dispatched: list[str]) -> Dispatcher:
    async def run() -> Dispatcher:
        async with dispatcher_on(db, testbed, dispatched) as dispatcher:
            await dispatcher.dispatch_once()
            return dispatcher

    return asyncio.run(run())


def first_record_fails(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The database goes away after a round's creates, for its record only; returns how
    many outcomes each record was given."""
    record = Dispatcher._record
    written: list[int] = []

    def fails_once(self: Dispatcher, outcomes: Any) -> None:
        written.append(len(outcomes))
        if len(written) == 1:
            raise sa_exc.OperationalError("COMMIT", {}, Exception("server closed the connection"))
        record(self, outcomes)

    monkeypatch.setattr(Dispatcher, "_record", fails_once)
    return written


def stored(db: Database, job_id: str) -> Any:
    with db.read_only() as session:
        job = get_job_any_project(session, job_id)
        assert job is not None
        session.expunge(job)
        return job


def test_a_mixed_round_ends_each_job_in_its_state_in_two_transactions(
    db: Database, testbed: Testbed, kube: Client, namespace: str
) -> None:
    plain = [submit(db, namespace, f"plain-{i}") for i in range(8)]
    cancelled = submit(db, namespace, "cancelled")
    cancel(db, cancelled, with_state=False)  # flagged before the dispatcher got to it
    broken = body("broken")
    broken["spec"]["resources"]["requests"]["cpu"] = "lots"  # a rule changed since submission
    invalid = submit(db, namespace, "invalid", broken)
    taken = submit(db, namespace, "name-taken")
    foreign = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": job_name(taken), "namespace": namespace},
        "spec": {
            "suspend": True,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "registry.example/other:1"}],
                }
            },
        },
    }
    create(kube, foreign)
    # A dispatcher that created this job's Job and was killed before its commit.
    crashed = submit(db, namespace, "crashed")
    spec = parse_training_job(body("crashed"))
    manifest = render_job(crashed, spec, namespace, dataset=None, options=OPTIONS)
    uid_before = create(kube, copy.deepcopy(manifest)).metadata.uid

    dispatched: list[str] = []
    with counting_commits(db) as commits:
        dispatcher = one_round(db, testbed, dispatched)
    assert len(commits) == 2  # the claim with the preparation, the outcomes: not one per job
    made = [*plain, crashed]
    assert sorted(dispatched) == sorted(made)
    assert (dispatcher.created, dispatcher.failures) == (len(made), 1)

    for job_id in made:
        job = stored(db, job_id)
        assert (job.business_state, job.reason) == (BusinessState.QUEUED, ReasonCode.SCHEDULING)
        assert (job.k8s_job_name, job.next_dispatch_at) == (job_name(job_id), None)
        k8s_job = get(kube, K8sJob, job_name(job_id), namespace)
        # The Job is all a job needs: its Pods get their reporting token from the kubelet.
        (volume,) = k8s_job.spec.template.spec.volumes
        assert volume.projected.sources[0].serviceAccountToken.audience == "kubetrain"
        assert list(kube.list(Secret, namespace=namespace, labels={LABEL_JOB_ID: job_id})) == []
    # Created again is found again: the same Job, not a second one.
    assert get(kube, K8sJob, job_name(crashed), namespace).metadata.uid == uid_before

    job = stored(db, cancelled)
    assert (job.business_state, job.reason, job.k8s_job_name) == (
        BusinessState.CANCELLED,
        ReasonCode.CANCELLED,
        None,
    )
    assert get(kube, K8sJob, job_name(cancelled), namespace) is None
    job = stored(db, invalid)
    assert (job.business_state, job.reason, job.raw_reason) == (
        BusinessState.FAILED,
        ReasonCode.JOB_NOT_CREATED,
        "InvalidSpec",
    )
    assert "lots" in job.raw_message
    job = stored(db, taken)
    assert (job.business_state, job.reason, job.raw_reason) == (
        BusinessState.CREATED,
        ReasonCode.JOB_NOT_CREATED,
        "NameConflict",
    )
    assert (job.dispatch_attempts, job.k8s_job_name) == (1, None)
    assert job.next_dispatch_at is not None  # retried after its backoff

    # The next round deletes the Job of a job cancelled after it was made.
    cancel(db, plain[0], with_state=True)
    one_round(db, testbed, dispatched)
    assert stored(db, plain[0]).next_dispatch_at is None
    eventually(
        lambda: get(kube, K8sJob, job_name(plain[0]), namespace) is None,
        what="the cancelled job's Job to go",
    )


def test_outcomes_a_failed_write_could_not_record_are_written_by_the_next_round(
    db: Database, testbed: Testbed, kube: Client, namespace: str, monkeypatch
) -> None:
    job_id = submit(db, namespace, "unrecorded")
    written = first_record_fails(monkeypatch)
    dispatched: list[str] = []

    async def run() -> Dispatcher:
        async with dispatcher_on(db, testbed, dispatched) as dispatcher:
            with pytest.raises(sa_exc.OperationalError):
                await dispatcher.dispatch_once()
            # The Job exists; the record still says CREATED, and its claim holds it for 60 s.
            assert get(kube, K8sJob, job_name(job_id), namespace) is not None
            assert stored(db, job_id).business_state == BusinessState.CREATED
            assert dispatched == []
            await dispatcher.dispatch_once()
            return dispatcher

    dispatcher = asyncio.run(run())
    assert written == [1, 1]
    assert dispatched == [job_id]
    assert dispatcher.created == 1  # written, not created again
    job = stored(db, job_id)
    assert (job.business_state, job.k8s_job_name) == (BusinessState.QUEUED, job_name(job_id))


def test_a_database_failing_in_the_preparation_leaves_no_claim_behind(
    db: Database, testbed: Testbed, kube: Client, namespace: str, monkeypatch
) -> None:
    job_id = submit(db, namespace, "unclaimed")
    prepare = Dispatcher._prepare
    calls: list[int] = []

    def fails_once(self: Dispatcher, session: Any, claimed: Any) -> Any:
        calls.append(len(claimed))
        if len(calls) == 1:  # the database goes away while the round prepares
            raise sa_exc.OperationalError("UPDATE", {}, Exception("server closed the connection"))
        return prepare(self, session, claimed)

    monkeypatch.setattr(Dispatcher, "_prepare", fails_once)

    async def run() -> Dispatcher:
        async with dispatcher_on(db, testbed) as dispatcher:
            with pytest.raises(sa_exc.OperationalError):
                await dispatcher.dispatch_once()
            await dispatcher.dispatch_once()  # at once: no claim holds the job
            return dispatcher

    dispatcher = asyncio.run(run())
    assert calls == [1, 1]
    assert dispatcher.created == 1
    assert stored(db, job_id).business_state == BusinessState.QUEUED


def test_through_a_backlog_the_next_claim_and_the_last_record_overlap_a_rounds_creates(
    db: Database, testbed: Testbed, kube: Client, namespace: str, monkeypatch
) -> None:
    jobs = [submit(db, namespace, f"backlog-{i}") for i in range(7)]
    claim, create_, record = Dispatcher._claim, Dispatcher._create, Dispatcher._record
    seen: list[str] = []
    in_flight = 0

    def claiming(self: Dispatcher, limit: int) -> Any:
        seen.append(f"claim with {in_flight} in flight")
        return claim(self, limit)

    def recording(self: Dispatcher, outcomes: Any) -> None:
        # In its thread: a record that overlaps the next round sees its creates start
        # (written before the next round, it would wait here for nothing).
        waited = time.monotonic() + 1.0
        while not in_flight and time.monotonic() < waited:
            time.sleep(0.01)
        seen.append(f"record of {len(outcomes)} with {in_flight} in flight")
        record(self, outcomes)

    async def creating(self: Dispatcher, job: Any) -> Any:
        nonlocal in_flight
        in_flight += 1
        try:
            await asyncio.sleep(0.3)  # the API server's answer, slowed: the database overlaps
            return await create_(self, job)
        finally:
            in_flight -= 1

    monkeypatch.setattr(Dispatcher, "_claim", claiming)
    monkeypatch.setattr(Dispatcher, "_record", recording)
    monkeypatch.setattr(Dispatcher, "_create", creating)
    dispatched: list[str] = []

    async def run() -> list[bool]:
        async with dispatcher_on(db, testbed, dispatched) as dispatcher:
            rounds = [await dispatcher.dispatch_once(3, overlap=True) for _ in range(3)]
            await dispatcher.dispatch_once(3)  # claims nothing; waits for the last record
            return rounds

    # Rounds of 3, 3 and 1: the first two full, so each took the next one's claim
    # while its own creates waited; the last, not full, took none. Each round's record
    # was written while the next round's creates were in flight (the last's, with none
    # left). A claim and a record in their threads at once come in either order.
    assert asyncio.run(run()) == [True, True, False]
    assert sorted(seen) == sorted(
        [
            "claim with 0 in flight",
            "claim with 3 in flight",
            "record of 3 with 3 in flight",
            "claim with 3 in flight",
            "record of 3 with 1 in flight",
            "record of 1 with 0 in flight",
            "claim with 0 in flight",
        ]
    )
    assert sorted(dispatched) == sorted(jobs)  # each once
    for job_id in jobs:
        assert stored(db, job_id).business_state == BusinessState.QUEUED
        assert get(kube, K8sJob, job_name(job_id), namespace) is not None


def test_an_overlapped_record_that_fails_is_written_with_the_next_rounds(
    db: Database, testbed: Testbed, kube: Client, namespace: str, monkeypatch
) -> None:
    jobs = [submit(db, namespace, f"unwritten-{i}") for i in range(4)]
    written = first_record_fails(monkeypatch)  # while the next round's creates go
    dispatched: list[str] = []

    async def run() -> Dispatcher:
        async with dispatcher_on(db, testbed, dispatched) as dispatcher:
            assert await dispatcher.dispatch_once(2, overlap=True)
            assert await dispatcher.dispatch_once(2, overlap=True)
            # The second round's record writes the first round's outcomes with its own.
            await dispatcher.dispatch_once(2)
            return dispatcher

    dispatcher = asyncio.run(run())
    assert written == [2, 4]
    assert sorted(dispatched) == sorted(jobs)  # each once
    assert dispatcher.created == 4  # written, none created again
    for job_id in jobs:
        job = stored(db, job_id)
        assert (job.business_state, job.k8s_job_name) == (BusinessState.QUEUED, job_name(job_id))
