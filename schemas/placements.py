"""Placement responses and the fetch-placements query (CONTRACT section 4)."""

from __future__ import annotations

from marshmallow import fields, validate

from models.placement import PLATFORMS
from schemas.base import ApiSchema, ResourceId, Timestamp
from schemas.campaigns import CAMPAIGN_ID_EXAMPLE
from schemas.deals import DEAL_ID_EXAMPLE
from schemas.envelope import PageQuerySchema


class PlacementSchema(ApiSchema):
    id = fields.String(
        metadata={"description": "Placement id.", "example": "plc_01jd3kf5h7j9k1m3n5p7q9r1s3"}
    )
    campaign_id = fields.String(
        metadata={
            "description": "Its campaign, through which it belongs to the brand.",
            "example": CAMPAIGN_ID_EXAMPLE,
        }
    )
    deal_id = fields.String(
        metadata={"description": "The deal it delivers.", "example": DEAL_ID_EXAMPLE}
    )
    platform = fields.String(
        validate=validate.OneOf(PLATFORMS), metadata={"description": "Where it is posted."}
    )
    post_url = fields.String(
        metadata={
            "description": "The live post.",
            "example": "https://www.instagram.com/p/C9xYz12AbCd/",
        }
    )
    clicks = fields.Integer(metadata={"description": "Clicks from this post, as last measured."})
    submitted_at = Timestamp(
        attribute="created_at", metadata={"description": "When the creator reported it live."}
    )
    verified_at = Timestamp(
        allow_none=True,
        metadata={"description": "Null until verified; only verified placements are paid."},
    )
    metrics_updated_at = Timestamp(
        allow_none=True, metadata={"description": "When `clicks` was last measured."}
    )


class PlacementListSchema(ApiSchema):
    placements = fields.List(
        fields.Nested(PlacementSchema),
        attribute="items",
        metadata={"description": "One page, newest first."},
    )


class PlacementQuerySchema(PageQuerySchema):
    campaign_id = ResourceId("cmp", "campaign")
    deal_id = ResourceId("deal", "deal")
