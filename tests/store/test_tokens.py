"""API tokens: shown once, stored hashed, checked, revoked."""

from __future__ import annotations

import hashlib

import pytest
from sqlalchemy import event, text
from sqlalchemy.exc import IntegrityError

from kubetrain.store import (
    ALL_PROJECTS,
    Database,
    Role,
    Token,
    authenticate_token,
    create_token,
    find_token,
    list_tokens,
    revoke_token,
    use_is_stale,
)
from tests.store.builders import T0, at

pytestmark = pytest.mark.db


def test_only_a_hash_is_stored(db: Database) -> None:
    with db.transaction() as session:
        token, plaintext = create_token(
            session, name="ci", role=Role.SUBMITTER, project="ai-training", now=T0
        )
    assert plaintext.startswith("kt_")
    assert len(plaintext) >= 40
    with db.read_only() as session:
        rows = session.execute(text("SELECT * FROM tokens")).all()
    assert len(rows) == 1
    stored = [str(value) for value in rows[0]]
    assert not any(plaintext in value or plaintext[8:] in value for value in stored)
    assert hashlib.sha256(plaintext.encode()).hexdigest() in stored
    assert token.prefix == plaintext[: len(token.prefix)]
    assert len(token.prefix) <= 10


def test_authenticate_finds_live_tokens_only(db: Database) -> None:
    with db.transaction() as session:
        token, plaintext = create_token(
            session, name="alice", role=Role.VIEWER, project="ai-training", now=T0
        )
        _, other = create_token(session, name="bob", role=Role.ADMIN, project="*", now=T0)
    with db.transaction() as session:
        found = authenticate_token(session, plaintext, now=at(1))
        assert found is not None
        assert (found.id, found.role, found.project) == (token.id, Role.VIEWER, "ai-training")
        assert authenticate_token(session, plaintext + "x", now=at(1)) is None
        assert authenticate_token(session, "", now=at(1)) is None
        assert revoke_token(session, token.id, now=at(2)) is True
        assert revoke_token(session, token.id, now=at(3)) is False
        assert revoke_token(session, "no-such-token") is False
    with db.transaction() as session:
        assert authenticate_token(session, plaintext, now=at(4)) is None
        assert authenticate_token(session, other, now=at(4)) is not None


def test_last_use_is_recorded_about_once_a_minute(db: Database) -> None:
    with db.transaction() as session:
        token, plaintext = create_token(
            session, name="ci", role=Role.SUBMITTER, project="ai-training", now=T0
        )
    for seconds in (10, 30, 69, 71):
        with db.transaction() as session:
            authenticate_token(session, plaintext, now=at(seconds))
    with db.read_only() as session:
        stored = session.get(Token, token.id)
        assert stored is not None
        # 10 recorded, 30 and 69 within its minute, 71 recorded.
        assert stored.last_used_at == at(71)
    with db.transaction() as session:
        authenticate_token(session, plaintext, now=at(100))
    with db.read_only() as session:
        stored = session.get(Token, token.id)
        assert stored is not None
        assert stored.last_used_at == at(71)


def test_checking_a_token_writes_at_most_one_update(db: Database) -> None:
    with db.transaction() as session:
        _, plaintext = create_token(session, name="ci", role=Role.VIEWER, project="p", now=T0)
    statements: list[str] = []

    def record(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        statements.append(statement.split()[0].upper())

    event.listen(db.engine, "before_cursor_execute", record)
    try:
        for seconds in (1, 2):
            with db.transaction() as session:
                assert authenticate_token(session, plaintext, now=at(seconds)) is not None
    finally:
        event.remove(db.engine, "before_cursor_execute", record)
    assert statements.count("UPDATE") == 1  # the first check; the second is within the minute


def test_listing_and_scopes(db: Database) -> None:
    with db.transaction() as session:
        team, _ = create_token(session, name="a", role=Role.VIEWER, project="team-a", now=at(1))
        admin, _ = create_token(session, name="b", role=Role.ADMIN, project="*", now=at(2))
        other, _ = create_token(session, name="c", role=Role.VIEWER, project="team-b", now=at(3))
        revoke_token(session, other.id, now=at(4))
    with db.read_only() as session:
        assert [t.id for t in list_tokens(session)] == [team.id, admin.id]
        assert [t.id for t in list_tokens(session, include_revoked=True)] == [
            team.id,
            admin.id,
            other.id,
        ]
        assert [t.id for t in list_tokens(session, project="team-a")] == [team.id, admin.id]
    # What a scope lets a caller reach is asserted through the API (tests/api/test_auth.py).
    assert team.project == "team-a"
    assert admin.project == ALL_PROJECTS


def test_token_hashes_are_unique(db: Database) -> None:
    with db.transaction() as session:
        token, _ = create_token(session, name="a", role=Role.VIEWER, project="p", now=T0)
    copy = Token(id="copy", name="copy", token_hash=token.token_hash, prefix="kt_", project="*")
    copy.role, copy.created_at = Role.ADMIN, T0
    with pytest.raises(IntegrityError), db.transaction() as session:
        session.add(copy)


def test_find_token_reads_only_and_says_when_a_use_is_due(db: Database) -> None:
    with db.transaction() as session:
        token, plaintext = create_token(
            session, name="ci", role=Role.VIEWER, project="ai-training", now=T0
        )
    with db.read_only() as session:  # READ ONLY on PostgreSQL: a write would fail here
        found = find_token(session, plaintext)
        assert found is not None
        assert found.id == token.id
        assert found.last_used_at is None
        assert use_is_stale(found, now=T0)
        assert find_token(session, plaintext + "x") is None
    with db.transaction() as session:
        authenticate_token(session, plaintext, now=at(10))
    with db.read_only() as session:
        found = find_token(session, plaintext)
        assert found is not None
        assert not use_is_stale(found, now=at(30))
        assert use_is_stale(found, now=at(71))
    with db.transaction() as session:
        assert revoke_token(session, token.id, now=at(80))
    with db.read_only() as session:
        assert find_token(session, plaintext) is None
