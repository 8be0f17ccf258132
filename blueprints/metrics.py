"""`GET /metrics` (CONTRACT 9.2): Prometheus text format, outside /api/v1 and without an API key;
`METRICS_TOKEN`, when set, is required as a bearer token."""

from __future__ import annotations

import hmac
import logging

import sqlalchemy.exc
from flask import Blueprint, Response, current_app, request

from blueprints.envelope import failure
from extensions import db
from models.columns import utcnow
from observability.metrics import (
    count_backing_service_error,
    exposition,
    gauge,
    labelled_gauge,
)
from services.delivery.backlog import delivery_backlog, delivery_loop_ages
from services.delivery.health import count_disabled_endpoints

log = logging.getLogger("brand_api.metrics")
metrics = Blueprint("metrics", __name__)


@metrics.get("/metrics")
def prometheus_metrics():
    token = current_app.extensions["settings"].metrics_token
    if token is not None and not _presents(token):
        return failure(
            401,
            "UNAUTHORIZED",
            "Send the metrics token: Authorization: Bearer <METRICS_TOKEN>",
            headers={"WWW-Authenticate": 'Bearer realm="metrics"'},
        )
    body, content_type = exposition(_database_gauges())
    return Response(body, content_type=content_type)


def _presents(token: str) -> bool:
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        value.strip().encode(), token.encode()
    )


def _database_gauges() -> list:
    """Read at scrape time from the database, so every process agrees; left out (and counted)
    when the database cannot answer, so the process counters still get through."""
    now = utcnow()
    try:
        backlog = delivery_backlog()
        disabled = count_disabled_endpoints()
        loops = delivery_loop_ages()
        db.session.commit()
    except (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError) as error:
        db.session.rollback()
        count_backing_service_error("database", "metrics")
        log.warning("metrics without the delivery backlog: %s", type(error).__name__)
        return [gauge("brand_api_database_up", "1 when the database answered this scrape.", 0)]
    oldest_age = (now - backlog.oldest_due_at).total_seconds() if backlog.oldest_due_at else 0.0
    return [
        gauge("brand_api_database_up", "1 when the database answered this scrape.", 1),
        gauge(
            "brand_api_webhook_deliveries_pending",
            "Deliveries not yet delivered or failed (waiting, in flight or retrying), about: "
            "PostgreSQL's live-row statistics of the queue and the leases.",
            backlog.pending,
        ),
        gauge(
            "brand_api_webhook_oldest_due_delivery_age_seconds",
            "How long the oldest due delivery has waited past its time (0 when none), as the "
            "delivery loops' last walks round the queue saw it: the number to alert on; it "
            "grows when workers cannot keep up.",
            max(0.0, oldest_age),
        ),
        gauge(
            "brand_api_webhook_endpoints_disabled",
            "Endpoints disabled and not deleted, all brands.",
            disabled,
        ),
        labelled_gauge(
            "brand_api_delivery_loop_last_round_age_seconds",
            "Seconds since each delivery loop (worker process, on any machine) last finished a "
            "round: a loop works every second or sooner, so an age past 30 s is a stalled or "
            "dead worker. A loop that stopped cleanly is not listed; a killed one for an hour.",
            ["loop"],
            [([f"{loop.hostname}:{loop.pid}"], loop.age_seconds) for loop in loops],
        ),
    ]
