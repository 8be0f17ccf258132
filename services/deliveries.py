"""The delivery log: listing, reading and redelivering a brand's webhook deliveries (SPEC
section 4, CONTRACT 4), and ending an endpoint's pending deliveries."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import cast

from flask import current_app
from sqlalchemy import CursorResult, false, func, not_, select, text, update

from extensions import db
from models import WebhookAttempt, WebhookDelivery, WebhookEndpoint, WebhookEvent
from models.columns import utcnow
from models.paging import DESCENDING
from models.webhook_delivery import DELIVERED, FAILED, PENDING
from services.errors import NotFound, ValidationFailed
from services.events import deliver_again
from services.pagination import Page, paginate
from services.record_reads import in_creation_order

# How far back recover reaches (CONTRACT 8.3).
RECOVER_WINDOW = timedelta(days=14)


@dataclass(frozen=True)
class DeliveryDetail:
    delivery: WebhookDelivery
    attempts: list[WebhookAttempt]
    payload: dict

    def __getattr__(self, name: str):
        # The detail is the delivery plus two fields; schemas read the rest from it.
        return getattr(self.delivery, name)


def list_deliveries(
    *,
    brand_id: str,
    page: int,
    limit: int,
    status: str | None = None,
    retrying: bool | None = None,
    event_name: str | None = None,
    event_id: str | None = None,
    endpoint_id: str | None = None,
    sort_order: str = DESCENDING,
) -> Page:
    statement = select(WebhookDelivery).where(WebhookDelivery.brand_id == brand_id)
    if status is not None:
        statement = statement.where(WebhookDelivery.status == status)
    if retrying is not None:
        is_retrying = WebhookDelivery.is_retrying
        statement = statement.where(is_retrying if retrying else not_(is_retrying))
    if event_name is not None:
        statement = statement.where(WebhookDelivery.event_name == event_name)
    if event_id is not None:
        statement = statement.where(*_of_event(brand_id, event_id))
    if endpoint_id is not None:
        statement = statement.where(WebhookDelivery.endpoint_id == endpoint_id)
    return paginate(
        in_creation_order(statement, WebhookDelivery, sort_order), page=page, limit=limit
    )


@dataclass(frozen=True)
class DeliveryHealth:
    """What the brand's webhooks are doing: the deliveries created since a moment that were
    delivered or failed for good, the ones pending now (retrying after a failed attempt, or
    waiting for their first), and the attempts since that moment that failed."""

    delivered: int
    failed: int
    retrying: int
    waiting: int
    failed_attempts: int


def delivery_health(brand_id: str, *, since: datetime) -> DeliveryHealth:
    """The overview's figures: see `DeliveryHealth`."""
    settled = dict(
        db.session.execute(
            select(WebhookDelivery.status, func.count())
            .where(
                WebhookDelivery.brand_id == brand_id,
                WebhookDelivery.created_at >= since,
                WebhookDelivery.status != PENDING,
            )
            .group_by(WebhookDelivery.status)
        ).all()
    )
    pending, retrying = db.session.execute(
        select(func.count(), func.count().filter(WebhookDelivery.is_retrying)).where(
            WebhookDelivery.brand_id == brand_id, WebhookDelivery.status == PENDING
        )
    ).one()
    failed_attempts = db.session.execute(
        select(func.count())
        .select_from(WebhookAttempt)
        .join(WebhookDelivery, WebhookDelivery.id == WebhookAttempt.delivery_id)
        .where(
            WebhookDelivery.brand_id == brand_id,
            # Only a delivery created within its longest life can have an attempt after `since`:
            # bounds the brand's rows the count reads.
            WebhookDelivery.created_at >= since - _longest_delivery_life(),
            WebhookAttempt.requested_at >= since,
            WebhookAttempt.failed,
        )
    ).scalar_one()
    return DeliveryHealth(
        delivered=settled.get(DELIVERED, 0),
        failed=settled.get(FAILED, 0),
        retrying=retrying,
        waiting=pending - retrying,
        failed_attempts=failed_attempts,
    )


def _of_event(brand_id: str, event_id: str) -> tuple:
    """Conditions for the deliveries of one of the brand's events. Deliveries have no index on
    their event (it would cost every delivery written); an event's deliveries are made with it
    or later (redeliveries), so its time bounds the rows of the brand's log to read."""
    created_at = db.session.scalar(
        select(WebhookEvent.created_at).where(
            WebhookEvent.id == event_id, WebhookEvent.brand_id == brand_id
        )
    )
    if created_at is None:
        return (false(),)
    return (WebhookDelivery.created_at >= created_at, WebhookDelivery.event_id == event_id)


def _longest_delivery_life() -> timedelta:
    """From a delivery's creation to its last attempt at the latest: the retry schedule with
    its +10% jitter, and an hour more per attempt that a receiver's Retry-After may add."""
    schedule = current_app.extensions["settings"].webhook_retry_schedule
    return timedelta(seconds=sum(schedule) * 1.1 + 3600 * (len(schedule) + 1))


def get_delivery(brand_id: str, delivery_id: str) -> WebhookDelivery:
    """:raise NotFound: no such delivery in this brand."""
    delivery = db.session.scalar(
        select(WebhookDelivery).where(
            WebhookDelivery.id == delivery_id, WebhookDelivery.brand_id == brand_id
        )
    )
    if delivery is None:
        raise NotFound(f"No webhook delivery with id {delivery_id!r} in this brand")
    return delivery


def get_delivery_and_endpoint(
    brand_id: str, delivery_id: str
) -> tuple[WebhookDelivery, WebhookEndpoint | None]:
    """The delivery and its endpoint (None once deleted) in one query: one row of the log,
    which the dashboard asks for again while the delivery is pending.

    :raise NotFound: no such delivery in this brand.
    """
    row = db.session.execute(
        select(WebhookDelivery, WebhookEndpoint)
        .outerjoin(
            WebhookEndpoint,
            (WebhookEndpoint.id == WebhookDelivery.endpoint_id)
            & WebhookEndpoint.deleted_at.is_(None),
        )
        .where(WebhookDelivery.id == delivery_id, WebhookDelivery.brand_id == brand_id)
    ).first()
    if row is None:
        raise NotFound(f"No webhook delivery with id {delivery_id!r} in this brand")
    return row[0], row[1]


def get_delivery_detail(brand_id: str, delivery_id: str) -> DeliveryDetail:
    """The delivery, its attempts in order and the event body it sends."""
    delivery = get_delivery(brand_id, delivery_id)
    attempts = list(
        db.session.scalars(
            select(WebhookAttempt)
            .where(WebhookAttempt.delivery_id == delivery.id)
            .order_by(WebhookAttempt.attempt_number)
        )
    )
    body = db.session.execute(
        select(WebhookEvent.body).where(WebhookEvent.id == delivery.event_id)
    ).scalar_one()
    return DeliveryDetail(delivery=delivery, attempts=attempts, payload=json.loads(body))


def redeliver(*, brand_id: str, delivery_id: str, now: datetime | None = None) -> str:
    """A new delivery of the same event (same body, same event id) to the same endpoint; its id.
    The original notes it (`redelivered_as`), so recover does not send it once more.

    :raise NotFound: no such delivery, or its endpoint was deleted or is disabled.
    """
    original = get_delivery(brand_id, delivery_id)
    _endpoint_taking_deliveries(original.endpoint_id, "The endpoint of this delivery")
    [new_delivery] = deliver_again(
        brand_id=brand_id,
        endpoint_id=original.endpoint_id,
        events=[(original.event_id, original.event_name)],
        now=now,
    )
    original.redelivered_as = new_delivery
    return new_delivery


def send_event_again(
    *, brand_id: str, event_id: str, endpoint_id: str, now: datetime | None = None
) -> str:
    """Deliver one of the brand's stored events to one of its endpoints (the dashboard's
    "resend to endpoint…"): when the event went to that endpoint before, a redelivery of its
    newest delivery there (redeliver's rule: the original notes it); otherwise a first delivery,
    whatever the endpoint subscribes to, as a test ping is. The new delivery's id.

    :raise NotFound: no such event or endpoint in this brand, or the endpoint is disabled or
        deleted."""
    event_name = db.session.scalar(
        select(WebhookEvent.name).where(
            WebhookEvent.id == event_id, WebhookEvent.brand_id == brand_id
        )
    )
    if event_name is None:
        raise NotFound(f"No event with id {event_id!r} in this brand")
    endpoint = _endpoint_taking_deliveries(endpoint_id, "This endpoint", brand_id=brand_id)
    newest = db.session.scalar(
        select(WebhookDelivery.id)
        .where(
            *_of_event(brand_id, event_id),
            WebhookDelivery.brand_id == brand_id,
            WebhookDelivery.endpoint_id == endpoint.id,
        )
        .order_by(WebhookDelivery.created_at.desc(), WebhookDelivery.id.desc())
        .limit(1)
    )
    if newest is not None:
        return redeliver(brand_id=brand_id, delivery_id=newest, now=now)
    [new_delivery] = deliver_again(
        brand_id=brand_id, endpoint_id=endpoint.id, events=[(event_id, event_name)], now=now
    )
    return new_delivery


@dataclass(frozen=True)
class Recovered:
    endpoint_id: str
    queued: int


def recover_failed_deliveries(
    *,
    brand_id: str,
    endpoint_id: str,
    since: datetime,
    until: datetime | None = None,
    now: datetime | None = None,
) -> Recovered:
    """A new delivery of every `failed` delivery of the endpoint created in [since, until)
    (until: now by default) that was neither recovered nor redelivered yet, in the order they
    were created (CONTRACT 8.3). Run twice, the second finds nothing more to queue: each
    original notes its new delivery, under a row lock a concurrent recover waits for.

    :raise ValidationFailed: `since` more than 14 days ago, or not before `until`.
    :raise NotFound: no such endpoint in this brand, or it is disabled or deleted.
    """
    now = now or utcnow()
    errors = {}
    if since < now - RECOVER_WINDOW:
        errors["since"] = [f"Must be at most {RECOVER_WINDOW.days} days ago."]
    elif since >= now:
        errors["since"] = ["Must be in the past."]
    if until is not None and until <= since:
        errors["until"] = ["Must be after since."]
    if errors:
        raise ValidationFailed("Invalid recovery window", errors)
    until = min(until or now, now)
    endpoint = _endpoint_taking_deliveries(endpoint_id, "This endpoint", brand_id=brand_id)
    failed = db.session.execute(
        select(WebhookDelivery.id, WebhookDelivery.event_id, WebhookDelivery.event_name)
        .where(
            WebhookDelivery.brand_id == brand_id,
            WebhookDelivery.endpoint_id == endpoint.id,
            WebhookDelivery.status == FAILED,
            WebhookDelivery.redelivered_as.is_(None),
            WebhookDelivery.created_at >= since,
            WebhookDelivery.created_at < until,
        )
        .order_by(WebhookDelivery.created_at, WebhookDelivery.id)
        .with_for_update()
    ).all()
    new_ids = deliver_again(
        brand_id=brand_id,
        endpoint_id=endpoint.id,
        events=[(row.event_id, row.event_name) for row in failed],
        now=now,
    )
    if failed:
        db.session.execute(
            _NOTE_REDELIVERED,
            {"originals": [row.id for row in failed], "new_ids": new_ids},
        )
    return Recovered(endpoint_id=endpoint.id, queued=len(failed))


_NOTE_REDELIVERED = text(
    """
    UPDATE webhook_deliveries AS original SET redelivered_as = noted.new_id
    FROM unnest(CAST(:originals AS varchar[]), CAST(:new_ids AS varchar[]))
         AS noted(original_id, new_id)
    WHERE original.id = noted.original_id
    """
)


def _endpoint_taking_deliveries(
    endpoint_id: str, subject: str, *, brand_id: str | None = None
) -> WebhookEndpoint:
    """The endpoint, if it takes deliveries now (redeliver, recover).

    :raise NotFound: it does not exist (in that brand), was deleted, or is disabled."""
    query = select(WebhookEndpoint).where(WebhookEndpoint.id == endpoint_id)
    if brand_id is not None:
        query = query.where(WebhookEndpoint.brand_id == brand_id)
    endpoint = db.session.scalar(query)
    if endpoint is None or endpoint.deleted_at is not None:
        if brand_id is not None:
            raise NotFound(f"No webhook endpoint with id {endpoint_id!r} in this brand")
        raise NotFound(f"{subject} was deleted")
    if not endpoint.is_active:
        raise NotFound(f"{subject} is disabled; re-enable it with update-endpoint first")
    return endpoint


def fail_pending_deliveries(endpoint_id: str, *, error: str) -> int:
    """End every pending delivery of the endpoint as `failed`; how many. One whose attempt is
    in flight keeps its lease: the attempt still counts against the endpoint's limit, and its
    worker records it (services/delivery_attempts.py) when it ends."""
    result = db.session.execute(
        update(WebhookDelivery)
        .where(WebhookDelivery.endpoint_id == endpoint_id, WebhookDelivery.status == PENDING)
        .values(status=FAILED, last_error=error, next_attempt_at=None)
        .execution_options(synchronize_session=False)
    )
    # Session.execute is typed for any statement; an UPDATE's result is a CursorResult.
    return cast(CursorResult, result).rowcount
