"""What the delivery loop does to the database (CONTRACT 6.2): claim the attempts to start now, and
record each attempt's outcome (retry, deliver, fail, disable the endpoint).

The database alone says what is due, what is in flight and how an endpoint is doing
(services/delivery_queue.py holds the rules every writer of that work shares):

- A claim reads endpoints in the order they became ready (`ready_at`), locks them (SKIP LOCKED:
  two workers never claim one endpoint's work at once, and neither waits for the other), and
  moves each one's oldest due deliveries, up to its room, from the queue to the leases. Its
  cost is the endpoints and deliveries it claims, not the endpoints with pending work
  (issue 35).
- An endpoint has at most its slot limit of live leases, across all workers; while it keeps
  failing the limit is one and nothing starts before `next_probe_at` (the breaker).
- A lease lasts the attempt's timeout plus `LEASE_SLACK`: longer than any attempt, so it needs
  no extension, and a worker that dies leaves leases that lapse by themselves. The claim that
  next visits the endpoint puts a lapsed lease's delivery back first in its queue.
- A result is written under the token that took the delivery. A result whose lease is gone (it
  lapsed and was taken again) is discarded; the attempt that took it is the one logged.
- A result is untrusted data made safe before it comes here (workers/answers.py), and one
  result that cannot be stored anyway is stored in a reduced form, alone: it never holds back
  the records of others, nor the next claim (issue 34).

Times are the database's clock (`statement_timestamp()`), so that workers on machines whose
clocks differ agree on what is due and whose lease is live. Written in SQL on the session: the
hot path wants few round trips and no ORM identity map. Each function leaves the transaction
to its caller.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from extensions import db
from models.webhook_delivery import ERROR_MAX_LENGTH, FAILED, PENDING
from models.webhook_endpoint import endpoint_is_open_sql
from services.delivery_queue import (
    PROBING_AFTER_FAILURES,
    bring_retries_forward,
    endpoint_limit_sql,
    fail_pending_deliveries,
    in_flight_sql,
    sql,
)
from services.endpoint_health import (
    count_failure,
    count_success,
    disable_endpoint,
    disable_if_failing_too_long,
    failing_threshold,
)
from services.psycopg_direct import fetch_all_on_psycopg, psycopg_sql

log = logging.getLogger("brand_api.webhooks")

JITTER = 0.10  # retries land within ±10% of the schedule (CONTRACT 6.2)
# A receiver's Retry-After is honoured up to this (CONTRACT 8.6).
RETRY_AFTER_MAX_SECONDS = 3600
GONE_REASON = "The receiver answered 410 Gone"
# A lease outlives its attempt (at most WEBHOOK_TIMEOUT) by this much: the time its result has
# to be recorded before another worker may take the delivery.
LEASE_SLACK = timedelta(seconds=5)
# Endpoints one claim looks at, at most (each gets up to its room).
CLAIM_ENDPOINTS_MAX = 500
# How far past an ordered endpoint's room a claim looks for deliveries it can start, holding
# the ones behind an earlier delivery of their subject as it goes.
ORDERED_LOOK_AHEAD = 32
# What the log keeps of an outcome that could not be stored as the receiver sent it.
UNSTORABLE = "The receiver's answer could not be stored; its status is kept"


def _sql(statement: str) -> str:
    """`{now}` (services/delivery_queue.py), `{e_is_open}` (the endpoint `e` takes deliveries:
    models/webhook_endpoint.py's one rule), `{limit}` and `{in_flight}` (of endpoint `e`)."""
    return sql(
        statement.replace("{e_is_open}", f"({endpoint_is_open_sql('e')})")
        .replace("{limit}", endpoint_limit_sql("e"))
        .replace("{in_flight}", in_flight_sql("e"))
    )


def _psycopg(statement: str) -> str:
    """`_sql`, for psycopg directly: the claim and the record run every round, and
    SQLAlchemy's work around an execution was a third of such a statement's time."""
    return psycopg_sql(text(_sql(statement)))


@dataclass(frozen=True)
class RetryPolicy:
    """CONTRACT section 1: WEBHOOK_RETRY_SCHEDULE, WEBHOOK_DISABLE_FAILURES/_WINDOW, and the
    timeout that bounds the breaker's pause and sets the lease."""

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

    @property
    def lease(self) -> timedelta:
        return timedelta(seconds=self.timeout) + LEASE_SLACK


@dataclass(frozen=True)
class Attempt:
    """One attempt to make now: a leased delivery and its endpoint as committed at the claim."""

    delivery_id: str
    endpoint_id: str
    event_id: str
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
    # When the next endpoint becomes ready (a retry, a probe, a lease that may lapse), if any.
    next_ready_at: datetime | None = None


@dataclass(frozen=True)
class AttemptTimings:
    """Where an attempt's time went (CONTRACT 12.5), in milliseconds; None where the attempt did
    not get that far or the step did not happen."""

    dns_ms: int | None = None
    connect_ms: int | None = None
    tls_ms: int | None = None
    first_byte_ms: int | None = None


@dataclass(frozen=True)
class AttemptOutcome:
    """What happened, every string already safe to store (workers/answers.py)."""

    requested_at: datetime
    duration_ms: int
    request_headers: dict[str, str]
    http_status: int | None = None
    error: str | None = None
    response_body: str | None = None
    response_headers: dict[str, str] | None = None
    remote_address: str | None = None
    timings: AttemptTimings = AttemptTimings()
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

    def reduced(self) -> AttemptOutcome:
        """This outcome with nothing of the receiver's but its status: what is stored when the
        whole could not be."""
        return AttemptOutcome(
            requested_at=self.requested_at,
            duration_ms=self.duration_ms,
            request_headers={},
            http_status=self.http_status,
            error=None if self.succeeded else UNSTORABLE,
            response_body=None if self.succeeded else "",
            retry_after_seconds=self.retry_after_seconds,
            gone=self.gone,
        )


@dataclass(frozen=True)
class Recorded:
    """What became of an attempt's result. `kept` is False when its lease was no longer the
    delivery's (it lapsed and another worker took it): nothing was written."""

    status: str
    retry_at: datetime | None = None
    endpoint_disabled: bool = False
    kept: bool = True
    reduced: bool = False


# --- claiming ---------------------------------------------------------------------------------


def claim_attempts(
    *,
    slots: int,
    endpoint_limit: int,
    token: str,
    lease: timedelta,
    held: Sequence[str] = (),
    now: datetime | None = None,
) -> Claimed:
    """Lease up to `slots` due deliveries for attempts that start now (the caller commits).

    Endpoints take turns: the ones ready longest ago first, and each one served goes to the
    back of the line (a brand's backlog never goes before another brand's single event). Each
    gets up to its room (its slot limit less its live leases) of its oldest due deliveries, and
    the first of every endpoint before the second of any, up to `slots`. An endpoint that
    orders by subject never starts a delivery while an earlier one of its subject is pending:
    that one is held (`next_attempt_at` null) until the earlier ends. `held`: deliveries this
    worker is still sending or recording, never taken again by it.

    Then each endpoint visited is given its next turn (services/delivery_queue.py)."""
    connection = db.session.connection()
    params: dict[str, Any] = {
        "now": now,
        "slots": slots,
        "max_endpoints": max(1, min(slots, CLAIM_ENDPOINTS_MAX)),
        "endpoint_limit": endpoint_limit,
        "probing_after": PROBING_AFTER_FAILURES,
        "lease_seconds": lease.total_seconds(),
        "token": token,
        "held": list(held),
        "look_ahead": ORDERED_LOOK_AHEAD,
    }
    locked = fetch_all_on_psycopg(connection, _LOCK_READY, params)
    if not locked:
        return Claimed(next_ready_at=_next_ready(now))
    endpoint_ids = [row[0] for row in locked]
    if any(row[1] for row in locked):
        db.session.execute(
            _RETURN_LAPSED,
            {
                "endpoint_ids": endpoint_ids,
                "held": list(held),
                "now": now,
            },
        )
    rows = fetch_all_on_psycopg(connection, _TAKE_DUE, {**params, "endpoint_ids": endpoint_ids})
    attempts = [
        Attempt(
            delivery_id=row[1],
            endpoint_id=row[2],
            attempt_number=row[3] + 1,
            event_id=row[4],
            event_name=row[5],
            url=row[6],
            secret_ciphertext=row[7],
            previous_secret_ciphertext=row[8],
            body=row[9].encode(),
            token=token,
        )
        for row in rows
        if row[0] == "attempt"
    ]
    settle(sorted(row[1] for row in rows if row[0] == "settle"), now)
    # A loop that started something wakes when it ends; one that did not sleeps till this.
    return Claimed(attempts=attempts, next_ready_at=None if attempts else _next_ready(now))


def settle(endpoint_ids: list[str], now: datetime | None) -> None:
    """The endpoints a claim found nothing visible to start at (their turn came, they have room,
    nothing is due): their next turn is their next retry or the end of a lease, or none. Made
    only under FOR UPDATE, which no publisher holding an endpoint's KEY SHARE allows: an
    endpoint a publisher is adding work to stays ready for the next claim
    (services/delivery_queue.py). A closed endpoint's strays (a publish that raced its disable
    or delete) are failed."""
    if not endpoint_ids:
        return
    quiet = db.session.execute(_LOCK_QUIET, {"endpoint_ids": endpoint_ids}).scalars().all()
    if not quiet:
        return
    # A statement of its own: its snapshot sees every publisher that committed before the lock.
    closed = db.session.execute(_SETTLE, {"endpoint_ids": list(quiet), "now": now}).scalars()
    for endpoint_id in [endpoint_id for endpoint_id in closed if endpoint_id is not None]:
        fail_pending_deliveries(endpoint_id, error="Endpoint disabled or deleted", now=now)


def _next_ready(now: datetime | None) -> datetime | None:
    return db.session.execute(_NEXT_READY, {"now": now}).scalar()


# The endpoints whose turn has come, in turn, locked (another worker's are skipped, never
# waited for), and whether one of them has a lease that lapsed.
_LOCK_READY = _psycopg(
    """
    SELECT e.id,
           EXISTS (SELECT 1 FROM webhook_delivery_leases AS lease
                   WHERE lease.endpoint_id = e.id AND lease.leased_until < {now}
                     AND lease.delivery_id <> ALL(CAST(:held AS varchar[])))
    FROM webhook_endpoints AS e
    WHERE e.ready_at <= {now}
    ORDER BY e.ready_at, e.id
    LIMIT :max_endpoints
    FOR NO KEY UPDATE OF e SKIP LOCKED
    """
)

# Lapsed leases (their worker died, or could not record in time) give their delivery back to the
# queue, first in line (due since it was made; never later than now, whatever the clock of the
# host that made it); one no longer pending just goes.
_RETURN_LAPSED = text(
    _sql(
        """
        WITH lapsed AS (
            DELETE FROM webhook_delivery_leases
            WHERE endpoint_id = ANY(CAST(:endpoint_ids AS varchar[])) AND leased_until < {now}
              AND delivery_id <> ALL(CAST(:held AS varchar[]))
            RETURNING *
        )
        INSERT INTO webhook_delivery_queue (
            delivery_id, endpoint_id, next_attempt_at, attempt_count, not_before, subject_key,
            sequence
        )
        SELECT lapsed.delivery_id, lapsed.endpoint_id, LEAST(d.created_at, {now}),
               lapsed.attempt_count,
               lapsed.not_before, lapsed.subject_key, lapsed.sequence
        FROM lapsed JOIN webhook_deliveries AS d ON d.id = lapsed.delivery_id
        WHERE d.status = 'pending'
        ON CONFLICT (delivery_id) DO NOTHING
        """
    )
)

# With the endpoints locked, in one statement: each open, unpaused endpoint's room (its limit
# less every worker's live leases), its oldest due queue rows (a look-ahead past its room: one
# more to know whether more is due, more for an endpoint that orders by subject, whose rows
# behind an earlier pending delivery of their subject are held as they are met), the rows each
# gets (the first of every endpoint before the second of any, up to the slots), moved from the
# queue to the leases, and what each endpoint came to. Rows are materialised CTEs: as
# subqueries of the statements that change them, PostgreSQL may re-run a pick and ignore its
# limit.
_TAKE_DUE = _psycopg(
    """
    WITH endpoint AS MATERIALIZED (
        SELECT e.id, e.url, e.secret_ciphertext,
               CASE WHEN e.previous_secret_expires_at > {now}
                    THEN e.previous_secret_ciphertext END AS previous_secret_ciphertext,
               {e_is_open} AS open,
               COALESCE(e.next_probe_at > {now}, false) AS paused,
               e.ordering = 'subject' AS ordered,
               GREATEST(0, {limit} - {in_flight}) AS room,
               array_position(CAST(:endpoint_ids AS varchar[]), e.id) AS turn
        FROM webhook_endpoints AS e
        WHERE e.id = ANY(CAST(:endpoint_ids AS varchar[]))
    ),
    seen AS MATERIALIZED (
        SELECT endpoint.id AS endpoint_id, endpoint.turn, due.*,
               endpoint.ordered AND due.subject_key IS NOT NULL AND (
                   EXISTS (SELECT 1 FROM webhook_delivery_queue AS earlier
                           WHERE earlier.endpoint_id = endpoint.id
                             AND earlier.subject_key = due.subject_key
                             AND earlier.sequence < due.sequence)
                   OR EXISTS (SELECT 1 FROM webhook_delivery_leases AS earlier
                              WHERE earlier.endpoint_id = endpoint.id
                                AND earlier.subject_key = due.subject_key
                                AND earlier.sequence < due.sequence)) AS behind
        FROM endpoint CROSS JOIN LATERAL (
            SELECT q.delivery_id, q.next_attempt_at, q.attempt_count, q.not_before,
                   q.subject_key, q.sequence
            FROM webhook_delivery_queue AS q
            WHERE q.endpoint_id = endpoint.id AND q.next_attempt_at <= {now}
              AND q.delivery_id <> ALL(CAST(:held AS varchar[]))
            ORDER BY q.next_attempt_at, q.delivery_id
            LIMIT endpoint.room + CASE WHEN endpoint.ordered THEN :look_ahead ELSE 1 END
            FOR UPDATE OF q SKIP LOCKED
        ) AS due
        WHERE endpoint.open AND NOT endpoint.paused AND endpoint.room > 0
    ),
    startable AS MATERIALIZED (
        SELECT seen.*,
               row_number() OVER (PARTITION BY seen.endpoint_id
                                  ORDER BY seen.next_attempt_at, seen.delivery_id) AS place
        FROM seen WHERE NOT seen.behind
    ),
    taken AS MATERIALIZED (
        SELECT startable.* FROM startable JOIN endpoint ON endpoint.id = startable.endpoint_id
        WHERE startable.place <= endpoint.room
        ORDER BY startable.place, startable.turn
        LIMIT :slots
    ),
    held_back AS (
        UPDATE webhook_delivery_queue AS q SET next_attempt_at = NULL
        FROM seen WHERE q.delivery_id = seen.delivery_id AND seen.behind
    ),
    unqueued AS (
        DELETE FROM webhook_delivery_queue AS q
        -- Through the primary key: the planner cannot see how few rows the CTE holds.
        WHERE q.delivery_id = ANY (ARRAY(SELECT delivery_id FROM taken))
        RETURNING q.*
    ),
    leased AS (
        INSERT INTO webhook_delivery_leases (
            delivery_id, endpoint_id, token, leased_until, attempt_count, not_before,
            subject_key, sequence
        )
        SELECT delivery_id, endpoint_id, :token, {now} + make_interval(secs => :lease_seconds),
               attempt_count, not_before, subject_key, sequence
        FROM unqueued
        RETURNING delivery_id, endpoint_id, attempt_count
    ),
    counted AS (
        SELECT endpoint.id, endpoint.open, endpoint.paused, endpoint.room,
               (SELECT count(*) FROM taken WHERE taken.endpoint_id = endpoint.id) AS taken,
               (SELECT count(*) FROM startable
                WHERE startable.endpoint_id = endpoint.id) AS startable,
               (SELECT count(*) FROM seen WHERE seen.endpoint_id = endpoint.id) AS seen,
               endpoint.room + CASE WHEN endpoint.ordered THEN :look_ahead ELSE 1 END AS looked
        FROM endpoint
    ),
    -- Each endpoint's next turn: `paused` till the breaker's next probe; `full` till a lease may
    -- end (a record brings it sooner; the leases taken here end at now + the lease); `again`
    -- now, at the back of the line (held rows filled its look-ahead: more may be due behind
    -- them); `kept`, its place, when this claim ran out of slots before serving it all;
    -- `settle` when nothing visible is due (done after this statement: `settle`).
    turn AS (
        SELECT id, CASE
            WHEN NOT open THEN 'settle'
            WHEN paused THEN 'paused'
            WHEN room - taken <= 0 THEN 'full'
            WHEN startable > taken THEN 'kept'
            WHEN seen >= looked THEN 'again'
            ELSE 'settle' END AS kind
        FROM counted
    ),
    moved AS (
        UPDATE webhook_endpoints AS e
        SET ready_at = CASE turn.kind
            WHEN 'paused' THEN e.next_probe_at
            WHEN 'full' THEN LEAST(
                (SELECT min(lease.leased_until) FROM webhook_delivery_leases AS lease
                 WHERE lease.endpoint_id = e.id AND lease.leased_until >= {now}),
                {now} + make_interval(secs => :lease_seconds))
            ELSE {now} END
        FROM turn WHERE e.id = turn.id AND turn.kind IN ('paused', 'full', 'again')
    )
    SELECT 'attempt', leased.delivery_id, CAST(leased.endpoint_id AS text), leased.attempt_count,
           d.event_id, d.event_name, endpoint.url, endpoint.secret_ciphertext,
           endpoint.previous_secret_ciphertext, event.body
    FROM leased
    JOIN endpoint ON endpoint.id = leased.endpoint_id
    JOIN webhook_deliveries AS d ON d.id = leased.delivery_id
    JOIN webhook_events AS event ON event.id = d.event_id
    UNION ALL
    SELECT 'settle', turn.id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
    FROM turn WHERE turn.kind = 'settle'
    """
)

# FOR UPDATE conflicts with the KEY SHARE a publisher holds on the endpoints it adds work to,
# until it commits: those are skipped (they stay ready).
_LOCK_QUIET = text(
    """
    SELECT id FROM webhook_endpoints WHERE id = ANY(CAST(:endpoint_ids AS varchar[]))
    ORDER BY id FOR UPDATE SKIP LOCKED
    """
)

# Nothing visible is due: the next turn is the earliest of its next retry and the end of a lease
# (which may lapse), or none; a closed endpoint has none, and is named for its strays.
_SETTLE = text(
    _sql(
        """
        UPDATE webhook_endpoints AS e
        SET ready_at = CASE WHEN {e_is_open} THEN LEAST(
            (SELECT min(q.next_attempt_at) FROM webhook_delivery_queue AS q
             WHERE q.endpoint_id = e.id),
            (SELECT min(lease.leased_until) FROM webhook_delivery_leases AS lease
             WHERE lease.endpoint_id = e.id)) END
        WHERE e.id = ANY(CAST(:endpoint_ids AS varchar[]))
        RETURNING CASE WHEN NOT {e_is_open} THEN e.id END
        """
    )
)

_NEXT_READY = text("SELECT min(ready_at) FROM webhook_endpoints WHERE ready_at IS NOT NULL")


# --- recording --------------------------------------------------------------------------------


def record_attempts(
    results: Sequence[tuple[Attempt, AttemptOutcome]],
    *,
    policy: RetryPolicy,
    rng: random.Random | None = None,
) -> list[Recorded]:
    """Write a round's results, in the order they finished (the caller commits); for each,
    what became of it.

    All in one go when that works, in the caller's transaction, which must hold nothing else
    yet (the loop claims in it next, and commits once). When a statement fails for a reason of
    the data (not an outage), that transaction is rolled back and each result is written and
    committed alone; one that still fails is written in a reduced form (its status and a plain
    error) and logged: one bad answer never holds back the others' records, nor the claim that
    follows. An outage (the connection lost) is raised: the results wait for the next round.

    Endpoint rows are locked first, in id order (update-endpoint locks its one row), so a
    record waits for an endpoint change in progress (at most the lock timeout) and never
    deadlocks with it. An endpoint's run of failures counts the failures after its last success
    in the batch; a success ends the run, and if the endpoint was down (its breaker engaged),
    its deliveries waiting for a retry become due now (it is back: catch-up). A success settles
    its delivery `delivered` even if a disable failed it meanwhile: the receiver has it."""
    if not results:
        return []
    try:
        return _record(results, policy, rng)
    except (OperationalError, InterfaceError):
        raise
    except DBAPIError as error:
        db.session.rollback()
        log.warning(
            "recording %d webhook attempt(s) together failed (%s); recording each alone",
            len(results),
            type(error.orig).__name__,
        )
    return [_record_alone(attempt, outcome, policy, rng) for attempt, outcome in results]


def _record_alone(
    attempt: Attempt, outcome: AttemptOutcome, policy: RetryPolicy, rng: random.Random | None
) -> Recorded:
    """One result in a transaction of its own; reduced if it cannot be stored as it is."""
    try:
        recorded = _record([(attempt, outcome)], policy, rng)[0]
        db.session.commit()
        return recorded
    except (OperationalError, InterfaceError):
        raise
    except DBAPIError as error:
        db.session.rollback()
        log.error(
            "webhook attempt delivery=%s endpoint=%s: its outcome could not be stored (%s); "
            "storing its status alone",
            attempt.delivery_id,
            attempt.endpoint_id,
            type(error.orig).__name__,
        )
    try:
        recorded = replace(_record([(attempt, outcome.reduced())], policy, rng)[0], reduced=True)
        db.session.commit()
        return recorded
    except (OperationalError, InterfaceError):
        raise
    except DBAPIError:
        db.session.rollback()
        # Not for want of storing the receiver's bytes: a fault of ours, with its traceback.
        # The result is dropped; its lease lapses and the delivery is attempted again.
        log.exception(
            "webhook attempt delivery=%s: not even its status could be stored", attempt.delivery_id
        )
        return Recorded(status=PENDING, kept=False)


def _record(
    results: Sequence[tuple[Attempt, AttemptOutcome]],
    policy: RetryPolicy,
    rng: random.Random | None,
) -> list[Recorded]:
    endpoint_ids = sorted({attempt.endpoint_id for attempt, _ in results})
    delays = [_retry_delay(attempt, outcome, policy, rng) for attempt, outcome in results]
    rows = fetch_all_on_psycopg(
        db.session.connection(),
        _RECORD,
        {
            **_record_parameters(results, delays),
            "endpoint_ids": endpoint_ids,
            "probing_after": PROBING_AFTER_FAILURES,
        },
    )
    failing = {row[1] for row in rows if row[0] == "endpoint" and row[4]}
    # Down, not merely refusing some deliveries: its breaker is engaged.
    down = {row[1] for row in rows if row[0] == "endpoint" and row[5]}
    written = {row[1]: (row[2], row[3]) for row in rows if row[0] == "delivery"}
    # An ordered delivery that ended lets the next of its subject go.
    ended = [
        (row[1], row[6]) for row in rows if row[0] == "delivery" and row[6] and row[2] != PENDING
    ]
    if ended:
        endpoint_of = {attempt.delivery_id: attempt.endpoint_id for attempt, _ in results}
        db.session.execute(
            _RELEASE_NEXT,
            {
                "endpoint_ids": [endpoint_of[delivery_id] for delivery_id, _ in ended],
                "subject_keys": [subject_key for _, subject_key in ended],
            },
        )
    recorded: list[Recorded] = []
    last_success: dict[str, int] = {}
    for index, (attempt, outcome) in enumerate(results):
        if attempt.delivery_id not in written:
            recorded.append(Recorded(status=PENDING, kept=False))
            continue
        status, retry_at = written[attempt.delivery_id]
        recorded.append(Recorded(status=status, retry_at=retry_at))
        if outcome.succeeded:
            last_success[attempt.endpoint_id] = index
    for endpoint_id in failing & set(last_success):
        count_success(endpoint_id)
        if endpoint_id in down:
            # It is back: what waited for a retry goes now (within its limit). Only after an
            # outage: a receiver that refuses one delivery and takes the rest keeps that one on
            # its schedule instead of retrying it at every other success.
            bring_retries_forward(endpoint_id, override_retry_after=False)
    for index, (attempt, outcome) in enumerate(results):
        if outcome.succeeded or not recorded[index].kept:
            continue
        if index < last_success.get(attempt.endpoint_id, -1):
            continue  # a later success in this batch ended the run it would have counted in
        if _counts_against_endpoint(outcome) and _count_failure(attempt, outcome, policy):
            recorded[index] = replace(recorded[index], status=FAILED, endpoint_disabled=True)
    return recorded


def _counts_against_endpoint(outcome: AttemptOutcome) -> bool:
    """A failure of this worker's own (it could not decrypt the secret, it ran out of file
    descriptors) is retried on the schedule but says nothing of the receiver."""
    return not (outcome.error or "").startswith("Not sent: this worker")


def _retry_delay(
    attempt: Attempt, outcome: AttemptOutcome, policy: RetryPolicy, rng: random.Random | None
) -> tuple[float | None, float | None]:
    """(seconds to the next attempt, seconds before which none may start: a Retry-After), or
    Nones for a success or after the last attempt."""
    if outcome.succeeded or attempt.attempt_number >= policy.max_attempts:
        return None, None
    delay = policy.schedule[attempt.attempt_number - 1] * (rng or random).uniform(
        1 - JITTER, 1 + JITTER
    )
    asked = None
    if outcome.retry_after_seconds is not None:
        asked = min(outcome.retry_after_seconds, RETRY_AFTER_MAX_SECONDS)
        delay = max(delay, asked)
    return delay, asked


def _count_failure(attempt: Attempt, outcome: AttemptOutcome, policy: RetryPolicy) -> bool:
    """One more failure in the endpoint's run: the breaker's pause, the failing announcement,
    perhaps the endpoint disabled (a long run, or a 410); True when this disabled it."""
    error = outcome.error_text
    run = count_failure(
        attempt.endpoint_id,
        outcome.requested_at,
        error=error,
        failing_at=failing_threshold(policy.disable_failures),
        max_pause=policy.timeout,
    )
    if outcome.gone:
        return disable_endpoint(
            attempt.endpoint_id,
            reason=GONE_REASON,
            now=outcome.requested_at,
            by_service=True,
            last_error=error,
        )
    return disable_if_failing_too_long(
        attempt.endpoint_id,
        run,
        disable_failures=policy.disable_failures,
        disable_window=policy.disable_window,
        now=outcome.requested_at,
        last_error=error,
    )


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
# - `released`: each result's lease, deleted under its token (none: the result is discarded);
# - `written`: its delivery, settled `delivered`, waiting for a retry (`pending`, with its next
#   time; a delivery a disable failed meanwhile stays failed), or `failed` after the last;
# - `requeued`: one waiting for a retry goes back in the queue;
# - `logged`: the attempt's row;
# - `unheld`: for a delivery that ended, the next of its subject held behind it (an endpoint
#   that orders by subject) becomes due, in the place in line it had when it was held (the
#   delivery keeps that time): before what was published after it.
_RECORD = _psycopg(
    """
    WITH locked AS MATERIALIZED (
        SELECT id, consecutive_failures <> 0 OR next_probe_at IS NOT NULL AS failing,
               consecutive_failures >= :probing_after OR next_probe_at IS NOT NULL AS down
        FROM webhook_endpoints WHERE id = ANY(CAST(:endpoint_ids AS varchar[]))
        ORDER BY id FOR NO KEY UPDATE
    ),
    result AS (
        SELECT * FROM unnest(
            CAST(:delivery_ids AS varchar[]), CAST(:tokens AS varchar[]),
            CAST(:attempt_numbers AS integer[]), CAST(:succeeded AS boolean[]),
            CAST(:http_statuses AS integer[]), CAST(:errors AS varchar[]),
            CAST(:retry_seconds AS double precision[]),
            CAST(:not_before_seconds AS double precision[]),
            CAST(:requested_ats AS timestamptz[]), CAST(:durations AS integer[]),
            CAST(:response_bodies AS text[]), CAST(:request_headers AS text[]),
            CAST(:response_headers AS text[]), CAST(:remote_addresses AS varchar[]),
            CAST(:dns_ms AS integer[]), CAST(:connect_ms AS integer[]),
            CAST(:tls_ms AS integer[]), CAST(:first_byte_ms AS integer[])
        ) AS r(delivery_id, token, attempt_number, succeeded, http_status, error,
               retry_seconds, not_before_seconds, requested_at, duration_ms, response_body,
               request_headers, response_headers, remote_address, dns_ms, connect_ms, tls_ms,
               first_byte_ms)
    ),
    released AS (
        DELETE FROM webhook_delivery_leases AS lease USING result AS r
        WHERE lease.delivery_id = r.delivery_id AND lease.token = r.token
        RETURNING lease.delivery_id, lease.endpoint_id, lease.subject_key, lease.sequence
    ),
    written AS (
        UPDATE webhook_deliveries AS d
        SET status = CASE WHEN r.succeeded THEN 'delivered'
                          WHEN d.status = 'pending' AND r.retry_seconds IS NOT NULL
                          THEN 'pending' ELSE 'failed' END,
            delivered_at = CASE WHEN r.succeeded THEN statement_timestamp() END,
            failed_at = CASE WHEN r.succeeded THEN NULL
                             WHEN d.status = 'pending' AND r.retry_seconds IS NOT NULL THEN NULL
                             ELSE COALESCE(d.failed_at, statement_timestamp()) END,
            attempt_count = r.attempt_number, http_status = r.http_status,
            last_error = r.error,
            next_attempt_at = CASE
                WHEN NOT r.succeeded AND d.status = 'pending' AND r.retry_seconds IS NOT NULL
                THEN statement_timestamp() + make_interval(secs => r.retry_seconds) END
        FROM result AS r JOIN released ON released.delivery_id = r.delivery_id
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
    ),
    readied AS (
        UPDATE webhook_endpoints AS e
        SET ready_at = GREATEST(statement_timestamp(),
                                COALESCE(e.next_probe_at, statement_timestamp()))
        FROM locked WHERE e.id = locked.id
    )
    -- The locks first (an Append reads its branches in order): in id order, whatever else.
    SELECT 'endpoint', locked.id, NULL, NULL, locked.failing, locked.down, NULL FROM locked
    UNION ALL
    SELECT 'delivery', written.id, written.status, written.next_attempt_at, NULL, NULL,
           released.subject_key
    FROM written JOIN released ON released.delivery_id = written.id
    """
)

# For each delivery of an ordered endpoint that ended, the next of its subject held behind it
# becomes due, in its place from before it was held. A statement of its own, after the record
# locked the endpoints: its snapshot sees every hold a claim made before that lock.
_RELEASE_NEXT = text(
    """
    WITH ended AS (
        SELECT DISTINCT endpoint_id, subject_key
        FROM unnest(CAST(:endpoint_ids AS varchar[]), CAST(:subject_keys AS varchar[]))
             AS ended(endpoint_id, subject_key)
    ),
    next_of_subject AS (
        SELECT DISTINCT ON (q.endpoint_id, q.subject_key) q.delivery_id, q.next_attempt_at
        FROM ended
        JOIN webhook_delivery_queue AS q
          ON q.endpoint_id = ended.endpoint_id AND q.subject_key = ended.subject_key
        ORDER BY q.endpoint_id, q.subject_key, q.sequence
    )
    UPDATE webhook_delivery_queue AS q
    SET next_attempt_at = (SELECT LEAST(d.next_attempt_at, statement_timestamp())
                           FROM webhook_deliveries AS d WHERE d.id = q.delivery_id)
    FROM next_of_subject AS next
    WHERE q.delivery_id = next.delivery_id AND next.next_attempt_at IS NULL
    """
)
