"""events: the order the events API lists them in (publishing transaction, then position)

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27 09:00:00

GET /event/fetch-events lists a brand's events in publish order after a cursor, and a follower
must never miss one whose transaction committed after a later one was already listed
(services/event_feed.py says how the two columns guarantee it):

- `xact_id`: the publishing transaction's id, `pg_current_xact_id()` (64 bits, never wraps);
- `position`: from a sequence, the order of the events one transaction published.

Both are column defaults, so every insert (a postback's one statement included) fills them at
no extra round trip. Existing events are all committed: they get `xact_id` 0 (before every
transaction still to come) and positions in the order they were created.

`ix_webhook_events_feed` (brand, name, xact_id, position) reads one event type of a brand in
that order; the feed merges the types asked for (every type, when none is named).

The backfill rewrites every event row once, inside this migration's transaction, which holds
the table's lock meanwhile: events published during it wait for it.
"""
from alembic import op


# revision identifiers, used by Alembic.
revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None

SEQUENCE = 'webhook_events_position_seq'


def upgrade():
    op.execute(f'CREATE SEQUENCE {SEQUENCE}')
    op.execute('ALTER TABLE webhook_events ADD COLUMN xact_id BIGINT, ADD COLUMN position BIGINT')
    op.execute(
        """
        UPDATE webhook_events SET xact_id = 0, position = ordered.position
        FROM (SELECT id, row_number() OVER (ORDER BY created_at, id) AS position
              FROM webhook_events) AS ordered
        WHERE ordered.id = webhook_events.id
        """
    )
    op.execute(
        f"SELECT setval('{SEQUENCE}', coalesce(max(position), 0) + 1, false) FROM webhook_events"
    )
    op.execute(
        f"""
        ALTER TABLE webhook_events
            ALTER COLUMN xact_id SET DEFAULT CAST(CAST(pg_current_xact_id() AS TEXT) AS BIGINT),
            ALTER COLUMN xact_id SET NOT NULL,
            ALTER COLUMN position SET DEFAULT nextval('{SEQUENCE}'),
            ALTER COLUMN position SET NOT NULL
        """
    )
    op.execute(f'ALTER SEQUENCE {SEQUENCE} OWNED BY webhook_events.position')
    op.create_index(
        'ix_webhook_events_feed', 'webhook_events', ['brand_id', 'name', 'xact_id', 'position']
    )


def downgrade():
    op.drop_index('ix_webhook_events_feed', table_name='webhook_events')
    # The sequence is owned by `position` and goes with it.
    op.execute('ALTER TABLE webhook_events DROP COLUMN position, DROP COLUMN xact_id')
