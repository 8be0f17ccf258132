"""Escrow hold responses and the fetch-holds query (CONTRACT section 4)."""

from __future__ import annotations

from marshmallow import fields, validate

from models.escrow_hold import HOLD_STATUSES
from schemas.base import ApiSchema, ResourceId, Timestamp, currency_field, money
from schemas.campaigns import CAMPAIGN_ID_EXAMPLE
from schemas.deals import DEAL_ID_EXAMPLE
from schemas.envelope import PageQuerySchema


class EscrowHoldSchema(ApiSchema):
    id = fields.String(
        metadata={"description": "Escrow hold id.", "example": "esc_01jd3kh8k0m2n4p6q8r0s2t4v6"}
    )
    deal_id = fields.String(
        metadata={"description": "The deal it funds.", "example": DEAL_ID_EXAMPLE}
    )
    campaign_id = fields.String(
        metadata={"description": "The deal's campaign.", "example": CAMPAIGN_ID_EXAMPLE}
    )
    amount_minor = money("The amount held.")
    currency = currency_field()
    status = fields.String(
        validate=validate.OneOf(HOLD_STATUSES),
        metadata={"description": "`held`, then `released` to the creator or `refunded`."},
    )
    held_at = Timestamp(attribute="created_at", metadata={"description": "When it was held."})
    released_at = Timestamp(
        allow_none=True, metadata={"description": "When it was released to the creator."}
    )
    refunded_at = Timestamp(
        allow_none=True, metadata={"description": "When it was refunded to the brand."}
    )


class EscrowHoldListSchema(ApiSchema):
    holds = fields.List(
        fields.Nested(EscrowHoldSchema),
        attribute="items",
        metadata={"description": "One page, newest first."},
    )


class EscrowHoldQuerySchema(PageQuerySchema):
    campaign_id = ResourceId("cmp", "campaign")
    deal_id = ResourceId("deal", "deal")
    status = fields.String(
        validate=validate.OneOf(HOLD_STATUSES),
        metadata={"description": "Only holds in this status."},
    )
