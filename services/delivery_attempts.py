"""What a worker does to the database around an attempt: claim due deliveries under a lease,
record each attempt's outcome (retry, deliver, fail, disable the endpoint), and find work whose
job was lost (CONTRACT 6.2).

Written in SQLAlchemy Core on the session: the worker's hot path wants few round trips and no
ORM identity map, and every function commits its own short transaction so that a worker killed
at any point leaves the database consistent.
"""

from __future__ import annotations

import json
import random
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from sqlalchemy import func, insert, or_, select, text, update

from extensions import db
from models import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from models.webhook_delivery import DELIVERED, ERROR_MAX_LENGTH, FAILED, PENDING
from models.webhook_endpoint import endpoint_is_open_sql
from services.deliveries import fail_pending_deliveries
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


@dataclass(frozen=True)
class RetryPolicy:
    """CONTRACT section 1: WEBHOOK_RETRY_SCHEDULE, WEBHOOK_DISABLE_FAILURES/_WINDOW."""

    schedule: tuple[int, ...]
    disable_failures: int
    disable_window: timedelta

    @classmethod
    def from_settings(cls, settings) -> RetryPolicy:
        return cls(
            schedule=settings.webhook_retry_schedule,
            disable_failures=settings.webhook_disable_failures,
            disable_window=timedelta(seconds=settings.webhook_disable_window),
        )

    @property
    def max_attempts(self) -> int:
        return len(self.schedule) + 1


@dataclass(frozen=True)
class ClaimedDelivery:
    id: str
    event_name: str
    attempt_number: int
    body: bytes
    # Held until then: its attempt must start a timeout before (one claimed ahead, later).
    leased_until: datetime


@dataclass
class Claim:
    """What one claim found for one endpoint: the deliveries leased to the claiming worker
    (perhaps none), of which the first `room` may start at once and the rest were claimed
    ahead, to start as those end; and what the worker should know of the endpoint."""

    endpoint_id: str
    url: str = ""
    secret_ciphertext: str = ""
    # The secret before it, while a rotation's overlap lasts (it signs too), and until when.
    previous_secret_ciphertext: str | None = None
    previous_secret_expires_at: datetime | None = None
    token: str = ""
    deliveries: list[ClaimedDelivery] = field(default_factory=list)
    room: int = 0
    # The endpoint's run of failed attempts when claimed (its slot limit follows from it).
    consecutive_failures: int = 0
    # Due deliveries are left that this claim did not take: the endpoint's slots were full.
    more_due: bool = False
    # When the endpoint's next delivery that is not due yet falls due (a retry), if any.
    next_due_at: datetime | None = None
    # False: the endpoint is disabled, deleted or gone; nothing is sent to it.
    open: bool = True
    # Another worker was claiming the endpoint at that moment; nothing was looked at.
    busy: bool = False


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


@dataclass(frozen=True)
class Recorded:
    status: str
    retry_at: datetime | None = None
    endpoint_disabled: bool = False
    # False when the delivery was no longer ours (lease lost, endpoint deleted meanwhile): the
    # outcome was not written.
    kept: bool = True
    # Whether the endpoint may still be sent to: false once it was deleted or disabled, by this
    # attempt or by anyone meanwhile. Read in the attempt's own transaction, so a drain learns
    # of a DELETE before its next send, at no extra commit.
    endpoint_open: bool = True
    # The endpoint's run of failed attempts after this one (0 after a success).
    consecutive_failures: int = 0


def claim_due_deliveries(
    slots: Mapping[str, int],
    *,
    endpoint_limit: int,
    lease: timedelta,
    now: datetime,
    owner: str,
    ahead: int = 0,
    attempt_time: timedelta = timedelta(0),
) -> dict[str, Claim]:
    """Lease due pending deliveries of several endpoints in one transaction, oldest due first.

    Of each endpoint, up to `slots[endpoint]` may start at once (its `room`), and never so
    many that it has more attempts in flight than its slot limit (`endpoint_health.slot_limit`)
    across all workers (an attempt in flight is a live lease). A healthy endpoint that no
    other worker holds is also claimed `ahead` (that many more, for the caller to start as its
    attempts end): while the caller holds them, other workers find no room, so the limit still
    holds. A lease runs out `lease` after the moment its attempt may start at the latest: a
    delivery claimed ahead is held `attempt_time` longer for each round of the endpoint's
    attempts before it.

    `owner` (8 characters) begins every lease token the caller takes. Deliveries leased by a
    live worker are not taken; a lapsed lease is. An endpoint that another worker is claiming
    at the same moment is skipped (`busy`): its count of leases would be stale. One that is
    disabled or deleted comes back closed, with any pending delivery a race left behind failed
    now."""
    endpoint_ids = list(slots)
    if not endpoint_ids:
        return {}
    # Claims of one endpoint take turns here, and the count of its leases below is read after
    # the lock is held (a new statement, a new snapshot), so two workers never both see room.
    locked = set(db.session.scalars(_TRY_CLAIM_LOCKS, {"endpoint_ids": endpoint_ids}))
    claims = {eid: Claim(eid, busy=True) for eid in endpoint_ids if eid not in locked}
    wanted = [eid for eid in endpoint_ids if eid in locked]
    token = owner + secrets.token_hex(12)
    rows = (
        db.session.execute(
            _CLAIM,
            {
                "endpoint_ids": wanted,
                "slots": [slots[eid] for eid in wanted],
                "endpoint_limit": endpoint_limit,
                "probing_after": PROBING_AFTER_FAILURES,
                "ahead": ahead,
                "now": now,
                "leased_until": now + lease,
                "round_seconds": attempt_time.total_seconds(),
                "token": token,
                "owned": owner + "%",
            },
        ).all()
        if wanted
        else []
    )
    for row in rows:
        claim = claims.get(row.endpoint_id)
        if claim is None:
            claim = claims[row.endpoint_id] = Claim(
                row.endpoint_id,
                url=row.url,
                secret_ciphertext=row.secret_ciphertext,
                previous_secret_ciphertext=row.previous_secret_ciphertext,
                previous_secret_expires_at=row.previous_secret_expires_at,
                token=token,
                room=row.room,
                consecutive_failures=row.consecutive_failures,
                more_due=row.more_due,
                next_due_at=row.next_due_at,
            )
        if row.delivery_id is not None:
            claim.deliveries.append(
                ClaimedDelivery(
                    id=row.delivery_id,
                    event_name=row.event_name,
                    attempt_number=row.attempt_count + 1,
                    body=row.body.encode(),
                    leased_until=row.leased_until,
                )
            )
    for endpoint_id in wanted:
        if endpoint_id not in claims:
            # Disabled or deleted: its pending deliveries were failed when that happened, and
            # any a race left behind go now.
            fail_pending_deliveries(endpoint_id, error="Endpoint disabled or deleted")
            claims[endpoint_id] = Claim(endpoint_id, open=False)
    db.session.commit()
    return claims


_TRY_CLAIM_LOCKS = text(
    """
    SELECT endpoint_id FROM unnest(CAST(:endpoint_ids AS varchar[])) AS endpoint_id
    WHERE pg_try_advisory_xact_lock(hashtextextended('brand-api:claim:' || endpoint_id, 0))
    """
)

# One statement: each open endpoint's room (its slot limit less its attempts in flight, by
# anyone) and how many to claim ahead (only if it is healthy and nobody else holds it), its
# oldest due deliveries that nobody holds (one more than it takes, to tell whether more are
# due), the lease of those it takes, and what the worker needs to send them. The picked rows
# are a materialised CTE: as a subquery
# of the UPDATE, PostgreSQL may re-run the pick per row and ignore its limit (it once leased
# whole backlogs that way).
_CLAIM = text(
    """
    WITH endpoint AS (
        SELECT e.id, e.url, e.secret_ciphertext, e.consecutive_failures, taking.*,
               CASE WHEN e.previous_secret_expires_at > :now
                    THEN e.previous_secret_ciphertext END AS previous_secret_ciphertext,
               e.previous_secret_expires_at
        FROM unnest(CAST(:endpoint_ids AS varchar[]), CAST(:slots AS integer[]))
             AS wanted(endpoint_id, slots)
        JOIN webhook_endpoints AS e ON e.id = wanted.endpoint_id
        CROSS JOIN LATERAL (
            SELECT count(*) AS in_flight,
                   count(*) FILTER (WHERE held.lease_token NOT LIKE :owned) AS elsewhere
            FROM webhook_deliveries AS held
            WHERE held.endpoint_id = e.id AND held.status = 'pending'
              AND held.lease_token IS NOT NULL AND held.leased_until >= :now
        ) AS holding
        CROSS JOIN LATERAL (
            SELECT CASE WHEN e.consecutive_failures >= :probing_after THEN 1
                        ELSE :endpoint_limit END AS slot_limit
        ) AS limits
        CROSS JOIN LATERAL (
            SELECT GREATEST(0, LEAST(wanted.slots, limits.slot_limit - holding.in_flight))
                       AS room
        ) AS fitting
        CROSS JOIN LATERAL (
            SELECT fitting.room, limits.slot_limit,
                   CASE WHEN fitting.room > 0 AND holding.elsewhere = 0
                             AND e.consecutive_failures = 0 THEN :ahead ELSE 0 END AS ahead
        ) AS taking
        WHERE {endpoint_is_open}
    ),
    picked AS MATERIALIZED (
        SELECT due.id, endpoint.id AS endpoint_id, endpoint.room, endpoint.ahead,
               endpoint.slot_limit,
               row_number() OVER (
                   PARTITION BY endpoint.id ORDER BY due.next_attempt_at, due.id
               ) AS place
        FROM endpoint CROSS JOIN LATERAL (
            SELECT d.id, d.next_attempt_at FROM webhook_deliveries AS d
            WHERE d.endpoint_id = endpoint.id AND d.status = 'pending'
              AND d.next_attempt_at <= :now
              AND (d.leased_until IS NULL OR d.leased_until < :now)
            ORDER BY d.next_attempt_at, d.id
            LIMIT CASE WHEN endpoint.room > 0 THEN endpoint.room + endpoint.ahead ELSE 0 END + 1
            FOR UPDATE SKIP LOCKED
        ) AS due
    ),
    leased AS (
        UPDATE webhook_deliveries AS d
        SET lease_token = :token,
            leased_until = CAST(:leased_until AS timestamptz) + make_interval(
                secs => :round_seconds * ceil(
                    GREATEST(0, picked.place - picked.room)::numeric / picked.slot_limit
                )
            )
        FROM picked
        WHERE d.id = picked.id AND picked.room > 0
          AND picked.place <= picked.room + picked.ahead
          -- Through the primary key: the planner cannot see how few rows the CTE holds, and
          -- hash-joined it against every delivery.
          AND d.id = ANY (ARRAY(SELECT id FROM picked))
        RETURNING d.id, d.endpoint_id, d.event_id, d.event_name, d.attempt_count,
                  d.next_attempt_at, d.leased_until
    )
    SELECT endpoint.id AS endpoint_id, endpoint.url, endpoint.secret_ciphertext,
           endpoint.previous_secret_ciphertext, endpoint.previous_secret_expires_at,
           endpoint.consecutive_failures, endpoint.room,
           EXISTS (
               SELECT 1 FROM picked
               WHERE picked.endpoint_id = endpoint.id
                 AND (picked.room = 0 OR picked.place > picked.room + picked.ahead)
           ) AS more_due,
           (SELECT min(later.next_attempt_at) FROM webhook_deliveries AS later
            WHERE later.endpoint_id = endpoint.id AND later.status = 'pending'
              AND later.next_attempt_at > :now) AS next_due_at,
           leased.id AS delivery_id, leased.event_name, leased.attempt_count,
           leased.leased_until, event.body
    FROM endpoint
    LEFT JOIN leased ON leased.endpoint_id = endpoint.id
    LEFT JOIN webhook_events AS event ON event.id = leased.event_id
    ORDER BY endpoint.id, leased.next_attempt_at, leased.id
    """.replace("{endpoint_is_open}", endpoint_is_open_sql("e"))
)


def record_attempt(
    claim: Claim,
    delivery: ClaimedDelivery,
    outcome: AttemptOutcome,
    *,
    policy: RetryPolicy,
    now: datetime,
    rng: random.Random | None = None,
) -> Recorded:
    """Write the attempt and move the delivery on: `delivered`; or pending with its next retry;
    or `failed` after the last one. A failure may disable the endpoint (CONTRACT 6.2), and a
    success ends its run of failures."""
    number = delivery.attempt_number
    error = outcome.error
    if not outcome.succeeded and error is None:
        error = f"HTTP {outcome.http_status}"
    error = error[:ERROR_MAX_LENGTH] if error else None
    if outcome.succeeded:
        recorded = Recorded(status=DELIVERED)
        values = dict(status=DELIVERED, delivered_at=now, next_attempt_at=None, last_error=None)
    elif number >= policy.max_attempts:
        recorded = Recorded(status=FAILED)
        values = dict(status=FAILED, next_attempt_at=None, last_error=error)
    else:
        delay = policy.schedule[number - 1] * (rng or random).uniform(1 - JITTER, 1 + JITTER)
        if outcome.retry_after_seconds is not None:
            delay = max(delay, min(outcome.retry_after_seconds, RETRY_AFTER_MAX_SECONDS))
        retry_at = now + timedelta(seconds=delay)
        recorded = Recorded(status=PENDING, retry_at=retry_at)
        values = dict(next_attempt_at=retry_at, last_error=error)

    # Rows are locked endpoint first, then delivery: the order of delete-endpoint and
    # update-endpoint, so an attempt recorded during a DELETE waits for it instead of
    # deadlocking with it.
    failures = None
    if outcome.succeeded:
        count_success(claim.endpoint_id)
    else:
        failures = count_failure(
            claim.endpoint_id,
            outcome.requested_at,
            error=error,
            failing_at=failing_threshold(policy.disable_failures),
        )
    kept = db.session.execute(
        update(WebhookDelivery)
        .where(
            WebhookDelivery.id == delivery.id,
            WebhookDelivery.lease_token == claim.token,
            WebhookDelivery.status == PENDING,
        )
        .values(
            attempt_count=number,
            http_status=outcome.http_status,
            leased_until=None,
            lease_token=None,
            **values,
        )
        .execution_options(synchronize_session=False)
    ).rowcount
    if not kept:
        endpoint_open = _endpoint_open(claim.endpoint_id)
        db.session.rollback()  # the failure count too: this attempt is not ours to count
        return Recorded(status=recorded.status, kept=False, endpoint_open=endpoint_open)
    db.session.execute(
        insert(WebhookAttempt).values(**_attempt_row(claim, delivery, outcome, error))
    )
    if _disabled_by(outcome, failures, claim.endpoint_id, policy, now, error):
        recorded = Recorded(status=FAILED, endpoint_disabled=True, endpoint_open=False)
    elif not _endpoint_open(claim.endpoint_id):
        recorded = Recorded(status=recorded.status, retry_at=recorded.retry_at, endpoint_open=False)
    db.session.commit()
    if failures is not None:
        recorded = replace(recorded, consecutive_failures=failures.consecutive_failures)
    return recorded


def _disabled_by(
    outcome: AttemptOutcome, failures, endpoint_id: str, policy, now, error: str | None
) -> bool:
    """Whether this failed attempt disabled the endpoint: at once for a 410 Gone (the receiver
    says it is gone for good), else when the run of failures is long and old enough."""
    if outcome.gone:
        return disable_endpoint(
            endpoint_id, reason=GONE_REASON, now=now, by_service=True, last_error=error
        )
    return failures is not None and disable_if_failing_too_long(
        endpoint_id,
        failures,
        disable_failures=policy.disable_failures,
        disable_window=policy.disable_window,
        now=now,
        last_error=error,
    )


def _attempt_row(
    claim: Claim, delivery: ClaimedDelivery, outcome: AttemptOutcome, error: str | None
) -> dict:
    return {
        "delivery_id": delivery.id,
        "endpoint_id": claim.endpoint_id,
        "attempt_number": delivery.attempt_number,
        "requested_at": outcome.requested_at,
        "duration_ms": outcome.duration_ms,
        "http_status": outcome.http_status,
        "error": error,
        "response_body": outcome.response_body,
        "request_headers": outcome.request_headers,
    }


def settle_delivered(
    results: Sequence[tuple[Claim, ClaimedDelivery, AttemptOutcome]], *, now: datetime
) -> set[str]:
    """Settle successful attempts in one statement where nothing else must change (the
    delivery still ours, its endpoint open and without failures to reset); the ids settled."""
    rows = [_attempt_row(*result, None) for result in results]
    settled = fetch_all_on_psycopg(
        db.session.connection(),
        _DELIVERED_AT_ONCE_ON_PSYCOPG,
        {
            "now": now,
            "delivery_ids": [row["delivery_id"] for row in rows],
            "tokens": [claim.token for claim, _, _ in results],
            "endpoint_ids": [row["endpoint_id"] for row in rows],
            "attempt_numbers": [row["attempt_number"] for row in rows],
            "requested_ats": [row["requested_at"] for row in rows],
            "durations": [row["duration_ms"] for row in rows],
            "http_statuses": [row["http_status"] for row in rows],
            "response_bodies": [row["response_body"] for row in rows],
            "request_headers": [json.dumps(row["request_headers"]) for row in rows],
        },
    )
    db.session.commit()
    return {delivery_id for (delivery_id,) in settled}


# A success with nothing else to change, for a whole batch: a CTE settles each delivery and
# logs its attempt together, in one round trip where a transaction per delivery takes four.
# A delivery that is not settled here (no longer ours, its endpoint closed, or failures to
# reset, which must lock the endpoint first) is for `record_attempt`. Reading the
# failure count without a lock is safe: a failure committed after this statement's snapshot
# is simply ordered after this success.
_DELIVERED_AT_ONCE = text(
    """
    WITH outcome AS (
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
        SET status = 'delivered', delivered_at = :now, next_attempt_at = NULL,
            last_error = NULL, attempt_count = o.attempt_number, http_status = o.http_status,
            leased_until = NULL, lease_token = NULL
        FROM outcome AS o
        WHERE d.id = o.delivery_id AND d.lease_token = o.token AND d.status = 'pending'
          AND EXISTS (
              SELECT 1 FROM webhook_endpoints AS endpoint
              WHERE endpoint.id = o.endpoint_id AND {endpoint_is_open}
                AND endpoint.consecutive_failures = 0
          )
        RETURNING d.id
    )
    INSERT INTO webhook_attempts (
        delivery_id, endpoint_id, attempt_number, requested_at, duration_ms, http_status, error,
        response_body, request_headers
    )
    SELECT o.delivery_id, o.endpoint_id, o.attempt_number, o.requested_at, o.duration_ms,
           o.http_status, NULL, o.response_body, CAST(o.request_headers AS json)
    FROM outcome AS o JOIN settled ON settled.id = o.delivery_id
    RETURNING delivery_id
    """.replace("{endpoint_is_open}", endpoint_is_open_sql("endpoint"))
)
# Run on psycopg directly: SQLAlchemy's work around an execution was about a third of the
# statement's time in the worker, on the path from one attempt of an endpoint to its next.
_DELIVERED_AT_ONCE_ON_PSYCOPG = psycopg_sql(_DELIVERED_AT_ONCE)


def release_deliveries(claim: Claim, delivery_ids: list[str]) -> None:
    """Give leased deliveries back unattempted, due as before, for the next drain."""
    if not delivery_ids:
        return
    db.session.execute(
        update(WebhookDelivery)
        .where(WebhookDelivery.id.in_(delivery_ids), WebhookDelivery.lease_token == claim.token)
        .values(leased_until=None, lease_token=None)
        .execution_options(synchronize_session=False)
    )
    db.session.commit()


def endpoints_with_overdue_deliveries(
    *, overdue_before: datetime, now: datetime, limit: int = 1000
) -> list[str]:
    """Endpoints with a pending delivery due before `overdue_before` that nobody holds: their
    job was lost (Redis down at publish, a worker killed mid-attempt, a job expired)."""
    statement = (
        select(WebhookDelivery.endpoint_id)
        .where(
            _claimable(now).whereclause,
            WebhookDelivery.next_attempt_at <= overdue_before,
        )
        .distinct()
        .limit(limit)
    )
    endpoint_ids = list(db.session.scalars(statement))
    db.session.commit()
    return endpoint_ids


@dataclass(frozen=True)
class DeliveryBacklog:
    """The work waiting, for `GET /metrics` (docs/operations.md says what to alert on)."""

    pending: int
    due: int  # claimable now: pending, due and held by no worker
    oldest_due_at: datetime | None


def delivery_backlog(*, now: datetime) -> DeliveryBacklog:
    """Counted on the pending rows only (partial indexes), however long the delivery log is."""
    due = _claimable(now).whereclause
    pending, due_count, oldest = db.session.execute(
        select(
            func.count(),
            func.count().filter(due),
            func.min(WebhookDelivery.next_attempt_at).filter(due),
        ).where(WebhookDelivery.status == PENDING)
    ).one()
    db.session.commit()
    return DeliveryBacklog(pending=pending, due=due_count, oldest_due_at=oldest)


def _claimable(now: datetime):
    return select(WebhookDelivery.id).where(
        WebhookDelivery.status == PENDING,
        WebhookDelivery.next_attempt_at <= now,
        or_(WebhookDelivery.leased_until.is_(None), WebhookDelivery.leased_until < now),
    )


def _endpoint_open(endpoint_id: str) -> bool:
    return bool(
        db.session.scalar(
            select(WebhookEndpoint.is_active).where(WebhookEndpoint.id == endpoint_id)
        )
    )
