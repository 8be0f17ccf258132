"""The delivery request as an OpenAPI callback of registerWebhookEndpoint: the five headers of
CONTRACT 6.1, the body schema, and one example body per event name from the catalogue."""

from __future__ import annotations

from models.event_catalog import EVENT_TYPES, sample_data
from schemas.webhooks import WebhookEventBodySchema
from services.events import API_VERSION
from services.signing import DELIVERY_HEADER, EVENT_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER

_HEADERS = (
    (TIMESTAMP_HEADER, "Unix seconds of this attempt; reject values older than about 5 minutes."),
    (
        SIGNATURE_HEADER,
        "`sha256=` + hex HMAC-SHA256 of `{X-Service-Timestamp}.{rawBody}` keyed with the "
        "endpoint's signing secret. Compare in constant time with your own computation.",
    ),
    (EVENT_HEADER, "The event name, also `type` in the body."),
    (
        DELIVERY_HEADER,
        "The delivery id: the same on every retry of this delivery, so deduplicate on it.",
    ),
)

DELIVERY_DESCRIPTION = """\
Each event your endpoint subscribes to is POSTed to its URL as JSON. Answer with any 2xx within
WEBHOOK_TIMEOUT (10 s by default) to acknowledge it; anything else (3xx included: redirects are
not followed), a timeout or a connection error is a failed attempt. Retries follow
WEBHOOK_RETRY_SCHEDULE (by default 5 s, 5 min, 30 min, 2 h, 5 h, 10 h and 10 h after the previous
attempt, ±10%). An endpoint whose attempts keep failing (by default at least 15 in a row over
three days) is disabled and its pending deliveries fail; re-enable it with update-endpoint.

Deliveries are at least once: verify the signature, then deduplicate on `X-Service-Delivery`."""


def delivery_callback() -> dict:
    examples = {
        name: {
            "summary": event.description,
            "value": {
                "id": "evt_01jd3kw3x5y7z9a1b3c5d7e9f1",
                "type": name,
                "createdAt": "2026-11-20T08:15:00.000Z",
                "brandId": "brd_01jd3k7a9b1c3d5e7f9g1h3j5k",
                "apiVersion": API_VERSION,
                "data": sample_data(name),
            },
        }
        for name, event in EVENT_TYPES.items()
    }
    return {
        "webhookDelivery": {
            "{$request.body#/url}": {
                "post": {
                    "summary": "A webhook delivery to your endpoint",
                    "description": DELIVERY_DESCRIPTION,
                    "parameters": [
                        {
                            "in": "header",
                            "name": name,
                            "required": True,
                            "schema": {"type": "string"},
                            "description": description,
                        }
                        for name, description in _HEADERS
                    ],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": WebhookEventBodySchema,
                                "examples": examples,
                            }
                        },
                    },
                    "responses": {
                        "2XX": {"description": "Acknowledged: the delivery is `delivered`."},
                        "default": {"description": "A failed attempt; it will be retried."},
                    },
                }
            }
        }
    }
