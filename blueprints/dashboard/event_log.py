"""Events: the brand's events newest first (filter by type, find one by id), each with its
deliveries; one event with its body, every delivery of it, where it went and why (CONTRACT
13.2, with "send it now" for an endpoint it skipped), "resend to endpoint…", and erasing its
subject's data behind a confirmation (CONTRACT 13.3).

The same services as the events API (services/event_feed.py) and redeliver
(services/deliveries.py). The catalogue of event names is the "Event types" page
(blueprints/dashboard/events.py).
"""

from __future__ import annotations

import json
import re

from flask import flash, redirect, request, url_for

from blueprints.dashboard import dashboard
from blueprints.dashboard.deliveries import poll_context
from blueprints.dashboard.rendering import (
    chosen_filters,
    load_query,
    render,
    render_confirmation,
    render_list,
)
from blueprints.dashboard.session import current_caller, is_htmx, signed_in
from extensions import db
from models.columns import id_pattern
from models.event_catalog import EVENT_NAMES
from models.paging import MAX_LIMIT
from schemas.base import iso_timestamp
from schemas.dashboard import EventLogQuerySchema
from schemas.envelope import PageMetaSchema
from schemas.webhooks import DeliverySchema, EndpointSchema
from services.deliveries import list_deliveries, send_event_again
from services.erasure import erase_subject
from services.errors import NotFound, ValidationFailed
from services.event_feed import get_event, list_events, subject_events
from services.event_routing import event_routing
from services.retention import retention_period
from services.webhook_endpoints import list_endpoints

FILTERS = ("type",)
FILTER_LABELS = {"type": "Type", "eventId": "Event id", "page": "Page", "limit": "Per page"}

ENDPOINT_ID = re.compile(id_pattern("whe"))
# The event page lists this many of its subject's events before it and after it.
SUBJECT_REACH = 20

_query = EventLogQuerySchema()
_meta = PageMetaSchema()
_endpoints = EndpointSchema(many=True)
_deliveries = DeliverySchema(many=True)


@dashboard.get("/events")
@signed_in()
def event_log():
    brand_id = current_caller().brand_id
    missing = _find_by_id(brand_id)
    if missing is None and request.args.get("eventId"):
        return redirect(url_for("dashboard.event", event_id=request.args["eventId"]), code=303)

    def fetch(query: dict) -> dict:
        page = list_events(
            brand_id=brand_id,
            page=query["page"],
            limit=query["limit"],
            event_type=query.get("type"),
        )
        events = [
            {
                "id": event.id,
                "type": event.type,
                "createdAt": iso_timestamp(event.created_at),
                "deliveries": event.deliveries,
            }
            for event in page.items
        ]
        return {"events": events, "meta": _meta.dump(page)}

    return render_list(
        "dashboard/event_log.html",
        fragment="dashboard/_event_results.html",
        query_schema=_query,
        fetch=fetch,
        chosen=chosen_filters(FILTERS),
        event_names=EVENT_NAMES,
        filter_labels=FILTER_LABELS,
        retention_days=retention_period().days,
        missing=missing,
        events=[],
        meta=None,
    )


def _find_by_id(brand_id: str) -> str | None:
    """The `eventId` asked for when it is no event of the brand; None otherwise (none asked, a
    malformed one, which the list reports, or one that exists)."""
    try:
        wanted = load_query(_query).get("event_id")
    except ValidationFailed:
        return None
    if wanted is None:
        return None
    try:
        get_event(brand_id, wanted)
    except NotFound:
        return wanted
    return None


@dashboard.get("/events/<id(evt):event_id>")
@signed_in()
def event(event_id: str):
    brand_id = current_caller().brand_id
    detail = get_event(brand_id, event_id)
    endpoints = {e["id"]: e for e in _endpoints.dump(list_endpoints(brand_id))}
    # Its deliveries as the delivery log shows them (retrying, next retry; pending rows refresh).
    deliveries = list_deliveries(brand_id=brand_id, page=1, limit=MAX_LIMIT, event_id=event_id)
    shown = _deliveries.dump(deliveries.items)
    active = [e for e in endpoints.values() if e["isActive"]]
    routes = [
        {"endpoint": endpoints[route.endpoint_id], **vars(route)}
        for route in event_routing(brand_id, event_id).endpoints
    ]
    return render(
        "dashboard/event.html",
        event={
            "id": detail.id,
            "type": detail.type,
            "createdAt": iso_timestamp(detail.created_at),
            "subject": {"type": detail.subject.type, "id": detail.subject.id},
            "sequence": detail.sequence,
            "erasedAt": detail.erased_at and iso_timestamp(detail.erased_at),
        },
        routes=routes,
        erase=_erase_confirmation(detail),
        subject=_subject_neighbours(brand_id, detail),
        body=json.dumps(json.loads(detail.body), indent=2, ensure_ascii=False),
        deliveries=shown,
        more_deliveries=deliveries.has_next,
        endpoints=endpoints,
        active_endpoints=active,
        received_by={delivery["endpointId"] for delivery in shown},
        resend_choice=_resend_choice(active, shown),
        **poll_context(0),
    )


def _resend_choice(active: list[dict], deliveries: list[dict]) -> str | None:
    """The endpoint "Resend to endpoint…" starts with: the one active endpoint that got the
    event, when exactly one did (sending it again there is the usual wish); else none, so that
    the event never goes by default to an endpoint that does not subscribe to it."""
    received = {delivery["endpointId"] for delivery in deliveries}
    candidates = [endpoint["id"] for endpoint in active if endpoint["id"] in received]
    return candidates[0] if len(candidates) == 1 else None


def _subject_neighbours(brand_id: str, detail) -> dict:
    """The event's subject's events around it, in sequence: up to SUBJECT_REACH before and
    after, and whether there are more either side (opening the first or the last listed moves
    the window)."""
    first = max(1, detail.sequence - SUBJECT_REACH)
    # One more each side than shown, to know whether there is more.
    found = subject_events(
        brand_id,
        (detail.subject.type, detail.subject.id),
        after_sequence=first - 2,
        limit=detail.sequence - first + SUBJECT_REACH + 3,
    )
    shown = [e for e in found if first <= e.sequence <= detail.sequence + SUBJECT_REACH]
    return {
        "events": [
            {
                "id": event.id,
                "type": event.type,
                "createdAt": iso_timestamp(event.created_at),
                "sequence": event.sequence,
            }
            for event in shown
        ],
        "earlier": any(event.sequence < first for event in found),
        "later": any(event.sequence > detail.sequence + SUBJECT_REACH for event in found),
    }


@dashboard.post("/events/<id(evt):event_id>/resend")
@signed_in(write=True)
def resend_event(event_id: str):
    """A delivery of the event to the endpoint chosen (a redelivery when it went there before).
    A deleted or disabled endpoint is NotFound, as in the API, shown as the error."""
    endpoint_id = request.form.get("endpointId", "")
    if not ENDPOINT_ID.fullmatch(endpoint_id):
        raise NotFound("Choose one of your active endpoints")
    new_id = send_event_again(
        brand_id=current_caller().brand_id, event_id=event_id, endpoint_id=endpoint_id
    )
    db.session.commit()
    flash(f"Queued as delivery {new_id}: it is listed below and in Deliveries.", "success")
    return redirect(url_for("dashboard.event", event_id=event_id), code=303)


def _erase_confirmation(detail) -> dict:
    """What erasing the event's subject says before it is done, as a dialog (htmx) or a page."""
    subject = f"{detail.subject.type} {detail.subject.id}"
    return {
        "title": f"Erase the data of {subject}?",
        "consequence": f"Erase the data of every event of {subject}? Each event keeps its id, "
        "type, time and place in the log, but its data becomes null; the answers your "
        "endpoints gave to its deliveries are deleted; its pending deliveries end as failed "
        "and are never sent. This cannot be undone.",
        "button": "Erase subject's data",
        "action": url_for("dashboard.erase_event_subject", event_id=detail.id),
    }


@dashboard.get("/events/<id(evt):event_id>/erase-subject")
@signed_in(write=True)
def confirm_erase_event_subject(event_id: str):
    detail = get_event(current_caller().brand_id, event_id)
    return render_confirmation(
        _erase_confirmation(detail), back=url_for("dashboard.event", event_id=event_id)
    )


@dashboard.post("/events/<id(evt):event_id>/erase-subject")
@signed_in(write=True)
def erase_event_subject(event_id: str):
    """eraseSubject for the event's subject (CONTRACT 13.3), then the event's page again."""
    brand_id = current_caller().brand_id
    detail = get_event(brand_id, event_id)
    erased = erase_subject(brand_id=brand_id, subject=(detail.subject.type, detail.subject.id))
    db.session.commit()
    flash(
        f"Erasing the data of {erased.events} event(s) of {detail.subject.type} "
        f"{detail.subject.id}: the newest are erased already, the rest within moments.",
        "success",
    )
    target = url_for("dashboard.event", event_id=event_id)
    if is_htmx():
        return "", 200, {"HX-Redirect": target}
    return redirect(target, code=303)
