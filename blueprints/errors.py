"""One handler per error type, registered on the app: domain errors, HTTP errors, unreachable
backing services and the unexpected all leave as the envelope (HTML only for a browser asking for
a page outside the API)."""

from __future__ import annotations

import logging

import redis.exceptions
import sqlalchemy.exc
from flask import Flask, render_template, request
from gunicorn.http.errors import (  # type: ignore[import-untyped]  # gunicorn ships no types
    NoMoreData,
    ParseException,
)
from werkzeug.exceptions import BadRequest, HTTPException

from blueprints.envelope import failure, request_id
from extensions import db
from observability.metrics import count_backing_service_error
from services.errors import DomainError, ValidationFailed

log = logging.getLogger("brand_api.errors")

STATUS_OF = {
    "VALIDATION_ERROR": 400,
    "UNAUTHORIZED": 401,
    "FORBIDDEN": 403,
    "NOT_FOUND": 404,
    "CONFLICT": 409,
    "RATE_LIMITED": 429,
    "INTERNAL_ERROR": 500,
    "SERVICE_UNAVAILABLE": 503,
}
_HTTP_ERROR_CODES = {
    400: ("VALIDATION_ERROR", "The request could not be understood"),
    404: ("NOT_FOUND", "No such route"),
    405: ("METHOD_NOT_ALLOWED", "Method not allowed on this route"),
    408: ("REQUEST_TIMEOUT", "The request's body did not arrive in time"),
    413: ("PAYLOAD_TOO_LARGE", "Request body exceeds the 64 KiB limit"),
    414: ("VALIDATION_ERROR", "The request's URL is longer than the server reads"),
    415: (
        "UNSUPPORTED_MEDIA_TYPE",
        "The request body must be JSON: send it with Content-Type: application/json",
    ),
    429: ("RATE_LIMITED", "Too many requests"),
    431: ("VALIDATION_ERROR", "The request's headers are larger than the server reads"),
}


def register_error_handlers(app: Flask) -> None:
    app.register_error_handler(DomainError, handle_domain_error)
    app.register_error_handler(HTTPException, handle_http_error)
    app.register_error_handler(ParseException, handle_unreadable_body)
    app.register_error_handler(NoMoreData, handle_unreadable_body)
    app.register_error_handler(sqlalchemy.exc.OperationalError, handle_backing_service_down)
    app.register_error_handler(sqlalchemy.exc.InterfaceError, handle_backing_service_down)
    app.register_error_handler(redis.exceptions.ConnectionError, handle_backing_service_down)
    app.register_error_handler(redis.exceptions.TimeoutError, handle_backing_service_down)
    app.register_error_handler(sqlalchemy.exc.DBAPIError, handle_database_error)
    app.register_error_handler(sqlalchemy.exc.TimeoutError, handle_pool_exhausted)
    app.register_error_handler(Exception, handle_unexpected)


def handle_domain_error(error: DomainError):
    db.session.rollback()
    errors = error.errors if isinstance(error, ValidationFailed) else None
    headers = {}
    if error.retry_after is not None:
        headers["Retry-After"] = str(error.retry_after)
    status = STATUS_OF[error.code]
    if _wants_html():
        return _html_error(status, error.message)
    return failure(status, error.code, error.message, errors=errors, headers=headers)


def handle_http_error(error: HTTPException):
    db.session.rollback()
    status = error.code or 500
    code, message = http_error(status, error.name)
    headers = {k: v for k, v in error.get_headers() if k.lower() in {"allow", "retry-after"}}
    if _wants_html():
        return _html_error(status, message, headers)
    return failure(status, code, message, headers=headers)


def handle_unreadable_body(_error: Exception):
    """gunicorn found the body malformed (a bad chunk) or cut short only as the app read it:
    the client's request is at fault, as when gunicorn refuses it before the app (400)."""
    return handle_http_error(BadRequest())


def http_error(status: int, name: str) -> tuple[str, str]:
    """The `errorCode` and message of an HTTP error the app did not raise itself (werkzeug's,
    gunicorn's): its own where the table has one, else by its class, with its `name`."""
    fallback = ("INTERNAL_ERROR" if status >= 500 else "VALIDATION_ERROR", name)
    return _HTTP_ERROR_CODES.get(status, fallback)


def handle_backing_service_down(error: Exception):
    db.session.rollback()
    service = "redis" if isinstance(error, redis.exceptions.RedisError) else "database"
    count_backing_service_error(service, "request")
    log.error(
        "backing service unreachable request_id=%s error=%s", request_id(), type(error).__name__
    )
    if _wants_html():
        return _html_error(503, "A backing service is unavailable; retry shortly")
    return failure(
        503,
        "SERVICE_UNAVAILABLE",
        "A backing service is unavailable; nothing was changed, retry shortly",
        headers={"Retry-After": "5"},
    )


def handle_pool_exhausted(_error: sqlalchemy.exc.TimeoutError):
    """No pooled connection came within the pool's timeout (app.ENGINE_OPTIONS): 503, as for a
    busy work slot, and the caller comes back in a second."""
    db.session.rollback()
    message = "This server is busy; retry after 1 second"
    if _wants_html():
        return _html_error(503, message, {"Retry-After": "1"})
    return failure(503, "SERVICE_UNAVAILABLE", message, headers={"Retry-After": "1"})


def handle_database_error(error: sqlalchemy.exc.DBAPIError):
    """A lost connection is an unavailable database whatever class the driver gives it (the
    server ending an idle transaction, say, which psycopg calls an InternalError)."""
    if error.connection_invalidated:
        return handle_backing_service_down(error)
    return handle_unexpected(error)


def handle_unexpected(error: Exception):
    db.session.rollback()
    # The traceback goes to the log under the request id the caller was given, never to them.
    log.exception("unexpected error request_id=%s", request_id())
    if _wants_html():
        return _html_error(500, "Something went wrong on our side")
    return failure(
        500,
        "INTERNAL_ERROR",
        f"An unexpected error occurred; quote request id {request_id()} to support",
    )


def _wants_html() -> bool:
    """A browser asking for a page outside the JSON API gets HTML; everything else JSON."""
    if request.path.startswith("/api/") or request.path in {"/healthz", "/readyz"}:
        return False
    if request.path.startswith("/dashboard"):
        return True
    best = request.accept_mimetypes.best_match(["application/json", "text/html"])
    return best == "text/html"


def _html_error(status: int, message: str, headers: dict | None = None):
    # htmx asked for a fragment: the dashboard's script shows this one as a notice.
    template = "dashboard/_error.html" if request.headers.get("HX-Request") else "error.html"
    body = render_template(template, status=status, message=message, request_id=request_id())
    return body, status, headers or {}
