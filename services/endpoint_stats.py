"""Endpoint health over the last 24 hours (CONTRACT 8.4): its deliveries by status, the share of
its attempts that succeeded, how long they took, when the last success and failure were, and
the hours of the day behind the dashboard's chart; and its latest failed attempts.

Read from index ranges, never the whole delivery log: the endpoint's deliveries created in the
window (`ix_webhook_deliveries_endpoint_created`) and its attempts made in it
(`ix_webhook_attempts_endpoint_requested`). fetch-endpoints, which shows every endpoint's
success rate and last success, reads the window's whole hours from the counts kept per hour
(models/endpoint_hours.py) and only the attempts of its two partial hours; bench/delivery_log.py
times both with a million deliveries in the brand.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy import case, func, null, select

from extensions import db
from models import EndpointHour, WebhookAttempt, WebhookDelivery
from models.webhook_delivery import DELIVERED, FAILED, LAST_ATTEMPT_BODY_CHARS, PENDING
from services.deliveries import count_states, state_columns
from services.webhook_endpoints import get_endpoint

WINDOW = timedelta(hours=24)
HOUR = timedelta(hours=1)


@dataclass(frozen=True)
class Hour:
    """One hour of the window: when it starts, and its attempts that succeeded and failed."""

    start: datetime
    succeeded: int
    failed: int


@dataclass(frozen=True)
class AttemptFigures:
    """An endpoint's attempts in the window."""

    attempts: int = 0
    succeeded: int = 0
    p50_ms: int | None = None
    p95_ms: int | None = None
    last_success_at: datetime | None = None
    last_failure_at: datetime | None = None

    @property
    def success_rate(self) -> float | None:
        """Successful attempts over all attempts (retries included); None without any."""
        return round(self.succeeded / self.attempts, 4) if self.attempts else None


@dataclass(frozen=True)
class EndpointStats:
    endpoint_id: str
    window_start: datetime
    window_end: datetime
    # By status, as the API gives them; and by state, as the dashboard names them.
    deliveries: dict[str, int]
    states: dict[str, int]
    attempts: AttemptFigures
    hours: list[Hour] = field(default_factory=list)

    @property
    def success_rate(self) -> float | None:
        return self.attempts.success_rate

    @property
    def attempt_duration_ms(self) -> dict[str, int | None]:
        return {"p50": self.attempts.p50_ms, "p95": self.attempts.p95_ms}

    @property
    def last_success_at(self) -> datetime | None:
        return self.attempts.last_success_at

    @property
    def last_failure_at(self) -> datetime | None:
        return self.attempts.last_failure_at


def endpoint_stats(*, brand_id: str, endpoint_id: str, now: datetime) -> EndpointStats:
    """The endpoint's figures over [now - 24 h, now].

    :raise NotFound: no such endpoint in this brand (disabled ones have figures too)."""
    endpoint = get_endpoint(brand_id, endpoint_id)
    start = now - WINDOW
    states = state_columns()  # one set of expressions: GROUP BY must match SELECT's
    counted = db.session.execute(
        select(*states, func.count())
        .where(
            WebhookDelivery.endpoint_id == endpoint.id,
            WebhookDelivery.created_at >= start,
            WebhookDelivery.created_at <= now,
        )
        .group_by(*states)
    ).all()
    by_status = dict.fromkeys((PENDING, DELIVERED, FAILED), 0)
    for row in counted:  # (status, retrying, held, count)
        by_status[row[0]] += row[-1]
    return EndpointStats(
        endpoint_id=endpoint.id,
        window_start=start,
        window_end=now,
        deliveries=by_status,
        states=count_states(counted),
        attempts=attempt_figures([endpoint.id], start=start, end=now)[endpoint.id],
        hours=_hours(endpoint.id, start=start, end=now),
    )


def attempt_figures(
    endpoint_ids: Sequence[str],
    *,
    start: datetime,
    end: datetime,
    durations: bool = True,
    end_included: bool = True,
) -> dict[str, AttemptFigures]:
    """Each endpoint's attempts in [start, end] ([start, end) unless `end_included`) in one
    statement, read from every attempt (without the durations, whose percentiles sort every
    attempt, `counted_figures` reads less)."""
    succeeded = WebhookAttempt.error.is_(None)
    percentiles = (
        (
            func.percentile_cont(0.5).within_group(WebhookAttempt.duration_ms),
            func.percentile_cont(0.95).within_group(WebhookAttempt.duration_ms),
        )
        if durations
        else (null(), null())
    )
    rows = db.session.execute(
        select(
            WebhookAttempt.endpoint_id,
            func.count(),
            func.count().filter(succeeded),
            *percentiles,
            func.max(case((succeeded, WebhookAttempt.requested_at))),
            func.max(case((~succeeded, WebhookAttempt.requested_at))),
        )
        .where(
            WebhookAttempt.endpoint_id.in_(list(endpoint_ids)),
            WebhookAttempt.requested_at >= start,
            WebhookAttempt.requested_at <= end
            if end_included
            else WebhookAttempt.requested_at < end,
        )
        .group_by(WebhookAttempt.endpoint_id)
    ).all()
    figures = {endpoint_id: AttemptFigures() for endpoint_id in endpoint_ids}
    for endpoint_id, attempts, ok, p50, p95, last_success, last_failure in rows:
        figures[endpoint_id] = AttemptFigures(
            attempts=attempts,
            succeeded=ok,
            p50_ms=None if p50 is None else round(p50),
            p95_ms=None if p95 is None else round(p95),
            last_success_at=last_success,
            last_failure_at=last_failure,
        )
    return figures


def _hours(endpoint_id: str, *, start: datetime, end: datetime) -> list[Hour]:
    """The window in 24 hours, oldest first, each with its attempts that succeeded and failed
    (the last one is the hour now running)."""
    succeeded = WebhookAttempt.error.is_(None)
    # Hours counted back from `end`, so that the last bucket ends now.
    hours_back = func.floor(func.extract("epoch", end - WebhookAttempt.requested_at) / 3600).cast(
        db.Integer
    )
    buckets = int(WINDOW / timedelta(hours=1))
    counted = [[0, 0] for _ in range(buckets)]
    for back, ok, failed in db.session.execute(
        select(hours_back, func.count().filter(succeeded), func.count().filter(~succeeded))
        .where(
            WebhookAttempt.endpoint_id == endpoint_id,
            WebhookAttempt.requested_at >= start,
            WebhookAttempt.requested_at <= end,
        )
        .group_by(hours_back)
    ).all():
        # An attempt at the window's very start belongs to its first hour.
        bucket = counted[min(int(back), buckets - 1)]
        bucket[0] += ok
        bucket[1] += failed
    return [
        Hour(start=end - timedelta(hours=back + 1), succeeded=ok, failed=failed)
        for back, (ok, failed) in reversed(list(enumerate(counted)))
    ]


@dataclass(frozen=True)
class FailedAttempt:
    """A failed attempt to the endpoint: when, of which delivery, and why (`HTTP 503`, a
    timeout, a refused connection...)."""

    delivery_id: str
    event_id: str
    event_name: str
    attempt_number: int
    requested_at: datetime
    error: str
    http_status: int | None
    # The start of the answer's body as stored, as an alert carries it (CONTRACT 13.4).
    response_body: str | None


def latest_failures(
    endpoint_id: str, *, start: datetime, end: datetime, limit: int
) -> list[FailedAttempt]:
    """What its dashboard page shows first: the last failed attempt of each of the `limit`
    deliveries that last failed in [start, end], newest first (a delivery retried five times is
    one line, not five). Reads the endpoint's failed attempts in the window, an index range
    (`ix_webhook_attempts_endpoint_requested`) as the health figures do."""
    latest_first = (
        func.row_number()
        .over(
            partition_by=WebhookAttempt.delivery_id,
            order_by=WebhookAttempt.attempt_number.desc(),
        )
        .label("latest_first")
    )
    failed = (
        select(
            WebhookAttempt.delivery_id,
            WebhookAttempt.attempt_number,
            WebhookAttempt.requested_at,
            WebhookAttempt.error,
            WebhookAttempt.http_status,
            func.left(WebhookAttempt.response_body, LAST_ATTEMPT_BODY_CHARS).label("response_body"),
            latest_first,
        )
        .where(
            WebhookAttempt.endpoint_id == endpoint_id,
            WebhookAttempt.requested_at >= start,
            WebhookAttempt.requested_at <= end,
            WebhookAttempt.failed,
        )
        .subquery()
    )
    rows = db.session.execute(
        select(
            failed.c.delivery_id,
            WebhookDelivery.event_id,
            WebhookDelivery.event_name,
            failed.c.attempt_number,
            failed.c.requested_at,
            failed.c.error,
            failed.c.http_status,
            failed.c.response_body,
        )
        .join(WebhookDelivery, WebhookDelivery.id == failed.c.delivery_id)
        .where(failed.c.latest_first == 1)
        .order_by(failed.c.requested_at.desc(), failed.c.delivery_id)
        .limit(limit)
    ).all()
    return [FailedAttempt(**row._mapping) for row in rows]


@dataclass(frozen=True)
class EndpointWithHealth:
    """An endpoint as fetch-endpoints lists it: the record, and its last 24 hours' success
    rate and last success."""

    record: object
    figures: AttemptFigures

    @property
    def success_rate_24h(self) -> float | None:
        return self.figures.success_rate

    @property
    def last_success_at(self) -> datetime | None:
        return self.figures.last_success_at

    def __getattr__(self, name: str):
        return getattr(self.record, name)


def with_health(records: Sequence, *, now: datetime) -> list[EndpointWithHealth]:
    """The endpoints, each with its figures of the last 24 hours."""
    figures = counted_figures([record.id for record in records], start=now - WINDOW, end=now)
    return [EndpointWithHealth(record, figures[record.id]) for record in records]


def counted_figures(
    endpoint_ids: Sequence[str], *, start: datetime, end: datetime
) -> dict[str, AttemptFigures]:
    """`attempt_figures` without the durations, from the counts kept per hour: the whole hours
    of [start, end] from EndpointHour, the partial hours at either end from the attempts (the
    two add up to one hour of attempts when the window is whole hours long)."""
    first_whole = _hour_of(start) if _hour_of(start) == start else _hour_of(start) + HOUR
    last_whole = _hour_of(end)
    if first_whole >= last_whole:
        return attempt_figures(endpoint_ids, start=start, end=end, durations=False)
    ids = list(endpoint_ids)
    parts = [
        attempt_figures(ids, start=start, end=first_whole, durations=False, end_included=False),
        attempt_figures(ids, start=last_whole, end=end, durations=False),
    ]
    whole_hours = db.session.execute(
        select(
            EndpointHour.endpoint_id,
            func.sum(EndpointHour.attempts),
            func.sum(EndpointHour.succeeded),
            func.max(EndpointHour.last_success_at),
            func.max(EndpointHour.last_failure_at),
        )
        .where(
            EndpointHour.endpoint_id.in_(ids),
            EndpointHour.hour >= first_whole,
            EndpointHour.hour < last_whole,
        )
        .group_by(EndpointHour.endpoint_id)
    ).all()
    parts.append(
        {
            endpoint_id: AttemptFigures(
                attempts=attempts,
                succeeded=succeeded,
                last_success_at=last_success,
                last_failure_at=last_failure,
            )
            for endpoint_id, attempts, succeeded, last_success, last_failure in whole_hours
        }
    )
    return {endpoint_id: _sum([part.get(endpoint_id) for part in parts]) for endpoint_id in ids}


def _hour_of(moment: datetime) -> datetime:
    """The start of the UTC hour `moment` is in (the hours EndpointHour counts by)."""
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def _sum(figures: list[AttemptFigures | None]) -> AttemptFigures:
    """The figures of adjoining spans as one (without durations)."""
    present = [part for part in figures if part is not None]
    successes = [part.last_success_at for part in present if part.last_success_at is not None]
    failures = [part.last_failure_at for part in present if part.last_failure_at is not None]
    return AttemptFigures(
        attempts=sum(part.attempts for part in present),
        succeeded=sum(part.succeeded for part in present),
        last_success_at=max(successes, default=None),
        last_failure_at=max(failures, default=None),
    )
