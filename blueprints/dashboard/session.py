"""The dashboard's one authentication decorator and its CSRF check.

A session is kept on the server (services.dashboard_sessions): the cookie, Flask's signed one,
holds only the session's random token, its CSRF token and the next page's notices. Every request
opens the session again and looks its key up again, so signing out, revoking the key or the
session's expiry ends it at once for every copy of the cookie. Every state-changing request must
carry the session's CSRF token, in the `X-CSRF-Token` header (htmx sends it from `hx-headers` on
<body>) or the `csrf_token` form field (plain forms).
"""

from __future__ import annotations

import functools
import hmac
import secrets
from datetime import timedelta
from urllib.parse import urlsplit

from flask import current_app, flash, g, redirect, request, session, url_for
from flask.sessions import SecureCookieSessionInterface

from blueprints.dashboard import DASHBOARD_PREFIX, dashboard
from extensions import db
from models.api_key import WRITE
from services import dashboard_sessions
from services.authentication import Caller, authenticate_key_id, authorize
from services.dashboard_sessions import Lifetimes
from services.errors import Forbidden, Unauthorized, ValidationFailed

CSRF_HEADER = "X-CSRF-Token"
CSRF_FIELD = "csrf_token"
# The cookie's name for the session's token (the server keeps only its hash).
SESSION_TOKEN = "sid"  # noqa: S105 - a key of the cookie, not a secret
SESSION_ENDED = "Your session has ended (signed out, or unused for too long); sign in again"
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
            token = session.get(SESSION_TOKEN)
            opened = dashboard_sessions.open_session(token, lifetimes=session_lifetimes())
            try:
                if opened is None:
                    raise Unauthorized(SESSION_ENDED)
                caller = authenticate_key_id(opened.key_id)
            except Unauthorized as error:
                end_session()
                raise SignedOut(error.message if token else None) from None
            authorize(caller, caller.brand_id, WRITE if write else None)
            db.session.commit()  # what opening the session read ends here, whatever the view does
            g.caller = caller
            g.dashboard_session = opened
            return view(*args, **kwargs)

        vars(signed_in_view)["requires_write"] = write  # a function attribute: mypy types none
        return signed_in_view

    return decorator


def current_caller() -> Caller:
    return g.caller


def session_lifetimes() -> Lifetimes:
    settings = current_app.extensions["settings"]
    return Lifetimes(
        idle_timeout=timedelta(seconds=settings.dashboard_session_idle_timeout),
        lifetime=timedelta(seconds=settings.dashboard_session_lifetime),
    )


def can_write() -> bool:
    caller = g.get("caller")
    return caller is not None and WRITE in caller.scopes


def start_session(caller: Caller) -> None:
    """Sign in as `caller`'s key: a new session on the server and a new cookie (and CSRF token),
    so nothing of an earlier session carries over. Commits."""
    end_session()
    assert caller.key_id is not None, "a bootstrap token never signs in"
    session[SESSION_TOKEN] = dashboard_sessions.start_session(
        brand_id=caller.brand_id, key_id=caller.key_id, lifetimes=session_lifetimes()
    )
    session["csrf_token"] = secrets.token_urlsafe(32)
    db.session.commit()


def end_session() -> None:
    """Sign out: the session ends on the server (every copy of the cookie with it), and this
    cookie is emptied. Commits."""
    dashboard_sessions.end_session(session.get(SESSION_TOKEN))
    db.session.commit()
    session.clear()


def csrf_token() -> str:
    if "csrf_token" not in session:
        session["csrf_token"] = secrets.token_urlsafe(32)
    return session["csrf_token"]


def safe_next(target: str | None) -> str:
    """Where to go after signing in: only a dashboard path of this site, never elsewhere.

    :raise ValidationFailed: on `next` holding a control character, which would end the
        `Location` header it goes into.
    """
    if target and not target.isprintable():
        raise ValidationFailed(
            "The sign-in form's `next` must be a dashboard address without control characters",
            {"next": ["Must not contain control characters (line breaks included)."]},
        )
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
        "session_key_prefix": getattr(g.get("dashboard_session"), "key_prefix", None),
    }


@dashboard.after_request
def vary_on_htmx(response):
    # The same URL answers a whole page or a fragment; caches must keep them apart. Pages may
    # show a one-time secret: no cache may keep any of them.
    response.vary.add("HX-Request")
    response.headers["Cache-Control"] = "no-store"
    return response
