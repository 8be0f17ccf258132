"""The events API's requests and responses (CONTRACT 11.1): a brand's events as a feed after a
cursor, and one event with its deliveries."""

from __future__ import annotations

import re

from marshmallow import ValidationError, fields, validate

from models.event_catalog import EVENT_NAMES, sample_data
from models.event_subjects import SUBJECT_TYPES, parse_subject_key
from models.paging import ASCENDING, DESCENDING
from models.webhook_delivery import DELIVERY_STATUSES
from models.webhook_event import ROUTING_OUTCOMES, SUBJECT_ID_MAX_LENGTH
from schemas.base import ApiSchema, ResourceId, Timestamp
from schemas.webhooks import DELIVERY_ID_EXAMPLE, ENDPOINT_ID_EXAMPLE

EVENT_ID_EXAMPLE = "evt_01jd3kw3x5y7z9a1b3c5d7e9f1"
FEED_DEFAULT_LIMIT = 50
FEED_MAX_LIMIT = 100
MAX_WAIT_SECONDS = 30
_ONE_NAME = "(?:" + "|".join(re.escape(name) for name in EVENT_NAMES) + ")"


class EventTypes(fields.String):
    """`types`: event names separated by commas, loaded as a list. A name that is not an event
    is refused by name, so a typo is an error rather than a filter that never matches. The
    document states the rule as the field's `pattern`."""

    def __init__(self, **options) -> None:
        metadata = {
            "description": "Only events of these types: event names separated by commas, "
            "without spaces (`conversion.recorded,deal.completed`). A name that is not an "
            "event is a VALIDATION_ERROR naming it. Default: every type.",
            "pattern": f"^{_ONE_NAME}(?:,{_ONE_NAME})*$",
            "example": "conversion.recorded,deal.completed",
        }
        super().__init__(metadata=metadata, **options)

    # Loads a list where marshmallow types a String as loading a str.
    def _deserialize(self, value, attr, data, **kwargs) -> list[str]:  # type: ignore[override]
        names = super()._deserialize(value, attr, data, **kwargs).split(",")
        unknown = [name for name in names if name not in EVENT_NAMES]
        if "" in names:
            raise ValidationError("Give event names separated by single commas.")
        if unknown:
            raise ValidationError(
                f"Not event names: {', '.join(unknown)}. See the event catalogue for the names."
            )
        return list(dict.fromkeys(names))


class SubjectKey(fields.String):
    """`subject`: `type:id`, loaded as (type, id) by `models.event_subjects.parse_subject_key`;
    anything else is refused, saying what is expected. The document states the form as the
    field's `pattern`."""

    PATTERN = f"^(?:{'|'.join(SUBJECT_TYPES)}):[^\\x00-\\x1f\\x7f]{{1,{SUBJECT_ID_MAX_LENGTH}}}$"

    def __init__(self, description: str | None = None, **options) -> None:
        metadata = {
            "description": description
            or "Only the events of this subject (the record an event is a step "
            "of: the body's `subject`), as `type:id`, in their `sequence` order: "
            f"`deal:deal_…`, `campaign:cmp_…`; types {', '.join(SUBJECT_TYPES)}. `after` is "
            "then one of that subject's events. A value of another form is a VALIDATION_ERROR.",
            "pattern": self.PATTERN,
            "example": "deal:deal_01jd3kf5g7h9j1k3m5n7p9q1r3",
        }
        super().__init__(metadata=metadata, **options)

    # Loads a pair where marshmallow types a String as loading a str.
    def _deserialize(self, value, attr, data, **kwargs) -> tuple[str, str]:  # type: ignore[override]
        text = super()._deserialize(value, attr, data, **kwargs)
        try:
            subject_type, subject_id = parse_subject_key(text)
        except ValueError as error:
            raise ValidationError(str(error)) from None
        if not re.fullmatch(self.PATTERN, text):
            raise ValidationError(
                f"The id must be 1-{SUBJECT_ID_MAX_LENGTH} characters, no control characters."
            )
        return subject_type, subject_id


class EventFeedQuerySchema(ApiSchema):
    after = ResourceId(
        "evt",
        "event",
        metadata={
            "description": "List the events published after this one (`meta.nextAfter` of the "
            "previous answer, or any event id of the brand). Left out: from the oldest event "
            "kept. An id of an event that retention has deleted (older than "
            "`WEBHOOK_RETENTION_DAYS`) starts at the oldest kept one, with "
            "`meta.cursorExpired: true`; any other id that is not an event of this brand is "
            "NOT_FOUND. With `sortOrder=desc`: the events published before this one (an "
            "expired id: none, with `meta.cursorExpired: true`).",
            "example": EVENT_ID_EXAMPLE,
        },
    )
    limit = fields.Integer(
        load_default=FEED_DEFAULT_LIMIT,
        validate=validate.Range(min=1, max=FEED_MAX_LIMIT),
        metadata={
            "description": f"At most this many events, 1-{FEED_MAX_LIMIT}; default "
            f"{FEED_DEFAULT_LIMIT}."
        },
    )
    types = EventTypes()
    subject = SubjectKey()
    wait = fields.Integer(
        load_default=0,
        validate=validate.Range(min=0, max=MAX_WAIT_SECONDS),
        metadata={
            "description": f"Seconds (0-{MAX_WAIT_SECONDS}) to hold the request open when "
            "no event comes after `after`: the answer comes as soon as one is published, or "
            "after that long with an empty list. Default 0: answer at once.",
            "example": 25,
        },
    )
    sort_order = fields.String(
        load_default=ASCENDING,
        validate=validate.OneOf((ASCENDING, DESCENDING)),
        metadata={
            "description": "`asc` (default): publish order, oldest first, the events published "
            "after `after`: the feed to follow. `desc`: newest first, the events published "
            "before `after` (left out: from the newest); pass `meta.nextAfter` as `after` to "
            "read further back. `desc` lists only events whose place in the order is final, "
            "so a walk back never skips one, and answers at once whatever `wait` says. The "
            "same word as fetch-deliveries' (whose default is `desc`: a log is read from its "
            "end, a feed from its start)."
        },
    )


class SubjectSchema(ApiSchema):
    type = fields.String(
        validate=validate.OneOf(SUBJECT_TYPES),
        metadata={
            "description": "`deal` (`deal.*`, `content.*`, `placement.*`, `escrow.*`, "
            "`dispute.*`), `campaign` (`campaign.*`), `conversion` (`conversion.recorded`), "
            "`endpoint` (`webhook.*`), `brand` (`verification.completed`: the brand's KYB "
            "check).",
            "example": "deal",
        },
    )
    id = fields.String(
        metadata={"description": "That record's id.", "example": "deal_01jd3kf5g7h9j1k3m5n7p9q1r3"}
    )


class FeedEventSchema(ApiSchema):
    id = fields.String(
        metadata={
            "description": "The event id: `id` in every delivery's body, and the cursor to "
            "resume after it.",
            "example": EVENT_ID_EXAMPLE,
        }
    )
    type = fields.String(
        validate=validate.OneOf(EVENT_NAMES), metadata={"example": "deal.completed"}
    )
    created_at = Timestamp(
        metadata={"description": "When the event happened; `createdAt` of its deliveries."}
    )
    subject = fields.Nested(
        SubjectSchema,
        metadata={
            "description": "The record whose life the event is a step of: `subject` of its "
            "deliveries' body. Pass it as `type:id` in `subject` to list that record's events."
        },
    )
    sequence = fields.Integer(
        validate=validate.Range(min=1),
        metadata={
            "description": "The event's place in its subject's life: 1 for the subject's first "
            "event, then one more for each next one, without gaps; `sequence` of its "
            "deliveries' body.",
            "example": 3,
        },
    )
    data = fields.Dict(
        allow_none=True,
        metadata={
            "description": "Exactly the `data` its webhook deliveries carry: the record the "
            "event is about (each type's shape is in the event catalogue and the webhook "
            "callbacks of this document). Null once the event was erased (`erasedAt`).",
            "example": sample_data("deal.completed"),
        },
    )
    erased_at = Timestamp(
        allow_none=True,
        metadata={
            "description": "When the event's data was erased with its subject (eraseSubject), "
            "or null: it keeps its id, type, subject, sequence and times.",
            "example": None,
        },
    )


class EventListSchema(ApiSchema):
    events = fields.List(
        fields.Nested(FeedEventSchema),
        metadata={
            "description": "In the order they were published, oldest first (newest first with "
            "`sortOrder=desc`)."
        },
    )


class EventFeedMetaSchema(ApiSchema):
    next_after = fields.String(
        allow_none=True,
        metadata={
            "description": "Pass it as `after` next: the last event's id, or `after` itself "
            "when none came (null when neither). Following it sees every event of the brand "
            "once, in publish order (with `sortOrder=desc`, in the opposite order).",
            "example": EVENT_ID_EXAMPLE,
        },
    )
    cursor_expired = fields.Boolean(
        metadata={
            "description": "True when `after` was older than what is kept: the list starts "
            "at the oldest event kept, and events between the two were deleted unseen.",
            "example": False,
        }
    )


class EventDeliverySchema(ApiSchema):
    id = fields.String(metadata={"example": DELIVERY_ID_EXAMPLE})
    endpoint_id = fields.String(metadata={"example": ENDPOINT_ID_EXAMPLE})
    status = fields.String(validate=validate.OneOf(DELIVERY_STATUSES))
    attempt_count = fields.Integer(metadata={"example": 1})


class EventDetailSchema(FeedEventSchema):
    deliveries = fields.List(
        fields.Nested(EventDeliverySchema),
        metadata={
            "description": "Every delivery of the event, redeliveries included, oldest first; "
            "empty when no endpoint was subscribed."
        },
    )


class EventRouteSchema(ApiSchema):
    endpoint_id = fields.String(metadata={"example": ENDPOINT_ID_EXAMPLE})
    outcome = fields.String(
        validate=validate.OneOf(ROUTING_OUTCOMES),
        metadata={
            "description": "`sent`: a delivery of the event to that endpoint exists; "
            "`not_subscribed`: the endpoint's `events` did not include its type; `filtered`: "
            "its `campaignIds` left the event out (or, for an alert about the endpoint itself, "
            "the service did); `disabled`: the endpoint was subscribed but disabled when the "
            "event was published. Decided as things stood at publish time.",
            "example": "sent",
        },
    )
    delivery_id = fields.String(
        allow_none=True,
        metadata={
            "description": "The first delivery of the event to that endpoint when `sent`, "
            "else null.",
            "example": DELIVERY_ID_EXAMPLE,
        },
    )


class EventRoutingSchema(ApiSchema):
    event_id = fields.String(metadata={"example": EVENT_ID_EXAMPLE})
    endpoints = fields.List(
        fields.Nested(EventRouteSchema),
        metadata={
            "description": "One entry for each endpoint of the brand that existed when the "
            "event was published and still exists, oldest endpoint first."
        },
    )


class SubjectPathSchema(ApiSchema):
    subject = SubjectKey(
        required=True,
        description="The record whose events to erase (the body's `subject` of each), as "
        f"`type:id`: `deal:deal_…`, `campaign:cmp_…`, `conversion:conv_…`; types "
        f"{', '.join(SUBJECT_TYPES)}. A value of another form is a VALIDATION_ERROR.",
    )


class ErasedSubjectSchema(ApiSchema):
    subject = fields.Nested(SubjectSchema)
    events = fields.Integer(
        metadata={
            "description": "How many events of the subject the brand has: every one of them "
            "is erased (the newest before this answer, the rest within moments).",
            "example": 12,
        }
    )
