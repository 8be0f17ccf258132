"""The dashboard's one authentication decorator and its CSRF check.

A session holds the id of the API key it signed in with (never the secret) and a CSRF token.
Every request looks the key up again, so a revoked key signs its sessions out at once. Every
state-changing request must carry the session's CSRF token, in the `X-CSRF-Token` header (htmx
sends it from `hx-headers` on <body>) or the `csrf_token` form field (plain forms).
"""

from __future__ import annotations

import functools
import hmac
import secrets
from urllib.parse import urlsplit

from flask import flash, g, redirect, request, session, url_for
from flask.sessions import SecureCookieSessionInterface

from blueprints.dashboard import DASHBOARD_PREFIX, dashboard
from models.api_key import WRITE
from services.authentication import Caller, authenticate_key_id, authorize
from services.errors import Forbidden, Unauthorized

CSRF_HEADER = "X-CSRF-Token"
CSRF_FIELD = "csrf_token"
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class DashboardCookieSessions(SecureCookieSessionInterface):
    """Flask's signed-cookie sessions, opened without parsing cookies or building a signer when
    the request cannot carry the session cookie (every JSON API request, any first visit):
    Flask does both for every request, 1-2% of a postback's CPU."""

    def open_session(self, app, request):
        cookies = request.environ.get("HTTP_COOKIE", "")
        if app.secret_key and self.get_cookie_name(app) not in cookies:
            return self.session_class()
        return super().open_session(app, request)


class SignedOut(Exception):
    """The request needs a signed-in session and has none (or its key was revoked)."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message)
        self.message = message


def signed_in(*, write: bool = False):
    """Require a session whose key is still active; with `write`, a key with write scope.

    The view finds the caller in `current_caller()`.
    """

    def decorator(view):
        @functools.wraps(view)
        def signed_in_view(*args, **kwargs):
            try:
                caller = authenticate_key_id(session.get("key_id"))
            except Unauthorized as error:
                had_session = "key_id" in session
                end_session()
                raise SignedOut(error.message if had_session else None) from None
            authorize(caller, caller.brand_id, WRITE if write else None)
            g.caller = caller
            return view(*args, **kwargs)

        vars(signed_in_view)["requires_write"] = write  # a function attribute: mypy types none
        return signed_in_view

    return decorator


def current_caller() -> Caller:
    return g.caller


def can_write() -> bool:
    caller = g.get("caller")
    return caller is not None and WRITE in caller.scopes


def start_session(caller: Caller, key_prefix: str) -> None:
    """Sign in as `caller`'s key: a new session (and CSRF token), so nothing carries over.

    The key's prefix (what every key listing shows, never the secret) names it in the top bar.
    """
    session.clear()
    session["key_id"] = caller.key_id
    session["key_prefix"] = key_prefix
    session["csrf_token"] = secrets.token_urlsafe(32)


def end_session() -> None:
    session.clear()


def csrf_token() -> str:
    if "csrf_token" not in session:
        session["csrf_token"] = secrets.token_urlsafe(32)
    return session["csrf_token"]


def safe_next(target: str | None) -> str:
    """Where to go after signing in: only a dashboard path of this site, never elsewhere."""
    if target:
        parts = urlsplit(target)
        if not parts.scheme and not parts.netloc and parts.path.startswith(DASHBOARD_PREFIX):
            return target
    return url_for("dashboard.overview")


def is_htmx() -> bool:
    return request.headers.get("HX-Request") == "true"


@dashboard.before_request
def check_csrf_token() -> None:
    if request.method in _SAFE_METHODS:
        return
    presented = request.headers.get(CSRF_HEADER) or request.form.get(CSRF_FIELD) or ""
    expected = session.get("csrf_token")
    if not expected or not hmac.compare_digest(presented.encode(), expected.encode()):
        raise Forbidden("The form has expired or did not come from this site; reload the page")


@dashboard.errorhandler(SignedOut)
def send_to_sign_in(error: SignedOut):
    if error.message:
        flash(error.message, "warning")
    if is_htmx():
        # Back to the page the fragment was for, not to the fragment's own URL; and tell htmx
        # to navigate, or it would swap the sign-in page into the fragment's place.
        current = urlsplit(request.headers.get("HX-Current-URL", ""))
        back_to: str | None = current.path + (f"?{current.query}" if current.query else "")
        return "", 200, {"HX-Redirect": url_for("dashboard.sign_in", next=back_to or None)}
    back_to = request.full_path.rstrip("?") if request.method == "GET" else None
    return redirect(url_for("dashboard.sign_in", next=back_to), code=303)


@dashboard.context_processor
def dashboard_context() -> dict:
    return {
        "csrf_token": csrf_token,
        "can_write": can_write(),
        "caller": g.get("caller"),
        "session_key_prefix": session.get("key_prefix"),
    }


@dashboard.after_request
def vary_on_htmx(response):
    # The same URL answers a whole page or a fragment; caches must keep them apart. Pages may
    # show a one-time secret: no cache may keep any of them.
    response.vary.add("HX-Request")
    response.headers["Cache-Control"] = "no-store"
    return response
