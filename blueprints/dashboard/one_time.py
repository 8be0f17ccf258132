"""One-time secrets across a redirect: a form posted without JavaScript is answered with a 303
to a page (so that reloading it never repeats the action), and a key or signing secret made by
that POST must reach that page once.

The secret travels in the session cookie, encrypted with the app's `ENCRYPTION_KEY` (Fernet, as
signing secrets are at rest): the signed cookie alone would show it to anything that logs
cookies. The page that shows it takes it out of the session, so a reload does not show it again,
and a stash not shown within a few minutes is never shown.
"""

from __future__ import annotations

import json

from flask import session

from services.secret_box import InvalidToken, secret_box

_STASH = "one_time"
SHOWN_WITHIN_SECONDS = 600


def stash(kind: str, record: dict) -> None:
    """Keep `record` (an answer holding a secret) for the next page that takes `kind`."""
    session[_STASH] = {"kind": kind, "sealed": secret_box().encrypt(json.dumps(record))}


def take(kind: str) -> dict | None:
    """The record stashed for `kind`, once; None when there is none (or it is too old)."""
    stashed = session.get(_STASH)
    if not isinstance(stashed, dict) or stashed.get("kind") != kind:
        return None
    session.pop(_STASH)
    try:
        return json.loads(secret_box().decrypt(stashed["sealed"], ttl=SHOWN_WITHIN_SECONDS))
    except (InvalidToken, KeyError, ValueError):
        return None
