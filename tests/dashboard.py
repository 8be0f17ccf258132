"""Helpers for dashboard tests through Flask's test client: sign in as a browser would, and
read the CSRF token a page carries."""

from __future__ import annotations

import re

_CSRF = re.compile(r'"X-CSRF-Token": "([^"]+)"')
# A signing secret on a page: `whsec_` + base64 (CONTRACT 12.1: `+`, `/` and a final `=` too), or
# base62 for one issued before.
SIGNING_SECRET = re.compile(r"whsec_[A-Za-z0-9+/]{20,}={0,2}")


def csrf_token(client, path: str = "/dashboard/sign-in") -> str:
    """The CSRF token of the session, as the page at `path` carries it for htmx."""
    page = client.get(path)
    match = _CSRF.search(page.get_data(as_text=True))
    assert match, f"no CSRF token on {path} ({page.status_code})"
    return match.group(1)


def sign_in(client, secret: str) -> str:
    """Sign in with an API key; returns the new session's CSRF token."""
    response = client.post(
        "/dashboard/sign-in", data={"apiKey": secret, "csrf_token": csrf_token(client)}
    )
    assert response.status_code == 303, response.get_data(as_text=True)
    return csrf_token(client, "/dashboard/")


def htmx(token: str, **extra: str) -> dict[str, str]:
    """The headers htmx sends with a request from a dashboard page."""
    return {"HX-Request": "true", "X-CSRF-Token": token, **extra}
