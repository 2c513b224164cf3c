"""GET …/jobs/{id}/logs on a real database, with the cluster side faked at its boundary
(cluster/logs.py's PodLogs): which Pod, the options passed on, and what is said instead of
logs when there are none."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, cast

import pytest
from fastapi.testclient import TestClient

from kubetrain.api import create_app
from kubetrain.api import logs as logs_api
from kubetrain.cluster.errors import ClusterRefused
from kubetrain.cluster.logs import PodLogs
from kubetrain.domain.states import BusinessState, ReasonCode
from kubetrain.settings import ServerSettings
from kubetrain.store import Database, PodObservation
from kubetrain.store.sync import SyncedJob, record_synced
from tests.api.builders import JOBS, OTHER, FakeLogs, Tokens, submitted

pytestmark = pytest.mark.db


@pytest.fixture
def pod_logs() -> FakeLogs:
    return FakeLogs()


@pytest.fixture
def client(settings: ServerSettings, db: Database, pod_logs: FakeLogs) -> Iterator[TestClient]:
    app = create_app(settings, db, pod_logs=cast(PodLogs, pod_logs))
    with TestClient(app) as test_client:
        yield test_client


def pod(name: str, node: str = "gpu-node-1", **fields: Any) -> PodObservation:
    return PodObservation(pod_name=name, pod_uid=f"uid-{name}", node=node, **fields)


def record(db: Database, job_id: str, pods: list[PodObservation], ranks: list[int | None]) -> None:
    diagnosis = {
        "attempts": [{"pod": p.pod_name, "rank": r} for p, r in zip(pods, ranks, strict=True)]
    }
    synced = SyncedJob(
        job_id,
        pods,
        BusinessState.RUNNING,
        ReasonCode.TRAINING,
        None,
        None,
        None,
        1,
        None,
        diagnosis,
    )
    with db.transaction() as session:
        record_synced(session, [synced], now=datetime.now(UTC))


@pytest.fixture
def job(client: TestClient, tokens: Tokens, db: Database, pod_logs: FakeLogs) -> str:
    job_id = submitted(client, tokens)
    record(
        db,
        job_id,
        [
            pod(
                "kt-a",
                pod_phase="Failed",
                termination_message="CUDA error: out of memory",
                exit_code=1,
            ),
            pod("kt-b", pod_phase="Running"),
        ],
        [None, None],
    )
    pod_logs.output["kt-b"] = ["step 1 loss 2.3\n", "step 2 loss 2.1\n"]
    return job_id


def test_the_newest_attempts_log_is_streamed_as_text(
    client: TestClient, tokens: Tokens, job: str, pod_logs: FakeLogs
) -> None:
    answer = client.get(
        f"{JOBS}/{job}/logs",
        params={"tail": 10, "since": "5m", "follow": "true", "timestamps": "true"},
        headers=tokens("viewer"),
    )
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain")
    assert answer.text == "step 1 loss 2.3\nstep 2 loss 2.1\n"
    (asked,) = pod_logs.asked
    assert (asked.pod, asked.container, asked.tail, asked.since_seconds) == (
        "kt-b",
        "trainer",
        10,
        300,
    )
    assert (asked.follow, asked.timestamps, asked.namespace) == (True, True, "ai-training")


def test_a_pod_that_is_gone_is_said_with_its_termination_message(
    client: TestClient, tokens: Tokens, job: str
) -> None:
    answer = client.get(f"{JOBS}/{job}/logs", params={"attempt": 1}, headers=tokens("viewer"))
    assert answer.status_code == 410
    problem = answer.json()
    assert problem["type"] == "urn:kubetrain:problem:pod-gone"
    assert problem["termination_message"] == "CUDA error: out of memory"
    assert "Pod kt-a (attempt 1) is gone" in problem["detail"]
    assert "CUDA error: out of memory" in problem["detail"]


def test_fake_nodes_are_said_to_have_no_logs(
    client: TestClient, tokens: Tokens, job: str, pod_logs: FakeLogs
) -> None:
    pod_logs.fake_nodes.add("gpu-node-1")
    answer = client.get(f"{JOBS}/{job}/logs", headers=tokens("viewer"))
    assert answer.status_code == 409
    assert "fake nodes run no containers and have no logs" in answer.json()["detail"]
    assert not pod_logs.asked  # never asked the API server to reach a kubelet that is not there


def test_a_gang_worker_is_chosen_by_its_rank(
    client: TestClient, tokens: Tokens, db: Database, pod_logs: FakeLogs
) -> None:
    job_id = submitted(client, tokens, "gang")
    record(
        db, job_id, [pod("kt-g-0", pod_phase="Running"), pod("kt-g-1", pod_phase="Running")], [0, 1]
    )
    pod_logs.output |= {"kt-g-0": ["rank 0\n"], "kt-g-1": ["rank 1\n"]}
    assert (
        client.get(f"{JOBS}/{job_id}/logs", params={"worker": 1}, headers=tokens("viewer")).text
        == "rank 1\n"
    )
    assert (
        client.get(f"{JOBS}/{job_id}/logs", params={"worker": 0}, headers=tokens("viewer")).text
        == "rank 0\n"
    )
    missing = client.get(f"{JOBS}/{job_id}/logs", params={"worker": 2}, headers=tokens("viewer"))
    assert missing.status_code == 404
    assert "no Pod of worker 2" in missing.json()["detail"]


def test_the_logs_are_read_like_the_other_reads(
    client: TestClient, tokens: Tokens, job: str, pod_logs: FakeLogs
) -> None:
    # Another project's token: the job does not exist for it.
    assert client.get(f"{JOBS}/{job}/logs", headers=tokens("viewer", OTHER)).status_code == 404
    assert client.get(f"{JOBS}/{job}/logs").status_code == 401
    assert (
        client.get(
            f"{JOBS}/{job}/logs", params={"attempt": 3}, headers=tokens("viewer")
        ).status_code
        == 404
    )
    bad = client.get(f"{JOBS}/{job}/logs", params={"since": "yesterday"}, headers=tokens("viewer"))
    assert bad.status_code == 422
    assert "since" in bad.json()["detail"]
    assert not pod_logs.asked


def test_a_server_without_a_cluster_connection_says_so(
    settings: ServerSettings, db: Database, tokens: Tokens
) -> None:
    with TestClient(create_app(settings, db)) as plain:
        job_id = submitted(plain, tokens)
        record(db, job_id, [pod("kt-x", pod_phase="Running")], [None])
        answer = plain.get(f"{JOBS}/{job_id}/logs", headers=tokens("viewer"))
    assert answer.status_code == 503
    assert "no cluster connection" in answer.json()["detail"]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("since", "0s"),
        ("since", "-5m"),
        ("since", "yesterday"),
        ("since", "9000h"),
        ("since", ""),
        ("tail", "-1"),
        ("tail", "100001"),
        ("tail", "ten"),
        ("attempt", "0"),
        ("attempt", "1e3"),
        ("attempt", "10000000"),
        ("worker", "-1"),
        ("worker", "256"),
        ("follow", "maybe"),
        ("timestamps", "2"),
    ],
)
def test_every_bad_parameter_is_a_422_naming_it_before_kubernetes_is_asked(
    client: TestClient, tokens: Tokens, job: str, pod_logs: FakeLogs, name: str, value: str
) -> None:
    answer = client.get(f"{JOBS}/{job}/logs", params={name: value}, headers=tokens("viewer"))
    assert answer.status_code == 422, answer.text
    problem = answer.json()
    assert [e["field"] for e in problem["errors"]] == [f"query.{name}"]
    assert not pod_logs.asked


def test_the_smallest_and_largest_windows_are_passed_on(
    client: TestClient, tokens: Tokens, job: str, pod_logs: FakeLogs
) -> None:
    for since, seconds in (("1s", 1), ("8784h", 8784 * 3600)):
        answer = client.get(f"{JOBS}/{job}/logs", params={"since": since}, headers=tokens("viewer"))
        assert answer.status_code == 200, answer.text
        assert pod_logs.asked[-1].since_seconds == seconds


def test_kubernetes_refusals_are_translated_not_passed_on_as_503(
    client: TestClient, tokens: Tokens, job: str, pod_logs: FakeLogs
) -> None:
    # kubetrain's own ServiceAccount refused: no retry helps, so no 503, and its text
    # (about kubetrain's identity) stays in the server's log.
    said = 'pods "kt-b" is forbidden: User "system:serviceaccount:kubetrain:kubetrain" cannot'
    pod_logs.refusals["kt-b"] = ClusterRefused(403, "Forbidden", said)
    answer = client.get(f"{JOBS}/{job}/logs", headers=tokens("viewer"))
    assert answer.status_code == 502, answer.text
    problem = answer.json()
    assert problem["type"] == "urn:kubetrain:problem:logs-refused"
    assert "Forbidden" in problem["detail"]
    assert "serviceaccount" not in answer.text
    # An API server that does not answer now: the one 503, with when to come back.
    pod_logs.refusals["kt-b"] = ClusterRefused(503, "ServiceUnavailable", "etcd is slow")
    answer = client.get(f"{JOBS}/{job}/logs", headers=tokens("viewer"))
    assert answer.status_code == 503
    assert answer.headers["Retry-After"] == "5"
    assert "etcd" not in answer.text


@pytest.mark.timeout(30)  # without the end, the stream would never end
def test_a_follow_stream_ends_once_the_pod_has_ended_even_if_the_kubelet_never_says(
    client: TestClient,
    tokens: Tokens,
    db: Database,
    pod_logs: FakeLogs,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(logs_api, "FOLLOW_CHECK_SECONDS", 0.05)
    monkeypatch.setattr(logs_api, "FOLLOW_GRACE_SECONDS", 0.0)
    job_id = submitted(client, tokens, "lost")
    ended = datetime.now(UTC)
    record(db, job_id, [pod("kt-lost", pod_phase="Failed", finished_at=ended)], [None])
    pod_logs.output["kt-lost"] = ["last words\n"]
    pod_logs.endless.add("kt-lost")
    answer = client.get(
        f"{JOBS}/{job_id}/logs", params={"follow": "true"}, headers=tokens("viewer")
    )
    # The answer is whole: the stream ended, and its place is given back.
    assert (answer.status_code, answer.text) == (200, "last words\n")
    app = cast(Any, client.app)
    assert app.state.kubetrain.follow_streams.total() == 0
