"""Forms of the dashboard that the JSON API has no schema for."""

from __future__ import annotations

from marshmallow import fields, validate

from models.event_catalog import EVENT_NAMES
from schemas.api_keys import KeyCreateSchema
from schemas.base import ApiSchema, ResourceId
from schemas.envelope import PageQuerySchema


class BootstrapSignInSchema(KeyCreateSchema):
    """The first-key form: which brand, the token support issued, and the key to mint."""

    brand_id = ResourceId("brd", "brand", required=True)
    bootstrap_token = fields.String(
        required=True,
        validate=validate.Length(min=1, max=200),
        load_only=True,
        metadata={"description": "The bootstrap token support issued (`bst_…`)."},
    )


class ExampleEventSchema(ApiSchema):
    """An endpoint page's "Send an example event": which event of the catalogue."""

    event_name = fields.String(
        required=True,
        validate=validate.OneOf(EVENT_NAMES, error="Not an event: choose one of the list."),
        metadata={"description": "The event whose sample body is sent."},
    )


class EventLogQuerySchema(PageQuerySchema):
    """The Events page: the brand's events newest first, of one type, or the one with an id."""

    type = fields.String(validate=validate.OneOf(EVENT_NAMES))
    event_id = ResourceId("evt", "event")
