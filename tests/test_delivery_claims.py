"""What the delivery loop asks of the database (services/delivery_attempts.py): due deliveries
leased as their attempts start, oldest first, never more in flight per endpoint than its slot
limit across all workers (whatever the deliveries' status), endpoints served in turn, the
breaker's pause the same for every worker, leases that lapse unless extended, and results
written under the token that took the delivery, whenever that is."""

from __future__ import annotations

import threading
from datetime import timedelta

import psycopg
import pytest
from sqlalchemy import func, select, update

from extensions import db
from models import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from models.columns import utcnow
from services.delivery_attempts import (
    LEASE,
    AttemptOutcome,
    RetryPolicy,
    claim_attempts,
    extend_leases,
    record_attempts,
)
from services.endpoint_health import PROBING_AFTER_FAILURES, disable_endpoint
from services.endpoint_urls import UrlPolicy
from services.events import publish_event
from services.webhook_endpoints import register_endpoint, rotate_signing_secret

POLICY = RetryPolicy(schedule=(60, 60), disable_failures=1000, disable_window=timedelta(days=1))


def new_endpoint(brand: str) -> str:
    return register_endpoint(
        brand_id=brand,
        url="http://127.0.0.1:9/hooks",
        events=["deal.completed"],
        policy=UrlPolicy(https_only=False, allow_local=True),
    ).id


def backlog(brand: str, count: int, start: int = 0) -> None:
    for number in range(start, start + count):
        publish_event(brand_id=brand, name="deal.completed", data={"n": number})
    db.session.commit()


@pytest.fixture
def endpoint_with_backlog(app, brand):
    with app.app_context():
        endpoint = new_endpoint(brand)
        backlog(brand, 60)
    return endpoint


def claim(slots: int, *, limit: int = 100, token: str = "0000aaaa", now=None):  # noqa: S107
    claimed = claim_attempts(slots=slots, endpoint_limit=limit, token=token, now=now)
    db.session.commit()
    return claimed


def numbers(attempts) -> list[int]:
    return [int(a.body.split(b'"n":')[1].split(b"}")[0]) for a in attempts]


def outcome(status: int | None = 200, error: str | None = None) -> AttemptOutcome:
    return AttemptOutcome(
        requested_at=utcnow(), duration_ms=5, request_headers={}, http_status=status, error=error
    )


def record(results):
    recorded = record_attempts(results, policy=POLICY)
    db.session.commit()
    return recorded


def row(delivery_id: str) -> WebhookDelivery:
    db.session.expire_all()
    return db.session.get(WebhookDelivery, delivery_id)


def test_a_claim_takes_the_oldest_due_up_to_the_endpoints_room(app, endpoint_with_backlog):
    with app.app_context():
        first = claim(10, limit=3)
        assert numbers(first.attempts) == [0, 1, 2]
        assert {a.attempt_number for a in first.attempts} == {1}
        assert all(a.url == "http://127.0.0.1:9/hooks" for a in first.attempts)
        leased = row(first.attempts[0].delivery_id)
        assert leased.lease_token == "0000aaaa"
        # A lease lasts seconds, not the whole timeout: a dead worker's lapse soon.
        assert leased.leased_until - utcnow() <= LEASE
        # The endpoint's three slots are held: a second worker finds no room.
        assert claim(10, limit=3, token="0000bbbb").attempts == []


def test_a_lapsed_lease_is_taken_again_and_holds_no_slot(app, endpoint_with_backlog):
    with app.app_context():
        first = claim(2, limit=2)
        later = utcnow() + LEASE + timedelta(seconds=1)
        again = claim(2, limit=2, token="0000bbbb", now=later)
        assert numbers(again.attempts) == numbers(first.attempts) == [0, 1]
        assert row(again.attempts[0].delivery_id).lease_token == "0000bbbb"


def test_extending_keeps_a_lease_that_would_have_lapsed(app, endpoint_with_backlog):
    with app.app_context():
        first = claim(2, limit=2)
        ours = extend_leases([(a.delivery_id, a.token) for a in first.attempts])
        foreign = extend_leases([(first.attempts[0].delivery_id, "0000zzzz")])
        db.session.commit()
        assert ours == {a.delivery_id for a in first.attempts}
        assert foreign == set()
        extended_to = row(first.attempts[0].delivery_id).leased_until
        assert extended_to > utcnow() + LEASE - timedelta(seconds=1)


def test_a_retry_is_never_claimed_before_it_is_due(app, endpoint_with_backlog):
    with app.app_context():
        [attempt] = claim(1, limit=1).attempts
        [recorded] = record([(attempt, outcome(500, "HTTP 500"))])
        assert recorded.status == "pending" and recorded.retry_at is not None
        soon = claim(100, limit=100)
        assert attempt.delivery_id not in {a.delivery_id for a in soon.attempts}
        # With nothing due left, the claim says when the retry falls due (the loop sleeps so).
        idle = claim(100, limit=100, token="0000bbbb")
        assert idle.attempts == [] and idle.next_due_at == recorded.retry_at
        due = claim(100, limit=100, token="0000cccc", now=recorded.retry_at)
        assert attempt.delivery_id in {a.delivery_id for a in due.attempts}


def test_a_failing_endpoint_is_probed_one_at_a_time_after_its_pause(app, endpoint_with_backlog):
    with app.app_context():
        db.session.execute(
            update(WebhookEndpoint)
            .where(WebhookEndpoint.id == endpoint_with_backlog)
            .values(consecutive_failures=PROBING_AFTER_FAILURES - 1)
        )
        db.session.commit()
        healthy = claim(10, limit=4).attempts
        assert len(healthy) == 4  # not failing yet: its whole limit
        record([(a, outcome(500, "HTTP 500")) for a in healthy])
        endpoint = db.session.get(WebhookEndpoint, endpoint_with_backlog)
        db.session.refresh(endpoint)
        assert endpoint.consecutive_failures > PROBING_AFTER_FAILURES
        # The breaker's pause holds every worker back, then one probe at a time.
        assert endpoint.next_probe_at > utcnow()
        assert claim(10, limit=4, token="0000bbbb").attempts == []
        after_pause = endpoint.next_probe_at + timedelta(milliseconds=1)
        probes = claim(10, limit=4, token="0000cccc", now=after_pause).attempts
        assert len(probes) == 1


def test_endpoints_take_turns_whoever_has_the_older_backlog(app, brand, make_brand):
    other_brand = make_brand("Single Foods")
    with app.app_context():
        busy = new_endpoint(brand)
        backlog(brand, 50)
        [first] = claim(1, limit=1).attempts
        record([(first, outcome())])
        quiet = new_endpoint(other_brand)
        publish_event(brand_id=other_brand, name="deal.completed", data={"n": 1000})
        db.session.commit()
        # The busy endpoint's backlog is older, but it was just served: the quiet one goes first.
        [taken] = claim(1, limit=1, token="0000bbbb").attempts
        assert taken.endpoint_id == quiet
        [after] = claim(1, limit=1, token="0000cccc").attempts
        assert after.endpoint_id == busy


def test_one_claim_serves_many_endpoints_first_of_each_before_second_of_any(app, brand):
    with app.app_context():
        endpoints = [new_endpoint(brand) for _ in range(5)]
        backlog(brand, 10)  # ten deliveries to each
        claimed = claim(5, limit=2).attempts
        assert sorted(a.endpoint_id for a in claimed) == sorted(endpoints)


def test_a_disable_leaves_attempts_in_flight_their_slot_and_their_record(
    app, endpoint_with_backlog
):
    with app.app_context():
        in_flight = claim(10, limit=2).attempts
        disable_endpoint(endpoint_with_backlog, reason="test", now=utcnow())
        db.session.execute(
            update(WebhookEndpoint)
            .where(WebhookEndpoint.id == endpoint_with_backlog)
            .values(disabled_at=None, disabled_reason=None)
        )
        db.session.commit()  # enabled again at once: its failed deliveries stay failed
        backlog(db.session.get(WebhookEndpoint, endpoint_with_backlog).brand_id, 5, start=100)
        # The two attempts still in flight hold both slots, although their rows are failed.
        assert claim(10, limit=2, token="0000bbbb").attempts == []
        success, failure = in_flight
        recorded = record([(success, outcome()), (failure, outcome(500, "HTTP 500"))])
        assert [r.kept for r in recorded] == [True, True]
        # Each is logged; the receiver had the first: it is delivered, whatever the disable said.
        assert row(success.delivery_id).status == "delivered"
        assert row(failure.delivery_id).status == "failed"
        logged = db.session.scalar(
            select(func.count()).where(
                WebhookAttempt.delivery_id.in_([success.delivery_id, failure.delivery_id])
            )
        )
        assert logged == 2
        assert numbers(claim(10, limit=2, token="0000cccc").attempts) == [100, 101]


def test_a_result_is_written_past_its_lease_but_not_over_another_workers(
    app, endpoint_with_backlog
):
    with app.app_context():
        late, taken_over = claim(2, limit=2).attempts
        # Both leases lapse; another worker takes the second delivery, nobody the first.
        db.session.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.lease_token == "0000aaaa")
            .values(leased_until=utcnow() - timedelta(seconds=1))
        )
        db.session.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.id == taken_over.delivery_id)
            .values(lease_token="0000bbbb", leased_until=utcnow() + LEASE)
        )
        db.session.commit()
        recorded = record([(late, outcome()), (taken_over, outcome())])
        assert [r.kept for r in recorded] == [True, False]
        assert row(late.delivery_id).status == "delivered"
        assert row(taken_over.delivery_id).status == "pending"
        assert row(taken_over.delivery_id).lease_token == "0000bbbb"


def test_a_closed_endpoints_stray_deliveries_fail_at_the_next_claim(app, endpoint_with_backlog):
    with app.app_context():
        db.session.execute(
            update(WebhookEndpoint)
            .where(WebhookEndpoint.id == endpoint_with_backlog)
            .values(deleted_at=utcnow())
        )
        db.session.commit()  # deleted without its service: 60 pending deliveries are strays
        assert claim(100).attempts == []
        statuses = set(
            db.session.scalars(
                select(WebhookDelivery.status).where(
                    WebhookDelivery.endpoint_id == endpoint_with_backlog
                )
            )
        )
        assert statuses == {"failed"}


def test_an_endpoint_being_changed_is_skipped_not_waited_for(app, app_environ, brand):
    """A claim or a record never waits on an endpoint's row lock (an update in progress): the
    endpoint is left for the next round, and other endpoints go on."""
    with app.app_context():
        changing, other = new_endpoint(brand), new_endpoint(brand)
        backlog(brand, 2)
        url = app_environ["DATABASE_URL"].replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(url) as holder:
            holder.execute("SELECT 1 FROM webhook_endpoints WHERE id = %s FOR UPDATE", [changing])
            claimed = claim(10, limit=1).attempts
            assert {a.endpoint_id for a in claimed} == {other}
            [recorded] = record([(claimed[0], outcome())])
            assert recorded is not None and recorded.status == "delivered"
            holder.rollback()
        later = claim(10, limit=1, token="0000bbbb").attempts
        assert changing in {a.endpoint_id for a in later}


def test_a_record_defers_results_of_an_endpoint_whose_row_is_held(app, app_environ, brand):
    with app.app_context():
        endpoint = new_endpoint(brand)
        backlog(brand, 1)
        [attempt] = claim(1).attempts
        url = app_environ["DATABASE_URL"].replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(url) as holder:
            holder.execute("SELECT 1 FROM webhook_endpoints WHERE id = %s FOR UPDATE", [endpoint])
            finished = threading.Event()
            results = []

            def record_now():
                with app.app_context():
                    results.extend(record([(attempt, outcome())]))
                    finished.set()

            thread = threading.Thread(target=record_now)
            thread.start()
            assert finished.wait(5), "the record waited on the endpoint's lock"
            thread.join()
            holder.rollback()
        assert results == [None]  # deferred: recorded next round
        assert row(attempt.delivery_id).lease_token == attempt.token
        assert record([(attempt, outcome())])[0].status == "delivered"


def test_an_attempt_claimed_after_a_rotation_commits_carries_the_new_secret(
    app, brand, endpoint_with_backlog
):
    with app.app_context():
        before = claim(1, limit=2).attempts[0].secret_ciphertext
        rotate_signing_secret(brand_id=brand, endpoint_id=endpoint_with_backlog)
        db.session.commit()
        after = claim(1, limit=2, token="0000bbbb").attempts[0].secret_ciphertext
        assert after != before
        assert after == db.session.get(WebhookEndpoint, endpoint_with_backlog).secret_ciphertext
