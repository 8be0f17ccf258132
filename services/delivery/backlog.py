"""What the delivery work looks like from outside: the deliveries an endpoint has waiting for a
retry (the dashboard's "retry now" button), and the figures `GET /metrics` shows, each read in a
bounded number of rows however large the queue (docs/operations.md says what to alert on)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text

from extensions import db

# The endpoint's deliveries waiting for a retry: queued after a failed attempt, due later
# (a held one, null, waits for an earlier one of its subject, not for a time).
_COUNT_WAITING = text(
    """
    SELECT count(*) FROM webhook_delivery_queue
    WHERE endpoint_id = :endpoint_id AND attempt_count > 0
      AND next_attempt_at > COALESCE(CAST(:now AS timestamptz), statement_timestamp())
    """
)


def waiting_retries(endpoint_id: str, *, now: datetime | None = None) -> int:
    """How many deliveries of the endpoint wait for a retry: what retry-now brings forward. An
    index-only count of that endpoint's queue (the brand's own read, no lock taken)."""
    return db.session.execute(_COUNT_WAITING, {"endpoint_id": endpoint_id, "now": now}).scalar_one()


@dataclass(frozen=True)
class DeliveryBacklog:
    """The work waiting, for `GET /metrics`."""

    # Exact up to COUNT_EXACT_UP_TO; past it, PostgreSQL's live-row statistics of the queue.
    pending: int
    oldest_due_at: datetime | None  # the oldest due time any loop's last walk saw waiting


# A scrape counts at most this many queued rows (a few milliseconds), never a million.
COUNT_EXACT_UP_TO = 10_000


def delivery_backlog() -> DeliveryBacklog:
    counted, estimated, oldest = db.session.execute(_BACKLOG, {"cap": COUNT_EXACT_UP_TO}).one()
    pending = counted if counted < COUNT_EXACT_UP_TO else max(counted, int(estimated or 0))
    return DeliveryBacklog(pending=pending, oldest_due_at=oldest)


# Pending work is every row of the queue and the leases (the leases hold what is in flight: a
# few hundred per worker); the loops' own view of the lag, written with their heartbeats.
_BACKLOG = text(
    """
    SELECT (SELECT count(*) FROM (SELECT 1 FROM webhook_delivery_queue LIMIT :cap) AS q)
               + (SELECT count(*) FROM webhook_delivery_leases),
           (SELECT sum(n_live_tup) FROM pg_stat_user_tables
            WHERE relname IN ('webhook_delivery_queue', 'webhook_delivery_leases')),
           (SELECT min(oldest_due_at) FROM webhook_delivery_loops
            WHERE last_round_at > statement_timestamp() - interval '1 minute')
    """
)


@dataclass(frozen=True)
class LoopAge:
    hostname: str
    pid: int
    age_seconds: float


# A loop killed without a word is listed this long, then forgotten.
FORGET_LOOPS_AFTER = "1 hour"


def delivery_loop_ages() -> list[LoopAge]:
    """Every delivery loop's time since its last round (loop.py writes them), oldest first;
    loops silent for over an hour are forgotten."""
    db.session.execute(_FORGET_LOOPS)
    rows = db.session.execute(_LOOP_AGES).all()
    return [LoopAge(hostname=row[0], pid=row[1], age_seconds=float(row[2])) for row in rows]


_FORGET_LOOPS = text(
    f"DELETE FROM webhook_delivery_loops "  # noqa: S608 - a constant
    f"WHERE last_round_at < statement_timestamp() - interval '{FORGET_LOOPS_AFTER}'"
)
_LOOP_AGES = text(
    """
    SELECT hostname, pid, EXTRACT(EPOCH FROM statement_timestamp() - last_round_at)
    FROM webhook_delivery_loops ORDER BY last_round_at
    """
)
