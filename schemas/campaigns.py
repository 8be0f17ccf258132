"""Campaign responses and the fetch-campaigns query (CONTRACT section 4)."""

from __future__ import annotations

from marshmallow import fields, validate

from models.campaign import CAMPAIGN_STATUSES, PRICING_MODELS
from schemas.base import ApiSchema, Timestamp, currency_field, money
from schemas.envelope import PageQuerySchema

CAMPAIGN_ID_EXAMPLE = "cmp_01jd3k9m2x4q8r7t6v5w4y3z2a"


class CampaignSchema(ApiSchema):
    id = fields.String(metadata={"description": "Campaign id.", "example": CAMPAIGN_ID_EXAMPLE})
    name = fields.String(
        metadata={"description": "The brand's name for it.", "example": "Harmattan Glow launch"}
    )
    status = fields.String(
        validate=validate.OneOf(CAMPAIGN_STATUSES),
        metadata={
            "description": "`draft` until published; `active` while open to creators; "
            "`paused`; then `completed` or `cancelled`."
        },
    )
    pricing_model = fields.String(
        validate=validate.OneOf(PRICING_MODELS),
        metadata={
            "description": "How creators earn: `fixed_fee` (each deal's agreed amount, earned "
            "as its required placements are verified) or `per_click` (`clickRateMinor` per "
            "click on verified placements, up to the deal's agreed amount)."
        },
    )
    click_rate_minor = money(
        "`per_click` only: what one click on a verified placement earns; null otherwise.",
        allow_none=True,
    )
    currency = currency_field()
    budget_minor = money("The campaign's budget.")
    spent_minor = money(
        "Released from escrow to creators. `campaign.budget_threshold` fires as it crosses "
        "50, 80 and 100 percent of the budget."
    )
    committed_minor = money("Held in escrow for accepted deals, not yet released or refunded.")
    remaining_minor = money("Budget less spent and committed; negative when over budget.")
    starts_at = Timestamp(metadata={"description": "When creators may start posting."})
    ends_at = Timestamp(metadata={"description": "When the campaign is planned to end."})
    published_at = Timestamp(
        allow_none=True, metadata={"description": "When it went live; null while a draft."}
    )
    completed_at = Timestamp(allow_none=True, metadata={"description": "When it completed."})
    cancelled_at = Timestamp(allow_none=True, metadata={"description": "When it was cancelled."})
    created_at = Timestamp(metadata={"description": "When the brand created it."})
    updated_at = Timestamp(metadata={"description": "Its last change of any field."})


class CampaignListSchema(ApiSchema):
    campaigns = fields.List(
        fields.Nested(CampaignSchema),
        attribute="items",
        metadata={"description": "One page, newest first."},
    )


class CampaignQuerySchema(PageQuerySchema):
    status = fields.String(
        validate=validate.OneOf(CAMPAIGN_STATUSES),
        metadata={"description": "Only campaigns in this status."},
    )
