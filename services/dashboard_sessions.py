"""Dashboard sessions kept on the server (CONTRACT 7 and 11.3).

The browser's cookie carries a random token; the database keeps its SHA-256, the key the session
signed in with, and when it started and was last used. A session ends, for every copy of its
cookie at once, when it is signed out, after `idle_timeout` without a request, or `lifetime`
after it started, whichever comes first; and its key is checked on every request, so revoking
the key ends it too (blueprints/dashboard/session.py says so to the browser and deletes it).
A secret a POST made (a new key, a new signing secret) waits for the page after its redirect
in `dashboard_one_time_secrets` and is taken from there once, by a DELETE ... RETURNING that
two replays cannot both win.

In PostgreSQL rather than Redis: the dashboard reads the database on every request anyway (the
key is checked again each time), so the sessions add no service it can be down without; and a
restart of Redis, which this service does not ask to persist anything, would sign everyone out.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import cast

from sqlalchemy import Table, delete, insert, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from extensions import db
from models import ApiKey, DashboardSession, OneTimeSecret
from models.columns import utcnow

# A session's last use is written at most once per quarter of its idle timeout, and at most once
# a minute: a page polling every second costs one UPDATE per interval, and a session ends between
# (timeout - interval) and timeout after its last use, so one used more often than every
# (timeout - interval) never ends. With the shortest timeout, 60 s: written every 15 s, and use
# every 45 s keeps it.
LAST_SEEN_FRACTION_OF_IDLE = 4
LAST_SEEN_MAX_INTERVAL = timedelta(seconds=60)
TOKEN_BYTES = 32

# A declarative model's `__table__` is typed as any FromClause; a mapped_column model's is a Table.
_sessions = cast(Table, DashboardSession.__table__)
_secrets = cast(Table, OneTimeSecret.__table__)


@dataclass(frozen=True)
class Lifetimes:
    idle_timeout: timedelta
    lifetime: timedelta

    @property
    def last_seen_interval(self) -> timedelta:
        """How stale the stored last use may get before a request writes it again."""
        return min(LAST_SEEN_MAX_INTERVAL, self.idle_timeout / LAST_SEEN_FRACTION_OF_IDLE)


@dataclass(frozen=True)
class OpenSession:
    """A live session: its key, to check again, and the prefix the top bar names it by."""

    token_hash: str
    brand_id: str
    key_id: str
    key_prefix: str


def start_session(*, brand_id: str, key_id: str, lifetimes: Lifetimes) -> str:
    """A new session of `key_id`; returns the token for the cookie (stored only hashed).

    Sessions already past their lifetimes are deleted on the way: sign-ins are rare enough that
    this keeps the table to the sessions still alive, without a job of its own.
    """
    now = utcnow()
    db.session.execute(delete(_sessions).where(_expired(now, lifetimes)))
    token = secrets.token_urlsafe(TOKEN_BYTES)
    db.session.execute(
        insert(_sessions).values(
            token_hash=_hash(token),
            brand_id=brand_id,
            key_id=key_id,
            created_at=now,
            last_seen_at=now,
        )
    )
    return token


def open_session(token: str | None, *, lifetimes: Lifetimes) -> OpenSession | None:
    """The live session of `token`, its last use noted; None when there is none (never was,
    signed out, its key deleted) or it expired, which ends it."""
    if not token:
        return None
    now = utcnow()
    token_hash = _hash(token)
    row = db.session.execute(
        select(
            _sessions.c.brand_id,
            _sessions.c.key_id,
            _sessions.c.created_at,
            _sessions.c.last_seen_at,
            ApiKey.__table__.c.key_prefix,
        )
        .join(ApiKey.__table__, ApiKey.__table__.c.id == _sessions.c.key_id)
        .where(_sessions.c.token_hash == token_hash)
    ).first()
    if row is None:
        return None
    # Both writes on a short connection of their own: they stand whatever the request does next.
    if (
        row.last_seen_at <= now - lifetimes.idle_timeout
        or row.created_at <= now - lifetimes.lifetime
    ):
        with db.engine.begin() as connection:
            connection.execute(delete(_sessions).where(_sessions.c.token_hash == token_hash))
        return None
    stale = now - lifetimes.last_seen_interval
    if row.last_seen_at <= stale:
        with db.engine.begin() as connection:
            connection.execute(
                update(_sessions)
                .where(_sessions.c.token_hash == token_hash, _sessions.c.last_seen_at <= stale)
                .values(last_seen_at=now)
            )
    return OpenSession(token_hash, row.brand_id, row.key_id, row.key_prefix)


def end_session(token: str | None) -> None:
    """Sign out: the session (and any secret it was still to show) is gone for every copy of
    its cookie."""
    if token:
        db.session.execute(delete(_sessions).where(_sessions.c.token_hash == _hash(token)))


def keep_secret(token: str, kind: str, sealed: str) -> None:
    """Keep `sealed` for the next page of the session of `token` that takes `kind` (one per
    kind). Committed at once, on a connection of its own: the POST that made it has committed."""
    statement = pg_insert(_secrets).values(
        session_hash=_hash(token), kind=kind, sealed=sealed, created_at=utcnow()
    )
    with db.engine.begin() as connection:
        connection.execute(
            statement.on_conflict_do_update(
                index_elements=[_secrets.c.session_hash, _secrets.c.kind],
                set_={"sealed": statement.excluded.sealed, "created_at": utcnow()},
            )
        )


def take_secret(token: str | None, kind: str, *, shown_within: timedelta) -> str | None:
    """The sealed secret kept for `kind`, deleted as it is read and committed at once; None when
    there is none, it was taken already (by any copy of the cookie, however many replay it at
    the same moment), or it is older than `shown_within`."""
    if not token:
        return None
    with db.engine.begin() as connection:
        row = connection.execute(
            delete(_secrets)
            .where(_secrets.c.session_hash == _hash(token), _secrets.c.kind == kind)
            .returning(_secrets.c.sealed, _secrets.c.created_at)
        ).first()
    if row is None or row.created_at <= utcnow() - shown_within:
        return None
    return row.sealed


def _expired(now: datetime, lifetimes: Lifetimes):
    return or_(
        _sessions.c.last_seen_at <= now - lifetimes.idle_timeout,
        _sessions.c.created_at <= now - lifetimes.lifetime,
    )


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
