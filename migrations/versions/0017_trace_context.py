"""trace context: endpoints that send a W3C traceparent, events that keep the publisher's

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-28 17:00:00

CONTRACT 13.6. `webhook_endpoints.trace_context`: every attempt to the endpoint carries a
`traceparent` header (false for every endpoint of today: nothing they receive changes).
`webhook_events.traceparent`: the trace context of the API request that published the event
(its server span's when the API exports traces, else the caller's own `traceparent`), so that
each delivery attempt, hours later and in another process, joins that trace. Null for events of
today and for events no request published (the worker's own, `events emit`).
"""

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

# `00-` + 32 hex + `-` + 16 hex + `-` + 2 hex (W3C Trace Context, version 00).
TRACEPARENT_LENGTH = 55


def upgrade():
    # A constant default: PostgreSQL adds the column without rewriting the table.
    op.add_column(
        "webhook_endpoints",
        sa.Column("trace_context", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    op.add_column(
        "webhook_events",
        sa.Column("traceparent", sa.String(TRACEPARENT_LENGTH), nullable=True),
    )


def downgrade():
    op.drop_column("webhook_events", "traceparent")
    op.drop_column("webhook_endpoints", "trace_context")
