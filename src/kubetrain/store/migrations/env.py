"""Alembic's entry point for kubetrain's migrations.

`Database.upgrade()` hands in an open connection (inside its transaction, after
taking the migration lock); otherwise, e.g. for `command.revision(...,
autogenerate=True)`, an engine is made from the `sqlalchemy.url` option.
"""

from __future__ import annotations

from typing import Any, Literal

from alembic import context
from alembic.autogenerate.api import AutogenContext
from sqlalchemy import Connection, create_engine

from kubetrain.store.models import Base, StrEnumType, UTCDateTime


def _render_item(kind: str, obj: Any, _autogen: AutogenContext) -> str | Literal[False]:
    """Autogenerate our column types as the plain SQL types they store, not as imports."""
    if kind == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    if kind == "type" and isinstance(obj, StrEnumType):
        return f"sa.String(length={obj.impl.length})"
    return False


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        # SQLite cannot ALTER most things; batch mode rebuilds the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
        render_item=_render_item,
    )
    with context.begin_transaction():
        context.run_migrations()


connection = context.config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    engine = create_engine(context.config.get_main_option("sqlalchemy.url") or "")
    with engine.connect() as fresh:
        _run(fresh)
    engine.dispose()
