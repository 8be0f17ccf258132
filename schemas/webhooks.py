"""Webhook endpoint and delivery requests and responses (SPEC sections 2 and 4, CONTRACT 4)."""

from __future__ import annotations

from marshmallow import fields, validate

from models.event_catalog import DEFAULT_SUBSCRIPTION, EVENT_NAMES
from models.webhook_delivery import (
    DELIVERY_STATUSES,
    RESPONSE_BODY_MAX_BYTES,
    RESPONSE_HEADER_MAX_CHARS,
    RESPONSE_HEADERS_MAX,
)
from models.webhook_endpoint import (
    DESCRIPTION_MAX_LENGTH,
    MAX_CAMPAIGN_FILTER,
    MAX_IN_FLIGHT_RANGE,
    MAX_OVERLAP_SECONDS,
    NO_ORDERING,
    ORDERINGS,
    URL_MAX_LENGTH,
)
from schemas.base import (
    ApiSchema,
    JsonBoolean,
    JsonInteger,
    OptionalText,
    QueryBoolean,
    ResourceId,
    Timestamp,
)
from schemas.envelope import PageMetaSchema, SortedPageQuerySchema

ENDPOINT_ID_EXAMPLE = "whe_01jd3kr7s9t1v3w5x7y9z1a3b5"
DELIVERY_ID_EXAMPLE = "whd_01jd3kt0v2w4x6y8z0a2b4c6d8"
SECRET_EXAMPLE = "whsec_9Tq2…"  # noqa: S105 - a truncated example
# What a signing secret is and keys (CONTRACT 6.1 and 12.1), said once for register and rotate.
_SIGNING_KEY_FORMAT = (
    "`whsec_` + base64 of 32 random bytes, as Standard Webhooks has it: its libraries take it "
    "as it is (`Webhook(signingSecret)`) and key `webhook-signature` with the decoded bytes; "
    "`X-Service-Signature` is keyed with the whole string as UTF-8. A secret issued before "
    "this format (`whsec_` + 38 base62 characters) keys both with the whole string until the "
    "endpoint's secret is rotated. Shown this once: store it now."
)
_DEFAULT_EVENTS = ", ".join(f"`{name}`" for name in DEFAULT_SUBSCRIPTION)


class EndpointUrl(fields.String):
    """A receiver URL. Its `pattern` depends on the environment's URL policy, so the OpenAPI
    document asks `services.endpoint_urls.url_pattern` for it when it is built."""


def _url_field(**options) -> fields.String:
    return EndpointUrl(
        validate=validate.Length(min=1, max=URL_MAX_LENGTH),
        metadata={
            "description": "The receiver. HTTPS, resolving to a public address; outside "
            "production also `http://localhost` and `http://127.0.0.1` on any port. At most "
            "2048 characters, no `user:password@`.",
            "example": "https://hooks.example.com/brand-api",
        },
        **options,
    )


def _events_field(description: str, **options) -> fields.List:
    return fields.List(
        fields.String(
            validate=validate.Length(min=1, max=64),
            # An event name, or any other name, which is dropped (SPEC registration rule 2).
            metadata={"anyOf": [{"enum": list(EVENT_NAMES)}, {}]},
        ),
        validate=validate.Length(max=len(EVENT_NAMES) * 2),
        metadata={
            "description": description,
            "example": ["deal.completed", "conversion.recorded", "escrow.released"],
            # At least one name is an event name: if every one is dropped, the request fails
            # (`services.webhook_endpoints.resolve_subscription`).
            "contains": {"enum": list(EVENT_NAMES)},
        },
        **options,
    )


def _description_field(description: str, **options) -> OptionalText:
    return OptionalText(
        max_length=DESCRIPTION_MAX_LENGTH,
        metadata={"description": description, "example": "Orders service, production"},
        **options,
    )


def _dropped_events_field() -> fields.List:
    return fields.List(
        fields.String(),
        metadata={
            "description": "The names in the request's `events` that are not supported and "
            "were dropped, each once, in the order given; empty when none (or when `events` "
            "was not sent). A misspelt name shows here instead of going unnoticed.",
            "example": [],
        },
    )


_ORDERING_HELP = (
    '`"none"`: deliveries start as soon as they are due, several at once, so a subject\'s '
    "events may arrive out of order. `\"subject\"`: a subject's events (a deal's, a "
    "campaign's: the body's `subject`) arrive one after another in `sequence` order; the next "
    "goes once the one before it has ended (delivered, or failed after its last retry), while "
    "other subjects' events flow at full speed. Applies to events published from then on; "
    'turning it back to `"none"` sends every held delivery at once.'
)
_CAMPAIGNS_HELP = (
    "Only events of these campaigns of the brand: a deal's events, the campaign's own, and "
    "conversions attributed to one of its links (`webhook.*` events always pass). At most "
    f"{MAX_CAMPAIGN_FILTER}; empty means every campaign's events, and events of no campaign "
    "(`verification.completed`, an unattributed conversion) too. An id that is not one of the "
    "brand's campaigns is a VALIDATION_ERROR naming it."
)


class CampaignFilter(fields.List):
    """An endpoint's campaign filter as the API shows it: the ids, or `[]` for every campaign
    (the model's null), so that a client reads one type."""

    def _serialize(self, value, attr, obj, **kwargs):
        return [] if value is None else super()._serialize(value, attr, obj, **kwargs)


_MAX_IN_FLIGHT_HELP = (
    "How many attempts to this endpoint may be on the wire at once, across all the service's "
    f"workers ({MAX_IN_FLIGHT_RANGE[0]}-{MAX_IN_FLIGHT_RANGE[1]}): 1 for a receiver that "
    "handles one request at a time, more for one that scales out. While the endpoint keeps "
    "failing it is probed with one attempt at a time whatever this says."
)
_TRACE_CONTEXT_HELP = (
    "`true`: every attempt carries a W3C `traceparent` header (`00-<trace id>-<span id>-"
    "<flags>`), the attempt being the parent of your receiver's handling of it; its trace is "
    "the one of the API request that published the event, when that request came with a "
    "`traceparent` of its own. The attempt's `requestHeaders` show it. `false`: no attempt "
    "carries `traceparent` or `tracestate`."
)


def _max_in_flight_field(description: str, **options) -> JsonInteger:
    return JsonInteger(
        allow_none=True,
        validate=validate.Range(*MAX_IN_FLIGHT_RANGE),
        metadata={"description": description, "example": 5},
        **options,
    )


def _trace_context_field(description: str, **options) -> JsonBoolean:
    return JsonBoolean(metadata={"description": description, "example": True}, **options)


def _ordering_field(description: str, **options) -> fields.String:
    return fields.String(
        validate=validate.OneOf(ORDERINGS),
        metadata={"description": description, "example": "subject"},
        **options,
    )


def _campaign_ids_field(description: str, **options) -> fields.List:
    return fields.List(
        ResourceId("cmp", "campaign"),
        validate=validate.Length(max=MAX_CAMPAIGN_FILTER),
        metadata={"description": description, "example": []},
        **options,
    )


def _previous_secret_field() -> Timestamp:
    return Timestamp(
        attribute="previous_secret_until",
        allow_none=True,
        metadata={
            "description": "Until when the secret before the current one also signs each "
            "delivery (a rotation's overlap); null when only the current one does."
        },
    )


class EndpointRegisterSchema(ApiSchema):
    url = _url_field(required=True)
    events = _events_field(
        f"Event names to subscribe to. Unsupported names are dropped (the answer lists them in "
        f"`droppedEvents`); if none is left the request fails. Default {_DEFAULT_EVENTS}.",
        load_default=None,
    )
    description = _description_field(
        "Your own note to tell endpoints apart (two endpoints may share a URL). At most "
        f"{DESCRIPTION_MAX_LENGTH} characters, no control characters; surrounding spaces are "
        "trimmed, and empty means none.",
        load_default=None,
    )
    ordering = _ordering_field(
        f"Default `{NO_ORDERING}`. " + _ORDERING_HELP, load_default=NO_ORDERING
    )
    campaign_ids = _campaign_ids_field(
        _CAMPAIGNS_HELP + " Default: every campaign.", load_default=None, allow_none=True
    )
    max_in_flight = _max_in_flight_field(
        _MAX_IN_FLIGHT_HELP + " Default (absent or `null`): the service's "
        "`WEBHOOK_ENDPOINT_CONCURRENCY`.",
        load_default=None,
    )
    trace_context = _trace_context_field(
        _TRACE_CONTEXT_HELP + " Default `false`.", load_default=False
    )


class EndpointUpdateSchema(ApiSchema):
    min_fields = 1

    url = _url_field()
    events = _events_field("Replaces the subscription; same rules as registration.")
    description = _description_field(
        'Replaces the description; `null` or `""` removes it. Same rules as registration.'
    )
    is_active = JsonBoolean(
        metadata={
            "description": "`true` re-enables a disabled endpoint and resets "
            "`consecutiveFailures`; `false` disables it and fails its pending deliveries."
        }
    )
    ordering = _ordering_field("Replaces the ordering. " + _ORDERING_HELP)
    campaign_ids = _campaign_ids_field(
        "Replaces the campaign filter; `[]` or `null` removes it. " + _CAMPAIGNS_HELP,
        allow_none=True,
    )
    max_in_flight = _max_in_flight_field(
        "Replaces the limit; `null` returns to the service's `WEBHOOK_ENDPOINT_CONCURRENCY`. "
        + _MAX_IN_FLIGHT_HELP
    )
    trace_context = _trace_context_field("Replaces the choice. " + _TRACE_CONTEXT_HELP)


class EndpointSchema(ApiSchema):
    id = fields.String(metadata={"example": ENDPOINT_ID_EXAMPLE})
    url = fields.String(metadata={"example": "https://hooks.example.com/brand-api"})
    description = fields.String(
        allow_none=True,
        metadata={
            "description": "The brand's note on the endpoint, or null.",
            "example": "Orders service, production",
        },
    )
    events = fields.List(
        fields.String(validate=validate.OneOf(EVENT_NAMES)),
        metadata={"example": list(DEFAULT_SUBSCRIPTION)},
    )
    is_active = fields.Boolean(
        metadata={"description": "False once disabled (by failures or by update-endpoint)."}
    )
    consecutive_failures = fields.Integer(
        metadata={"description": "Failed attempts in a row; a success resets it."}
    )
    disabled_at = Timestamp(allow_none=True)
    disabled_reason = fields.String(
        allow_none=True, metadata={"description": "Why the endpoint was disabled."}
    )
    ordering = fields.String(
        validate=validate.OneOf(ORDERINGS),
        metadata={
            "description": '`"subject"`: each subject\'s events arrive one after another; '
            '`"none"`: as soon as they are due.',
            "example": NO_ORDERING,
        },
    )
    campaign_ids = CampaignFilter(
        fields.String(),
        metadata={
            "description": "The campaigns whose events it receives (`webhook.*` always); "
            "empty: every campaign's, and events of none.",
            "example": [],
        },
    )
    max_in_flight = fields.Integer(
        allow_none=True,
        metadata={
            "description": "Its own limit of attempts on the wire at once, across all "
            "workers; null when it has none and the service's `WEBHOOK_ENDPOINT_CONCURRENCY` "
            "applies.",
            "example": 5,
        },
    )
    trace_context = fields.Boolean(
        metadata={
            "description": "Each attempt carries a W3C `traceparent` header.",
            "example": False,
        }
    )
    previous_secret_expires_at = _previous_secret_field()
    created_at = Timestamp()


class IssuedEndpointSchema(EndpointSchema):
    """registerWebhookEndpoint: the endpoint, once its signing secret, and what was dropped."""

    signing_secret = fields.String(
        metadata={
            "description": "The signing secret: " + _SIGNING_KEY_FORMAT,
            "example": SECRET_EXAMPLE,
        }
    )
    dropped_events = _dropped_events_field()


class UpdatedEndpointSchema(EndpointSchema):
    """updateWebhookEndpoint: the endpoint as it is now, and what was dropped."""

    dropped_events = _dropped_events_field()


class RotateSecretSchema(ApiSchema):
    overlap_seconds = JsonInteger(
        load_default=0,
        validate=validate.Range(min=0, max=MAX_OVERLAP_SECONDS),
        metadata={
            "description": "How long the secret being replaced goes on signing beside the new "
            f"one, in seconds (0-{MAX_OVERLAP_SECONDS}, a week). 0, the default: the new "
            "secret alone signs from the next attempt on.",
            "example": 86400,
        },
    )


class RotatedSecretSchema(ApiSchema):
    id = fields.String(metadata={"example": ENDPOINT_ID_EXAMPLE})
    signing_secret = fields.String(
        metadata={
            "description": "The new signing secret: " + _SIGNING_KEY_FORMAT,
            "example": SECRET_EXAMPLE,
        }
    )
    previous_secret_expires_at = _previous_secret_field()


class RecoverSchema(ApiSchema):
    since = fields.AwareDateTime(
        required=True,
        metadata={
            "description": "Recover failed deliveries created from this moment (ISO 8601 with "
            "its offset or `Z`; at most 14 days ago).",
            "example": "2026-11-20T08:00:00Z",
        },
    )
    until = fields.AwareDateTime(
        load_default=None,
        metadata={
            "description": "…and before this one (default: now).",
            "example": "2026-11-20T11:30:00Z",
        },
    )


class RecoveredSchema(ApiSchema):
    endpoint_id = fields.String(metadata={"example": ENDPOINT_ID_EXAMPLE})
    queued = fields.Integer(
        metadata={
            "description": "How many failed deliveries were queued again, each as a new "
            "delivery of the same event; 0 when there was nothing left to recover.",
            "example": 42,
        }
    )


class RetriedPendingSchema(ApiSchema):
    endpoint_id = fields.String(metadata={"example": ENDPOINT_ID_EXAMPLE})
    due = fields.Integer(
        metadata={
            "description": "How many of its pending deliveries that were waiting for a retry "
            "are due now; 0 when none was waiting.",
            "example": 12,
        }
    )


def _success_rate_field(description: str, **options) -> fields.Float:
    return fields.Float(
        allow_none=True,
        validate=validate.Range(min=0, max=1),
        metadata={"description": description, "example": 0.9875},
        **options,
    )


class ListedEndpointSchema(EndpointSchema):
    """An endpoint in fetch-endpoints, with its health over the last 24 hours (CONTRACT 8.4)."""

    success_rate_24h = _success_rate_field(
        "Its attempts of the last 24 hours that succeeded, retries included, as a share "
        "(0-1); null when there was none.",
        data_key="successRate24h",
    )
    last_success_at = Timestamp(
        allow_none=True,
        metadata={"description": "Its last successful attempt in the last 24 hours, or null."},
    )


class EndpointListSchema(ApiSchema):
    endpoints = fields.List(fields.Nested(ListedEndpointSchema))


class DeliveryCountsSchema(ApiSchema):
    pending = fields.Integer(metadata={"example": 2})
    delivered = fields.Integer(metadata={"example": 311})
    failed = fields.Integer(metadata={"example": 4})


class DurationPercentilesSchema(ApiSchema):
    p50 = fields.Integer(allow_none=True, metadata={"example": 84})
    p95 = fields.Integer(allow_none=True, metadata={"example": 412})


class EndpointStatsSchema(ApiSchema):
    """getWebhookEndpointStats: an endpoint's last 24 hours (CONTRACT 8.4)."""

    endpoint_id = fields.String(metadata={"example": ENDPOINT_ID_EXAMPLE})
    window_start = Timestamp(metadata={"description": "24 hours before `windowEnd`."})
    window_end = Timestamp(metadata={"description": "When the figures were read."})
    deliveries = fields.Nested(
        DeliveryCountsSchema,
        metadata={
            "description": "Its deliveries created in the window, by their status now "
            "(`pending` includes those retrying)."
        },
    )
    success_rate = _success_rate_field(
        "Its attempts in the window that succeeded, retries included, as a share (0-1); null "
        "when there was none."
    )
    attempt_duration_ms = fields.Nested(
        DurationPercentilesSchema,
        metadata={
            "description": "How long its attempts in the window took, from sending to the end "
            "of the answer (or the timeout): median and 95th percentile; null without any."
        },
    )
    last_success_at = Timestamp(
        allow_none=True, metadata={"description": "Its last successful attempt in the window."}
    )
    last_failure_at = Timestamp(
        allow_none=True, metadata={"description": "Its last failed attempt in the window."}
    )


class DeletedEndpointSchema(ApiSchema):
    id = fields.String(metadata={"example": ENDPOINT_ID_EXAMPLE})


class QueuedDeliverySchema(ApiSchema):
    delivery_id = fields.String(
        metadata={
            "description": "Follow it with fetchWebhookDelivery.",
            "example": DELIVERY_ID_EXAMPLE,
        }
    )


class DeliverySchema(ApiSchema):
    id = fields.String(metadata={"example": DELIVERY_ID_EXAMPLE})
    endpoint_id = fields.String(metadata={"example": ENDPOINT_ID_EXAMPLE})
    event_id = fields.String(
        metadata={
            "description": "The event's id, also `id` in the body; the same on redeliveries.",
            "example": "evt_01jd3kw3x5y7z9a1b3c5d7e9f1",
        }
    )
    event_name = fields.String(
        validate=validate.OneOf(EVENT_NAMES), metadata={"example": "deal.completed"}
    )
    status = fields.String(
        validate=validate.OneOf(DELIVERY_STATUSES),
        metadata={
            "description": "`pending` until an attempt succeeds (`delivered`), or the last "
            "retry fails or the endpoint is disabled or deleted (`failed`)."
        },
    )
    retrying = fields.Boolean(
        attribute="is_retrying",
        metadata={
            "description": "True while the delivery is `pending` after a failed attempt: its "
            "endpoint is failing, and the next attempt is at `nextRetryAt`. It stays `pending` "
            "through the whole retry schedule (about 27 hours by default) and only then turns "
            "`failed`, so look for this, not `status=failed`, to see deliveries failing now.",
            "example": False,
        },
    )
    http_status = fields.Integer(
        allow_none=True, metadata={"description": "The receiver's answer to the last attempt."}
    )
    attempt_count = fields.Integer()
    last_error = fields.String(allow_none=True)
    delivered_at = Timestamp(allow_none=True)
    next_retry_at = Timestamp(
        allow_none=True, metadata={"description": "When the next retry is due, if any."}
    )
    held_behind = fields.String(
        allow_none=True,
        metadata={
            "description": "For an endpoint that orders by subject: the id of the earlier "
            "delivery of the same subject this `pending` one waits for (it is not attempted "
            "until that one is `delivered` or `failed`). Null for every other delivery.",
            "example": None,
        },
    )
    created_at = Timestamp()


class DeliveryListSchema(ApiSchema):
    deliveries = fields.List(fields.Nested(DeliverySchema), attribute="items")


class OwnAttributes(fields.Nested):
    """A nested object made of the parent's own attributes (`timings` groups four columns)."""

    def get_value(self, obj, attr, accessor=None, default=None):
        return obj


def _step_ms(description: str) -> fields.Integer:
    return fields.Integer(
        allow_none=True,
        metadata={"description": f"{description}, in milliseconds; null when it did not happen."},
    )


class AttemptTimingsSchema(ApiSchema):
    """Where an attempt's time went; the rest of `durationMs` is sending the request and
    reading the answer."""

    dns_ms = _step_ms("Looking up the host's address (none for an address in the URL)")
    connect_ms = _step_ms(
        "The TCP connect (none when a kept-alive connection to the receiver was reused)"
    )
    tls_ms = _step_ms("The TLS handshake (none over http, or on a reused connection)")
    first_byte_ms = _step_ms(
        "From the request sent to the first byte of the answer (none without an answer)"
    )


class AttemptSchema(ApiSchema):
    attempt_number = fields.Integer(metadata={"description": "From 1."})
    requested_at = Timestamp()
    duration_ms = fields.Integer()
    http_status = fields.Integer(allow_none=True)
    error = fields.String(allow_none=True)
    response_body = fields.String(
        allow_none=True,
        metadata={"description": f"The first {RESPONSE_BODY_MAX_BYTES} bytes of the answer."},
    )
    request_headers = fields.Dict(
        keys=fields.String(),
        values=fields.String(),
        metadata={
            "description": "The headers this attempt sent, as sent (`Host`, `Content-Length` "
            "and `User-Agent` among them), signatures included: they are HMACs, not the secret."
        },
    )
    remote_address = fields.String(
        allow_none=True,
        metadata={
            "description": "The IP address the attempt connected to; null when it connected "
            "nowhere (refused before, or the name did not resolve).",
            "example": "203.0.113.7",
        },
    )
    timings = OwnAttributes(AttemptTimingsSchema)
    response_headers = fields.Dict(
        keys=fields.String(),
        values=fields.String(),
        allow_none=True,
        metadata={
            "description": f"The receiver's answer's headers: at most {RESPONSE_HEADERS_MAX}, "
            f"each value at most {RESPONSE_HEADER_MAX_CHARS} characters, control characters "
            "replaced; null when no answer came.",
            "example": {"Content-Type": "application/json", "Server": "nginx"},
        },
    )


class DeliveryDetailSchema(DeliverySchema):
    attempts = fields.List(fields.Nested(AttemptSchema))
    payload = fields.Dict(
        metadata={
            "description": "The event body sent: `id`, `type`, `createdAt`, `brandId`, "
            "`apiVersion` and `data`."
        }
    )


class DeliveryQuerySchema(SortedPageQuerySchema):
    after = ResourceId(
        "whd",
        "delivery",
        metadata={
            "description": "Only the deliveries after this one in the list's order (newest "
            "first: older ones; with `sortOrder=asc`: newer ones), with the same filters: pass "
            "`meta.nextAfter` of the previous answer to read the next page. Unlike `page`, the "
            "walk neither skips nor repeats a delivery when new ones arrive meanwhile, and "
            "each page costs what the first does. `page` then pages through what follows "
            "`after` (leave it at 1). An id of a delivery that retention has deleted goes on "
            "from when it was made, with `meta.cursorExpired: true`; any other id that is not "
            "a delivery of this brand is NOT_FOUND.",
            "example": DELIVERY_ID_EXAMPLE,
        },
    )
    status = fields.String(validate=validate.OneOf(DELIVERY_STATUSES))
    retrying = QueryBoolean(
        metadata={
            "description": "`true`: only deliveries still `pending` after a failed attempt "
            "(their endpoint is failing now); `false`: every other delivery."
        }
    )
    event_name = fields.String(validate=validate.OneOf(EVENT_NAMES))
    event_id = ResourceId(
        "evt",
        "event",
        metadata={
            "description": "Only the deliveries of this event (`evt_…`, the `id` of an event's "
            "body): one per endpoint it reached, and its redeliveries."
        },
    )
    endpoint_id = fields.String(
        validate=validate.Length(min=1, max=64),
        metadata={"description": "Only this endpoint's deliveries."},
    )


class DeliveryPageMetaSchema(PageMetaSchema):
    """The log's paging (CONTRACT section 3) and its cursor, as the events feed has one."""

    next_after = fields.String(
        allow_none=True,
        metadata={
            "description": "Pass it as `after` for the next page: the last delivery listed, or "
            "`after` itself when none came (null when neither). Following it walks the list "
            "to its end, each delivery once.",
            "example": DELIVERY_ID_EXAMPLE,
        },
    )
    cursor_expired = fields.Boolean(
        metadata={
            "description": "True when `after` was a delivery retention has deleted: the list "
            "goes on from when it was made.",
            "example": False,
        }
    )
