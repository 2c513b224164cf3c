"""Dashboard sessions kept server-side, so that signing out (or revoking the token) ends them.

JupyterHub's way: the browser holds a random session id (inside the signed
cookie, see api/web/sessions.py), the server holds the session; sign-out
deletes the row, and a replayed cookie then names nothing. Only the id's
SHA-256 is stored, as for tokens (256 random bits: a fast hash loses nothing).
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from kubetrain.store.models import Token, WebSession
from kubetrain.store.tokens import hash_token

SESSION_ID_BYTES = 32


def open_web_session(
    session: Session, token_id: str, *, lifetime: timedelta, now: datetime | None = None
) -> str:
    """A new session for the token; returns its id, which exists nowhere else afterwards.
    Sessions expired by now are removed on the way, so the table holds live ones only."""
    now = now if now is not None else datetime.now(UTC)
    session.execute(delete(WebSession).where(WebSession.expires_at <= now))
    session_id = secrets.token_urlsafe(SESSION_ID_BYTES)
    session.add(
        WebSession(
            id_hash=hash_token(session_id),
            token_id=token_id,
            created_at=now,
            expires_at=now + lifetime,
        )
    )
    return session_id


def web_session_token(
    session: Session, session_id: str, *, now: datetime | None = None
) -> Token | None:
    """The live token of a live session; None once signed out, expired or revoked."""
    now = now if now is not None else datetime.now(UTC)
    return session.scalars(
        select(Token)
        .join(WebSession, WebSession.token_id == Token.id)
        .where(
            WebSession.id_hash == hash_token(session_id),
            WebSession.expires_at > now,
            Token.revoked_at.is_(None),
        )
    ).one_or_none()


def close_web_session(session: Session, session_id: str) -> bool:
    """End the session (sign-out); False if it had ended already."""
    result = session.execute(delete(WebSession).where(WebSession.id_hash == hash_token(session_id)))
    return bool(result.rowcount)  # type: ignore[attr-defined]
