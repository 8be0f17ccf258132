"""API key requests and responses (SPEC sections 2 and 4)."""

from __future__ import annotations

from marshmallow import fields, validate

from models.api_key import DEFAULT_SCOPES, KEY_NAME_MAX_LENGTH, SCOPES
from schemas.base import ApiSchema, Label, Timestamp


class KeyCreateSchema(ApiSchema):
    name = Label(
        required=True,
        max_length=KEY_NAME_MAX_LENGTH,
        metadata={"description": "A label to tell keys apart.", "example": "orders-service"},
    )
    scopes = fields.List(
        fields.String(validate=validate.OneOf(SCOPES)),
        load_default=list(DEFAULT_SCOPES),
        validate=validate.Length(min=1, error="Give at least one scope."),
        metadata={
            "description": "`read` lists and reads; `write` also creates and revokes keys and "
            'manages webhook endpoints (and implies `read`). Default `["read"]`.',
            "example": ["read", "write"],
        },
    )


class ApiKeySchema(ApiSchema):
    id = fields.String(metadata={"example": "key_01jd3k9m2x4q8r7t6v5w4y3z2a"})
    name = fields.String(metadata={"example": "orders-service"})
    key_prefix = fields.String(
        metadata={
            "description": "The first 12 characters of the secret; safe to show.",
            "example": "svc_live_4Fq",
        }
    )
    scopes = fields.List(fields.String(validate=validate.OneOf(SCOPES)))
    last_used_at = Timestamp(
        allow_none=True,
        metadata={"description": "When the key last authenticated a request, to the minute."},
    )
    created_at = Timestamp()


class IssuedApiKeySchema(ApiSchema):
    """Dumps a `services.api_keys.IssuedApiKey`: the stored key plus its one-time secret."""

    id = fields.String(
        attribute="record.id", metadata={"example": "key_01jd3k9m2x4q8r7t6v5w4y3z2a"}
    )
    name = fields.String(attribute="record.name", metadata={"example": "orders-service"})
    key_prefix = fields.String(attribute="record.key_prefix", metadata={"example": "svc_live_4Fq"})
    scopes = fields.List(fields.String(validate=validate.OneOf(SCOPES)), attribute="record.scopes")
    secret = fields.String(
        metadata={
            "description": "The key itself. Shown this once: store it now, it cannot be "
            "retrieved again.",
            "example": "svc_live_4FqL0...",
        }
    )
    created_at = Timestamp(attribute="record.created_at")


class RevokedKeySchema(ApiSchema):
    id = fields.String(metadata={"example": "key_01jd3k9m2x4q8r7t6v5w4y3z2a"})
    revoked_at = Timestamp()
