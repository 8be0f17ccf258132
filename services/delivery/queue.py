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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from extensions import db
from models.bulk_job import END_PENDING
from models.webhook_delivery import PENDING
from models.webhook_endpoint import endpoint_is_open_sql
from services.delivery.outcomes import (
    LOCK_TIMEOUT_SECONDS,
    STATEMENT_TIMEOUT_SECONDS,
    Attempt,
    AttemptOutcome,
    EndpointState,
    Recorded,
    RetryPolicy,
)
from services.psycopg_direct import RawStatement, run_pipeline

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

# The statement's clock: the database's, or `now` where a test gives one (one CTE of each
# statement that reads it: `{T}`).
CLOCK = "clock AS (SELECT COALESCE(CAST(%(now)s AS timestamptz), statement_timestamp()) AS t)"
T = "(SELECT t FROM clock)"
# Each transaction of a round sets its own limits first (a pooler may give the next transaction
# another server connection: nothing is set for the session), in the same exchange as the rest.
# A round that only records does not wait for the disk: a PostgreSQL crash (not a restart) may
# lose its last fraction of a second, and those deliveries are sent once more, after their
# leases. A round that takes attempts turns it back on (in _TAKE's rows): a lost lease would let
# a second copy go on the wire beside the first (docs/delivery.md).
LIMITS = RawStatement.of(
    f"SELECT set_config('statement_timeout', '{int(STATEMENT_TIMEOUT_SECONDS * 1000)}', true),"
    f" set_config('lock_timeout', '{int(LOCK_TIMEOUT_SECONDS * 1000)}', true),"
    " set_config('jit', 'off', true), set_config('plan_cache_mode', 'force_generic_plan', true),"
    " set_config('synchronous_commit', 'off', true)"
)


def takes_attempts_sql(alias: str) -> str:
    """The endpoint `alias` may be sent attempts now: open (models/webhook_endpoint.py's rule)
    and not clearing the queue it had when it was closed (an `end_pending` job, bulk.py)."""
    return (
        f"({endpoint_is_open_sql(alias)} AND NOT EXISTS (SELECT 1 FROM webhook_bulk_jobs j"  # noqa: S608
        f" WHERE j.kind = '{END_PENDING}' AND j.endpoint_id = {alias}.id"
        " AND j.finished_at IS NULL))"
    )


def limit_sql(alias: str) -> str:
    """How many attempts the endpoint `alias` may have in flight, across all workers: one while
    it keeps failing (the breaker), else its own `max_in_flight` or the setting."""
    return (
        f"CASE WHEN {alias}.consecutive_failures >= {PROBING_AFTER_FAILURES} THEN 1"
        f" ELSE COALESCE({alias}.max_in_flight, %(endpoint_limit)s) END"
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


def claim_attempts(**claim: Any) -> Claimed:
    """Lease due deliveries for attempts that start now, in a transaction of its own (which it
    commits: its locks are the transaction's). `claim`: as `record_and_claim` takes it."""
    _, claimed = record_and_claim([], policy=None, claim=claim)
    assert claimed is not None
    return claimed


def record_and_claim(
    results: Sequence[tuple[Attempt, AttemptOutcome]],
    *,
    policy: RetryPolicy | None,
    claim: dict[str, Any] | None,
    between: Callable[[list[Recorded]], None] | None = None,
    rng=None,
) -> tuple[list[Recorded] | None, Claimed | None]:
    """A round's record and claim, in one transaction that this commits, in two exchanges with
    the server when all goes well: the results and the walk, then the take and the commit.

    The record runs under a savepoint: when it fails for a reason of the data, it alone is
    rolled back, the claim goes on, and None is returned for it: the caller records the results
    the slow way (`record_attempts`). `between(recorded)` runs after the record and before the
    walk (the endpoints' health: a 410 closes its endpoint before the claim could take more of
    it); the walk goes with the record only when no result can be news for an endpoint's
    health (every one a success, at an endpoint healthy at its claim).

    `claim` (None: record only): `slots`, `endpoint_limit`, `token` and `lease`, and optionally
    `held` (deliveries this worker still sends or records, never taken again by it), `cursor`
    and `cycle_start` (where this claim's walk begins, and where the walks since the loop last
    waited began), `walk_max`, `start_by` (the attempts' start window) and `now` (a test's
    clock). Each endpoint served gets up to its room: its limit less every worker's live
    leases, and at most this worker's share of the limit (the limit divided among the live
    workers), so that workers share an endpoint's work; the first of every endpoint goes
    before the second of any. An endpoint that orders by subject never starts a delivery while
    an earlier one of its subject is pending: that one is held (`next_attempt_at` null,
    `held_behind` the earlier one) until the earlier one ends."""
    connection = db.session.connection()
    pick = _pick_parameters(claim) if claim is not None else None
    news_possible = between is not None and any(
        not outcome.succeeded or attempt.endpoint_failing for attempt, outcome in results
    )
    statements: list[tuple[RawStatement, dict[str, Any]]] = [(LIMITS, {})]
    if results:
        assert policy is not None
        statements += [(_SAVEPOINT, {}), (_RECORD, _record_parameters(results, policy, rng))]
    if pick is not None and not news_possible:
        statements.append((_PICK, pick))
    try:
        answers = run_pipeline(connection, statements, commit=pick is None)
        recorded = _recorded(results, answers[2]) if results else []
    except DBAPIError as error:
        if not results or isinstance(error, OperationalError | InterfaceError):
            raise
        log.warning(
            "recording %d webhook attempt(s) together failed (%s); recording them apart",
            len(results),
            type(error.orig).__name__,
        )
        run_pipeline(connection, [(_ROLLBACK_TO_SAVEPOINT, {})], commit=pick is None)
        answers, recorded = [], None
    if recorded and between is not None:
        between(recorded)
    if pick is None:
        return recorded, None
    picked = answers[-1] if len(answers) == len(statements) and statements[-1][1] is pick else None
    if picked is None:
        [picked] = run_pipeline(connection, [(_PICK, pick)], commit=False)
    assert claim is not None
    return recorded, _take(connection, picked, pick, claim)


def _pick_parameters(claim: dict[str, Any]) -> dict[str, Any]:
    return {
        "now": claim.get("now"),
        "cursor": claim.get("cursor", ""),
        "cycle_start": claim.get("cycle_start", ""),
        "walk_max": claim.get("walk_max", 256),
        "slots": claim["slots"],
        "endpoint_limit": claim["endpoint_limit"],
        "held": list(claim.get("held", ())),
        "lock_class": CLAIM_LOCK_CLASS,
    }


def _take(connection, rows: list[tuple], pick: dict[str, Any], claim: dict[str, Any]) -> Claimed:
    """What the walk found (`rows`), taken: the attempts leased, and the transaction
    committed."""
    walk = next(row for row in rows if row[0] == "walk")
    _, new_cursor, round_done, next_due_at, oldest_due_at, closed, _ = walk
    claimed = Claimed(
        cursor=new_cursor or "",
        round_done=round_done,
        next_due_at=next_due_at,
        oldest_due_at=oldest_due_at,
    )
    served = [row for row in rows if row[0] == "endpoint"]
    if len(served) >= pick["slots"]:
        # More endpoints were ready than slots: the next walk begins after the last served.
        claimed = replace(claimed, cursor=served[-1][1], round_done=False)
    if closed:
        log.info("closed endpoint(s) %s still had queued work: clearing it", ", ".join(closed))
    if not served:
        run_pipeline(connection, [], commit=True)
        return claimed
    token = claim["token"]
    take = {
        **pick,
        "endpoint_ids": [row[1] for row in served],
        "owner": token[:8],
        "token": token,
        "lease_seconds": claim["lease"].total_seconds(),
        "look_ahead": ORDERED_LOOK_AHEAD,
        "live_seconds": LIVE_WORKER_SECONDS,
    }
    [taken] = run_pipeline(connection, [(_TAKE, take)], commit=True)
    start_by = claim.get("start_by", float("inf"))
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
            endpoint_failing=row[9],
            brand_id=row[10],
            trace_context=row[11],
            traceparent=row[12],
        )
        for row in taken
    ]
    return replace(claimed, attempts=attempts)


_SAVEPOINT = RawStatement.of("SAVEPOINT record")
_ROLLBACK_TO_SAVEPOINT = RawStatement.of("ROLLBACK TO SAVEPOINT record")


# The walk: from the cursor, the first queue row of each next endpoint (its earliest due time;
# a held row, null, sorts last), wrapping round to the first endpoint and on up to the cursor.
# The endpoints found due (and those with a lapsed lease: the leases table holds only what is
# in flight) that take attempts, are not paused and have room, in walk order, up to one per
# slot, each locked for this transaction unless another claim holds it. A closed endpoint the
# walk meets with queued work and no job clearing it (a publish that raced its closing) gets
# that job (bulk.py). Last, a row that says where the walk got to.
_PICK = RawStatement.of(
    f"""
    WITH RECURSIVE {CLOCK},
    walk(endpoint_id, due_at, n, wrapped) AS (
        SELECT f.endpoint_id, f.next_attempt_at, 1, f.wrapped
        FROM ((SELECT endpoint_id, next_attempt_at, false AS wrapped
               FROM webhook_delivery_queue WHERE endpoint_id > %(cursor)s
               ORDER BY endpoint_id, next_attempt_at LIMIT 1)
              UNION ALL
              (SELECT endpoint_id, next_attempt_at, true FROM webhook_delivery_queue
               ORDER BY endpoint_id, next_attempt_at LIMIT 1)
              LIMIT 1) AS f
        UNION ALL
        SELECT s.endpoint_id, s.next_attempt_at, w.n + 1, s.wrapped
        FROM walk AS w CROSS JOIN LATERAL (
            (SELECT endpoint_id, next_attempt_at, w.wrapped AS wrapped FROM webhook_delivery_queue
             WHERE endpoint_id > w.endpoint_id AND (NOT w.wrapped OR endpoint_id <= %(cursor)s)
             ORDER BY endpoint_id, next_attempt_at LIMIT 1)
            UNION ALL
            (SELECT endpoint_id, next_attempt_at, true FROM webhook_delivery_queue
             WHERE NOT w.wrapped AND endpoint_id <= %(cursor)s
             ORDER BY endpoint_id, next_attempt_at LIMIT 1)
            LIMIT 1) AS s
        WHERE w.n < %(walk_max)s
    ),
    walked AS MATERIALIZED (SELECT * FROM walk),
    eligible AS MATERIALIZED (
        SELECT e.id, c.n FROM (
            SELECT endpoint_id, min(n) AS n FROM (
                SELECT endpoint_id, n FROM walked WHERE due_at <= {T}
                UNION ALL
                SELECT endpoint_id, 0 FROM webhook_delivery_leases
                WHERE leased_until < {T} AND delivery_id <> ALL(%(held)s)
            ) AS f GROUP BY endpoint_id
        ) AS c
        JOIN webhook_endpoints AS e ON e.id = c.endpoint_id
        WHERE {takes_attempts_sql("e")} AND NOT COALESCE(e.next_probe_at > {T}, false)
          AND (SELECT count(*) FROM webhook_delivery_leases AS l
               WHERE l.endpoint_id = e.id AND l.leased_until >= {T}) < {limit_sql("e")}
        ORDER BY c.n LIMIT %(slots)s
    ),
    closed AS (
        INSERT INTO webhook_bulk_jobs (kind, brand_id, endpoint_id, note, requested_at)
        SELECT '{END_PENDING}', e.brand_id, e.id, 'Endpoint disabled or deleted', {T}
        FROM walked JOIN webhook_endpoints AS e ON e.id = walked.endpoint_id
        WHERE NOT ({endpoint_is_open_sql("e")})
          AND NOT EXISTS (SELECT 1 FROM webhook_bulk_jobs AS j WHERE j.kind = '{END_PENDING}'
                          AND j.endpoint_id = e.id AND j.finished_at IS NULL)
        ON CONFLICT DO NOTHING
        RETURNING endpoint_id
    )
    SELECT 'endpoint', id, NULL::boolean, NULL::timestamptz, NULL::timestamptz, NULL::text[], n
    FROM eligible WHERE pg_try_advisory_xact_lock(%(lock_class)s, hashtext(id))
    UNION ALL
    SELECT 'walk', (SELECT endpoint_id FROM walked ORDER BY n DESC LIMIT 1),
           (SELECT count(*) < %(walk_max)s
                   OR COALESCE(bool_or(wrapped AND endpoint_id >= %(cycle_start)s), false)
            FROM walked),
           (SELECT min(due_at) FROM walked WHERE due_at > {T}),
           (SELECT min(due_at) FROM walked WHERE due_at <= {T}),
           (SELECT CAST(array_agg(endpoint_id) AS text[]) FROM closed), NULL
    ORDER BY 1, 7
    """  # noqa: S608 - constant SQL, put together at import
)

# With the endpoints locked, in a statement of its own (its snapshot sees every claim committed
# before the locks): each endpoint's room (its limit less every worker's live leases, and at
# most this worker's share of the limit less its own), its lapsed leases (re-let first: theirs
# are the oldest due) and its oldest due queue rows (a look-ahead past its room for an endpoint
# that orders by subject, whose rows behind an earlier pending delivery of their subject are
# held as they are met: the earlier one's delivery row is locked FOR SHARE meanwhile, so it
# cannot end unseen before the hold commits, and a row whose earlier one is locked by someone
# else waits for the next claim), the rows each gets (the first of every endpoint before the
# second of any, up to the slots), moved from the queue to the leases, and the attempts to
# make. Rows are materialised CTEs: as subqueries of the statements that change them,
# PostgreSQL may re-run a pick and ignore its limit.
_TAKE = RawStatement.of(
    f"""
    WITH {CLOCK},
    endpoint AS MATERIALIZED (
        SELECT e.id, e.url, e.secret_ciphertext, e.ordering = 'subject' AS ordered,
               e.trace_context,
               e.consecutive_failures > 0 OR e.next_probe_at IS NOT NULL AS failing,
               CASE WHEN e.previous_secret_expires_at > {T}
                    THEN e.previous_secret_ciphertext END AS previous_secret_ciphertext,
               array_position(CAST(%(endpoint_ids)s AS varchar[]), e.id) AS turn,
               CAST(GREATEST(0, LEAST(x.lim - f.total, ceil(x.lim::numeric / (
                   SELECT GREATEST(1, count(*)) FROM webhook_delivery_loops
                   WHERE last_round_at > {T} - make_interval(secs => %(live_seconds)s)
               )) - f.mine)) AS integer) AS room
        FROM webhook_endpoints AS e
        CROSS JOIN LATERAL (SELECT {limit_sql("e")} AS lim) AS x
        CROSS JOIN LATERAL (
            SELECT count(*) AS total, count(*) FILTER (WHERE left(token, 8) = %(owner)s) AS mine
            FROM webhook_delivery_leases WHERE endpoint_id = e.id AND leased_until >= {T}
        ) AS f
        WHERE e.id = ANY(CAST(%(endpoint_ids)s AS varchar[])) AND {takes_attempts_sql("e")}
          AND NOT COALESCE(e.next_probe_at > {T}, false)
    ),
    lapsed AS MATERIALIZED (
        SELECT p.id AS endpoint_id, p.turn, l.delivery_id, l.leased_until AS due_at
        FROM endpoint AS p CROSS JOIN LATERAL (
            SELECT delivery_id, leased_until FROM webhook_delivery_leases
            WHERE endpoint_id = p.id AND leased_until < {T} AND delivery_id <> ALL(%(held)s)
            ORDER BY leased_until LIMIT p.room FOR UPDATE SKIP LOCKED
        ) AS l
        WHERE p.room > 0
    ),
    due AS MATERIALIZED (
        SELECT p.id AS endpoint_id, p.turn, p.ordered, q.*
        FROM endpoint AS p CROSS JOIN LATERAL (
            SELECT delivery_id, next_attempt_at AS due_at, subject_key, sequence
            FROM webhook_delivery_queue
            WHERE endpoint_id = p.id AND next_attempt_at <= {T} AND delivery_id <> ALL(%(held)s)
            ORDER BY next_attempt_at
            LIMIT p.room + CASE WHEN p.ordered THEN %(look_ahead)s ELSE 0 END
            FOR UPDATE SKIP LOCKED
        ) AS q
        WHERE p.room > 0
    ),
    before AS MATERIALIZED (
        SELECT d.delivery_id, b.delivery_id AS predecessor
        FROM due AS d CROSS JOIN LATERAL (
            SELECT delivery_id FROM (
                SELECT delivery_id, sequence FROM webhook_delivery_queue
                WHERE endpoint_id = d.endpoint_id AND subject_key = d.subject_key
                  AND sequence < d.sequence
                UNION ALL
                SELECT delivery_id, sequence FROM webhook_delivery_leases
                WHERE endpoint_id = d.endpoint_id AND subject_key = d.subject_key
                  AND sequence < d.sequence
            ) AS e ORDER BY sequence DESC LIMIT 1
        ) AS b
        WHERE d.ordered AND d.subject_key IS NOT NULL
    ),
    pinned AS MATERIALIZED (
        SELECT id FROM webhook_deliveries
        WHERE id IN (SELECT predecessor FROM before) AND status = 'pending'
        FOR SHARE SKIP LOCKED
    ),
    taken AS MATERIALIZED (
        SELECT r.* FROM (
            SELECT s.*, row_number() OVER (
                PARTITION BY s.endpoint_id ORDER BY NOT s.relet, s.due_at) AS place
            FROM (
                SELECT endpoint_id, turn, delivery_id, true AS relet, due_at FROM lapsed
                UNION ALL
                SELECT endpoint_id, turn, delivery_id, false, due_at FROM due
                WHERE delivery_id NOT IN (SELECT delivery_id FROM before)
            ) AS s
        ) AS r JOIN endpoint AS p ON p.id = r.endpoint_id
        WHERE r.place <= p.room ORDER BY r.place, r.turn LIMIT %(slots)s
    ),
    held AS (
        UPDATE webhook_delivery_queue AS q SET next_attempt_at = NULL, held_behind = b.predecessor
        FROM before AS b JOIN pinned ON pinned.id = b.predecessor
        WHERE q.delivery_id = b.delivery_id
    ),
    unqueued AS (
        -- Through the primary key: the planner cannot see how few rows the CTE holds.
        DELETE FROM webhook_delivery_queue
        WHERE delivery_id = ANY(ARRAY(SELECT delivery_id FROM taken WHERE NOT relet))
        RETURNING *
    ),
    relet AS (
        UPDATE webhook_delivery_leases
        SET token = %(token)s, leased_until = {T} + make_interval(secs => %(lease_seconds)s)
        WHERE delivery_id = ANY(ARRAY(SELECT delivery_id FROM taken WHERE relet))
        RETURNING delivery_id, endpoint_id, attempt_count
    ),
    leased AS (
        INSERT INTO webhook_delivery_leases (
            delivery_id, endpoint_id, token, leased_until, attempt_count, not_before,
            subject_key, sequence
        )
        SELECT delivery_id, endpoint_id, %(token)s,
               {T} + make_interval(secs => %(lease_seconds)s), attempt_count, not_before,
               subject_key, sequence
        FROM unqueued
        RETURNING delivery_id, endpoint_id, attempt_count
    ),
    a AS (SELECT * FROM leased UNION ALL SELECT * FROM relet)
    SELECT a.delivery_id, CAST(a.endpoint_id AS text), a.attempt_count, d.event_id, d.event_name,
           p.url, p.secret_ciphertext, p.previous_secret_ciphertext, v.body, p.failing,
           d.brand_id, p.trace_context, v.traceparent,
           set_config('synchronous_commit', 'on', true)
    FROM a JOIN taken AS t ON t.delivery_id = a.delivery_id
    JOIN endpoint AS p ON p.id = a.endpoint_id
    JOIN webhook_deliveries AS d ON d.id = a.delivery_id
    JOIN webhook_events AS v ON v.id = d.event_id
    ORDER BY t.place, t.turn
    """  # noqa: S608 - constant SQL, put together at import
)


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
    [_, rows] = run_pipeline(
        db.session.connection(),
        [(LIMITS, {}), (_RECORD, _record_parameters(results, policy, rng))],
        commit=True,
    )
    return _recorded(results, rows)


def _recorded(results, rows: list[tuple]) -> list[Recorded]:
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
    results: Sequence[tuple[Attempt, AttemptOutcome]], policy: RetryPolicy, rng
) -> dict[str, Any]:
    """The batch as one JSON document: one parameter, dumped by the json module's C encoder
    (eighteen arrays through psycopg's adapters cost a round 0.1 ms)."""
    delays = [
        policy.retry_delay(attempt.attempt_number, outcome, rng) for attempt, outcome in results
    ]
    return {
        "results": json.dumps(
            [
                {
                    "delivery_id": attempt.delivery_id,
                    "token": attempt.token,
                    "attempt_number": attempt.attempt_number,
                    "succeeded": outcome.succeeded,
                    "http_status": outcome.http_status,
                    "error": outcome.error_text,
                    "retry_seconds": retry,
                    "not_before_seconds": asked,
                    "requested_at": outcome.requested_at.isoformat(),
                    "duration_ms": outcome.duration_ms,
                    "response_body": outcome.response_body,
                    "request_headers": outcome.request_headers,
                    "response_headers": outcome.response_headers,
                    "remote_address": outcome.remote_address,
                    "dns_ms": outcome.timings.dns_ms,
                    "connect_ms": outcome.timings.connect_ms,
                    "tls_ms": outcome.timings.tls_ms,
                    "first_byte_ms": outcome.timings.first_byte_ms,
                }
                for (attempt, outcome), (retry, asked) in zip(results, delays, strict=True)
            ]
        )
    }


# The batch, in one statement:
# - `owned`: each result's lease, still under the token that took it (none: discarded);
# - `locked`: those whose lease and delivery rows this transaction can lock now (the others are
#   carried to the next round: nothing waits), with their endpoint read as it is;
# - `released`: their leases, deleted;
# - `written`: their deliveries, settled `delivered`, waiting for a retry (`pending`, with its
#   next time, while the endpoint is open), or `failed` after the last or on a closed
#   endpoint; a trigger releases what was held behind one that stopped being pending;
# - `requeued`: one waiting for a retry goes back in the queue;
# - `logged`: the attempt's row (a trigger counts it into its endpoint's hour).
_RETRY = "(NOT r.succeeded AND d.status = 'pending' AND k.open AND r.retry_seconds IS NOT NULL)"
_RECORD = RawStatement.of(
    f"""
    WITH r AS MATERIALIZED (
        SELECT * FROM json_to_recordset(CAST(%(results)s AS json)) AS r(
            delivery_id varchar, token varchar, attempt_number integer, succeeded boolean,
            http_status integer, error varchar, retry_seconds double precision,
            not_before_seconds double precision, requested_at timestamptz, duration_ms integer,
            response_body text, request_headers json, response_headers json,
            remote_address varchar, dns_ms integer, connect_ms integer, tls_ms integer,
            first_byte_ms integer)
    ),
    owned AS MATERIALIZED (
        SELECT l.delivery_id FROM webhook_delivery_leases AS l
        JOIN r ON r.delivery_id = l.delivery_id AND r.token = l.token
    ),
    lease AS MATERIALIZED (
        SELECT delivery_id FROM webhook_delivery_leases
        WHERE delivery_id IN (SELECT delivery_id FROM owned)
        ORDER BY delivery_id FOR UPDATE SKIP LOCKED
    ),
    k AS MATERIALIZED (
        SELECT d.id, e.consecutive_failures,
               e.consecutive_failures >= {PROBING_AFTER_FAILURES}
                   OR e.next_probe_at IS NOT NULL AS probing,
               {endpoint_is_open_sql("e")} AS open
        FROM webhook_deliveries AS d JOIN webhook_endpoints AS e ON e.id = d.endpoint_id
        WHERE d.id IN (SELECT delivery_id FROM lease)
        ORDER BY d.id FOR NO KEY UPDATE OF d SKIP LOCKED
    ),
    released AS (
        DELETE FROM webhook_delivery_leases AS l USING k WHERE l.delivery_id = k.id
        RETURNING l.delivery_id, l.subject_key, l.sequence
    ),
    written AS (
        UPDATE webhook_deliveries AS d
        SET status = CASE WHEN r.succeeded THEN 'delivered'
                          WHEN {_RETRY} THEN 'pending' ELSE 'failed' END,
            delivered_at = CASE WHEN r.succeeded THEN statement_timestamp() END,
            failed_at = CASE WHEN r.succeeded OR {_RETRY} THEN NULL
                             ELSE COALESCE(d.failed_at, statement_timestamp()) END,
            attempt_count = r.attempt_number, http_status = r.http_status,
            last_error = r.error,
            next_attempt_at = CASE WHEN {_RETRY}
                THEN statement_timestamp() + make_interval(secs => r.retry_seconds) END
        FROM r JOIN k ON k.id = r.delivery_id
        JOIN released ON released.delivery_id = r.delivery_id
        WHERE d.id = r.delivery_id
        RETURNING d.id, d.endpoint_id, d.status, d.next_attempt_at
    ),
    requeued AS (
        INSERT INTO webhook_delivery_queue (
            delivery_id, endpoint_id, next_attempt_at, attempt_count, not_before, subject_key,
            sequence
        )
        SELECT w.id, w.endpoint_id, w.next_attempt_at, r.attempt_number,
               statement_timestamp() + make_interval(secs => r.not_before_seconds),
               released.subject_key, released.sequence
        FROM written AS w JOIN r ON r.delivery_id = w.id
        JOIN released ON released.delivery_id = w.id
        WHERE w.status = 'pending'
    ),
    logged AS (
        INSERT INTO webhook_attempts (
            delivery_id, endpoint_id, attempt_number, requested_at, duration_ms, http_status,
            error, response_body, request_headers, response_headers, remote_address, dns_ms,
            connect_ms, tls_ms, first_byte_ms
        )
        SELECT r.delivery_id, w.endpoint_id, r.attempt_number, r.requested_at, r.duration_ms,
               r.http_status, r.error, r.response_body, r.request_headers, r.response_headers,
               r.remote_address, r.dns_ms, r.connect_ms, r.tls_ms, r.first_byte_ms
        FROM r JOIN written AS w ON w.id = r.delivery_id
    )
    SELECT r.delivery_id,
           CASE WHEN w.id IS NOT NULL THEN 'kept'
                WHEN o.delivery_id IS NOT NULL THEN 'carried' ELSE 'gone' END,
           w.status, w.next_attempt_at, k.consecutive_failures, k.probing
    FROM r LEFT JOIN written AS w ON w.id = r.delivery_id
    LEFT JOIN k ON k.id = r.delivery_id
    LEFT JOIN owned AS o ON o.delivery_id = r.delivery_id
    """  # noqa: S608 - constant SQL, put together at import
)
