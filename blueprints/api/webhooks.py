"""Webhook endpoint and delivery routes (SPEC section 4, CONTRACT section 4)."""

from __future__ import annotations

from blueprints.api import api
from blueprints.api.auth import authenticate, current_caller
from blueprints.api.operations import operation
from models.api_key import READ, WRITE
from models.columns import utcnow
from schemas.webhooks import (
    DeletedEndpointSchema,
    DeliveryDetailSchema,
    DeliveryListSchema,
    DeliveryPageMetaSchema,
    DeliveryQuerySchema,
    EndpointListSchema,
    EndpointRegisterSchema,
    EndpointStatsSchema,
    EndpointUpdateSchema,
    IssuedEndpointSchema,
    QueuedDeliverySchema,
    RecoveredSchema,
    RecoverSchema,
    RetriedPendingSchema,
    RotatedSecretSchema,
    RotateSecretSchema,
    UpdatedEndpointSchema,
)
from services.deliveries import (
    get_delivery_detail,
    list_deliveries,
    recover_failed_deliveries,
    redeliver,
)
from services.endpoint_stats import endpoint_stats, with_health
from services.webhook_endpoints import (
    THROUGH_THE_API,
    ChangedBy,
    current_url_policy,
    delete_endpoint,
    list_endpoints,
    register_endpoint,
    retry_pending,
    rotate_signing_secret,
    send_test_ping,
    update_endpoint,
)

ENDPOINTS = "Webhook endpoints"
DELIVERIES = "Webhook deliveries"
SIGNATURE_HELP = (
    " Deliveries are signed: `X-Service-Signature: sha256=<hex>` is HMAC-SHA256 over "
    "`{X-Service-Timestamp}.{rawBody}` with the signing secret, and `webhook-signature` as "
    "Standard Webhooks has it, which its libraries verify with the secret as issued. What each "
    "event's delivery carries: the document's `webhooks`."
)


@api.post("/brand/<brand_id>/webhook/register-endpoint")
@authenticate(scope=WRITE)
@operation(
    operation_id="registerWebhookEndpoint",
    tag=ENDPOINTS,
    summary="Register a webhook endpoint",
    description="Returns the signing secret once: store it to verify deliveries. Unsupported "
    "event names are dropped and listed in `droppedEvents`." + SIGNATURE_HELP,
    body=EndpointRegisterSchema,
    response=IssuedEndpointSchema,
    status=201,
    message="Webhook endpoint registered; store the signing secret now, it is not shown again",
    errors=(409,),  # the brand has MAX_ENDPOINTS_PER_BRAND endpoints already
)
def register_webhook_endpoint(brand_id: str, body: dict):
    return register_endpoint(policy=current_url_policy(), brand_id=brand_id, **body)


@api.get("/brand/<brand_id>/webhook/fetch-endpoints")
@authenticate(scope=READ)
@operation(
    operation_id="fetchWebhookEndpoints",
    tag=ENDPOINTS,
    summary="List the brand's webhook endpoints",
    description="Active and disabled endpoints, oldest first, each with its success rate and "
    "last success of the last 24 hours. Signing secrets are never listed.",
    response=EndpointListSchema,
)
def fetch_webhook_endpoints(brand_id: str):
    return {"endpoints": with_health(list_endpoints(brand_id), now=utcnow())}


@api.get("/brand/<brand_id>/webhook/<id(whe):endpoint_id>/stats")
@authenticate(scope=READ)
@operation(
    operation_id="getWebhookEndpointStats",
    tag=ENDPOINTS,
    summary="An endpoint's health over the last 24 hours",
    description="Its deliveries created in the last 24 hours by status, the share of its "
    "attempts that succeeded (retries included), their duration's median and 95th "
    "percentile, and its last success and failure. Watch `successRate` and `lastFailureAt` to "
    "see an endpoint failing long before it is disabled.",
    response=EndpointStatsSchema,
)
def get_webhook_endpoint_stats(brand_id: str, endpoint_id: str):
    return endpoint_stats(brand_id=brand_id, endpoint_id=endpoint_id, now=utcnow())


@api.patch("/brand/<brand_id>/webhook/<id(whe):endpoint_id>/update-endpoint")
@authenticate(scope=WRITE)
@operation(
    operation_id="updateWebhookEndpoint",
    tag=ENDPOINTS,
    summary="Change an endpoint's URL, events, description, ordering, campaigns or delivery "
    "settings, or disable or re-enable it",
    description="Give any of `url`, `events`, `description`, `isActive`, `ordering`, "
    "`campaignIds`, `maxInFlight`, `traceContext`. Re-enabling (`isActive: true`) "
    "clears `disabledAt` and `consecutiveFailures`; deliveries failed while it was disabled "
    "can be sent again with redeliver. An id in `campaignIds` that is not one of the brand's "
    "campaigns is a VALIDATION_ERROR naming it.",
    body=EndpointUpdateSchema,
    response=UpdatedEndpointSchema,
    message="Webhook endpoint updated",
)
def update_webhook_endpoint(brand_id: str, endpoint_id: str, body: dict):
    return update_endpoint(
        brand_id=brand_id,
        endpoint_id=endpoint_id,
        policy=current_url_policy(),
        changed_by=ChangedBy(THROUGH_THE_API, current_caller().key_id),
        **body,
    )


@api.post("/brand/<brand_id>/webhook/<id(whe):endpoint_id>/rotate-secret")
@authenticate(scope=WRITE)
@operation(
    operation_id="rotateWebhookSecret",
    tag=ENDPOINTS,
    summary="Replace an endpoint's signing secret",
    description="Without `overlapSeconds`, effective at once: every attempt from now on, "
    "retries included, is signed with the new secret only. With it, each delivery is signed "
    "with both the new and the previous secret until `previousSecretExpiresAt` (two values "
    "in `X-Service-Signature` and in `webhook-signature`, newest first), so that you deploy "
    "the new secret to your receivers at your own pace.",
    body=RotateSecretSchema,
    response=RotatedSecretSchema,
    message="Signing secret rotated; store it now, it is not shown again",
)
def rotate_webhook_secret(brand_id: str, endpoint_id: str, body: dict):
    return rotate_signing_secret(brand_id=brand_id, endpoint_id=endpoint_id, **body)


@api.post("/brand/<brand_id>/webhook/<id(whe):endpoint_id>/recover")
@authenticate(scope=WRITE)
@operation(
    operation_id="recoverWebhookDeliveries",
    tag=ENDPOINTS,
    summary="Send again what failed during an outage",
    description="Queues a new delivery (as redeliver does: same event, new delivery id) of "
    "every `failed` delivery of this endpoint created between `since` (at most 14 days ago) "
    "and `until` (default now) that was not recovered or redelivered already, in the order "
    "they were first created; deliveries of erased events (eraseSubject) are left out. They "
    "go out at the endpoint's usual pace, beside other endpoints' deliveries. Asking twice "
    "queues nothing the second time. A disabled endpoint answers NOT_FOUND: re-enable it "
    "first.",
    body=RecoverSchema,
    response=RecoveredSchema,
    status=202,
    errors=(409,),  # an event among them was erased while it ran
    message="Failed deliveries queued again",
)
def recover_webhook_deliveries(brand_id: str, endpoint_id: str, body: dict):
    return recover_failed_deliveries(brand_id=brand_id, endpoint_id=endpoint_id, **body)


@api.post("/brand/<brand_id>/webhook/<id(whe):endpoint_id>/retry-pending")
@authenticate(scope=WRITE)
@operation(
    operation_id="retryPendingWebhookDeliveries",
    tag=ENDPOINTS,
    summary="Send the deliveries waiting for a retry now",
    description="Once your receiver is fixed: every `pending` delivery of this endpoint that "
    "waits for its next retry becomes due now, instead of at its `nextRetryAt` (a receiver's "
    "`Retry-After` included), and goes out at the endpoint's usual pace (at most "
    "its `maxInFlight` at once). No delivery is duplicated: each is the same "
    "delivery, its next attempt sooner. Deliveries held behind an earlier one of their subject "
    '(`ordering: "subject"`) stay held until it ends. A disabled endpoint answers NOT_FOUND: '
    "re-enable it first.",
    response=RetriedPendingSchema,
    status=202,
    message="Waiting deliveries are due now",
)
def retry_pending_webhook_deliveries(brand_id: str, endpoint_id: str):
    due = retry_pending(brand_id=brand_id, endpoint_id=endpoint_id)
    return {"endpoint_id": endpoint_id, "due": due}


@api.delete("/brand/<brand_id>/webhook/<id(whe):endpoint_id>/delete-endpoint")
@authenticate(scope=WRITE)
@operation(
    operation_id="deleteWebhookEndpoint",
    tag=ENDPOINTS,
    summary="Delete a webhook endpoint",
    description="Its pending deliveries end as `failed`; its past deliveries stay in the log.",
    response=DeletedEndpointSchema,
    message="Webhook endpoint deleted",
)
def delete_webhook_endpoint(brand_id: str, endpoint_id: str):
    return delete_endpoint(brand_id=brand_id, endpoint_id=endpoint_id)


@api.post("/brand/<brand_id>/webhook/<id(whe):endpoint_id>/send-test")
@authenticate(scope=READ)
@operation(
    operation_id="sendWebhookTest",
    tag=ENDPOINTS,
    summary="Send a test ping to an endpoint",
    description="Queues a `webhook.test` delivery to this endpoint whatever its "
    "subscriptions. A disabled endpoint answers NOT_FOUND.",
    response=QueuedDeliverySchema,
    status=202,
    message="Test ping queued",
)
def send_webhook_test(brand_id: str, endpoint_id: str):
    return {"delivery_id": send_test_ping(brand_id=brand_id, endpoint_id=endpoint_id)}


@api.get("/brand/<brand_id>/webhook/fetch-deliveries")
@authenticate(scope=READ)
@operation(
    operation_id="fetchWebhookDeliveries",
    tag=DELIVERIES,
    summary="The delivery log",
    description="Every delivery of the brand's events, newest first unless `sortOrder=asc`; "
    "filter by status, event or endpoint. Two ways to page, both with every filter and both "
    "orders. `page` and `limit`, with `meta.total` exact up to 10,000 deliveries past the page "
    "(beyond, a lower bound with `meta.totalExact: false`): a page is found by walking the "
    "list's index up to it, so page 500 of 100 takes less than twice page 1 with a million "
    "deliveries, and each further 100,000 deliveries deep adds some 15-35 ms. Or `after`: "
    "pass `meta.nextAfter` to read the next page; each costs what the first does, and the walk "
    "never repeats a delivery nor skips one that was there when it began (with "
    "`sortOrder=asc` it also reaches those made meanwhile). `meta` then counts what follows "
    "`after`.",
    query=DeliveryQuerySchema,
    response=DeliveryListSchema,
    meta=DeliveryPageMetaSchema,
    errors=(404,),  # `after` that is not a delivery of the brand
)
def fetch_webhook_deliveries(brand_id: str, query: dict):
    return list_deliveries(brand_id=brand_id, **query)


@api.get("/brand/<brand_id>/webhook/deliveries/<id(whd):delivery_id>")
@authenticate(scope=READ)
@operation(
    operation_id="fetchWebhookDelivery",
    tag=DELIVERIES,
    summary="One delivery with its attempts and payload",
    description="Each attempt's time, duration, HTTP status, error, the first 2 KiB of the "
    "answer and the headers sent; and the exact event body.",
    response=DeliveryDetailSchema,
)
def fetch_webhook_delivery(brand_id: str, delivery_id: str):
    return get_delivery_detail(brand_id, delivery_id)


@api.post("/brand/<brand_id>/webhook/deliveries/<id(whd):delivery_id>/redeliver")
@authenticate(scope=WRITE)
@operation(
    operation_id="redeliverWebhook",
    tag=DELIVERIES,
    summary="Deliver an event again",
    description="A new delivery (new `X-Service-Delivery`) of the same event (same body and "
    "event `id`) to the same endpoint, whatever the first one's status. The endpoint must be "
    "active. An erased event (eraseSubject) is not sent again: CONFLICT.",
    response=QueuedDeliverySchema,
    status=202,
    errors=(409,),  # its event was erased
    message="Redelivery queued",
)
def redeliver_webhook(brand_id: str, delivery_id: str):
    return {"delivery_id": redeliver(brand_id=brand_id, delivery_id=delivery_id)}
