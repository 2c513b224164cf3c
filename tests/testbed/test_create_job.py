"""`create_job` against the testbed's API server: the Job made as bytes through our own
connections (cluster/wire.py), or httpx's where a proxy is in the way, is the one the
server keeps (its uid, kubetrain as its field manager), made again it is found as ours,
and a refusal reads as the typed client's refusal read before (code, reason, message and
the refused fields). The connections outlive an API server restarted under them, and a
token file rotated after a 401 is read again."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any, cast

import pytest
from lightkube import ApiError, Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import PolicyRule, RoleRef, Subject
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import ServiceAccount
from lightkube.resources.rbac_authorization_v1 import Role, RoleBinding

from kubetrain.cluster import client as client_module
from kubetrain.cluster.client import creating_client, load_config, typed_client
from kubetrain.cluster.errors import ClusterError, ClusterRefused, JobConflictError, wrap
from kubetrain.cluster.jobs import create_job
from kubetrain.domain.manifest import RenderOptions, render_job
from kubetrain.domain.spec import parse_training_job
from kubetrain.testbed.cluster import Testbed
from tests.api.builders import training_job
from tests.kube import account_kubeconfig, account_token, create, eventually, get

pytestmark = pytest.mark.testbed


def manifest(namespace: str, job_id: str = "create-1") -> dict[str, Any]:
    job = parse_training_job(training_job("made"), project="p")
    rendered = render_job(job_id, job, namespace, dataset=None, options=RenderOptions())
    rendered["spec"]["suspend"] = True  # the Job alone: no Pods to wait for
    return rendered


@pytest.fixture(params=["wire", "httpx"])
def through(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which client makes the creates: ours, or httpx's (as where a proxy is named for
    the server, `_httpx_only`)."""
    if request.param == "httpx":
        monkeypatch.setattr(client_module, "_httpx_only", lambda config: True)
    return str(request.param)


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
    testbed: Testbed, kube: Client, namespace: str, through: str
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
    testbed: Testbed, kube: Client, namespace: str, through: str
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
def test_a_refusal_reads_as_the_typed_clients(
    testbed: Testbed, namespace: str, spoil: Any, through: str
) -> None:
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


def test_creates_go_on_through_an_api_server_restarted_under_the_kept_connections(
    testbed: Testbed, kube: Client, namespace: str
) -> None:
    """A connection kept from before the restart is closed; the next create makes a new
    one. While the API server is down a create fails as unreachable, not refused. (The
    test ends once the Job controller has seen the Job made after: the controllers of
    this worker's testbed watch the restarted API server again for the tests after.)"""

    async def go() -> tuple[str | None, ClusterError, str | None]:
        config = load_config(testbed.kubeconfig)
        client, http, other = typed_client(config), creating_client(config), None
        try:
            first = await create_job(http, client, manifest(namespace, "before"))
            await asyncio.to_thread(testbed.stop_component, "kube-apiserver")
            try:
                # On connections of its own: `http`'s kept one is for the create after.
                other = creating_client(config)
                with pytest.raises(ClusterError) as down:
                    await create_job(other, client, manifest(namespace, "during"))
            finally:
                await asyncio.to_thread(testbed.start_component, "kube-apiserver")
            after = await create_job(http, client, manifest(namespace, "after"))
            return first, down.value, after
        finally:
            for each in (http, other):
                if each is not None:
                    await each.aclose()
            await client.close()

    first, down, after = asyncio.run(go())
    assert first
    assert after
    assert first != after
    assert down.unreachable
    assert not isinstance(down, ClusterRefused)
    name = manifest(namespace, "after")["metadata"]["name"]
    eventually(
        lambda: any(
            c.type == "Suspended" and c.status == "True"
            for c in (get(kube, Job, name, namespace).status.conditions or [])
        ),
        120,
        what="the Job controller to mark the Job made after the restart Suspended",
    )


def test_a_token_file_rotated_after_a_401_is_read_again(
    testbed: Testbed, kube: Client, namespace: str, tmp_path: Path
) -> None:
    """As the kubelet rotates a Pod's projected token: a create with a token the API
    server does not know is refused (401, in its words); once the file holds a valid
    token, the next create reads it again after its 401 and is made."""
    account = "creator"
    kube.create(ServiceAccount(metadata=ObjectMeta(name=account)), namespace=namespace)
    rule = PolicyRule(apiGroups=["batch"], resources=["jobs"], verbs=["create"])
    kube.create(Role(metadata=ObjectMeta(name=account), rules=[rule]), namespace=namespace)
    kube.create(
        RoleBinding(
            metadata=ObjectMeta(name=account),
            roleRef=RoleRef(apiGroup="rbac.authorization.k8s.io", kind="Role", name=account),
            subjects=[Subject(kind="ServiceAccount", name=account, namespace=namespace)],
        ),
        namespace=namespace,
    )
    token = account_token(kube, namespace, account, seconds=600)
    token_file = tmp_path / "token"
    token_file.write_text("not-a-token-the-api-server-issued")
    kubeconfig = account_kubeconfig(
        testbed, account, {"tokenFile": str(token_file)}, tmp_path / "kubeconfig"
    )

    async def go() -> tuple[ClusterRefused, str | None]:
        admin = typed_client(load_config(testbed.kubeconfig))  # for a 409 only: none here
        http = creating_client(load_config(kubeconfig))
        try:
            with pytest.raises(ClusterRefused) as unknown:
                await create_job(http, admin, manifest(namespace, "unknown-token"))
            token_file.write_text(token)
            return unknown.value, await create_job(http, admin, manifest(namespace, "rotated"))
        finally:
            await http.aclose()
            await admin.close()

    unknown, uid = asyncio.run(go())
    assert (unknown.code, unknown.reason) == (401, "Unauthorized")
    made = get(kube, Job, manifest(namespace, "rotated")["metadata"]["name"], namespace)
    assert made is not None
    assert uid == made.metadata.uid
