"""Web sign-in: an API token exchanged for a server-side session named by a signed cookie,
and CSRF tokens.

The cookie holds no token: only a random session id, an expiry and the
session's CSRF secret, signed with HMAC-SHA256 under the server's session key
(`KUBETRAIN_SESSION_SECRET`, shared by every API replica). The session itself
is a row (store/web_sessions.py) naming the token, so its role and project
come from the database as for a bearer request; signing out deletes the row
and revoking the token ends it too, both at the next request.

    kubetrain_session     the session: HttpOnly, SameSite=Lax, Secure over TLS
    kubetrain_signin      the sign-in form's CSRF value, before a session exists:
                          signed by the server with its expiry, so a value an
                          attacker made up is refused

Forms that change something carry the CSRF value in a hidden field; a POST
whose field does not match the session's is refused (SameSite=Lax keeps the
cookie off cross-site POSTs as well; the token is the check that does not
depend on the browser). The sign-in form is also refused when the browser
says it came from another site (`Origin`, `Sec-Fetch-Site`): no page elsewhere
can sign a user in as the attacker (login CSRF).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass

SESSION_COOKIE = "kubetrain_session"
SIGNIN_COOKIE = "kubetrain_signin"
SESSION_SECONDS = 12 * 3600  # a working day; signing in again takes one paste
SIGNIN_SECONDS = 3600  # how long a sign-in form stays good
CSRF_FIELD = "csrf_token"


@dataclass(frozen=True, slots=True)
class WebSession:
    session_id: str  # names the server-side row (store.web_session_token)
    csrf: str
    expires: int  # Unix seconds


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class SessionSigner:
    """Issues and reads session cookie values under one key."""

    def __init__(self, key: bytes) -> None:
        # Derived, so the configured secret itself never signs anything else.
        self._key = hmac.new(key, b"kubetrain web session v1", hashlib.sha256).digest()

    def _mac(self, payload: str) -> str:
        return _b64(hmac.new(self._key, payload.encode(), hashlib.sha256).digest())

    def issue(self, session_id: str, *, now: int) -> tuple[str, WebSession]:
        session = WebSession(session_id, secrets.token_urlsafe(32), now + SESSION_SECONDS)
        payload = _b64(json.dumps([session.session_id, session.csrf, session.expires]).encode())
        return f"{payload}.{self._mac(payload)}", session

    def read(self, value: str | None, *, now: int) -> WebSession | None:
        """The session in a cookie value; None if absent, forged, damaged or expired."""
        fields = self._verified(value, now=now)
        if fields is None or len(fields) != 3:
            return None
        session_id, csrf, expires = fields
        if not (isinstance(session_id, str) and isinstance(csrf, str)):
            return None
        assert isinstance(expires, int)  # _verified checked it
        return WebSession(session_id, csrf, expires)

    def issue_signin(self, *, now: int) -> str:
        """A sign-in form's CSRF value: random, and signed with its expiry."""
        payload = _b64(
            json.dumps(["signin", secrets.token_urlsafe(32), now + SIGNIN_SECONDS]).encode()
        )
        return f"{payload}.{self._mac(payload)}"

    def signin_is_valid(self, value: str | None, *, now: int) -> bool:
        """Whether `value` is a sign-in CSRF value this server issued and still honours."""
        fields = self._verified(value, now=now)
        return fields is not None and len(fields) == 3 and fields[0] == "signin"

    def _verified(self, value: str | None, *, now: int) -> list[object] | None:
        """The signed fields of a value whose last field is an unexpired expiry."""
        if not value or value.count(".") != 1:
            return None
        payload, mac = value.split(".")
        if not hmac.compare_digest(mac, self._mac(payload)):
            return None
        try:
            fields = json.loads(_unb64(payload))
        except (ValueError, TypeError):
            return None
        if not isinstance(fields, list) or not fields:
            return None
        expires = fields[-1]
        if not isinstance(expires, int) or expires <= now:
            return None
        return fields


def same_secret(expected: str, given: str | None) -> bool:
    """A CSRF comparison in constant time; a missing value never matches."""
    return bool(given) and hmac.compare_digest(expected.encode(), (given or "").encode())
