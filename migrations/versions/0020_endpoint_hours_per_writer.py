"""endpoint hours: one counter row per writing session, so two workers never wait on one

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-28

The statement trigger on `webhook_attempts` adds each record's attempts to their endpoint's hour
with an upsert. Two workers recording attempts of one endpoint in the same hour upserted the same
row, so the second waited until the first's transaction committed: 16.5% of a worker's samples
at 100 endpoints with two workers (bench/scale.py). Each session now counts into a row of its
own (`writer`, its backend's pid: two transactions running at once are never on one backend);
readers already sum an endpoint's rows. An hour then has a row per session that wrote to it:
a worker's loop keeps one connection, so about one per worker.

Down: the rows of an hour are summed back into one.
"""

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

FUNCTION = """
    CREATE OR REPLACE FUNCTION webhook_count_endpoint_hours() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO webhook_endpoint_hours AS counted (
            endpoint_id, hour, {writer_column}attempts, succeeded, last_success_at,
            last_failure_at
        )
        SELECT endpoint_id, date_trunc('hour', requested_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC',
               {writer_value}count(*), count(*) FILTER (WHERE error IS NULL),
               max(requested_at) FILTER (WHERE error IS NULL),
               max(requested_at) FILTER (WHERE error IS NOT NULL)
        FROM inserted
        GROUP BY 1, 2
        ON CONFLICT ({conflict}) DO UPDATE
        SET attempts = counted.attempts + excluded.attempts,
            succeeded = counted.succeeded + excluded.succeeded,
            last_success_at = GREATEST(counted.last_success_at, excluded.last_success_at),
            last_failure_at = GREATEST(counted.last_failure_at, excluded.last_failure_at);
        RETURN NULL;
    END
    $$
"""


def upgrade():
    op.add_column(
        "webhook_endpoint_hours",
        sa.Column("writer", sa.Integer(), nullable=False, server_default="0"),
    )
    op.alter_column("webhook_endpoint_hours", "writer", server_default=None)
    op.drop_constraint("pk_webhook_endpoint_hours", "webhook_endpoint_hours", type_="primary")
    op.create_primary_key(
        "pk_webhook_endpoint_hours", "webhook_endpoint_hours", ["endpoint_id", "hour", "writer"]
    )
    op.execute(
        FUNCTION.format(
            writer_column="writer, ",
            writer_value="pg_backend_pid(), ",
            conflict="endpoint_id, hour, writer",
        )
    )


def downgrade():
    # Attempts written meanwhile wait for this transaction, then count into the summed rows.
    op.execute("LOCK TABLE webhook_endpoint_hours IN EXCLUSIVE MODE")
    op.execute(
        """
        WITH summed AS (
            DELETE FROM webhook_endpoint_hours RETURNING *
        )
        INSERT INTO webhook_endpoint_hours (
            endpoint_id, hour, writer, attempts, succeeded, last_success_at, last_failure_at
        )
        SELECT endpoint_id, hour, 0, sum(attempts), sum(succeeded), max(last_success_at),
               max(last_failure_at)
        FROM summed GROUP BY endpoint_id, hour
        """
    )
    op.drop_constraint("pk_webhook_endpoint_hours", "webhook_endpoint_hours", type_="primary")
    op.create_primary_key(
        "pk_webhook_endpoint_hours", "webhook_endpoint_hours", ["endpoint_id", "hour"]
    )
    op.drop_column("webhook_endpoint_hours", "writer")
    op.execute(FUNCTION.format(writer_column="", writer_value="", conflict="endpoint_id, hour"))
