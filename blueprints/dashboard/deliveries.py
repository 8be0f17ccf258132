"""Deliveries: the log with filters, sort and paging; rows that refresh themselves while
pending; one delivery with its payload, the headers sent and every attempt; redeliver.

The same services and schemas as the API's fetch-deliveries, fetchWebhookDelivery and
redeliverWebhook (blueprints/api/webhooks.py).
"""

from __future__ import annotations

import json

from flask import flash, request

from blueprints.dashboard import dashboard
from blueprints.dashboard.rendering import load_query, render
from blueprints.dashboard.session import current_caller, signed_in
from extensions import db
from schemas.envelope import PageMetaSchema
from schemas.webhooks import DeliveryDetailSchema, DeliveryQuerySchema, DeliverySchema
from services.deliveries import get_delivery, get_delivery_detail, list_deliveries, redeliver
from services.errors import ValidationFailed
from services.event_catalog import EVENT_NAMES
from services.webhook_endpoints import list_endpoints

FILTERS = ("status", "eventName", "endpointId", "sortOrder", "limit")

_query = DeliveryQuerySchema()
_deliveries = DeliverySchema(many=True)
_delivery = DeliverySchema()
_detail = DeliveryDetailSchema()
_meta = PageMetaSchema()


def _endpoint_urls(brand_id: str) -> dict[str, str]:
    """Each endpoint's URL by id, to name it in the log (a deleted one is shown by its id)."""
    return {endpoint.id: endpoint.url for endpoint in list_endpoints(brand_id)}


@dashboard.get("/deliveries")
@signed_in()
def deliveries():
    brand_id = current_caller().brand_id
    chosen = {name: request.args[name] for name in FILTERS if request.args.get(name)}
    context = {
        "chosen": chosen,
        "event_names": EVENT_NAMES,
        "endpoint_urls": _endpoint_urls(brand_id),
        "deliveries": [],
        "meta": None,
        "errors": {},
    }
    try:
        query = load_query(_query)
    except ValidationFailed as error:
        context["errors"] = error.errors
        return render(
            "dashboard/deliveries.html",
            fragment="dashboard/_delivery_results.html",
            status=400,
            **context,
        )
    page = list_deliveries(brand_id=brand_id, **query)
    context.update(deliveries=_deliveries.dump(page.items), meta=_meta.dump(page))
    return render(
        "dashboard/deliveries.html", fragment="dashboard/_delivery_results.html", **context
    )


@dashboard.get("/deliveries/<delivery_id>/row")
@signed_in()
def delivery_row(delivery_id: str):
    """One row of the log, which a pending row asks for until it settles."""
    brand_id = current_caller().brand_id
    return render(
        "dashboard/_delivery_row.html",
        fragment="dashboard/_delivery_row.html",
        delivery=_delivery.dump(get_delivery(brand_id, delivery_id)),
        endpoint_urls=_endpoint_urls(brand_id),
    )


def _detail_context(delivery_id: str) -> dict:
    brand_id = current_caller().brand_id
    detail = _detail.dump(get_delivery_detail(brand_id, delivery_id))
    return {
        "delivery": detail,
        "payload": json.dumps(detail["payload"], indent=2),
        "endpoint_urls": _endpoint_urls(brand_id),
    }


@dashboard.get("/deliveries/<delivery_id>")
@signed_in()
def delivery(delivery_id: str):
    return render(
        "dashboard/delivery.html",
        fragment="dashboard/_delivery_progress.html",
        **_detail_context(delivery_id),
    )


@dashboard.post("/deliveries/<delivery_id>/redeliver")
@signed_in(write=True)
def redeliver_delivery(delivery_id: str):
    """redeliverWebhook: a new delivery of the same event to the same endpoint."""
    new_id = redeliver(brand_id=current_caller().brand_id, delivery_id=delivery_id)
    db.session.commit()
    flash("Redelivery queued.", "success")
    return render(
        "dashboard/delivery.html",
        fragment="dashboard/_delivery_redelivered.html",
        status=202,
        redelivered=new_id,
        **_detail_context(delivery_id),
    )
