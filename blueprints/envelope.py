"""The one envelope builder (SPEC section 1): every JSON response of the service passes here."""

from __future__ import annotations

import re
import secrets
from functools import cache
from typing import TYPE_CHECKING, cast

from flask import Response, current_app, g, request

if TYPE_CHECKING:
    from marshmallow import Schema

REQUEST_ID_HEADER = "X-Request-Id"
# A caller's own request id is kept when it is safe to echo and to log; otherwise we mint one.
_CALLER_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{8,128}$")


@cache
def _schemas() -> tuple[Schema, Schema]:
    """Made at the first answer, not at import: app.py imports `request_id` from here, and a
    command's app (`flask --app app …`) has no answer to write (docs/benchmarks.md)."""
    from schemas.envelope import EnvelopeSchema, ErrorEnvelopeSchema

    return EnvelopeSchema(), ErrorEnvelopeSchema()


def request_id() -> str:
    if "request_id" not in g:
        incoming = request.headers.get(REQUEST_ID_HEADER, "")
        g.request_id = incoming if _CALLER_REQUEST_ID.match(incoming) else new_request_id()
    return g.request_id


def new_request_id() -> str:
    return "req_" + secrets.token_hex(12)


def success(
    data, *, status_code: int = 200, message: str = "OK", meta: dict | None = None
) -> Response:
    body = {
        "status": True,
        "status_code": status_code,
        "message": message,
        "data": data,
        "request_id": request_id(),
    }
    if meta is not None:
        body["meta"] = meta
    return _json(_schemas()[0].dump(body), status_code)


def failure(
    status_code: int,
    error_code: str,
    message: str,
    *,
    errors: dict[str, list[str]] | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    body = error_body(status_code, error_code, message, request_id(), errors=errors)
    response = _json(body, status_code)
    response.headers.update(headers or {})
    return response


def error_body(
    status_code: int,
    error_code: str,
    message: str,
    request_id: str,
    *,
    errors: dict[str, list[str]] | None = None,
) -> dict:
    """The error envelope as JSON's keys have it; needs no request (gunicorn's own refusals,
    blueprints/gunicorn_refusals.py, are written before the app sees one)."""
    body = {
        "status": False,
        "status_code": status_code,
        "message": message,
        "error_code": error_code,
        "request_id": request_id,
    }
    if errors is not None:
        body["errors"] = errors
    return _schemas()[1].dump(body)


def _json(payload: dict, status_code: int) -> Response:
    # Flask types it as any Response class; a Flask app's response_class is flask.Response.
    response = cast(Response, current_app.json.response(payload))
    response.status_code = status_code
    return response
