"""Endpoint health over the last 24 hours (CONTRACT 8.4): its deliveries by status, the share of
its attempts that succeeded, how long they took, when the last success and failure were, and
the hours of the day behind the dashboard's chart.

Read from two index ranges, never the whole delivery log: the brand's deliveries of the endpoint
created in the window (`ix_webhook_deliveries_brand_endpoint`) and the endpoint's attempts made
in it (`ix_webhook_attempts_endpoint_requested`); bench/delivery_log.py times it with a million
deliveries in the brand.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import case, func, null, select

from extensions import db
from models import WebhookAttempt, WebhookDelivery
from models.webhook_delivery import DELIVERED, FAILED, PENDING
from services.webhook_endpoints import get_endpoint

WINDOW = timedelta(hours=24)


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
    deliveries: dict[str, int]
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
    by_status = dict(
        db.session.execute(
            select(WebhookDelivery.status, func.count())
            .where(
                WebhookDelivery.brand_id == brand_id,
                WebhookDelivery.endpoint_id == endpoint.id,
                WebhookDelivery.created_at >= start,
                WebhookDelivery.created_at <= now,
            )
            .group_by(WebhookDelivery.status)
        ).all()
    )
    return EndpointStats(
        endpoint_id=endpoint.id,
        window_start=start,
        window_end=now,
        deliveries={status: by_status.get(status, 0) for status in (PENDING, DELIVERED, FAILED)},
        attempts=attempt_figures([endpoint.id], start=start, end=now)[endpoint.id],
        hours=_hours(endpoint.id, start=start, end=now),
    )


def attempt_figures(
    endpoint_ids: Sequence[str], *, start: datetime, end: datetime, durations: bool = True
) -> dict[str, AttemptFigures]:
    """Each endpoint's attempts in [start, end], in one statement (fetch-endpoints asks for all
    of a brand's at once, and without the durations, whose percentiles sort every attempt)."""
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
            WebhookAttempt.requested_at <= end,
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
    """The endpoints, each with its figures of the last 24 hours (one statement for all)."""
    figures = attempt_figures(
        [record.id for record in records], start=now - WINDOW, end=now, durations=False
    )
    return [EndpointWithHealth(record, figures[record.id]) for record in records]
