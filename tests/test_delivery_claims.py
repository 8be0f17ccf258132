"""What the delivery loop asks of the database (services/delivery/queue.py and health.py): due
deliveries moved from the queue to leases as their attempts start, oldest first, never more in
flight per endpoint than its limit across all workers (whatever the deliveries' status),
endpoints served in turn from where the last walk stopped, the breaker's pause the same for
every worker, leases that outlive their attempt and lapse by themselves, results written under
the token that took the delivery, an endpoint that orders by subject holding a subject's later
deliveries behind the earlier one they wait for, one result that cannot be stored never holding
back the others, and no row of another endpoint or a lock anyone holds ever waited for."""

from __future__ import annotations

import time
from datetime import timedelta

import psycopg
import pytest
from sqlalchemy import func, select, text, update

from extensions import db
from models import (
    DeliveryLease,
    QueuedDelivery,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
)
from models.columns import utcnow
from services.delivery.health import apply_news, disable_endpoint, news_of
from services.delivery.outcomes import (
    RECORD_SLACK_SECONDS,
    START_WINDOW_SECONDS,
    UNSTORABLE,
    AttemptOutcome,
    RetryPolicy,
)
from services.delivery.queue import PROBING_AFTER_FAILURES, claim_attempts, record_attempts
from services.endpoint_urls import UrlPolicy
from services.events import publish_event
from services.webhook_endpoints import register_endpoint, rotate_signing_secret
from tests.bulk_jobs import run_bulk_jobs

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


def claim(slots: int, *, limit: int = 100, token: str = "0000aaaa", now=None, held=(), cursor=""):  # noqa: S107
    claimed = claim_attempts(
        slots=slots,
        endpoint_limit=limit,
        token=token,
        lease=LEASE,
        held=held,
        now=now,
        cursor=cursor,
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


def record(results, *, policy: RetryPolicy = POLICY):
    """As a round does: the results in one transaction, what they say of each endpoint's health
    in another."""
    recorded = record_attempts(results, policy=policy)
    applied = apply_news(news_of(results, recorded), policy=policy)
    db.session.commit()
    assert applied.carried == {}
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


def database_url(app_environ) -> str:
    return app_environ["DATABASE_URL"].replace("postgresql+psycopg://", "postgresql://")


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
        # A lease outlives the attempt's start window, its timeout and its record's slack.
        left = lease.leased_until - utcnow()
        assert timedelta(seconds=POLICY.timeout + RECORD_SLACK_SECONDS) < left <= LEASE
        # The claim wrote nothing on the delivery itself.
        assert row(first.attempts[0].delivery_id).attempt_count == 0
        # The endpoint's three slots are held: a second worker finds no room.
        assert claim(10, limit=3, token="0000bbbb").attempts == []


def test_a_lease_covers_the_start_window_the_timeout_and_the_records_slack(app):
    policy = RetryPolicy(schedule=(1,), disable_failures=1, disable_window=timedelta(0), timeout=3)
    assert policy.lease == timedelta(seconds=START_WINDOW_SECONDS + 3 + RECORD_SLACK_SECONDS)


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
        assert idle.attempts == [] and idle.round_done
        assert idle.next_due_at == recorded.retry_at  # the loop sleeps until then


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
        assert endpoint.consecutive_failures == PROBING_AFTER_FAILURES - 1 + 4
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
        # A new event is the probe after the breaker's pause; it succeeds: a catch-up job
        # brings what waited for a retry forward, in batches, apart from the round.
        backlog(brand, 1, start=9)
        paused_until = db.session.get(WebhookEndpoint, endpoint).next_probe_at
        [probe] = claim(4, limit=4, token="0000bbbb", now=paused_until).attempts
        assert numbers([probe]) == [9]
        record([(probe, outcome())])
        assert all(
            queued(a.delivery_id).next_attempt_at == at
            for a, at in zip(failed, waiting, strict=True)
        )
        assert run_bulk_jobs(app) == 1
        now = utcnow()
        brought = [queued(a.delivery_id).next_attempt_at for a in failed]
        assert [at <= now for at in brought] == [True, True, True, False]
        assert brought[3] > now + timedelta(seconds=500)
        # The log shows when each is due, as the queue does.
        assert [row(a.delivery_id).next_attempt_at for a in failed] == brought


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
        assert run_bulk_jobs(app) == 0
        assert queued(refused.delivery_id).next_attempt_at > utcnow() + timedelta(seconds=50)


def test_endpoints_take_turns_from_where_the_last_walk_stopped(app, brand, make_brand):
    """Each claim walks the endpoints with queued work from where the last one stopped: a
    backlog gets its turn once round, as a single event of another brand's does."""
    other_brand = make_brand("Single Foods")
    with app.app_context():
        busy = new_endpoint(brand)
        backlog(brand, 50)
        quiet = new_endpoint(other_brand)
        publish_event(brand_id=other_brand, name="deal.completed", data={"n": 1000})
        db.session.commit()
        first = claim(1, limit=1)
        second = claim(1, limit=2, token="0000bbbb", cursor=first.cursor)
        third = claim(1, limit=2, token="0000cccc", cursor=second.cursor)
        served = [c.attempts[0].endpoint_id for c in (first, second, third)]
        assert served == [busy, quiet, busy]  # the busy one's second waits for the quiet one
        assert not first.round_done  # slots ran out before the walk went round


def test_one_claim_serves_many_endpoints_first_of_each_before_second_of_any(app, brand):
    with app.app_context():
        endpoints = [new_endpoint(brand) for _ in range(5)]
        backlog(brand, 10)  # ten deliveries to each
        claimed = claim(5, limit=2).attempts
        assert sorted(a.endpoint_id for a in claimed) == sorted(endpoints)
        both = claim(10, limit=2, token="0000bbbb").attempts
        assert sorted(a.endpoint_id for a in both) == sorted(endpoints)


def test_a_claims_walk_is_bounded_and_says_when_it_went_round(app, brand, make_brand):
    """A claim walks at most `walk_max` endpoints; the ones it did not reach are for the next
    claim, which goes on from there."""
    with app.app_context():
        endpoints = []
        for number in range(3):
            other = make_brand(f"Walk {number}")
            endpoints.append(new_endpoint(other))
            publish_event(brand_id=other, name="deal.completed", data={"n": number})
        db.session.commit()
        short = claim_attempts(
            slots=10, endpoint_limit=1, token="0000aaaa", lease=LEASE, walk_max=2
        )
        db.session.commit()
        assert len(short.attempts) == 2 and not short.round_done
        rest = claim_attempts(
            slots=10,
            endpoint_limit=1,
            token="0000bbbb",
            lease=LEASE,
            walk_max=2,
            cursor=short.cursor,
            cycle_start="",
        )
        db.session.commit()
        assert len(rest.attempts) == 1 and rest.round_done
        served = {a.endpoint_id for a in short.attempts + rest.attempts}
        assert served == set(endpoints)


def test_workers_share_an_endpoints_limit(app, endpoint_with_backlog):
    """With two loops live (their heartbeats), each takes at most half an endpoint's limit: a
    second worker finds work however fast the first records and claims again."""
    with app.app_context():
        for loop_id in ("aaaa0000-1", "bbbb0000-2"):
            db.session.execute(
                text(
                    "INSERT INTO webhook_delivery_loops (id, hostname, pid, started_at,"
                    " last_round_at) VALUES (:id, 'test', 1, now(), now())"
                ),
                {"id": loop_id},
            )
        db.session.commit()
        first = claim(10, limit=4, token="aaaa0000" + "0" * 24).attempts
        assert len(first) == 2
        again = claim(10, limit=4, token="aaaa0000" + "1" * 24).attempts
        assert again == []  # its share is taken, the rest is the other worker's
        second = claim(10, limit=4, token="bbbb0000" + "0" * 24).attempts
        assert len(second) == 2


def test_a_disable_fails_the_queue_by_a_job_and_leaves_attempts_in_flight_their_record(
    app, endpoint_with_backlog
):
    with app.app_context():
        brand = db.session.get(WebhookEndpoint, endpoint_with_backlog).brand_id
        in_flight = claim(10, limit=2).attempts
        disable_endpoint(endpoint_with_backlog, reason="test", now=utcnow())
        db.session.execute(
            update(WebhookEndpoint)
            .where(WebhookEndpoint.id == endpoint_with_backlog)
            .values(disabled_at=None, disabled_reason=None)
        )
        db.session.commit()  # enabled again at once: what it had is still ended
        backlog(brand, 5, start=100)
        # Until the job is done, nothing of the endpoint's is attempted: not what it had (58
        # queued, made before the disable), not what came after.
        assert claim(10, limit=4, token="0000bbbb").attempts == []
        run_bulk_jobs(app)
        failed = db.session.scalar(
            select(func.count()).where(
                WebhookDelivery.endpoint_id == endpoint_with_backlog,
                WebhookDelivery.status == "failed",
            )
        )
        assert failed == 58
        # The job waits for the two attempts in flight, whose records say what happened.
        assert claim(10, limit=4, token="0000cccc").attempts == []
        success, failure = in_flight
        recorded = record([(success, outcome()), (failure, outcome(500, "HTTP 500"))])
        assert [r.kept for r in recorded] == [True, True]
        assert row(success.delivery_id).status == "delivered"  # the receiver has it
        assert row(failure.delivery_id).status == "pending"  # its endpoint takes attempts
        run_bulk_jobs(app)
        assert row(failure.delivery_id).status == "failed"  # made before the disable: ended
        assert queued(failure.delivery_id) is None
        logged = db.session.scalar(
            select(func.count()).where(
                WebhookAttempt.delivery_id.in_([success.delivery_id, failure.delivery_id])
            )
        )
        assert logged == 2
        assert numbers(claim(10, limit=2, token="0000dddd").attempts) == [100, 101]


def test_a_failure_of_a_closed_endpoint_ends_its_delivery_failed(app, endpoint_with_backlog):
    with app.app_context():
        [attempt] = claim(1, limit=1).attempts
        disable_endpoint(endpoint_with_backlog, reason="test", now=utcnow())
        db.session.commit()
        [recorded] = record([(attempt, outcome(500, "HTTP 500"))])
        assert recorded.status == "failed" and queued(attempt.delivery_id) is None


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
        assert not discarded.kept and not discarded.carried
        assert row(taken_over.delivery_id).status == "pending"
        assert lease_of(taken_over.delivery_id).token == "0000bbbb"


def test_a_closed_endpoints_stray_deliveries_are_ended_by_a_job_the_walk_asks_for(
    app, endpoint_with_backlog
):
    """A publish that raced the endpoint's closing (or rows left behind some other way) leaves
    queued work no job ends: the claim's walk meets it and asks for that job."""
    with app.app_context():
        db.session.execute(
            update(WebhookEndpoint)
            .where(WebhookEndpoint.id == endpoint_with_backlog)
            .values(deleted_at=utcnow())
        )
        db.session.commit()  # deleted without its service: 60 pending deliveries are strays
        assert claim(100).attempts == []
        run_bulk_jobs(app)
        statuses = set(
            db.session.scalars(
                select(WebhookDelivery.status).where(
                    WebhookDelivery.endpoint_id == endpoint_with_backlog
                )
            )
        )
        assert statuses == {"failed"}
        assert claim(100).attempts == []


def test_a_locked_endpoint_row_holds_back_nothing(app, app_environ, brand):
    """A claim and a record never wait for an endpoint's row (a change in progress, or a
    session that holds it for a minute): the claim takes its work, the record writes its
    result, and only the health news of that endpoint waits for the next round."""
    with app.app_context():
        locked, other = new_endpoint(brand), new_endpoint(brand)
        backlog(brand, 2)
        with psycopg.connect(database_url(app_environ)) as holder:
            holder.execute("SET lock_timeout = 0")
            holder.execute("SELECT 1 FROM webhook_endpoints WHERE id = %s FOR UPDATE", [locked])
            started = time.monotonic()
            claimed = claim(10, limit=1).attempts
            assert {a.endpoint_id for a in claimed} == {locked, other}
            results = [(a, outcome(500, "HTTP 500")) for a in claimed]
            recorded = record_attempts(results, policy=POLICY)
            assert [r.kept for r in recorded] == [True, True]
            applied = apply_news(news_of(results, recorded), policy=POLICY)
            db.session.commit()
            assert time.monotonic() - started < 5  # nothing waited for the lock
            assert set(applied.carried) == {locked}
            holder.rollback()
        db.session.expire_all()
        assert db.session.get(WebhookEndpoint, other).consecutive_failures == 1
        assert db.session.get(WebhookEndpoint, locked).consecutive_failures == 0
        # The next round writes what waited.
        apply_news(applied.carried, policy=POLICY)
        db.session.commit()
        db.session.expire_all()
        assert db.session.get(WebhookEndpoint, locked).consecutive_failures == 1


def test_a_result_whose_rows_are_locked_is_carried_not_waited_for(app, app_environ, brand):
    with app.app_context():
        new_endpoint(brand)
        backlog(brand, 2)
        first, second = claim(10, limit=2).attempts
        with psycopg.connect(database_url(app_environ)) as holder:
            holder.execute(
                "SELECT 1 FROM webhook_deliveries WHERE id = %s FOR UPDATE", [first.delivery_id]
            )
            recorded = record_attempts([(first, outcome()), (second, outcome())], policy=POLICY)
            assert [(r.kept, r.carried) for r in recorded] == [(False, True), (True, False)]
            holder.rollback()
        [later] = record_attempts([(first, outcome())], policy=POLICY)
        assert later.kept and row(first.delivery_id).status == "delivered"


def test_success_records_write_no_endpoint_row(app, endpoint_with_backlog):
    """Item 8 of issue 41: a delivery updates no endpoint row on its way (claims and records of
    a healthy endpoint touch only the queue, the leases, the delivery and its attempt)."""
    with app.app_context():
        before = db.session.execute(
            text("SELECT xmin::text FROM webhook_endpoints WHERE id = :id"),
            {"id": endpoint_with_backlog},
        ).scalar_one()
        db.session.commit()
        for token in ("0000aaaa", "0000bbbb", "0000cccc"):
            attempts = claim(10, limit=4, token=token).attempts
            record([(a, outcome()) for a in attempts])
        after = db.session.execute(
            text("SELECT xmin::text FROM webhook_endpoints WHERE id = :id"),
            {"id": endpoint_with_backlog},
        ).scalar_one()
        assert after == before  # the row's version is the one the registration wrote


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
        held = db.session.execute(
            select(QueuedDelivery.delivery_id, QueuedDelivery.held_behind).where(
                QueuedDelivery.next_attempt_at.is_(None)
            )
        ).all()
        assert len(held) == 4
        # Each waits behind the one just before it in its subject (CONTRACT 13.1).
        behind = {row.held_behind for row in held}
        assert {a_first.delivery_id, b_first.delivery_id} <= behind
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


def test_one_unstorable_result_never_holds_back_the_others(app, brand):
    with app.app_context():
        new_endpoint(brand)
        backlog(brand, 4)
        attempts = claim(3, limit=3).attempts
        # Bytes no text column takes (what answers.py would have replaced).
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


def test_no_statement_of_the_app_pays_for_jit_compilation(app, endpoint_with_backlog):
    """PostgreSQL compiles a statement whose estimate passes `jit_above_cost`: a claim over a
    backlog of a million spent 90 ms compiling to run for 6 (docs/benchmarks.md). Every
    connection of the app's engine has JIT off: even with every threshold at 0, a statement
    over the queue is planned without it."""
    with app.app_context(), db.engine.connect() as connection:
        for threshold in ("jit_above_cost", "jit_inline_above_cost", "jit_optimize_above_cost"):
            connection.exec_driver_sql(f"SET {threshold} = 0")
        plan = connection.exec_driver_sql(
            "EXPLAIN (ANALYZE, FORMAT JSON) SELECT endpoint_id, min(next_attempt_at)"
            " FROM webhook_delivery_queue GROUP BY endpoint_id"
        ).scalar_one()[0]
        connection.rollback()
    assert "JIT" not in plan, plan["JIT"]
