"""gunicorn's own refusals, in CONTRACT's envelope like every other answer.

gunicorn answers some requests before the app sees them: a request line longer than
`limit_request_line` (414), more or larger headers than `limit_request_fields` and
`limit_request_field_size` allow (431), a malformed request line, method, version, header or
chunk (400), and a few more. Every worker class answers them in `Worker.handle_error`, which picks
the status and writes it with `gunicorn.util.write_error`, an HTML page. That one function is
replaced here, in each worker once the app is loaded (gunicorn.conf.py, `post_worker_init`): a
worker class of our own would have to copy `handle_error`'s mapping of exceptions to statuses,
which grows with gunicorn's releases, while `write_error(sock, status, reason, message)` has kept
its signature since gunicorn 19. tests/test_hostile_input.py holds a real gunicorn to it.
"""

from __future__ import annotations

import inspect
import json
import logging

from gunicorn import util  # type: ignore[import-untyped]  # gunicorn ships no types

from blueprints.envelope import REQUEST_ID_HEADER, error_body, new_request_id
from blueprints.errors import http_error

log = logging.getLogger("brand_api.errors")
_WRITE_ERROR_PARAMETERS = ["sock", "status_int", "reason", "mesg"]


def answer_refusals_in_the_envelope(strict_transport_security: str | None) -> None:
    """From now on, this process writes gunicorn's refusals as the envelope, with the headers
    the app gives every answer (`strict_transport_security`: production's, or None)."""
    hook = getattr(util, "write_error", None)
    if not callable(hook) or list(inspect.signature(hook).parameters) != _WRITE_ERROR_PARAMETERS:
        # A gunicorn that changed the hook: its refusals stay HTML, and the operator is told.
        log.warning("gunicorn's write_error changed: its own refusals are answered in HTML")
        return
    headers = {
        "Content-Type": "application/json",
        "Connection": "close",
        "X-Content-Type-Options": "nosniff",
        "X-Frame-Options": "DENY",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-store",
    }
    if strict_transport_security is not None:
        headers["Strict-Transport-Security"] = strict_transport_security

    def write_refusal(sock, status_int: int, reason: str, mesg: str) -> None:
        # `mesg` quotes what the client sent (a header, the request line): never echoed.
        code, message = http_error(status_int, reason)
        identifier = new_request_id()
        envelope = error_body(status_int, code, message, identifier)
        body = json.dumps(envelope, separators=(",", ":")).encode()
        head = {**headers, REQUEST_ID_HEADER: identifier, "Content-Length": str(len(body))}
        lines = [f"HTTP/1.1 {status_int} {reason}", *(f"{k}: {v}" for k, v in head.items())]
        util.write_nonblock(sock, ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)

    util.write_error = write_refusal
