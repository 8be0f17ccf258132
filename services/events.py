"""Publishing events: the one function every source of events calls (an outbox).

`publish_event` writes the event and one delivery per receiving endpoint in the caller's database
transaction, so an event exists exactly when what caused it was committed. It sends nothing and
touches no queue: it notes the endpoints to wake in the session, and `workers.dispatch` enqueues
their jobs once that transaction has committed (and only then). If Redis is down at that moment
the deliveries are still in the database, due, and the worker's sweeper finds them.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select

from extensions import db
from models import WebhookDelivery, WebhookEndpoint, WebhookEvent
from models.columns import new_id, utcnow
from models.webhook_delivery import PENDING
from schemas.base import iso_timestamp
from services.errors import ValidationFailed
from services.event_catalog import EVENT_NAMES, is_event_name

API_VERSION = "1"
# session.info key under which endpoints to wake after commit are collected.
WAKE_AFTER_COMMIT = "webhook_endpoints_to_wake"


@dataclass(frozen=True)
class PublishedEvent:
    event: WebhookEvent
    delivery_ids: list[str]


def publish_event(
    *,
    brand_id: str,
    name: str,
    data: dict,
    only_endpoint_ids: Collection[str] | None = None,
    now: datetime | None = None,
) -> PublishedEvent:
    """Record the event `name` for the brand and a pending delivery to every active endpoint
    subscribed to it (or, with `only_endpoint_ids`, to those active endpoints whatever their
    subscriptions: the test ping).

    The brand must exist (callers hold its records; `events emit` checks an id typed by hand):
    reading it again here would cost every postback a round trip.

    :raise ValidationFailed: unknown event name, or `data` that is not a JSON object.
    """
    if not is_event_name(name):
        raise ValidationFailed(
            "Unknown event name",
            {"name": [f"Must be one of: {', '.join(EVENT_NAMES)}."]},
        )
    if not isinstance(data, dict):
        raise ValidationFailed("Event data must be a JSON object", {"data": ["Not an object."]})
    now = now or utcnow()
    event_id = new_id("evt")
    body = json.dumps(
        {
            "id": event_id,
            "type": name,
            "createdAt": iso_timestamp(now),
            "brandId": brand_id,
            "apiVersion": API_VERSION,
            "data": data,
        },
        separators=(",", ":"),
        ensure_ascii=False,
    )
    event = WebhookEvent(id=event_id, brand_id=brand_id, name=name, body=body, created_at=now)
    db.session.add(event)

    endpoint_ids = _receiving_endpoints(brand_id, name, only_endpoint_ids)
    delivery_ids = _add_deliveries(brand_id, event_id, name, endpoint_ids, now)
    return PublishedEvent(event=event, delivery_ids=delivery_ids)


def deliver_again(
    *, brand_id: str, event_id: str, event_name: str, endpoint_id: str, now: datetime | None
) -> str:
    """One more delivery of a stored event, same body, to one endpoint (redeliver); its id."""
    return _add_deliveries(brand_id, event_id, event_name, [endpoint_id], now or utcnow())[0]


def _add_deliveries(
    brand_id: str, event_id: str, name: str, endpoint_ids: list[str], now: datetime
) -> list[str]:
    deliveries = [
        WebhookDelivery(
            id=new_id("whd"),
            brand_id=brand_id,
            endpoint_id=endpoint_id,
            event_id=event_id,
            event_name=name,
            status=PENDING,
            attempt_count=0,
            next_attempt_at=now,
            created_at=now,
        )
        for endpoint_id in endpoint_ids
    ]
    db.session.add_all(deliveries)
    db.session.flush()
    db.session.info.setdefault(WAKE_AFTER_COMMIT, set()).update(endpoint_ids)
    return [delivery.id for delivery in deliveries]


def _receiving_endpoints(
    brand_id: str, name: str, only_endpoint_ids: Collection[str] | None
) -> list[str]:
    statement = select(WebhookEndpoint.id, WebhookEndpoint.events).where(
        WebhookEndpoint.brand_id == brand_id, WebhookEndpoint.is_active
    )
    if only_endpoint_ids is not None:
        statement = statement.where(WebhookEndpoint.id.in_(list(only_endpoint_ids)))
        return [row.id for row in db.session.execute(statement)]
    return [row.id for row in db.session.execute(statement) if name in row.events]
