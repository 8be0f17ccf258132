"""The queue's statements: how publishers add work, how a worker claims attempts, and how it
records what came of them (CONTRACT 6.2, 12.2, 13.1, 13.5). docs/delivery.md explains the design.

Every pending delivery is in exactly one of two tables: queued (`webhook_delivery_queue`,
waiting for its next attempt, or held behind an earlier one of its subject) or leased
(`webhook_delivery_leases`, on the wire). The rule of every statement here: it touches the rows
of the attempts it records or claims, and a bounded number of index probes, never anything that
grows with one endpoint's queue. What does grow (failing a closed endpoint's queue, retry-now,
catch-up, releasing holds) is a bulk job (bulk.py).

- A claim walks the endpoints that have queued work in id order from where this worker's last
  walk stopped (one index probe each, at most `walk_max` a claim), wrapping round: every endpoint
  with due work gets its turn, and no row records whose turn it is. The endpoints it can serve
  (taking attempts, not paused, with room under their limit) are locked for the claim's
  transaction with an advisory lock (another worker's claim skips them, nobody waits), then a
  second statement, whose snapshot sees every claim committed before those locks, takes each
  one's lapsed leases and oldest due rows up to its room.
- A record writes a batch of results in one statement. It locks the leases and deliveries it
  writes with SKIP LOCKED: a result whose rows another transaction holds is carried to the next
  round, never waited for. A result whose lease another worker took is discarded.

Times are the database's clock (`statement_timestamp()`), or `now` where a test gives one.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from extensions import db
from models.bulk_job import END_PENDING
from models.webhook_delivery import PENDING
from models.webhook_endpoint import SUBJECT_ORDERING, endpoint_is_open_sql
from services.delivery.outcomes import (
    Attempt,
    AttemptOutcome,
    EndpointState,
    Recorded,
    RetryPolicy,
)
from services.psycopg_direct import fetch_all_on_psycopg

log = logging.getLogger("brand_api.webhooks")

# An endpoint whose last this many attempts failed in a row is probed with one attempt at a time
# (a half-open circuit breaker), whatever its limit allows a healthy one (health.py).
PROBING_AFTER_FAILURES = 3
# How far past an ordered endpoint's room a claim looks for deliveries it can start, holding
# the ones behind an earlier pending delivery of their subject as it goes.
ORDERED_LOOK_AHEAD = 32
# A worker whose heartbeat is older than this no longer counts among those sharing an
# endpoint's limit.
LIVE_WORKER_SECONDS = 10
# The advisory locks of claims: (this, hashtext(endpoint id)).
CLAIM_LOCK_CLASS = 41_001
# A result a record could not write for a reason of the data is tried alone, then reduced, up
# to this many times in all, then dropped (its lease lapses and the delivery is sent again).
RECORD_TRIES = 3

NOW = "COALESCE(CAST(%(now)s AS timestamptz), statement_timestamp())"


def takes_attempts_sql(alias: str) -> str:
    """The endpoint `alias` may be sent attempts now: open (models/webhook_endpoint.py's rule)
    and not clearing the queue it had when it was closed (an `end_pending` job, bulk.py)."""
    return (
        f"({endpoint_is_open_sql(alias)} AND NOT EXISTS"  # noqa: S608 - constant SQL
        " (SELECT 1 FROM webhook_bulk_jobs AS job"
        f" WHERE job.kind = '{END_PENDING}' AND job.endpoint_id = {alias}.id"
        " AND job.finished_at IS NULL))"
    )


def limit_sql(alias: str) -> str:
    """How many attempts the endpoint `alias` may have in flight, across all workers: one while
    it keeps failing (the breaker), else its own `max_in_flight` or the setting."""
    return (
        f"CASE WHEN {alias}.consecutive_failures >= {PROBING_AFTER_FAILURES} THEN 1"
        f" ELSE COALESCE({alias}.max_in_flight, %(endpoint_limit)s) END"
    )


def _in_flight_sql(alias: str, *, owner: bool = False) -> str:
    """The endpoint's live leases (a lapsed one's attempt is over), every worker's or this
    worker's (its tokens begin with its owner id)."""
    mine = " AND left(lease.token, 8) = %(owner)s" if owner else ""
    return (
        "(SELECT count(*) FROM webhook_delivery_leases AS lease"  # noqa: S608 - constant SQL
        f" WHERE lease.endpoint_id = {alias}.id AND lease.leased_until >= {NOW}{mine})"
    )


# --- publishing -------------------------------------------------------------------------------

# For a publishing statement (services/events.py) whose CTE `receiving` holds the endpoints
# that take the event (locked FOR KEY SHARE, so that one closed meanwhile is read again and
# left out) and whose `{deliveries_from}` gives `event` (id, brand_id, name, created_at,
# sequence) one row per delivery: a pending delivery and its queue row for each, due now. The
# queue row carries the event's subject for an endpoint that orders by subject. Nothing else:
# no endpoint row is written, whatever the endpoint's state.
ENQUEUE_CTES = """
    deliveries AS (
        INSERT INTO webhook_deliveries (
            id, brand_id, endpoint_id, event_id, event_name, status, attempt_count,
            next_attempt_at, created_at
        )
        SELECT {delivery_id}, event.brand_id, receiving.id, event.id, event.name, :pending, 0,
               statement_timestamp(), {created_at}
        FROM {deliveries_from}
        RETURNING id, endpoint_id, event_id
    ),
    queued AS (
        INSERT INTO webhook_delivery_queue (
            delivery_id, endpoint_id, next_attempt_at, attempt_count, subject_key, sequence
        )
        SELECT deliveries.id, deliveries.endpoint_id, statement_timestamp(), 0,
               CASE WHEN receiving.ordering = :subject_ordering THEN {subject_key} END,
               CASE WHEN receiving.ordering = :subject_ordering THEN event.sequence END
        FROM deliveries
        JOIN receiving ON receiving.id = deliveries.endpoint_id
        JOIN {event_of_delivery}
    )"""
RECEIVING_COLUMNS = "endpoint.id, endpoint.ordering"
ENQUEUE_PARAMETERS = {"pending": PENDING, "subject_ordering": SUBJECT_ORDERING}


# --- claiming ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claimed:
    attempts: list[Attempt] = field(default_factory=list)
    # Where the next claim's walk begins (the last endpoint this one walked or served).
    cursor: str = ""
    # Since `cycle_start`, the walks went round every endpoint with queued work: no need to walk
    # again before something changes.
    round_done: bool = True
    # The earliest time a walked endpoint's queue falls due after now (sleep no longer).
    next_due_at: datetime | None = None
    # The oldest due time this walk saw still waiting (for GET /metrics).
    oldest_due_at: datetime | None = None


def claim_attempts(
    *,
    slots: int,
    endpoint_limit: int,
    token: str,
    lease: timedelta,
    held: Sequence[str] = (),
    cursor: str = "",
    cycle_start: str = "",
    walk_max: int = 256,
    start_by: float = float("inf"),
    now: datetime | None = None,
) -> Claimed:
    """Lease up to `slots` due deliveries for attempts that start now (the caller commits).

    Walks at most `walk_max` endpoints from `cursor` (`cycle_start`: where the walks since the
    loop last waited began; the claim says when they have gone round). Each endpoint served
    gets up to its room: its limit less every worker's live leases, and at most this worker's
    share of the limit (the limit divided among the live workers), so that workers share an
    endpoint's work. The
    first of every endpoint goes before the second of any. An endpoint that orders by subject
    never starts a delivery while an earlier one of its subject is pending: that one is held
    (`next_attempt_at` null, `held_behind` the earlier one) until the earlier one ends. `held`:
    deliveries this worker is still sending or recording, never taken again by it."""
    connection = db.session.connection()
    params: dict[str, Any] = {
        "now": now,
        "cursor": cursor,
        "cycle_start": cycle_start,
        "walk_max": walk_max,
        "slots": slots,
        "endpoint_limit": endpoint_limit,
        "held": list(held),
        "lock_class": CLAIM_LOCK_CLASS,
    }
    rows = fetch_all_on_psycopg(connection, _PICK, params)
    walk = next(row for row in rows if row[0] == "walk")
    _, new_cursor, round_done, next_due_at, oldest_due_at, closed, _ = walk
    claimed = Claimed(
        cursor=new_cursor or "",
        round_done=round_done,
        next_due_at=next_due_at,
        oldest_due_at=oldest_due_at,
    )
    served = [row for row in rows if row[0] == "endpoint"]
    if len(served) >= slots:
        # More endpoints were ready than slots: the next walk begins after the last served.
        claimed = replace(claimed, cursor=served[-1][1], round_done=False)
    if closed:
        log.info("closed endpoint(s) %s still had queued work: clearing it", ", ".join(closed))
    if not served:
        return claimed
    taken = fetch_all_on_psycopg(
        connection,
        _TAKE,
        {
            **params,
            "endpoint_ids": [row[1] for row in served],
            "owner": token[:8],
            "token": token,
            "lease_seconds": lease.total_seconds(),
            "look_ahead": ORDERED_LOOK_AHEAD,
            "live_seconds": LIVE_WORKER_SECONDS,
        },
    )
    attempts = [
        Attempt(
            delivery_id=row[0],
            endpoint_id=row[1],
            attempt_number=row[2] + 1,
            event_id=row[3],
            event_name=row[4],
            url=row[5],
            secret_ciphertext=row[6],
            previous_secret_ciphertext=row[7],
            body=row[8].encode(),
            token=token,
            start_by=start_by,
        )
        for row in taken
    ]
    return replace(claimed, attempts=attempts)


# The walk: from the cursor, the first queue row of each next endpoint (its earliest due time;
# a held row, null, sorts last), wrapping round to the first endpoint and on up to the cursor.
# The endpoints found due (and those with a lapsed lease: the leases table holds only what is
# in flight) that take attempts, are not paused and have room, in walk order, up to one per
# slot, each locked for this transaction unless another claim holds it. A closed endpoint the
# walk meets with queued work and no job clearing it (a publish that raced its closing) gets
# that job (bulk.py). Last, a row that says where the walk got to.
_WALK = """
    walk(endpoint_id, due_at, n, wrapped) AS (
        SELECT first.endpoint_id, first.next_attempt_at, 1, first.wrapped
        FROM ((SELECT q.endpoint_id, q.next_attempt_at, false AS wrapped
               FROM webhook_delivery_queue AS q WHERE q.endpoint_id > %(cursor)s
               ORDER BY q.endpoint_id, q.next_attempt_at LIMIT 1)
              UNION ALL
              (SELECT q.endpoint_id, q.next_attempt_at, true
               FROM webhook_delivery_queue AS q
               ORDER BY q.endpoint_id, q.next_attempt_at LIMIT 1)
              LIMIT 1) AS first
        UNION ALL
        SELECT step.endpoint_id, step.next_attempt_at, walk.n + 1, step.wrapped
        FROM walk CROSS JOIN LATERAL (
            (SELECT q.endpoint_id, q.next_attempt_at, walk.wrapped AS wrapped
             FROM webhook_delivery_queue AS q
             WHERE q.endpoint_id > walk.endpoint_id
               AND (NOT walk.wrapped OR q.endpoint_id <= %(cursor)s)
             ORDER BY q.endpoint_id, q.next_attempt_at LIMIT 1)
            UNION ALL
            (SELECT q.endpoint_id, q.next_attempt_at, true
             FROM webhook_delivery_queue AS q
             WHERE NOT walk.wrapped AND q.endpoint_id <= %(cursor)s
             ORDER BY q.endpoint_id, q.next_attempt_at LIMIT 1)
            LIMIT 1) AS step
        WHERE walk.n < %(walk_max)s
    )"""

_PICK = f"""
    WITH RECURSIVE {_WALK.strip()},
    walked AS MATERIALIZED (SELECT * FROM walk),
    candidate AS MATERIALIZED (
        SELECT endpoint_id, min(n) AS n FROM (
            SELECT endpoint_id, n FROM walked WHERE due_at <= {NOW}
            UNION ALL
            SELECT lease.endpoint_id, 0 FROM webhook_delivery_leases AS lease
            WHERE lease.leased_until < {NOW} AND lease.delivery_id <> ALL(%(held)s)
        ) AS found GROUP BY endpoint_id
    ),
    eligible AS MATERIALIZED (
        SELECT e.id, candidate.n FROM candidate
        JOIN webhook_endpoints AS e ON e.id = candidate.endpoint_id
        WHERE {takes_attempts_sql("e")}
          AND NOT COALESCE(e.next_probe_at > {NOW}, false)
          AND {_in_flight_sql("e")} < {limit_sql("e")}
        ORDER BY candidate.n LIMIT %(slots)s
    ),
    closed AS (
        INSERT INTO webhook_bulk_jobs (kind, brand_id, endpoint_id, note, requested_at)
        SELECT '{END_PENDING}', e.brand_id, e.id, 'Endpoint disabled or deleted', {NOW}
        FROM walked JOIN webhook_endpoints AS e ON e.id = walked.endpoint_id
        WHERE NOT ({endpoint_is_open_sql("e")})
          AND NOT EXISTS (SELECT 1 FROM webhook_bulk_jobs AS job
                          WHERE job.kind = '{END_PENDING}' AND job.endpoint_id = e.id
                            AND job.finished_at IS NULL)
        ON CONFLICT DO NOTHING
        RETURNING endpoint_id
    )
    SELECT 'endpoint', eligible.id, NULL::boolean, NULL::timestamptz, NULL::timestamptz,
           NULL::text[], eligible.n
    FROM eligible WHERE pg_try_advisory_xact_lock(%(lock_class)s, hashtext(eligible.id))
    UNION ALL
    SELECT 'walk', (SELECT endpoint_id FROM walked ORDER BY n DESC LIMIT 1),
           (SELECT count(*) < %(walk_max)s
                   OR COALESCE(bool_or(wrapped AND endpoint_id >= %(cycle_start)s), false)
            FROM walked),
           (SELECT min(due_at) FROM walked WHERE due_at > {NOW}),
           (SELECT min(due_at) FROM walked WHERE due_at <= {NOW}),
           (SELECT CAST(array_agg(endpoint_id) AS text[]) FROM closed), NULL
    ORDER BY 1, 7
"""  # noqa: S608 - constant SQL, put together at import

# With the endpoints locked, in a statement of its own (its snapshot sees every claim committed
# before the locks): each endpoint's room, its lapsed leases (re-let first: theirs are the
# oldest due) and its oldest due queue rows (a look-ahead past its room for an endpoint that
# orders by subject, whose rows behind an earlier pending delivery of their subject are held
# as they are met: the earlier one's delivery row is locked FOR SHARE meanwhile, so it cannot
# end unseen before the hold commits, and a row whose earlier one is locked by someone else
# waits for the next claim), the rows each gets (the first of every endpoint before the second
# of any, up to the slots), moved from the queue to the leases, and the attempts to make. Rows
# are materialised CTEs: as subqueries of the statements that change them, PostgreSQL may re-run
# a pick and ignore its limit.
_TAKE = f"""
    WITH endpoint AS MATERIALIZED (
        SELECT e.id, e.url, e.secret_ciphertext,
               CASE WHEN e.previous_secret_expires_at > {NOW}
                    THEN e.previous_secret_ciphertext END AS previous_secret_ciphertext,
               e.ordering = 'subject' AS ordered,
               CAST(GREATEST(0, LEAST(
                   {limit_sql("e")} - {_in_flight_sql("e")},
                   ceil({limit_sql("e")}::numeric / GREATEST(1, (
                       SELECT count(*) FROM webhook_delivery_loops AS loop
                       WHERE loop.last_round_at
                             > {NOW} - make_interval(secs => %(live_seconds)s)
                   ))) - {_in_flight_sql("e", owner=True)})) AS integer) AS room,
               array_position(CAST(%(endpoint_ids)s AS varchar[]), e.id) AS turn
        FROM webhook_endpoints AS e
        WHERE e.id = ANY(CAST(%(endpoint_ids)s AS varchar[]))
          AND {takes_attempts_sql("e")}
          AND NOT COALESCE(e.next_probe_at > {NOW}, false)
    ),
    lapsed AS MATERIALIZED (
        SELECT endpoint.id AS endpoint_id, endpoint.turn, lease.delivery_id, lease.leased_until
        FROM endpoint CROSS JOIN LATERAL (
            SELECT l.delivery_id, l.leased_until FROM webhook_delivery_leases AS l
            WHERE l.endpoint_id = endpoint.id AND l.leased_until < {NOW}
              AND l.delivery_id <> ALL(%(held)s)
            ORDER BY l.leased_until LIMIT endpoint.room
            FOR UPDATE OF l SKIP LOCKED
        ) AS lease
        WHERE endpoint.room > 0
    ),
    due AS MATERIALIZED (
        SELECT endpoint.id AS endpoint_id, endpoint.turn, endpoint.ordered, q.*
        FROM endpoint CROSS JOIN LATERAL (
            SELECT q.delivery_id, q.next_attempt_at, q.subject_key, q.sequence
            FROM webhook_delivery_queue AS q
            WHERE q.endpoint_id = endpoint.id AND q.next_attempt_at <= {NOW}
              AND q.delivery_id <> ALL(%(held)s)
            ORDER BY q.next_attempt_at
            LIMIT endpoint.room + CASE WHEN endpoint.ordered THEN %(look_ahead)s ELSE 0 END
            FOR UPDATE OF q SKIP LOCKED
        ) AS q
        WHERE endpoint.room > 0
    ),
    predecessor AS MATERIALIZED (
        SELECT due.delivery_id, before.delivery_id AS predecessor
        FROM due CROSS JOIN LATERAL (
            SELECT earlier.delivery_id FROM (
                SELECT q.delivery_id, q.sequence FROM webhook_delivery_queue AS q
                WHERE q.endpoint_id = due.endpoint_id AND q.subject_key = due.subject_key
                  AND q.sequence < due.sequence
                UNION ALL
                SELECT l.delivery_id, l.sequence FROM webhook_delivery_leases AS l
                WHERE l.endpoint_id = due.endpoint_id AND l.subject_key = due.subject_key
                  AND l.sequence < due.sequence
            ) AS earlier ORDER BY earlier.sequence DESC LIMIT 1
        ) AS before
        WHERE due.ordered AND due.subject_key IS NOT NULL
    ),
    pinned AS MATERIALIZED (
        SELECT d.id FROM webhook_deliveries AS d
        WHERE d.id IN (SELECT predecessor FROM predecessor) AND d.status = 'pending'
        FOR SHARE OF d SKIP LOCKED
    ),
    startable AS MATERIALIZED (
        SELECT endpoint_id, turn, delivery_id, relet,
               row_number() OVER (PARTITION BY endpoint_id ORDER BY NOT relet, due_at) AS place
        FROM (
            SELECT endpoint_id, turn, delivery_id, true AS relet, leased_until AS due_at
            FROM lapsed
            UNION ALL
            SELECT due.endpoint_id, due.turn, due.delivery_id, false, due.next_attempt_at
            FROM due LEFT JOIN predecessor ON predecessor.delivery_id = due.delivery_id
            WHERE predecessor.delivery_id IS NULL
        ) AS ready
    ),
    taken AS MATERIALIZED (
        SELECT startable.* FROM startable JOIN endpoint ON endpoint.id = startable.endpoint_id
        WHERE startable.place <= endpoint.room
        ORDER BY startable.place, startable.turn
        LIMIT %(slots)s
    ),
    held_back AS (
        UPDATE webhook_delivery_queue AS q
        SET next_attempt_at = NULL, held_behind = predecessor.predecessor
        FROM predecessor JOIN pinned ON pinned.id = predecessor.predecessor
        WHERE q.delivery_id = predecessor.delivery_id
    ),
    unqueued AS (
        DELETE FROM webhook_delivery_queue AS q
        -- Through the primary key: the planner cannot see how few rows the CTE holds.
        WHERE q.delivery_id = ANY (ARRAY(SELECT delivery_id FROM taken WHERE NOT relet))
        RETURNING q.*
    ),
    relet AS (
        UPDATE webhook_delivery_leases AS l
        SET token = %(token)s, leased_until = {NOW} + make_interval(secs => %(lease_seconds)s)
        WHERE l.delivery_id = ANY (ARRAY(SELECT delivery_id FROM taken WHERE relet))
        RETURNING l.delivery_id, l.endpoint_id, l.attempt_count
    ),
    leased AS (
        INSERT INTO webhook_delivery_leases (
            delivery_id, endpoint_id, token, leased_until, attempt_count, not_before,
            subject_key, sequence
        )
        SELECT delivery_id, endpoint_id, %(token)s,
               {NOW} + make_interval(secs => %(lease_seconds)s),
               attempt_count, not_before, subject_key, sequence
        FROM unqueued
        RETURNING delivery_id, endpoint_id, attempt_count
    ),
    attempts AS (SELECT * FROM leased UNION ALL SELECT * FROM relet)
    SELECT attempts.delivery_id, CAST(attempts.endpoint_id AS text), attempts.attempt_count,
           d.event_id, d.event_name, endpoint.url, endpoint.secret_ciphertext,
           endpoint.previous_secret_ciphertext, event.body
    FROM attempts
    JOIN endpoint ON endpoint.id = attempts.endpoint_id
    JOIN webhook_deliveries AS d ON d.id = attempts.delivery_id
    JOIN webhook_events AS event ON event.id = d.event_id
    ORDER BY (SELECT place FROM taken WHERE taken.delivery_id = attempts.delivery_id),
             endpoint.turn
"""  # noqa: S608 - constant SQL, put together at import


# --- recording --------------------------------------------------------------------------------


def record_attempts(
    results: Sequence[tuple[Attempt, AttemptOutcome]],
    *,
    policy: RetryPolicy,
    rng=None,
) -> list[Recorded]:
    """Write a round's results, committing what it writes (each part of a split batch on its
    own); for each, what became of it (with its endpoint as the record found it).

    All in one statement when that works. When it fails for a reason of the data (not an
    outage: that is raised, and the results wait for the next round), the batch is split in
    two and each half written alone, down to single results; a single result that still fails
    is written in a reduced form (its status and a plain error), and one that fails even so is
    dropped and logged (its lease lapses and the delivery is sent again). One bad answer never
    holds back the others' records, and the same batch is never retried as it was.

    A success settles its delivery `delivered` even if its endpoint was closed meanwhile: the
    receiver has it. A failure of a closed endpoint's delivery ends it `failed`."""
    recorded: dict[int, Recorded] = {}
    _record_split(list(enumerate(results)), policy, rng, recorded)
    return [recorded[index] for index in range(len(results))]


def _record_split(batch, policy, rng, recorded) -> None:
    try:
        written = _record([pair for _, pair in batch], policy, rng)
        db.session.commit()
    except (OperationalError, InterfaceError):
        raise
    except DBAPIError as error:
        db.session.rollback()
        if len(batch) > 1:
            log.warning(
                "recording %d webhook attempt(s) together failed (%s); splitting the batch",
                len(batch),
                type(error.orig).__name__,
            )
            middle = len(batch) // 2
            _record_split(batch[:middle], policy, rng, recorded)
            _record_split(batch[middle:], policy, rng, recorded)
            return
        index, (attempt, outcome) = batch[0]
        recorded[index] = _record_reduced(attempt, outcome, policy, rng, error)
        return
    for (index, _), result in zip(batch, written, strict=True):
        recorded[index] = result


def _record_reduced(attempt, outcome, policy, rng, error) -> Recorded:
    log.error(
        "webhook attempt delivery=%s endpoint=%s: its outcome could not be stored (%s); "
        "storing its status alone",
        attempt.delivery_id,
        attempt.endpoint_id,
        type(error.orig).__name__,
    )
    for _ in range(RECORD_TRIES - 1):
        try:
            written = _record([(attempt, outcome.reduced())], policy, rng)
            db.session.commit()
            return replace(written[0], reduced=True)
        except (OperationalError, InterfaceError):
            raise
        except DBAPIError:
            db.session.rollback()
    # Not for want of storing the receiver's bytes: a fault of ours, with its traceback.
    log.exception(
        "webhook attempt delivery=%s: not even its status could be stored; its lease lapses",
        attempt.delivery_id,
    )
    return Recorded(status=PENDING, kept=False)


def _record(results, policy: RetryPolicy, rng) -> list[Recorded]:
    delays = [
        policy.retry_delay(attempt.attempt_number, outcome, rng) for attempt, outcome in results
    ]
    rows = fetch_all_on_psycopg(
        db.session.connection(), _RECORD, _record_parameters(results, delays)
    )
    by_id = {row[0]: row for row in rows}
    recorded: list[Recorded] = []
    for attempt, _ in results:
        _, outcome_kind, status, retry_at, failures, probing = by_id[attempt.delivery_id]
        if outcome_kind == "kept":
            state = EndpointState(failures, probing)
            recorded.append(Recorded(status=status, retry_at=retry_at, endpoint=state))
        elif outcome_kind == "carried":
            recorded.append(Recorded(status=PENDING, kept=False, carried=True))
        else:
            recorded.append(Recorded(status=PENDING, kept=False))
    return recorded


def _record_parameters(
    results: Sequence[tuple[Attempt, AttemptOutcome]],
    delays: Sequence[tuple[float | None, float | None]],
) -> dict[str, Any]:
    return {
        "delivery_ids": [attempt.delivery_id for attempt, _ in results],
        "tokens": [attempt.token for attempt, _ in results],
        "attempt_numbers": [attempt.attempt_number for attempt, _ in results],
        "succeeded": [outcome.succeeded for _, outcome in results],
        "http_statuses": [outcome.http_status for _, outcome in results],
        "errors": [outcome.error_text for _, outcome in results],
        "retry_seconds": [delay for delay, _ in delays],
        "not_before_seconds": [asked for _, asked in delays],
        "requested_ats": [outcome.requested_at for _, outcome in results],
        "durations": [outcome.duration_ms for _, outcome in results],
        "response_bodies": [outcome.response_body for _, outcome in results],
        "request_headers": [json.dumps(outcome.request_headers) for _, outcome in results],
        "response_headers": [
            None if outcome.response_headers is None else json.dumps(outcome.response_headers)
            for _, outcome in results
        ],
        "remote_addresses": [outcome.remote_address for _, outcome in results],
        "dns_ms": [outcome.timings.dns_ms for _, outcome in results],
        "connect_ms": [outcome.timings.connect_ms for _, outcome in results],
        "tls_ms": [outcome.timings.tls_ms for _, outcome in results],
        "first_byte_ms": [outcome.timings.first_byte_ms for _, outcome in results],
    }


# The batch, in one statement:
# - `owned`: each result's lease, still under the token that took it (none: discarded);
# - `locked`: those whose lease and delivery rows this transaction can lock now (the others are
#   carried to the next round: nothing waits), with their endpoint read as it is;
# - `released`: their leases, deleted;
# - `written`: their deliveries, settled `delivered`, waiting for a retry (`pending`, with its
#   next time, while the endpoint takes attempts), or `failed` after the last or on a closed
#   endpoint; a trigger releases what was held behind one that stopped being pending;
# - `requeued`: one waiting for a retry goes back in the queue;
# - `logged`: the attempt's row (a trigger counts it into its endpoint's hour).
_RECORD = f"""
    WITH result AS (
        SELECT * FROM unnest(
            CAST(%(delivery_ids)s AS varchar[]), CAST(%(tokens)s AS varchar[]),
            CAST(%(attempt_numbers)s AS integer[]), CAST(%(succeeded)s AS boolean[]),
            CAST(%(http_statuses)s AS integer[]), CAST(%(errors)s AS varchar[]),
            CAST(%(retry_seconds)s AS double precision[]),
            CAST(%(not_before_seconds)s AS double precision[]),
            CAST(%(requested_ats)s AS timestamptz[]), CAST(%(durations)s AS integer[]),
            CAST(%(response_bodies)s AS text[]), CAST(%(request_headers)s AS text[]),
            CAST(%(response_headers)s AS text[]), CAST(%(remote_addresses)s AS varchar[]),
            CAST(%(dns_ms)s AS integer[]), CAST(%(connect_ms)s AS integer[]),
            CAST(%(tls_ms)s AS integer[]), CAST(%(first_byte_ms)s AS integer[])
        ) AS r(delivery_id, token, attempt_number, succeeded, http_status, error,
               retry_seconds, not_before_seconds, requested_at, duration_ms, response_body,
               request_headers, response_headers, remote_address, dns_ms, connect_ms, tls_ms,
               first_byte_ms)
    ),
    owned AS MATERIALIZED (
        SELECT l.delivery_id FROM webhook_delivery_leases AS l
        JOIN result AS r ON r.delivery_id = l.delivery_id AND r.token = l.token
    ),
    lease AS MATERIALIZED (
        SELECT l.delivery_id, l.endpoint_id, l.subject_key, l.sequence
        FROM webhook_delivery_leases AS l
        WHERE l.delivery_id IN (SELECT delivery_id FROM owned)
        ORDER BY l.delivery_id
        FOR UPDATE OF l SKIP LOCKED
    ),
    locked AS MATERIALIZED (
        SELECT d.id, d.status, e.consecutive_failures,
               e.consecutive_failures >= {PROBING_AFTER_FAILURES}
                   OR e.next_probe_at IS NOT NULL AS probing,
               {endpoint_is_open_sql("e")} AS open
        FROM webhook_deliveries AS d
        JOIN webhook_endpoints AS e ON e.id = d.endpoint_id
        WHERE d.id IN (SELECT delivery_id FROM lease)
        ORDER BY d.id
        FOR NO KEY UPDATE OF d SKIP LOCKED
    ),
    released AS (
        DELETE FROM webhook_delivery_leases AS l USING locked
        WHERE l.delivery_id = locked.id
        RETURNING l.delivery_id, l.endpoint_id, l.subject_key, l.sequence
    ),
    written AS (
        UPDATE webhook_deliveries AS d
        SET status = CASE WHEN r.succeeded THEN 'delivered'
                          WHEN d.status = 'pending' AND locked.open
                               AND r.retry_seconds IS NOT NULL THEN 'pending'
                          ELSE 'failed' END,
            delivered_at = CASE WHEN r.succeeded THEN statement_timestamp() END,
            failed_at = CASE WHEN r.succeeded THEN NULL
                             WHEN d.status = 'pending' AND locked.open
                                  AND r.retry_seconds IS NOT NULL THEN NULL
                             ELSE COALESCE(d.failed_at, statement_timestamp()) END,
            attempt_count = r.attempt_number, http_status = r.http_status,
            last_error = r.error,
            next_attempt_at = CASE
                WHEN NOT r.succeeded AND d.status = 'pending' AND locked.open
                     AND r.retry_seconds IS NOT NULL
                THEN statement_timestamp() + make_interval(secs => r.retry_seconds) END
        FROM result AS r JOIN locked ON locked.id = r.delivery_id
        JOIN released ON released.delivery_id = r.delivery_id
        WHERE d.id = r.delivery_id
        RETURNING d.id, d.endpoint_id, d.status, d.next_attempt_at
    ),
    requeued AS (
        INSERT INTO webhook_delivery_queue (
            delivery_id, endpoint_id, next_attempt_at, attempt_count, not_before, subject_key,
            sequence
        )
        SELECT written.id, written.endpoint_id, written.next_attempt_at, r.attempt_number,
               statement_timestamp() + make_interval(secs => r.not_before_seconds),
               released.subject_key, released.sequence
        FROM written
        JOIN result AS r ON r.delivery_id = written.id
        JOIN released ON released.delivery_id = written.id
        WHERE written.status = 'pending'
    ),
    logged AS (
        INSERT INTO webhook_attempts (
            delivery_id, endpoint_id, attempt_number, requested_at, duration_ms, http_status,
            error, response_body, request_headers, response_headers, remote_address, dns_ms,
            connect_ms, tls_ms, first_byte_ms
        )
        SELECT r.delivery_id, written.endpoint_id, r.attempt_number, r.requested_at,
               r.duration_ms, r.http_status, r.error, r.response_body,
               CAST(r.request_headers AS json), CAST(r.response_headers AS json),
               r.remote_address, r.dns_ms, r.connect_ms, r.tls_ms, r.first_byte_ms
        FROM result AS r JOIN written ON written.id = r.delivery_id
    )
    SELECT r.delivery_id,
           CASE WHEN written.id IS NOT NULL THEN 'kept'
                WHEN owned.delivery_id IS NOT NULL THEN 'carried'
                ELSE 'gone' END,
           written.status, written.next_attempt_at,
           locked.consecutive_failures, locked.probing
    FROM result AS r
    LEFT JOIN written ON written.id = r.delivery_id
    LEFT JOIN locked ON locked.id = r.delivery_id
    LEFT JOIN owned ON owned.delivery_id = r.delivery_id
"""  # noqa: S608 - constant SQL, put together at import
