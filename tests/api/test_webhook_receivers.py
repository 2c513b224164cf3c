"""Hostile webhook receivers, real ones on loopback (opened to webhooks by the settings):
one that trickles its answer, one that answers 10 MB, one that redirects to the cloud's
metadata service; a name that resolves to loopback, refused unless loopback is opened;
and another project's events, delivered while a trickling receiver is still being
served. The notifier's code does not depend on the database: SQLite only."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from ipaddress import ip_address
from typing import Any

import pytest
from fastapi.testclient import TestClient

from kubetrain.control.notifier import Notifier
from kubetrain.delivery import ANSWER_CAP, webhook_poster
from kubetrain.domain.networks import Address, networks
from kubetrain.settings import ServerSettings
from kubetrain.store import Database
from tests.api.builders import OTHER, PROJECT, Tokens, submitted, training_job
from tests.api.test_webhooks import LOOPBACK, Receiver, rounds
from tests.kube import eventually

pytestmark = [pytest.mark.db, pytest.mark.parametrize("backend", ["sqlite"], indirect=True)]

HOOKS = f"/api/v1/projects/{PROJECT}/webhooks"
METADATA = "http://169.254.169.254/latest/meta-data/iam/security-credentials/"
HUGE = 10 * 1024 * 1024


@pytest.fixture
def settings(db: Database) -> ServerSettings:
    return ServerSettings(
        database_url=db.url.render_as_string(hide_password=False),
        webhook_allowed_networks=LOOPBACK,
    )


class Hostile:
    """A real HTTP server on loopback whose answer to every POST is `answer(handler)`."""

    def __init__(self, answer: Callable[[Hostile, BaseHTTPRequestHandler], None]) -> None:
        self.requests: list[dict[str, str]] = []
        self.answering = threading.Event()  # a request came, its answer is being written
        self.cut = threading.Event()  # the sender closed the connection mid-answer
        self.done = threading.Event()  # an answer was written whole
        self.stop = threading.Event()
        hostile = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["content-length"]))
                hostile.requests.append({k.lower(): v for k, v in self.headers.items()})
                hostile.answering.set()
                try:
                    answer(hostile, self)
                    self.wfile.flush()
                    hostile.done.set()
                except OSError:  # broken pipe, reset: the sender gave up on the answer
                    hostile.cut.set()

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


def trickle(hostile: Hostile, handler: BaseHTTPRequestHandler) -> None:
    """200 and a body of 100 bytes, one byte every half second (50 s in all)."""
    handler.send_response(200)
    handler.send_header("content-length", "100")
    handler.end_headers()
    for _ in range(100):
        handler.wfile.write(b"x")
        handler.wfile.flush()
        if hostile.stop.wait(0.5):
            return


def huge(hostile: Hostile, handler: BaseHTTPRequestHandler) -> None:
    """200 and 10 MB, through a small send buffer, so that what the sender does not
    read cannot all sit in the kernel's buffers."""
    handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    handler.send_response(200)
    handler.send_header("content-length", str(HUGE))
    handler.end_headers()
    chunk = b"x" * 65536
    for _ in range(HUGE // len(chunk)):
        handler.wfile.write(chunk)


def redirect(hostile: Hostile, handler: BaseHTTPRequestHandler) -> None:
    handler.send_response(302)
    handler.send_header("location", METADATA)
    handler.send_header("content-length", "0")
    handler.end_headers()


@pytest.fixture
def hostile(request: pytest.FixtureRequest) -> Iterator[Hostile]:
    server = Hostile(request.param)
    yield server
    server.close()


def only_webhook(client: TestClient, tokens: Tokens) -> dict[str, Any]:
    (hook,) = client.get(HOOKS, headers=tokens("admin")).json()["items"]
    return dict(hook)


def create(client: TestClient, tokens: Tokens, url: str, project: str = PROJECT) -> None:
    created = client.post(
        f"/api/v1/projects/{project}/webhooks", json={"url": url}, headers=tokens("admin", project)
    )
    assert created.status_code == 201, created.text


@pytest.mark.parametrize("hostile", [trickle], indirect=True)
def test_a_trickling_receiver_is_cut_off_at_the_deadline(
    client: TestClient, tokens: Tokens, db: Database, hostile: Hostile
):
    """The deadline is the whole exchange's: a byte every half second renews no timeout."""
    create(client, tokens, hostile.url)
    submitted(client, tokens, "slowly")
    assert rounds(db, datetime.now(UTC), timeout=1.5) == 0
    eventually(hostile.cut.is_set, 10, what="the trickled answer cut off")
    assert not hostile.done.is_set()
    hook = only_webhook(client, tokens)
    assert (hook["status"], hook["delivered"]) == ("failing", 0)
    assert hook["lastError"] == "no complete answer within 1.5 s"


@pytest.mark.parametrize("hostile", [huge], indirect=True)
def test_a_10_mb_answer_is_read_only_up_to_the_cap(
    client: TestClient, tokens: Tokens, db: Database, hostile: Hostile
):
    create(client, tokens, hostile.url)
    submitted(client, tokens, "chatty")
    assert rounds(db, datetime.now(UTC)) == 1  # a 2xx is a 2xx, whatever follows it
    eventually(hostile.cut.is_set, 10, what="the 10 MB answer dropped with the connection")
    assert not hostile.done.is_set()
    assert ANSWER_CAP < HUGE
    hook = only_webhook(client, tokens)
    assert (hook["status"], hook["delivered"]) == ("ok", 1)


@pytest.mark.parametrize("hostile", [redirect], indirect=True)
def test_a_redirect_to_the_metadata_service_is_not_followed(
    client: TestClient, tokens: Tokens, db: Database, hostile: Hostile
):
    create(client, tokens, hostile.url)
    submitted(client, tokens, "moved")
    assert rounds(db, datetime.now(UTC)) == 0
    assert len(hostile.requests) == 1
    hook = only_webhook(client, tokens)
    assert hook["status"] == "failing"
    assert hook["lastError"] == "the receiver answered HTTP 302; redirects are not followed"


def test_a_name_that_resolves_to_loopback_is_refused_unless_loopback_is_opened(
    client: TestClient, tokens: Tokens, db: Database
):
    """`localhost` is a name, so the API takes it; the notifier resolves it and refuses
    the address, saying which rule, and the receiver hears nothing."""
    receiver = Receiver()
    try:
        create(client, tokens, f"http://localhost:{receiver.server.server_address[1]}/hook")
        job = submitted(client, tokens, "named")
        now = datetime.now(UTC)
        assert rounds(db, now, allowed=()) == 0
        assert receiver.received == []
        hook = only_webhook(client, tokens)
        assert hook["status"] == "failing"
        assert hook["lastError"].startswith("the receiver's address is refused: ")
        assert "is closed to webhooks (loopback)" in hook["lastError"]
        # Opened by the platform, the same webhook is delivered (to 127.0.0.1 even where
        # localhost resolves to ::1 first: each address is checked, the first allowed used).
        assert rounds(db, now + timedelta(seconds=2)) == 1
        assert [e["data"]["job"]["id"] for e in receiver.events()] == [job]
    finally:
        receiver.server.shutdown()


def test_the_connection_goes_to_the_address_checked_with_the_name_kept(
    client: TestClient, tokens: Tokens, db: Database
):
    """No second resolution (DNS rebinding): the name is resolved once per delivery, the
    connection made to the address checked, and the receiver still sees its name."""
    receiver = Receiver()
    port = receiver.server.server_address[1]
    asked: list[str] = []

    async def rebinding(host: str, _port: int) -> list[Address]:
        asked.append(host)  # first loopback (opened here), then the metadata service
        return [ip_address("127.0.0.1" if len(asked) == 1 else "169.254.169.254")]

    async def deliver() -> int:
        allowed = networks(LOOPBACK)
        async with webhook_poster(allowed_networks=allowed, resolve=rebinding) as post:
            return await Notifier(db, post).round()

    try:
        create(client, tokens, f"http://hooks.rebind.test:{port}/hook")
        submitted(client, tokens, "rebound")
        assert asyncio.run(deliver()) == 1
        assert asked == ["hooks.rebind.test"]
        ((headers, _),) = receiver.received
        assert headers["host"] == f"hooks.rebind.test:{port}"
    finally:
        receiver.server.shutdown()


@pytest.mark.parametrize("hostile", [trickle], indirect=True)
def test_another_projects_events_arrive_while_a_trickling_receiver_is_served(
    client: TestClient, tokens: Tokens, db: Database, hostile: Hostile
):
    """The notifier's own loop, with the default 10 s deadline: project A's receiver
    trickles; project B's event, committed meanwhile, arrives while A's is still being
    served, within a bound (the issue asks for 2 s at p99; bench/ measures it)."""
    fast = Receiver()
    stop = threading.Event()

    def notify() -> None:
        async def main() -> None:
            async with webhook_poster(allowed_networks=networks(LOOPBACK)) as post:
                loop = asyncio.create_task(Notifier(db, post, interval=0.1).run())
                await asyncio.to_thread(stop.wait)
                loop.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await loop

        asyncio.run(main())

    notifier = threading.Thread(target=notify, daemon=True)
    try:
        create(client, tokens, hostile.url)
        create(client, tokens, fast.url, OTHER)
        notifier.start()
        submitted(client, tokens, "slow-receiver")
        eventually(hostile.answering.is_set, 10, interval=0.05, what="the trickle to begin")
        theirs = client.post(
            f"/api/v1/projects/{OTHER}/jobs",
            json=training_job("beside"),
            headers=tokens("submitter", OTHER),
        )
        assert theirs.status_code == 201, theirs.text
        eventually(lambda: fast.received, 5, interval=0.05, what="the other project's event")
        assert not hostile.cut.is_set(), "the trickle had been cut off"
        assert not hostile.done.is_set(), "the trickle had ended"
        (event,) = (json.loads(body) for _, body in fast.received)
        assert event["data"]["job"]["id"] == theirs.json()["id"]
    finally:
        stop.set()
        notifier.join(30)
        fast.server.shutdown()
