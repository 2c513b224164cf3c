"""Jobs' status tokens are gone: Pods report with a projected ServiceAccount token that
kubetrain checks with a TokenReview, so no token of a job is kept (api/reports.py).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_index(op.f("ix_jobs_status_token_hash"), table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("status_token_hash")


def downgrade() -> None:
    # The hashes are not brought back: a job dispatched before the downgrade has no
    # token the old reports endpoint would take, as after a lost token.
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("status_token_hash", sa.String(length=64), nullable=True))
    op.create_index(op.f("ix_jobs_status_token_hash"), "jobs", ["status_token_hash"])
