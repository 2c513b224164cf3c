"""`kubetrain token create | list | revoke`: API tokens, written to the database directly.

Direct, not through the API, because this is how the first admin token is
made, before any token exists; it needs what the server needs
(`KUBETRAIN_DATABASE_URL`) and migrates the database first, as the server does
at start. `create` prints the token alone on stdout (`export
KUBETRAIN_TOKEN=$(kubetrain token create ...)`); it is stored only as a hash,
so it is shown this once.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from kubetrain.cli._errors import CommandError, settings_error
from kubetrain.cli._output import emit, short_time, table
from kubetrain.domain import names

if TYPE_CHECKING:
    from kubetrain.store import Database, Token


@contextmanager
def _database(args: argparse.Namespace) -> Iterator[Database]:
    # Imported here: the store (SQLAlchemy, Alembic) takes a second to load,
    # which no other command should pay.
    from sqlalchemy.exc import SQLAlchemyError

    from kubetrain.settings import ServerSettings
    from kubetrain.store import Database

    try:
        settings = ServerSettings.load(database_url=args.database_url)
    except ValidationError as exc:
        raise settings_error(exc, "server") from None
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    try:
        db = Database(settings.database_url)
    except Exception as exc:  # a malformed URL; an unknown driver
        raise CommandError(f"cannot use the database URL: {exc}") from None
    where = db.url.render_as_string(hide_password=True)
    try:
        db.upgrade()
        yield db
    except SQLAlchemyError as exc:
        reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        raise CommandError(f"cannot use the database {where}: {reason}") from None
    finally:
        db.dispose()


def _check_project(project: str) -> None:
    from kubetrain.store import ALL_PROJECTS

    if project != ALL_PROJECTS and (problem := names.dns1123_label_problem(project)):
        raise CommandError(f"--project: {problem} (or '*' for every project)")


def _create(args: argparse.Namespace) -> int:
    from kubetrain.store import Role, create_token

    _check_project(args.project)
    name = args.name or f"{args.role}-{'all' if args.project == '*' else args.project}"
    with _database(args) as db, db.transaction() as session:
        token, plaintext = create_token(
            session, name=name, role=Role(args.role), project=args.project
        )
        summary = f"{token.name} ({token.role} on {token.project}, id {token.id})"
    print(plaintext)
    print(f"created token {summary}; it is shown only now", file=sys.stderr)
    return 0


def _row(token: Token) -> dict[str, Any]:
    def when(value: Any) -> str | None:
        return value.isoformat() if value is not None else None

    return {
        "id": token.id,
        "name": token.name,
        "prefix": token.prefix,
        "role": str(token.role),
        "project": token.project,
        "created_at": when(token.created_at),
        "last_used_at": when(token.last_used_at),
        "revoked_at": when(token.revoked_at),
    }


def _list(args: argparse.Namespace) -> int:
    from kubetrain.store import list_tokens

    with _database(args) as db, db.read_only() as session:
        rows = [
            _row(token)
            for token in list_tokens(session, project=args.project, include_revoked=args.all)
        ]
    if args.output != "table":
        emit(rows, args.output)
        return 0
    table(
        ["ID", "NAME", "PREFIX", "ROLE", "PROJECT", "CREATED", "LAST USED", "REVOKED"],
        [
            [
                r["id"],
                r["name"],
                r["prefix"] + "…",
                r["role"],
                r["project"],
                short_time(r["created_at"]),
                short_time(r["last_used_at"]),
                short_time(r["revoked_at"]),
            ]
            for r in rows
        ],
    )
    return 0


def _revoke(args: argparse.Namespace) -> int:
    from kubetrain.store import revoke_token

    with _database(args) as db, db.transaction() as session:
        revoked = revoke_token(session, args.token_id)
    if not revoked:
        raise CommandError(f"no live token with id {args.token_id!r}")
    print(f"revoked token {args.token_id}")
    return 0
