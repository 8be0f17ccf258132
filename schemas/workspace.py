"""The workspace view (CONTRACT section 4): the brand and the calling key, no secrets."""

from __future__ import annotations

from marshmallow import fields, validate

from models.api_key import SCOPES
from models.brand import KYB_STATUSES, PLANS
from schemas.base import ApiSchema, Timestamp


class PeriodSchema(ApiSchema):
    start = Timestamp(metadata={"description": "When the period began."})
    end = Timestamp(metadata={"description": "When it ends (and renews)."})


class CallerSchema(ApiSchema):
    key_id = fields.String(
        metadata={
            "description": "The id of the key that made this request.",
            "example": "key_01jd3k9m2x4q8r7t6v5w4y3z2a",
        }
    )
    scopes = fields.List(
        fields.String(validate=validate.OneOf(SCOPES)),
        metadata={"description": "What that key may do: `read`, and `write` (which implies it)."},
    )


class WorkspaceSchema(ApiSchema):
    brand_id = fields.String(
        metadata={"description": "The brand's id.", "example": "brd_01jd3k7a9b1c3d5e7f9g1h3j5k"}
    )
    name = fields.String(metadata={"description": "The brand's name."})
    plan = fields.String(
        validate=validate.OneOf(PLANS),
        metadata={"description": "Billing plan; scopes, not the plan, decide what a key may do."},
    )
    kyb_status = fields.String(
        validate=validate.OneOf(KYB_STATUSES),
        metadata={"description": "Know-your-business verification of the brand."},
    )
    subscription_period = fields.Nested(
        PeriodSchema, metadata={"description": "The current billing period."}
    )
    caller = fields.Nested(
        CallerSchema, metadata={"description": "The API key that made this request."}
    )
    created_at = Timestamp(metadata={"description": "When the workspace was created."})
