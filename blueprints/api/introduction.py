"""The document's `info.description`: what every operation shares (credentials, the envelope,
the error codes) and how webhooks are delivered, in Markdown. Its tables are built from the
envelope schemas, the error responses and the delivery headers, so a renderer shows them as they
are; its `##` headings are the reference's first sections (`/docs#description/envelope`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from marshmallow import Schema, fields

from blueprints.api.code_samples import CREDENTIAL_VARIABLES
from blueprints.api.webhook_events import ANY_EVENT, delivery_headers
from schemas.envelope import ERROR_CODES, EnvelopeSchema, ErrorEnvelopeSchema, PageMetaSchema

LICENSE_HEADING = "License"
_JSON_TYPES: tuple[tuple[type[fields.Field], str], ...] = (
    (fields.Boolean, "boolean"),
    (fields.Integer, "integer"),
    (fields.String, "string"),
    (fields.Dict, "object"),
    (fields.Nested, "object"),
    (fields.Raw, "object or array"),
)

_OVERVIEW = """\
The server-to-server interface for a brand's backend: API keys, signed outbound webhooks,
idempotent conversion postbacks and read-only views of the brand's data."""

_AUTHENTICATION = f"""\
## Authentication

Send an API key as `X-Api-Key: svc_live_…` (or `Authorization: Bearer svc_live_…`). The brand's
first key is created with the bootstrap token support issues (`X-Service-Bootstrap-Token: bst_…`).
Each operation states the credential and scope it needs, and its rate limit.

Each operation's curl command uses shell variables, as the README's walkthrough does:
`${CREDENTIAL_VARIABLES["ApiKey"]}` (an API key), `${CREDENTIAL_VARIABLES["BootstrapToken"]}` \
(a bootstrap token), `$BRAND` (the brand's id: filled in when you open this page from the
dashboard) and the ids in the path (`$ENDPOINT`, `$DELIVERY`, `$KEY_ID`, …)."""

_WEBHOOKS = f"""\
## Webhooks

Each event an endpoint subscribes to is POSTed to its URL as JSON: one entry of **Webhook
events** per event name, with its body's schema and an example. Answer with any 2xx within
`WEBHOOK_TIMEOUT` (10 s by default) to acknowledge it; anything else (3xx included: redirects are
not followed), a timeout or a connection error is a failed attempt. Retries follow
`WEBHOOK_RETRY_SCHEDULE` (by default 5 s, 5 min, 30 min, 2 h, 5 h, 10 h and 10 h after the
previous attempt, ±10%). An endpoint whose attempts keep failing (by default at least 15 in a row
over three days) is disabled and its pending deliveries fail; re-enable it with
updateWebhookEndpoint.

Deliveries are at least once: verify the signature, then deduplicate on `X-Service-Delivery`.
Every delivery carries:

{{headers}}

Every field of an event's `data` is always sent (`null` when it has no value) and no other: the
schemas say so with `required` and `additionalProperties: false`. Each event's body is a named
schema (`DealCompletedEvent`, …) and `{ANY_EVENT}` is any of them, told apart by `type`: generate
types from this document (the README shows how) and parse a delivery in one call."""

_PATHS = """\
## Paths

`/webhook/{endpointId}/…` and `/webhook/deliveries/{deliveryId}` look alike to a
linter (could `deliveries` be an endpoint id?). It never is: every id starts with its type's
prefix, which each path parameter's `pattern` states (`whe_…` for an endpoint), and a literal
segment is always matched before a parameter."""

_LICENSE = f"""\
## {LICENSE_HEADING}

Proprietary: this interface and its documentation are for integrating with this service."""


def introduction(error_responses: Mapping[str, tuple[int, str, tuple[str, ...]]]) -> str:
    """The whole description; `error_responses` maps each error response's name to its status,
    its `ERROR_CODE: meaning` description and its headers."""
    envelope = "\n\n".join(
        (
            "## Envelope",
            "Every JSON answer, success or failure, has the same outer shape; each operation "
            "states only what it puts in `data`. On success:",
            _field_table(EnvelopeSchema()),
            "`meta`, on paged lists:",
            _field_table(PageMetaSchema()),
            "On failure:",
            _field_table(ErrorEnvelopeSchema()),
        )
    )
    errors = "\n\n".join(
        (
            "## Errors",
            "A failure's `errorCode` is stable and meant for automation; `message` is for "
            "people. Quote `requestId` when asking support about a request.",
            _error_table(error_responses),
        )
    )
    webhooks = _WEBHOOKS.replace(
        "{headers}",
        _table(("Header", "Value"), ((f"`{name}`", text) for name, text in delivery_headers())),
    )
    return "\n\n".join((_OVERVIEW, _AUTHENTICATION, envelope, errors, webhooks, _PATHS, _LICENSE))


def _field_table(schema: Schema) -> str:
    rows = (
        (
            f"`{field.data_key or name}`",
            _json_type(field),
            "always" if field.required else "when it applies",
            field.metadata.get("description", ""),
        )
        for name, field in schema.fields.items()
    )
    return _table(("Field", "Type", "Present", "Meaning"), rows)


def _json_type(field: fields.Field) -> str:
    declared = field.metadata.get("type")
    return declared or next(name for kind, name in _JSON_TYPES if isinstance(field, kind))


def _error_table(error_responses: Mapping[str, tuple[int, str, tuple[str, ...]]]) -> str:
    by_code = {}
    for status, description, _headers in error_responses.values():
        code, _, meaning = description.partition(": ")
        by_code[code] = (str(status), meaning)
    rows = ((f"`{code}`", *by_code[code]) for code in ERROR_CODES)
    return _table(("errorCode", "HTTP status", "Meaning"), rows)


def _table(header: tuple[str, ...], rows: Iterable[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)
