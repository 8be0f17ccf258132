"""delivery engine: no shared turn state, held deliveries say what they wait for, bulk changes
as jobs of bounded batches, per-endpoint in-flight limits, autovacuum for the hot tables

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-28 12:00:00

Issue 41: one brand's data could stop every brand's delivery, because a round did every
endpoint's bookkeeping in one transaction. Now (docs/delivery.md):

- `webhook_attempts` and `webhook_endpoint_hours` lose their foreign key to the endpoint: its
  check locked the endpoint's row at every record, so one session holding a row held every
  brand's records. The delivery's own key to its endpoint keeps attempts right.
- `webhook_endpoints.ready_at` and its index go: a claim walks the queue's endpoints itself,
  so no publisher, claim or record writes an endpoint row per delivery. `max_in_flight`
  (CONTRACT 13.5) replaces the global limit for an endpoint that sets it. The endpoints keep
  room in each page (fillfactor 50) so that their health updates stay HOT, and a partial index
  finds the few with a previous secret to forget.
- `webhook_delivery_queue.held_behind`: the delivery a held one waits for (CONTRACT 13.1). A
  statement trigger on `webhook_deliveries` releases the deliveries held behind any delivery
  that stops being pending, whatever ended it. The queue's claim index drops `delivery_id`.
  A global index on the leases' end finds lapsed ones.
- `webhook_bulk_jobs`: a change that grows with a brand's data (ending a closed endpoint's
  pending deliveries, retry-now, catch-up after an outage, releasing holds when ordering is
  turned off) is a row here, run by the workers in batches of at most 1,000 rows.
- `webhook_delivery_loops.oldest_due_at`: the delivery lag each loop saw, for GET /metrics.
- Per-table autovacuum settings for the tables every delivery writes, so that their dead rows
  are cleaned within seconds, not at 20% of the table (PostgreSQL's default).

Held deliveries of today are released by the migration (they carry no `held_behind`); the
claim holds them again where an earlier delivery of their subject is still pending.
"""

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

ID = sa.String(40)
TIMESTAMP = sa.DateTime(timezone=True)

# The tables written for every delivery: vacuumed after a fixed number of dead rows rather than a
# share of the table, and analysed as often, so that a drain of a million leaves no bloat behind.
HOT_TABLES = {
    "webhook_delivery_queue": 2000,
    "webhook_delivery_leases": 1000,
    "webhook_bulk_jobs": 200,
    "webhook_delivery_loops": 200,
    "webhook_endpoints": 200,
    "webhook_endpoint_hours": 1000,
}
AUTOVACUUM = (
    "autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = {rows}, "
    "autovacuum_analyze_scale_factor = 0, autovacuum_analyze_threshold = {rows}, "
    "autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_insert_threshold = {rows}, "
    "autovacuum_vacuum_cost_delay = 0"
)
AUTOVACUUM_KEYS = (
    "autovacuum_vacuum_scale_factor",
    "autovacuum_vacuum_threshold",
    "autovacuum_analyze_scale_factor",
    "autovacuum_analyze_threshold",
    "autovacuum_vacuum_insert_scale_factor",
    "autovacuum_vacuum_insert_threshold",
    "autovacuum_vacuum_cost_delay",
)

# A delivery that stops being pending (delivered or failed, by a record, a bulk job, an erasure:
# any statement) lets go of the deliveries held behind it: each is due again at the time it was
# due before it was held (never later than now), and the claim holds it again if an earlier one
# of its subject is still pending.
RELEASE_FUNCTION = """
    CREATE FUNCTION webhook_release_held() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        UPDATE webhook_delivery_queue AS q
        SET next_attempt_at = LEAST(d.next_attempt_at, statement_timestamp()),
            held_behind = NULL
        FROM ended
        JOIN webhook_deliveries AS d ON true
        WHERE q.held_behind = ended.id AND d.id = q.delivery_id AND ended.status <> 'pending';
        RETURN NULL;
    END
    $$
"""


def upgrade():
    # A record never waits for an endpoint's row: no foreign key check of its inserts locks it.
    op.drop_constraint(
        'fk_webhook_attempts_endpoint_id_webhook_endpoints', 'webhook_attempts', type_='foreignkey'
    )
    op.drop_constraint(
        'fk_webhook_endpoint_hours_endpoint_id_webhook_endpoints', 'webhook_endpoint_hours',
        type_='foreignkey',
    )

    # Endpoints: no turn state; a limit of their own; room for HOT health updates.
    op.drop_index("ix_webhook_endpoints_ready", table_name="webhook_endpoints")
    op.drop_column("webhook_endpoints", "ready_at")
    op.add_column("webhook_endpoints", sa.Column("max_in_flight", sa.SmallInteger(), nullable=True))
    op.create_index(
        "ix_webhook_endpoints_previous_secret",
        "webhook_endpoints",
        ["previous_secret_expires_at"],
        postgresql_where=sa.text("previous_secret_expires_at IS NOT NULL"),
    )
    op.execute("ALTER TABLE webhook_endpoints SET (fillfactor = 50)")

    # The queue: what a held delivery waits for; a smaller claim index.
    op.add_column("webhook_delivery_queue", sa.Column("held_behind", ID, nullable=True))
    op.execute(
        "UPDATE webhook_delivery_queue AS q SET next_attempt_at = LEAST(d.next_attempt_at, now())"
        " FROM webhook_deliveries AS d WHERE d.id = q.delivery_id AND q.next_attempt_at IS NULL"
    )
    op.drop_index("ix_webhook_delivery_queue_endpoint_due", table_name="webhook_delivery_queue")
    op.create_index(
        "ix_webhook_delivery_queue_endpoint_due",
        "webhook_delivery_queue",
        ["endpoint_id", "next_attempt_at"],
    )
    op.create_index(
        "ix_webhook_delivery_queue_held_behind",
        "webhook_delivery_queue",
        ["held_behind"],
        postgresql_where=sa.text("held_behind IS NOT NULL"),
    )
    op.create_index(
        "ix_webhook_delivery_leases_leased_until", "webhook_delivery_leases", ["leased_until"]
    )
    op.execute(RELEASE_FUNCTION)
    op.execute(
        """
        CREATE TRIGGER webhook_deliveries_release_held
        AFTER UPDATE ON webhook_deliveries REFERENCING NEW TABLE AS ended
        FOR EACH STATEMENT EXECUTE FUNCTION webhook_release_held()
        """
    )

    # Bulk changes, run in batches by the workers.
    op.create_table(
        "webhook_bulk_jobs",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("kind", sa.String(20), nullable=False),
        sa.Column("brand_id", ID, nullable=False),
        sa.Column("endpoint_id", ID, nullable=True),
        sa.Column("subject_key", sa.String(80), nullable=True),
        sa.Column("note", sa.String(500), nullable=True),
        sa.Column("requested_at", TIMESTAMP, nullable=False),
        sa.Column("done", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("last_run_at", TIMESTAMP, nullable=True),
        sa.Column("finished_at", TIMESTAMP, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_webhook_bulk_jobs"),
    )
    op.create_index(
        "ix_webhook_bulk_jobs_open",
        "webhook_bulk_jobs",
        ["kind", "endpoint_id"],
        unique=True,
        postgresql_where=sa.text("finished_at IS NULL AND endpoint_id IS NOT NULL"),
    )
    op.create_index(
        "ix_webhook_bulk_jobs_turn",
        "webhook_bulk_jobs",
        ["last_run_at", "id"],
        postgresql_where=sa.text("finished_at IS NULL"),
    )
    op.create_index(
        "ix_webhook_bulk_jobs_finished",
        "webhook_bulk_jobs",
        ["finished_at"],
        postgresql_where=sa.text("finished_at IS NOT NULL"),
    )
    # Each loop says the oldest due time its last walk round the queue saw (GET /metrics): a
    # count over the whole queue at every scrape took 300-700 ms at a million pending.
    op.add_column("webhook_delivery_loops", sa.Column("oldest_due_at", TIMESTAMP, nullable=True))

    for table, rows in HOT_TABLES.items():
        op.execute(f"ALTER TABLE {table} SET ({AUTOVACUUM.format(rows=rows)})")


def downgrade():
    for table in HOT_TABLES:
        op.execute(f"ALTER TABLE {table} RESET ({', '.join(AUTOVACUUM_KEYS)})")
    op.drop_column("webhook_delivery_loops", "oldest_due_at")
    op.drop_index("ix_webhook_bulk_jobs_finished", table_name="webhook_bulk_jobs")
    op.drop_index("ix_webhook_bulk_jobs_turn", table_name="webhook_bulk_jobs")
    op.drop_index("ix_webhook_bulk_jobs_open", table_name="webhook_bulk_jobs")
    op.drop_table("webhook_bulk_jobs")
    op.execute("DROP TRIGGER webhook_deliveries_release_held ON webhook_deliveries")
    op.execute("DROP FUNCTION webhook_release_held()")
    op.drop_index("ix_webhook_delivery_leases_leased_until", table_name="webhook_delivery_leases")
    op.drop_index("ix_webhook_delivery_queue_held_behind", table_name="webhook_delivery_queue")
    op.drop_index("ix_webhook_delivery_queue_endpoint_due", table_name="webhook_delivery_queue")
    op.create_index(
        "ix_webhook_delivery_queue_endpoint_due",
        "webhook_delivery_queue",
        ["endpoint_id", "next_attempt_at", "delivery_id"],
    )
    op.drop_column("webhook_delivery_queue", "held_behind")
    op.execute("ALTER TABLE webhook_endpoints RESET (fillfactor)")
    op.execute(
        "DELETE FROM webhook_endpoint_hours WHERE endpoint_id NOT IN"
        " (SELECT id FROM webhook_endpoints)"
    )
    op.create_foreign_key(
        "fk_webhook_endpoint_hours_endpoint_id_webhook_endpoints",
        "webhook_endpoint_hours",
        "webhook_endpoints",
        ["endpoint_id"],
        ["id"],
        ondelete="CASCADE",
    )
    op.create_foreign_key(
        "fk_webhook_attempts_endpoint_id_webhook_endpoints",
        "webhook_attempts",
        "webhook_endpoints",
        ["endpoint_id"],
        ["id"],
        ondelete="CASCADE",
    )
    op.drop_index("ix_webhook_endpoints_previous_secret", table_name="webhook_endpoints")
    op.drop_column("webhook_endpoints", "max_in_flight")
    op.add_column("webhook_endpoints", sa.Column("ready_at", TIMESTAMP, nullable=True))
    # Every endpoint with pending work is ready at once; the old claim settles the rest.
    op.execute(
        "UPDATE webhook_endpoints SET ready_at = now() WHERE id IN"
        " (SELECT endpoint_id FROM webhook_delivery_queue"
        "  UNION SELECT endpoint_id FROM webhook_delivery_leases)"
    )
    op.create_index(
        "ix_webhook_endpoints_ready",
        "webhook_endpoints",
        ["ready_at", "id"],
        postgresql_where=sa.text("ready_at IS NOT NULL"),
    )
