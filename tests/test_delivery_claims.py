"""What the delivery loop asks of the database (services/delivery_attempts.py): due deliveries
moved from the queue to leases as their attempts start, oldest first, never more in flight per
endpoint than its slot limit across all workers (whatever the deliveries' status), endpoints
served in turn, the breaker's pause the same for every worker, leases that outlive their attempt
and lapse by themselves, results written under the token that took the delivery, an endpoint
that orders by subject holding a subject's later deliveries behind its earlier, and one result
that cannot be stored never holding back the others."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import psycopg
import pytest
from sqlalchemy import func, select, update

from extensions import db
from models import (
    DeliveryLease,
    QueuedDelivery,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
)
from models.columns import utcnow
from services.delivery_attempts import (
    LEASE_SLACK,
    UNSTORABLE,
    AttemptOutcome,
    RetryPolicy,
    claim_attempts,
    record_attempts,
)
from services.delivery_queue import PROBING_AFTER_FAILURES
from services.endpoint_health import disable_endpoint
from services.endpoint_urls import UrlPolicy
from services.events import publish_event
from services.webhook_endpoints import register_endpoint, rotate_signing_secret

POLICY = RetryPolicy(
    schedule=(60, 60), disable_failures=1000, disable_window=timedelta(days=1), timeout=10
)
LEASE = POLICY.lease


def new_endpoint(brand: str, **options) -> str:
    return register_endpoint(
        brand_id=brand,
        url="http://127.0.0.1:9/hooks",
        events=["deal.completed"],
        policy=UrlPolicy(https_only=False, allow_local=True),
        **options,
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


def claim(slots: int, *, limit: int = 100, token: str = "0000aaaa", now=None, held=()):  # noqa: S107
    claimed = claim_attempts(
        slots=slots, endpoint_limit=limit, token=token, lease=LEASE, held=held, now=now
    )
    db.session.commit()
    return claimed


def numbers(attempts) -> list[int]:
    return [int(a.body.split(b'"n":')[1].split(b"}")[0]) for a in attempts]


def outcome(status: int | None = 200, error: str | None = None, **more) -> AttemptOutcome:
    return AttemptOutcome(
        requested_at=utcnow(),
        duration_ms=5,
        request_headers={},
        http_status=status,
        error=error,
        **more,
    )


def record(results):
    recorded = record_attempts(results, policy=POLICY)
    db.session.commit()
    return recorded


def row(delivery_id: str) -> WebhookDelivery:
    db.session.expire_all()
    return db.session.get(WebhookDelivery, delivery_id)


def lease_of(delivery_id: str) -> DeliveryLease | None:
    db.session.expire_all()
    return db.session.get(DeliveryLease, delivery_id)


def queued(delivery_id: str) -> QueuedDelivery | None:
    db.session.expire_all()
    return db.session.get(QueuedDelivery, delivery_id)


def test_a_claim_takes_the_oldest_due_up_to_the_endpoints_room(app, endpoint_with_backlog):
    with app.app_context():
        first = claim(10, limit=3)
        assert numbers(first.attempts) == [0, 1, 2]
        assert {a.attempt_number for a in first.attempts} == {1}
        assert all(a.url == "http://127.0.0.1:9/hooks" for a in first.attempts)
        assert all(a.event_id.startswith("evt_") for a in first.attempts)
        lease = lease_of(first.attempts[0].delivery_id)
        assert lease is not None and lease.token == "0000aaaa"
        assert queued(first.attempts[0].delivery_id) is None
        # A lease outlives the attempt's timeout, so nothing extends it; not by much more.
        left = lease.leased_until - utcnow()
        assert timedelta(seconds=POLICY.timeout) < left <= LEASE
        # The claim wrote nothing on the delivery itself.
        assert row(first.attempts[0].delivery_id).attempt_count == 0
        # The endpoint's three slots are held: a second worker finds no room.
        assert claim(10, limit=3, token="0000bbbb").attempts == []


def test_a_lapsed_lease_goes_first_again_and_holds_no_slot(app, endpoint_with_backlog):
    with app.app_context():
        first = claim(2, limit=2)
        later = utcnow() + LEASE + timedelta(seconds=1)
        again = claim(2, limit=2, token="0000bbbb", now=later)
        assert numbers(again.attempts) == numbers(first.attempts) == [0, 1]
        assert {a.attempt_number for a in again.attempts} == {1}  # the lost attempt is not one
        assert lease_of(again.attempts[0].delivery_id).token == "0000bbbb"


def test_a_worker_never_takes_again_what_it_still_holds(app, endpoint_with_backlog):
    with app.app_context():
        mine = claim(2, limit=2).attempts
        later = utcnow() + LEASE + timedelta(seconds=1)
        held = [a.delivery_id for a in mine]
        again = claim(2, limit=2, now=later, held=held).attempts
        assert not {a.delivery_id for a in again} & set(held)
        assert numbers(again) == [2, 3]


def test_a_retry_is_never_claimed_before_it_is_due(app, endpoint_with_backlog):
    with app.app_context():
        [attempt] = claim(1, limit=1).attempts
        [recorded] = record([(attempt, outcome(500, "HTTP 500"))])
        assert recorded.status == "pending" and recorded.retry_at is not None
        assert queued(attempt.delivery_id).next_attempt_at == recorded.retry_at
        soon = claim(100, limit=100)
        assert attempt.delivery_id not in {a.delivery_id for a in soon.attempts}
        due = claim(100, limit=100, token="0000cccc", now=recorded.retry_at)
        assert attempt.delivery_id in {a.delivery_id for a in due.attempts}


def test_an_idle_claim_says_when_the_next_retry_falls_due(app, brand):
    with app.app_context():
        new_endpoint(brand)
        backlog(brand, 1)
        [attempt] = claim(1).attempts
        [recorded] = record([(attempt, outcome(500, "HTTP 500"))])
        idle = claim(100, token="0000bbbb")
        assert idle.attempts == []
        assert idle.next_ready_at == recorded.retry_at  # the loop sleeps until then


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


def test_an_endpoint_that_answers_again_gets_its_retries_at_once(app, brand):
    with app.app_context():
        endpoint = new_endpoint(brand)
        backlog(brand, 4)
        failed = claim(4, limit=4).attempts
        record([(a, outcome(503, "HTTP 503")) for a in failed[:3]])
        # A receiver's Retry-After is kept even then.
        record([(failed[3], outcome(429, "HTTP 429", retry_after_seconds=600))])
        waiting = [queued(a.delivery_id).next_attempt_at for a in failed]
        assert all(at > utcnow() + timedelta(seconds=50) for at in waiting)
        # A new event is the probe after the breaker's pause; it succeeds: what waited for a
        # retry is due now.
        backlog(brand, 1, start=9)
        paused_until = db.session.get(WebhookEndpoint, endpoint).next_probe_at
        [probe] = claim(4, limit=4, token="0000bbbb", now=paused_until).attempts
        assert numbers([probe]) == [9]
        record([(probe, outcome())])
        now = utcnow()
        brought = [queued(a.delivery_id).next_attempt_at for a in failed]
        assert [at <= now for at in brought] == [True, True, True, False]
        assert brought[3] > now + timedelta(seconds=500)


def test_endpoints_take_turns_whoever_has_the_older_backlog(app, brand, make_brand):
    """Endpoints are served in the order they became ready, each served one goes to the back of
    the line: a backlog never goes before a single event that became ready before its turn."""
    other_brand = make_brand("Single Foods")
    with app.app_context():
        busy = new_endpoint(brand)
        backlog(brand, 50)
        [first] = claim(1, limit=1).attempts
        quiet = new_endpoint(other_brand)
        publish_event(brand_id=other_brand, name="deal.completed", data={"n": 1000})
        db.session.commit()
        record([(first, outcome())])
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
        assert db.session.scalar(select(func.count()).select_from(QueuedDelivery)) == 0
        backlog(db.session.get(WebhookEndpoint, endpoint_with_backlog).brand_id, 5, start=100)
        # The two attempts still in flight hold both slots, although their rows are failed.
        assert claim(10, limit=2, token="0000bbbb").attempts == []
        success, failure = in_flight
        recorded = record([(success, outcome()), (failure, outcome(500, "HTTP 500"))])
        assert [r.kept for r in recorded] == [True, True]
        # Each is logged; the receiver had the first: it is delivered, whatever the disable said.
        assert row(success.delivery_id).status == "delivered"
        assert row(failure.delivery_id).status == "failed"
        assert queued(failure.delivery_id) is None  # failed: not queued for a retry
        logged = db.session.scalar(
            select(func.count()).where(
                WebhookAttempt.delivery_id.in_([success.delivery_id, failure.delivery_id])
            )
        )
        assert logged == 2
        assert numbers(claim(10, limit=2, token="0000cccc").attempts) == [100, 101]


def test_a_late_result_is_kept_unless_another_worker_took_its_delivery(app, endpoint_with_backlog):
    with app.app_context():
        late, taken_over = claim(2, limit=2).attempts
        # Both leases lapse. Nobody visits the endpoint: the late result still counts.
        past = utcnow() - timedelta(seconds=1)
        db.session.execute(update(DeliveryLease).values(leased_until=past))
        db.session.commit()
        [kept] = record([(late, outcome())])
        assert kept.kept and row(late.delivery_id).status == "delivered"
        # The other's lapsed lease is taken by another worker's claim: its late result is not.
        [again] = claim(1, limit=2, token="0000bbbb").attempts
        assert again.delivery_id == taken_over.delivery_id
        [discarded] = record([(taken_over, outcome())])
        assert not discarded.kept
        assert row(taken_over.delivery_id).status == "pending"
        assert lease_of(taken_over.delivery_id).token == "0000bbbb"


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
        assert db.session.get(WebhookEndpoint, endpoint_with_backlog).ready_at is None


def test_an_endpoint_being_changed_is_skipped_by_a_claim_and_waited_for_by_a_record(
    app, app_environ, brand
):
    """A claim never waits on an endpoint's row lock (an update in progress): the endpoint is
    left for the next round, and other endpoints go on. A record waits for the change to
    commit (milliseconds), so that its failure counts and the change never cross."""
    with app.app_context():
        changing, other = new_endpoint(brand), new_endpoint(brand)
        backlog(brand, 2)
        url = app_environ["DATABASE_URL"].replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(url) as holder:
            holder.execute("SELECT 1 FROM webhook_endpoints WHERE id = %s FOR UPDATE", [changing])
            claimed = claim(10, limit=1).attempts
            assert {a.endpoint_id for a in claimed} == {other}
            holder.rollback()
        later = claim(10, limit=1, token="0000bbbb").attempts
        [attempt] = [a for a in later if a.endpoint_id == changing]
        with psycopg.connect(url) as holder:
            holder.execute("SELECT 1 FROM webhook_endpoints WHERE id = %s FOR UPDATE", [changing])
            results = []
            thread = threading.Thread(
                target=lambda: (
                    app.app_context().push() or results.extend(record([(attempt, outcome())]))
                )
            )
            started = time.monotonic()
            thread.start()
            time.sleep(0.5)
            assert not results  # waiting for the change
            holder.commit()
            thread.join(10)
        assert [r.status for r in results] == ["delivered"]
        assert time.monotonic() - started >= 0.5


def test_a_publisher_in_progress_keeps_the_endpoint_ready(app, app_environ, brand):
    """A claim that finds nothing due may set the endpoint aside (ready_at null) only when no
    publisher is adding to it: a delivery committed after the claim looked must not be
    stranded."""
    with app.app_context():
        endpoint = new_endpoint(brand)
        backlog(brand, 1)
        [attempt] = claim(10).attempts
        record([(attempt, outcome())])
        url = app_environ["DATABASE_URL"].replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(url) as publisher:
            # A publisher's lock on the endpoint, as its statement takes it, not committed yet.
            publisher.execute(
                "SELECT 1 FROM webhook_endpoints WHERE id = %s FOR KEY SHARE", [endpoint]
            )
            assert claim(10).attempts == []
            db.session.expire_all()
            assert db.session.get(WebhookEndpoint, endpoint).ready_at is not None
            publisher.rollback()
        assert claim(10).attempts == []  # no publisher now: it is set aside
        db.session.expire_all()
        assert db.session.get(WebhookEndpoint, endpoint).ready_at is None
        backlog(brand, 1, start=7)  # and a publish brings it back
        assert numbers(claim(10).attempts) == [7]


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


def deal_event(deal: str, step: int) -> dict:
    return {"id": deal, "status": "in_progress", "n": step}


def test_an_ordered_endpoint_holds_a_subjects_later_events_behind_its_earlier(app, brand):
    with app.app_context():
        new_endpoint(brand, ordering="subject")
        for step in range(3):
            for deal in ("deal_a", "deal_b"):
                publish_event(brand_id=brand, name="deal.completed", data=deal_event(deal, step))
        db.session.commit()
        first = claim(10, limit=4).attempts
        # One of each subject at a time, whatever the room.
        assert sorted(numbers(first)) == [0, 0]
        a_first = next(a for a in first if b'"deal_a"' in a.body)
        b_first = next(a for a in first if b'"deal_b"' in a.body)
        held = db.session.scalar(
            select(func.count()).where(QueuedDelivery.next_attempt_at.is_(None))
        )
        assert held == 4
        # deal_a's first fails: deal_a's next waits, deal_b's next goes.
        record([(a_first, outcome(500, "HTTP 500")), (b_first, outcome())])
        second = claim(10, limit=4, token="0000bbbb").attempts
        assert [
            (b'"deal_b"' in a.body, n) for a, n in zip(second, numbers(second), strict=True)
        ] == [(True, 1)]
        record([(second[0], outcome())])
        # At its retry, deal_a's first goes (deal_b's third beside it), never deal_a's second.
        retry_at = queued(a_first.delivery_id).next_attempt_at
        third = claim(10, limit=4, token="0000cccc", now=retry_at).attempts
        assert [a.delivery_id for a in third if b'"deal_a"' in a.body] == [a_first.delivery_id]
        # When deal_a's first succeeds, its second goes.
        record([(attempt, outcome()) for attempt in third])
        [a_second] = [
            a for a in claim(10, limit=4, token="0000dddd").attempts if b'"deal_a"' in a.body
        ]
        assert numbers([a_second]) == [1]


def test_one_unstorable_result_never_holds_back_the_others(app, brand):
    with app.app_context():
        new_endpoint(brand)
        backlog(brand, 4)
        attempts = claim(3, limit=3).attempts
        # Bytes no text column takes (what workers/answers.py would have replaced).
        poisoned = outcome(200, response_body="OK\x00\x00 binary")
        recorded = record(
            [(attempts[0], outcome()), (attempts[1], poisoned), (attempts[2], outcome())]
        )
        assert [r.status for r in recorded] == ["delivered"] * 3
        assert [r.reduced for r in recorded] == [False, True, False]
        stored = db.session.get(WebhookAttempt, (attempts[1].delivery_id, 1))
        assert stored.http_status == 200 and stored.response_body is None
        failing = outcome(500, error="HTTP 500\x00")
        [failed] = record([(claim(1, limit=3, token="0000bbbb").attempts[0], failing)])
        assert failed.reduced and failed.status == "pending"
        assert db.session.scalar(
            select(WebhookAttempt.error).where(WebhookAttempt.error == UNSTORABLE)
        )


def test_a_lease_lasts_the_timeout_and_its_slack(app):
    policy = RetryPolicy(schedule=(1,), disable_failures=1, disable_window=timedelta(0), timeout=3)
    assert policy.lease == timedelta(seconds=3) + LEASE_SLACK


def test_a_released_delivery_goes_before_what_was_published_after_it(app, brand):
    """A subject's next event waits for the earlier one, then goes in its own place in the
    endpoint's line: before the deliveries published after it, not behind all of them (with a
    backlog, each event of the subject would wait the whole backlog again)."""
    with app.app_context():
        new_endpoint(brand, ordering="subject")
        for step in range(2):
            publish_event(brand_id=brand, name="deal.completed", data=deal_event("deal_a", step))
        db.session.commit()
        [first] = claim(10, limit=1).attempts
        for deal in ("deal_b", "deal_c", "deal_d"):
            publish_event(brand_id=brand, name="deal.completed", data=deal_event(deal, 0))
        db.session.commit()
        record([(first, outcome())])
        [after] = claim(10, limit=1, token="0000bbbb").attempts
        assert b'"deal_a"' in after.body and numbers([after]) == [1]


def test_a_delivery_refused_by_a_healthy_endpoint_keeps_its_retry_schedule(app, brand):
    """Catch-up is for an endpoint coming back. One delivery its receiver keeps refusing (one
    deal's events, a handler that fails on one event type) while the endpoint's other
    deliveries succeed waits for its retry: brought forward by every success, it would spend
    all its attempts in seconds and end `failed` long before the schedule's last retry."""
    with app.app_context():
        new_endpoint(brand)
        backlog(brand, 2)
        refused, other = claim(10, limit=2).attempts
        record([(refused, outcome(500, "HTTP 500"))])
        record([(other, outcome())])
        assert queued(refused.delivery_id).next_attempt_at > utcnow() + timedelta(seconds=50)


def test_no_statement_of_the_app_pays_for_jit_compilation(app, endpoint_with_backlog):
    """PostgreSQL compiles a statement whose estimate passes `jit_above_cost`: a claim over a
    backlog of a million spent 90 ms compiling to run for 6 (docs/benchmarks.md). Every
    connection of the app's engine, the delivery loop's included, has JIT off: even with every
    threshold at 0, a statement over the queue is planned without it."""
    with app.app_context(), db.engine.connect() as connection:
        for threshold in ("jit_above_cost", "jit_inline_above_cost", "jit_optimize_above_cost"):
            connection.exec_driver_sql(f"SET {threshold} = 0")
        plan = connection.exec_driver_sql(
            "EXPLAIN (ANALYZE, FORMAT JSON) SELECT endpoint_id, min(next_attempt_at)"
            " FROM webhook_delivery_queue GROUP BY endpoint_id"
        ).scalar_one()[0]
        connection.rollback()
    assert "JIT" not in plan, plan["JIT"]
