"""The dispatcher against the testbed's API server and a real database (SQLite and
PostgreSQL): each claimed job of a round ends in its own state, and the round's
database work is the same two transactions however many jobs it holds; through a
backlog, each call's slot is refilled as it ends, and the claims and the writes go on
beside the calls, a failed one losing nothing."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.batch_v1 import Job as K8sJob
from lightkube.resources.core_v1 import Secret
from sqlalchemy import event
from sqlalchemy import exc as sa_exc

from kubetrain.cluster.client import creating_client, load_config, typed_client
from kubetrain.control import dispatcher as dispatcher_module
from kubetrain.control.dispatcher import Dispatcher
from kubetrain.domain.manifest import (
    ANNOTATION_SPEC_DIGEST,
    LABEL_JOB_ID,
    RenderOptions,
    job_name,
    render_job,
)
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
    config = load_config(testbed.kubeconfig)
    client, http = typed_client(config), creating_client(config)
    try:
        yield Dispatcher(
            db,
            client,
            http=http,
            render_options=OPTIONS,
            on_dispatched=dispatched.append if dispatched is not None else None,
        )
    finally:
        await client.close()
        await http.aclose()


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
        if job_id != crashed:  # (its Job is the test's own)
            # The submission's digest as the store keeps it, not computed again per create
            # (here the tests' stand-in, which no computation would give).
            assert k8s_job.metadata.annotations[ANNOTATION_SPEC_DIGEST] == job.spec_digest
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


def test_a_flow_refills_each_slot_as_its_call_ends_and_claims_and_writes_meanwhile(
    db: Database, testbed: Testbed, kube: Client, namespace: str, monkeypatch
) -> None:
    jobs = [submit(db, namespace, f"flow-{i}") for i in range(7)]
    slow = set(jobs[:2])  # of the first claim's three, two answer late
    claim, create_, record = Dispatcher._claim, Dispatcher._create, Dispatcher._record
    seen: list[str] = []
    in_flight: set[str] = set()
    most = 0

    def claiming(self: Dispatcher, limit: int) -> Any:
        taken = claim(self, limit)
        seen.append(f"claim of {taken[0]} with {len(in_flight)} in flight")
        return taken

    def recording(self: Dispatcher, outcomes: Any) -> None:
        seen.append(f"record with {len(in_flight)} in flight")
        record(self, outcomes)

    async def creating(self: Dispatcher, job: Any) -> Any:
        nonlocal most
        seen.append(f"create with {len(in_flight)} in flight")
        in_flight.add(job.job_id)
        most = max(most, len(in_flight))
        try:
            await asyncio.sleep(1.5 if job.job_id in slow else 0.1)
            return await create_(self, job)
        finally:
            in_flight.discard(job.job_id)

    monkeypatch.setattr(Dispatcher, "_claim", claiming)
    monkeypatch.setattr(Dispatcher, "_record", recording)
    monkeypatch.setattr(Dispatcher, "_create", creating)
    dispatched: list[str] = []

    async def run() -> bool:
        async with dispatcher_on(db, testbed, dispatched) as dispatcher:
            return await dispatcher._flow(3)

    assert asyncio.run(run()) is False  # ended on a claim that was not full
    assert most == 3  # never more calls in flight than the limit
    # The first claim's fast job ended while its two slow ones went on: its slot was
    # refilled at once, where a round would have waited for the slow ones.
    creates = [line for line in seen if line.startswith("create")]
    assert creates[:4] == [f"create with {n} in flight" for n in (0, 1, 2, 2)]
    # The next claims and the records were made while calls were in flight.
    assert any(
        line.startswith("claim of 3 with") and not line.endswith(" 0 in flight")
        for line in seen[4:]
    )
    assert any(
        line.startswith("record with") and not line.endswith(" 0 in flight") for line in seen
    )
    assert sorted(dispatched) == sorted(jobs)  # each once
    for job_id in jobs:
        assert stored(db, job_id).business_state == BusinessState.QUEUED
        assert get(kube, K8sJob, job_name(job_id), namespace) is not None


def test_a_record_that_fails_in_a_flow_is_written_with_the_next(
    db: Database, testbed: Testbed, kube: Client, namespace: str, monkeypatch
) -> None:
    jobs = [submit(db, namespace, f"unwritten-{i}") for i in range(4)]
    written = first_record_fails(monkeypatch)  # while other calls are in flight
    create_ = Dispatcher._create

    async def one_by_one(self: Dispatcher, job: Any) -> Any:
        await asyncio.sleep(0.2 * jobs.index(job.job_id))  # each ends on its own
        return await create_(self, job)

    monkeypatch.setattr(Dispatcher, "_create", one_by_one)
    dispatched: list[str] = []

    async def run() -> Dispatcher:
        async with dispatcher_on(db, testbed, dispatched) as dispatcher:
            await dispatcher._flow(4)  # the last write succeeded: nothing raised
            return dispatcher

    dispatcher = asyncio.run(run())
    assert len(written) >= 2
    assert written[1] > 1  # the failed one's outcome with the next's
    assert sum(written[1:]) == 4  # after the failure, each outcome written once
    assert sorted(dispatched) == sorted(jobs)  # each once
    assert dispatcher.created == 4  # written, none created again
    for job_id in jobs:
        job = stored(db, job_id)
        assert (job.business_state, job.k8s_job_name) == (BusinessState.QUEUED, job_name(job_id))


def test_a_claim_the_database_fails_ends_the_flow_once_the_calls_made_are_written(
    db: Database, testbed: Testbed, kube: Client, namespace: str, monkeypatch
) -> None:
    jobs = [submit(db, namespace, f"claimed-{i}") for i in range(3)]
    later = submit(db, namespace, "later")  # due, but its claim fails
    claim = Dispatcher._claim
    claims = 0

    def second_fails(self: Dispatcher, limit: int) -> Any:
        nonlocal claims
        claims += 1
        if claims == 2:
            raise sa_exc.OperationalError("SELECT", {}, Exception("server closed the connection"))
        return claim(self, limit)

    monkeypatch.setattr(Dispatcher, "_claim", second_fails)
    dispatched: list[str] = []

    async def run() -> None:
        async with dispatcher_on(db, testbed, dispatched) as dispatcher:
            with pytest.raises(sa_exc.OperationalError):
                await dispatcher._flow(3)
            assert sorted(dispatched) == sorted(jobs)  # the first claim's, written
            await dispatcher._flow(3)  # the database answers again: the rest

    asyncio.run(run())
    for job_id in [*jobs, later]:
        assert stored(db, job_id).business_state == BusinessState.QUEUED
    assert dispatched[-1] == later


def test_a_flow_is_behind_after_full_claims_in_a_row_and_caught_up_after(
    db: Database, testbed: Testbed, namespace: str, monkeypatch
) -> None:
    monkeypatch.setattr(dispatcher_module, "BACKLOG_CLAIMS", 2)  # at a limit of 2: 4 jobs
    jobs = [submit(db, namespace, f"backlog-{i}") for i in range(5)]  # claims of 2, 2, 1
    claim, create_ = Dispatcher._claim, Dispatcher._create
    claims: list[list[str]] = []
    met: dict[str, bool] = {}  # job id -> caught up as its call started

    def claiming(self: Dispatcher, limit: int) -> Any:
        taken = claim(self, limit)
        claims.append([prepared.job_id for prepared in taken[1]])
        return taken

    async def creating(self: Dispatcher, job: Any) -> Any:
        met[job.job_id] = self.caught_up.is_set()  # what a syncer's round would meet
        return await create_(self, job)

    monkeypatch.setattr(Dispatcher, "_claim", claiming)
    monkeypatch.setattr(Dispatcher, "_create", creating)

    async def run() -> bool:
        async with dispatcher_on(db, testbed) as dispatcher:
            assert dispatcher.caught_up.is_set()  # nothing claimed yet
            await dispatcher._flow(2)
            return dispatcher.caught_up.is_set()

    assert asyncio.run(run())  # the flow ended: caught up
    assert [len(c) for c in claims] == [2, 2, 1]
    first, second, last = claims
    assert all(met[job_id] for job_id in first)  # one full claim is no backlog
    assert not met[second[0]]  # the second full claim in a row: behind, the syncer waits
    assert met[last[0]]  # a claim that is not full: caught up
    for job_id in jobs:
        assert stored(db, job_id).business_state == BusinessState.QUEUED
