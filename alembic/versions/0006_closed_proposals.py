"""Proposals nobody will decide are ``closed``: those still pending when their run ended,
and those that change nothing; before, both stayed ``pending`` and offered an approval
that could only be refused.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-07
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        "UPDATE proposals SET state = 'closed', decided_at = CURRENT_TIMESTAMP, "
        "outcome = 'its run ended before anyone decided' "
        "WHERE state = 'pending' AND run_id IN "
        "(SELECT id FROM runs WHERE state IN ('finished', 'failed', 'stopped'))"
    )


def downgrade() -> None:
    op.execute("UPDATE proposals SET state = 'pending' WHERE state = 'closed'")
