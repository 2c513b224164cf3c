"""API bearer tokens: created once, stored as a hash, checked on every request.

Only the SHA-256 of a token is stored. A slow, salted password hash (bcrypt,
argon2) protects secrets people choose, which are guessable; our tokens are 256
random bits, so no guess list exists and a fast hash loses nothing, while it
keeps the lookup one indexed equality on the hash (a salted hash would force
checking every row) and costs microseconds per request instead of ~100 ms.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from kubetrain.store.models import ALL_PROJECTS, Role, Token

TOKEN_PREFIX = "kt_"  # noqa: S105 - not a secret; recognisable in logs and by secret scanners
TOKEN_BYTES = 32
DISPLAY_PREFIX_LENGTH = len(TOKEN_PREFIX) + 6  # enough to tell tokens apart, useless to guess
# last_used_at is for humans deciding what to revoke; minute resolution saves a
# write on almost every request.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def hash_token(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode()).hexdigest()


def create_token(
    session: Session,
    *,
    name: str,
    role: Role,
    project: str,
    now: datetime | None = None,
) -> tuple[Token, str]:
    """A new token for `project` (or `ALL_PROJECTS`); returns the row and the plaintext,
    which exists nowhere else afterwards."""
    plaintext = TOKEN_PREFIX + secrets.token_urlsafe(TOKEN_BYTES)
    token = Token(
        id=str(uuid.uuid4()),
        name=name,
        token_hash=hash_token(plaintext),
        prefix=plaintext[:DISPLAY_PREFIX_LENGTH],
        role=Role(role),
        project=project,
        created_at=now if now is not None else datetime.now(UTC),
    )
    session.add(token)
    session.flush()
    return token, plaintext


def find_token(session: Session, plaintext: str) -> Token | None:
    """The live token with that plaintext, or None; reads only, so a read-only session does.

    The API checks tokens this way and calls `authenticate_token` (a write)
    only when `use_is_stale` says `last_used_at` is due, so a read request
    takes no write lock.
    """
    return session.scalars(
        select(Token).where(Token.token_hash == hash_token(plaintext), Token.revoked_at.is_(None))
    ).one_or_none()


def find_live_token_by_id(session: Session, token_id: str) -> Token | None:
    """The token with that id unless revoked: a web session names its token by id, so a
    revocation ends the session at its next request."""
    return session.scalars(
        select(Token).where(Token.id == token_id, Token.revoked_at.is_(None))
    ).one_or_none()


def use_is_stale(token: Token, *, now: datetime | None = None) -> bool:
    """Whether `authenticate_token` would record this use (last_used_at over a minute old)."""
    now = now if now is not None else datetime.now(UTC)
    return token.last_used_at is None or token.last_used_at < now - LAST_USED_RESOLUTION


def authenticate_token(
    session: Session, plaintext: str, *, now: datetime | None = None
) -> Token | None:
    """The live token with that plaintext, or None (unknown or revoked).

    Needs a read-write session: it records `last_used_at`, but writes only when
    the stored value is over a minute old.
    """
    now = now if now is not None else datetime.now(UTC)
    token = find_token(session, plaintext)
    if token is None:
        return None
    stale = now - LAST_USED_RESOLUTION
    if use_is_stale(token, now=now):
        # Conditional, so concurrent requests with one token write at most once.
        session.execute(
            update(Token)
            .where(
                Token.id == token.id,
                or_(Token.last_used_at.is_(None), Token.last_used_at < stale),
            )
            .values(last_used_at=now)
            .execution_options(synchronize_session=False)
        )
        # Show the caller the new value without making the ORM write it again.
        set_committed_value(token, "last_used_at", now)
    return token


def revoke_token(session: Session, token_id: str, *, now: datetime | None = None) -> bool:
    """Revoke the token; False if there is no such token or it was revoked already."""
    result = session.execute(
        update(Token)
        .where(Token.id == token_id, Token.revoked_at.is_(None))
        .values(revoked_at=now if now is not None else datetime.now(UTC))
        .execution_options(synchronize_session="fetch")
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


def list_tokens(
    session: Session, *, project: str | None = None, include_revoked: bool = False
) -> list[Token]:
    """Tokens, oldest first; `project` selects those scoped to exactly that project or `*`."""
    query = select(Token)
    if project is not None:
        query = query.where(Token.project.in_([project, ALL_PROJECTS]))
    if not include_revoked:
        query = query.where(Token.revoked_at.is_(None))
    return list(session.scalars(query.order_by(Token.created_at, Token.id)))
