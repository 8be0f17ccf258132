"""Claiming due deliveries (services/delivery_attempts.py): oldest first, never more in flight
per endpoint than its slot limit across all claims (all workers), a lapsed lease taken again,
a failing endpoint probed one at a time, and what a claim tells the engine about the rest."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest
from sqlalchemy import func, select, update

from extensions import db
from models import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from models.columns import utcnow
from services.delivery_attempts import (
    AttemptOutcome,
    RetryPolicy,
    claim_due_deliveries,
    record_attempt,
    release_deliveries,
)
from services.endpoint_health import PROBING_AFTER_FAILURES, disable_endpoint
from services.endpoint_urls import UrlPolicy
from services.events import publish_event
from services.webhook_endpoints import register_endpoint

LEASE = timedelta(seconds=30)


def new_endpoint(brand: str) -> str:
    return register_endpoint(
        brand_id=brand,
        url="http://127.0.0.1:9/hooks",
        events=["deal.completed"],
        policy=UrlPolicy(https_only=False, allow_local=True),
    ).id


@pytest.fixture
def endpoint_with_backlog(app, brand):
    with app.app_context():
        endpoint = new_endpoint(brand)
        for number in range(60):
            publish_event(brand_id=brand, name="deal.completed", data={"n": number})
        db.session.commit()
    return endpoint


def claim(endpoint_id: str, slots: int, *, limit: int = 100, now=None, owner="0000aaaa", **kw):
    return claim_due_deliveries(
        {endpoint_id: slots},
        endpoint_limit=limit,
        lease=LEASE,
        now=now or utcnow(),
        owner=owner,
        **kw,
    )[endpoint_id]


def numbers(claimed) -> list[int]:
    return [int(d.body.split(b'"n":')[1].split(b"}")[0]) for d in claimed.deliveries]


def test_a_claim_takes_its_slots_oldest_first_and_says_whether_more_are_due(
    app, endpoint_with_backlog
):
    with app.app_context():
        first = claim(endpoint_with_backlog, 50)
        second = claim(endpoint_with_backlog, 50)
        third = claim(endpoint_with_backlog, 50)
    assert len(first.deliveries) == 50 and first.more_due
    assert len(second.deliveries) == 10 and not second.more_due
    assert third.deliveries == [] and not third.more_due and third.open
    assert len({d.id for d in first.deliveries + second.deliveries}) == 60
    assert numbers(first) == sorted(numbers(first))
    assert max(numbers(first)) < min(numbers(second))


def test_an_endpoint_never_has_more_than_its_limit_leased_across_claims(app, endpoint_with_backlog):
    with app.app_context():
        first = claim(endpoint_with_backlog, 2, limit=3, owner="00000001")  # one worker
        second = claim(endpoint_with_backlog, 3, limit=3, owner="00000002")  # one slot left
        third = claim(endpoint_with_backlog, 3, limit=3, owner="00000003")  # none left
        assert [len(c.deliveries) for c in (first, second, third)] == [2, 1, 0]
        assert third.more_due  # due work waits for a slot, not for a wake
        release_deliveries(first, [d.id for d in first.deliveries])
        fourth = claim(endpoint_with_backlog, 3, limit=3, owner="00000003")
    assert len(fourth.deliveries) == 2
    assert {d.id for d in fourth.deliveries} == {d.id for d in first.deliveries}


def test_a_lapsed_lease_can_be_claimed_again_and_holds_no_slot(app, endpoint_with_backlog):
    with app.app_context():
        now = utcnow()
        first = claim(endpoint_with_backlog, 100, now=now)
        later = now + LEASE + timedelta(seconds=1)
        again = claim(endpoint_with_backlog, 100, limit=60, now=later)
    assert len(first.deliveries) == 60
    assert {d.id for d in again.deliveries} == {d.id for d in first.deliveries}
    assert again.token != first.token


def test_a_failing_endpoint_is_probed_one_attempt_at_a_time(app, endpoint_with_backlog):
    with app.app_context():
        db.session.execute(
            update(WebhookEndpoint)
            .where(WebhookEndpoint.id == endpoint_with_backlog)
            .values(consecutive_failures=PROBING_AFTER_FAILURES)
        )
        db.session.commit()
        probe = claim(endpoint_with_backlog, 10, limit=10)
        none_while_probing = claim(endpoint_with_backlog, 10, limit=10)
    assert len(probe.deliveries) == 1 and probe.consecutive_failures == PROBING_AFTER_FAILURES
    assert none_while_probing.deliveries == [] and none_while_probing.more_due


def test_a_claim_serves_several_endpoints_and_tells_when_the_next_retry_is_due(app, brand):
    with app.app_context():
        busy, quiet, retrying = new_endpoint(brand), new_endpoint(brand), new_endpoint(brand)
        for number in range(3):
            publish_event(brand_id=brand, name="deal.completed", data={"n": number})
        db.session.commit()
        later = utcnow() + timedelta(minutes=5)
        db.session.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.endpoint_id.in_([quiet, retrying]))
            .values(next_attempt_at=later)
        )
        db.session.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.endpoint_id == quiet)
            .values(status="delivered", next_attempt_at=None)
        )
        db.session.commit()
        claims = claim_due_deliveries(
            {busy: 2, quiet: 2, retrying: 2},
            endpoint_limit=2,
            lease=LEASE,
            now=utcnow(),
            owner="0000aaaa",
        )
    assert len(claims[busy].deliveries) == 2 and claims[busy].more_due
    assert claims[quiet].deliveries == [] and claims[quiet].next_due_at is None
    assert claims[retrying].deliveries == [] and not claims[retrying].more_due
    assert claims[retrying].next_due_at == later


def test_a_closed_endpoint_comes_back_closed_and_its_stray_deliveries_fail(
    app, endpoint_with_backlog
):
    with app.app_context():
        disable_endpoint(endpoint_with_backlog, reason="test", now=utcnow())
        db.session.commit()
        # A delivery a race left pending after the disable.
        stray = db.session.scalars(
            select(WebhookDelivery.id).where(WebhookDelivery.endpoint_id == endpoint_with_backlog)
        ).first()
        db.session.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.id == stray)
            .values(status="pending", next_attempt_at=utcnow())
        )
        db.session.commit()
        closed = claim(endpoint_with_backlog, 5)
        status = db.session.scalar(
            select(WebhookDelivery.status).where(WebhookDelivery.id == stray)
        )
    assert not closed.open and closed.deliveries == []
    assert status == "failed"


def test_an_endpoint_another_worker_is_claiming_is_skipped_as_busy(
    app, app_environ, endpoint_with_backlog
):
    url = app_environ["DATABASE_URL"].replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url) as other:  # another worker's claim, mid-transaction
        other.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended('brand-api:claim:' || %s, 0))",
            [endpoint_with_backlog],
        )
        with app.app_context():
            busy = claim(endpoint_with_backlog, 5)
        other.rollback()
    with app.app_context():
        free = claim(endpoint_with_backlog, 5)
    assert busy.busy and busy.deliveries == []
    assert not free.busy and len(free.deliveries) == 5


def test_a_healthy_endpoint_nobody_else_holds_is_claimed_rounds_ahead(app, endpoint_with_backlog):
    attempt = timedelta(seconds=12)
    with app.app_context():
        now = utcnow()
        ahead = claim(endpoint_with_backlog, 2, limit=2, now=now, ahead=6, attempt_time=attempt)
        other = claim(endpoint_with_backlog, 2, limit=2, owner="0000bbbb", ahead=6)
    assert ahead.room == 2 and len(ahead.deliveries) == 8 and ahead.more_due
    # The first two start now; the rest one round (two attempts) after another, each held
    # until its latest start plus the lease.
    leases = [(d.leased_until - now - LEASE) // attempt for d in ahead.deliveries]
    assert leases == [0, 0, 1, 1, 2, 2, 3, 3]
    # Everything leased counts as in flight for another worker: it finds no room.
    assert other.room == 0 and other.deliveries == [] and other.more_due


def test_nothing_is_claimed_ahead_beside_another_workers_attempts(app, endpoint_with_backlog):
    with app.app_context():
        first = claim(endpoint_with_backlog, 1, limit=2, owner="0000bbbb")
        second = claim(endpoint_with_backlog, 2, limit=2, ahead=6)
    assert len(first.deliveries) == 1
    assert second.room == 1 and len(second.deliveries) == 1  # the one slot left, no more


def test_nothing_is_claimed_ahead_for_a_failing_endpoint(app, endpoint_with_backlog):
    with app.app_context():
        db.session.execute(
            update(WebhookEndpoint)
            .where(WebhookEndpoint.id == endpoint_with_backlog)
            .values(consecutive_failures=1)
        )
        db.session.commit()
        failing = claim(endpoint_with_backlog, 2, limit=2, ahead=6)
    assert failing.room == 2 and len(failing.deliveries) == 2


def test_a_result_is_written_only_while_its_delivery_is_held(app, endpoint_with_backlog):
    """A worker whose lease lapsed and was taken over finds its late result discarded; the
    new holder's result is the one written."""
    policy = RetryPolicy(schedule=(60,), disable_failures=15, disable_window=timedelta(days=3))
    with app.app_context():
        now = utcnow()
        stale = claim(endpoint_with_backlog, 1, limit=1, now=now, owner="0000aaaa")
        later = now + LEASE + timedelta(seconds=1)
        current = claim(endpoint_with_backlog, 1, limit=1, now=later, owner="0000bbbb")
        [delivery] = stale.deliveries
        assert current.deliveries[0].id == delivery.id
        success = AttemptOutcome(
            requested_at=later, duration_ms=5, request_headers={}, http_status=200
        )
        late = record_attempt(stale, delivery, success, policy=policy, now=later)
        on_time = record_attempt(current, current.deliveries[0], success, policy=policy, now=later)
        attempts = db.session.scalar(
            select(func.count()).where(WebhookAttempt.delivery_id == delivery.id)
        )
    assert not late.kept and on_time.kept
    assert attempts == 1
