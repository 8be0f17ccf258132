"""Forms of the dashboard that the JSON API has no schema for."""

from __future__ import annotations

from marshmallow import fields, validate

from schemas.api_keys import KeyCreateSchema
from schemas.base import ResourceId


class BootstrapSignInSchema(KeyCreateSchema):
    """The first-key form: which brand, the token support issued, and the key to mint."""

    brand_id = ResourceId("brd", "brand", required=True)
    bootstrap_token = fields.String(
        required=True,
        validate=validate.Length(min=1, max=200),
        load_only=True,
        metadata={"description": "The bootstrap token support issued (`bst_…`)."},
    )
