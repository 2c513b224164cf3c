"""What a webhook receives: CloudEvents 1.0 JSON bodies, signed as Standard Webhooks.

The events come from the job's history: every business transition (state or
reason) is one row of `transitions`, written in the same transaction as the
change itself, so the history is the outbox (control/notifier.py delivers it).

* CloudEvents 1.0, structured JSON mode (`application/cloudevents+json`):
  `specversion`, `id`, `source`, `type`, `subject`, `time`, `datacontenttype`,
  `data`. `source` names the installation (`urn:uuid:` and an id made once and
  kept in its database) and `id` is random, made once for the event and kept
  until it is delivered: stable across retries, so a receiver can deduplicate
  on source + id, and it tells nothing of how many events other projects had.
* Standard Webhooks: `webhook-id` (the event's id), `webhook-timestamp` (Unix
  seconds of this attempt), `webhook-signature` = `v1,` + base64 of
  HMAC-SHA256(key, f"{id}.{timestamp}.{body}"), the key being the base64 after
  the secret's `whsec_` prefix.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import unicodedata
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from kubetrain.domain.events import EventType
from kubetrain.domain.networks import Network, address_refusal, literal_address

__all__ = [
    "SECRET_PREFIX",
    "EventType",
    "Notification",
    "event_types_for",
    "new_secret",
    "sign",
    "url_problem",
]

SECRET_PREFIX = "whsec_"  # noqa: S105 - the format's prefix, not a secret
CONTENT_TYPE = "application/cloudevents+json"
MAX_URL_LENGTH = 2048


def new_secret() -> str:
    """A signing secret in the Standard Webhooks format (shown once)."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(24)).decode()


def sign(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header for one delivery attempt."""
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def url_problem(url: str, allowed: Iterable[Network] = ()) -> str | None:
    """Why `url` cannot receive webhooks, or None. Credentials never go in a URL:
    it is shown in lists and logs, and the signature is the receiver's proof.
    A host written as an address is checked here against the closed networks
    (domain/networks.py; `allowed` opens some); a name, when it is resolved."""
    if len(url) > MAX_URL_LENGTH:
        return f"must be at most {MAX_URL_LENGTH} characters"
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in url):
        return "must not contain spaces or control characters"
    if hidden := next((c for c in url if _invisible(c)), None):
        # A bidirectional override makes the URL read otherwise than where it goes.
        return (
            "must not contain invisible or bidirectional control characters "
            f"(U+{ord(hidden):04X} {unicodedata.name(hidden, 'unnamed')})"
        )
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is no number
    except ValueError as exc:
        return f"is not a URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return f"must be an http:// or https:// URL, got scheme {parts.scheme or 'none'!r}"
    if not parts.hostname:
        return "must name a host"
    if parts.username is not None or parts.password is not None:
        return "must not carry credentials (user:password@); receivers check the signature"
    if parts.fragment:
        return "must not have a #fragment"
    address = literal_address(parts.hostname)
    if address is not None and (refusal := address_refusal(address, allowed)):
        return f"must not point into the platform's networks: {address} is in {refusal}"
    return None


def _invisible(char: str) -> bool:
    """A character that shows as nothing or reorders what follows: format characters
    (U+200E/F, U+202A-E, U+2066-9, zero widths, soft hyphen...), C1 controls, and
    separators other than the plain space (refused with the controls above)."""
    return (
        unicodedata.category(char) in ("Cf", "Cc", "Zs", "Zl", "Zp", "Co", "Cn")
        and ord(char) > 0x7F
    )


def event_types_for(
    from_state: str | None,
    to_state: str | None,
    from_reason: str | None,
    to_reason: str | None,
    *,
    waitable_before: bool | None,
    waitable_now: bool | None,
) -> list[EventType]:
    """The events one business transition raises: a state change, else a reason
    change; a job becoming not waitable; a job that stopped progressing."""
    found: list[EventType] = []
    if from_state != to_state:
        found.append(EventType.STATE_CHANGED)
    elif from_reason != to_reason:
        found.append(EventType.REASON_CHANGED)
    if waitable_now is False and waitable_before is not False:
        found.append(EventType.NOT_WAITABLE)
    if to_reason == "NO_PROGRESS" and from_reason != "NO_PROGRESS":
        found.append(EventType.NO_PROGRESS)
    return found


@dataclass(frozen=True, slots=True)
class Notification:
    """One CloudEvent about one job."""

    id: str
    source: str  # the installation (its id as a URN), so that source + id never repeat
    type: EventType
    time: datetime
    job: Mapping[str, Any]  # id, project, name, state, reason, attempt
    change: Mapping[str, Any]  # from/to state and reason, raw reason, source
    diagnosis: Mapping[str, Any] | None  # summary: link, explanation, action, actor, waitable

    @property
    def subject(self) -> str:
        return f"projects/{self.job['project']}/jobs/{self.job['id']}"

    def body(self) -> bytes:
        event = {
            "specversion": "1.0",
            "id": self.id,
            "source": self.source,
            "type": str(self.type),
            "subject": self.subject,
            "time": self.time.isoformat().replace("+00:00", "Z"),
            "datacontenttype": "application/json",
            "data": {
                "job": dict(self.job),
                "change": dict(self.change),
                "diagnosis": dict(self.diagnosis) if self.diagnosis else None,
            },
        }
        return json.dumps(event, separators=(",", ":"), sort_keys=True).encode()

    def headers(self, secret: str, timestamp: int) -> dict[str, str]:
        body = self.body()
        return {
            "content-type": CONTENT_TYPE,
            "webhook-id": self.id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": sign(secret, self.id, timestamp, body),
        }


def wanted(event: EventType, subscribed: Collection[str]) -> bool:
    """An empty subscription means every event type."""
    return not subscribed or str(event) in subscribed
