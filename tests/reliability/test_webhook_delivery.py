"""A webhook's receiver hears every state change of a job, in order, signed, through a SIGKILL
of kubetrain in the middle of the job's life (issue 22's notifications, end to end).

Everything is real: `kubetrain serve` as a process on the testbed (SQLite and PostgreSQL), the
webhook made with `kubetrain webhook create` (its secret read from its stdout, the only place
it is ever shown), and a stdlib HTTP receiver on loopback. The receiver refuses the first
deliveries with 500 (the notifier must retry them), and it holds its answer to the job's first
RUNNING event while the test SIGKILLs kubetrain: the event reached the receiver, kubetrain never
heard the 2xx, so the restarted server must send it again (at least once), and only it of what
came before (each answered event moved the webhook's cursor), and go on in order.
The signatures are checked here with hmac and base64 alone, as a receiver would.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from kubetrain.testbed.cluster import Testbed
from tests.e2e.conftest import Server, training_job
from tests.e2e.test_lifecycle import get, submit, wait_for
from tests.kube import eventually
from tests.reliability.conftest import unled_server

pytestmark = [pytest.mark.testbed, pytest.mark.faults]

FATE = "testbed.kubetrain.io"
RUN = "30s"  # the job's training: the kill, after its RUNNING event, lands well before its end
REFUSED = 3  # the first deliveries answered 500: retried after ~1, 2 and 4 s
TRIGGER_STATE = "RUNNING"  # the event whose answer is held while kubetrain is killed
HELD = 0  # a delivery's status while its answer is held (kubetrain died before hearing one)
EVENT_TYPES = {
    "io.kubetrain.job.state_changed",
    "io.kubetrain.job.reason_changed",
    "io.kubetrain.job.not_waitable",
    "io.kubetrain.job.no_progress",
}


@dataclass
class Delivery:
    headers: dict[str, str]
    body: bytes
    received_at: float  # time.time()
    life: int  # which kubetrain process sent it: 0 before the kill, 1 after
    status: int  # what the receiver answered; HELD for the one it answered only after the kill

    @property
    def event(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.body)
        return parsed


class Receiver:
    """A real HTTP server on loopback: records every delivery, refuses the first `REFUSED`,
    and holds the first 2xx delivery of a `TRIGGER_STATE` event until `release` is set."""

    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []
        self.life = 0
        self.lock = threading.Lock()
        self.held = threading.Event()  # the trigger event arrived; its answer is held
        self.release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                headers = {k.lower(): v for k, v in self.headers.items()}
                status = receiver.record(headers, body)
                if status == HELD:
                    receiver.release.wait(120)
                    status = 200
                with contextlib.suppress(OSError):  # the sender may be dead by now
                    self.send_response(status)
                    self.send_header("content-length", "0")
                    self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/kubetrain-events"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def record(self, headers: dict[str, str], body: bytes) -> int:
        with self.lock:
            status = 500 if len(self.deliveries) < REFUSED else 200
            if status == 200 and not self.held.is_set():
                change = json.loads(body).get("data", {}).get("change", {})
                if change.get("toState") == TRIGGER_STATE:
                    status = HELD
                    self.held.set()
            self.deliveries.append(Delivery(headers, body, time.time(), self.life, status))
            return status

    def snapshot(self) -> list[Delivery]:
        with self.lock:
            return list(self.deliveries)

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def server(request: pytest.FixtureRequest, testbed: Testbed, tmp_path: Path) -> Iterator[Server]:
    """`kubetrain serve` without leader election: its restart would otherwise wait out the
    killed process's Lease (15 s). The receiver is on loopback, which only the setting
    opens to webhooks."""
    if request.param == "sqlite":
        database_url = f"sqlite:///{tmp_path / 'kubetrain.db'}"
    else:
        database_url = request.getfixturevalue("postgres_server").create_database()
    opened = {"KUBETRAIN_WEBHOOK_ALLOWED_NETWORKS": '["127.0.0.0/8"]'}
    with unled_server(testbed, tmp_path, database_url, env=opened) as srv:
        yield srv


def verify_signature(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """Standard Webhooks, as a receiver checks it: HMAC-SHA256 with the key after `whsec_`
    over `{webhook-id}.{webhook-timestamp}.{body}`; any `v1,` signature listed may match."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    offered = headers["webhook-signature"].split()
    return any(
        version == "v1" and hmac.compare_digest(signature, expected)
        for version, _, signature in (s.partition(",") for s in offered)
    )


def _utc(text: str) -> datetime:
    at = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def _change_of(row: dict[str, Any]) -> tuple[datetime, str | None, str | None]:
    """A business history row as the events tell it: when, and to what state and reason."""
    return _utc(row["at"]), row["to_state"], row["to_reason"]


def _change_in(event: dict[str, Any]) -> tuple[datetime, str | None, str | None]:
    change = event["data"]["change"]
    return _utc(change["at"]), change["toState"], change["toReason"]


def _first_received(deliveries: list[Delivery]) -> list[tuple[datetime, str | None, str | None]]:
    """The changes the receiver heard of, each once, in the order it first heard of them."""
    seen: list[tuple[datetime, str | None, str | None]] = []
    for delivery in deliveries:
        change = _change_in(delivery.event)
        if change not in seen:
            seen.append(change)
    return seen


@pytest.mark.timeout(600)
def test_a_loopback_receiver_gets_every_state_change_in_order_signed_through_a_sigkill(
    server: Server, receiver: Receiver
) -> None:
    project = f"hooks-{uuid.uuid4().hex[:8]}"
    created = server.cli("webhook", "create", "-p", project, "--url", receiver.url)
    assert created.returncode == 0, created.stderr
    secret = created.stdout.strip()
    assert secret.startswith("whsec_"), created.stdout
    body = training_job(
        "notified", project, resources={"requests": {"cpu": "100m", "memory": "128Mi"}}
    )
    body["metadata"]["annotations"] = {f"{FATE}/run": RUN}
    reply = submit(server, project, body)
    assert reply.status_code == 201, reply.text
    job_id = reply.json()["id"]

    # The receiver has the RUNNING event and holds its answer: kubetrain dies waiting for it.
    eventually(receiver.held.is_set, 150, interval=0.1, what=f"the {TRIGGER_STATE} event")
    at_kill = get(server, project, job_id)
    assert at_kill["business_status"] == TRIGGER_STATE, at_kill  # mid-life, not finished
    server.kill()
    receiver.life = 1
    receiver.release.set()
    server.start()

    wait_for(server, project, job_id, "SUCCEEDED", "COMPLETED", timeout=180)
    rows = get(server, project, job_id, "/history")["items"]
    business = [r for r in rows if r["kind"] == "business"]
    changes = [_change_of(r) for r in business]
    print("history:", [(state, reason) for _, state, reason in changes])
    final = changes[-1]
    assert final[1:] == ("SUCCEEDED", "COMPLETED")
    eventually(
        lambda: any(d.status == 200 and _change_in(d.event) == final for d in receiver.snapshot()),
        90,
        what="the SUCCEEDED event answered 2xx",
    )
    deliveries = receiver.snapshot()
    print(
        "deliveries:",
        [(d.life, d.status, d.headers["webhook-id"]) for d in deliveries],
    )

    # Each one signed, with the secret shown at creation, and a CloudEvent about this job.
    for delivery in deliveries:
        headers, event = delivery.headers, delivery.event
        assert headers["content-type"] == "application/cloudevents+json", headers
        assert verify_signature(secret, headers, delivery.body), headers
        assert abs(int(headers["webhook-timestamp"]) - delivery.received_at) < 300, headers
        assert event["specversion"] == "1.0", event
        assert event["id"] == headers["webhook-id"], event
        assert event["type"] in EVENT_TYPES, event
        assert event["source"], event
        assert event["subject"] == f"projects/{project}/jobs/{job_id}", event
        assert event["time"], event
        assert event["data"]["job"]["id"] == job_id, event

    # Every state change of the history, and nothing else, first heard in the history's order.
    assert _first_received(deliveries) == changes

    # At least once, and no more: what was refused, and what kubetrain never heard answered,
    # came again, the same (its id, its body); nothing answered 2xx was ever sent again.
    by_id: dict[str, list[Delivery]] = {}
    for delivery in deliveries:
        by_id.setdefault(delivery.headers["webhook-id"], []).append(delivery)
    for event_id, sent in by_id.items():
        assert len({d.body for d in sent}) == 1, f"{event_id} changed between deliveries"
        assert [d.status for d in sent][-1] == 200, f"{event_id} was never answered 2xx"
        assert all(d.status != 200 for d in sent[:-1]), f"{event_id} sent again after its 2xx"
    assert [d.status for d in deliveries[:REFUSED]] == [500] * REFUSED
    # The restarted process began where the killed one stood: at the event held over the kill
    # (the cursor had moved past every event answered before it), and went on to the end.
    held = next(d for d in deliveries if d.status == HELD)
    after = [d for d in deliveries if d.life == 1]
    assert after, "nothing was sent after the restart"
    assert after[0].body == held.body, (held.event, after[0].event)
    assert any(_change_in(d.event) == final for d in after)

    # The webhook is healthy again, and the secret went nowhere but to the CLI's stdout.
    listed = server.cli("webhook", "list", "-p", project, "-o", "json")
    assert listed.returncode == 0, listed.stderr
    (hook,) = json.loads(listed.stdout)
    assert (hook["status"], hook["failures"]) == ("ok", 0), hook
    assert hook["delivered"] == len(by_id), hook
    key = secret.removeprefix("whsec_")
    log = server.log.read_text(errors="replace")
    assert key not in log
    assert key not in created.stderr + listed.stdout + listed.stderr
