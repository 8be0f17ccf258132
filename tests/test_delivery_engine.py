"""The delivery loop against receivers that behave like real ones: slow, hanging, trickling,
asking for a later retry, gone. Real `flask worker` processes, real receivers on 127.0.0.1,
PostgreSQL and Redis.

Behaviour, not timing: what has arrived, and what the delivery log says, at a moment another
receiver proves (an attempt still in flight, a trickle not finished).
"""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from itertools import pairwise

import psycopg
import pytest
from sqlalchemy import func, select

from extensions import db
from models import DeliveryLease, WebhookDelivery
from services.delivery.transport import parse_retry_after
from services.endpoint_urls import UrlPolicy
from services.events import publish_event
from services.webhook_endpoints import register_endpoint
from tests import test_webhook_delivery as delivery
from tests.receiver import Receiver, Reply
from tests.test_webhook_delivery import logs, parse_time, poll, publish

LOCAL = UrlPolicy(https_only=False, allow_local=True)

# The delivery tests' fixtures: a brand's API, and workers of a test's own.
api = delivery.api
workers = delivery.workers
start_worker = delivery.start_worker


@pytest.fixture
def hanging() -> Receiver:
    """A receiver that never answers (until the test ends)."""
    server = Receiver()
    release = threading.Event()
    server.default = Reply(hold=release)
    yield server
    release.set()
    server.close()


@pytest.fixture
def healthy() -> Receiver:
    server = Receiver()
    yield server
    server.close()


def test_a_healthy_endpoint_is_delivered_while_a_hanging_ones_attempt_is_in_flight(
    app, api, brand, hanging, healthy, start_worker
):
    own = start_worker(WEBHOOK_TIMEOUT="20")  # one worker process
    api.register(hanging.url, events=["deal.completed"])
    api.register(healthy.url, events=["deal.completed"])

    published = publish(app, brand, *(("deal.completed", {"n": n}) for n in range(5)))
    healthy.wait_for(5)
    delivery_ids = {ids for _, pair in published for ids in pair}
    healthy_ids = {request.delivery_id for request in healthy.received}
    for delivery_id in healthy_ids:
        api.wait_delivery(delivery_id, "delivered", worker=own)
    # ... while the hanging endpoint's attempts are still open.
    assert hanging.in_flight >= 1, logs(own)
    hanging_ids = delivery_ids - healthy_ids
    assert all(api.delivery(d)["status"] == "pending" for d in hanging_ids)


def test_a_brand_with_10000_due_deliveries_delays_another_brands_event_by_a_few_attempts(
    app, make_brand, healthy, start_worker
):
    """The backlog's endpoints could fill every slot of the worker (four here), yet the other
    brand's single event takes its turn among them instead of waiting for the backlog."""
    busy = Receiver()
    # Slow enough that the single event's wake (commit, NOTIFY, the loop's round: tens of
    # milliseconds on a loaded machine) costs a couple of the backlog's attempts, not a dozen:
    # what is counted is the turns the loop gives, not how fast the wake travels.
    busy.default = Reply(delay=0.2)
    try:
        backlog_brand, single_brand = make_brand("Backlog Foods"), make_brand("Single Foods")
        with app.app_context():
            for number in range(5):
                register_endpoint(
                    brand_id=backlog_brand,
                    url=f"{busy.url}/{number}",
                    events=["escrow.released"],
                    policy=LOCAL,
                )
            register_endpoint(
                brand_id=single_brand, url=healthy.url, events=["deal.completed"], policy=LOCAL
            )
            db.session.commit()
            for batch in range(20):
                for number in range(100):
                    publish_event(
                        brand_id=backlog_brand,
                        name="escrow.released",
                        data={"n": batch * 100 + number},
                    )
                db.session.commit()
            due = db.session.scalar(
                select(func.count()).where(
                    WebhookDelivery.brand_id == backlog_brand, WebhookDelivery.status == "pending"
                )
            )
        assert due == 10_000
        own = start_worker(WEBHOOK_CONCURRENCY="4")
        busy.wait_for(12, timeout=30)

        before = len(busy.received)
        publish(app, single_brand, ("deal.completed", {"single": True}))
        healthy.wait_for(1)
        during = len(busy.received) - before

        assert len(busy.received) < 1_000, logs(own)
        assert during <= 10, f"{during} backlog attempts before the single event\n{logs(own)}"
    finally:
        busy.close()


def test_a_busy_worker_holds_at_most_four_database_connections(
    app, app_environ, api, brand, hanging, healthy, start_worker
):
    """The delivery loop's connection, the wake-up listener's, and the pool's for RQ's jobs
    and maintenance: however much is in flight (docs/webhooks.md, "Sizing")."""
    for number in range(6):  # 18 of the brand's 20 endpoints
        api.register(f"{healthy.url}/{number}", events=["deal.completed"])
        api.register(f"{hanging.url}/{number}", events=["deal.completed"])
    failing = Receiver()
    failing.default = Reply(status=500)
    try:
        for number in range(6):
            api.register(f"{failing.url}/{number}", events=["deal.completed"])
        own = start_worker(WEBHOOK_TIMEOUT="1", WEBHOOK_SWEEP_INTERVAL="0.5")
        own.wait_started()
        # Sampled while it is busy, not while its interpreter is still starting.
        publish(app, brand, *(("deal.completed", {"n": n}) for n in range(20)))
        healthy.wait_for(1, timeout=30)
        url = app_environ["DATABASE_URL"].replace("postgresql+psycopg://", "postgresql://")
        seen = []
        with psycopg.connect(url, autocommit=True) as conn:
            for number in range(60):
                if number % 10 == 0:
                    publish(app, brand, *(("deal.completed", {"n": n}) for n in range(20)))
                seen.append(
                    conn.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                        [f"brand-api pid={own.pid}"],
                    ).fetchone()[0]
                )
                time.sleep(0.05)
        assert len(failing.received) > 0 and len(healthy.received) > 0, logs(own)
        assert 2 <= max(seen) <= 4, (seen, logs(own))
    finally:
        failing.close()


def test_a_trickling_receiver_cannot_hold_an_attempt_past_the_timeout(
    app, api, brand, start_worker
):
    trickler = Receiver()
    trickler.default = Reply(trickle=0.2, body=b"x" * 50)  # the answer would take ~25 s
    try:
        own = start_worker(WEBHOOK_TIMEOUT="1", WEBHOOK_RETRY_SCHEDULE="60")
        api.register(trickler.url, events=["deal.completed"])
        [(_, [delivery_id])] = publish(app, brand, ("deal.completed", {"n": 1}))

        detail = api.wait_delivery(
            delivery_id, lambda d: d["attemptCount"] == 1, timeout=10, worker=own
        )
        attempt = detail["attempts"][0]
        assert attempt["error"].startswith("Timed out after 1s"), attempt
        assert trickler.trickles_finished == 0  # the receiver was still trickling
        assert attempt["durationMs"] < 5000, attempt  # a sanity bound, far above the 1 s
        assert detail["status"] == "pending" and detail["nextRetryAt"] is not None
    finally:
        trickler.close()


@pytest.mark.parametrize("as_date", [False, True])
def test_retry_after_sets_the_next_attempt_no_sooner_than_asked(
    app, api, brand, healthy, start_worker, as_date
):
    own = start_worker(WEBHOOK_RETRY_SCHEDULE="1,1")
    api.register(healthy.url, events=["deal.completed"])
    # An HTTP date counts from when it is written: 5 s from now, whole seconds.
    not_before = (datetime.now(UTC) + timedelta(seconds=5)).replace(microsecond=0)
    asked = format_datetime(not_before, usegmt=True) if as_date else "3"
    healthy.reply_with(Reply(status=429, headers={"Retry-After": asked}))
    [(_, [delivery_id])] = publish(app, brand, ("deal.completed", {"n": 1}))

    first, second = healthy.wait_for(2, timeout=20)
    detail = api.wait_delivery(delivery_id, "delivered", worker=own)
    if as_date:
        assert second.received_wall >= not_before.timestamp(), logs(own)
    else:
        assert second.received_at - first.received_at >= 2.9, logs(own)
    failed = detail["attempts"][0]
    assert failed["httpStatus"] == 429
    assert "Retry-After" in failed["error"], failed


def test_a_410_disables_the_endpoint_at_once(app, api, brand, healthy, start_worker):
    healthy.default = Reply(status=410)
    own = start_worker()
    endpoint = api.register(healthy.url, events=["deal.completed"])
    published = publish(app, brand, *(("deal.completed", {"n": n}) for n in range(3)))

    disabled = poll(
        lambda: api.endpoint(endpoint["id"]),
        lambda e: not e["isActive"],
        timeout=15,
        what="the endpoint disabled by 410",
        worker=own,
    )
    assert "410 Gone" in disabled["disabledReason"]
    for _, ids in published:
        api.wait_delivery(ids[0], "failed", worker=own)
    # The attempts in flight when the first 410 came back are recorded too: each counts. The
    # disable fails such a delivery at once; its attempt is recorded when the receiver answers.
    details = poll(
        lambda: [api.delivery(ids[0]) for _, ids in published],
        lambda found: sum(d["attemptCount"] for d in found) == len(healthy.received),
        timeout=15,
        what="every attempt the receiver heard recorded",
        worker=own,
    )
    attempted = sum(d["attemptCount"] for d in details)
    assert 1 <= attempted <= 2  # WEBHOOK_ENDPOINT_CONCURRENCY
    assert api.endpoint(endpoint["id"])["consecutiveFailures"] == attempted
    gone = [d for d in details if d["attemptCount"]]
    assert "410 Gone" in gone[0]["attempts"][0]["error"]
    # No retry of a 410: the receiver heard of each delivery at most once.
    time.sleep(1.5)
    assert max(Counter(r.delivery_id for r in healthy.received).values()) == 1


def test_retries_arrive_on_schedule(app, api, brand, healthy, start_worker):
    healthy.reply_with(*[Reply(status=500)] * 3)
    own = start_worker(WEBHOOK_RETRY_SCHEDULE="1,1,1")
    api.register(healthy.url, events=["deal.completed"])
    [(_, [delivery_id])] = publish(app, brand, ("deal.completed", {"n": 1}))

    received = healthy.wait_for(4, timeout=20)
    api.wait_delivery(delivery_id, "delivered", worker=own)
    gaps = [later.received_at - earlier.received_at for earlier, later in pairwise(received)]
    # Each retry 1 s (±10%) after the failure before it: never early, and on time.
    assert all(0.85 <= gap < 3.0 for gap in gaps), (gaps, logs(own))


def test_a_worker_killed_with_100_attempts_in_flight_loses_none(
    app, api, brand, hanging, start_worker
):
    settings = {"WEBHOOK_ENDPOINT_CONCURRENCY": "100", "WEBHOOK_TIMEOUT": "5"}
    endpoint = api.register(hanging.url, events=["deal.completed"])
    published = publish(app, brand, *(("deal.completed", {"n": n}) for n in range(100)))
    delivery_ids = [ids[0] for _, ids in published]
    doomed = start_worker(**settings)
    hanging.wait_for(100, timeout=20)
    assert hanging.in_flight == 100
    doomed.kill()

    assert all(api.delivery(d)["status"] == "pending" for d in delivery_ids)
    assert all(api.delivery(d)["attemptCount"] == 0 for d in delivery_ids)
    hanging.default = Reply()  # the receiver is back
    successor = start_worker(**settings)  # it takes them once their leases lapse
    for delivery_id in delivery_ids:
        detail = api.wait_delivery(delivery_id, "delivered", timeout=40, worker=successor)
        assert detail["attemptCount"] == 1
    counts = Counter(r.delivery_id for r in hanging.received)
    assert set(counts) == set(delivery_ids)
    assert set(counts.values()) == {2}  # the lost attempt, then the successor's
    assert api.endpoint(endpoint["id"])["isActive"]


def test_sigterm_finishes_the_attempts_in_flight_and_gives_back_the_rest(
    app, api, brand, start_worker
):
    slow = Receiver()
    slow.default = Reply(delay=1.0)
    try:
        api.register(slow.url, events=["deal.completed"])
        published = publish(app, brand, *(("deal.completed", {"n": n}) for n in range(10)))
        delivery_ids = [ids[0] for _, ids in published]
        stopping = start_worker(WEBHOOK_TIMEOUT="3")
        slow.wait_for(1, timeout=20)
        stopping.process.send_signal(signal.SIGTERM)
        stopping.process.wait(3 + 5)  # the attempts in flight end within the timeout

        started = {r.delivery_id for r in slow.received}
        with app.app_context():
            rows = db.session.execute(
                select(WebhookDelivery.id, WebhookDelivery.status).where(
                    WebhookDelivery.id.in_(delivery_ids)
                )
            ).all()
            leased = set(
                db.session.scalars(
                    select(DeliveryLease.delivery_id).where(
                        DeliveryLease.delivery_id.in_(delivery_ids)
                    )
                )
            )
        assert not leased  # what was not started is given back, not left to lapse
        for row in rows:
            if row.id in started:
                assert row.status == "delivered", (row, logs(stopping))
            else:
                assert row.status == "pending", row
        assert len(started) < len(delivery_ids)
    finally:
        slow.close()


def test_an_endpoints_limit_holds_across_two_workers(app, api, brand, start_worker):
    slow = Receiver()
    slow.default = Reply(delay=0.15)
    try:
        api.register(slow.url, events=["deal.completed"])
        published = publish(app, brand, *(("deal.completed", {"n": n}) for n in range(30)))
        first, second = start_worker(), start_worker()
        for _, [delivery_id] in published:
            api.wait_delivery(delivery_id, "delivered", timeout=30, worker=first)
        assert 1 <= slow.max_in_flight <= 2, logs(first, second)  # WEBHOOK_ENDPOINT_CONCURRENCY
        counts = Counter(r.delivery_id for r in slow.received)
        assert len(counts) == 30 and set(counts.values()) == {1}
    finally:
        slow.close()


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("120", 120.0),
        ("0", 0.0),
        (" 7 ", 7.0),
        ("86400", 3600.0),  # at most an hour (CONTRACT 8.6)
        ("Tue, 24 Nov 2026 12:00:30 GMT", 30.0),
        ("Tue, 24 Nov 2026 11:00:00 GMT", 0.0),  # in the past: as soon as the schedule says
        ("Wed, 25 Nov 2026 12:00:00 GMT", 3600.0),
        ("soon", None),
        ("-5", None),
        ("", None),
        (None, None),
    ],
)
def test_retry_after_is_read_as_seconds_or_an_http_date(value, seconds):
    now = datetime(2026, 11, 24, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after(value, now=now) == seconds


def test_the_next_attempt_time_is_in_the_log(app, api, brand, healthy, start_worker):
    healthy.reply_with(Reply(status=503, headers={"Retry-After": "30"}))
    own = start_worker(WEBHOOK_RETRY_SCHEDULE="1,1")
    api.register(healthy.url, events=["deal.completed"])
    [(_, [delivery_id])] = publish(app, brand, ("deal.completed", {"n": 1}))
    detail = api.wait_delivery(delivery_id, lambda d: d["attemptCount"] == 1, worker=own)
    requested = parse_time(detail["attempts"][0]["requestedAt"])
    assert parse_time(detail["nextRetryAt"]) - requested >= timedelta(seconds=29)


def test_an_endpoint_that_keeps_timing_out_gets_one_slot(app, api, brand, hanging, start_worker):
    own = start_worker(
        WEBHOOK_TIMEOUT="1", WEBHOOK_ENDPOINT_CONCURRENCY="4", WEBHOOK_RETRY_SCHEDULE="60"
    )
    api.register(hanging.url, events=["deal.completed"])
    publish(app, brand, *(("deal.completed", {"n": n}) for n in range(9)))

    received = hanging.wait_for(9, timeout=40)
    # Healthy, it had four at once. The first two timeouts each free a slot for the next
    # delivery; from the third timeout in a row on, one attempt at a time.
    first_wave, later = received[:4], received[6:]
    assert max(r.received_at for r in first_wave) - min(r.received_at for r in first_wave) < 0.9
    gaps = [b.received_at - a.received_at for a, b in pairwise(later)]
    assert all(gap >= 0.9 for gap in gaps), (gaps, logs(own))


def test_a_round_that_records_a_whole_cohort_claims_the_next_one_at_once(
    app, api, brand, receiver, start_worker
):
    """Every attempt in flight ends at once and one round records them all: that round claims
    the next ones too. It used to count those results against its slots, claim nothing, and
    sleep its poll interval with nothing in flight to wake it: a second lost per cohort (one of
    two workers drew 256 attempts a second that way, beside the other's 2,000)."""
    concurrency, cohorts = 8, 30
    for number in range(4):  # 2 in flight each: the worker's 8 slots
        api.register(f"{receiver.url}/{number}")
    gate = threading.Event()
    receiver.default = Reply(hold=gate)
    own = start_worker(WEBHOOK_CONCURRENCY=str(concurrency), WEBHOOK_POLL_INTERVAL="1")
    publish(app, brand, *[("deal.completed", {"n": n}) for n in range(cohorts * 2)])
    # A few seconds' work; a second lost per cohort takes 30.
    deadline = time.monotonic() + 15
    try:
        for cohort in range(1, cohorts + 1):
            receiver.wait_for(concurrency * cohort, timeout=deadline - time.monotonic())
            # The whole cohort is waiting: the next one's gate first, then all answered at once.
            held, gate = gate, threading.Event()
            receiver.default = Reply(hold=gate)
            held.set()
    except AssertionError as error:
        raise AssertionError(f"cohort {cohort}: {error}\n{logs(own)}") from None
    finally:
        gate.set()
