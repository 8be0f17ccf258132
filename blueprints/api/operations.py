"""The `operation` decorator: each JSON API route declares its schemas once, and from that one
declaration the request is parsed, the response dumped into the envelope, the transaction
committed, and the OpenAPI document written."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from flask import current_app, request
from marshmallow import Schema, ValidationError
from werkzeug.exceptions import RequestEntityTooLarge, UnsupportedMediaType

from blueprints.envelope import success
from extensions import db
from schemas.base import NUL, ApiSchema, unstorable_text
from schemas.envelope import PageMetaSchema
from services.errors import NotFound, ValidationFailed

# Where errors about the body as a whole (not one field) are reported in `errors`.
BODY = "body"
# No record holds a NUL and PostgreSQL refuses it in text: a NUL anywhere in a query parameter
# or a body is a 400 (`schemas.base.unstorable_text`). The OpenAPI document states it as this
# `pattern` of every such string.
NUL_FREE_PATTERN = r"^[^\x00]*$"
# How deep a body may nest objects and arrays. No operation needs more than a few levels (a
# postback's `metadata` allows 8 of its own); a limit here keeps a 1 KB body of brackets from
# costing a deep recursion anywhere after the parse.
MAX_BODY_DEPTH = 32
_page_meta = PageMetaSchema()


@dataclass(frozen=True)
class Operation:
    operation_id: str
    summary: str
    tag: str
    description: str = ""
    body: type[ApiSchema] | None = None
    query: type[Schema] | None = None
    # Path arguments that are more than an id (`IdConverter`): loaded, in place, by this.
    path: type[Schema] | None = None
    # Request headers the operation reads (its fields' `data_key`s are the header names).
    headers: type[Schema] | None = None
    response: type[Schema] | None = None
    many: bool = False
    # The view returns a `services.pagination.Page`; its paging goes to `meta`.
    paged: bool = False
    # Another `meta` (a cursor's): this schema dumps it from what the view returns.
    meta: type[Schema] | None = None
    status: int = 200
    message: str = "OK"
    # An operation with a second kind of success (a postback's replay): `other_status(result)`
    # returns (status, message) for a result that is one, else None.
    other_status: Callable[[Any], tuple[int, str] | None] | None = None
    other_statuses: dict[int, str] = field(default_factory=dict)  # for the OpenAPI document
    # The schema of another success when it documents the same fields differently (a replay's
    # `replay: true`); the response schema dumps every success alike.
    other_schemas: dict[int, type[Schema]] = field(default_factory=dict)
    errors: tuple[int, ...] = field(default_factory=tuple)
    # What else an error status means for this operation, added to its shared description in
    # the OpenAPI document (fetch-events' 429: its long-poll caps).
    error_notes: dict[int, str] = field(default_factory=dict)


def operation(**declaration):
    """Declare an API operation (see `Operation`); the view receives `body=` and `query=` as
    loaded by their schemas and returns what the response schema dumps."""
    spec = Operation(**declaration)
    body_schema = spec.body() if spec.body else None
    query_schema = spec.query() if spec.query else None
    headers_schema = spec.headers() if spec.headers else None
    path_schema = spec.path() if spec.path else None
    response_schema = spec.response(many=spec.many) if spec.response else None
    meta_schema = _page_meta if spec.paged else spec.meta() if spec.meta else None

    def decorator(view):
        @functools.wraps(view)
        def operation_view(*args, **kwargs):
            _refuse_nul_in_path(kwargs)
            kwargs.update(_load_request(body_schema, query_schema, headers_schema, path_schema))
            result = view(*args, **kwargs)
            # Dumped before the commit, which expires ORM objects: reading them afterwards
            # would cost a SELECT per object to reload what this request just wrote.
            data = response_schema.dump(result) if response_schema is not None else None
            meta = meta_schema.dump(result) if meta_schema is not None else None
            db.session.commit()
            status, message = spec.status, spec.message
            if spec.other_status is not None:
                status, message = spec.other_status(result) or (status, message)
            return success(data, status_code=status, message=message, meta=meta)

        vars(operation_view)["operation"] = spec  # a function attribute: mypy types none
        return operation_view

    return decorator


def _refuse_nul_in_path(path_values: dict) -> None:
    """No record has a NUL in its id, and PostgreSQL refuses NUL in text: say so before a query
    turns it into a server error. (An id's own segment is matched by `IdConverter`, which takes
    no NUL; this is for the brand's, read as any text. Query values are refused by the schema
    that loads them, `ApiSchema`.)"""
    if any(NUL in value for value in path_values.values() if isinstance(value, str)):
        raise NotFound("No such record in this brand")


def _json_body(_schema: Schema | None = None) -> dict:
    """The body as a JSON object every string and number of which can be stored; no body at
    all is an empty object (every field left out).

    :raise UnsupportedMediaType: a body not declared JSON (`application/json` or a `+json`
        type, any parameters): a form, text or multipart body is never guessed at.
    :raise ValidationFailed: naming the field (or `body`) at fault.
    """
    raw = request.get_data(cache=True)  # a declared length over the limit: 413 from werkzeug
    if request.content_length is None and len(raw) >= current_app.config["MAX_CONTENT_LENGTH"]:
        # A chunked body is cut off at the limit without an error; never parse what was cut.
        raise RequestEntityTooLarge()
    if raw and not request.is_json:
        raise UnsupportedMediaType()
    if not raw.strip():
        return {}
    try:
        payload = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise ValidationFailed(
            "Request body must be valid JSON", {BODY: ["Not valid JSON."]}
        ) from None
    except RecursionError:  # the parser's own bound, far deeper than MAX_BODY_DEPTH
        raise _nested_too_deep() from None
    problems = _unstorable_values(payload)
    if not isinstance(payload, dict):
        raise ValidationFailed(
            "Request body must be a JSON object", {BODY: ["Must be a JSON object."]}
        )
    if problems:
        raise ValidationFailed("Request body holds values that cannot be stored", problems)
    return payload


def _nested_too_deep() -> ValidationFailed:
    return ValidationFailed(
        "Request body is nested too deeply",
        {BODY: [f"Objects and arrays may nest at most {MAX_BODY_DEPTH} levels deep."]},
    )


def _unstorable_values(payload) -> dict[str, list[str]]:
    """`{field path: [message]}` for each string holding NUL or a lone surrogate (keys
    included) and each number that is not finite (NaN, Infinity, or beyond a double: 1e400).
    Iterative, so a body of any depth the parser took is walked without recursion.

    :raise ValidationFailed: objects and arrays nest deeper than MAX_BODY_DEPTH.
    """
    problems: dict[str, list[str]] = {}
    stack: list[tuple[object, str, int]] = [(payload, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        items: Iterable[tuple[object, object]]
        if isinstance(value, dict):
            items = value.items()
            if any(unstorable_text(key) for key in value):
                problems[path or BODY] = ["Keys must not contain NUL or lone surrogates."]
        elif isinstance(value, list):
            items = enumerate(value)
        else:
            problem = _unstorable_number(value) or (
                unstorable_text(value) if isinstance(value, str) else None
            )
            if problem:
                problems[path or BODY] = [problem]
            continue
        if depth == MAX_BODY_DEPTH:
            raise _nested_too_deep()
        stack.extend(
            (item, f"{path}.{key}" if path else str(key), depth + 1) for key, item in items
        )
    return problems


def _unstorable_number(value) -> str | None:
    if isinstance(value, float) and not math.isfinite(value):
        return "Must be a finite number: not NaN, Infinity, or beyond ±1.7e308."
    return None


def _load_request(
    body_schema: Schema | None,
    query_schema: Schema | None,
    headers_schema: Schema | None,
    path_schema: Schema | None = None,
) -> dict:
    """The view's `body`, `query` and `headers` arguments, and its path arguments that a
    schema loads; every invalid field of all four is reported in one 400, so a client fixes
    its request in one round."""
    loaded: dict = {}
    errors: dict[str, list[str]] = {}
    sources = (
        ("path", path_schema, lambda _schema: dict(request.view_args or {})),
        ("headers", headers_schema, _declared_headers),
        ("body", body_schema, _json_body),
        ("query", query_schema, lambda _schema: request.args.to_dict(flat=True)),
    )
    for argument, schema, read in sources:
        if schema is None:
            continue
        try:
            if argument == "path":
                # Only the path's arguments the schema declares; the others stay as routed.
                routed = read(schema)
                loaded.update(schema.load({name: routed[name] for name in schema.fields}))
            else:
                loaded[argument] = schema.load(read(schema))
        except ValidationError as error:
            errors.update(flatten_errors(error.messages))
    if errors:
        raise ValidationFailed("Invalid request", errors)
    return loaded


def _declared_headers(schema: Schema) -> dict:
    names = (declared.data_key or name for name, declared in schema.fields.items())
    return {name: request.headers[name] for name in names if name in request.headers}


def flatten_errors(messages, prefix: str = "") -> dict[str, list[str]]:
    """marshmallow's nested messages as `{"dotted.path": [message, ...]}`."""
    if isinstance(messages, list):
        return {prefix if prefix and prefix != "_schema" else BODY: [str(m) for m in messages]}
    flat: dict[str, list[str]] = {}
    for key, value in messages.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        flat.update(flatten_errors(value, path))
    return flat
