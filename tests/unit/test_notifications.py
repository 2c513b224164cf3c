"""Webhook bodies and signatures (domain/notifications.py), the networks closed to
webhooks (domain/networks.py) and the notifier's backoff."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from ipaddress import ip_address

import pytest

from kubetrain.control.notifier import BACKOFF_MAX_SECONDS, backoff
from kubetrain.domain.networks import address_refusal, networks
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
        source="urn:uuid:0b5c6f7e-2f0a-4c1e-9d43-2a7c3e1f5b6d",
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
    assert event["source"] == "urn:uuid:0b5c6f7e-2f0a-4c1e-9d43-2a7c3e1f5b6d"
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
        # Bidirectional and invisible controls make a URL read otherwise than where it goes.
        ("https://example.org/\u202egpj.exe", "U+202E RIGHT-TO-LEFT OVERRIDE"),
        ("https://exa\u200emple.org/", "U+200E LEFT-TO-RIGHT MARK"),
        ("https://example.org/\u2066x\u2069", "U+2066 LEFT-TO-RIGHT ISOLATE"),
        ("https://example.org/\u200bx", "U+200B ZERO WIDTH SPACE"),
        ("https://example.org/\ufeffx", "U+FEFF"),
        ("https://example.org/\u0085x", "U+0085"),
        ("https://example.org/a\u00a0b", "U+00A0 NO-BREAK SPACE"),
        # The platform's own networks, written as addresses, are refused at creation.
        ("http://169.254.169.254/latest/meta-data", "169.254.0.0/16 is closed"),
        ("http://10.0.0.7/hook", "10.0.0.0/8 is closed to webhooks (private, RFC 1918)"),
        ("http://127.0.0.1:9000/hook", "127.0.0.0/8 is closed to webhooks (loopback)"),
        ("http://[::1]:9000/hook", "::1/128 is closed to webhooks (loopback)"),
        ("http://[::ffff:169.254.169.254]/", "169.254.0.0/16"),
        ("http://[fd00::1]/", "fc00::/7 is closed to webhooks (private, unique local)"),
        ("http://[fe80::1]/", "fe80::/10"),
        ("http://0.0.0.0:8080/", "0.0.0.0/8"),
        ("http://224.0.0.1/", "multicast"),
        ("http://240.0.0.1/", "reserved"),
        ("http://192.168.1.1/", "192.168.0.0/16"),
        ("http://172.16.0.1/", "172.16.0.0/12"),
    ],
)
def test_receiver_urls_are_checked(url: str, problem: str):
    found = url_problem(url)
    assert found is not None
    assert problem in found


def test_good_urls_pass():
    assert url_problem("https://hooks.example.org/kubetrain") is None
    assert url_problem("http://93.184.215.14:9000/hook?x=1") is None
    assert url_problem("http://[2606:4700::1111]/hook") is None
    # An internationalized name is no control character.
    assert url_problem("https://bücher.example/hook") is None
    # The platform may open a closed network, and only that one.
    allowed = networks(["127.0.0.0/8", "fd00::/8"])
    assert url_problem("http://127.0.0.1:9000/hook", allowed) is None
    assert url_problem("http://[fd00::1]/", allowed) is None
    assert url_problem("http://[::ffff:127.0.0.1]/", allowed) is None
    assert url_problem("http://10.0.0.7/", allowed) is not None


@pytest.mark.parametrize(
    ("address", "closed"),
    [
        ("100.64.0.1", "100.64.0.0/10"),
        ("198.18.0.1", "198.18.0.0/15"),
        ("255.255.255.255", "240.0.0.0/4"),
        ("64:ff9b::a9fe:a9fe", "169.254.0.0/16"),  # NAT64 of 169.254.169.254
        ("2002:7f00:1::", "127.0.0.0/8"),  # 6to4 of 127.0.0.1
        ("ff02::1", "ff00::/8"),
        ("2001:db8::1", "2001:db8::/32"),
    ],
)
def test_every_closed_network_is_named(address: str, closed: str):
    refusal = address_refusal(ip_address(address))
    assert refusal is not None
    assert closed in refusal


def test_public_addresses_pass_and_allowed_networks_must_be_cidrs():
    assert address_refusal(ip_address("8.8.8.8")) is None
    assert address_refusal(ip_address("2001:4860:4860::8888")) is None
    with pytest.raises(ValueError, match=r"'10\.0\.0\.1/8' is not a CIDR"):
        networks(["10.0.0.1/8"])


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
