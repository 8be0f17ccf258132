"""The delivery log: listing, reading and redelivering a brand's webhook deliveries (SPEC
section 4, CONTRACT 4), and ending an endpoint's pending deliveries."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from flask import current_app
from sqlalchemy import func, literal, not_, select, text, tuple_, union_all

from extensions import db
from models import (
    DeliveryLease,
    QueuedDelivery,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEvent,
)
from models.columns import id_time, utcnow
from models.paging import ASCENDING, DESCENDING
from models.webhook_delivery import DELIVERED, FAILED, PENDING
from services.errors import NotFound, ValidationFailed
from services.events import deliver_again
from services.pagination import Page, paginate
from services.record_reads import in_creation_order
from services.retention import retention_period

# How far back recover reaches (CONTRACT 8.3).
RECOVER_WINDOW = timedelta(days=14)

# A delivery's state in the dashboard's words: its status, with `pending` told apart by why it
# waits: for its first attempt, behind an earlier delivery of its subject, or for a retry. The
# API keeps SPEC's three statuses, its `retrying` flag and `heldBehind`.
WAITING, HELD, RETRYING = "waiting", "held", "retrying"
DELIVERY_STATES = (WAITING, HELD, RETRYING, DELIVERED, FAILED)


def delivery_state(status: str, retrying: bool, held: bool = False) -> str:
    """`waiting` (pending, no attempt yet), `held` (pending behind an earlier delivery of its
    subject: `WebhookDelivery.is_held`), `retrying` (pending after a failed attempt:
    `WebhookDelivery.is_retrying`), `delivered` or `failed`."""
    if status != PENDING:
        return status
    if held:
        return HELD
    return RETRYING if retrying else WAITING


def state_columns() -> tuple:
    """What `count_states` reads, to select and group by: status, retrying, held."""
    return WebhookDelivery.status, WebhookDelivery.is_retrying, WebhookDelivery.is_held


def count_states(rows: Iterable[Sequence[Any]]) -> dict[str, int]:
    """Counts by (status, is_retrying, is_held), as a query grouped by `state_columns` gives
    them, by state: every state, in DELIVERY_STATES' order."""
    counts = dict.fromkeys(DELIVERY_STATES, 0)
    for status, retrying, held, count in rows:
        counts[delivery_state(status, retrying, held)] += count
    return counts


@dataclass(frozen=True)
class DeliveryDetail:
    delivery: WebhookDelivery
    attempts: list[WebhookAttempt]
    payload: dict
    # The body exactly as every attempt sent it (the payload is its parsed form).
    body: str

    def __getattr__(self, name: str):
        # The detail is the delivery plus three fields; schemas read the rest from it.
        return getattr(self.delivery, name)


@dataclass(frozen=True)
class DeliveryPage(Page):
    """A page of the delivery log, and the cursor to read on from it."""

    # Pass it as `after` next: the page's last delivery, or `after` itself when none came.
    next_after: str | None = None
    # `after` was a delivery retention has deleted: the list goes on from its creation time.
    cursor_expired: bool = False


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
    after: str | None = None,
    now: datetime | None = None,
) -> DeliveryPage:
    """The brand's deliveries that match the filters, in creation order (`sort_order`), after
    the delivery `after` in that order if given, one page of them.

    Every filter reads an index of its own (see `_log_conditions`), and the page's place is
    found in the index alone: the rows an OFFSET skips are index entries, never table rows, and
    only the page's rows are read from the table. So a deep page costs a walk of the index up
    to it (about 50,000 entries for page 500 of 100: bench/delivery_log.py), and `after` costs
    nothing more than page 1.

    :raise NotFound: `after` is not a delivery of the brand (and not one retention deleted).
    """
    conditions = _log_conditions(
        brand_id,
        status=status,
        retrying=retrying,
        event_name=event_name,
        event_id=event_id,
        endpoint_id=endpoint_id,
    )
    cursor = _cursor(brand_id, after, now) if after is not None else None
    if cursor is not None:
        conditions.append(_after(cursor, sort_order))
    # The page's keys, read from the index in order; then only those rows from the table.
    keys = in_creation_order(
        select(WebhookDelivery.id, WebhookDelivery.created_at).where(*conditions),
        WebhookDelivery,
        sort_order,
    )

    def one_page(offset: int, size: int):
        listed = keys.offset(offset).limit(size).subquery()
        return in_creation_order(
            select(WebhookDelivery).join(listed, listed.c.id == WebhookDelivery.id),
            WebhookDelivery,
            sort_order,
        )

    listed = paginate(one_page, page=page, limit=limit, count=keys)
    return DeliveryPage(
        items=listed.items,
        page=listed.page,
        limit=listed.limit,
        total=listed.total,
        total_exact=listed.total_exact,
        next_after=listed.items[-1].id if listed.items else after,
        cursor_expired=cursor is not None and cursor.expired,
    )


# `failed` is the one status with an index: the partial ones on `failed_at IS NOT NULL`. Every
# statement that settles a delivery sets `failed_at` exactly when it makes it `failed` (and
# clears it otherwise), so the condition that reads those indexes is this one, not the status.
_FAILED = WebhookDelivery.failed_at.is_not(None)


def _log_conditions(
    brand_id: str,
    *,
    status: str | None,
    retrying: bool | None,
    event_name: str | None,
    event_id: str | None,
    endpoint_id: str | None,
) -> list:
    """The WHERE of the log's filters, each written so that PostgreSQL reads it from an index
    of webhook_deliveries in creation order (models/webhook_delivery.py):

    - the brand's log: (brand_id, created_at, id); `eventName`: (brand_id, event_name, ...);
    - `endpointId`: (endpoint_id, created_at, id), with the endpoint's brand checked once (an
      endpoint's deliveries are all its brand's), so the index alone answers;
    - `status=failed`: the partial failed indexes, by brand or by endpoint (`_FAILED`);
    - `status=pending`, `retrying=true`: the pending work of the brand's endpoints, from
      webhook_delivery_queue and webhook_delivery_leases, where every pending delivery is;
      the delivery's own columns then say which are pending and retrying;
    - `eventId`: (event_id).
    `status=delivered` and `retrying=false` match most of the log and have no index of their
    own: they read the log's rows in order and keep the ones that match.
    """
    conditions: list  # SQL expressions, hybrid properties' included
    if endpoint_id is None:
        conditions = [WebhookDelivery.brand_id == brand_id]
    else:
        endpoint_brand = select(WebhookEndpoint.brand_id).where(WebhookEndpoint.id == endpoint_id)
        # An uncorrelated subquery: PostgreSQL checks it once, before reading the index.
        conditions = [
            WebhookDelivery.endpoint_id == endpoint_id,
            endpoint_brand.scalar_subquery() == brand_id,
        ]
    if status == FAILED:
        conditions.append(_FAILED)
    elif status is not None:
        conditions.append(WebhookDelivery.status == status)
    if status == PENDING or retrying:
        conditions.append(WebhookDelivery.id.in_(_pending_work(brand_id, endpoint_id)))
    if retrying is not None:
        is_retrying = WebhookDelivery.is_retrying
        conditions.append(is_retrying if retrying else not_(is_retrying))
    if event_name is not None:
        conditions.append(WebhookDelivery.event_name == event_name)
    if event_id is not None:
        conditions.append(WebhookDelivery.event_id == event_id)
    return conditions


def _pending_work(brand_id: str, endpoint_id: str | None = None):
    """The ids of the pending deliveries of the brand's endpoints (or of one): each is queued
    for its next attempt or leased for the one on the wire (models/delivery_queue.py), two
    tables as small as the work waiting, where the log holds every delivery ever made."""
    endpoints = (
        [endpoint_id]
        if endpoint_id is not None
        else select(WebhookEndpoint.id).where(WebhookEndpoint.brand_id == brand_id)
    )
    return union_all(
        select(QueuedDelivery.delivery_id).where(QueuedDelivery.endpoint_id.in_(endpoints)),
        select(DeliveryLease.delivery_id).where(DeliveryLease.endpoint_id.in_(endpoints)),
    )


@dataclass(frozen=True)
class _Cursor:
    created_at: datetime
    delivery_id: str
    expired: bool


def _cursor(brand_id: str, after: str, now: datetime | None) -> _Cursor:
    """Where the log resumes after the delivery `after`. One retention deleted (its id tells
    when it was made, and that is older than what is kept) resumes from that time, as the events
    feed does (CONTRACT 11.1).

    :raise NotFound: `after` is no delivery of the brand, and not an expired one."""
    created_at = db.session.scalar(
        select(WebhookDelivery.created_at).where(
            WebhookDelivery.id == after, WebhookDelivery.brand_id == brand_id
        )
    )
    if created_at is not None:
        return _Cursor(created_at=created_at, delivery_id=after, expired=False)
    made_at = id_time(after)
    if made_at is not None and made_at < (now or utcnow()) - retention_period():
        return _Cursor(created_at=made_at, delivery_id=after, expired=True)
    raise NotFound(f"No webhook delivery with id {after!r} in this brand")


def _after(cursor: _Cursor, sort_order: str):
    """The rows after the cursor in the list's order: a range of the same index, by the row
    comparison PostgreSQL matches against (created_at, id)."""
    key = tuple_(WebhookDelivery.created_at, WebhookDelivery.id)
    position = tuple_(
        literal(cursor.created_at, WebhookDelivery.created_at.type), cursor.delivery_id
    )
    return key > position if sort_order == ASCENDING else key < position


@dataclass(frozen=True)
class DeliveryHealth:
    """What the brand's webhooks are doing: the deliveries created since a moment that were
    delivered or failed for good, the ones pending now (retrying after a failed attempt, held
    behind an earlier delivery of their subject, or waiting for their first), and the attempts
    since that moment that failed."""

    delivered: int
    failed: int
    retrying: int
    waiting: int
    failed_attempts: int
    held: int = 0


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
    states = state_columns()  # one set of expressions: GROUP BY must match SELECT's
    pending_rows = db.session.execute(
        select(*states, func.count())
        .where(WebhookDelivery.id.in_(_pending_work(brand_id)), WebhookDelivery.status == PENDING)
        .group_by(*states)
    ).all()
    pending = count_states(pending_rows)
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
        retrying=pending[RETRYING],
        waiting=pending[WAITING],
        held=pending[HELD],
        failed_attempts=failed_attempts,
    )


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
    return DeliveryDetail(delivery=delivery, attempts=attempts, payload=json.loads(body), body=body)


def redeliver(*, brand_id: str, delivery_id: str, now: datetime | None = None) -> str:
    """A new delivery of the same event (same body, same event id) to the same endpoint; its id.
    The original notes it (`redelivered_as`), so recover does not send it once more.

    :raise NotFound: no such delivery, or its endpoint was deleted or is disabled.
    :raise Conflict: its event was erased.
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
        deleted.
    :raise Conflict: the event was erased."""
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
            WebhookDelivery.event_id == event_id,
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
    were created (CONTRACT 8.3); deliveries of erased events are left out (CONTRACT 13.3). Run
    twice, the second finds nothing more to queue: each original notes its new delivery, under
    a row lock a concurrent recover waits for.

    :raise ValidationFailed: `since` more than 14 days ago, or not before `until`.
    :raise NotFound: no such endpoint in this brand, or it is disabled or deleted.
    :raise Conflict: an event among them was erased meanwhile.
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
            _FAILED,  # the endpoint's failed index
            WebhookDelivery.redelivered_as.is_(None),
            WebhookDelivery.created_at >= since,
            WebhookDelivery.created_at < until,
            # An erased event is not sent again (CONTRACT 13.3): recover leaves it out.
            ~select(WebhookEvent.id)
            .where(WebhookEvent.id == WebhookDelivery.event_id, WebhookEvent.is_erased)
            .exists(),
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
