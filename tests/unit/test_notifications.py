"""Webhook bodies and signatures (domain/notifications.py) and the notifier's backoff."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from kubetrain.control.notifier import BACKOFF_MAX_SECONDS, backoff
from kubetrain.domain.notifications import (
    EventType,
    Notification,
    event_types_for,
    new_secret,
    sign,
    url_problem,
)

pytestmark = pytest.mark.unit


def test_signatures_reproduce_the_standard_webhooks_test_vector():
    # The vector published with the Standard Webhooks reference libraries: a
    # receiver's stock verifier accepts what kubetrain signs.
    assert (
        sign(
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            b'{"test": 2432232314}',
        )
        == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    )


def test_new_secrets_are_random_and_in_the_format():
    one, two = new_secret(), new_secret()
    assert one != two
    assert one.startswith("whsec_")
    assert sign(one, "m", 1, b"x") != sign(two, "m", 1, b"x")


def test_the_body_is_a_structured_cloudevent_and_the_headers_sign_it():
    at = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
    note = Notification(
        id="kt-7-state_changed",
        type=EventType.STATE_CHANGED,
        time=at,
        job={"id": "j1", "project": "ai", "name": "train", "state": "RUNNING"},
        change={"fromState": "QUEUED", "toState": "RUNNING"},
        diagnosis=None,
    )
    event = json.loads(note.body())
    assert event["specversion"] == "1.0"
    assert event["type"] == "io.kubetrain.job.state_changed"
    assert event["subject"] == "projects/ai/jobs/j1"
    assert event["id"] == "kt-7-state_changed"
    assert event["time"] == "2026-12-04T12:00:00Z"
    assert event["data"]["job"]["state"] == "RUNNING"
    secret = new_secret()
    headers = note.headers(secret, 1_800_000_000)
    assert headers["content-type"] == "application/cloudevents+json"
    assert headers["webhook-id"] == note.id
    assert headers["webhook-signature"] == sign(secret, note.id, 1_800_000_000, note.body())


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("ftp://example.org/x", "must be an http:// or https:// URL"),
        ("https://user:pw@example.org/hook", "must not carry credentials"),
        ("https://token@example.org/hook", "must not carry credentials"),
        ("http:///nohost", "must name a host"),
        ("http://example.org/a b", "must not contain spaces"),
        ("http://example.org:99999999/", "is not a URL"),
        ("https://example.org/" + "a" * 3000, "at most 2048"),
    ],
)
def test_receiver_urls_are_checked(url: str, problem: str):
    found = url_problem(url)
    assert found is not None
    assert problem in found


def test_good_urls_pass():
    assert url_problem("http://127.0.0.1:9000/hook?x=1") is None
    assert url_problem("https://hooks.example.org/kubetrain") is None


def test_which_events_a_transition_raises():
    assert event_types_for(
        "QUEUED", "RUNNING", "SCHEDULING", "TRAINING", waitable_before=True, waitable_now=None
    ) == [EventType.STATE_CHANGED]
    assert event_types_for(
        "QUEUED",
        "QUEUED",
        "SCHEDULING",
        "INSUFFICIENT_GPU",
        waitable_before=None,
        waitable_now=False,
    ) == [EventType.REASON_CHANGED, EventType.NOT_WAITABLE]
    # still not waitable: no second NOT_WAITABLE
    assert event_types_for(
        "QUEUED",
        "QUEUED",
        "INSUFFICIENT_GPU",
        "UNTOLERATED_TAINT",
        waitable_before=False,
        waitable_now=False,
    ) == [EventType.REASON_CHANGED]
    assert event_types_for(
        "RUNNING", "RUNNING", "TRAINING", "NO_PROGRESS", waitable_before=None, waitable_now=None
    ) == [EventType.REASON_CHANGED, EventType.NO_PROGRESS]


def test_backoff_grows_is_capped_and_jittered():
    assert backoff(1, lambda: 0.0) == 0.5
    assert backoff(1, lambda: 1.0) == 1.0
    assert backoff(4, lambda: 1.0) == 8.0
    assert backoff(100, lambda: 1.0) == BACKOFF_MAX_SECONDS
    assert backoff(100, lambda: 0.0) == BACKOFF_MAX_SECONDS / 2


def test_rows_are_delivered_only_once_their_id_has_settled():
    """A history id seen now may hide a lower id still in flight (PostgreSQL): only
    ids at most the highest seen `settle_seconds` ago are delivered."""
    from kubetrain.control.notifier import Notifier

    ticks = iter([0.0, 1.0, 2.5, 3.0])
    notifier = Notifier(None, None, settle_seconds=2.0, monotonic=lambda: next(ticks))
    assert notifier._settled_id(10) == 0  # t=0: nothing seen long enough
    assert notifier._settled_id(12) == 0  # t=1
    assert notifier._settled_id(15) == 10  # t=2.5: what was newest at t=0
    assert notifier._settled_id(16) == 12  # t=3: what was newest at t=1
