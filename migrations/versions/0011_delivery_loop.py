"""endpoints: the breaker's next probe time; deliveries: leases counted whatever their status

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25 18:00:00

The delivery loop (workers/delivery_loop.py) keeps no endpoint state in a worker's memory:

- `webhook_endpoints.next_probe_at`: while an endpoint keeps failing, no attempt of it starts
  before this time, whichever worker claims it (the pause between probes was per process).
- `ix_webhook_deliveries_endpoint_leased` now covers every leased delivery, not only pending
  ones: disabling an endpoint fails its pending deliveries but leaves an attempt in flight its
  lease, so that the attempt still counts against the endpoint's limit until it is recorded.
  Built CONCURRENTLY, so a large table keeps taking deliveries meanwhile.
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None

LEASED = "lease_token IS NOT NULL"
LEASED_PENDING = "status = 'pending' AND lease_token IS NOT NULL"


def upgrade():
    op.add_column(
        'webhook_endpoints', sa.Column('next_probe_at', sa.DateTime(timezone=True), nullable=True)
    )
    with op.get_context().autocommit_block():
        op.execute('DROP INDEX CONCURRENTLY IF EXISTS ix_webhook_deliveries_endpoint_leased')
        op.execute(
            'CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_webhook_deliveries_endpoint_leased '
            f'ON webhook_deliveries (endpoint_id, leased_until) WHERE {LEASED}'
        )


def downgrade():
    with op.get_context().autocommit_block():
        op.execute('DROP INDEX CONCURRENTLY IF EXISTS ix_webhook_deliveries_endpoint_leased')
        op.execute(
            'CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_webhook_deliveries_endpoint_leased '
            f'ON webhook_deliveries (endpoint_id, leased_until) WHERE {LEASED_PENDING}'
        )
    op.drop_column('webhook_endpoints', 'next_probe_at')
