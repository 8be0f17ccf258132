"""Where an event went, and why (CONTRACT 13.2): for each endpoint of the brand that existed
when the event was published and still exists, whether it was `sent` (and the first delivery),
`not_subscribed`, `filtered` or `disabled`, as things stood at publish time.

Only what cannot be read back later is stored: the publisher keeps, with the event, the
subscribed endpoints it passed over and why (`passed_over`, services/events.py). A delivery
says `sent`. An endpoint that existed, got no delivery and is not in `passed_over` was not
subscribed then: had it been, it would have been sent the event or listed. That holds whatever
its subscriptions, filters or state became since, so none of them is read here."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import or_, select

from extensions import db
from models import WebhookDelivery, WebhookEndpoint, WebhookEvent
from models.webhook_event import NOT_SUBSCRIBED, SENT
from services.errors import NotFound


@dataclass(frozen=True)
class Route:
    endpoint_id: str
    outcome: str
    delivery_id: str | None


@dataclass(frozen=True)
class EventRouting:
    event_id: str
    endpoints: list[Route]


def event_routing(brand_id: str, event_id: str) -> EventRouting:
    """The event's route to each endpoint that existed when it was published and still exists,
    oldest endpoint first.

    :raise NotFound: no such event in this brand (another brand's included)."""
    event = db.session.execute(
        select(WebhookEvent.id, WebhookEvent.created_at, WebhookEvent.passed_over).where(
            WebhookEvent.id == event_id, WebhookEvent.brand_id == brand_id
        )
    ).first()
    if event is None:
        raise NotFound(f"No event with id {event_id!r} in this brand")
    # Each endpoint's first delivery of it (the publisher's; later ones are resends).
    first_delivery: dict[str, str] = {}
    published_to: set[str] = set()
    for delivery_id, endpoint_id, created_at in db.session.execute(
        select(WebhookDelivery.id, WebhookDelivery.endpoint_id, WebhookDelivery.created_at)
        .where(WebhookDelivery.event_id == event.id)
        .order_by(WebhookDelivery.created_at, WebhookDelivery.id)
    ):
        first_delivery.setdefault(endpoint_id, delivery_id)
        if created_at == event.created_at:  # the publisher dates its deliveries as the event
            published_to.add(endpoint_id)
    passed_over = event.passed_over or {}
    endpoints = db.session.scalars(
        select(WebhookEndpoint.id)
        .where(
            WebhookEndpoint.brand_id == brand_id,
            WebhookEndpoint.deleted_at.is_(None),
            # Existed when it was published: created before it, or one the publisher saw
            # (an endpoint created in the same instant, whose clock ran a little behind).
            or_(
                WebhookEndpoint.created_at <= event.created_at,
                WebhookEndpoint.id.in_(published_to | set(passed_over)),
            ),
        )
        .order_by(WebhookEndpoint.created_at, WebhookEndpoint.id)
    ).all()
    return EventRouting(
        event_id=event.id,
        endpoints=[
            Route(
                endpoint_id=endpoint_id,
                outcome=SENT
                if endpoint_id in first_delivery
                else passed_over.get(endpoint_id, NOT_SUBSCRIBED),
                delivery_id=first_delivery.get(endpoint_id),
            )
            for endpoint_id in endpoints
        ],
    )
