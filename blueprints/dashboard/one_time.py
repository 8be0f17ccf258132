"""One-time secrets across a redirect: a form posted without JavaScript is answered with a 303
to a page (so that reloading it never repeats the action), and a key or signing secret made by
that POST must reach that page once (CONTRACT 11.3).

The secret waits on the server, in the signed-in session's store (services.dashboard_sessions),
encrypted with the app's `ENCRYPTION_KEY` (Fernet, as signing secrets are at rest). The page
that shows it deletes it as it reads it, so a reload, or a replay of any copy of the cookie,
finds nothing; a secret not shown within a few minutes is never shown.
"""

from __future__ import annotations

import json
from datetime import timedelta

from flask import session

from blueprints.dashboard.session import SESSION_TOKEN
from services import dashboard_sessions
from services.secret_box import InvalidToken, secret_box

SHOWN_WITHIN = timedelta(seconds=600)


def stash(kind: str, record: dict) -> None:
    """Keep `record` (an answer holding a secret) for the next page that takes `kind`."""
    sealed = secret_box().encrypt(json.dumps(record))
    dashboard_sessions.keep_secret(session[SESSION_TOKEN], kind, sealed)


def take(kind: str) -> dict | None:
    """The record stashed for `kind`, once; None when there is none (or it is too old)."""
    sealed = dashboard_sessions.take_secret(
        session.get(SESSION_TOKEN), kind, shown_within=SHOWN_WITHIN
    )
    if sealed is None:
        return None
    try:
        return json.loads(secret_box().decrypt(sealed))
    except InvalidToken:  # sealed under an ENCRYPTION_KEY since removed
        return None
