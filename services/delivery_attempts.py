"""What the delivery loop does to the database (CONTRACT 6.2): lease due deliveries as their
attempts start, keep those leases while the attempts run, and record each outcome (retry,
deliver, fail, disable the endpoint).

The database alone says what is due, what is in flight and how an endpoint is doing:

- A delivery is due when it is `pending`, its `next_attempt_at` has passed and no live lease
  holds it. A lease is a token and a time (`leased_until`), taken in the statement that picks
  the delivery, extended by its worker every second while the attempt runs, and cleared by the
  record. A worker that dies leaves leases that lapse within `LEASE` seconds.
- An endpoint has at most its slot limit of live leases, whatever their deliveries' status,
  across all workers: a claim locks the endpoint's row and counts them. While it keeps failing
  (`consecutive_failures`), the limit is one and no attempt starts before `next_probe_at`.
- A result is written under the token that took the delivery, whenever that is: late (past
  the lease, after an outage) or after a disable failed the delivery meanwhile. A result
  whose token was replaced (the lease lapsed and another worker took the delivery) is
  discarded, and that worker's attempt is the one logged.

Times are the database's clock (`statement_timestamp()`), so that workers on machines whose
clocks differ agree on what is due and whose lease is live. Written in SQL on the session: the
hot path wants few round trips and no ORM identity map; each function leaves the transaction to
its caller, who commits once per round.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import TextClause, text

from extensions import db
from models.webhook_delivery import DELIVERED, ERROR_MAX_LENGTH, FAILED, PENDING
from models.webhook_endpoint import endpoint_is_open_sql
from services.endpoint_health import (
    PROBING_AFTER_FAILURES,
    count_failure,
    count_success,
    disable_endpoint,
    disable_if_failing_too_long,
    failing_threshold,
)
from services.psycopg_direct import fetch_all_on_psycopg, psycopg_sql

JITTER = 0.10  # retries land within ±10% of the schedule (CONTRACT 6.2)
# A receiver's Retry-After is honoured up to this (CONTRACT 8.6).
RETRY_AFTER_MAX_SECONDS = 3600
GONE_REASON = "The receiver answered 410 Gone"
# How long a lease lasts unless its worker extends it: what a killed worker's deliveries wait.
LEASE = timedelta(seconds=4)
# Endpoints one claim looks at, at most (each gets up to its room).
CLAIM_ENDPOINTS_MAX = 500
# The database's clock, unless a caller (a test) gives the time.
_NOW = "COALESCE(CAST(:now AS timestamptz), statement_timestamp())"


def _sql(statement: str) -> TextClause:
    """A constant statement with `{now}` (the time above) and `{e_is_open}` (the endpoint
    `e` takes deliveries: models/webhook_endpoint.py's one rule) filled in."""
    return text(statement.replace("{now}", _NOW).replace("{e_is_open}", endpoint_is_open_sql("e")))


def _psycopg_sql(statement: str) -> str:
    """`_sql`, for psycopg directly: the claim runs every round, and SQLAlchemy's work around
    an execution was a third of such a statement's time."""
    return psycopg_sql(_sql(statement))


@dataclass(frozen=True)
class RetryPolicy:
    """CONTRACT section 1: WEBHOOK_RETRY_SCHEDULE, WEBHOOK_DISABLE_FAILURES/_WINDOW, and the
    timeout that bounds the breaker's pause."""

    schedule: tuple[int, ...]
    disable_failures: int
    disable_window: timedelta
    timeout: float = 10.0

    @classmethod
    def from_settings(cls, settings) -> RetryPolicy:
        return cls(
            schedule=settings.webhook_retry_schedule,
            disable_failures=settings.webhook_disable_failures,
            disable_window=timedelta(seconds=settings.webhook_disable_window),
            timeout=settings.webhook_timeout,
        )

    @property
    def max_attempts(self) -> int:
        return len(self.schedule) + 1


@dataclass(frozen=True)
class Attempt:
    """One attempt to make now: a leased delivery and its endpoint as committed at the claim."""

    delivery_id: str
    endpoint_id: str
    event_name: str
    attempt_number: int
    body: bytes
    url: str
    secret_ciphertext: str
    # The secret before it, while a rotation's overlap lasts at the claim (it signs too).
    previous_secret_ciphertext: str | None
    token: str


@dataclass(frozen=True)
class Claimed:
    attempts: list[Attempt] = field(default_factory=list)
    # When a pending delivery that is not due yet falls due (a retry), if any.
    next_due_at: datetime | None = None


@dataclass(frozen=True)
class AttemptOutcome:
    requested_at: datetime
    duration_ms: int
    request_headers: dict[str, str]
    http_status: int | None = None
    error: str | None = None
    response_body: str | None = None
    # What the receiver asked for: a later retry (429/503 Retry-After), or no more (410 Gone).
    retry_after_seconds: float | None = None
    gone: bool = False

    @property
    def succeeded(self) -> bool:
        return self.error is None and self.http_status is not None and 200 <= self.http_status < 300

    @property
    def kind(self) -> str:
        """succeeded, http_error, timeout, not_sent or network_error: for metrics, whose labels
        must be few. The sender's errors start with the words this reads (workers/transport.py)."""
        if self.succeeded:
            return "succeeded"
        if self.http_status is not None:
            return "http_error"
        error = self.error or ""
        if error.startswith("Timed out"):
            return "timeout"
        if error.startswith("Not sent"):
            return "not_sent"
        return "network_error"

    @property
    def error_text(self) -> str | None:
        """What the log keeps of a failure (every failed attempt says why)."""
        if self.succeeded:
            return None
        error = self.error or f"HTTP {self.http_status}"
        return error[:ERROR_MAX_LENGTH]


@dataclass(frozen=True)
class Recorded:
    """What became of an attempt's result. `kept` is False when its token was no longer the
    delivery's (another worker took it after the lease lapsed): nothing was written."""

    status: str
    retry_at: datetime | None = None
    endpoint_disabled: bool = False
    kept: bool = True


# --- claiming ---------------------------------------------------------------------------------


def run_round(
    results: Sequence[tuple[Attempt, AttemptOutcome]],
    *,
    slots: int,
    endpoint_limit: int,
    token: str,
    policy: RetryPolicy,
    now: datetime | None = None,
    next_due: bool = True,
    rng: random.Random | None = None,
) -> tuple[list[Recorded | None], Claimed]:
    """A round of the delivery loop: record `results` (`record_attempts`), then lease up to
    `slots` due deliveries for attempts that start now (`claim_attempts`). The caller commits.

    Two statements claim, and the first records the successes too (a round is a handful of
    round trips, and the loop's pace against a fast receiver is set by them). The first
    locks the rows of the results' endpoints and of the endpoints with due deliveries and
    room, in their turn (SKIP LOCKED: one another transaction holds is left for the next
    round, never waited for), and settles the successes. The second, with a snapshot taken
    once those locks are held and those leases released, counts each endpoint's live leases
    and takes its deliveries. A change of an endpoint (rotation, URL, disable) waits for that
    lock, so every attempt leased after it commits reads it. With `next_due`, and nothing
    claimed, it also says when the next retry falls due."""
    recorded: list[Recorded | None] = [None] * len(results)
    successes = [(i, a, o) for i, (a, o) in enumerate(results) if o.succeeded]
    params: dict[str, Any] = {
        "now": now,
        "slots": slots,
        "max_endpoints": min(slots, CLAIM_ENDPOINTS_MAX),
        "endpoint_limit": endpoint_limit,
        "probing_after": PROBING_AFTER_FAILURES,
        "lease_seconds": LEASE.total_seconds(),
        "token": token,
    }
    connection = db.session.connection()
    rows = fetch_all_on_psycopg(
        connection,
        _RECORD_AND_LOCK,
        params | _settle_parameters(results, [(a, o) for _, a, o in successes]),
    )
    locked = {row[1] for row in rows if row[0] in ("locked", "failing")}
    failing = {row[1] for row in rows if row[0] == "failing"}
    settled = {row[1] for row in rows if row[0] == "settled"}
    candidates = sorted((row for row in rows if row[0] in ("open", "closed")), key=_turn)
    last_success: dict[str, int] = {}
    for index, attempt, _ in successes:
        if attempt.endpoint_id in locked:
            recorded[index] = Recorded(status=DELIVERED, kept=attempt.delivery_id in settled)
            last_success[attempt.endpoint_id] = index
    for endpoint_id in failing & {
        a.endpoint_id for _, a, _ in successes if a.delivery_id in settled
    }:
        count_success(endpoint_id)
    for index, (attempt, outcome) in enumerate(results):
        if outcome.succeeded or attempt.endpoint_id not in locked:
            continue
        counts = index > last_success.get(attempt.endpoint_id, -1)
        recorded[index] = _record_failure(attempt, outcome, policy, rng, counts=counts)
    closed = [row[1] for row in candidates if row[0] == "closed"]
    if closed:
        _fail_strays(closed, now)
    open_ids = [row[1] for row in candidates if row[0] == "open"]
    claimed: list[Attempt] = []
    if open_ids:
        # In the endpoints' turns, which the second statement keeps.
        leased = fetch_all_on_psycopg(connection, _LEASE_DUE, {**params, "endpoint_ids": open_ids})
        claimed = [
            Attempt(
                delivery_id=delivery_id,
                endpoint_id=endpoint_id,
                event_name=event_name,
                attempt_number=attempt_count + 1,
                body=body.encode(),
                url=url,
                secret_ciphertext=secret_ciphertext,
                previous_secret_ciphertext=previous_secret_ciphertext,
                token=token,
            )
            for (
                delivery_id,
                endpoint_id,
                event_name,
                attempt_count,
                url,
                secret_ciphertext,
                previous_secret_ciphertext,
                body,
            ) in leased
        ]
    next_due_at = db.session.scalar(_NEXT_DUE, {"now": now}) if next_due and not claimed else None
    return recorded, Claimed(attempts=claimed, next_due_at=next_due_at)


def claim_attempts(
    *,
    slots: int,
    endpoint_limit: int,
    token: str,
    now: datetime | None = None,
    next_due: bool = True,
) -> Claimed:
    """Lease up to `slots` due deliveries for attempts that start now: each endpoint's oldest
    due first, at most its room (its slot limit less its live leases), and the endpoints in
    turn: those with fewer attempts in flight first, then the one whose last attempt started
    longest ago. So a brand's backlog takes its turns with another brand's single event
    instead of going first, and no endpoint waits for a slot while others take several. (A
    round with nothing to record; see `run_round`.)"""
    return run_round(
        [],
        slots=slots,
        endpoint_limit=endpoint_limit,
        token=token,
        policy=_NO_POLICY,
        now=now,
        next_due=next_due,
    )[1]


def record_attempts(
    results: Sequence[tuple[Attempt, AttemptOutcome]],
    *,
    policy: RetryPolicy,
    rng: random.Random | None = None,
) -> list[Recorded | None]:
    """Write a round's results, in the order they finished; for each, what became of it, or
    None when its endpoint's row is held by another transaction (a change in progress, a
    claim): it is recorded next round, its lease kept meanwhile, so that no lock anywhere can
    hold up other endpoints' records or let a lease lapse.

    Rows are locked endpoint first, then delivery, the order of update-endpoint and
    delete-endpoint, so that no deadlock is possible with them. An endpoint's run of failures
    counts the failures after its last success in the round; a success resets it. A success
    settles its delivery `delivered` even if a disable failed it meanwhile: the receiver has it.
    (A round that claims nothing; see `run_round`.)"""
    if not results:
        return []
    return run_round(
        results, slots=0, endpoint_limit=0, token="", policy=policy, next_due=False, rng=rng
    )[0]


_NO_POLICY = RetryPolicy(schedule=(), disable_failures=1, disable_window=timedelta(0))


def _turn(row: tuple) -> tuple:
    """A candidate endpoint's place: fewer attempts in flight first, then the one whose last
    attempt started longest ago (never first), then the one whose due delivery waited longest."""
    _, endpoint_id, in_flight, last_attempt_at, oldest_due_at = row
    return (in_flight, last_attempt_at is not None, last_attempt_at, oldest_due_at, endpoint_id)


def _settle_parameters(
    results: Sequence[tuple[Attempt, AttemptOutcome]],
    successes: Sequence[tuple[Attempt, AttemptOutcome]],
) -> dict[str, Any]:
    return {
        "batch_endpoint_ids": sorted({attempt.endpoint_id for attempt, _ in results}),
        "batch_delivery_ids": [attempt.delivery_id for attempt, _ in results],
        "delivery_ids": [attempt.delivery_id for attempt, _ in successes],
        "tokens": [attempt.token for attempt, _ in successes],
        "endpoint_ids": [attempt.endpoint_id for attempt, _ in successes],
        "attempt_numbers": [attempt.attempt_number for attempt, _ in successes],
        "requested_ats": [outcome.requested_at for _, outcome in successes],
        "durations": [outcome.duration_ms for _, outcome in successes],
        "http_statuses": [outcome.http_status for _, outcome in successes],
        "response_bodies": [outcome.response_body for _, outcome in successes],
        "request_headers": [json.dumps(outcome.request_headers) for _, outcome in successes],
    }


# One statement, in CTEs:
# - candidates: endpoints with a pending delivery, one index probe each (a loose index scan: a
#   backlog of a million rows of one endpoint costs one probe, not a million rows), kept if one
#   of their pending deliveries is due and unleased, they have room (the round's results'
#   leases, released below, not counted) and no probe pause holds them, the first in turn
#   (`_turn`); closed endpoints with such strays too, to fail them;
# - locked: the results' endpoints (rows are locked endpoint first, then delivery);
# - settled and logged: each success of a locked endpoint, written under its token.
_RECORD_AND_LOCK = _psycopg_sql(
    """
    WITH RECURSIVE pending_endpoint(endpoint_id) AS (
        (SELECT endpoint_id FROM webhook_deliveries WHERE status = 'pending'
         ORDER BY endpoint_id LIMIT 1)
        UNION ALL
        SELECT (SELECT d.endpoint_id FROM webhook_deliveries AS d
                WHERE d.status = 'pending' AND d.endpoint_id > p.endpoint_id
                ORDER BY d.endpoint_id LIMIT 1)
        FROM pending_endpoint AS p WHERE p.endpoint_id IS NOT NULL
    ),
    candidates AS MATERIALIZED (
        SELECT e.id, {e_is_open} AS open, holding.in_flight, last_attempt.at AS last_attempt_at,
               oldest_due.next_attempt_at AS oldest_due_at
        FROM pending_endpoint AS p
        JOIN webhook_endpoints AS e ON e.id = p.endpoint_id
        CROSS JOIN LATERAL (
            SELECT d.next_attempt_at FROM webhook_deliveries AS d
            WHERE d.endpoint_id = e.id AND d.status = 'pending' AND d.next_attempt_at <= {now}
              AND (d.lease_token IS NULL OR d.leased_until < {now})
            ORDER BY d.next_attempt_at, d.id LIMIT 1
        ) AS oldest_due
        CROSS JOIN LATERAL (
            SELECT count(*) AS in_flight FROM webhook_deliveries AS held
            WHERE held.endpoint_id = e.id AND held.lease_token IS NOT NULL
              AND held.leased_until >= {now}
              AND held.id <> ALL(CAST(:batch_delivery_ids AS varchar[]))
        ) AS holding
        CROSS JOIN LATERAL (
            SELECT max(requested_at) AS at FROM webhook_attempts AS attempt
            WHERE attempt.endpoint_id = e.id
        ) AS last_attempt
        WHERE NOT ({e_is_open})
           OR ((e.next_probe_at IS NULL OR e.next_probe_at <= {now})
               AND holding.in_flight < CASE WHEN e.consecutive_failures >= :probing_after
                                            THEN 1 ELSE :endpoint_limit END)
        ORDER BY holding.in_flight, last_attempt.at NULLS FIRST, oldest_due.next_attempt_at,
                 e.id
        LIMIT :max_endpoints
        FOR NO KEY UPDATE OF e SKIP LOCKED
    ),
    locked AS MATERIALIZED (
        SELECT id, consecutive_failures <> 0 OR next_probe_at IS NOT NULL AS failing
        FROM webhook_endpoints WHERE id = ANY(CAST(:batch_endpoint_ids AS varchar[]))
        ORDER BY id FOR NO KEY UPDATE SKIP LOCKED
    ),
    outcome AS (
        SELECT * FROM unnest(
            CAST(:delivery_ids AS varchar[]), CAST(:tokens AS varchar[]),
            CAST(:endpoint_ids AS varchar[]), CAST(:attempt_numbers AS integer[]),
            CAST(:requested_ats AS timestamptz[]), CAST(:durations AS integer[]),
            CAST(:http_statuses AS integer[]), CAST(:response_bodies AS text[]),
            CAST(:request_headers AS text[])
        ) AS o(delivery_id, token, endpoint_id, attempt_number, requested_at, duration_ms,
               http_status, response_body, request_headers)
    ),
    settled AS (
        UPDATE webhook_deliveries AS d
        SET status = 'delivered', delivered_at = statement_timestamp(), next_attempt_at = NULL,
            last_error = NULL, attempt_count = o.attempt_number, http_status = o.http_status,
            leased_until = NULL, lease_token = NULL
        FROM outcome AS o JOIN locked ON locked.id = o.endpoint_id
        WHERE d.id = o.delivery_id AND d.lease_token = o.token
        RETURNING d.id
    ),
    logged AS (
        INSERT INTO webhook_attempts (
            delivery_id, endpoint_id, attempt_number, requested_at, duration_ms, http_status,
            error, response_body, request_headers
        )
        SELECT o.delivery_id, o.endpoint_id, o.attempt_number, o.requested_at, o.duration_ms,
               o.http_status, NULL, o.response_body, CAST(o.request_headers AS json)
        FROM outcome AS o JOIN settled ON settled.id = o.delivery_id
    )
    SELECT CASE WHEN failing THEN 'failing' ELSE 'locked' END, id,
           NULL::bigint, NULL::timestamptz, NULL::timestamptz
    FROM locked
    UNION ALL
    SELECT 'settled', id, NULL, NULL, NULL FROM settled
    UNION ALL
    SELECT CASE WHEN open THEN 'open' ELSE 'closed' END, id, in_flight, last_attempt_at,
           oldest_due_at
    FROM candidates
    """
)

# The endpoints are locked: their leases counted now are every worker's. Each gets up to its
# room of its oldest due deliveries (SKIP LOCKED: none another transaction holds), the first
# of every endpoint before the second of any, up to the slots asked for. The picked rows are a
# materialised CTE: as a subquery of the UPDATE, PostgreSQL may re-run the pick per row and
# ignore its limit.
_LEASE_DUE = _psycopg_sql(
    """
    WITH endpoint AS (
        SELECT e.id, e.url, e.secret_ciphertext,
               CASE WHEN e.previous_secret_expires_at > {now}
                    THEN e.previous_secret_ciphertext END AS previous_secret_ciphertext,
               GREATEST(0, CASE WHEN e.consecutive_failures >= :probing_after THEN 1
                                ELSE :endpoint_limit END
                           - (SELECT count(*) FROM webhook_deliveries AS held
                              WHERE held.endpoint_id = e.id AND held.lease_token IS NOT NULL
                                AND held.leased_until >= {now})) AS room
        FROM webhook_endpoints AS e
        WHERE e.id = ANY(CAST(:endpoint_ids AS varchar[])) AND {e_is_open}
          AND (e.next_probe_at IS NULL OR e.next_probe_at <= {now})
    ),
    picked AS MATERIALIZED (
        SELECT due.id, endpoint.id AS endpoint_id,
               row_number() OVER (PARTITION BY endpoint.id
                                  ORDER BY due.next_attempt_at, due.id) AS place,
               array_position(CAST(:endpoint_ids AS varchar[]), endpoint.id) AS turn
        FROM endpoint CROSS JOIN LATERAL (
            SELECT d.id, d.next_attempt_at FROM webhook_deliveries AS d
            WHERE d.endpoint_id = endpoint.id AND d.status = 'pending'
              AND d.next_attempt_at <= {now}
              AND (d.lease_token IS NULL OR d.leased_until < {now})
            ORDER BY d.next_attempt_at, d.id
            LIMIT endpoint.room
            FOR UPDATE OF d SKIP LOCKED
        ) AS due
    ),
    taken AS MATERIALIZED (
        SELECT id FROM picked ORDER BY place, turn LIMIT :slots
    ),
    leased AS (
        UPDATE webhook_deliveries AS d
        SET lease_token = :token,
            leased_until = {now} + make_interval(secs => :lease_seconds)
        -- Through the primary key: the planner cannot see how few rows the CTE holds.
        WHERE d.id = ANY (ARRAY(SELECT id FROM taken))
        RETURNING d.id, d.endpoint_id, d.event_id, d.event_name, d.attempt_count,
                  d.next_attempt_at
    )
    SELECT leased.id, leased.endpoint_id, leased.event_name, leased.attempt_count,
           endpoint.url, endpoint.secret_ciphertext, endpoint.previous_secret_ciphertext,
           event.body
    FROM leased
    JOIN endpoint ON endpoint.id = leased.endpoint_id
    JOIN webhook_events AS event ON event.id = leased.event_id
    ORDER BY leased.next_attempt_at, leased.id
    """
)

_NEXT_DUE = _sql(
    """
    SELECT min(next_attempt_at) FROM webhook_deliveries
    WHERE status = 'pending' AND next_attempt_at > {now}
    """
)


def _fail_strays(endpoint_ids: list[str], now: datetime | None) -> None:
    """Pending deliveries of closed endpoints: a publish that raced the disable or delete
    committed them after it failed the others."""
    db.session.execute(
        _sql(
            """
            UPDATE webhook_deliveries SET status = 'failed', next_attempt_at = NULL,
                   last_error = 'Endpoint disabled or deleted'
            WHERE endpoint_id = ANY(CAST(:endpoint_ids AS varchar[])) AND status = 'pending'
              AND (lease_token IS NULL OR leased_until < {now})
            """
        ),
        {"endpoint_ids": endpoint_ids, "now": now},
    )


# --- keeping leases ---------------------------------------------------------------------------


def extend_leases(held: Sequence[tuple[str, str]], *, now: datetime | None = None) -> set[str]:
    """Extend the leases of attempts still running or waiting for their record, given as
    (delivery id, token); the ids whose lease is still ours. Rows another transaction holds
    are skipped this round rather than waited for."""
    if not held:
        return set()
    rows = db.session.execute(
        _EXTEND,
        {
            "delivery_ids": [delivery_id for delivery_id, _ in held],
            "tokens": [token for _, token in held],
            "lease_seconds": LEASE.total_seconds(),
            "now": now,
        },
    ).all()
    return {row.id for row in rows}


_EXTEND = _sql(
    """
    WITH ours AS (
        SELECT d.id FROM webhook_deliveries AS d
        JOIN unnest(CAST(:delivery_ids AS varchar[]), CAST(:tokens AS varchar[]))
             AS held(id, token) ON held.id = d.id AND d.lease_token = held.token
        FOR NO KEY UPDATE OF d SKIP LOCKED
    )
    UPDATE webhook_deliveries AS d
    SET leased_until = {now} + make_interval(secs => :lease_seconds)
    FROM ours WHERE d.id = ours.id
    RETURNING d.id
    """
)


# --- recording --------------------------------------------------------------------------------


def _record_failure(
    attempt: Attempt,
    outcome: AttemptOutcome,
    policy: RetryPolicy,
    rng: random.Random | None,
    *,
    counts: bool,
) -> Recorded:
    """A failed attempt: its log row, the delivery's next retry (or `failed` after the last),
    and, if it `counts` in the endpoint's run of failures, that run: the breaker's pause, the
    failing announcement, perhaps the endpoint disabled."""
    number = attempt.attempt_number
    error = outcome.error_text
    delay = None
    if number < policy.max_attempts:
        delay = policy.schedule[number - 1] * (rng or random).uniform(1 - JITTER, 1 + JITTER)
        if outcome.retry_after_seconds is not None:
            delay = max(delay, min(outcome.retry_after_seconds, RETRY_AFTER_MAX_SECONDS))
    row = db.session.execute(
        _RECORD_FAILURE,
        {
            "delivery_id": attempt.delivery_id,
            "token": attempt.token,
            "attempt_number": number,
            "http_status": outcome.http_status,
            "error": error,
            "retry_seconds": delay,
            "endpoint_id": attempt.endpoint_id,
            "requested_at": outcome.requested_at,
            "duration_ms": outcome.duration_ms,
            "response_body": outcome.response_body,
            "request_headers": json.dumps(outcome.request_headers),
        },
    ).first()
    if row is None:
        return Recorded(status=PENDING, kept=False)
    disabled = False
    if counts:
        run = count_failure(
            attempt.endpoint_id,
            outcome.requested_at,
            error=error,
            failing_at=failing_threshold(policy.disable_failures),
            max_pause=policy.timeout,
        )
        if outcome.gone:
            disabled = disable_endpoint(
                attempt.endpoint_id,
                reason=GONE_REASON,
                now=outcome.requested_at,
                by_service=True,
                last_error=error,
            )
        else:
            disabled = disable_if_failing_too_long(
                attempt.endpoint_id,
                run,
                disable_failures=policy.disable_failures,
                disable_window=policy.disable_window,
                now=outcome.requested_at,
                last_error=error,
            )
    status = FAILED if disabled else row.status
    retry_at = row.next_attempt_at if status == PENDING else None
    return Recorded(status=status, retry_at=retry_at, endpoint_disabled=disabled)


# A failed attempt, written under its token: the delivery waits for its retry (or is failed
# after the last attempt; one a disable failed meanwhile stays failed), and its log row.
_RECORD_FAILURE = text(
    """
    WITH given AS (
        SELECT CAST(:retry_seconds AS double precision) AS retry_seconds,
               CAST(:http_status AS integer) AS http_status,
               CAST(:error AS varchar) AS error,
               CAST(:attempt_number AS integer) AS attempt_number
    ),
    written AS (
        UPDATE webhook_deliveries AS d
        SET attempt_count = given.attempt_number, http_status = given.http_status,
            last_error = given.error,
            status = CASE WHEN d.status = 'pending' AND given.retry_seconds IS NOT NULL
                          THEN 'pending' ELSE 'failed' END,
            next_attempt_at = CASE
                WHEN d.status = 'pending' AND given.retry_seconds IS NOT NULL
                THEN statement_timestamp() + make_interval(secs => given.retry_seconds) END,
            leased_until = NULL, lease_token = NULL
        FROM given
        WHERE d.id = :delivery_id AND d.lease_token = :token
        RETURNING d.id, d.status, d.next_attempt_at
    ),
    logged AS (
        INSERT INTO webhook_attempts (
            delivery_id, endpoint_id, attempt_number, requested_at, duration_ms, http_status,
            error, response_body, request_headers
        )
        SELECT written.id, :endpoint_id, given.attempt_number,
               CAST(:requested_at AS timestamptz), CAST(:duration_ms AS integer),
               given.http_status, given.error, CAST(:response_body AS text),
               CAST(:request_headers AS json)
        FROM written CROSS JOIN given
    )
    SELECT status, next_attempt_at FROM written
    """
)


@dataclass(frozen=True)
class DeliveryBacklog:
    """The work waiting, for `GET /metrics` (docs/operations.md says what to alert on)."""

    pending: int
    due: int  # claimable now: pending, due and held by no worker
    oldest_due_at: datetime | None


def delivery_backlog(*, now: datetime | None = None) -> DeliveryBacklog:
    """Counted on the pending rows only (partial indexes), however long the delivery log is."""
    pending, due, oldest = db.session.execute(_BACKLOG, {"now": now}).one()
    db.session.commit()
    return DeliveryBacklog(pending=pending, due=due, oldest_due_at=oldest)


_BACKLOG = _sql(
    """
    SELECT count(*), count(*) FILTER (WHERE {due}), min(next_attempt_at) FILTER (WHERE {due})
    FROM webhook_deliveries WHERE status = 'pending'
    """.replace(
        "{due}", "next_attempt_at <= {now} AND (lease_token IS NULL OR leased_until < {now})"
    )
)
