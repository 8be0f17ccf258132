"""The OpenAPI 3 document, generated from the routes' declared operations and their marshmallow
schemas; never written by hand. A route under /api/v1 without a declaration is left out, and a
test fails on it."""

from __future__ import annotations

import copy
import re

from apispec import APISpec
from apispec.ext.marshmallow import MarshmallowPlugin
from flask import Flask, current_app, has_request_context, jsonify, request

from blueprints.api import API_PREFIX, api
from models.api_key import WRITE
from models.event_catalog import SAMPLE_RECORDS
from schemas.base import camelcase
from schemas.envelope import ErrorEnvelopeSchema, envelope_for

OPENAPI_PATH = "/openapi.json"
_PATH_PARAMETER = re.compile(r"<(?:[a-z_]+:)?([a-z_]+)>")

# Every id a path carries starts with its type's prefix (CONTRACT 3); the pattern says so, which
# also settles which path a URL is (see API_DESCRIPTION, "Paths").
PATH_PARAMETER_PREFIXES = {
    "brandId": "brd",
    "keyId": "key",
    "endpointId": "whe",
    "deliveryId": "whd",
    "campaignId": "cmp",
    "dealId": "deal",
    "linkId": "lnk",
    "placementId": "plc",
    "holdId": "esc",
    "conversionId": "conv",
}

PATH_PARAMETER_DESCRIPTIONS = {
    "brandId": "The brand workspace id (`brd_…`); must be the brand of the credential.",
    "keyId": "An API key id (`key_…`) from create-key or fetch-keys.",
    "endpointId": "A webhook endpoint id (`whe_…`) from register-endpoint or fetch-endpoints.",
    "deliveryId": "A webhook delivery id (`whd_…`) from fetch-deliveries, send-test or redeliver.",
    "campaignId": "A campaign id (`cmp_…`) from fetch-campaigns or an event.",
    "dealId": "A deal id (`deal_…`) from fetch-deals or an event.",
    "linkId": "A tracked link id (`lnk_…`) from fetch-links.",
    "placementId": "A placement id (`plc_…`) from fetch-placements or an event.",
    "holdId": "An escrow hold id (`esc_…`) from fetch-holds or an event.",
    "conversionId": "A conversion id (`conv_…`) from record-postback, fetch-postbacks or a "
    "`conversion.recorded` event.",
}

_ERROR_RESPONSES = {
    "ValidationError": (400, "VALIDATION_ERROR: the body or query is invalid; see `errors`."),
    "Unauthorized": (401, "UNAUTHORIZED: missing, malformed, unknown or revoked credential."),
    "Forbidden": (403, "FORBIDDEN: the credential is of another brand, or lacks the scope."),
    "NotFound": (404, "NOT_FOUND: no such record in this brand."),
    "MethodNotAllowed": (
        405,
        "METHOD_NOT_ALLOWED: the path exists; the `Allow` header lists its methods.",
    ),
    "Conflict": (
        409,
        "CONFLICT: the same Idempotency-Key is still in flight; retry after `Retry-After`.",
    ),
    "PayloadTooLarge": (413, "PAYLOAD_TOO_LARGE: the body is over 64 KiB."),
    "RateLimited": (
        429,
        "RATE_LIMITED: too many requests for this key; retry after `Retry-After`.",
    ),
    "InternalError": (500, "INTERNAL_ERROR: unexpected; quote the requestId to support."),
    "ServiceUnavailable": (503, "SERVICE_UNAVAILABLE: database or Redis unreachable; retry."),
}

API_DESCRIPTION = """\
The server-to-server interface for a brand's backend: API keys, signed outbound webhooks,
idempotent conversion postbacks and read-only views of the brand's data.

Every response is an envelope: `status`, `statusCode`, `message`, `data` (on success),
`errorCode` (on failure), `requestId` (also the `X-Request-Id` header) and `meta` (on paged lists).
Authenticate with `X-Api-Key: svc_live_…` (or `Authorization: Bearer svc_live_…`); the first key is
created with the bootstrap token support issues (`X-Service-Bootstrap-Token: bst_…`).

**Paths:** `/webhook/{endpointId}/…` and `/webhook/deliveries/{deliveryId}` look alike to a
linter (could `deliveries` be an endpoint id?). It never is: every id starts with its type's
prefix, which each path parameter's `pattern` states (`whe_…` for an endpoint), and a literal
segment is always matched before a parameter.
"""
LICENSE = {"name": "Proprietary", "anchor": "license"}


@api.get(OPENAPI_PATH)
def openapi_document():
    return jsonify(openapi_spec(current_app))


def openapi_spec(app: Flask) -> dict:
    """The document for `app` as this request sees it: built once per process, with absolute
    URLs of the address the request came to, so that a client generated from it needs no
    base URL guessed (behind a proxy, the app must see the original host and scheme)."""
    if "openapi" not in app.extensions:
        app.extensions["openapi"] = build_openapi(app)
    built = app.extensions["openapi"]
    root = request.url_root.rstrip("/") if has_request_context() else ""
    info = built["info"] | {
        "license": {"name": LICENSE["name"], "url": f"{root}/docs#{LICENSE['anchor']}"}
    }
    servers = [{"url": root + API_PREFIX, "description": "This deployment"}]
    return built | {"info": info, "servers": servers}


def build_openapi(app: Flask) -> dict:
    spec = APISpec(
        title="Brand Server-to-Server API",
        version="1",
        openapi_version="3.0.3",
        plugins=[MarshmallowPlugin()],
        info={"description": API_DESCRIPTION},
        servers=[{"url": API_PREFIX, "description": "This deployment"}],
    )
    spec.components.security_scheme(
        "ApiKey", {"type": "apiKey", "in": "header", "name": "X-Api-Key"}
    )
    spec.components.security_scheme(
        "BootstrapToken", {"type": "apiKey", "in": "header", "name": "X-Service-Bootstrap-Token"}
    )
    spec.components.security_scheme(
        "Bearer",
        {
            "type": "http",
            "scheme": "bearer",
            "description": "The API key (or, on create-key "
            "only, the bootstrap token) as `Authorization: Bearer …`.",
        },
    )
    spec.components.schema("ErrorEnvelope", schema=ErrorEnvelopeSchema)
    for name, (_status, description) in _ERROR_RESPONSES.items():
        spec.components.response(
            name,
            {
                "description": description,
                "content": {"application/json": {"schema": "ErrorEnvelope"}},
            },
        )

    for rule in sorted(app.url_map.iter_rules(), key=lambda r: r.rule):
        view = app.view_functions.get(rule.endpoint)
        declared = getattr(view, "operation", None)
        if not rule.rule.startswith(API_PREFIX) or declared is None:
            continue
        path = _PATH_PARAMETER.sub(
            lambda m: "{" + camelcase(m.group(1)) + "}", rule.rule[len(API_PREFIX) :]
        )
        operations = {
            method.lower(): _operation(declared, getattr(view, "auth", None), rule.arguments)
            for method in sorted(rule.methods - {"HEAD", "OPTIONS"})
        }
        spec.path(path=path, operations=operations)
    document = spec.to_dict()
    # Each record's example is a whole, consistent record (an active campaign with its
    # publishedAt and no completedAt), not one assembled field by field.
    schemas = document["components"]["schemas"]
    for name, record in SAMPLE_RECORDS.items():
        schemas[name]["example"] = copy.deepcopy(dict(record))
    return document


def _operation(declared, auth, arguments) -> dict:
    parameters = [
        {
            "in": "path",
            "name": camelcase(name),
            "required": True,
            "schema": _path_parameter_schema(camelcase(name)),
            "description": PATH_PARAMETER_DESCRIPTIONS.get(camelcase(name), ""),
        }
        for name in sorted(arguments)
    ]
    if declared.query is not None:
        parameters.append({"in": "query", "schema": declared.query})
    if declared.headers is not None:
        parameters.append({"in": "header", "schema": declared.headers})
    responses: dict = {}
    if declared.response is not None:
        success = {declared.status: declared.message} | declared.other_statuses
        for status, message in success.items():
            schema = declared.other_schemas.get(status, declared.response)
            responses[str(status)] = {
                "description": message,
                "content": {
                    "application/json": {
                        "schema": envelope_for(schema, many=declared.many, paged=declared.paged)
                    }
                },
            }
    for name, (status, _description) in _ERROR_RESPONSES.items():
        if _may_fail_with(status, declared, auth, arguments):
            responses[str(status)] = name
    document = {
        "operationId": declared.operation_id,
        "summary": declared.summary,
        "description": declared.description + _scope_note(auth),
        "tags": [declared.tag],
        "parameters": parameters,
        "responses": responses,
    }
    if declared.callbacks:
        document["callbacks"] = declared.callbacks
    if declared.body is not None:
        document["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": declared.body}},
        }
    if auth is not None:
        first = "BootstrapToken" if auth.bootstrap_token else "ApiKey"
        document["security"] = [{first: []}, {"Bearer": []}]
    return document


def _path_parameter_schema(name: str) -> dict:
    prefix = PATH_PARAMETER_PREFIXES.get(name)
    if prefix is None:
        return {"type": "string"}
    return {"type": "string", "pattern": f"^{prefix}_[0-9a-z]+$", "example": _example_id(prefix)}


def _example_id(prefix: str) -> str:
    return f"{prefix}_01jd3k9m2x4q8r7t6v5w4y3z2a"


def _may_fail_with(status: int, declared, auth, arguments) -> bool:
    if status in (405, 409, 429):
        return status in declared.errors  # described once in components for every client
    if status == 400:
        return any(
            schema is not None for schema in (declared.body, declared.query, declared.headers)
        )
    if status in (401, 403):
        return auth is not None
    if status == 404:
        return len(arguments - {"brand_id"}) > 0 or status in declared.errors
    if status == 413:
        return declared.body is not None
    return True


def _scope_note(auth) -> str:
    if auth is None:
        return ""
    if auth.bootstrap_token:
        return "\n\n**Credential:** bootstrap token only."
    if auth.scope is None:
        return "\n\n**Credential:** any API key of the brand, `read` or `write`."
    scope = "write" if auth.scope == WRITE else "read"
    return f"\n\n**Credential:** API key with the `{scope}` scope."
