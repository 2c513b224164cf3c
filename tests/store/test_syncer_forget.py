"""A finished job's objects that the watches deliver after the syncer forgot it (a late
Event, a last change of its Job) are let go when the job is marked by them, not kept for
the server's life: the syncer reads no finished job again."""

from __future__ import annotations

import asyncio

import pytest

from kubetrain.cluster.cache import ClusterCache
from kubetrain.control.syncer import Syncer
from kubetrain.domain.states import BusinessState
from kubetrain.store import Database
from tests.store.builders import new_job
from tests.unit.test_cache import feed

pytestmark = pytest.mark.db

PROJECT = "fixture-succeeded-8c4f"  # the dump's namespace


def test_a_finished_jobs_objects_that_came_late_are_let_go(db: Database) -> None:
    with db.transaction() as session:
        job = new_job(session, name="succeeded", project=PROJECT, state=BusinessState.SUCCEEDED)
        job.k8s_job_name = "kt-succeeded"
        job_id = job.id
    cache = ClusterCache(http=None)
    syncer = Syncer(db, cache, resync_interval=3600)
    # Recorded and forgotten already; then its Job, Pod and Events arrive (again).
    feed(cache, "succeeded", job_id)
    assert cache.job(PROJECT, "kt-succeeded") is not None
    assert cache.snapshot([job_id]).events
    assert job_id in syncer.dirty  # the watches' deliveries marked it

    assert asyncio.run(syncer.sync_batch({job_id: 0.0})) == []
    assert cache.job(PROJECT, "kt-succeeded") is None
    assert not cache.snapshot([job_id]).events
    assert not cache.snapshot([job_id]).pods
