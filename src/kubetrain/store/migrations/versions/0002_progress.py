"""Progress reported from inside the Pods: the per-job status token, reports, progress.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _when(name: str, *, nullable: bool = False) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("status_token_hash", sa.String(length=64), nullable=True))
    op.create_table(
        "reports",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("pod", sa.String(length=253), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        _when("reported_at"),
        _when("received_at"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_reports_job_id_jobs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_reports")),
        sa.UniqueConstraint("job_id", "pod", "seq", name=op.f("uq_reports_job_id_pod_seq")),
    )
    op.create_index(op.f("ix_reports_job_id_kind_id"), "reports", ["job_id", "kind", "id"])
    op.create_table(
        "progress",
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("pod", sa.String(length=253), nullable=False),
        sa.Column("phase", sa.String(length=32), nullable=True),
        _when("phase_since", nullable=True),
        sa.Column("step", sa.BigInteger(), nullable=True),
        _when("step_at", nullable=True),
        sa.Column("metrics", sa.JSON(), nullable=True),
        sa.Column("checkpoint", sa.JSON(), nullable=True),
        sa.Column("dropped", sa.BigInteger(), nullable=False),
        _when("updated_at"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_progress_job_id_jobs")),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_progress")),
    )


def downgrade() -> None:
    op.drop_table("progress")
    op.drop_index(op.f("ix_reports_job_id_kind_id"), table_name="reports")
    op.drop_table("reports")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("status_token_hash")
