"""Claiming due deliveries: a batch is at most `limit` rows, leased rows are not claimed twice,
and a claim's lease ends by itself."""

from __future__ import annotations

from datetime import timedelta

import pytest

from extensions import db
from models.columns import utcnow
from services.delivery_attempts import claim_due_deliveries
from services.endpoint_urls import UrlPolicy
from services.events import publish_event
from services.webhook_endpoints import register_endpoint

LEASE = timedelta(seconds=30)


@pytest.fixture
def endpoint_with_backlog(app, brand):
    with app.app_context():
        endpoint = register_endpoint(
            brand_id=brand,
            url="http://127.0.0.1:9/hooks",
            events=["deal.completed"],
            policy=UrlPolicy(https_only=False, allow_local=True),
        ).id
        for number in range(60):
            publish_event(brand_id=brand, name="deal.completed", data={"n": number})
        db.session.commit()
    return endpoint


def test_a_claim_takes_at_most_its_limit_oldest_first(app, endpoint_with_backlog):
    with app.app_context():
        now = utcnow()
        first = claim_due_deliveries(endpoint_with_backlog, limit=50, lease=LEASE, now=now)
        second = claim_due_deliveries(endpoint_with_backlog, limit=50, lease=LEASE, now=now)
        third = claim_due_deliveries(endpoint_with_backlog, limit=50, lease=LEASE, now=now)
    assert len(first.deliveries) == 50
    assert len(second.deliveries) == 10
    assert third is None
    claimed = [d.id for d in first.deliveries + second.deliveries]
    assert len(set(claimed)) == 60
    numbers = [int(d.body.split(b'"n":')[1].split(b"}")[0]) for d in first.deliveries]
    assert numbers == sorted(numbers)


def test_a_lapsed_lease_can_be_claimed_again(app, endpoint_with_backlog):
    with app.app_context():
        now = utcnow()
        first = claim_due_deliveries(endpoint_with_backlog, limit=100, lease=LEASE, now=now)
        later = now + LEASE + timedelta(seconds=1)
        again = claim_due_deliveries(endpoint_with_backlog, limit=100, lease=LEASE, now=later)
    assert len(first.deliveries) == 60
    assert {d.id for d in again.deliveries} == {d.id for d in first.deliveries}
    assert again.token != first.token
