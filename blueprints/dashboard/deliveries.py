"""Deliveries: the log with filters, sort and paging; rows that refresh themselves while pending;
one delivery with its payload, the headers sent and every attempt (its timings, address, answer
and a curl command that makes it again: blueprints/dashboard/attempts.py); redeliver.

The same services and schemas as the API's fetchWebhookDeliveries, fetchWebhookDelivery and
redeliverWebhook (blueprints/api/webhooks.py): the filters are read by DeliveryQuerySchema, the
records are DeliverySchema / DeliveryDetailSchema dumps.

A pending row (and a pending delivery's status region) asks for itself again two seconds after
it arrives; the answer carries the trigger only while the delivery is still pending, so a
delivered or failed one stops. Each ask costs one query for the row, and the asks stop after
POLL_LIMIT of them (a delivery waiting hours for its next retry), leaving a "Check again" link.
"""

from __future__ import annotations

import json

from flask import flash, redirect, render_template, request, url_for

from blueprints.dashboard import dashboard
from blueprints.dashboard.attempts import attempt_records
from blueprints.dashboard.rendering import chosen_filters, render, render_list
from blueprints.dashboard.session import current_caller, is_htmx, signed_in
from extensions import db
from models.event_catalog import EVENT_NAMES
from models.webhook_delivery import DELIVERY_STATUSES, RESPONSE_BODY_MAX_BYTES
from schemas.base import iso_timestamp
from schemas.envelope import PageMetaSchema
from schemas.webhooks import (
    DeliveryDetailSchema,
    DeliveryQuerySchema,
    DeliverySchema,
    EndpointSchema,
)
from services.deliveries import (
    get_delivery_and_endpoint,
    get_delivery_detail,
    list_deliveries,
    redeliver,
)
from services.retention import delivery_log_reach
from services.signing import DELIVERY_HEADER, EVENT_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER
from services.webhook_endpoints import list_endpoints

# The query parameters of fetchWebhookDeliveries a page keeps (`limit` too; links add `page`).
FILTERS = ("status", "retrying", "eventName", "eventId", "endpointId", "sortOrder")
# Those that narrow the list (an empty list with one of them set is "nothing matches").
NARROWING = ("status", "retrying", "eventName", "eventId", "endpointId")
FILTER_LABELS = {
    "status": "Status",
    "retrying": "Retrying",
    "eventName": "Event",
    "eventId": "Event id",
    "endpointId": "Endpoint",
    "sortOrder": "Order",
    "page": "Page",
    "limit": "Per page",
}
POLL_DELAY = "2s"
# 2 s apart, five minutes of asking; then the row offers "Check again".
POLL_LIMIT = 150

_query = DeliveryQuerySchema()
_deliveries = DeliverySchema(many=True)
_delivery = DeliverySchema()
_detail = DeliveryDetailSchema()
_endpoint = EndpointSchema()
_endpoints = EndpointSchema(many=True)
_meta = PageMetaSchema()


def _endpoints_by_id(brand_id: str) -> dict[str, dict]:
    """The brand's endpoints (active and disabled) by id; a deleted one is absent."""
    return {endpoint["id"]: endpoint for endpoint in _endpoints.dump(list_endpoints(brand_id))}


def _polls() -> int:
    """How many times the element asking has asked already (its URL's `polls`)."""
    try:
        return max(0, int(request.args.get("polls", 0)))
    except ValueError:
        return 0


def poll_context(polls: int) -> dict:
    """What a pending row needs to ask for itself again (_delivery_row.html)."""
    return {"polls": polls + 1, "poll_delay": POLL_DELAY, "poll_more": polls + 1 < POLL_LIMIT}


# ---- the log ----


@dashboard.get("/deliveries")
@signed_in()
def deliveries():
    """fetchWebhookDeliveries: the whole page, or for htmx (filters, pages) the results only."""
    brand_id = current_caller().brand_id
    chosen = chosen_filters(FILTERS)

    def fetch(query: dict) -> dict:
        page = list_deliveries(brand_id=brand_id, **query)
        return {"deliveries": _deliveries.dump(page.items), "meta": _meta.dump(page)}

    reach = delivery_log_reach(brand_id)
    return render_list(
        "dashboard/deliveries.html",
        fragment="dashboard/_delivery_results.html",
        query_schema=_query,
        fetch=fetch,
        chosen=chosen,
        narrowed=any(name in chosen for name in NARROWING),
        statuses=DELIVERY_STATUSES,
        event_names=EVENT_NAMES,
        endpoints=_endpoints_by_id(brand_id),
        filter_labels=FILTER_LABELS,
        retention_days=reach.retention_days,
        oldest_delivery_at=reach.oldest_at and iso_timestamp(reach.oldest_at),
        deliveries=[],
        meta=None,
        **poll_context(0),
    )


@dashboard.get("/deliveries/<id(whd):delivery_id>/row")
@signed_in()
def delivery_row(delivery_id: str):
    """One row of the log, which a pending row asks for until it settles (one query)."""
    record, endpoint = get_delivery_and_endpoint(current_caller().brand_id, delivery_id)
    if not is_htmx():
        return redirect(url_for("dashboard.delivery", delivery_id=delivery_id), code=303)
    endpoints = {endpoint.id: _endpoint.dump(endpoint)} if endpoint is not None else {}
    # Only the row: no flash messages, which would wipe the page's every two seconds.
    return render_template(
        "dashboard/_delivery_row.html",
        delivery=_delivery.dump(record),
        endpoints=endpoints,
        **poll_context(_polls()),
    )


# ---- one delivery ----


def _detail_context(delivery_id: str, polls: int = 0, **extra) -> dict:
    brand_id = current_caller().brand_id
    record = get_delivery_detail(brand_id, delivery_id)
    detail = _detail.dump(record)
    endpoint = _endpoints_by_id(brand_id).get(detail["endpointId"])
    context = {
        "delivery": detail,
        "endpoint": endpoint,
        "attempt_records": attempt_records(detail, endpoint, record.body),
        "payload": json.dumps(detail["payload"], indent=2, ensure_ascii=False),
        "headers": _headers_sent(detail),
        "response_max_kib": RESPONSE_BODY_MAX_BYTES // 1024,
        "redelivered": None,
        **poll_context(polls),
    }
    return context | extra


def _headers_sent(detail: dict) -> dict:
    """The last attempt's headers as stored, or before any attempt the ones it will carry
    (the timestamp and signature are made when it is sent)."""
    if detail["attempts"]:
        last = detail["attempts"][-1]
        return {"attempt": last["attemptNumber"], "values": last["requestHeaders"]}
    return {
        "attempt": None,
        "values": {
            "Content-Type": "application/json",
            TIMESTAMP_HEADER: "(Unix seconds when it is sent)",
            SIGNATURE_HEADER: "sha256=(HMAC-SHA256 of {timestamp}.{body} with the signing secret)",
            EVENT_HEADER: detail["eventName"],
            DELIVERY_HEADER: detail["id"],
        },
    }


@dashboard.get("/deliveries/<id(whd):delivery_id>")
@signed_in()
def delivery(delivery_id: str):
    """fetchWebhookDelivery."""
    return render("dashboard/delivery.html", **_detail_context(delivery_id))


@dashboard.get("/deliveries/<id(whd):delivery_id>/progress")
@signed_in()
def delivery_progress(delivery_id: str):
    """The status, headers and attempts region, which asks for itself while pending."""
    context = _detail_context(delivery_id, _polls())
    if not is_htmx():
        return redirect(url_for("dashboard.delivery", delivery_id=delivery_id), code=303)
    return render_template("dashboard/_delivery_progress.html", **context)


@dashboard.post("/deliveries/<id(whd):delivery_id>/redeliver")
@signed_in(write=True)
def redeliver_delivery(delivery_id: str):
    """redeliverWebhook: a new delivery of the same event to the same endpoint. A deleted or
    disabled endpoint is NotFound, as in the API, shown as the error."""
    new_id = redeliver(brand_id=current_caller().brand_id, delivery_id=delivery_id)
    db.session.commit()
    if not is_htmx():
        # A plain form: the new delivery's page, which a reload only reads.
        flash(f"Redelivery queued: this is the new delivery of {delivery_id}'s event.", "success")
        return redirect(url_for("dashboard.delivery", delivery_id=new_id), code=303)
    return render(
        "dashboard/delivery.html",
        fragment="dashboard/_delivery_redeliver.html",
        status=202,
        **_detail_context(delivery_id, redelivered=new_id),
    )
