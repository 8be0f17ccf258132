"""The response envelope of SPEC section 1 as schemas. The runtime builder dumps through
`EnvelopeSchema` / `ErrorEnvelopeSchema`; the OpenAPI document describes each operation's success
body as `envelope_for(DataSchema)`, whose `data` is typed."""

from __future__ import annotations

from functools import cache

from marshmallow import Schema, fields, validate

from models.paging import ASCENDING, DEFAULT_LIMIT, DESCENDING, MAX_LIMIT, MAX_PAGE
from schemas.base import ApiSchema

ERROR_CODES = (
    "VALIDATION_ERROR",
    "UNAUTHORIZED",
    "FORBIDDEN",
    "NOT_FOUND",
    "METHOD_NOT_ALLOWED",
    "CONFLICT",
    "PAYLOAD_TOO_LARGE",
    "UNSUPPORTED_MEDIA_TYPE",
    "RATE_LIMITED",
    "INTERNAL_ERROR",
    "SERVICE_UNAVAILABLE",
)


class PageQuerySchema(ApiSchema):
    """`page` and `limit` of every list (CONTRACT section 3); lists add their filters."""

    page = fields.Integer(
        load_default=1,
        validate=validate.Range(min=1, max=MAX_PAGE),
        metadata={"description": f"From 1, at most {MAX_PAGE:,}."},
    )
    limit = fields.Integer(
        load_default=DEFAULT_LIMIT,
        validate=validate.Range(min=1, max=MAX_LIMIT),
        metadata={"description": f"Page size, 1-{MAX_LIMIT}; default {DEFAULT_LIMIT}."},
    )


class SortedPageQuerySchema(PageQuerySchema):
    """A list that also takes `sortOrder` (the delivery log, stored conversions)."""

    sort_order = fields.String(
        load_default=DESCENDING,
        validate=validate.OneOf((ASCENDING, DESCENDING)),
        metadata={"description": "By creation time; default `desc`, newest first."},
    )


class PageMetaSchema(ApiSchema):
    page = fields.Integer(
        required=True, metadata={"description": "Current page, from 1.", "example": 1}
    )
    limit = fields.Integer(
        required=True, metadata={"description": "Page size, 1-100.", "example": 20}
    )
    total = fields.Integer(
        required=True,
        metadata={
            "description": "Matching records; above 10,000 a lower bound (see `totalExact`).",
            "example": 1,
        },
    )
    total_pages = fields.Integer(
        required=True, metadata={"description": "Pages of `total`.", "example": 1}
    )
    has_next = fields.Boolean(
        required=True, metadata={"description": "Always exact.", "example": False}
    )
    total_exact = fields.Boolean(
        required=True,
        metadata={
            "description": "False when more than 10,000 records match past the requested "
            "page: counting them all would make every page slow, so `total` stops there."
        },
    )


def _envelope_fields(data: fields.Field | None, meta: fields.Field | None) -> dict:
    """The fields in SPEC order; `data` and `meta` vary by use."""
    declared = {
        "status": fields.Boolean(required=True, metadata={"description": "`true` on success."}),
        "status_code": fields.Integer(
            required=True, metadata={"description": "The HTTP status of the answer, repeated."}
        ),
        "message": fields.String(
            required=True, metadata={"description": "Human-readable; not for automation."}
        ),
    }
    if data is not None:
        declared["data"] = data
    declared["request_id"] = fields.String(
        required=True, metadata={"description": "Also sent as the X-Request-Id header."}
    )
    if meta is not None:
        declared["meta"] = meta
    return declared


EnvelopeSchema = ApiSchema.from_dict(
    _envelope_fields(
        fields.Raw(
            metadata={
                "description": "The operation's result: an object, or a list of them; each "
                "operation states its own."
            }
        ),
        # Already dumped by the operation (PageMetaSchema): a second pass would look for the
        # snake_case attributes in the camelCase dict and drop them.
        fields.Raw(
            metadata={
                "type": "object",
                "description": "On paged lists only: where the page stands.",
            }
        ),
    ),
    name="Envelope",
)


class ErrorEnvelopeSchema(ApiSchema):
    status = fields.Boolean(required=True, metadata={"description": "Always `false`."})
    status_code = fields.Integer(
        required=True, metadata={"description": "The HTTP status of the answer, repeated."}
    )
    message = fields.String(
        required=True, metadata={"description": "What went wrong, for people; may change."}
    )
    error_code = fields.String(
        required=True, metadata={"description": "Stable, for automation.", "enum": ERROR_CODES}
    )
    request_id = fields.String(
        required=True,
        metadata={"description": "Also sent as the X-Request-Id header; quote it to support."},
    )
    errors = fields.Dict(
        keys=fields.String(),
        values=fields.List(fields.String()),
        metadata={
            "description": "VALIDATION_ERROR only: messages per field; nested fields as dotted "
            "paths (`scopes.0`)."
        },
    )


@cache
def envelope_for(
    data_schema: type[Schema],
    *,
    many: bool = False,
    paged: bool = False,
    meta: type[Schema] | None = None,
):
    """A named envelope schema whose `data` is `data_schema` and whose `meta` is the paging
    (`paged`) or `meta` (for the OpenAPI document)."""
    name = data_schema.__name__.removesuffix("Schema") + ("List" if many else "") + "Envelope"
    meta = PageMetaSchema if paged else meta
    return ApiSchema.from_dict(
        _envelope_fields(
            fields.Nested(data_schema, many=many, required=True),
            fields.Nested(meta, required=True) if meta is not None else None,
        ),
        name=name,
    )
