"""The retention purge (services/retention.py) as an RQ job: queued by a worker's maintenance
at most once per PURGE_INTERVAL across all workers, and run by whichever worker takes it, on
its job thread, while the delivery loop goes on beside it (a million rows take minutes;
docs/benchmarks.md)."""

from __future__ import annotations

import logging
import threading
from dataclasses import asdict
from datetime import timedelta

import redis
from flask import Flask, current_app
from rq import Queue
from sqlalchemy import Connection, create_engine
from sqlalchemy.pool import NullPool

from extensions import db
from models.columns import utcnow
from observability.metrics import RETENTION_DELETED, count_backing_service_error
from services.retention import delete_expired_deliveries, retention_period
from workers.connection import QUEUES, redis_connection

log = logging.getLogger("brand_api.webhooks")
PURGE_GATE = "brand-api:retention-gate"
PURGE_JOB = "workers.retention.purge_expired"
PURGE_JOB_ID = "retention-purge"
# What ages past the cutoff meanwhile is a few minutes of deliveries: small batches, soon done.
PURGE_INTERVAL = timedelta(minutes=5)
# A purge stops between batches when its worker is asked to stop; this bounds one regardless.
PURGE_JOB_TIMEOUT_SECONDS = 3600

_stopping = threading.Event()


def queue_purge_if_due(app: Flask) -> bool:
    """Queue a purge unless any worker queued one within PURGE_INTERVAL (a Redis key); whether
    it did. Two purges never overlap anyway: the service holds an advisory lock."""
    connection = redis_connection(app)
    interval_ms = int(PURGE_INTERVAL.total_seconds() * 1000)
    try:
        if connection is None or not connection.set(PURGE_GATE, 1, nx=True, px=interval_ms):
            return False
        Queue(QUEUES[0], connection=connection).enqueue(
            PURGE_JOB,
            job_id=PURGE_JOB_ID,
            job_timeout=PURGE_JOB_TIMEOUT_SECONDS,
            result_ttl=0,
            failure_ttl=86400,
            description="delete deliveries, attempts and events past the retention",
        )
    except redis.RedisError as error:
        count_backing_service_error("redis", "retention")
        log.warning("could not queue the retention purge: %s", type(error).__name__)
        return False
    return True


def stop_purge() -> None:
    """Ask a running purge to stop after its current batch (its worker is stopping)."""
    _stopping.set()


def _purge_connection() -> Connection:
    """The purge holds a session-level advisory lock across its batches' transactions, which a
    transaction pool would leave on a server connection someone else gets: behind a pooler it
    opens a connection to PostgreSQL itself (DATABASE_DIRECT_URL), closed when it ends."""
    settings = current_app.extensions["settings"]
    if not settings.behind_a_pooler:
        return db.engine.connect()
    return create_engine(settings.database_direct_url, poolclass=NullPool).connect()


def purge_expired() -> None:
    """The job: delete what is past the retention, a batch at a time, until done or asked to
    stop (the next interval's purge takes up the rest)."""
    _stopping.clear()
    try:
        with _purge_connection() as connection:
            purged = delete_expired_deliveries(
                connection,
                now=utcnow(),
                retention=retention_period(),
                keep_going=lambda: not _stopping.is_set(),
            )
    except Exception:
        # A database outage ends this purge; the next interval starts another.
        count_backing_service_error("database", "retention")
        log.exception("retention purge failed")
        return
    for table in ("deliveries", "attempts", "events"):
        RETENTION_DELETED.labels(table=table).inc(getattr(purged, table))
    if purged.deliveries or purged.events:
        log.info("retention purge deleted %s", asdict(purged), extra=asdict(purged))
