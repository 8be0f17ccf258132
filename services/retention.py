"""Retention (CONTRACT 1, `WEBHOOK_RETENTION_DAYS`): deliveries, their attempts and events older
than the retention are deleted, and the delivery log says how far back it goes.

What is deleted, and what is kept (docs/webhooks.md, "How long deliveries are kept"):
- a delivery created before the cutoff once it is settled (`delivered` or `failed`), with its
  attempts; a `pending` one is work still to do and waits until it settles, whatever its age;
- an event created before the cutoff once no delivery refers to it: a redelivery made today of
  a month-old event keeps that event (its body is what the redelivery sends) until the
  redelivery itself is old.

How: a brand at a time, oldest first, at most `batch_size` rows per transaction, each its own
short transaction on rows locked with SKIP LOCKED, so that neither the delivery log (reads
never wait on row locks) nor a worker or a redeliver (they skip or wait for one batch at most)
waits on the purge. A session-level advisory lock keeps to one purge at a time across every
worker and the command line.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from flask import current_app
from sqlalchemy import Connection, func, select, text
from sqlalchemy.exc import IntegrityError

from extensions import db
from models import WebhookDelivery
from models.endpoint_hours import HOURS_KEPT

# Rows one transaction deletes at most (deliveries or events; a delivery's attempts go with it).
BATCH_SIZE = 1000
# After each batch the purge rests this many times as long as the batch took, leaving the
# database's CPU, disk and WAL to the requests (docs/benchmarks.md, "Retention": 1 still
# doubled the postbacks' p99 on a quiet machine, 3 left their p50 as it was).
REST_RATIO = 3.0
# pg_try_advisory_lock key of the purge: "retentn" in ASCII, far from the per-endpoint keys.
PURGE_LOCK_KEY = 0x726574656E746E
# A batch waits at most this long for a lock it needs (it never should: see the module's doc).
LOCK_TIMEOUT = "2s"

_START = (datetime(1970, 1, 1, tzinfo=UTC), "")


@dataclass
class Purged:
    """What one purge deleted, and in how many transactions."""

    deliveries: int = 0
    attempts: int = 0
    events: int = 0
    batches: int = 0
    # The most deliveries or events one transaction deleted (attempts go with their delivery).
    largest_batch: int = 0
    # Another purge held the lock: this one did nothing.
    skipped: bool = False


def retention_period() -> timedelta:
    """`WEBHOOK_RETENTION_DAYS` as a duration."""
    return timedelta(days=current_app.extensions["settings"].webhook_retention_days)


def delete_expired_deliveries(
    connection: Connection,
    *,
    now: datetime,
    retention: timedelta,
    batch_size: int = BATCH_SIZE,
    rest_ratio: float = REST_RATIO,
    keep_going: Callable[[], bool] = lambda: True,
) -> Purged:
    """Delete what is older than `now - retention` (see the module's doc), `batch_size` rows per
    transaction on `connection`, which must not be in a transaction, resting `rest_ratio` times
    a batch's duration after it. `keep_going` is asked before each batch: a worker shutting
    down stops between two."""
    cutoff = now - retention
    purged = Purged()
    if not connection.execute(_TRY_LOCK, {"key": PURGE_LOCK_KEY}).scalar_one():
        connection.commit()
        return Purged(skipped=True)
    connection.commit()
    try:
        brand_ids = connection.execute(_BRANDS_WITH_OLD_ROWS, {"cutoff": cutoff}).scalars().all()
        connection.commit()
        for brand_id in brand_ids:
            for statement in (_DELETE_DELIVERIES, _DELETE_EVENTS):
                if not _delete_in_batches(
                    connection,
                    statement,
                    brand_id,
                    cutoff,
                    batch_size=batch_size,
                    rest_ratio=rest_ratio,
                    purged=purged,
                    keep_going=keep_going,
                ):
                    return purged
        _delete_old_hours(connection, before=now - HOURS_KEPT, batch_size=batch_size)
        return purged
    finally:
        connection.rollback()
        connection.execute(_UNLOCK, {"key": PURGE_LOCK_KEY})
        connection.commit()


def _delete_in_batches(
    connection: Connection,
    statement,
    brand_id: str,
    cutoff: datetime,
    *,
    batch_size: int,
    rest_ratio: float,
    purged: Purged,
    keep_going: Callable[[], bool],
) -> bool:
    """One brand's rows of one kind, oldest first, a batch per transaction; False if asked to
    stop. Rows a batch skips (pending, locked by someone else, an event still referred to)
    stay behind its cursor, for the next purge."""
    after_created_at, after_id = _START
    while True:
        if not keep_going():
            return False
        started = time.monotonic()
        try:
            with connection.begin():
                connection.execute(_SET_LOCK_TIMEOUT)
                row = connection.execute(
                    statement,
                    {
                        "brand_id": brand_id,
                        "cutoff": cutoff,
                        "after_created_at": after_created_at,
                        "after_id": after_id,
                        "batch_size": batch_size,
                    },
                ).one()
        except IntegrityError:
            # An event a delivery committed to a moment ago (a redelivery racing this batch):
            # the foreign key refused it, the batch is undone; the next purge sees that delivery.
            purged.batches += 1
            return True
        purged.batches += 1
        purged.largest_batch = max(purged.largest_batch, row.deliveries + row.events)
        purged.deliveries += row.deliveries
        purged.attempts += row.attempts
        purged.events += row.events
        if row.last_id is None:
            return True
        after_created_at, after_id = row.last_created_at, row.last_id
        time.sleep((time.monotonic() - started) * rest_ratio)


def _delete_old_hours(connection: Connection, *, before: datetime, batch_size: int) -> None:
    """The endpoints' hour counts older than any health window reads (models/endpoint_hours.py),
    a batch per transaction."""
    while True:
        with connection.begin():
            deleted = connection.execute(
                _DELETE_OLD_HOURS, {"before": before, "batch_size": batch_size}
            ).rowcount
        if deleted < batch_size:
            return


@dataclass(frozen=True)
class LogReach:
    """How far back a brand's delivery log goes: the retention, and its oldest delivery."""

    retention_days: int
    oldest_at: datetime | None


def delivery_log_reach(brand_id: str) -> LogReach:
    """The retention and the brand's oldest delivery still kept (one index probe)."""
    oldest_at = db.session.scalar(
        select(func.min(WebhookDelivery.created_at)).where(WebhookDelivery.brand_id == brand_id)
    )
    return LogReach(retention_days=retention_period().days, oldest_at=oldest_at)


_TRY_LOCK = text("SELECT pg_try_advisory_lock(:key)")
_UNLOCK = text("SELECT pg_advisory_unlock(:key)")
_SET_LOCK_TIMEOUT = text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")

# Brands with a delivery or an event older than the cutoff: one index probe per brand.
_BRANDS_WITH_OLD_ROWS = text(
    """
    SELECT brands.id FROM brands
    WHERE EXISTS (SELECT 1 FROM webhook_deliveries AS d
                  WHERE d.brand_id = brands.id AND d.created_at < :cutoff)
       OR EXISTS (SELECT 1 FROM webhook_events AS e
                  WHERE e.brand_id = brands.id AND e.created_at < :cutoff)
    ORDER BY brands.id
    """
)

# A batch of a brand's settled deliveries older than the cutoff, after the cursor, in the order
# of ix_webhook_deliveries_brand_created; their attempts first (the same statement), then them.
_DELETE_DELIVERIES = text(
    """
    WITH doomed AS (
        SELECT id, created_at FROM webhook_deliveries
        WHERE brand_id = :brand_id
          AND created_at < :cutoff
          AND (created_at, id) > (:after_created_at, :after_id)
          AND status <> 'pending'
        ORDER BY created_at, id
        LIMIT :batch_size
        FOR UPDATE SKIP LOCKED
    ), attempts AS (
        DELETE FROM webhook_attempts WHERE delivery_id IN (SELECT id FROM doomed) RETURNING 1
    ), deliveries AS (
        DELETE FROM webhook_deliveries WHERE id IN (SELECT id FROM doomed) RETURNING 1
    ), last AS (
        SELECT created_at, id FROM doomed ORDER BY created_at DESC, id DESC LIMIT 1
    )
    SELECT (SELECT count(*) FROM deliveries) AS deliveries,
           (SELECT count(*) FROM attempts) AS attempts,
           0 AS events,
           (SELECT created_at FROM last) AS last_created_at,
           (SELECT id FROM last) AS last_id
    """
)

# A batch of a brand's events older than the cutoff, after the cursor, in creation order; of
# those, the ones no delivery refers to any more are deleted. The candidates are taken first on
# their own: asked in one go, the planner reckons (from statistics taken while every event had
# deliveries) that few qualify, and reads both tables whole at every batch.
_DELETE_EVENTS = text(
    """
    WITH candidates AS MATERIALIZED (
        SELECT id, created_at FROM webhook_events
        WHERE brand_id = :brand_id
          AND created_at < :cutoff
          AND (created_at, id) > (:after_created_at, :after_id)
        ORDER BY created_at, id
        LIMIT :batch_size
    ), doomed AS (
        SELECT id FROM webhook_events AS event
        WHERE id IN (SELECT id FROM candidates)
          AND NOT EXISTS (SELECT 1 FROM webhook_deliveries WHERE event_id = event.id)
        FOR UPDATE SKIP LOCKED
    ), events AS (
        DELETE FROM webhook_events WHERE id IN (SELECT id FROM doomed) RETURNING 1
    ), last AS (
        SELECT created_at, id FROM candidates ORDER BY created_at DESC, id DESC LIMIT 1
    )
    SELECT 0 AS deliveries,
           0 AS attempts,
           (SELECT count(*) FROM events) AS events,
           (SELECT created_at FROM last) AS last_created_at,
           (SELECT id FROM last) AS last_id
    """
)

_DELETE_OLD_HOURS = text(
    """
    DELETE FROM webhook_endpoint_hours
    WHERE (endpoint_id, hour) IN (SELECT endpoint_id, hour FROM webhook_endpoint_hours
                                  WHERE hour < :before LIMIT :batch_size)
    """
)
