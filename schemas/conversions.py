"""Conversion postbacks: the request (CONTRACT section 5), its answer, the stored conversion
and the fetch-postbacks query."""

from __future__ import annotations

import json

from marshmallow import ValidationError, fields, post_load, validate, validates

from models import credentials
from models.conversion import (
    CLICK_ID_MAX_LENGTH,
    EVENT_TYPE_MAX_LENGTH,
    IDEMPOTENCY_KEY_MAX_LENGTH,
    IDEMPOTENCY_KEY_MIN_LENGTH,
    IDEMPOTENCY_KEY_PATTERN,
    LINK_CODE_MAX_LENGTH,
)
from models.money import CURRENCIES, NGN
from schemas.base import (
    ApiSchema,
    JsonInteger,
    Label,
    QueryBoolean,
    ResourceId,
    Timestamp,
    currency_field,
    money,
)
from schemas.campaigns import CAMPAIGN_ID_EXAMPLE
from schemas.deals import DEAL_ID_EXAMPLE
from schemas.envelope import SortedPageQuerySchema

IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"
METADATA_MAX_BYTES = 8 * 1024
METADATA_MAX_DEPTH = 8
# A brand's monthly revenue in kobo is far below this; anything above is a unit mistake.
VALUE_MINOR_MAX = 10**15
CONVERSION_ID_EXAMPLE = "conv_01jd3km1n3p5q7r9s1t3v5w7x9"
LINK_ID_EXAMPLE = "lnk_01jd3kc4d6f8g0h2j4k6m8n0p2"


class PostbackHeadersSchema(ApiSchema):
    idempotency_key = fields.String(
        required=True,
        data_key=IDEMPOTENCY_KEY_HEADER,
        validate=validate.Regexp(
            IDEMPOTENCY_KEY_PATTERN,
            error=f"{IDEMPOTENCY_KEY_MIN_LENGTH}-{IDEMPOTENCY_KEY_MAX_LENGTH} letters, digits, "
            "dashes, underscores or colons.",
        ),
        metadata={
            "description": "Your unique id for this outcome (an order id, say): every retry "
            "of it must send the same key. Kept as long as the conversion, so a replay never "
            "expires.",
            "example": "order-20931-purchase",
        },
    )

    @validates("idempotency_key")
    def _not_a_credential(self, value: str, **_) -> None:
        if credentials.looks_like_credential(value):
            raise ValidationError("Looks like a credential; use your own id for the outcome.")


class PostbackSchema(ApiSchema):
    event_type = Label(
        required=True,
        max_length=EVENT_TYPE_MAX_LENGTH,
        metadata={
            "description": "Your label for the outcome, such as `purchase`, `lead`, `signup`.",
            "example": "purchase",
        },
    )
    click_id = Label(
        allow_none=True,
        max_length=CLICK_ID_MAX_LENGTH,
        metadata={
            "description": "The click identifier your partner forwarded. Its presence makes "
            "the conversion `attributed`.",
            "example": "clk_8f2a61",
        },
    )
    link_code = Label(
        allow_none=True,
        max_length=LINK_CODE_MAX_LENGTH,
        metadata={
            "description": "The code of one of your tracked links: the conversion is counted "
            "on that link and takes its campaign and deal. An unknown code is stored, "
            "unattributed to any link, and not refused.",
            "example": "GLOW25",
        },
    )
    value_minor = JsonInteger(
        load_default=0,
        validate=validate.Range(min=0, max=VALUE_MINOR_MAX),
        metadata={"description": "The outcome's value in minor units of `currency`; default 0."},
    )
    currency = fields.String(
        load_default=NGN,
        validate=validate.OneOf(CURRENCIES),
        metadata={"description": "ISO 4217 code of `valueMinor`; default `NGN`.", "example": "NGN"},
    )
    metadata = fields.Dict(
        keys=fields.String(),
        allow_none=True,
        load_default=dict,
        metadata={
            "description": f"Your own ids, as a JSON object of at most {METADATA_MAX_BYTES:,} "
            "bytes. Never a secret: a value that looks like one of this service's "
            "credentials (`svc_live_…`, `bst_…`, `whsec_…`) is refused.",
            "example": {"orderId": "ORD-20931"},
        },
    )

    @validates("metadata")
    def _bounded_and_secret_free(self, value: dict | None, **_) -> None:
        if value is None:
            return
        size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())
        if size > METADATA_MAX_BYTES:
            raise ValidationError(f"At most {METADATA_MAX_BYTES:,} bytes as JSON; got {size:,}.")
        problem = _metadata_problem(value, depth=1)
        if problem:
            raise ValidationError(problem)

    @post_load
    def _absent_as_empty(self, data: dict, **_) -> dict:
        if data.get("metadata") is None:
            data["metadata"] = {}
        return data


def _metadata_problem(value, depth: int, path: str = "metadata") -> str | None:
    """What is wrong at the first bad place in `value`, naming the path but never the value."""
    if depth > METADATA_MAX_DEPTH:
        return f"Nested deeper than {METADATA_MAX_DEPTH} levels at {path}."
    if isinstance(value, str):
        prefix = credentials.looks_like_credential(value)
        if prefix:
            return f"{path} looks like a credential ({prefix}…); never send secrets in metadata."
        return None
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, item in items:
        if isinstance(key, str) and credentials.looks_like_credential(key):
            return f"A key in {path} looks like a credential; never send secrets in metadata."
        problem = _metadata_problem(item, depth + 1, f"{path}.{key}")
        if problem:
            return problem
    return None


class PostbackResultSchema(ApiSchema):
    conversion_id = fields.String(
        attribute="conversion.id",
        metadata={"description": "The stored conversion.", "example": CONVERSION_ID_EXAMPLE},
    )
    replay = fields.Boolean(
        metadata={
            "description": "True when the key was seen before: this is the first conversion "
            "stored under it, whatever this request's body said, and nothing was counted again.",
            "example": False,
        }
    )
    attributed = fields.Boolean(
        attribute="conversion.attributed",
        metadata={
            "description": "True when the postback carried a `linkCode` or a `clickId` "
            "(SPEC's rule), known or not: `linkId` says whether the code matched a link."
        },
    )
    link_id = fields.String(
        attribute="conversion.link_id",
        allow_none=True,
        metadata={
            "description": "The tracked link `linkCode` matched, on which the conversion was "
            "counted; null when `linkCode` was absent or is none of your links' codes. "
            "`attributed` is true for any code or click id: this field tells a code you know "
            "from one you do not.",
            "example": LINK_ID_EXAMPLE,
        },
    )
    campaign_id = fields.String(
        attribute="conversion.campaign_id",
        allow_none=True,
        metadata={
            "description": "The campaign of the matched tracked link; null when `linkCode` was "
            "absent or is not one of your links.",
            "example": CAMPAIGN_ID_EXAMPLE,
        },
    )
    deal_id = fields.String(
        attribute="conversion.deal_id",
        allow_none=True,
        metadata={
            "description": "The deal of the matched tracked link; null without a matched link, "
            "or for a campaign-wide link.",
            "example": DEAL_ID_EXAMPLE,
        },
    )


class PostbackReplaySchema(PostbackResultSchema):
    """The 200 of a key seen before: the same fields, describing the first conversion."""

    replay = fields.Boolean(
        metadata={
            "description": "Always true here: the key was seen before, and this is the first "
            "conversion stored under it.",
            "example": True,
        }
    )


class ConversionSchema(ApiSchema):
    id = fields.String(metadata={"description": "Conversion id.", "example": CONVERSION_ID_EXAMPLE})
    idempotency_key = fields.String(
        metadata={
            "description": "The `Idempotency-Key` it was recorded under.",
            "example": "order-20931-purchase",
        }
    )
    event_type = fields.String(metadata={"description": "Your label.", "example": "purchase"})
    click_id = fields.String(
        allow_none=True, metadata={"description": "As sent; null when absent."}
    )
    link_code = fields.String(
        allow_none=True,
        metadata={"description": "As sent, known or not; null when absent.", "example": "GLOW25"},
    )
    link_id = fields.String(
        allow_none=True,
        metadata={
            "description": "The tracked link it was counted on; null when `linkCode` was absent "
            "or is not one of your links.",
            "example": LINK_ID_EXAMPLE,
        },
    )
    campaign_id = fields.String(
        allow_none=True,
        metadata={
            "description": "The matched link's campaign, or null.",
            "example": CAMPAIGN_ID_EXAMPLE,
        },
    )
    deal_id = fields.String(
        allow_none=True,
        metadata={"description": "The matched link's deal, or null.", "example": DEAL_ID_EXAMPLE},
    )
    value_minor = money("The outcome's value in `currency`.")
    currency = currency_field()
    metadata = fields.Dict(
        attribute="details",
        metadata={"description": "Your own ids, as sent.", "example": {"orderId": "ORD-20931"}},
    )
    attributed = fields.Boolean(
        metadata={"description": "True when it carried a `linkCode` or a `clickId`."}
    )
    created_at = Timestamp(metadata={"description": "When it was recorded."})


class ConversionListSchema(ApiSchema):
    conversions = fields.List(
        fields.Nested(ConversionSchema),
        attribute="items",
        metadata={"description": "One page, newest first unless `sortOrder=asc`."},
    )


class ConversionQuerySchema(SortedPageQuerySchema):
    event_type = fields.String(
        validate=validate.Length(min=1, max=EVENT_TYPE_MAX_LENGTH),
        metadata={"description": "Exact `eventType`."},
    )
    link_code = fields.String(
        validate=validate.Length(min=1, max=LINK_CODE_MAX_LENGTH),
        metadata={"description": "Exact `linkCode` as sent (case-sensitive), known or not."},
    )
    campaign_id = ResourceId("cmp", "campaign")
    deal_id = ResourceId("deal", "deal")
    attributed = QueryBoolean(
        metadata={"description": "`true` or `false`: whether a `linkCode` or `clickId` came."}
    )
