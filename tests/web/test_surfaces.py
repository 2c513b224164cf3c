"""The Queues page (Kueue's queues from dumps recorded from the real Kueue), the job
page's logs panel (the cluster side faked at PodLogs, as in tests/api/test_logs.py) and
the admins' Usage page."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from fastapi.testclient import TestClient

from kubetrain.api import create_app
from kubetrain.cluster.logs import PodLogs
from kubetrain.cluster.tokenreview import TokenReviewer
from kubetrain.domain.states import BusinessState, ReasonCode
from kubetrain.settings import ServerSettings
from kubetrain.store import Database, PodObservation
from kubetrain.store.sync import SyncedJob, record_synced
from tests.api.builders import (
    NEVER_FITS_NAMESPACE,
    OTHER,
    PROJECT,
    WAITING_NAMESPACE,
    FakeLogs,
    FakeReviewer,
    Tokens,
    enrol,
    kueue_cluster,
    own,
    submitted,
)
from tests.web.conftest import plaintext, sign_in

pytestmark = pytest.mark.db

# Reports take times within a window of the server's clock (api/reports.py).
YESTERDAY = (datetime.now(UTC) - timedelta(days=1)).strftime("%Y-%m-%dT16:00:0{}Z")

HOSTILE = "<script>window.__xss=1</script>"


@pytest.fixture
def pod_logs() -> FakeLogs:
    return FakeLogs()


@pytest.fixture
def listing() -> dict[str, Any]:
    return kueue_cluster()


@pytest.fixture
def client(
    db: Database, listing: dict[str, Any], pod_logs: FakeLogs, reviewer: FakeReviewer
) -> Iterator[TestClient]:
    settings = ServerSettings(
        database_url=db.url.render_as_string(hide_password=False),
        namespaces={PROJECT: WAITING_NAMESPACE, OTHER: NEVER_FITS_NAMESPACE},
    )
    pods = cast(TokenReviewer, reviewer)
    app = create_app(
        settings, db, cluster=lambda: listing, pod_logs=cast(PodLogs, pod_logs), pod_tokens=pods
    )
    with TestClient(app) as test_client:
        yield test_client


# -- queues --------------------------------------------------------------------------


def test_the_queues_page_draws_gpu_quota_and_lists_who_waits_in_order(
    client: TestClient, tokens: Tokens, listing: dict[str, Any]
) -> None:
    job_id = submitted(client, tokens, "queued-one")
    own(listing, WAITING_NAMESPACE, "kt-kueue-waiting", job_id)
    sign_in(client, plaintext(tokens, "viewer", "*"))
    page = client.get("/ui/queues")
    assert page.status_code == 200
    assert '<a href="/ui/queues" class="here">Queues</a>' in page.text
    assert re.findall(r'data-cluster-queue="([^"]+)"', page.text) == ["gpus", "stopped"]
    gpus = page.text[page.text.index('data-cluster-queue="gpus"') :]
    gpus = gpus[: gpus.index("</section>")]
    assert 'data-resource="default-flavor · nvidia.com/gpu" data-used="8" data-total="8"' in gpus
    assert "8 of 8 nominal admitted" in gpus
    assert "1 admitted · 2 pending" in gpus
    rows = re.findall(
        r'<tr data-position="(\d+)">\s*<td class="num">\d+</td>\s*<td>(.*?)</td>', gpus
    )
    assert rows == [
        ("1", f'<a href="/ui/projects/{PROJECT}/jobs/{job_id}">queued-one</a>'),
        ("2", '<span class="mono">kt-kueue-never-fits</span>'),
    ]
    assert "insufficient unused quota for nvidia.com/gpu" in gpus
    assert "inactive: Can&#39;t admit new workloads: is stopped." in page.text
    live = client.get("/ui/queues?fragment=live").text
    assert "<html" not in live
    assert 'data-cluster-queue="gpus"' in live


def test_a_project_sees_its_own_place_in_the_queue_and_not_who_is_ahead(
    client: TestClient, tokens: Tokens, listing: dict[str, Any]
) -> None:
    job_id = submitted(client, tokens, "queued-one")
    own(listing, WAITING_NAMESPACE, "kt-kueue-waiting", job_id)
    sign_in(client, plaintext(tokens, "viewer", OTHER))
    page = client.get("/ui/queues").text
    assert re.findall(r'data-position="(\d+)"', page) == ["2"]
    assert "1 pending job of other projects is not shown; the positions count them" in page
    for secret in ("queued-one", job_id, WAITING_NAMESPACE, "kt-kueue-waiting"):
        assert secret not in page


def test_without_kueue_the_queues_page_says_so(db: Database, tokens: Tokens) -> None:
    settings = ServerSettings(database_url=db.url.render_as_string(hide_password=False))
    empty = {"apiVersion": "v1", "kind": "List", "items": []}
    with TestClient(create_app(settings, db, cluster=lambda: empty)) as plain:
        sign_in(plain, plaintext(tokens, "viewer"))
        assert "No ClusterQueue: Kueue is not installed" in plain.get("/ui/queues").text


# -- the logs panel ------------------------------------------------------------------


def _ran(db: Database, job_id: str, pod: PodObservation) -> None:
    synced = SyncedJob(
        job_id, [pod], BusinessState.RUNNING, ReasonCode.TRAINING, None, None, None, 1, None, {}
    )
    with db.transaction() as session:
        record_synced(session, [synced], now=datetime.now(UTC))


def test_the_progress_card_says_a_phase_is_current_only_while_the_job_runs(
    client: TestClient, tokens: Tokens, db: Database, reviewer: FakeReviewer
) -> None:
    from kubetrain.domain.manifest import job_name

    job_id = submitted(client, tokens, "phased")
    token = enrol(db, reviewer, job_id, "aaaaa", namespace=WAITING_NAMESPACE)
    pod = f"{job_name(job_id)}-aaaaa"
    events = [
        {"seq": 1, "time": YESTERDAY.format(0), "type": "phase", "phase": "TRAINING"},
        {"seq": 2, "time": YESTERDAY.format(1), "type": "step", "step": 5, "metrics": {}},
        # A small model's checkpoint: a few KiB, which is not "0.0 MiB".
        {
            "seq": 3,
            "time": YESTERDAY.format(2),
            "type": "checkpoint",
            "step": 5,
            "sizeBytes": 4300,
            "durationSeconds": 0.01,
            "binding": {"dataset_version": "mnist@v2", "code_version": "c1", "params_sha256": None},
        },
    ]
    answer = client.post(
        f"/api/v1/jobs/{job_id}/reports",
        json={"pod": pod, "events": events},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert answer.status_code == 202, answer.text
    sign_in(client, plaintext(tokens, "viewer"))

    def card() -> str:
        page = client.get(f"/ui/projects/{PROJECT}/jobs/{job_id}").text
        section = page[page.index('id="progress"') :]
        return section[: section.index("</section>")]

    # Not running (here: not yet; a finished job alike): the last report, not a state.
    before = card()
    assert (
        '<dt>Last phase reported</dt><dd id="phase"><span class="chip chip-muted">TRAINING</span>'
        f" by {pod}</dd>"
    ) in before
    assert "<dt>Phase</dt>" not in before
    assert "step 5, 4.2 KiB in 0.01 s" in before
    assert '<td>5</td><td class="nowrap">4.2 KiB</td>' in before
    assert "<th>Bound to</th>" in before
    assert "dataset <code>mnist@v2</code><br>code <code>c1</code><br>params <code>unset</code>" in (
        before
    )
    _ran(db, job_id, PodObservation(pod, "uid-a", node="gpu-1", pod_phase="Running"))
    running = card()
    assert (
        f'<dt>Phase</dt><dd id="phase"><span class="chip chip-ok">TRAINING</span> on {pod}</dd>'
    ) in running


def _logs_card(client: TestClient, job_id: str, *, live: bool = False) -> str:
    url = f"/ui/projects/{PROJECT}/jobs/{job_id}" + ("?fragment=live" if live else "")
    page = client.get(url)
    assert page.status_code == 200
    card = page.text[page.text.index('id="logs"') :]
    return card[: card.index("</section>")]


def test_the_job_page_shows_the_last_lines_of_the_current_attempt_escaped(
    client: TestClient, tokens: Tokens, db: Database, pod_logs: FakeLogs
) -> None:
    job_id = submitted(client, tokens, "talks")
    _ran(db, job_id, PodObservation("kt-talks-a", "uid-a", node="gpu-1", pod_phase="Running"))
    pod_logs.output["kt-talks-a"] = ["step 1 loss 2.3\n", f"{HOSTILE}\n"]
    sign_in(client, plaintext(tokens, "viewer"))
    card = _logs_card(client, job_id)
    assert "attempt 1 · kt-talks-a · the last lines" in card
    assert "step 1 loss 2.3\n&lt;script&gt;window.__xss=1&lt;/script&gt;" in card
    assert "<script>" not in card
    (asked,) = pod_logs.asked
    assert (asked.pod, asked.container, asked.tail, asked.follow) == (
        "kt-talks-a",
        "trainer",
        100,
        False,
    )
    # The live refresh reads them again.
    pod_logs.output["kt-talks-a"].append("step 2 loss 2.1\n")
    assert "step 2 loss 2.1" in _logs_card(client, job_id, live=True)


def test_on_a_fake_node_the_panel_says_there_are_no_logs(
    client: TestClient, tokens: Tokens, db: Database, pod_logs: FakeLogs
) -> None:
    job_id = submitted(client, tokens, "kwok")
    _ran(db, job_id, PodObservation("kt-kwok-a", "uid-a", node="kwok-1", pod_phase="Running"))
    pod_logs.fake_nodes.add("kwok-1")
    sign_in(client, plaintext(tokens, "viewer"))
    card = _logs_card(client, job_id)
    assert "runs on kwok-1, a fake node" in card
    assert "fake nodes run no containers and have no logs" in card
    assert pod_logs.asked == []  # the log is not even asked for


def test_when_the_pod_is_gone_the_panel_shows_its_termination_message(
    client: TestClient, tokens: Tokens, db: Database
) -> None:
    job_id = submitted(client, tokens, "crashed")
    gone = PodObservation(
        "kt-crashed-a",
        "uid-a",
        node="gpu-1",
        pod_phase="Failed",
        exit_code=1,
        termination_message="Traceback …\nRuntimeError: CUDA error: out of memory",
    )
    _ran(db, job_id, gone)
    sign_in(client, plaintext(tokens, "viewer"))
    card = _logs_card(client, job_id)
    assert "Pod kt-crashed-a (attempt 1) is gone, and its logs with it" in card
    termination = re.search(r'<pre class="logs" id="log-termination">([^<]*)</pre>', card)
    assert termination is not None
    assert termination.group(1) == "Traceback …\nRuntimeError: CUDA error: out of memory"


def _recorded_pod(scenario: str) -> PodObservation:
    """The job's last Pod in a dump recorded from the testbed, as the syncer stores it."""
    from tests.unit.diagnosis_helpers import recorded

    view = recorded(scenario).attempts[-1]
    return PodObservation(
        view.pod_name,
        view.pod_uid,
        node=view.node,
        pod_phase=view.phase,
        container_state=view.container_state,
        raw_reason=view.raw_reason,
        raw_message=view.raw_message,
    )


@pytest.mark.parametrize(
    ("scenario", "why"),
    [
        ("insufficient-gpu", "it has not been scheduled to a node (Unschedulable: 0/4 nodes"),
        ("real-image-pull-failed", "its image has not been pulled (ImagePullBackOff: Back-off"),
    ],
)
def test_a_pod_with_no_container_says_so_and_why(
    client: TestClient, tokens: Tokens, db: Database, pod_logs: FakeLogs, scenario: str, why: str
) -> None:
    job_id = submitted(client, tokens, "early")
    pod = _recorded_pod(scenario)
    _ran(db, job_id, pod)
    sign_in(client, plaintext(tokens, "viewer"))
    card = _logs_card(client, job_id)
    assert f"Pod {pod.pod_name} (attempt 1) has no container, so no logs: {why}" in card
    assert "printed nothing" not in card
    assert pod_logs.asked == []  # the API server has nothing to give: not even asked
    # The logs endpoint says the same, as a problem rather than an empty stream.
    answer = client.get(
        f"/api/v1/projects/{PROJECT}/jobs/{job_id}/logs", headers=tokens("viewer", PROJECT)
    )
    assert answer.status_code == 409, answer.text
    assert answer.json()["type"] == "urn:kubetrain:problem:no-container"
    assert why in answer.json()["detail"]


def test_before_a_pod_or_without_a_cluster_the_panel_says_why(
    client: TestClient, tokens: Tokens, db: Database
) -> None:
    job_id = submitted(client, tokens, "early")
    sign_in(client, plaintext(tokens, "viewer"))
    assert "no Pod yet" in _logs_card(client, job_id)
    _ran(db, job_id, PodObservation("kt-early-a", "uid-a", node="gpu-1", pod_phase="Running"))
    settings = ServerSettings(database_url=db.url.render_as_string(hide_password=False))
    with TestClient(create_app(settings, db)) as plain:
        sign_in(plain, plaintext(tokens, "viewer"))
        assert "this server has no cluster connection" in _logs_card(plain, job_id)


# -- usage ---------------------------------------------------------------------------


def test_admins_see_gpu_hours_per_project_and_type_before_training_and_training(
    client: TestClient, tokens: Tokens, db: Database
) -> None:
    job_id = submitted(client, tokens, "used")
    start = datetime.now(UTC) - timedelta(hours=3)
    _ran(
        db,
        job_id,
        PodObservation(
            "kt-used-a",
            "uid-a",
            node="gpu-1",
            pod_phase="Succeeded",
            bound_at=start,
            started_at=start + timedelta(minutes=30),
            finished_at=start + timedelta(hours=2, minutes=30),
        ),
    )
    sign_in(client, plaintext(tokens, "admin", "*"))
    page = client.get("/ui/usage").text
    assert '<a href="/ui/usage" class="here">Usage</a>' in page
    row = re.search(rf'<tr data-project="{PROJECT}" data-gpu-type="any">(.*?)</tr>', page, re.S)
    assert row is not None
    cells = re.findall(r'<td class="num">(?:<b>)?([\d.]+)', row.group(1))
    assert cells == ["1", "0.50", "2.00", "2.50"]  # jobs, before training, training, total
    assert "80% training" in row.group(1)
    assert re.search(r'class="usage-before" x="0" y="0" width="20.0"', row.group(1))
    # A window is one of those offered.
    recent = client.get("/ui/usage?since=24h").text
    assert "GPU-hours the last 24 hours" in recent
    assert client.get("/ui/usage?since=1y").status_code == 422


def test_the_usage_page_is_for_admins(client: TestClient, tokens: Tokens) -> None:
    sign_in(client, plaintext(tokens, "submitter"))
    assert "/ui/usage" not in client.get("/ui/queues").text  # not in the nav either
    refused = client.get("/ui/usage")
    assert refused.status_code == 403
    assert "a submitter token may not admin" in refused.text
