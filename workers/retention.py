"""The retention purge in a worker (services/retention.py): started by the sweeper's tick at most
once per PURGE_INTERVAL across all workers, and run in a thread of its own, so that the worker
keeps taking jobs while a large purge runs (a million rows take minutes; docs/benchmarks.md)."""

from __future__ import annotations

import logging
import threading
from dataclasses import asdict
from datetime import timedelta

from flask import Flask

from extensions import db
from models.columns import utcnow
from observability.metrics import RETENTION_DELETED, count_backing_service_error
from services.retention import delete_expired_deliveries, retention_period
from workers.connection import redis_connection

log = logging.getLogger("brand_api.webhooks")
PURGE_GATE = "brand-api:retention-gate"
# What ages past the cutoff meanwhile is a few minutes of deliveries: small batches, soon done.
PURGE_INTERVAL = timedelta(minutes=5)

_thread: threading.Thread | None = None
_stopping = threading.Event()


def purge_if_due(app: Flask) -> bool:
    """Start a purge in a thread unless one runs in this process or any worker started one
    within PURGE_INTERVAL (a Redis key); whether it started. Two purges never overlap anyway:
    the service holds an advisory lock."""
    global _thread  # one purge thread per worker process
    if _thread is not None and _thread.is_alive():
        return False
    connection = redis_connection(app)
    interval_ms = int(PURGE_INTERVAL.total_seconds() * 1000)
    if connection is None or not connection.set(PURGE_GATE, 1, nx=True, px=interval_ms):
        return False
    _stopping.clear()
    _thread = threading.Thread(target=_purge, args=(app,), name="retention-purge", daemon=True)
    _thread.start()
    return True


def stop_purge(timeout: float) -> None:
    """Ask a running purge to stop after its current batch, and wait for it that long."""
    _stopping.set()
    if _thread is not None:
        _thread.join(timeout)


def _purge(app: Flask) -> None:
    with app.app_context():
        try:
            with db.engine.connect() as connection:
                purged = delete_expired_deliveries(
                    connection,
                    now=utcnow(),
                    retention=retention_period(),
                    keep_going=lambda: not _stopping.is_set(),
                )
            for table in ("deliveries", "attempts", "events"):
                RETENTION_DELETED.labels(table=table).inc(getattr(purged, table))
            if purged.deliveries or purged.events:
                log.info("retention purge deleted %s", asdict(purged), extra=asdict(purged))
        except Exception:
            # A database outage ends this purge; the next interval starts another.
            count_backing_service_error("database", "retention")
            log.exception("retention purge failed")
