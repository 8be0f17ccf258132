"""Deal responses, with their escrow snapshot and settlement summary, and the fetch-deals query
(CONTRACT section 4)."""

from __future__ import annotations

from marshmallow import fields, validate

from models.deal import DEAL_STATUSES
from schemas.base import ApiSchema, ResourceId, Timestamp, currency_field, money
from schemas.campaigns import CAMPAIGN_ID_EXAMPLE
from schemas.envelope import PageQuerySchema

DEAL_ID_EXAMPLE = "deal_01jd3kb7c9x2m4n6p8q0r2s4t6"


class EscrowSnapshotSchema(ApiSchema):
    held_minor = money("Held now: neither released nor refunded yet.")
    released_minor = money("Released to the creator.")
    refunded_minor = money("Refunded to the brand.")
    currency = currency_field()


class SettlementSchema(ApiSchema):
    verified_placements = fields.Integer(
        metadata={"description": "This deal's placements verified live so far."}
    )
    placements_required = fields.Integer(metadata={"description": "Live posts the deal asks for."})
    amount_due_minor = money(
        "Earned by the creator so far under the campaign's pricing model: for `fixed_fee`, "
        "the agreed amount times verified over required placements; for `per_click`, clicks "
        "on verified placements times the rate, at most the agreed amount."
    )
    amount_settled_minor = money("Paid to the creator (released from escrow).")
    outstanding_minor = money("Due but not yet settled.")
    currency = currency_field()


class DealSchema(ApiSchema):
    id = fields.String(metadata={"description": "Deal id.", "example": DEAL_ID_EXAMPLE})
    campaign_id = fields.String(
        metadata={"description": "The campaign it belongs to.", "example": CAMPAIGN_ID_EXAMPLE}
    )
    creator_handle = fields.String(
        metadata={"description": "The creator's public handle.", "example": "@adaeze.cooks"}
    )
    status = fields.String(
        validate=validate.OneOf(DEAL_STATUSES),
        metadata={
            "description": "`offered`, then `accepted`, `declined` or `expired`; an accepted "
            "deal goes `in_progress` and ends `completed` or `cancelled`, possibly through "
            "`disputed`."
        },
    )
    agreed_amount_minor = money("What the creator earns when every placement is delivered.")
    currency = currency_field()
    escrow = fields.Nested(
        EscrowSnapshotSchema, metadata={"description": "This deal's escrow holds, summed."}
    )
    settlement = fields.Nested(
        SettlementSchema, metadata={"description": "What the creator has earned and been paid."}
    )
    accepted_at = Timestamp(
        allow_none=True, metadata={"description": "When the creator accepted the offer."}
    )
    completed_at = Timestamp(allow_none=True, metadata={"description": "When it completed."})
    created_at = Timestamp(metadata={"description": "When the offer was made."})
    updated_at = Timestamp(metadata={"description": "Its last change, escrow included."})


class DealListSchema(ApiSchema):
    deals = fields.List(
        fields.Nested(DealSchema),
        attribute="items",
        metadata={"description": "One page, newest first."},
    )


class DealQuerySchema(PageQuerySchema):
    status = fields.String(
        validate=validate.OneOf(DEAL_STATUSES),
        metadata={"description": "Only deals in this status."},
    )
    campaign_id = ResourceId("cmp", "campaign")
