"""The events API (CONTRACT 11.1): a brand's events to pull, in publish order after a cursor,
with a long-poll; one event with its deliveries, and where it went (CONTRACT 13.2); erasing a
subject's events (CONTRACT 13.3)."""

from __future__ import annotations

from typing import cast

from blueprints.api import api
from blueprints.api.auth import authenticate, current_caller
from blueprints.api.operations import operation
from config import DEFAULT_EVENT_WAITS_PER_KEY, DEFAULT_EVENT_WAITS_PER_PROCESS
from models.api_key import READ, WRITE
from schemas.event_feed import (
    ErasedSubjectSchema,
    EventDetailSchema,
    EventFeedMetaSchema,
    EventFeedQuerySchema,
    EventListSchema,
    EventRoutingSchema,
    SubjectPathSchema,
)
from services.erasure import erase_subject
from services.event_feed import fetch_events, get_event
from services.event_routing import event_routing

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
    "it to follow the brand live; a key may hold only a few waits at once (see the 429 "
    "answer). With `subject` (`deal:deal_…`), only that record's events, in their `sequence` "
    "order (its history, or a follower of one deal); `after` is then one of its events. "
    "`sortOrder=desc` reads the same order backwards, newest first, for history. Only "
    "events still kept (`WEBHOOK_RETENTION_DAYS`) are listed. It pages by cursor only (no "
    "`page`): page numbers would shift under a reader as events are published.",
    query=EventFeedQuerySchema,
    response=EventListSchema,
    meta=EventFeedMetaSchema,
    errors=(404,),  # `after` that is not an event of the brand
    error_notes={
        429: "With `wait`, also when the request would have to wait and the server process "
        "that took it already holds as many waiting requests as it may: "
        f"`EVENT_WAITS_PER_KEY` of this key (default {DEFAULT_EVENT_WAITS_PER_KEY}), "
        "the brand's share, whatever its number of keys (half the process's waits while it "
        "waits alone, less as other brands wait too), or "
        f"`EVENT_WAITS_PER_PROCESS` in all (default {DEFAULT_EVENT_WAITS_PER_PROCESS}, at most "
        "half the process's threads). `Retry-After` is then between the `wait` asked for and "
        "twice that, at random, so that clients refused together come back apart. A request "
        "with events to list gets them whatever the caps."
    },
)
def fetch_brand_events(brand_id: str, query: dict):
    # A read-scoped caller is an API key (only create-key takes a bootstrap token).
    key_id = cast(str, current_caller().key_id)
    return fetch_events(brand_id=brand_id, key_id=key_id, **query)


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


@api.get("/brand/<brand_id>/event/<id(evt):event_id>/routing")
@authenticate(scope=READ)
@operation(
    operation_id="fetchEventRouting",
    tag=EVENTS,
    summary="Where an event went, and why",
    description="For each of the brand's endpoints that existed when the event was published "
    "(and still exists): `sent` with its first delivery, or why not: `not_subscribed`, "
    "`filtered` by its `campaignIds`, or `disabled` at the time. Decided as things stood "
    "when the event was published, not from the endpoint's settings now. An endpoint passed "
    "over can be sent the event now with the dashboard's resend, or redeliver once it has "
    "a delivery.",
    response=EventRoutingSchema,
)
def fetch_brand_event_routing(brand_id: str, event_id: str):
    return event_routing(brand_id, event_id)


@api.post("/brand/<brand_id>/subject/<subject>/erase")
@authenticate(scope=WRITE)
@operation(
    operation_id="eraseSubject",
    tag=EVENTS,
    summary="Erase the data of every event of a subject",
    description="For a person's request to erase their data: every event of the record "
    "(`deal:deal_…`, `campaign:cmp_…`, `conversion:conv_…`) loses its `data` (null, with "
    "`erasedAt`), and every attempt of its deliveries loses the receiver's answer. Ids, "
    "types, subjects, sequences, times, statuses and headers stay, so the log still adds "
    "up. Pending deliveries of those events end `failed` with the last error `erased` and "
    "are not attempted again; redeliver or resend of an erased event is a CONFLICT, and "
    "recover leaves them out. The newest events are erased before the answer, the rest "
    "within moments, in batches. Asking again answers 202 again (and erases events "
    "published since). Nothing of the subject: NOT_FOUND.",
    path=SubjectPathSchema,
    response=ErasedSubjectSchema,
    status=202,
    message="Erasing the subject's events",
    errors=(404,),
)
def erase_brand_subject(brand_id: str, subject: tuple[str, str]):
    return erase_subject(brand_id=brand_id, subject=subject)
