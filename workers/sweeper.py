"""The sweeper: finds due deliveries that no job will pick up and queues drains for them,
destroys the previous signing secrets whose rotation overlap has ended, and starts the
retention purge when it is due (workers/retention.py).

A job can be lost without losing a delivery: Redis was down when the event was committed, a
worker was killed mid-attempt (its lease then expires), Redis lost its data, a job expired. The
database still says `pending` and when; the sweeper reads that, every WEBHOOK_SWEEP_INTERVAL
seconds, in one worker at a time.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from flask import Flask

from models.columns import utcnow
from services.delivery_attempts import endpoints_with_overdue_deliveries
from services.webhook_endpoints import forget_expired_previous_secrets
from workers import dispatch
from workers.connection import redis_connection
from workers.retention import purge_if_due

log = logging.getLogger("brand_api.webhooks")
SWEEP_LOCK = "brand-api:sweep-lock"


def sweep(app: Flask) -> int:
    """Queue drains for endpoints with deliveries overdue by more than one interval; how many.
    Skipped when another worker swept within the interval."""
    interval = app.extensions["settings"].webhook_sweep_interval
    connection = redis_connection(app)
    if connection is None:
        return 0
    if not connection.set(SWEEP_LOCK, 1, nx=True, px=max(1, int(interval * 900))):
        return 0
    now = utcnow()
    endpoint_ids = endpoints_with_overdue_deliveries(
        overdue_before=now - timedelta(seconds=interval), now=now
    )
    queued = dispatch.request_drains(app, endpoint_ids)
    if queued:
        log.info("sweeper queued drains for %d endpoint(s) with overdue deliveries", queued)
    forgotten = forget_expired_previous_secrets(now=now)
    if forgotten:
        log.info("destroyed %d previous signing secret(s) whose overlap ended", forgotten)
    purge_if_due(app)
    return queued
