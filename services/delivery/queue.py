"""The queue's statements: how publishers add work, how a worker claims attempts and how it
records what came of them (CONTRACT 6.2, 12.2, 13.1, 13.5). docs/delivery.md explains the design
(the outbox, the queue and leases, the walk, in-flight limits, the record); each statement
touches the rows it records or claims and a bounded number of index probes, nothing more.
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
    Recorded,
    RetryPolicy,
)
from services.psycopg_direct import RawStatement, run_pipeline

log = logging.getLogger("brand_api.webhooks")

# After this many failures in a row an endpoint gets one attempt at a time (the breaker).
PROBING_AFTER_FAILURES = 3
# How far past an ordered endpoint's room a claim looks, holding what waits behind its subject.
ORDERED_LOOK_AHEAD = 32
# A worker whose heartbeat is older no longer shares endpoints' limits.
LIVE_WORKER_SECONDS = 10
# The advisory locks of claims: (this, hashtext(endpoint id)).
CLAIM_LOCK_CLASS = 41_001
# A result the database refuses alone is stored reduced, this many tries in all, then dropped.
RECORD_TRIES = 3
# Errors that say the database is out of reach, not that a result's data is wrong.
OUTAGE = (OperationalError, InterfaceError)

# The statement's clock: the database's, or `now` where a test gives one (`{T}`).
CLOCK = "clock AS (SELECT COALESCE(CAST(%(now)s AS timestamptz), statement_timestamp()) AS t)"
T = "(SELECT t FROM clock)"
# Each transaction sets its own limits (a pooler may hand its connection on). A record alone
# does not wait for the disk; a take turns that back on (docs/delivery.md says why). A plan is
# made once per connection, maybe while the tables are nearly empty, and kept: with sequential
# scans off it probes indexes however large they grow (one kept a scan of the whole queue in
# every take once a brand had 250,000 queued, and every brand's deliveries fell 30 s behind).
LIMITS = RawStatement.of(
    f"SELECT set_config('statement_timeout', '{int(STATEMENT_TIMEOUT_SECONDS * 1000)}', true),"
    f" set_config('lock_timeout', '{int(LOCK_TIMEOUT_SECONDS * 1000)}', true),"
    " set_config('jit', 'off', true), set_config('plan_cache_mode', 'force_generic_plan', true),"
    " set_config('enable_seqscan', 'off', true), set_config('synchronous_commit', 'off', true)"
)


def clearing_sql(alias: str) -> str:
    """The endpoint `alias` has an open `end_pending` job (bulk.py) clearing its old queue."""
    return (
        f"EXISTS (SELECT 1 FROM webhook_bulk_jobs AS j WHERE j.kind = '{END_PENDING}'"  # noqa: S608
        f" AND j.endpoint_id = {alias}.id AND j.finished_at IS NULL)"
    )


def serving_sql(alias: str) -> str:
    """The endpoint `alias` takes attempts now: open, not clearing, not pausing (the breaker)."""
    return (
        f"{endpoint_is_open_sql(alias)} AND NOT {clearing_sql(alias)}"
        f" AND NOT COALESCE({alias}.next_probe_at > {T}, false)"
    )


def limit_sql(alias: str) -> str:
    """The endpoint's in-flight limit across workers: one while the breaker is open."""
    return (
        f"CASE WHEN {alias}.consecutive_failures >= {PROBING_AFTER_FAILURES} THEN 1"
        f" ELSE COALESCE({alias}.max_in_flight, %(endpoint_limit)s) END"
    )


# A publishing statement's pending deliveries and their queue rows, due now: services/events.py
# gives the CTE `receiving` (the endpoints, locked FOR KEY SHARE) and fills the placeholders,
# `{deliveries_from}` yielding `event` once per delivery. No endpoint row is written.
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


@dataclass(frozen=True)
class Claimed:
    attempts: list[Attempt] = field(default_factory=list)
    # Where the next claim's walk begins (the last endpoint this one walked or served).
    cursor: str = ""
    # The walks since `cycle_start` went round every endpoint with queued work.
    round_done: bool = True
    # The earliest due time after now of a walked endpoint (sleep no longer); the oldest due
    # time the walk saw still waiting (GET /metrics).
    next_due_at: datetime | None = None
    oldest_due_at: datetime | None = None


def claim_attempts(**claim: Any) -> Claimed:
    """A claim alone, committed (`claim`: as `record_and_claim` takes it)."""
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
    """A round's record and claim in one transaction, committed: two exchanges with the server
    when all goes well. The record runs under a savepoint: refused for a reason of the data,
    it alone rolls back and None is returned for it (the caller uses `record_attempts`).
    `between(recorded)` (the health step) runs before the walk; the walk goes out with the
    record only when no result can be health news.

    `claim` (None: record only): `slots`, `endpoint_limit`, `token`, `lease`; optionally `held`
    (deliveries never taken again by this worker), `cursor`, `cycle_start`, `walk_max`,
    `start_by` and `now` (a test's clock). docs/delivery.md, mechanisms 3, 4 and 10, says what
    each endpoint gets."""
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
        if not results or isinstance(error, OUTAGE):
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
    """What the walk found (`rows`), taken: the attempts leased, and the commit."""
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


# The walk: from the cursor, each next endpoint's first queue row (a held one, null, sorts
# last), wrapping round. Those due (or with a lapsed lease) that take attempts and have room,
# up to one per slot, each locked unless another claim holds it; a job for a closed endpoint
# met with queued work and none clearing it (bulk.py); last, where the walk got to. Past the
# wrap both bounds of a step are the index's: as a filter, the upper one let a probe that found
# nothing before the cursor read every row after it.
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
            (SELECT endpoint_id, next_attempt_at, false AS wrapped FROM webhook_delivery_queue
             WHERE NOT w.wrapped AND endpoint_id > w.endpoint_id
             ORDER BY endpoint_id, next_attempt_at LIMIT 1)
            UNION ALL
            (SELECT endpoint_id, next_attempt_at, true FROM webhook_delivery_queue
             WHERE w.wrapped AND endpoint_id > w.endpoint_id AND endpoint_id <= %(cursor)s
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
        WHERE {serving_sql("e")}
          AND (SELECT count(*) FROM webhook_delivery_leases AS l
               WHERE l.endpoint_id = e.id AND l.leased_until >= {T}) < {limit_sql("e")}
        ORDER BY c.n LIMIT %(slots)s
    ),
    closed AS (
        INSERT INTO webhook_bulk_jobs (kind, brand_id, endpoint_id, note, requested_at)
        SELECT '{END_PENDING}', e.brand_id, e.id, 'Endpoint disabled or deleted', {T}
        FROM walked JOIN webhook_endpoints AS e ON e.id = walked.endpoint_id
        WHERE NOT ({endpoint_is_open_sql("e")}) AND NOT {clearing_sql("e")}
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

# With the endpoints locked, in a statement whose snapshot sees every claim committed before
# the locks: each endpoint's room, its lapsed leases (first) and oldest due rows up to it, moved
# to the leases; an ordered endpoint's rows behind a pending one of their subject are held
# (that one locked FOR SHARE meanwhile, so it cannot end unseen; one someone else holds waits
# for the next claim). CTEs are materialised: as subqueries of the statements that change rows,
# PostgreSQL may re-run a pick past its limit.
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
        WHERE e.id = ANY(CAST(%(endpoint_ids)s AS varchar[])) AND {serving_sql("e")}
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


def record_attempts(
    results: Sequence[tuple[Attempt, AttemptOutcome]], *, policy: RetryPolicy, rng=None
) -> list[Recorded]:
    """Write results the slow way, each part committed: a batch refused for a reason of the
    data is split in two down to single results, stored reduced, then dropped (mechanism 6 of
    docs/delivery.md). An outage is raised: the results wait for the next round."""
    try:
        return _record(results, policy, rng)
    except OUTAGE:
        raise
    except DBAPIError as error:
        db.session.rollback()
        if len(results) > 1:
            log.warning(
                "recording %d webhook attempt(s) together failed (%s); splitting the batch",
                len(results),
                type(error.orig).__name__,
            )
            middle = len(results) // 2
            first = record_attempts(results[:middle], policy=policy, rng=rng)
            return first + record_attempts(results[middle:], policy=policy, rng=rng)
        return [_record_reduced(*results[0], policy, rng, error)]


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
            [written] = _record([(attempt, outcome.reduced())], policy, rng)
            return replace(written, reduced=True)
        except OUTAGE:
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
    db.session.commit()
    return _recorded(results, rows)


def _recorded(results, rows: list[tuple]) -> list[Recorded]:
    by_id = {row[0]: row for row in rows}
    recorded: list[Recorded] = []
    for attempt, _ in results:
        _, kind, status, retry_at, failures, probing = by_id[attempt.delivery_id]
        if kind == "kept":
            kept = Recorded(status, retry_at, consecutive_failures=failures, probing=probing)
            recorded.append(kept)
        else:
            recorded.append(Recorded(status=PENDING, kept=False, carried=kind == "carried"))
    return recorded


def _record_parameters(
    results: Sequence[tuple[Attempt, AttemptOutcome]], policy: RetryPolicy, rng
) -> dict[str, Any]:
    """The batch as one JSON parameter, dumped by the json module's C encoder (eighteen arrays
    through psycopg's adapters cost a round 0.1 ms)."""
    rows = []
    for attempt, outcome in results:
        retry, asked = policy.retry_delay(attempt.attempt_number, outcome, rng)
        rows.append(
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
        )
    return {"results": json.dumps(rows)}


# The batch, in one statement: each result whose lease is still its token's (`owned`; else it
# is discarded) and whose lease and delivery this transaction can lock now (`k`; else it is
# carried) settles its delivery (`delivered` even if its endpoint closed meanwhile: the
# receiver has it), goes back in the queue for a retry, and logs its attempt. Triggers release
# what was held behind a delivery that stops being pending, and count the attempt's hour.
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
