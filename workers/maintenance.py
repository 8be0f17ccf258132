"""What a worker does besides delivering, every WEBHOOK_SWEEP_INTERVAL seconds on RQ's
maintenance tick: destroy the previous signing secrets whose rotation overlap has ended, and
queue the retention purge when it is due (workers/retention.py). Nothing here finds or wakes
deliveries: the delivery loop reads what is due from the database itself."""

from __future__ import annotations

import logging

from flask import Flask

from models.columns import utcnow
from services.webhook_endpoints import forget_expired_previous_secrets
from workers.retention import queue_purge_if_due

log = logging.getLogger("brand_api.webhooks")


def run_maintenance(app: Flask) -> None:
    forgotten = forget_expired_previous_secrets(now=utcnow())
    if forgotten:
        log.info("destroyed %d previous signing secret(s) whose overlap ended", forgotten)
    queue_purge_if_due(app)
