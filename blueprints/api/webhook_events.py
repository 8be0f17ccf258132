"""The OpenAPI 3.1 `webhooks` section: one entry per event name of the catalogue, each the POST a
delivery of that event makes to an endpoint. Its headers are those `services.signing` writes
(CONTRACT 6.1, 8.1 and 12.1); its body is the event's schema of `schemas.events` (the one every
publisher dumps its data through), complete and closed, with the catalogue's sample as example.
"""

from __future__ import annotations

import copy
import json
from datetime import datetime
from typing import Any

from apispec import APISpec

from models.columns import id_pattern
from models.event_catalog import EVENT_NAMES, EVENT_TYPES, sample_data
from models.event_subjects import event_subject
from schemas.events import (
    EVENT_DATA_SCHEMAS,
    event_body_schema,
    event_component_name,
)
from services.events import event_body_parts
from services.signing import (
    DELIVERY_HEADER,
    EVENT_HEADER,
    SIGNATURE_HEADER,
    STANDARD_ID_HEADER,
    STANDARD_SIGNATURE_HEADER,
    STANDARD_TIMESTAMP_HEADER,
    TIMESTAMP_HEADER,
    USER_AGENT,
)

WEBHOOK_TAG = "Webhook events"
WEBHOOK_TAG_DESCRIPTION = (
    "What the service POSTs to your endpoints: one entry per event name. How a delivery is "
    "acknowledged, retried and verified: [Webhooks](#description/webhooks), in the introduction."
)
ANY_EVENT = "WebhookEvent"
SAMPLE_EVENT_ID = "evt_01jd3kw3x5y7z9a1b3c5d7e9f1"
SAMPLE_CREATED_AT = "2026-11-20T08:15:00.000Z"
SAMPLE_BRAND_ID = "brd_01jd3k7a9b1c3d5e7f9g1h3j5k"
SAMPLE_SEQUENCE = 1
_SCHEMAS = "#/components/schemas/"
_UNIX_SECONDS = r"^[0-9]{1,12}$"
_HEX_SIGNATURE = "sha256=[0-9a-f]{64}"
_BASE64_SIGNATURE = "v1,[A-Za-z0-9+/]{43}="
_DELIVERY_ID = f"^{id_pattern('whd')}$"
_EVENT_ID = f"^{id_pattern('evt')}$"

# (name, description, schema) of each header a delivery carries; X-Service-Event's schema is
# the event's own name.
_HEADERS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    (
        TIMESTAMP_HEADER,
        "Unix seconds of this attempt. Reject a delivery whose timestamp is more than about 5 "
        "minutes away from your clock: it is inside the signature, so a replayed delivery "
        "cannot carry a fresh one.",
        {"type": "string", "pattern": _UNIX_SECONDS, "example": "1795162500"},
    ),
    (
        SIGNATURE_HEADER,
        "`sha256=` + hex HMAC-SHA256 of `{X-Service-Timestamp}.{rawBody}`, keyed with the "
        "endpoint's whole signing secret (`whsec_…`) as UTF-8 bytes. During a rotation's overlap, "
        "two, newest first, separated by `, `: accept the delivery when either matches. Compare "
        "in constant time.",
        {
            "type": "string",
            "pattern": f"^{_HEX_SIGNATURE}(, {_HEX_SIGNATURE})?$",
            "example": "sha256=5257a869e7ecebeda32affa62cdca3fa51cad7e77a0e56ff536d0ce8e108d8bd",
        },
    ),
    (EVENT_HEADER, "The event name, also `type` in the body.", {}),
    (
        DELIVERY_HEADER,
        "The delivery id: the same on every retry of this delivery, so deduplicate on it (a "
        "redelivery is a new delivery of the same event, with the body's `id` unchanged).",
        {"type": "string", "pattern": _DELIVERY_ID, "example": "whd_01jd3kt0v2w4x6y8z0a2b4c6d801"},
    ),
    (
        STANDARD_ID_HEADER,
        "Standard Webhooks' (standardwebhooks.com) message id: the event id, the body's `id`, "
        "the same on every retry, redelivery and recovery of the event (CONTRACT 12.1).",
        {"type": "string", "pattern": f"^{id_pattern('evt')}$", "example": SAMPLE_EVENT_ID},
    ),
    (
        STANDARD_TIMESTAMP_HEADER,
        "Standard Webhooks' timestamp: the same Unix seconds as `X-Service-Timestamp`.",
        {"type": "string", "pattern": _UNIX_SECONDS, "example": "1795162500"},
    ),
    (
        STANDARD_SIGNATURE_HEADER,
        "Standard Webhooks' signature: `v1,` + base64 HMAC-SHA256 of "
        "`{webhook-id}.{webhook-timestamp}.{rawBody}`, keyed with the 32 bytes the signing "
        "secret's base64 encodes (for a secret issued before that format, base62, the whole "
        "string); two, space-separated, during a rotation's overlap, each keyed by its own "
        "secret's format. `standardwebhooks.Webhook(secret).verify(body, headers)` checks it "
        "with the secret as issued (an older secret: `Webhook(secret.encode())`).",
        {
            "type": "string",
            "pattern": f"^{_BASE64_SIGNATURE}( {_BASE64_SIGNATURE})?$",
            "example": "v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4=",
        },
    ),
    (
        "User-Agent",
        "The service's delivery client.",
        {"type": "string", "enum": [USER_AGENT]},
    ),
)

_RESPONSES: dict[str, dict[str, Any]] = {
    "2XX": {
        "description": "Acknowledged within `WEBHOOK_TIMEOUT`: the delivery is `delivered` and "
        "is not sent again. The first bytes of your answer are kept in its delivery log."
    },
    "410": {
        "description": "Gone: the endpoint is disabled at once and its pending deliveries "
        "fail; re-enable it with updateWebhookEndpoint."
    },
    "429": {
        "description": "Slow down: a failed attempt whose next retry waits at least "
        "`Retry-After` (seconds or an HTTP date; at most an hour).",
        "headers": {"Retry-After": {"schema": {"type": "string"}}},
    },
    "503": {
        "description": "Unavailable: as 429, the next retry waits at least `Retry-After`.",
        "headers": {"Retry-After": {"schema": {"type": "string"}}},
    },
    "default": {
        "description": "Any other answer (a 3xx too: redirects are not followed), no answer "
        "within `WEBHOOK_TIMEOUT`, or no connection: a failed attempt, retried on "
        "`WEBHOOK_RETRY_SCHEDULE`."
    },
}


def register_event_schemas(spec: APISpec) -> None:
    """Each event's body as a named schema (`DealCompletedEvent`), for a type generator to name
    its class after."""
    for name in EVENT_NAMES:
        spec.components.schema(event_component_name(name), schema=event_body_schema(name))


def add_webhooks(document: dict[str, Any]) -> None:
    """The `webhooks` section, once the marshmallow schemas are components of `document`, and
    `WebhookEvent`: any delivery's body, told apart by `type`."""
    schemas = document["components"]["schemas"]
    for name in EVENT_NAMES:
        component = schemas[event_component_name(name)]
        component["example"] = sample_body(name)
        _require_every_field(component, schemas, set())
    for name, data_schema in EVENT_DATA_SCHEMAS.items():
        data = schemas[_component_of(data_schema.__name__)]
        data.setdefault("example", sample_data(name))
    schemas[ANY_EVENT] = {
        "description": "The body of any delivery, by its `type`: one schema per event name.",
        "oneOf": [{"$ref": _SCHEMAS + event_component_name(name)} for name in EVENT_NAMES],
        "discriminator": {
            "propertyName": "type",
            "mapping": {name: _SCHEMAS + event_component_name(name) for name in EVENT_NAMES},
        },
    }
    document["webhooks"] = {name: {"post": _delivery(name)} for name in EVENT_NAMES}


def sample_body(name: str, brand_id: str = SAMPLE_BRAND_ID) -> dict[str, Any]:
    """A delivery's body of the event `name` with the catalogue's sample data, written by the
    publisher's own code: the first event of its subject."""
    data = sample_data(name)
    head, tail = event_body_parts(
        event_id=SAMPLE_EVENT_ID,
        name=name,
        brand_id=brand_id,
        now=datetime.fromisoformat(SAMPLE_CREATED_AT),
        subject=event_subject(name, data, event_id=SAMPLE_EVENT_ID),
        data=data,
        sequence=SAMPLE_SEQUENCE,
    )
    return json.loads(head + tail)


def _delivery(name: str) -> dict[str, Any]:
    component = event_component_name(name)
    return {
        "operationId": component[:1].lower() + component[1:],
        "summary": name,
        "description": f"{EVENT_TYPES[name].description}\n\nHow deliveries are acknowledged, "
        "retried and verified: [Webhooks](#description/webhooks), in the introduction.",
        "tags": [WEBHOOK_TAG],
        "parameters": [
            {
                "in": "header",
                "name": header,
                "required": True,
                "description": description,
                "schema": copy.deepcopy(schema) or {"type": "string", "const": name},
            }
            for header, description, schema in _HEADERS
        ],
        "requestBody": {
            "required": True,
            "description": f"The `{name}` event, as JSON.",
            "content": {
                "application/json": {
                    "schema": {"$ref": _SCHEMAS + component},
                    "example": sample_body(name),
                }
            },
        },
        "responses": copy.deepcopy(_RESPONSES),
    }


def delivery_headers() -> list[tuple[str, str]]:
    """(name, description) of each header of a delivery, for the introduction's table."""
    return [(header, description) for header, description, _schema in _HEADERS]


def _component_of(class_name: str) -> str:
    return class_name.removesuffix("Schema")


def _require_every_field(schema: dict[str, Any], schemas: dict[str, Any], seen: set[str]) -> None:
    """A publisher writes every field of an event, null when it has no value: each object the
    body reaches lists all its properties as `required` (and, a marshmallow schema refusing
    unknown fields, `additionalProperties: false` already closes it)."""
    ref = schema.get("$ref", "")
    if ref.startswith(_SCHEMAS):
        name = ref.removeprefix(_SCHEMAS)
        if name not in seen:
            seen.add(name)
            _require_every_field(schemas[name], schemas, seen)
        return
    if "properties" in schema:
        schema["required"] = list(schema["properties"])
    for nested in (*schema.get("properties", {}).values(), *schema.get("anyOf", [])):
        _require_every_field(nested, schemas, seen)
    if isinstance(schema.get("items"), dict):
        _require_every_field(schema["items"], schemas, seen)
