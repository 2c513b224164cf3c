"""The control loops on the testbed, below the API: the dispatcher creates the
Jobs of stored records and the syncer brings what Kubernetes says back as the
business state, the attempts and the history."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Namespace, Pod

from kubetrain.cluster.client import load_config
from kubetrain.control.runner import ControlLoops
from kubetrain.domain.spec import parse_training_job, spec_digest
from kubetrain.domain.states import BusinessState, ReasonCode
from kubetrain.store import (
    Database,
    get_job_any_project,
    job_history,
    list_attempts,
    submit_job,
)
from kubetrain.testbed.cluster import Testbed
from tests.kube import eventually, get

pytestmark = pytest.mark.testbed


@pytest.fixture(scope="module")
def loops(testbed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlLoops]:
    db = Database(f"sqlite:///{tmp_path_factory.mktemp('control') / 'kubetrain.db'}")
    db.upgrade()
    control = ControlLoops(
        db, load_config(testbed.kubeconfig), leader_elect=False, resync_interval=5
    )
    loop = asyncio.new_event_loop()
    task = loop.create_task(control.run())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield control
    loop.call_soon_threadsafe(task.cancel)
    time.sleep(0.2)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    db.dispose()


def submit(control: ControlLoops, project: str, name: str, **spec: Any) -> str:
    body = {
        "apiVersion": "kubetrain.io/v1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "project": project},
        "spec": {
            "image": "registry.example/trainer:2026-08",
            "resources": {"requests": {"cpu": "2", "memory": "8Gi"}},
            **spec,
        },
    }
    job = parse_training_job(body)
    with control.db.transaction() as session:
        job_id = submit_job(
            session,
            project=project,
            name=name,
            owner="tests",
            namespace=project,
            spec=job.model_dump(mode="json"),
            digest=spec_digest(job),
        ).job.id
    control.notify()
    return job_id


def wait_state(
    control: ControlLoops,
    job_id: str,
    state: BusinessState,
    reason: ReasonCode,
    timeout: float = 60,
) -> Any:
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        with control.db.read_only() as session:
            job = get_job_any_project(session, job_id)
            seen = (job.business_state, job.reason, job.raw_reason)
            if (job.business_state, job.reason) == (state, reason):
                session.expunge(job)
                return job
        time.sleep(0.2)
    pytest.fail(f"job never reached {state}/{reason}; last seen {seen}")


def history(control: ControlLoops, job: Any) -> list[tuple[str, str]]:
    with control.db.read_only() as session:
        return [
            (str(t.to_state), str(t.to_reason))
            for t in job_history(session, job.project, job.id, kind="business")
        ]


def test_a_fitting_job_runs_to_success(loops: ControlLoops):
    project = f"ctl-{uuid.uuid4().hex[:6]}"
    job_id = submit(loops, project, "fits")
    job = wait_state(loops, job_id, BusinessState.SUCCEEDED, ReasonCode.COMPLETED)
    path = history(loops, job)
    assert path[0] == ("CREATED", "JOB_NOT_CREATED")
    assert path[-1] == ("SUCCEEDED", "COMPLETED")
    assert ("RUNNING", "TRAINING") in path
    with loops.db.read_only() as session:
        (attempt,) = list_attempts(session, job_id)
        assert attempt.node
        assert (attempt.exit_code, attempt.number) == (0, 1)


def test_sixteen_gpus_wait_with_the_schedulers_message(loops: ControlLoops):
    project = f"ctl-{uuid.uuid4().hex[:6]}"
    job_id = submit(
        loops, project, "big", resources={"requests": {"cpu": "2", "memory": "8Gi"}, "gpus": 16}
    )
    job = wait_state(loops, job_id, BusinessState.QUEUED, ReasonCode.INSUFFICIENT_GPU)
    assert job.raw_reason == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in job.raw_message
    assert job.diagnosis["waitable"] is False


def test_history_has_no_duplicate_rows(loops: ControlLoops):
    project = f"ctl-{uuid.uuid4().hex[:6]}"
    job_id = submit(loops, project, "steady")
    job = wait_state(loops, job_id, BusinessState.SUCCEEDED, ReasonCode.COMPLETED)
    path = history(loops, job)
    # A full resync passes, and the finished job is marked again as a watch event of it
    # would mark it: the syncer finds it finished and reads it no more (syncs of other
    # tests' jobs may go on meanwhile). Neither writes a row.
    syncer = loops.syncer
    assert syncer is not None
    resyncs, ended = syncer.stats.resyncs, syncer.stats.ended
    loops.reported(job_id)
    eventually(
        lambda: syncer.stats.resyncs > resyncs and syncer.stats.ended > ended,
        30,
        what="a resync, and the finished job marked and found finished",
    )
    assert history(loops, job) == path
    assert all(a != b for a, b in itertools.pairwise(path))
    assert path == history(loops, job)


def test_a_dispatched_pod_is_locked_down_in_a_namespace_with_pod_security_levels(
    loops: ControlLoops, kube: Client
):
    project = f"ctl-{uuid.uuid4().hex[:6]}"
    job_id = submit(loops, project, "locked")
    pods = eventually(
        lambda: list(kube.list(Pod, namespace=project, labels={"kubetrain.io/job-id": job_id})),
        what="the job's Pod",
    )
    # As the API server stored it, so admitted under the namespace's enforced level.
    context = pods[0].spec.containers[0].securityContext
    assert context.allowPrivilegeEscalation is False
    assert context.capabilities.drop == ["ALL"]
    assert context.seccompProfile.type == "RuntimeDefault"
    labels = get(kube, Namespace, project).metadata.labels
    assert labels["pod-security.kubernetes.io/enforce"] == "baseline"
    assert labels["pod-security.kubernetes.io/warn"] == "restricted"
