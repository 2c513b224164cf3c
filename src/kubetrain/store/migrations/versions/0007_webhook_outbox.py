"""Webhook outbox rows and the installation's id.

`webhook_deliveries` replaces each webhook's cursor into the history: a cursor
on ids passes a row that commits after rows with higher ids (PostgreSQL), so
that row was never delivered. The rows a webhook had still to receive when this
migration runs become its first deliveries, each with a random event key.
`installation` holds one random id, made here, once: the CloudEvents `source`.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-06
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_RANDOM_KEY = {
    "postgresql": "replace(gen_random_uuid()::text, '-', '')",
    "sqlite": "lower(hex(randomblob(16)))",
}


def upgrade() -> None:
    installation = op.create_table(
        "installation",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_installation")),
    )
    op.bulk_insert(installation, [{"id": str(uuid.uuid4()), "created_at": datetime.now(UTC)}])
    op.create_table(
        "webhook_deliveries",
        sa.Column("webhook_id", sa.String(length=36), nullable=False),
        sa.Column(
            "transition_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False
        ),
        sa.Column("event_key", sa.String(length=32), nullable=False),
        sa.ForeignKeyConstraint(
            ["webhook_id"],
            ["webhooks.id"],
            name=op.f("fk_webhook_deliveries_webhook_id_webhooks"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["transition_id"],
            ["transitions.id"],
            name=op.f("fk_webhook_deliveries_transition_id_transitions"),
        ),
        sa.PrimaryKeyConstraint("webhook_id", "transition_id", name=op.f("pk_webhook_deliveries")),
    )
    key = _RANDOM_KEY[op.get_bind().dialect.name]
    pending = (
        f"SELECT w.id, t.id, {key} FROM webhooks w "  # noqa: S608 - a constant of this file
        "JOIN jobs j ON j.project = w.project "
        "JOIN transitions t ON t.job_id = j.id "
        "WHERE t.kind = 'business' AND t.id > w.cursor"
    )
    op.execute(f"INSERT INTO webhook_deliveries (webhook_id, transition_id, event_key) {pending}")
    with op.batch_alter_table("webhooks") as batch:
        batch.drop_column("cursor")


def downgrade() -> None:
    with op.batch_alter_table("webhooks") as batch:
        batch.add_column(sa.Column("cursor", sa.BigInteger(), nullable=False, server_default="0"))
    # Back to a cursor: just before the oldest row still to deliver, else the newest row.
    op.execute(
        "UPDATE webhooks SET cursor = COALESCE("
        "(SELECT MIN(d.transition_id) - 1 FROM webhook_deliveries d"
        " WHERE d.webhook_id = webhooks.id), (SELECT MAX(id) FROM transitions), 0)"
    )
    with op.batch_alter_table("webhooks") as batch:
        batch.alter_column("cursor", server_default=None)
    op.drop_table("webhook_deliveries")
    op.drop_table("installation")
