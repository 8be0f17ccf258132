"""deliveries: an index on their event, and an event kept while a delivery refers to it

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26 01:00:00

Retention (WEBHOOK_RETENTION_DAYS) deletes an old event only once no delivery refers to it:
a redelivery made today of a month-old event still sends that event's body.

- `ix_webhook_deliveries_event`: "does a delivery still refer to this event" is an index probe.
  Without it, each event deleted made PostgreSQL's foreign-key check read the whole delivery
  table. Built CONCURRENTLY, so a large table keeps taking deliveries meanwhile.
- `fk_webhook_deliveries_event_id_webhook_events` loses ON DELETE CASCADE: deleting an event
  that a delivery committed a moment ago refers to (a redelivery racing the purge) now fails
  instead of silently deleting that young delivery. Added NOT VALID and validated after, so
  that checking the existing rows never blocks writes.
"""
from alembic import op


# revision identifiers, used by Alembic.
revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None

EVENT_FK = 'fk_webhook_deliveries_event_id_webhook_events'


def upgrade():
    op.drop_constraint(EVENT_FK, 'webhook_deliveries', type_='foreignkey')
    op.create_foreign_key(
        EVENT_FK, 'webhook_deliveries', 'webhook_events', ['event_id'], ['id'],
        postgresql_not_valid=True,
    )
    with op.get_context().autocommit_block():
        op.execute(f'ALTER TABLE webhook_deliveries VALIDATE CONSTRAINT {EVENT_FK}')
        op.create_index(
            'ix_webhook_deliveries_event', 'webhook_deliveries', ['event_id'],
            postgresql_concurrently=True, if_not_exists=True,
        )


def downgrade():
    with op.get_context().autocommit_block():
        op.drop_index(
            'ix_webhook_deliveries_event', table_name='webhook_deliveries',
            postgresql_concurrently=True, if_exists=True,
        )
    op.drop_constraint(EVENT_FK, 'webhook_deliveries', type_='foreignkey')
    op.create_foreign_key(
        EVENT_FK, 'webhook_deliveries', 'webhook_events', ['event_id'], ['id'], ondelete='CASCADE'
    )
