"""Server-side dashboard sessions (sign-out ends them); report credentials looked up by hash.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _when(name: str) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=False)


def upgrade() -> None:
    op.create_index(op.f("ix_jobs_status_token_hash"), "jobs", ["status_token_hash"])
    op.create_table(
        "web_sessions",
        sa.Column("id_hash", sa.String(length=64), nullable=False),
        sa.Column("token_id", sa.String(length=36), nullable=False),
        _when("created_at"),
        _when("expires_at"),
        sa.ForeignKeyConstraint(
            ["token_id"], ["tokens.id"], name=op.f("fk_web_sessions_token_id_tokens")
        ),
        sa.PrimaryKeyConstraint("id_hash", name=op.f("pk_web_sessions")),
    )
    op.create_index(op.f("ix_web_sessions_expires_at"), "web_sessions", ["expires_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_web_sessions_expires_at"), table_name="web_sessions")
    op.drop_table("web_sessions")
    op.drop_index(op.f("ix_jobs_status_token_hash"), table_name="jobs")
