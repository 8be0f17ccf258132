"""Tracked link responses and the fetch-links query (CONTRACT section 4)."""

from __future__ import annotations

from marshmallow import fields, validate

from models.tracked_link import CODE_MAX_LENGTH
from schemas.base import ApiSchema, ResourceId, Timestamp, currency_field, money
from schemas.campaigns import CAMPAIGN_ID_EXAMPLE
from schemas.deals import DEAL_ID_EXAMPLE
from schemas.envelope import PageQuerySchema


class TrackedLinkSchema(ApiSchema):
    id = fields.String(
        metadata={"description": "Tracked link id.", "example": "lnk_01jd3kc4d6f8g0h2j4k6m8n0p2"}
    )
    campaign_id = fields.String(
        metadata={"description": "The campaign it promotes.", "example": CAMPAIGN_ID_EXAMPLE}
    )
    deal_id = fields.String(
        allow_none=True,
        metadata={"description": "Null for a campaign-wide link.", "example": DEAL_ID_EXAMPLE},
    )
    code = fields.String(
        metadata={
            "description": "The link code; send it as `linkCode` in postbacks to attribute a "
            "conversion. Case-sensitive.",
            "example": "GLOW25",
        }
    )
    short_url = fields.String(
        metadata={"description": "The URL creators share.", "example": "https://kola.link/GLOW25"}
    )
    destination_url = fields.String(
        metadata={"description": "Where the short URL sends a visitor."}
    )
    clicks = fields.Integer(metadata={"description": "Visits through the short URL."})
    conversions = fields.Integer(metadata={"description": "Attributed conversion postbacks."})
    conversion_value_minor = money(
        "Sum of the values of attributed conversions in the link's `currency`."
    )
    currency = currency_field()
    last_clicked_at = Timestamp(
        allow_none=True, metadata={"description": "When its latest counted click happened."}
    )
    created_at = Timestamp(metadata={"description": "When the link was created."})


class TrackedLinkListSchema(ApiSchema):
    links = fields.List(
        fields.Nested(TrackedLinkSchema),
        attribute="items",
        metadata={"description": "One page, newest first."},
    )


class TrackedLinkQuerySchema(PageQuerySchema):
    campaign_id = ResourceId("cmp", "campaign")
    deal_id = ResourceId("deal", "deal")
    code = fields.String(
        validate=validate.Length(min=1, max=CODE_MAX_LENGTH),
        metadata={"description": "Exact link code (case-sensitive)."},
    )
