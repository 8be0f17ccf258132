"""The OpenAPI 3 document, generated from the routes' declared operations and their marshmallow
schemas; never written by hand. A route under /api/v1 without a declaration is left out, and a
test fails on it."""

from __future__ import annotations

import copy
import re
from typing import cast

from apispec import APISpec
from apispec.ext.marshmallow import MarshmallowPlugin, OpenAPIConverter, resolver
from flask import Flask, current_app, has_request_context, jsonify, request
from werkzeug.routing import Rule

from blueprints.api import API_PREFIX, IdConverter, api
from blueprints.api.code_samples import add_code_samples, with_server
from blueprints.api.introduction import LICENSE_HEADING, introduction
from blueprints.api.operations import NUL_FREE_PATTERN
from blueprints.api.response_examples import add_response_examples
from blueprints.api.webhook_events import (
    WEBHOOK_TAG,
    WEBHOOK_TAG_DESCRIPTION,
    add_webhooks,
    register_event_schemas,
)
from models.api_key import WRITE
from models.columns import id_pattern
from models.event_catalog import SAMPLE_RECORDS
from schemas.base import ApiSchema, camelcase
from schemas.envelope import ErrorEnvelopeSchema, envelope_for
from schemas.webhooks import EndpointUrl
from services.endpoint_urls import UrlPolicy, url_pattern
from services.rate_limits import API, POSTBACK

OPENAPI_PATH = "/openapi.json"
_PATH_PARAMETER = re.compile(r"<(?:[a-z_]+(?:\([^)]*\))?:)?([a-z_]+)>")
# The brand in a path is read as any text: a key of another brand, or of no brand, is 403
# whatever the text (docs/decisions.md), so the document states the form of a brand id only.
BRAND_ID_PREFIX = "brd"

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
    "eventId": "An event id (`evt_…`): `id` in a delivery's body, or from fetch-events.",
}

# JSON Schema keywords of OpenAPI 3.1 a field may state in its metadata (apispec's list of what
# it copies is OpenAPI 3.0's).
_PASSED_KEYWORDS = ("contains", "const")
RETRY_AFTER = "Retry-After"
RATE_LIMIT_HEADERS = ("RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset")
_HEADERS = {
    "X-Request-Id": (
        "The `requestId` of the envelope; quote it to support.",
        {"type": "string"},
        True,
    ),
    RETRY_AFTER: ("Seconds to wait before sending the request again.", {"type": "integer"}, False),
    "RateLimit-Limit": (
        "Requests this API key may make in the current window (CONTRACT 9.1). Sent on every "
        "answer to a request with a valid API key.",
        {"type": "integer", "minimum": 0},
        False,
    ),
    "RateLimit-Remaining": (
        "Requests this API key has left in the current window.",
        {"type": "integer", "minimum": 0},
        False,
    ),
    "RateLimit-Reset": (
        "Seconds until the window resets and `RateLimit-Remaining` is full again.",
        {"type": "integer", "minimum": 0},
        False,
    ),
}
_KEYED = ("X-Request-Id", *RATE_LIMIT_HEADERS)  # an answer to a request with a valid key
_ERROR_RESPONSES = {
    "ValidationError": (
        400,
        "VALIDATION_ERROR: the body or query is invalid; see `errors`.",
        _KEYED,
    ),
    "Unauthorized": (
        401,
        "UNAUTHORIZED: missing, malformed, unknown or revoked credential.",
        ("X-Request-Id",),
    ),
    "Forbidden": (
        403,
        "FORBIDDEN: the credential is of another brand, or lacks the scope.",
        _KEYED,
    ),
    "NotFound": (404, "NOT_FOUND: no such record in this brand.", _KEYED),
    "MethodNotAllowed": (
        405,
        "METHOD_NOT_ALLOWED: the path exists; the `Allow` header lists its methods.",
        ("X-Request-Id",),
    ),
    "Conflict": (
        409,
        "CONFLICT: the request conflicts with the brand's state: the same Idempotency-Key is "
        "still in flight (retry after `Retry-After`), or a limit is reached.",
        (*_KEYED, RETRY_AFTER),
    ),
    "PayloadTooLarge": (
        413,
        "PAYLOAD_TOO_LARGE: the body is over 64 KiB.",
        ("X-Request-Id",),
    ),
    "UnsupportedMediaType": (
        415,
        "UNSUPPORTED_MEDIA_TYPE: the body is not declared JSON; send it with "
        "`Content-Type: application/json` (or a `+json` type, any charset).",
        _KEYED,
    ),
    "RateLimited": (
        429,
        "RATE_LIMITED: too many requests for this key, or too many requests from this address "
        "that failed authentication (`AUTH_FAILURES_PER_MINUTE`, default 120: then without "
        "`RateLimit-*`); retry after `Retry-After` seconds.",
        (*_KEYED, RETRY_AFTER),
    ),
    "InternalError": (
        500,
        "INTERNAL_ERROR: unexpected; quote the requestId to support.",
        ("X-Request-Id",),
    ),
    "ServiceUnavailable": (
        503,
        "SERVICE_UNAVAILABLE: database or Redis unreachable, or the server too busy to start "
        "the request in time; nothing was changed, retry after `Retry-After` seconds.",
        ("X-Request-Id", RETRY_AFTER),
    ),
}
# The header a 429 and a 503 always carry.
_REQUIRED_HEADERS = {"RateLimited": {RETRY_AFTER}, "ServiceUnavailable": {RETRY_AFTER}}

LICENSE_NAME = "Proprietary"
# Where a renderer puts the introduction's `## License` (Scalar: `#description/<slug>`).
LICENSE_ANCHOR = "description/" + LICENSE_HEADING.lower()


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
        "license": {"name": LICENSE_NAME, "url": f"{root}/docs#{LICENSE_ANCHOR}"}
    }
    servers = [{"url": root + API_PREFIX, "description": "This deployment"}]
    paths = with_server(built["paths"], root + API_PREFIX)
    return built | {"info": info, "servers": servers, "paths": paths}


def build_openapi(app: Flask) -> dict:
    marshmallow = MarshmallowPlugin()
    spec = APISpec(
        title="Brand Server-to-Server API",
        version="1",
        openapi_version="3.1.0",
        plugins=[marshmallow],
        info={"description": introduction(_ERROR_RESPONSES)},
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
    url_policy = UrlPolicy.for_environment(app.extensions["settings"].app_env)

    def receiver_url_pattern(_converter, field, **_) -> dict:
        return {"pattern": url_pattern(url_policy)} if isinstance(field, EndpointUrl) else {}

    def json_schema_keywords(_converter, field, **_) -> dict:
        # JSON Schema 2020-12 keywords apispec does not copy from a field's metadata.
        return {key: field.metadata[key] for key in _PASSED_KEYWORDS if key in field.metadata}

    # The plugin's converter, made when APISpec initialised the plugin above.
    converter = cast(OpenAPIConverter, marshmallow.converter)
    converter.add_attribute_function(receiver_url_pattern)
    converter.add_attribute_function(json_schema_keywords)
    for name, (description, schema, _required) in _HEADERS.items():
        spec.components.header(name, {"description": description, "schema": schema})
    spec.components.schema("ErrorEnvelope", schema=ErrorEnvelopeSchema)
    for name, (_status, description, _headers_sent) in _ERROR_RESPONSES.items():
        spec.components.response(name, _error_response(name, description))

    register_event_schemas(spec)
    bodies: set[type[ApiSchema]] = set()
    for rule in sorted(app.url_map.iter_rules(), key=lambda r: r.rule):
        view = app.view_functions.get(rule.endpoint)
        declared = getattr(view, "operation", None)
        if not rule.rule.startswith(API_PREFIX) or declared is None:
            continue
        path = _PATH_PARAMETER.sub(
            lambda m: "{" + camelcase(m.group(1)) + "}", rule.rule[len(API_PREFIX) :]
        )
        if declared.body is not None:
            bodies.add(declared.body)
        operations = {
            method.lower(): _operation(declared, getattr(view, "auth", None), rule)
            # Flask gives every rule its methods (Werkzeug types them as optional).
            for method in sorted(cast(set[str], rule.methods) - {"HEAD", "OPTIONS"})
        }
        spec.path(path=path, operations=operations)
    document = spec.to_dict()
    _state_request_rules(document, bodies)
    # Each record's example is a whole, consistent record (an active campaign with its
    # publishedAt and no completedAt), not one assembled field by field.
    schemas = document["components"]["schemas"]
    for name, record in SAMPLE_RECORDS.items():
        schemas[name]["example"] = copy.deepcopy(dict(record))
    add_webhooks(document)
    add_code_samples(document)
    add_response_examples(
        document, {name: status for name, (status, _text, _headers) in _ERROR_RESPONSES.items()}
    )
    document["tags"] = _tags(document)
    return document


def _tags(document: dict) -> list[dict]:
    """The operations' tags in the order of the paths, then the webhooks' (a renderer shows
    them in this order)."""
    names = [
        tag
        for item in (*document["paths"].values(), *document["webhooks"].values())
        for operation in item.values()
        for tag in operation["tags"]
    ]
    described = {WEBHOOK_TAG: WEBHOOK_TAG_DESCRIPTION}
    return [
        {"name": name} | ({"description": described[name]} if name in described else {})
        for name in dict.fromkeys(names)
    ]


def _operation(declared, auth, rule: Rule) -> dict:
    arguments = rule.arguments
    parameters = [
        {
            "in": "path",
            "name": camelcase(name),
            "required": True,
            "schema": _path_parameter_schema(rule, name),
            "description": PATH_PARAMETER_DESCRIPTIONS.get(camelcase(name), ""),
        }
        | _loaded_path_parameter(declared, name)
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
                "headers": _headers(_KEYED if _keyed(auth) else ("X-Request-Id",)),
                "content": {
                    "application/json": {
                        "schema": envelope_for(
                            schema, many=declared.many, paged=declared.paged, meta=declared.meta
                        )
                    }
                },
            }
    for name, (status, description, _headers_sent) in _ERROR_RESPONSES.items():
        if _may_fail_with(status, declared, auth, arguments):
            note = declared.error_notes.get(status)
            responses[str(status)] = (
                name if note is None else _error_response(name, f"{description} {note}")
            )
    document = {
        "operationId": declared.operation_id,
        "summary": declared.summary,
        "description": declared.description + _scope_note(auth),
        "tags": [declared.tag],
        "parameters": parameters,
        "responses": responses,
    }
    if declared.body is not None:
        document["requestBody"] = {
            # rotate-secret's body may be left out; a body with a required field may not.
            "required": _body_is_required(declared.body),
            "content": {"application/json": {"schema": declared.body}},
        }
    if auth is not None:
        first = "BootstrapToken" if auth.bootstrap_token else "ApiKey"
        document["security"] = [{first: []}, {"Bearer": []}]
        document["x-required-scope"] = _required_scope(auth)
        document["x-rate-limit"] = auth.rate_limit
    return document


def _error_response(name: str, description: str) -> dict:
    """The shared error response `name` (a component), or an operation's own telling of it."""
    _status, _description, headers = _ERROR_RESPONSES[name]
    return {
        "description": description,
        "headers": _headers(headers, required=_REQUIRED_HEADERS.get(name, set())),
        "content": {"application/json": {"schema": "ErrorEnvelope"}},
    }


def _headers(names, *, required=frozenset()) -> dict:
    return {
        name: {"$ref": f"#/components/headers/{name}"}
        if name not in required and not _HEADERS[name][2]
        else {"description": _HEADERS[name][0], "schema": _HEADERS[name][1], "required": True}
        for name in names
    }


def _keyed(auth) -> bool:
    """Whether the operation's answers are to a request with a credential (rate limited: an API
    key, or create-key's bootstrap token)."""
    return auth is not None


def _body_is_required(body: type[ApiSchema]) -> bool:
    fields_ = body().load_fields.values()
    return body.min_fields > 0 or any(field.required for field in fields_)


def _required_scope(auth) -> str:
    """`x-required-scope`: what the credential must be, for generators and linters."""
    if auth.bootstrap_token:
        return "bootstrap-token"
    if auth.scope is None:
        return "any"
    return "write" if auth.scope == WRITE else "read"


def _state_request_rules(document: dict, bodies: set[type[ApiSchema]]) -> None:
    """Rules every request is held to, stated on every request field they apply to: no NUL
    character in any query parameter, header or body string (`schemas.base.unstorable_text`,
    applied by `ApiSchema` and the body parser), and `ApiSchema.min_fields` as
    `minProperties`."""
    schemas = document["components"]["schemas"]
    for item in document["paths"].values():
        for operation in item.values():
            for parameter in operation.get("parameters", []):
                if parameter["in"] in ("query", "header"):
                    _refuse_nul(parameter["schema"], schemas, set())
            body = operation.get("requestBody", {}).get("content", {}).get("application/json")
            if body is not None:
                _refuse_nul(body["schema"], schemas, set())
    for body in bodies:
        if body.min_fields:
            schemas[resolver(body)]["minProperties"] = body.min_fields


def _refuse_nul(schema: dict, components: dict, seen: set[str]) -> None:
    ref = schema.get("$ref", "")
    if ref.startswith("#/components/schemas/"):
        name = ref.rsplit("/", 1)[1]
        if name not in seen:
            seen.add(name)
            _refuse_nul(components[name], components, seen)
        return
    if "string" in _types(schema) and not {"pattern", "enum", "format"} & set(schema):
        schema["pattern"] = NUL_FREE_PATTERN
    for nested in (*schema.get("properties", {}).values(), schema.get("items")):
        if isinstance(nested, dict):
            _refuse_nul(nested, components, seen)
    for alternatives in (schema.get("anyOf", []), schema.get("oneOf", [])):
        for nested in alternatives:
            _refuse_nul(nested, components, seen)


def _types(schema: dict) -> list[str]:
    """A schema's `type` as a list (OpenAPI 3.1: `"string"` or `["string", "null"]`)."""
    types = schema.get("type", [])
    return [types] if isinstance(types, str) else types


def _path_parameter_schema(rule: Rule, name: str) -> dict:
    """An id's `pattern` is the very expression the router matches it with (`IdConverter`)."""
    converter = rule._converters[name]  # werkzeug keeps each argument's converter here
    if isinstance(converter, IdConverter):
        prefix = converter.prefix
    elif name == "brand_id":
        prefix = BRAND_ID_PREFIX
    else:
        return {"type": "string"}
    pattern = converter.regex if isinstance(converter, IdConverter) else id_pattern(prefix)
    return {"type": "string", "pattern": f"^{pattern}$", "example": _example_id(prefix)}


def _loaded_path_parameter(declared, name: str) -> dict:
    """A path argument that the operation's `path` schema loads: its field's words and form."""
    field = declared.path().fields.get(name) if declared.path is not None else None
    if field is None:
        return {}
    metadata = field.metadata
    return {
        "description": metadata.get("description", ""),
        "schema": {"type": "string"}
        | {key: metadata[key] for key in ("pattern", "example") if key in metadata},
    }


def _example_id(prefix: str) -> str:
    return f"{prefix}_01jd3k9m2x4q8r7t6v5w4y3z2a"


def _may_fail_with(status: int, declared, auth, arguments) -> bool:
    if status == 429:
        return auth is not None  # every authenticated route is rate limited (CONTRACT 9.1)
    if status in (405, 409):
        return status in declared.errors  # described once in components for every client
    if status == 400:
        return any(
            schema is not None
            for schema in (declared.body, declared.query, declared.headers, declared.path)
        )
    if status in (401, 403):
        return auth is not None
    if status == 404:
        return len(arguments - {"brand_id"}) > 0 or status in declared.errors
    if status in (413, 415):
        return declared.body is not None
    return True


def _scope_note(auth) -> str:
    if auth is None:
        return ""
    if auth.bootstrap_token:
        credential = "bootstrap token only."
    elif auth.scope is None:
        credential = "any API key of the brand, `read` or `write`."
    else:
        credential = f"API key with the `{'write' if auth.scope == WRITE else 'read'}` scope."
    return (
        f"\n\n**Credential:** {credential}\n\n**Rate limit:** {_RATE_LIMIT_NOTES[auth.rate_limit]}"
    )


_RATE_LIMIT_NOTES = {
    API: "`RATE_LIMIT_PER_KEY` per credential (default 6000/minute), shared by every route but "
    "record-postback; over it, 429 `RATE_LIMITED` with `Retry-After`.",
    POSTBACK: "`POSTBACK_RATE_LIMIT_PER_KEY` per API key (default 60000/minute), for this route "
    "alone; over it, 429 `RATE_LIMITED` with `Retry-After`.",
}
