"""queue: releasing held deliveries reads only the index of what is held

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-28

The statement trigger that releases what waits behind a delivery that stopped being pending ran
in every record. Planned once per connection as a generic plan, it joined the transition table
to the whole queue and the whole delivery log by sequential scans: with one brand's 250,000
queued, every round of every worker took over 100 ms (bench/chaos.py backlog-410: the other
brand's deliveries 27 s late). It now reads the partial index of held rows, one probe per ended
delivery, whatever the planner's estimates.
"""

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

# Before: one join of the transition table, the queue and the delivery log, planned as the
# planner liked (0016).
OLD_BODY = """
    BEGIN
        UPDATE webhook_delivery_queue AS q
        SET next_attempt_at = LEAST(d.next_attempt_at, statement_timestamp()),
            held_behind = NULL
        FROM ended
        JOIN webhook_deliveries AS d ON true
        WHERE q.held_behind = ended.id AND d.id = q.delivery_id AND ended.status <> 'pending';
        RETURN NULL;
    END
"""
# Now: for each delivery that ended, a probe of the partial index of held rows (OFFSET 0 keeps
# the probe per ended row: the planner cannot fold it into a join of its choosing).
BODY = """
    BEGIN
        UPDATE webhook_delivery_queue AS q
        SET next_attempt_at = LEAST(d.next_attempt_at, statement_timestamp()),
            held_behind = NULL
        FROM ended AS e
        CROSS JOIN LATERAL (
            SELECT w.delivery_id FROM webhook_delivery_queue AS w
            WHERE w.held_behind = e.id OFFSET 0
        ) AS h
        JOIN webhook_deliveries AS d ON d.id = h.delivery_id
        WHERE e.status <> 'pending' AND q.delivery_id = h.delivery_id;
        RETURN NULL;
    END
"""


def upgrade():
    # Nested loops over indexes only: one probe of the held index per ended delivery, then the
    # rows by primary key. A function's SET applies while it runs, and to nothing else.
    op.execute(
        "CREATE OR REPLACE FUNCTION webhook_release_held() RETURNS trigger LANGUAGE plpgsql"
        " SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off"
        f" AS $${BODY}$$"
    )


def downgrade():
    op.execute(
        "CREATE OR REPLACE FUNCTION webhook_release_held() RETURNS trigger LANGUAGE plpgsql"
        " RESET ALL"
        f" AS $${OLD_BODY}$$"
    )
