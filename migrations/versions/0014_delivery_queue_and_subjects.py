"""deliveries: pending work in a queue and leases of its own; endpoints: a claim order, ordering
and campaign filters; events: subject and sequence; attempts: the whole attempt on record

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-26 18:00:00

The delivery loop's claim walked every endpoint with pending work on every round, and every
update of a delivery wrote all nine of its indexes (issues 34 and 35). Now:

- `webhook_delivery_queue` holds each pending delivery waiting for its next attempt, and
  `webhook_delivery_leases` each one on the wire: a claim moves a row from one to the other, a
  record back or away. The pending deliveries of today are queued as they stand; leases of
  attempts in flight during the upgrade are not carried over (stop the workers first, or
  their attempts are sent once more).
- `webhook_endpoints.ready_at` orders the claim: endpoints in the order they became ready, one
  index probe per endpoint claimed. Endpoints with pending work start ready now.
- `webhook_deliveries` keeps only indexes on columns that do not change (and `failed_at`, new:
  when it failed), so that `delivered` is a HOT update; fillfactor 85 leaves it room. The
  brand+status and brand+endpoint indexes give way to endpoint and failed ones; the lease
  columns and the due and leased indexes go to the new tables.
- `webhook_endpoints.ordering` and `.campaign_ids` (CONTRACT 12.2, 12.3).
- `webhook_events.subject_type/subject_id/sequence/campaign_id` (CONTRACT 12.2), filled for the
  events already stored from their bodies, numbered in publish order, and
  `webhook_event_subjects` holding each subject's last number. Bodies already stored are not
  rewritten: a redelivery of an event published before this sends it as it was first sent.
- `webhook_delivery_loops`: each running delivery loop's last round, for `GET /metrics`.
- `webhook_attempts`: response headers, the address connected to and the attempt's timings
  (CONTRACT 12.5); null for attempts made before.

The rewrite of `failed_at` and of the events' subject columns runs inside this migration's
transaction and holds those tables meanwhile.
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql


# revision identifiers, used by Alembic.
revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None

ID = sa.String(40)
TIMESTAMP = sa.DateTime(timezone=True)
FAILED_ONLY = 'failed_at IS NOT NULL'

# The subject of each stored event, from its body (services/event_subjects.py is the rule for
# events published from now on; this is that rule in SQL, for the bodies already stored).
SUBJECT_OF_BODY = """
    CASE
        WHEN name LIKE 'deal.%' THEN 'deal'
        WHEN name LIKE 'content.%' OR name LIKE 'placement.%' OR name LIKE 'escrow.%'
             OR name LIKE 'dispute.%' THEN 'deal'
        WHEN name LIKE 'campaign.%' THEN 'campaign'
        WHEN name LIKE 'conversion.%' THEN 'conversion'
        WHEN name LIKE 'webhook.%' THEN 'endpoint'
        WHEN name LIKE 'verification.%' THEN 'brand'
    END
"""
SUBJECT_ID_OF_BODY = """
    CASE
        WHEN name LIKE 'deal.%' OR name LIKE 'campaign.%' OR name LIKE 'conversion.%'
             THEN CAST(body AS json) -> 'data' ->> 'id'
        WHEN name LIKE 'content.%' OR name LIKE 'placement.%' OR name LIKE 'escrow.%'
             OR name LIKE 'dispute.%' THEN CAST(body AS json) -> 'data' ->> 'dealId'
        WHEN name LIKE 'webhook.%' THEN CAST(body AS json) -> 'data' ->> 'endpointId'
        WHEN name LIKE 'verification.%' THEN brand_id
    END
"""
CAMPAIGN_OF_BODY = """
    CASE
        WHEN name LIKE 'campaign.%' THEN CAST(body AS json) -> 'data' ->> 'id'
        WHEN name LIKE 'webhook.%' OR name LIKE 'verification.%' THEN NULL
        ELSE CAST(body AS json) -> 'data' ->> 'campaignId'
    END
"""


def upgrade():
    # Endpoints: the claim's order, ordering and filters.
    op.add_column('webhook_endpoints', sa.Column('ready_at', TIMESTAMP, nullable=True))
    op.add_column(
        'webhook_endpoints',
        sa.Column('ordering', sa.String(10), nullable=False, server_default='none'),
    )
    op.add_column(
        'webhook_endpoints', sa.Column('campaign_ids', postgresql.ARRAY(ID), nullable=True)
    )
    op.create_index(
        'ix_webhook_endpoints_ready', 'webhook_endpoints', ['ready_at', 'id'],
        postgresql_where=sa.text('ready_at IS NOT NULL'),
    )

    # The work: queue and leases.
    op.create_table(
        'webhook_delivery_queue',
        sa.Column('delivery_id', ID, nullable=False),
        sa.Column('endpoint_id', ID, nullable=False),
        sa.Column('next_attempt_at', TIMESTAMP, nullable=True),
        sa.Column('attempt_count', sa.Integer(), nullable=False),
        sa.Column('not_before', TIMESTAMP, nullable=True),
        sa.Column('subject_key', sa.String(80), nullable=True),
        sa.Column('sequence', sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint('delivery_id', name='pk_webhook_delivery_queue'),
    )
    op.create_index(
        'ix_webhook_delivery_queue_endpoint_due', 'webhook_delivery_queue',
        ['endpoint_id', 'next_attempt_at', 'delivery_id'],
    )
    op.create_index(
        'ix_webhook_delivery_queue_subject', 'webhook_delivery_queue',
        ['endpoint_id', 'subject_key', 'sequence'],
        postgresql_where=sa.text('subject_key IS NOT NULL'),
    )
    op.create_table(
        'webhook_delivery_leases',
        sa.Column('delivery_id', ID, nullable=False),
        sa.Column('endpoint_id', ID, nullable=False),
        sa.Column('token', sa.String(32), nullable=False),
        sa.Column('leased_until', TIMESTAMP, nullable=False),
        sa.Column('attempt_count', sa.Integer(), nullable=False),
        sa.Column('not_before', TIMESTAMP, nullable=True),
        sa.Column('subject_key', sa.String(80), nullable=True),
        sa.Column('sequence', sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint('delivery_id', name='pk_webhook_delivery_leases'),
    )
    op.create_index(
        'ix_webhook_delivery_leases_endpoint', 'webhook_delivery_leases',
        ['endpoint_id', 'leased_until'],
    )
    op.create_table(
        'webhook_delivery_loops',
        sa.Column('id', sa.String(32), nullable=False),
        sa.Column('hostname', sa.String(255), nullable=False),
        sa.Column('pid', sa.Integer(), nullable=False),
        sa.Column('started_at', TIMESTAMP, nullable=False),
        sa.Column('last_round_at', TIMESTAMP, nullable=False),
        sa.PrimaryKeyConstraint('id', name='pk_webhook_delivery_loops'),
    )
    op.execute(
        """
        INSERT INTO webhook_delivery_queue (delivery_id, endpoint_id, next_attempt_at,
                                            attempt_count)
        SELECT id, endpoint_id, COALESCE(next_attempt_at, statement_timestamp()), attempt_count
        FROM webhook_deliveries WHERE status = 'pending'
        """
    )
    op.execute(
        """
        UPDATE webhook_endpoints SET ready_at = statement_timestamp()
        WHERE id IN (SELECT endpoint_id FROM webhook_delivery_queue)
        """
    )

    # Deliveries: only unchanging columns indexed.
    op.add_column('webhook_deliveries', sa.Column('failed_at', TIMESTAMP, nullable=True))
    op.execute(
        """
        UPDATE webhook_deliveries AS d
        SET failed_at = COALESCE(
            (SELECT max(requested_at) FROM webhook_attempts AS a WHERE a.delivery_id = d.id),
            d.created_at)
        WHERE d.status = 'failed'
        """
    )
    for name in (
        'ix_webhook_deliveries_endpoint_leased',
        'ix_webhook_deliveries_due',
        'ix_webhook_deliveries_endpoint_due_order',
        'ix_webhook_deliveries_brand_status',
        'ix_webhook_deliveries_brand_endpoint',
    ):
        op.drop_index(name, table_name='webhook_deliveries')
    op.drop_column('webhook_deliveries', 'lease_token')
    op.drop_column('webhook_deliveries', 'leased_until')
    op.create_index(
        'ix_webhook_deliveries_endpoint_created', 'webhook_deliveries',
        ['endpoint_id', 'created_at', 'id'],
    )
    op.create_index(
        'ix_webhook_deliveries_brand_failed', 'webhook_deliveries',
        ['brand_id', 'created_at', 'id'], postgresql_where=sa.text(FAILED_ONLY),
    )
    op.create_index(
        'ix_webhook_deliveries_endpoint_failed', 'webhook_deliveries',
        ['endpoint_id', 'created_at', 'id'], postgresql_where=sa.text(FAILED_ONLY),
    )
    op.execute('ALTER TABLE webhook_deliveries SET (fillfactor = 85)')

    # Attempts: the whole attempt.
    op.add_column('webhook_attempts', sa.Column('response_headers', sa.JSON(), nullable=True))
    op.add_column('webhook_attempts', sa.Column('remote_address', sa.String(45), nullable=True))
    for column in ('dns_ms', 'connect_ms', 'tls_ms', 'first_byte_ms'):
        op.add_column('webhook_attempts', sa.Column(column, sa.Integer(), nullable=True))

    # Events: subject and sequence.
    op.add_column('webhook_events', sa.Column('subject_type', sa.String(16), nullable=True))
    op.add_column('webhook_events', sa.Column('subject_id', sa.String(64), nullable=True))
    op.add_column('webhook_events', sa.Column('sequence', sa.Integer(), nullable=True))
    op.add_column('webhook_events', sa.Column('campaign_id', ID, nullable=True))
    op.execute(
        f"""
        UPDATE webhook_events SET subject_type = {SUBJECT_OF_BODY},
                                  subject_id = left({SUBJECT_ID_OF_BODY}, 64),
                                  campaign_id = left({CAMPAIGN_OF_BODY}, 40)
        """
    )
    # An event whose body names no subject stands alone.
    op.execute(
        """
        UPDATE webhook_events SET subject_type = 'event', subject_id = id
        WHERE subject_type IS NULL OR subject_id IS NULL
        """
    )
    op.execute(
        """
        UPDATE webhook_events AS e SET sequence = numbered.sequence
        FROM (SELECT id, row_number() OVER (PARTITION BY brand_id, subject_type, subject_id
                                            ORDER BY xact_id, position) AS sequence
              FROM webhook_events) AS numbered
        WHERE numbered.id = e.id
        """
    )
    for column in ('subject_type', 'subject_id', 'sequence'):
        op.alter_column('webhook_events', column, nullable=False)
    op.create_index(
        'ix_webhook_events_subject', 'webhook_events',
        ['brand_id', 'subject_type', 'subject_id', 'sequence'],
    )
    op.create_table(
        'webhook_event_subjects',
        sa.Column('brand_id', ID, nullable=False),
        sa.Column('subject_type', sa.String(16), nullable=False),
        sa.Column('subject_id', sa.String(64), nullable=False),
        sa.Column('last_sequence', sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ['brand_id'], ['brands.id'],
            name='fk_webhook_event_subjects_brand_id_brands', ondelete='CASCADE',
        ),
        sa.PrimaryKeyConstraint(
            'brand_id', 'subject_type', 'subject_id', name='pk_webhook_event_subjects'
        ),
    )
    op.execute(
        """
        INSERT INTO webhook_event_subjects (brand_id, subject_type, subject_id, last_sequence)
        SELECT brand_id, subject_type, subject_id, max(sequence) FROM webhook_events
        WHERE subject_type <> 'conversion'
        GROUP BY brand_id, subject_type, subject_id
        """
    )


def downgrade():
    op.drop_table('webhook_event_subjects')
    op.drop_index('ix_webhook_events_subject', table_name='webhook_events')
    for column in ('campaign_id', 'sequence', 'subject_id', 'subject_type'):
        op.drop_column('webhook_events', column)

    for column in (
        'first_byte_ms', 'tls_ms', 'connect_ms', 'dns_ms', 'remote_address', 'response_headers'
    ):
        op.drop_column('webhook_attempts', column)

    op.execute('ALTER TABLE webhook_deliveries RESET (fillfactor)')
    op.add_column('webhook_deliveries', sa.Column('leased_until', TIMESTAMP, nullable=True))
    op.add_column('webhook_deliveries', sa.Column('lease_token', sa.String(32), nullable=True))
    # What was on the wire is due again; what waited keeps its time (a held one is due now).
    op.execute(
        """
        UPDATE webhook_deliveries AS d
        SET next_attempt_at = COALESCE(q.next_attempt_at, statement_timestamp())
        FROM webhook_delivery_queue AS q WHERE q.delivery_id = d.id
        """
    )
    op.execute(
        """
        UPDATE webhook_deliveries AS d SET next_attempt_at = statement_timestamp()
        FROM webhook_delivery_leases AS l WHERE l.delivery_id = d.id AND d.status = 'pending'
        """
    )
    op.drop_index('ix_webhook_deliveries_endpoint_failed', table_name='webhook_deliveries')
    op.drop_index('ix_webhook_deliveries_brand_failed', table_name='webhook_deliveries')
    op.drop_index('ix_webhook_deliveries_endpoint_created', table_name='webhook_deliveries')
    op.drop_column('webhook_deliveries', 'failed_at')
    op.create_index(
        'ix_webhook_deliveries_brand_status', 'webhook_deliveries',
        ['brand_id', 'status', 'created_at', 'id'],
    )
    op.create_index(
        'ix_webhook_deliveries_brand_endpoint', 'webhook_deliveries',
        ['brand_id', 'endpoint_id', 'created_at', 'id'],
    )
    op.create_index(
        'ix_webhook_deliveries_endpoint_due_order', 'webhook_deliveries',
        ['endpoint_id', 'next_attempt_at', 'id'],
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.create_index(
        'ix_webhook_deliveries_due', 'webhook_deliveries', ['next_attempt_at'],
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.create_index(
        'ix_webhook_deliveries_endpoint_leased', 'webhook_deliveries',
        ['endpoint_id', 'leased_until'], postgresql_where=sa.text('lease_token IS NOT NULL'),
    )

    op.drop_table('webhook_delivery_loops')
    op.drop_table('webhook_delivery_leases')
    op.drop_table('webhook_delivery_queue')

    op.drop_index('ix_webhook_endpoints_ready', table_name='webhook_endpoints')
    for column in ('campaign_ids', 'ordering', 'ready_at'):
        op.drop_column('webhook_endpoints', column)
