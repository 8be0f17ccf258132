"""Event bodies (SPEC section 6, CONTRACT 6.1 and 8.5): one marshmallow schema for the `data` of
each event name, and the body around it.

Every publisher dumps an event's `data` through `event_data`, and the OpenAPI document's
`webhooks` section is generated from these same schemas, so what a receiver is told it gets and
what it gets cannot differ. A record's event carries it as the read API returns it (the read
routes' schema), plus the fields that say what changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from types import MappingProxyType
from typing import Any

from marshmallow import Schema, ValidationError, fields, validate

from models.brand import KYB_OUTCOMES
from models.campaign import BUDGET_THRESHOLDS, CAMPAIGN_STATUSES
from models.columns import id_pattern
from models.deal import DEAL_STATUSES, DISPUTE_OUTCOMES
from models.event_catalog import API_VERSION, EVENT_NAMES, EVENT_TYPES
from models.event_subjects import (
    BRAND,
    CAMPAIGN,
    CONVERSION,
    DEAL,
    ENDPOINT,
    subject_type_of,
)
from models.webhook_delivery import LAST_ATTEMPT_BODY_CHARS
from schemas.base import ApiSchema, Timestamp, camelcase, currency_field, money
from schemas.campaigns import CAMPAIGN_ID_EXAMPLE, CampaignSchema
from schemas.conversions import ConversionSchema
from schemas.deals import DEAL_ID_EXAMPLE, DealSchema
from schemas.escrow_holds import EscrowHoldSchema
from schemas.placements import PlacementSchema

ENDPOINT_ID_EXAMPLE = "whe_01jd3kr7s9t1v3w5x7y9z1a3b5"
DELIVERY_ID_EXAMPLE = "whd_01jd3kt0v2w4x6y8z0a2b4c6d8"
EVENT_ID_EXAMPLE = "evt_01jd3kw3x5y7z9a1b3c5d7e9f1"


class CampaignCancelledSchema(CampaignSchema):
    previous_status = fields.String(
        validate=validate.OneOf(CAMPAIGN_STATUSES),
        metadata={"description": "The status it was cancelled from.", "example": "active"},
    )


class CampaignBudgetThresholdSchema(CampaignSchema):
    threshold_percent = fields.Integer(
        validate=validate.OneOf(BUDGET_THRESHOLDS),
        metadata={
            "description": "The share of `budgetMinor` that `spentMinor` has just reached or "
            "passed; each is announced once per campaign.",
            "example": 80,
        },
    )


class DealStatusChangeSchema(DealSchema):
    previous_status = fields.String(
        validate=validate.OneOf(DEAL_STATUSES),
        metadata={"description": "The status the deal had before.", "example": "in_progress"},
    )


class PlacementMetricsSchema(PlacementSchema):
    previous_clicks = fields.Integer(
        validate=validate.Range(min=0),
        metadata={"description": "`clicks` as last measured before.", "example": 1842},
    )


class ContentSchema(ApiSchema):
    """Content a creator submitted for the brand's approval (a record of the platform's only)."""

    id = fields.String(
        metadata={"description": "Content id.", "example": "cnt_01jd3kd2f4g6h8j0k2m4n6p8q0"}
    )
    deal_id = fields.String(
        metadata={"description": "The deal it was made for.", "example": DEAL_ID_EXAMPLE}
    )
    campaign_id = fields.String(
        metadata={"description": "The deal's campaign.", "example": CAMPAIGN_ID_EXAMPLE}
    )
    kind = fields.String(
        metadata={
            "description": "What was submitted, as the platform names it.",
            "example": "video",
        }
    )
    caption = fields.String(
        allow_none=True, metadata={"description": "The creator's caption, or null."}
    )
    submitted_at = Timestamp(metadata={"description": "When the creator submitted it."})


class KybVerificationSchema(ApiSchema):
    brand_id = fields.String(
        metadata={"description": "The brand verified.", "example": "brd_01jd3k7a9b1c3d5e7f9g1h3j5k"}
    )
    kyb_status = fields.String(
        validate=validate.OneOf(KYB_OUTCOMES),
        metadata={"description": "How it finished; also the workspace's `kybStatus` now."},
    )
    completed_at = Timestamp(metadata={"description": "When it finished."})


class DisputeResolutionSchema(ApiSchema):
    """How a dispute on a deal was decided; its escrow and deal events follow."""

    deal_id = fields.String(
        metadata={"description": "The disputed deal.", "example": DEAL_ID_EXAMPLE}
    )
    campaign_id = fields.String(
        metadata={"description": "The deal's campaign.", "example": CAMPAIGN_ID_EXAMPLE}
    )
    outcome = fields.String(
        validate=validate.OneOf(DISPUTE_OUTCOMES),
        metadata={
            "description": "`creator`: the held escrow is released and the deal completes; "
            "`brand`: it is refunded and the deal is cancelled; `split`: half each, and the "
            "deal completes."
        },
    )
    released_minor = money("Released to the creator.")
    refunded_minor = money("Refunded to the brand.")
    currency = currency_field()
    resolved_at = Timestamp(metadata={"description": "When it was decided."})


class EndpointPingSchema(ApiSchema):
    """`webhook.test`: sent by send-test to one endpoint, whatever its subscriptions."""

    endpoint_id = fields.String(
        metadata={
            "description": "The endpoint the test was sent to.",
            "example": ENDPOINT_ID_EXAMPLE,
        }
    )
    message = fields.String(metadata={"description": "A sentence for people; not for automation."})


class LastAttemptSchema(ApiSchema):
    """The attempt that made an operational event (CONTRACT 13.4): why, without the dashboard."""

    delivery_id = fields.String(
        metadata={
            "description": "Its delivery; fetchWebhookDelivery has every attempt of it.",
            "example": DELIVERY_ID_EXAMPLE,
        }
    )
    event_id = fields.String(
        metadata={"description": "The event it carried.", "example": EVENT_ID_EXAMPLE}
    )
    event_type = fields.String(
        validate=validate.OneOf(EVENT_NAMES),
        metadata={"description": "That event's name.", "example": "conversion.recorded"},
    )
    http_status = fields.Integer(
        allow_none=True,
        metadata={
            "description": "The receiver's HTTP status; null when no answer came (a timeout, "
            "a refused connection).",
            "example": 503,
        },
    )
    error = fields.String(
        allow_none=True,
        metadata={
            "description": "What went wrong, in the delivery log's words; null when nothing "
            "did (never, for these events).",
            "example": "HTTP 503",
        },
    )
    response_body = fields.String(
        allow_none=True,
        metadata={
            "description": f"The first {LAST_ATTEMPT_BODY_CHARS:,} characters of the answer's "
            "body as the delivery log keeps it; null when no answer came.",
            "example": "upstream unavailable",
        },
    )


class EndpointHealthSchema(ApiSchema):
    """An operational event about one of the brand's endpoints (CONTRACT 8.5)."""

    endpoint_id = fields.String(
        metadata={"description": "The endpoint it is about.", "example": ENDPOINT_ID_EXAMPLE}
    )
    url = fields.String(
        metadata={
            "description": "That endpoint's URL.",
            "example": "https://hooks.example.com/brand-api",
        }
    )
    consecutive_failures = fields.Integer(
        validate=validate.Range(min=0),
        metadata={"description": "Its failed attempts in a row.", "example": 15},
    )
    last_error = fields.String(
        allow_none=True,
        metadata={"description": "What its last attempt met (`HTTP 503`, a timeout), or null."},
    )
    disabled_at = Timestamp(
        allow_none=True,
        metadata={"description": "When it was disabled; null while it is only failing."},
    )
    last_attempt = fields.Nested(
        LastAttemptSchema,
        allow_none=True,
        metadata={
            "description": "The failed attempt that made this event; null only when the "
            "service's operators disabled the endpoint by hand."
        },
    )


_DEAL_EVENTS = (
    "deal.accepted",
    "deal.declined",
    "deal.expired",
    "deal.status_changed",
    "deal.completed",
    "deal.cancelled",
    "deal.disputed",
)
# The schema of each event's `data`, for every name of the catalogue (tests hold the two equal).
EVENT_DATA_SCHEMAS: Mapping[str, type[ApiSchema]] = MappingProxyType(
    {
        "campaign.published": CampaignSchema,
        "campaign.completed": CampaignSchema,
        "campaign.cancelled": CampaignCancelledSchema,
        "campaign.budget_threshold": CampaignBudgetThresholdSchema,
        **dict.fromkeys(_DEAL_EVENTS, DealStatusChangeSchema),
        "content.submitted": ContentSchema,
        "placement.submitted": PlacementSchema,
        "placement.verified": PlacementSchema,
        "placement.metrics_updated": PlacementMetricsSchema,
        "escrow.held": EscrowHoldSchema,
        "escrow.released": EscrowHoldSchema,
        "escrow.refunded": EscrowHoldSchema,
        "verification.completed": KybVerificationSchema,
        "dispute.resolved": DisputeResolutionSchema,
        "conversion.recorded": ConversionSchema,
        "webhook.test": EndpointPingSchema,
        "webhook.endpoint_failing": EndpointHealthSchema,
        "webhook.endpoint_disabled": EndpointHealthSchema,
    }
)


@cache
def _schema(schema_class: type[ApiSchema]) -> ApiSchema:
    return schema_class()


def event_data_schema(name: str) -> ApiSchema:
    """The schema of the event `name`'s `data` (one instance per schema, shared)."""
    return _schema(EVENT_DATA_SCHEMAS[name])


class _Changed:
    """`record` as a schema reads it, with `changes` over its attributes."""

    def __init__(self, record: object, changes: Mapping[str, object]) -> None:
        self._record = record
        self._changes = changes

    def __getattr__(self, name: str) -> object:
        if name in self._changes:
            return self._changes[name]
        return getattr(self._record, name)


def event_data(name: str, source: object, **changes: object) -> dict[str, Any]:
    """The `data` of the event `name` about `source` (a record, or a mapping of its attributes
    by their Python names), with `changes` (`previous_status=...`) over its attributes.

    :raise ValueError: a change the event's schema has no field for (it would be dropped).
    """
    schema = event_data_schema(name)
    if not changes:
        return schema.dump(source)
    unknown = set(changes) - {field.attribute or key for key, field in schema.dump_fields.items()}
    if unknown:
        raise ValueError(f"{name} has no field for {sorted(unknown)}")
    if isinstance(source, Mapping):
        return schema.dump({**source, **changes})
    return schema.dump(_Changed(source, changes))


def load_event_data(name: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """`given`, a `data` typed by hand (camelCase JSON), checked against the event's schema and
    written as a publisher would write it: every field, nothing else.

    :raise ValidationError: fields missing, unknown, or of the wrong type or value; its
        `messages` map each one's dotted path (`escrow.heldMinor`) to what is wrong.
    """
    schema = event_data_schema(name)
    errors = _missing_fields(schema, given)
    try:
        loaded = schema.load(given)
    except ValidationError as error:
        errors |= _dotted(error.normalized_messages())
    if errors:
        raise ValidationError(dict(sorted(errors.items())))
    return schema.dump(loaded)


def _missing_fields(schema: Schema, given: Mapping[str, Any], path: str = "") -> dict:
    """Every field a publisher writes that `given` leaves out, nested ones included."""
    missing: dict[str, list[str]] = {}
    for key, field in schema.dump_fields.items():
        data_key = field.data_key or key
        if data_key not in given:
            missing[path + data_key] = ["Missing: every field of the event is sent."]
        elif isinstance(field, fields.Nested) and isinstance(given[data_key], Mapping):
            missing |= _missing_fields(field.schema, given[data_key], f"{path}{data_key}.")
    return missing


def _dotted(messages: Any, path: str = "") -> dict[str, list[str]]:
    """marshmallow's nested messages as `{"escrow.heldMinor": [...]}`."""
    if not isinstance(messages, dict):
        return {path.rstrip("."): list(messages)}
    flat: dict[str, list[str]] = {}
    for key, value in messages.items():
        flat |= _dotted(value, f"{path}{key}.")
    return flat


def event_component_name(name: str) -> str:
    """The body's name in the OpenAPI document: `deal.completed` -> `DealCompletedEvent`."""
    words = name.replace(".", "_")
    return camelcase(words)[:1].upper() + camelcase(words)[1:] + "Event"


# Each subject type: what it is, when it is a body's subject, and an example id.
_SUBJECTS: Mapping[str, tuple[str, str]] = MappingProxyType(
    {
        DEAL: (
            "The deal, for `deal.*`, `content.*`, `placement.*`, `escrow.*` and `dispute.*` "
            "events.",
            DEAL_ID_EXAMPLE,
        ),
        CAMPAIGN: ("The campaign, for `campaign.*` events.", CAMPAIGN_ID_EXAMPLE),
        CONVERSION: (
            "The conversion, for `conversion.recorded` (its only event: sequence 1).",
            "conv_01jd3kq9r1s3t5v7w9x1y3z5a7",
        ),
        ENDPOINT: ("The endpoint, for `webhook.*` events.", ENDPOINT_ID_EXAMPLE),
        BRAND: (
            "The brand itself, for `verification.completed` (the brand's KYB check, which "
            "has no deal).",
            "brd_01jd3k7a9b1c3d5e7f9g1h3j5k",
        ),
    }
)


def subject_component_name(subject_type: str) -> str:
    """`deal` -> `DealSubject`: the schema of a body's `subject` of that type."""
    return subject_type.title() + "Subject"


@cache
def subject_schema(subject_type: str) -> type[Schema]:
    """A body's `subject` (CONTRACT 12.2) when it is of `subject_type`."""
    return ApiSchema.from_dict(
        {
            # `const`, as the body's `type`: a literal for a type generator.
            "type": fields.String(required=True, metadata={"const": subject_type}),
            "id": fields.String(
                required=True,
                metadata={"description": "Its id.", "example": _SUBJECTS[subject_type][1]},
            ),
        },
        name=subject_component_name(subject_type),
    )


@cache
def event_body_schema(name: str) -> type[Schema]:
    """The whole JSON body of a delivery of the event `name` (CONTRACT 6.1): the envelope
    `services.events.publish_event` writes around the event's `data`."""
    return ApiSchema.from_dict(
        {
            "id": fields.String(
                required=True,
                metadata={
                    "description": "The event id: the same on every retry and redelivery of "
                    "this event (`X-Service-Delivery` tells deliveries apart).",
                    "example": "evt_01jd3kw3x5y7z9a1b3c5d7e9f1",
                },
            ),
            # `const`, not a one-name enum: a type generator makes it a literal of the union's
            # discriminator rather than an enum class per event.
            "type": fields.String(
                required=True,
                metadata={
                    "const": name,
                    "description": "The event name, also the `X-Service-Event` header.",
                },
            ),
            "created_at": Timestamp(
                required=True, metadata={"description": "When the event happened."}
            ),
            "brand_id": fields.String(
                required=True,
                metadata={
                    "description": "The brand it happened in.",
                    "pattern": f"^{id_pattern('brd')}$",
                    "example": "brd_01jd3k7a9b1c3d5e7f9g1h3j5k",
                },
            ),
            "api_version": fields.String(
                required=True,
                metadata={"const": API_VERSION, "description": "The version of this body's shape."},
            ),
            "subject": fields.Nested(
                subject_schema(subject_type_of(name)),
                required=True,
                metadata={
                    "description": "The record whose life this event is a step of. "
                    + _SUBJECTS[subject_type_of(name)][0]
                    + " `fetch-events?subject=type:id` lists its events."
                },
            ),
            "sequence": fields.Integer(
                required=True,
                validate=validate.Range(min=1),
                metadata={
                    "description": "This event's place in its subject's life: 1 for the "
                    "subject's first event, then one more for each next one, in publish order, "
                    "without gaps (per brand and subject). The same on every retry and "
                    'redelivery. An endpoint with `ordering: "subject"` gets a subject\'s '
                    "events in this order; any receiver can use it to tell which came first.",
                    "example": 3,
                },
            ),
            "data": fields.Nested(
                EVENT_DATA_SCHEMAS[name],
                required=True,
                metadata={"description": EVENT_TYPES[name].description},
            ),
        },
        name=event_component_name(name),
    )
