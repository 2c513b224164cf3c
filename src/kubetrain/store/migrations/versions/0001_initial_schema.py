"""Initial schema: jobs, attempts, transitions, tokens, datasets.

Revision ID: 0001
Revises:
Create Date: 2026-12-02

Migrations spell out plain SQL types instead of importing the models' types,
so that later changes to the models cannot rewrite history.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _when(name: str, *, nullable: bool = False) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("project", sa.String(length=63), nullable=False),
        sa.Column("name", sa.String(length=253), nullable=False),
        sa.Column("owner", sa.String(length=255), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("spec_digest", sa.String(length=64), nullable=False),
        sa.Column("idempotency_key", sa.String(length=255), nullable=True),
        sa.Column("namespace", sa.String(length=63), nullable=False),
        sa.Column("k8s_job_name", sa.String(length=63), nullable=True),
        sa.Column("business_state", sa.String(length=32), nullable=False),
        sa.Column("reason", sa.String(length=32), nullable=False),
        sa.Column("reason_message", sa.Text(), nullable=True),
        sa.Column("raw_reason", sa.Text(), nullable=True),
        sa.Column("raw_message", sa.Text(), nullable=True),
        sa.Column("current_attempt", sa.Integer(), nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("dispatch_attempts", sa.Integer(), nullable=False),
        _when("next_dispatch_at", nullable=True),
        sa.Column("last_dispatch_error", sa.Text(), nullable=True),
        sa.Column("diagnosis", sa.JSON(), nullable=True),
        _when("created_at"),
        _when("updated_at"),
        _when("finished_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
        sa.UniqueConstraint(
            "project", "idempotency_key", name=op.f("uq_jobs_project_idempotency_key")
        ),
    )
    op.create_index(op.f("ix_jobs_next_dispatch_at"), "jobs", ["next_dispatch_at"])
    op.create_index(op.f("ix_jobs_project_business_state"), "jobs", ["project", "business_state"])
    op.create_index(op.f("ix_jobs_project_created_at_id"), "jobs", ["project", "created_at", "id"])
    op.create_index(
        op.f("ix_jobs_project_name_created_at"), "jobs", ["project", "name", "created_at"]
    )

    op.create_table(
        "attempts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("pod_name", sa.String(length=253), nullable=False),
        sa.Column("pod_uid", sa.String(length=64), nullable=False),
        sa.Column("node", sa.String(length=253), nullable=True),
        sa.Column("pod_phase", sa.String(length=32), nullable=True),
        sa.Column("container_state", sa.Text(), nullable=True),
        sa.Column("scheduling_reason", sa.Text(), nullable=True),
        sa.Column("raw_reason", sa.Text(), nullable=True),
        sa.Column("raw_message", sa.Text(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("termination_message", sa.Text(), nullable=True),
        _when("started_at", nullable=True),
        _when("finished_at", nullable=True),
        _when("created_at"),
        _when("updated_at"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_attempts_job_id_jobs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_attempts")),
        sa.UniqueConstraint("job_id", "number", name=op.f("uq_attempts_job_id_number")),
        sa.UniqueConstraint("job_id", "pod_uid", name=op.f("uq_attempts_job_id_pod_uid")),
    )

    op.create_table(
        "transitions",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("job_id", sa.String(length=36), nullable=False),
        _when("at"),
        sa.Column("source", sa.String(length=32), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("from_state", sa.String(length=32), nullable=True),
        sa.Column("to_state", sa.String(length=32), nullable=True),
        sa.Column("from_reason", sa.String(length=32), nullable=True),
        sa.Column("to_reason", sa.String(length=32), nullable=True),
        sa.Column("raw_reason", sa.Text(), nullable=True),
        sa.Column("raw_message", sa.Text(), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=True),
        sa.Column("detail", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_transitions_job_id_jobs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_transitions")),
    )
    op.create_index(op.f("ix_transitions_job_id_id"), "transitions", ["job_id", "id"])

    op.create_table(
        "tokens",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("role", sa.String(length=32), nullable=False),
        sa.Column("project", sa.String(length=63), nullable=False),
        _when("created_at"),
        _when("last_used_at", nullable=True),
        _when("revoked_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_tokens_token_hash")),
    )

    op.create_table(
        "datasets",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=253), nullable=False),
        sa.Column("version", sa.String(length=128), nullable=False),
        sa.Column("claim", sa.String(length=253), nullable=False),
        sa.Column("sub_path", sa.String(length=1024), nullable=True),
        sa.Column("checksums", sa.JSON(), nullable=True),
        _when("created_at"),
        sa.Column("created_by", sa.String(length=255), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_datasets")),
        sa.UniqueConstraint("name", "version", name=op.f("uq_datasets_name_version")),
    )


def downgrade() -> None:
    op.drop_table("datasets")
    op.drop_table("tokens")
    op.drop_index(op.f("ix_transitions_job_id_id"), table_name="transitions")
    op.drop_table("transitions")
    op.drop_table("attempts")
    for index in (
        "ix_jobs_project_name_created_at",
        "ix_jobs_project_created_at_id",
        "ix_jobs_project_business_state",
        "ix_jobs_next_dispatch_at",
    ):
        op.drop_index(op.f(index), table_name="jobs")
    op.drop_table("jobs")
