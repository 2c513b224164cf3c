"""`create_job` against the testbed's API server: the Job made as bytes through the plain
client is the one the server keeps (its uid, kubetrain as its field manager), made again
it is found as ours, and a refusal reads as the typed client's refusal read before
(code, reason, message and the refused fields)."""

from __future__ import annotations

import asyncio
import copy
from typing import Any, cast

import pytest
from lightkube import ApiError, Client
from lightkube.resources.batch_v1 import Job

from kubetrain.cluster.client import creating_client, load_config, typed_client
from kubetrain.cluster.errors import ClusterRefused, JobConflictError, wrap
from kubetrain.cluster.jobs import create_job
from kubetrain.domain.manifest import RenderOptions, render_job
from kubetrain.domain.spec import parse_training_job
from kubetrain.testbed.cluster import Testbed
from tests.api.builders import training_job
from tests.kube import create, get

pytestmark = pytest.mark.testbed


def manifest(namespace: str, job_id: str = "create-1") -> dict[str, Any]:
    job = parse_training_job(training_job("made"), project="p")
    rendered = render_job(job_id, job, namespace, dataset=None, options=RenderOptions())
    rendered["spec"]["suspend"] = True  # the Job alone: no Pods to wait for
    return rendered


def run_create(testbed: Testbed, body: dict[str, Any]) -> str | None:
    async def go() -> str | None:
        config = load_config(testbed.kubeconfig)
        client, http = typed_client(config), creating_client(config)
        try:
            return await create_job(http, client, body)
        finally:
            await http.aclose()
            await client.close()

    return asyncio.run(go())


def typed_refusal(testbed: Testbed, body: dict[str, Any]) -> ClusterRefused:
    """What lightkube's typed create answers the same manifest with, worded by `wrap`."""
    client = Client(config=load_config(testbed.kubeconfig), field_manager="kubetrain")
    with pytest.raises(ApiError) as refused:
        client.create(cast(Job, Job.from_dict(copy.deepcopy(body))))
    error = wrap(refused.value)
    assert isinstance(error, ClusterRefused)
    return error


def test_the_job_made_is_the_servers_and_made_again_is_found_as_ours(
    testbed: Testbed, kube: Client, namespace: str
) -> None:
    body = manifest(namespace)
    uid = run_create(testbed, body)
    made = get(kube, Job, body["metadata"]["name"], namespace)
    assert made is not None
    assert uid == made.metadata.uid
    # The object's own fields are kubetrain's (the Job controller writes only its status).
    assert {f.manager for f in made.metadata.managedFields if not f.subresource} == {"kubetrain"}
    assert made.metadata.labels == body["metadata"]["labels"]
    # A retry after a lost answer: the same Job, not an error.
    assert run_create(testbed, copy.deepcopy(body)) == uid


def test_a_job_of_that_name_not_ours_is_a_conflict(
    testbed: Testbed, kube: Client, namespace: str
) -> None:
    body = manifest(namespace)
    foreign = copy.deepcopy(body)
    # (Labels left empty, the API server would give it the template's, ours among them.)
    foreign["metadata"]["labels"] = {"team": "someone-else"}
    create(kube, foreign)
    with pytest.raises(JobConflictError):
        run_create(testbed, body)


@pytest.mark.parametrize(
    "spoil",
    [
        pytest.param(lambda m: m["spec"].update(parallelism=-1), id="invalid-field"),
        pytest.param(lambda m: m["metadata"].update(namespace="no-such-namespace"), id="no-ns"),
    ],
)
def test_a_refusal_reads_as_the_typed_clients(testbed: Testbed, namespace: str, spoil: Any) -> None:
    body = manifest(namespace, job_id="create-refused")
    spoil(body)
    expected = typed_refusal(testbed, body)
    with pytest.raises(ClusterRefused) as raised:
        run_create(testbed, body)
    got = raised.value
    assert (got.code, got.reason, got.message, got.causes) == (
        expected.code,
        expected.reason,
        expected.message,
        expected.causes,
    )
    assert got.code in (404, 422)
    assert not got.unreachable
