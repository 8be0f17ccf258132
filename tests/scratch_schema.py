"""A scratch database migrated to a given revision, and the rows most migration tests start
from: a brand and its endpoints, inserted in plain SQL, since the models describe the newest
schema and not the revision under test."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from flask_migrate import upgrade
from sqlalchemy import text
from sqlalchemy.engine import Connection

from app import create_app
from extensions import db
from tests.backends import scratch_database

AT = "2026-11-01 00:00:00+00:00"


@contextlib.contextmanager
def migrated_to(app_environ: dict, backends, revision: str = "head") -> Iterator[None]:
    """Inside: an app context on a database of its own, upgraded to `revision`."""
    with scratch_database(backends) as url:
        scratch = create_app({**app_environ, "DATABASE_URL": url})
        with scratch.app_context():
            upgrade(revision=revision)
            try:
                yield
            finally:
                db.engine.dispose()


def insert_brand_with_endpoints(
    connection: Connection,
    endpoints: Sequence[tuple[str, str]] = (("whe_m", "https://example.com/h"),),
    *,
    events: str = "[]",
    at: str = AT,
) -> None:
    """Brand `brd_m` and its `endpoints` (id, url), each subscribed to `events` (JSON)."""
    connection.execute(
        text("INSERT INTO brands VALUES ('brd_m', 'Mig', 'growth', 'verified', :at, :at, :at)"),
        {"at": at},
    )
    for endpoint_id, url in endpoints:
        connection.execute(
            text(
                "INSERT INTO webhook_endpoints (id, brand_id, url, events, secret_ciphertext,"
                " consecutive_failures, created_at, updated_at) VALUES (:id, 'brd_m', :url,"
                " :events, 'x', 0, :at, :at)"
            ),
            {"id": endpoint_id, "url": url, "events": events, "at": at},
        )
