"""webhooks: a previous secret during a rotation's overlap, redeliveries noted on the original,
and each attempt's endpoint for health figures

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25 03:00:00

- `webhook_endpoints.previous_secret_ciphertext` / `previous_secret_expires_at`: rotate-secret
  with `overlapSeconds` keeps the previous secret signing until then (CONTRACT 8.2); the worker's
  sweep destroys the ciphertext once it has expired.
- `webhook_deliveries.redelivered_as`: the newer delivery of the same event to the same endpoint
  (redeliver, recover), so that recover never queues one failure twice (CONTRACT 8.3).
- `webhook_attempts.endpoint_id`, indexed with `requested_at`: an endpoint's attempts of the
  last 24 hours (CONTRACT 8.4) are a range of that index, not a walk of the delivery log.
  Filled from each attempt's delivery.
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade():
    op.add_column('webhook_endpoints', sa.Column('previous_secret_ciphertext', sa.Text(), nullable=True))
    op.add_column(
        'webhook_endpoints',
        sa.Column('previous_secret_expires_at', sa.DateTime(timezone=True), nullable=True),
    )
    op.add_column('webhook_deliveries', sa.Column('redelivered_as', sa.String(length=40), nullable=True))
    op.add_column('webhook_attempts', sa.Column('endpoint_id', sa.String(length=40), nullable=True))
    op.execute(
        """
        UPDATE webhook_attempts AS attempt SET endpoint_id = delivery.endpoint_id
        FROM webhook_deliveries AS delivery WHERE delivery.id = attempt.delivery_id
        """
    )
    op.alter_column('webhook_attempts', 'endpoint_id', nullable=False)
    op.create_foreign_key(
        'fk_webhook_attempts_endpoint_id_webhook_endpoints',
        'webhook_attempts', 'webhook_endpoints', ['endpoint_id'], ['id'], ondelete='CASCADE',
    )
    op.create_index(
        'ix_webhook_attempts_endpoint_requested', 'webhook_attempts', ['endpoint_id', 'requested_at']
    )


def downgrade():
    op.drop_index('ix_webhook_attempts_endpoint_requested', table_name='webhook_attempts')
    op.drop_constraint(
        'fk_webhook_attempts_endpoint_id_webhook_endpoints', 'webhook_attempts', type_='foreignkey'
    )
    op.drop_column('webhook_attempts', 'endpoint_id')
    op.drop_column('webhook_deliveries', 'redelivered_as')
    op.drop_column('webhook_endpoints', 'previous_secret_expires_at')
    op.drop_column('webhook_endpoints', 'previous_secret_ciphertext')
