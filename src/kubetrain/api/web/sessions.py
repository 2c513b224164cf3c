"""Web sign-in: an API token exchanged for a signed session cookie, and CSRF tokens.

The cookie holds no token: only the token's id, an expiry and the session's
CSRF secret, signed with HMAC-SHA256 under the server's session key
(`KUBETRAIN_SESSION_SECRET`, shared by every API replica). Each request looks
the token up by id, so its role and project come from the database as for a
bearer request, and revoking the token ends the session at once.

    kubetrain_session     the session: HttpOnly, SameSite=Lax, Secure over TLS
    kubetrain_signin      the sign-in form's CSRF value, before a session exists

Forms that change something carry the CSRF value in a hidden field; a POST
whose field does not match the session's is refused (SameSite=Lax keeps the
cookie off cross-site POSTs as well; the token is the check that does not
depend on the browser).
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
CSRF_FIELD = "csrf_token"


@dataclass(frozen=True, slots=True)
class WebSession:
    token_id: str
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

    def issue(self, token_id: str, *, now: int) -> tuple[str, WebSession]:
        session = WebSession(token_id, secrets.token_urlsafe(32), now + SESSION_SECONDS)
        payload = _b64(json.dumps([session.token_id, session.csrf, session.expires]).encode())
        return f"{payload}.{self._mac(payload)}", session

    def read(self, value: str | None, *, now: int) -> WebSession | None:
        """The session in a cookie value; None if absent, forged, damaged or expired."""
        if not value or value.count(".") != 1:
            return None
        payload, mac = value.split(".")
        if not hmac.compare_digest(mac, self._mac(payload)):
            return None
        try:
            token_id, csrf, expires = json.loads(_unb64(payload))
        except (ValueError, TypeError):
            return None
        if not (isinstance(token_id, str) and isinstance(csrf, str) and isinstance(expires, int)):
            return None
        if expires <= now:
            return None
        return WebSession(token_id, csrf, expires)


def same_secret(expected: str, given: str | None) -> bool:
    """A CSRF comparison in constant time; a missing value never matches."""
    return bool(given) and hmac.compare_digest(expected.encode(), (given or "").encode())
