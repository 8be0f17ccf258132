"""endpoints: their attempts counted by the hour, kept by a trigger on webhook_attempts

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-26 18:00:00

fetch-endpoints shows each endpoint's last 24 hours (`successRate24h`, `lastSuccessAt`), and
counting the window's attempts on every call grows with the brand's traffic: 86,000 attempts a
day cost 25 ms whether read from the table or from an index alone (bench/delivery_log.py).
`webhook_endpoint_hours` holds the counts per endpoint and UTC hour: attempts, successes, and
the last success and failure. A statement-level trigger on `webhook_attempts` adds every
insert's attempts to their hours in the inserting transaction (one grouped upsert per
statement, whatever writes the attempts), so the counts are the attempts' own.

The attempts of the last two days are counted into it here; the trigger is created first, and
its lock on webhook_attempts holds inserts until this migration commits, so none is counted
twice or missed.
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None

ID = sa.String(40)
TIMESTAMP = sa.DateTime(timezone=True)
# The attempts of a set of rows, by endpoint and UTC hour (the session's time zone aside).
COUNTED = """
    SELECT endpoint_id, date_trunc('hour', requested_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC',
           count(*), count(*) FILTER (WHERE error IS NULL),
           max(requested_at) FILTER (WHERE error IS NULL),
           max(requested_at) FILTER (WHERE error IS NOT NULL)
    FROM {source}
    GROUP BY 1, 2
"""


def upgrade():
    op.create_table(
        'webhook_endpoint_hours',
        sa.Column('endpoint_id', ID, nullable=False),
        sa.Column('hour', TIMESTAMP, nullable=False),
        sa.Column('attempts', sa.Integer(), nullable=False),
        sa.Column('succeeded', sa.Integer(), nullable=False),
        sa.Column('last_success_at', TIMESTAMP, nullable=True),
        sa.Column('last_failure_at', TIMESTAMP, nullable=True),
        sa.ForeignKeyConstraint(
            ['endpoint_id'], ['webhook_endpoints.id'],
            name='fk_webhook_endpoint_hours_endpoint_id_webhook_endpoints', ondelete='CASCADE',
        ),
        sa.PrimaryKeyConstraint('endpoint_id', 'hour', name='pk_webhook_endpoint_hours'),
    )
    op.create_index('ix_webhook_endpoint_hours_hour', 'webhook_endpoint_hours', ['hour'])
    op.execute(
        f"""
        CREATE FUNCTION webhook_count_endpoint_hours() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO webhook_endpoint_hours AS counted (
                endpoint_id, hour, attempts, succeeded, last_success_at, last_failure_at
            )
            {COUNTED.format(source='inserted')}
            ON CONFLICT (endpoint_id, hour) DO UPDATE
            SET attempts = counted.attempts + excluded.attempts,
                succeeded = counted.succeeded + excluded.succeeded,
                last_success_at = GREATEST(counted.last_success_at, excluded.last_success_at),
                last_failure_at = GREATEST(counted.last_failure_at, excluded.last_failure_at);
            RETURN NULL;
        END
        $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER webhook_attempts_count_endpoint_hours
        AFTER INSERT ON webhook_attempts REFERENCING NEW TABLE AS inserted
        FOR EACH STATEMENT EXECUTE FUNCTION webhook_count_endpoint_hours()
        """
    )
    op.execute(
        f"""
        INSERT INTO webhook_endpoint_hours (
            endpoint_id, hour, attempts, succeeded, last_success_at, last_failure_at
        )
        {COUNTED.format(
            source="webhook_attempts WHERE requested_at >= now() - interval '2 days'"
        )}
        """
    )


def downgrade():
    op.execute('DROP TRIGGER webhook_attempts_count_endpoint_hours ON webhook_attempts')
    op.execute('DROP FUNCTION webhook_count_endpoint_hours()')
    op.drop_index('ix_webhook_endpoint_hours_hour', table_name='webhook_endpoint_hours')
    op.drop_table('webhook_endpoint_hours')
