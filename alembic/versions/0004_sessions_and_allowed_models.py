"""Sign-in sessions; the models each worker has built in and allows, and the hash of the
secret that keeps its id its own; a plan's planner name as long as other names.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-27
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "sessions",
        sa.Column("token_sha256", sa.String(64), nullable=False),
        sa.Column("user", sa.String(200), nullable=False),
        sa.Column("role", sa.String(20), nullable=False),
        sa.Column("issuer_sha256", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("token_sha256", name=op.f("pk_sessions")),
    )
    op.create_index(op.f("ix_sessions_expires_at"), "sessions", ["expires_at"])
    with op.batch_alter_table("workers") as batch:
        batch.add_column(
            sa.Column("builtin_models", sa.JSON(), nullable=False, server_default="[]")
        )
        batch.add_column(
            sa.Column("allowed_models", sa.JSON(), nullable=False, server_default="[]")
        )
        batch.add_column(sa.Column("secret_sha256", sa.String(64), nullable=True))
    with op.batch_alter_table("plans") as batch:
        batch.alter_column(
            "planner", existing_type=sa.String(50), type_=sa.String(200), existing_nullable=False
        )


def downgrade() -> None:
    with op.batch_alter_table("plans") as batch:
        batch.alter_column(
            "planner", existing_type=sa.String(200), type_=sa.String(50), existing_nullable=False
        )
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("secret_sha256")
        batch.drop_column("allowed_models")
        batch.drop_column("builtin_models")
    op.drop_index(op.f("ix_sessions_expires_at"), table_name="sessions")
    op.drop_table("sessions")
