"""where an event went (what the publisher passed over), erasure by subject

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-28 17:10:00

Issue 44, CONTRACT 13.2 and 13.3 (docs/webhooks.md, "Where an event went" and "Erasure"):

- `webhook_events.passed_over`: the endpoints the publisher passed over for a reason that
  cannot be read back later (`{"whe_…": "filtered" | "disabled"}`), null when none was. What
  was sent is in the deliveries, and an endpoint that existed, got nothing and is not listed
  here was not subscribed: no row per endpoint and event.
- `webhook_events.erased_at`: when the event's `data` was erased (null: never).
- `webhook_bulk_jobs.position`: where a job that walks rows in order got to (erasure walks a
  subject's events newest first, by `sequence`).
"""

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql


# revision identifiers, used by Alembic.
revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade():
    op.add_column(
        "webhook_events",
        sa.Column("passed_over", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )
    op.add_column(
        "webhook_events", sa.Column("erased_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.add_column("webhook_bulk_jobs", sa.Column("position", sa.BigInteger(), nullable=True))


def downgrade():
    op.drop_column("webhook_bulk_jobs", "position")
    op.drop_column("webhook_events", "erased_at")
    op.drop_column("webhook_events", "passed_over")
