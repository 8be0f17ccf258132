"""Each rule about an endpoint lives in one place, and every path that applies it agrees:

- "open" (receives deliveries: neither disabled nor deleted) is `models.webhook_endpoint`'s
  `endpoint_is_open`: the model's `is_active`, in Python and in SQL, publishing, the test ping,
  the worker's claim and its one-statement success all follow it, for every combination;
- disabling and re-enabling are `services.delivery.health`'s alone: no other module writes
  `disabled_at`.
"""

from __future__ import annotations

import itertools
import re
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, update

from extensions import db
from models import QueuedDelivery, WebhookDelivery, WebhookEndpoint
from models.columns import utcnow
from services.delivery.queue import claim_attempts
from services.endpoint_urls import UrlPolicy
from services.events import publish_event
from services.webhook_endpoints import register_endpoint

REPO = Path(__file__).resolve().parent.parent
LOCAL = UrlPolicy(https_only=False, allow_local=True)
STATES = list(itertools.product((False, True), repeat=2))  # (disabled, deleted)


def endpoint_in_state(brand: str, *, disabled: bool, deleted: bool) -> str:
    endpoint = register_endpoint(
        brand_id=brand, url="http://127.0.0.1:9/hooks", events=["deal.completed"], policy=LOCAL
    ).record
    db.session.execute(
        update(WebhookEndpoint)
        .where(WebhookEndpoint.id == endpoint.id)
        .values(
            disabled_at=utcnow() if disabled else None,
            disabled_reason="test" if disabled else None,
            deleted_at=utcnow() if deleted else None,
        )
    )
    db.session.commit()
    return endpoint.id


def pending_delivery(brand: str, endpoint_id: str) -> str:
    """A due delivery of that endpoint, written as if it had been queued before the change."""
    open_twin = endpoint_in_state(brand, disabled=False, deleted=False)
    published = publish_event(
        brand_id=brand, name="deal.completed", data={}, only_endpoint_ids=[open_twin]
    )
    db.session.execute(
        update(WebhookDelivery)
        .where(WebhookDelivery.id == published.delivery_ids[0])
        .values(endpoint_id=endpoint_id)
    )
    db.session.execute(
        update(QueuedDelivery)
        .where(QueuedDelivery.delivery_id == published.delivery_ids[0])
        .values(endpoint_id=endpoint_id)
    )
    db.session.commit()
    return published.delivery_ids[0]


@pytest.mark.parametrize(("disabled", "deleted"), STATES)
def test_every_path_that_decides_open_agrees(app, brand, disabled, deleted):
    expected = not disabled and not deleted
    with app.app_context():
        endpoint_id = endpoint_in_state(brand, disabled=disabled, deleted=deleted)
        loaded = db.session.get(WebhookEndpoint, endpoint_id)
        in_sql = db.session.scalar(
            select(WebhookEndpoint.is_active).where(WebhookEndpoint.id == endpoint_id)
        )

        subscribed = publish_event(brand_id=brand, name="deal.completed", data={})
        pinged = publish_event(
            brand_id=brand, name="webhook.test", data={}, only_endpoint_ids=[endpoint_id]
        )
        db.session.commit()
        receivers = {
            db.session.get(WebhookDelivery, delivery_id).endpoint_id
            for delivery_id in subscribed.delivery_ids
        }

        delivery_id = pending_delivery(brand, endpoint_id)
        claimed = claim_attempts(
            slots=10, endpoint_limit=10, token="0000aaaa", lease=timedelta(seconds=15)
        )
        db.session.commit()

        answers = {
            "model": loaded.is_active,
            "sql": in_sql,
            "publish": endpoint_id in receivers,
            "ping": len(pinged.delivery_ids) == 1,
            "claim": delivery_id in [a.delivery_id for a in claimed.attempts],
        }
        assert answers == dict.fromkeys(answers, expected)


def test_only_delivery_health_writes_disabled_at():
    writers = []
    for package in ("services", "workers", "blueprints", "commands", "fixtures"):
        for path in sorted((REPO / package).rglob("*.py")):
            if re.search(r"disabled_at\s*=(?!=)", path.read_text()):
                writers.append(str(path.relative_to(REPO)))
    assert writers == ["services/delivery/health.py"]


def test_only_the_model_spells_out_what_open_means():
    spelled = []
    pattern = re.compile(r"disabled_at(\.is_\(None\)| IS NULL)")
    for package in ("services", "workers", "blueprints", "commands", "fixtures", "schemas"):
        for path in sorted((REPO / package).rglob("*.py")):
            if pattern.search(path.read_text()):
                spelled.append(str(path.relative_to(REPO)))
    assert spelled == []
