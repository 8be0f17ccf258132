"""The delivery loop's work, as every writer of it sees it: the queue of pending deliveries waiting
for an attempt, the leases of those on the wire (models/delivery_queue.py), and each endpoint's
place in the claim's order, `webhook_endpoints.ready_at`.

`ready_at` is a hint, kept by every statement that changes an endpoint's work, with one promise:
it is never later than the first moment a claim could find an attempt to start there. So a
claim reads endpoints in `ready_at` order, one index probe each, and never walks the endpoints
that have nothing to do (issue 35). What each writer does:

- a publisher (services/events.py, and redeliveries) adds due work: it locks the receiving
  endpoints `FOR KEY SHARE` before it reads their `ready_at`, and brings it to now when it is
  null, or later than now while the endpoint has room and no breaker pause (`READY_RECEIVING`);
- a record (an attempt ended: a lease freed, perhaps a retry queued) brings it to now, or to the
  breaker's next probe;
- a claim (services/delivery_attempts.py) moves it on: to now for an endpoint it served that has
  more due (the back of the line: endpoints take turns), to the breaker's next probe, to the
  first lease's end for an endpoint whose slots are all taken, and to the next retry (or null)
  for one with nothing due. That last move is the only one that could miss work it cannot see
  (a publisher's delivery not committed yet), so a claim makes it only under `FOR UPDATE` on
  the endpoint, which waits for no publisher and is refused while one holds its `KEY SHARE`:
  then the endpoint simply stays ready and the next claim looks again.

Lowering `ready_at` is always safe (at worst a claim finds nothing); raising it is safe when the
reason is one no publisher can change (a pause, full slots). Every time comparison is the
database's clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from flask import current_app
from sqlalchemy import text

from extensions import db
from models.webhook_delivery import FAILED, PENDING

# An endpoint whose last this many attempts failed in a row is probed with one attempt at a time
# (a half-open circuit breaker), whatever WEBHOOK_ENDPOINT_CONCURRENCY allows a healthy one: a
# receiver that hangs holds one slot, not all of them, and one that is down is not hammered.
# After each failure of such a run, its next attempt waits 1, 2, 4... seconds (at most the
# timeout): `next_probe_at`, which every worker's claim reads (services/endpoint_health.py).
PROBING_AFTER_FAILURES = 3

# The database's clock, unless a caller (a test) gives the time.
NOW_SQL = "COALESCE(CAST(:now AS timestamptz), statement_timestamp())"


def sql(statement: str) -> str:
    """`{now}` in a statement of this family replaced by the time above."""
    return statement.replace("{now}", NOW_SQL)


def endpoint_limit_sql(alias: str) -> str:
    """How many attempts the endpoint `alias` may have in flight, across all workers: one while
    it keeps failing (the breaker), else `:endpoint_limit`. Binds :probing_after."""
    return (
        f"CASE WHEN {alias}.consecutive_failures >= :probing_after THEN 1 ELSE :endpoint_limit END"
    )


def in_flight_sql(alias: str) -> str:
    """The endpoint `alias`'s live leases, every worker's (a lapsed one is not counted)."""
    return (
        "(SELECT count(*) FROM webhook_delivery_leases AS lease "  # noqa: S608 - constant SQL
        f"WHERE lease.endpoint_id = {alias}.id AND lease.leased_until >= {{now}})"
    )


# For a statement that adds due work for the endpoints of a CTE `receiving` (id, ready_at,
# next_probe_at, consecutive_failures), whose rows it locked FOR KEY SHARE before reading them:
# bring each one's turn to now unless it already comes by then, or cannot start anything before
# its breaker's pause or a slot frees (whoever ends those moves it again). The rows to change are
# locked in id order first, as a record locks its endpoints, so that the two never deadlock.
# Binds :endpoint_limit and :probing_after; the time is the statement's (publishers have no test
# clock).
READY_RECEIVING = (
    """
    to_ready AS (
        SELECT ready.id, receiving.next_probe_at
        FROM webhook_endpoints AS ready JOIN receiving ON receiving.id = ready.id
        WHERE receiving.ready_at IS NULL
           OR (receiving.ready_at > {now}
               AND (receiving.next_probe_at IS NULL OR receiving.next_probe_at <= {now})
               AND """  # noqa: S608 - constant SQL, put together at import
    + in_flight_sql("receiving")
    + " < "
    + endpoint_limit_sql("receiving")
    + """)
        ORDER BY ready.id
        FOR NO KEY UPDATE OF ready
    ),
    readied AS (
        UPDATE webhook_endpoints AS ready
        SET ready_at = GREATEST({now}, COALESCE(to_ready.next_probe_at, {now}))
        FROM to_ready WHERE ready.id = to_ready.id
    )"""
).replace("{now}", "statement_timestamp()")


def queue_parameters() -> dict[str, int]:
    """What READY_RECEIVING and the claim bind from the settings."""
    return {
        "probing_after": PROBING_AFTER_FAILURES,
        "endpoint_limit": current_app.extensions["settings"].webhook_endpoint_concurrency,
    }


def fail_pending_deliveries(endpoint_id: str, *, error: str, now: datetime | None = None) -> int:
    """End every pending delivery of the endpoint as `failed` (its endpoint was disabled or
    deleted); how many. The queued ones leave the queue. One whose attempt is in flight keeps
    its lease, so that the attempt counts against the endpoint's limit until its worker records
    it: a success then makes it `delivered` (the receiver has it), a failure leaves it failed."""
    return db.session.execute(
        _FAIL_PENDING, {"endpoint_id": endpoint_id, "error": error, "now": now}
    ).scalar_one()


_FAIL_PENDING = text(
    sql(
        """
        WITH unqueued AS (
            DELETE FROM webhook_delivery_queue WHERE endpoint_id = :endpoint_id
            RETURNING delivery_id
        ),
        on_the_wire AS (
            SELECT delivery_id FROM webhook_delivery_leases WHERE endpoint_id = :endpoint_id
        ),
        failed AS (
            UPDATE webhook_deliveries
            SET status = :failed, failed_at = {now}, last_error = :error, next_attempt_at = NULL
            WHERE status = :pending
              AND id IN (SELECT delivery_id FROM unqueued
                         UNION ALL SELECT delivery_id FROM on_the_wire)
            RETURNING id
        )
        SELECT count(*) FROM failed
        """
    )
).bindparams(failed=FAILED, pending=PENDING)


@dataclass(frozen=True)
class RetriesBrought:
    endpoint_id: str
    due: int


def bring_retries_forward(
    endpoint_id: str, *, override_retry_after: bool, now: datetime | None = None
) -> int:
    """Every delivery of the endpoint waiting for a retry becomes due now; how many. The claim
    keeps the endpoint's in-flight limit. A receiver's Retry-After is kept unless
    `override_retry_after` (a person asked: CONTRACT 12.4); held ones (ordering) stay held."""
    return db.session.execute(
        _BRING_FORWARD,
        {"endpoint_id": endpoint_id, "override": override_retry_after, "now": now},
    ).scalar_one()


# The endpoint's deliveries waiting for a retry: queued after a failed attempt, due later
# (a held one, null, waits for an earlier one of its subject, not for a time).
_WAITING_FOR_RETRY = """
    endpoint_id = :endpoint_id AND attempt_count > 0 AND next_attempt_at > {now}
"""


def waiting_retries(endpoint_id: str, *, now: datetime | None = None) -> int:
    """How many deliveries of the endpoint wait for a retry: what `bring_retries_forward`
    would bring forward now (the endpoint page's "Retry the N waiting deliveries now")."""
    return db.session.execute(_COUNT_WAITING, {"endpoint_id": endpoint_id, "now": now}).scalar_one()


_COUNT_WAITING = text(
    sql(
        "SELECT count(*) FROM webhook_delivery_queue WHERE "  # noqa: S608 - constant SQL
        + _WAITING_FOR_RETRY
    )
)

_BRING_FORWARD = text(
    sql(
        """
        WITH brought AS (
            UPDATE webhook_delivery_queue
            SET next_attempt_at = CASE WHEN CAST(:override AS boolean) THEN {now}
                                       ELSE GREATEST({now}, COALESCE(not_before, {now})) END,
                not_before = CASE WHEN CAST(:override AS boolean) THEN NULL ELSE not_before END
            WHERE """  # noqa: S608 - constant SQL
        + _WAITING_FOR_RETRY
        + """
            RETURNING delivery_id, next_attempt_at
        ),
        shown AS (
            UPDATE webhook_deliveries AS d SET next_attempt_at = brought.next_attempt_at
            FROM brought WHERE d.id = brought.delivery_id
        ),
        readied AS (
            UPDATE webhook_endpoints SET ready_at = LEAST(ready_at, {now})
            WHERE id = :endpoint_id AND EXISTS (SELECT 1 FROM brought)
        )
        SELECT count(*) FROM brought
        """
    )
)


def release_held(endpoint_ids: list[str], *, now: datetime | None = None) -> None:
    """Every held delivery of these endpoints becomes due, in its place from before it was held
    (their ordering was turned off)."""
    db.session.execute(_RELEASE_ALL_HELD, {"endpoint_ids": endpoint_ids, "now": now})


_RELEASE_ALL_HELD = text(
    sql(
        """
        WITH released AS (
            UPDATE webhook_delivery_queue AS q
            SET next_attempt_at = (SELECT LEAST(d.next_attempt_at, {now})
                                   FROM webhook_deliveries AS d WHERE d.id = q.delivery_id)
            WHERE q.endpoint_id = ANY(CAST(:endpoint_ids AS varchar[]))
              AND q.next_attempt_at IS NULL
            RETURNING q.endpoint_id
        )
        UPDATE webhook_endpoints SET ready_at = LEAST(COALESCE(ready_at, {now}), {now})
        WHERE id IN (SELECT endpoint_id FROM released)
        """
    )
)


@dataclass(frozen=True)
class DeliveryBacklog:
    """The work waiting, for `GET /metrics` (docs/operations.md says what to alert on)."""

    pending: int
    due: int  # claimable now: queued and due, or leased by a worker whose lease lapsed
    oldest_due_at: datetime | None


def delivery_backlog(*, now: datetime | None = None) -> DeliveryBacklog:
    """Counted on the queue and the leases, which hold pending deliveries only."""
    pending, due, oldest = db.session.execute(_BACKLOG, {"now": now}).one()
    db.session.commit()
    return DeliveryBacklog(pending=pending, due=due, oldest_due_at=oldest)


_BACKLOG = text(
    sql(
        """
        SELECT (SELECT count(*) FROM webhook_delivery_queue)
                   + (SELECT count(*) FROM webhook_delivery_leases AS l
                      JOIN webhook_deliveries AS d ON d.id = l.delivery_id
                      WHERE d.status = 'pending'),
               (SELECT count(*) FROM webhook_delivery_queue WHERE next_attempt_at <= {now})
                   + (SELECT count(*) FROM webhook_delivery_leases WHERE leased_until < {now}),
               (SELECT min(next_attempt_at) FROM webhook_delivery_queue
                WHERE next_attempt_at <= {now})
        """
    )
)


@dataclass(frozen=True)
class LoopAge:
    hostname: str
    pid: int
    age_seconds: float


# A loop killed without a word is listed this long, then forgotten.
FORGET_LOOPS_AFTER = "1 hour"


def delivery_loop_ages() -> list[LoopAge]:
    """Every delivery loop's time since its last round (workers/delivery_loop.py writes them),
    oldest first; loops silent for over an hour are forgotten."""
    db.session.execute(_FORGET_LOOPS)
    rows = db.session.execute(_LOOP_AGES).all()
    db.session.commit()
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
