"""Webhooks on a real database: the API (admins of the project only; the secret shown
once), and the notifier delivering the job history to a real receiver on loopback,
in order, signed, retried after a failure.

Loopback is closed to webhooks by default (domain/networks.py): these receivers are
reached because the settings here open 127.0.0.0/8. Hostile receivers (one that
trickles its answer, one that answers 10 MB, one that redirects to the metadata
service) and a name that resolves to loopback are in test_webhook_receivers.py."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from kubetrain.api import create_app
from kubetrain.control.notifier import Notifier
from kubetrain.delivery import webhook_poster
from kubetrain.domain.networks import Network, networks
from kubetrain.domain.notifications import sign
from kubetrain.domain.states import BusinessState, ReasonCode
from kubetrain.settings import ServerSettings
from kubetrain.store import Database, apply_business_change
from kubetrain.store.models import Source, Transition
from kubetrain.store.webhooks import installation_id
from tests.api.builders import JOBS, OTHER, PROJECT, Tokens, submitted, training_job
from tests.kube import eventually

pytestmark = pytest.mark.db

HOOKS = f"/api/v1/projects/{PROJECT}/webhooks"
LOOPBACK = ["127.0.0.0/8"]  # the receivers here listen on loopback, closed by default


@pytest.fixture
def settings(db: Database) -> ServerSettings:
    return ServerSettings(
        database_url=db.url.render_as_string(hide_password=False),
        webhook_allowed_networks=LOOPBACK,
    )


class Receiver:
    """A real HTTP server on loopback that records what it is sent."""

    def __init__(self) -> None:
        self.received: list[tuple[dict[str, str], bytes]] = []
        self.status = 204
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                receiver.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(receiver.status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(body) for _, body in self.received]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()


def rounds(
    db: Database,
    clock: datetime,
    times: int = 1,
    *,
    allowed: tuple[Network, ...] = networks(LOOPBACK),
    timeout: float = 10.0,
) -> int:
    async def go() -> int:
        async with webhook_poster(allowed_networks=allowed, timeout=timeout) as post:
            notifier = Notifier(db, post, clock=lambda: clock)
            return sum([await notifier.round() for _ in range(times)])

    return asyncio.run(go())


def test_only_the_projects_admins_manage_webhooks_and_the_secret_is_shown_once(
    client: TestClient, tokens: Tokens, receiver: Receiver
):
    body = {"url": receiver.url}
    for role in ("viewer", "submitter"):
        assert client.post(HOOKS, json=body, headers=tokens(role)).status_code == 403
    assert client.post(HOOKS, json=body, headers=tokens("admin", OTHER)).status_code == 403
    created = client.post(HOOKS, json=body, headers=tokens("admin"))
    assert created.status_code == 201, created.text
    secret = created.json()["secret"]
    assert secret.startswith("whsec_")
    listed = client.get(HOOKS, headers=tokens("admin")).json()["items"]
    assert [h["id"] for h in listed] == [created.json()["id"]]
    assert secret not in json.dumps(listed)
    assert listed[0]["status"] == "ok"
    gone = client.delete(f"{HOOKS}/{listed[0]['id']}", headers=tokens("admin", OTHER))
    assert gone.status_code == 403
    assert client.delete(f"{HOOKS}/{listed[0]['id']}", headers=tokens("admin")).status_code == 204
    assert client.delete(f"{HOOKS}/{listed[0]['id']}", headers=tokens("admin")).status_code == 404


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"url": "https://user:secret@example.org/h"}, "url"),
        ({"url": "file:///etc/passwd"}, "url"),
        ({}, "url"),
        ({"url": "http://127.0.0.1/h", "events": ["io.kubetrain.job.exploded"]}, "events[0]"),
        ({"url": "http://127.0.0.1/h", "secret": "mine"}, "secret"),
        ({"url": "https://example.org/\u202egpj.exe"}, "url"),
        ({"url": "https://exa\u200fmple.org/h"}, "url"),
        ({"url": "http://169.254.169.254/latest/meta-data/"}, "url"),
        ({"url": "http://10.0.0.7/h"}, "url"),
    ],
)
def test_a_bad_webhook_is_refused_naming_the_field_and_nothing_is_stored(
    client: TestClient, tokens: Tokens, body: dict[str, Any], field: str
):
    refused = client.post(HOOKS, json=body, headers=tokens("admin"))
    assert refused.status_code == 422, refused.text
    assert field in [e["field"] for e in refused.json()["errors"]]
    assert "secret" not in refused.text or field == "secret"
    assert client.get(HOOKS, headers=tokens("admin")).json()["items"] == []


def test_the_history_is_delivered_in_order_signed_and_again_after_a_failure(
    client: TestClient, tokens: Tokens, db: Database, receiver: Receiver
):
    created = client.post(HOOKS, json={"url": receiver.url}, headers=tokens("admin")).json()
    secret = created["secret"]
    first = submitted(client, tokens, "first")
    second = submitted(client, tokens, "second")
    assert client.post(f"{JOBS}/{first}/cancel", headers=tokens("submitter")).status_code == 200
    now = datetime.now(UTC)

    receiver.status = 503
    assert rounds(db, now) == 0
    assert len(receiver.received) == 1  # the first failure stops the round
    hook = client.get(HOOKS, headers=tokens("admin")).json()["items"][0]
    assert (hook["status"], hook["failures"], hook["delivered"]) == ("failing", 1, 0)
    assert "503" in hook["lastError"]
    retry_at = datetime.fromisoformat(hook["nextAttemptAt"])
    assert now < retry_at <= now + timedelta(seconds=1)
    assert rounds(db, now) == 0  # backing off: nothing is tried
    assert len(receiver.received) == 1

    receiver.status = 200
    receiver.received.clear()
    assert rounds(db, now + timedelta(seconds=2)) == 3
    events = receiver.events()
    assert [(e["data"]["job"]["id"], e["data"]["job"]["state"]) for e in events] == [
        (first, "CREATED"),
        (second, "CREATED"),
        (first, "CANCELLED"),
    ]
    assert {e["type"] for e in events} == {"io.kubetrain.job.state_changed"}
    assert events[0]["subject"] == f"projects/{PROJECT}/jobs/{first}"
    for headers, body in receiver.received:
        timestamp = int(headers["webhook-timestamp"])
        assert headers["webhook-signature"] == sign(secret, headers["webhook-id"], timestamp, body)
        assert secret not in body.decode()
    hook = client.get(HOOKS, headers=tokens("admin")).json()["items"][0]
    assert (hook["status"], hook["failures"], hook["delivered"]) == ("ok", 0, 3)
    # delivered once: nothing more to send
    assert rounds(db, now + timedelta(seconds=3)) == 0


def test_a_webhook_hears_only_its_projects_jobs_and_its_event_types(
    client: TestClient, tokens: Tokens, db: Database, receiver: Receiver
):
    body = {"url": receiver.url, "events": ["io.kubetrain.job.state_changed"]}
    assert client.post(HOOKS, json=body, headers=tokens("admin")).status_code == 201
    other = client.post(
        f"/api/v1/projects/{OTHER}/jobs",
        json=training_job("theirs"),
        headers=tokens("submitter", OTHER),
    )
    assert other.status_code == 201, other.text
    mine = submitted(client, tokens, "mine")
    assert rounds(db, datetime.now(UTC)) == 1
    assert [e["data"]["job"]["id"] for e in receiver.events()] == [mine]


def test_a_round_cut_short_sends_again_only_the_event_in_flight(
    client: TestClient, tokens: Tokens, db: Database, receiver: Receiver
):
    """The leader's loops are cancelled when it loses its lease (a crash cuts them as short):
    what the receiver answered before stays delivered; only the event in flight comes again."""
    assert (
        client.post(HOOKS, json={"url": receiver.url}, headers=tokens("admin")).status_code == 201
    )
    jobs = [submitted(client, tokens, f"job-{index}") for index in range(3)]
    now = datetime.now(UTC)

    async def cut_short() -> None:
        async with webhook_poster(allowed_networks=networks(LOOPBACK)) as post:
            in_flight = asyncio.Event()

            async def third_never_answered(url: str, body: bytes, headers: dict[str, str]) -> int:
                if len(receiver.received) == 2:
                    in_flight.set()
                    await asyncio.Event().wait()
                return await post(url, body, headers)

            notifier = Notifier(db, third_never_answered, clock=lambda: now)
            round_ = asyncio.create_task(notifier.round())
            await in_flight.wait()
            round_.cancel()
            with pytest.raises(asyncio.CancelledError):
                await round_

    asyncio.run(cut_short())
    assert len(receiver.received) == 2
    hook = client.get(HOOKS, headers=tokens("admin")).json()["items"][0]
    assert (hook["status"], hook["delivered"]) == ("ok", 2)
    receiver.received.clear()
    assert rounds(db, now) == 1
    assert [e["data"]["job"]["id"] for e in receiver.events()] == [jobs[2]]


@pytest.mark.parametrize(
    ("url", "network"),
    [
        ("http://127.0.0.1:8080/h", "127.0.0.0/8"),
        ("http://169.254.169.254/latest/meta-data/", "169.254.0.0/16"),
        ("http://10.0.0.7/h", "10.0.0.0/8"),
        ("http://[::1]:8080/h", "::1/128"),
    ],
)
def test_the_platforms_networks_are_closed_to_webhooks_unless_the_platform_opens_them(
    db: Database, tokens: Tokens, url: str, network: str
):
    closed = ServerSettings(database_url=db.url.render_as_string(hide_password=False))
    with TestClient(create_app(closed, db)) as default_client:
        refused = default_client.post(HOOKS, json={"url": url}, headers=tokens("admin"))
        assert refused.status_code == 422, refused.text
        (error,) = refused.json()["errors"]
        assert error["field"] == "url"
        assert network in error["message"], error
        assert default_client.get(HOOKS, headers=tokens("admin")).json()["items"] == []


def test_webhooks_are_only_for_projects_that_can_exist(client: TestClient, tokens: Tokens):
    for project in ("*", "Not_A_Label"):
        refused = client.post(
            f"/api/v1/projects/{project}/webhooks",
            json={"url": "https://hooks.example.org/kt"},
            headers=tokens("admin", "*"),
        )
        assert refused.status_code == 422, refused.text
        assert [e["field"] for e in refused.json()["errors"]] == ["project"]


def test_event_ids_are_random_and_the_source_names_the_installation(
    client: TestClient, tokens: Tokens, db: Database, receiver: Receiver
):
    """Ids carry no counter another project's activity would move, and source + id never
    repeat across installations (each database has its own installation id)."""
    created = client.post(HOOKS, json={"url": receiver.url}, headers=tokens("admin"))
    assert created.status_code == 201, created.text
    mine = submitted(client, tokens, "mine")
    for index in range(3):  # another project's activity in between
        other = client.post(
            f"/api/v1/projects/{OTHER}/jobs",
            json=training_job(f"theirs-{index}"),
            headers=tokens("submitter", OTHER),
        )
        assert other.status_code == 201, other.text
    assert client.post(f"{JOBS}/{mine}/cancel", headers=tokens("submitter")).status_code == 200
    assert rounds(db, datetime.now(UTC)) == 2
    first, second = receiver.events()
    assert re.fullmatch(r"[0-9a-f]{32}-state_changed", first["id"]), first["id"]
    assert re.fullmatch(r"[0-9a-f]{32}-state_changed", second["id"]), second["id"]
    assert first["id"][:32] != second["id"][:32]
    source = first["source"]
    assert re.fullmatch(r"urn:uuid:[0-9a-f-]{36}", source), source
    assert second["source"] == source
    with db.read_only() as session:
        assert source == f"urn:uuid:{installation_id(session)}"


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_a_history_row_that_commits_late_is_delivered_in_its_jobs_order(
    client: TestClient, tokens: Tokens, db: Database, receiver: Receiver
):
    """On PostgreSQL a transaction can commit its history rows after later rows of other
    jobs have committed and been delivered (SQLite has one writer at a time, so rows
    commit in id order there). Held open past the old 2 s settle window while later rows
    are delivered, its row still reaches the receiver, after its job's earlier rows."""
    created = client.post(HOOKS, json={"url": receiver.url}, headers=tokens("admin"))
    assert created.status_code == 201, created.text
    held_job = submitted(client, tokens, "held")
    with db.transaction() as held:
        opened = time.monotonic()
        row = apply_business_change(
            held, held_job, BusinessState.CANCELLED, ReasonCode.CANCELLED, source=Source.API
        )
        assert row is not None
        held.flush()  # its id is taken; it commits only when the block ends
        later = [submitted(client, tokens, f"later-{index}") for index in range(2)]

        def later_delivered() -> bool:
            rounds(db, datetime.now(UTC))
            heard = {e["data"]["job"]["id"] for e in receiver.events()}
            return set(later) <= heard and time.monotonic() - opened > OLD_SETTLE_SECONDS

        eventually(later_delivered, 30, interval=0.2, what="the later jobs' events")
        assert row.id < max(
            r.id for r in _business_rows(db, later)
        )  # the held row's id is lower than rows already delivered
    assert rounds(db, datetime.now(UTC)) == 1
    by_job: dict[str, list[str]] = {}
    for event in receiver.events():
        by_job.setdefault(event["data"]["job"]["id"], []).append(event["data"]["job"]["state"])
    assert by_job == {
        held_job: ["CREATED", "CANCELLED"],
        later[0]: ["CREATED"],
        later[1]: ["CREATED"],
    }


OLD_SETTLE_SECONDS = 2.0  # the window the notifier once trusted every transaction to commit in


def _business_rows(db: Database, job_ids: list[str]) -> list[Transition]:
    with db.read_only() as session:
        return list(session.scalars(select(Transition).where(Transition.job_id.in_(job_ids))))
