"""The events API (CONTRACT 11.1): a brand's events to pull, in publish order after a cursor,
with a long-poll; and one event with its deliveries."""

from __future__ import annotations

from blueprints.api import api
from blueprints.api.auth import authenticate
from blueprints.api.operations import operation
from models.api_key import READ
from schemas.event_feed import (
    EventDetailSchema,
    EventFeedMetaSchema,
    EventFeedQuerySchema,
    EventListSchema,
)
from services.event_feed import fetch_events, get_event

EVENTS = "Events"


@api.get("/brand/<brand_id>/event/fetch-events")
@authenticate(scope=READ)
@operation(
    operation_id="fetchEvents",
    tag=EVENTS,
    summary="The brand's events, in publish order, after a cursor",
    description="Pull instead of (or beside) being pushed: every event of the brand, whether "
    "or not an endpoint subscribes to it, oldest first after `after`, with the same `data` "
    "as its deliveries. Pass `meta.nextAfter` as the next `after` and you see each event "
    "exactly once, in publish order, even while events are published concurrently. With "
    "`wait`, an empty answer is held open until an event is published (a long-poll): loop on "
    "it to follow the brand live. Only events still kept (`WEBHOOK_RETENTION_DAYS`) are "
    "listed.",
    query=EventFeedQuerySchema,
    response=EventListSchema,
    meta=EventFeedMetaSchema,
    errors=(404,),  # `after` that is not an event of the brand
)
def fetch_brand_events(brand_id: str, query: dict):
    return fetch_events(brand_id=brand_id, **query)


@api.get("/brand/<brand_id>/event/<id(evt):event_id>")
@authenticate(scope=READ)
@operation(
    operation_id="fetchEvent",
    tag=EVENTS,
    summary="One event, with its deliveries",
    description="The event as fetch-events lists it, and every delivery of it (one per "
    "endpoint it reached, and redeliveries), each with its status and attempts so far; follow "
    "one with fetchWebhookDelivery.",
    response=EventDetailSchema,
)
def fetch_brand_event(brand_id: str, event_id: str):
    return get_event(brand_id, event_id)
