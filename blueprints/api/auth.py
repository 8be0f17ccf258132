"""The one authentication decorator of the JSON API (SPEC section 5).

It reads the credential from the headers, asks the authentication service who is calling and
whether they may act on the brand in the path, and leaves the answer in `current_caller()`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from flask import g, request

from services.authentication import (
    Caller,
    authenticate_api_key,
    authenticate_bootstrap_token,
    authorize,
)
from services.errors import Unauthorized

API_KEY_HEADER = "X-Api-Key"
BOOTSTRAP_TOKEN_HEADER = "X-Service-Bootstrap-Token"  # noqa: S105 - a header name


@dataclass(frozen=True)
class AuthRequirement:
    """Recorded on each view for the OpenAPI document."""

    scope: str | None
    bootstrap_token: bool


def authenticate(*, scope: str | None = None, bootstrap_token: bool = False):
    """Require an API key with `scope` (or, for create-key only, a bootstrap token) of the brand
    named by the route's `brand_id`."""
    requirement = AuthRequirement(scope=scope, bootstrap_token=bootstrap_token)

    def decorator(view):
        @functools.wraps(view)
        def authenticated_view(*args, **kwargs):
            if bootstrap_token:
                caller = authenticate_bootstrap_token(_presented_bootstrap_token())
            else:
                caller = authenticate_api_key(_presented_api_key())
            authorize(caller, kwargs["brand_id"], scope)
            g.caller = caller
            return view(*args, **kwargs)

        authenticated_view.auth = requirement
        return authenticated_view

    return decorator


def current_caller() -> Caller:
    return g.caller


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
