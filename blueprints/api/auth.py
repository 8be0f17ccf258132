"""The one authentication decorator of the JSON API (SPEC section 5).

The decorator records what a view requires; `authenticate_request` enforces it before the
request takes any work slot (blueprints/admission.py): it reads the credential from the
headers, asks the authentication service who is calling and whether they may act on the brand
in the path, and leaves the answer in `current_caller()`. A failure counts against the client's
address (CONTRACT 13.7).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import cast

from flask import current_app, g, request

from blueprints.api import api
from services.authentication import (
    Caller,
    authenticate_api_key,
    authenticate_bootstrap_token,
    authorize,
    refuse_failed_authentication,
)
from services.errors import RateLimited, Unauthorized
from services.rate_limits import (
    API,
    AUTH_FAILURES,
    POSTBACK,
    SIGN_IN_FAILURES,
    SIGN_IN_FAILURES_GLOBAL,
    RateLimiter,
)

API_KEY_HEADER = "X-Api-Key"
BOOTSTRAP_TOKEN_HEADER = "X-Service-Bootstrap-Token"  # noqa: S105 - a header name


@dataclass(frozen=True)
class AuthRequirement:
    """Recorded on each view for the OpenAPI document."""

    scope: str | None
    bootstrap_token: bool
    rate_limit: str  # services.rate_limits.API or POSTBACK


def authenticate(*, scope: str | None = None, bootstrap_token: bool = False, rate_limit: str = API):
    """Require an API key with `scope` (or, for create-key only, a bootstrap token) of the brand
    named by the route's `brand_id`, and count the request against the credential's
    `rate_limit` (CONTRACT 9.1)."""
    requirement = AuthRequirement(
        scope=scope, bootstrap_token=bootstrap_token, rate_limit=rate_limit
    )

    def decorator(view):
        @functools.wraps(view)
        def authenticated_view(*args, **kwargs):
            if g.get("authenticated_by") is not requirement:  # admission did it already
                authenticate_request(requirement, kwargs["brand_id"])
            return view(*args, **kwargs)

        vars(authenticated_view)["auth"] = requirement  # a function attribute: mypy types none
        return authenticated_view

    return decorator


def requirement_of(view) -> AuthRequirement | None:
    """What `@authenticate` recorded on a view; None for a view that needs no credential."""
    return vars(view).get("auth") if view is not None else None


def authenticate_request(requirement: AuthRequirement, brand_id: str) -> Caller:
    """Who is calling, counted against their rate limit and allowed on `brand_id`.

    :raise Unauthorized: no valid credential (counted against the client's address).
    :raise RateLimited: the credential's rate limit, or the address's failures, used up.
    :raise Forbidden: another brand's credential, or a scope it lacks.
    """
    try:
        if requirement.bootstrap_token:
            caller = authenticate_bootstrap_token(_presented_bootstrap_token())
        else:
            caller = authenticate_api_key(_presented_api_key())
    except Unauthorized as failure:
        refuse_failed_authentication(rate_limiter(), client_address(), failure)
    g.caller = caller
    _count_request(requirement.rate_limit, caller)
    authorize(caller, brand_id, requirement.scope)
    g.authenticated_by = requirement
    return caller


def client_address() -> str:
    """The peer's address: behind a proxy, the proxy must hand the client's address on (docs)."""
    return request.remote_addr or "unknown"


def current_caller() -> Caller:
    return g.caller


def _count_request(limit: str, caller: Caller) -> None:
    """Counted once the credential is known valid, before anything else of the request runs."""
    limiter = rate_limiter()
    if limiter is None:
        return
    try:
        # A caller is an API key or a bootstrap token: one of the two ids is set.
        credential_id = cast(str, caller.key_id or caller.bootstrap_token_id)
        g.rate_limit = limiter.count_request(limit, credential_id)
    except RateLimited as refused:
        g.rate_limit = refused.state
        raise


def rate_limiter() -> RateLimiter | None:
    """The app's limiter, built on first use; None without Redis (a CLI-only app)."""
    app = current_app
    limiter = app.extensions.get("rate_limiter")
    settings = app.extensions["settings"]
    if limiter is None and settings.redis_url:
        limiter = RateLimiter(
            settings.redis_url,
            {
                API: settings.rate_limit_per_key,
                POSTBACK: settings.postback_rate_limit_per_key,
                SIGN_IN_FAILURES: settings.sign_in_failures_per_address,
                SIGN_IN_FAILURES_GLOBAL: settings.sign_in_failures_global,
                AUTH_FAILURES: f"{settings.auth_failures_per_minute}/minute",
            },
        )
        app.extensions["rate_limiter"] = limiter
    return limiter


@api.after_request
def add_rate_limit_headers(response):
    """Every answer to a request whose credential was counted says where it stands."""
    state = g.get("rate_limit")
    if state is not None:
        response.headers["RateLimit-Limit"] = str(state.limit)
        response.headers["RateLimit-Remaining"] = str(state.remaining)
        response.headers["RateLimit-Reset"] = str(state.reset_after)
    return response


def _bearer() -> str | None:
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return value.strip() or None


def _presented_api_key() -> str | None:
    key = request.headers.get(API_KEY_HEADER, "").strip() or _bearer()
    if key is None and request.headers.get(BOOTSTRAP_TOKEN_HEADER):
        raise Unauthorized("A bootstrap token is accepted only by create-key; send an API key")
    return key


def _presented_bootstrap_token() -> str | None:
    if request.headers.get(API_KEY_HEADER, "").strip():
        raise Unauthorized("create-key accepts only a bootstrap token, not an API key")
    return request.headers.get(BOOTSTRAP_TOKEN_HEADER, "").strip() or _bearer()
