"""Gang attempts: an attempt row per worker (`rank`), and the gang restart's outbox.

A gang's attempt N has one row per rank, so (job, number) is no longer unique; a Pod
still is (job, pod uid). `retries_used` counts the gang's attempts that failed
against `retries`; `restart_job_uid` is the ended attempt's Job the dispatcher
deletes before it creates the next.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("rank", sa.Integer(), nullable=True))
        batch.drop_constraint(op.f("uq_attempts_job_id_number"), type_="unique")
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(
            sa.Column("retries_used", sa.Integer(), nullable=False, server_default="0")
        )
        batch.add_column(sa.Column("restart_job_uid", sa.String(length=64), nullable=True))
    # The default only filled the rows already there; the models set it on insert.
    with op.batch_alter_table("jobs") as batch:
        batch.alter_column("retries_used", server_default=None)


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("restart_job_uid")
        batch.drop_column("retries_used")
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("rank")
        batch.create_unique_constraint(op.f("uq_attempts_job_id_number"), ["job_id", "number"])
