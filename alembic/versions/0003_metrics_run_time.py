"""Metrics of every kind in a run's time range come from one index, in time order.

The dashboards' usual question is "everything of run R between t0 and t1, thinned":
``(run_id, kind, time_ms)`` answers it with a scan per kind and a sort; ``(run_id,
time_ms, id)`` answers it in order, and covers the thinning's id-only pass.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_metrics_run_time", "metrics", ["run_id", "time_ms", "id"])


def downgrade() -> None:
    op.drop_index("ix_metrics_run_time", table_name="metrics")
