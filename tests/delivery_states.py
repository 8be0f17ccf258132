"""Deliveries put straight into a state, as the statements of the delivery loop leave it, for
tests that need one without a worker and a receiver:
- settled `delivered` or `failed`: the record says so (a failed one with `failed_at`, which the
  log's failed indexes read), and the delivery is out of the pending work
  (webhook_delivery_queue, webhook_delivery_leases);
- waiting for a retry after a failed first attempt: the delivery and its queue row agree on
  when (the claim reads the queue, the API and the dashboard the delivery)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from sqlalchemy import delete, update

from extensions import db
from models import DeliveryLease, QueuedDelivery, WebhookDelivery
from models.columns import utcnow
from models.webhook_delivery import DELIVERED, FAILED


def settle(delivery_ids: Iterable[str], status: str, **values) -> None:
    """End the deliveries `delivered` or `failed` (with any other columns in `values`), in the
    caller's session; the caller commits."""
    assert status in (DELIVERED, FAILED), status
    ids = list(delivery_ids)
    settled = {"status": status, "next_attempt_at": None, "failed_at": None}
    if status == FAILED:
        settled["failed_at"] = values.pop("failed_at", utcnow())
    db.session.execute(
        update(WebhookDelivery).where(WebhookDelivery.id.in_(ids)).values(**settled, **values)
    )
    db.session.execute(delete(QueuedDelivery).where(QueuedDelivery.delivery_id.in_(ids)))
    db.session.execute(delete(DeliveryLease).where(DeliveryLease.delivery_id.in_(ids)))


def wait_for_a_retry(delivery_ids: Iterable[str], at: datetime, **values) -> None:
    """The deliveries' first attempt failed (with the outcome's columns in `values`) and their
    retry falls due `at`, in the caller's session; the caller commits."""
    ids = list(delivery_ids)
    db.session.execute(
        update(QueuedDelivery)
        .where(QueuedDelivery.delivery_id.in_(ids))
        .values(attempt_count=1, next_attempt_at=at)
    )
    db.session.execute(
        update(WebhookDelivery)
        .where(WebhookDelivery.id.in_(ids))
        .values(attempt_count=1, next_attempt_at=at, **values)
    )
