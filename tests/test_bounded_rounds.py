"""Issue 41, item by item, with real worker processes where processes are involved: no brand's
backlog, lock or stall holds another brand's delivery; one attempt of a delivery on the wire at
a time, counted at the receiver; a subject held only behind a pending delivery; requests that
change a large queue do so in bounded batches; a stop past its grace exits 0; a round leaves
nothing on its connection.

A backlog is written with SQL (as the publisher writes it): through the API, 60,000 deliveries
would take minutes. 60,000 is the scale at which the old round's bulk statements stalled every
brand for seconds; bench/chaos.py runs the same attacks at 250,000.
"""

from __future__ import annotations

import contextlib
import re
import signal
import threading
import time
from collections import Counter
from datetime import timedelta

import psycopg
import pytest
from sqlalchemy import func, select, text, update

from extensions import db
from models import QueuedDelivery, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from models.columns import utcnow
from services.delivery import bulk
from services.delivery.health import apply_news, disable_endpoint, news_of
from services.delivery.loop import DeliveryLoop
from services.delivery.outcomes import Attempt, AttemptOutcome, RetryPolicy
from services.delivery.queue import claim_attempts, record_attempts
from services.endpoint_urls import UrlPolicy
from services.events import publish_event
from services.webhook_endpoints import delete_endpoint, register_endpoint, update_endpoint
from tests import test_webhook_delivery as delivery
from tests.bulk_jobs import run_bulk_jobs
from tests.receiver import Reply
from tests.test_webhook_delivery import Api, logs, poll, publish

api = delivery.api
workers = delivery.workers
start_worker = delivery.start_worker

BACKLOG = 60_000
# What a request's bulk job is tested on: several batches beyond the one the request runs (a
# queue of 60,000, two test runs at once saw every batch pass its 5 s for half a minute).
REQUEST_BACKLOG = 5_000
# psycopg prepares a statement on a connection after this many runs; the plan is kept from then.
PLANNED_AFTER = 5
LOCAL = UrlPolicy(https_only=False, allow_local=True)


@pytest.fixture
def other_api(client, make_brand, make_key) -> Api:
    """Another brand, calling the API with its own key: the brand that must not notice."""
    brand = make_brand("Bystander Foods")
    return Api(client, brand, make_key(brand))


def seed_backlog(app, endpoint_id: str, count: int, *, waiting_for_a_retry: bool = False) -> None:
    """`count` pending deliveries of one event to the endpoint, queued as the publisher queues
    them (due now), or waiting for a retry an hour away after a failed first attempt."""
    with app.app_context():
        brand_id = db.session.get(WebhookEndpoint, endpoint_id).brand_id
        event = publish_event(
            brand_id=brand_id,
            name="deal.completed",
            data={"n": -1},
            only_endpoint_ids=[endpoint_id],
        ).event
        db.session.execute(
            text(
                """
                WITH made AS (
                    INSERT INTO webhook_deliveries (id, brand_id, endpoint_id, event_id,
                        event_name, status, attempt_count, next_attempt_at, created_at)
                    SELECT 'whd_seed' || lpad(CAST(i AS text), 22, '0'), :brand_id,
                           :endpoint_id, :event_id, 'deal.completed', 'pending', :attempts,
                           statement_timestamp() + make_interval(secs => :delay),
                           statement_timestamp() - interval '1 minute'
                    FROM generate_series(1, :count) AS i
                    RETURNING id, next_attempt_at
                )
                INSERT INTO webhook_delivery_queue (delivery_id, endpoint_id, next_attempt_at,
                                                    attempt_count)
                SELECT id, :endpoint_id, next_attempt_at, :attempts FROM made
                """
            ),
            {
                "brand_id": brand_id,
                "endpoint_id": endpoint_id,
                "event_id": event.id,
                "count": count,
                "attempts": 1 if waiting_for_a_retry else 0,
                "delay": 3600 if waiting_for_a_retry else 0,
            },
        )
        db.session.commit()


def queued(app, endpoint_id: str, *, waiting_for_a_retry: bool = False) -> int:
    with app.app_context():
        query = select(func.count()).where(QueuedDelivery.endpoint_id == endpoint_id)
        if waiting_for_a_retry:
            query = query.where(QueuedDelivery.next_attempt_at > func.now())
        count = db.session.scalar(query)
        db.session.remove()
    return count


def delivered_while_queued(other_api: Api, app, brand: str, attacked: str, worker) -> int:
    """Publish an event of the other brand, wait for its delivery; how many deliveries the
    attacked endpoint still had queued (or waiting for a retry) at that moment."""
    [(_, [delivery_id])] = publish(app, brand, ("deal.completed", {"n": 1}))
    other_api.wait_delivery(delivery_id, "delivered", timeout=15, worker=worker)
    return queued(app, attacked)


# --- 1. A large backlog never stops the loop for every brand --------------------------------


def test_a_410_over_a_backlog_holds_back_no_other_brand(
    app, api, other_api, receivers, start_worker
):
    """The old round failed the endpoint's whole queue inside the record that met the 410: no
    other brand's delivery was recorded until it was done. Now the disable is one row, a job
    fails the queue in batches, and the other brand's event goes at once."""
    gone = receivers(Reply(status=410))
    healthy = receivers()
    attacked = api.register(gone.url)
    other_api.register(healthy.url)
    seed_backlog(app, attacked["id"], BACKLOG)
    worker = start_worker()
    gone.wait_for(1, timeout=20)
    poll(
        lambda: api.endpoint(attacked["id"])["isActive"],
        lambda active: not active,
        timeout=10,
        what="the endpoint disabled by its 410",
        worker=worker,
    )
    left = delivered_while_queued(other_api, app, other_api.brand, attacked["id"], worker)
    assert left > BACKLOG // 2, (left, logs(worker))
    # The rest is failed by the job, batch after batch; nothing more is sent to the receiver.
    poll(
        lambda: queued(app, attacked["id"]),
        lambda count: count == 0,
        timeout=120,
        what="the backlog ended",
        worker=worker,
    )
    assert len(gone.received) <= 2  # what was in flight at the 410 (the endpoint's limit)
    with app.app_context():
        statuses = Counter(
            db.session.scalars(
                select(WebhookDelivery.status).where(WebhookDelivery.endpoint_id == attacked["id"])
            )
        )
    assert statuses["pending"] == 0 and statuses["failed"] >= BACKLOG


def test_a_backlog_brought_forward_after_an_outage_holds_back_no_other_brand(
    app, api, other_api, receivers, start_worker
):
    """The old record brought every retry of an endpoint that answered again forward in one
    statement. Now a catch-up job does, in batches, while the other brand's events go."""
    back = receivers()
    healthy = receivers()
    attacked = api.register(back.url)
    other_api.register(healthy.url)
    seed_backlog(app, attacked["id"], BACKLOG, waiting_for_a_retry=True)
    with app.app_context():  # it was down: its breaker engaged, its probe due now
        db.session.execute(
            update(WebhookEndpoint)
            .where(WebhookEndpoint.id == attacked["id"])
            .values(consecutive_failures=5, failing_since=utcnow(), next_probe_at=utcnow())
        )
        db.session.commit()
    worker = start_worker()
    publish(app, api.brand, ("deal.completed", {"n": 0}))  # the probe, which succeeds
    back.wait_for(1, timeout=20)
    poll(
        lambda: api.endpoint(attacked["id"])["consecutiveFailures"],
        lambda failures: failures == 0,
        timeout=10,
        what="the endpoint's run of failures reset",
        worker=worker,
    )
    [(_, [delivery_id])] = publish(app, other_api.brand, ("deal.completed", {"n": 1}))
    other_api.wait_delivery(delivery_id, "delivered", timeout=15, worker=worker)
    left = queued(app, attacked["id"], waiting_for_a_retry=True)
    assert left > BACKLOG // 2, (left, logs(worker))
    poll(
        lambda: queued(app, attacked["id"], waiting_for_a_retry=True),
        lambda count: count == 0,
        timeout=120,
        what="every retry brought forward",
        worker=worker,
    )


def _take(token: str, *, slots: int) -> list:
    return claim_attempts(slots=slots, endpoint_limit=100, token=token, lease=POLICY.lease).attempts


def test_a_take_planned_on_a_small_queue_still_probes_it_once_it_is_large(app, api):
    """A round's statements are planned once per connection and kept. Planned while the queue
    held a row, the take kept a scan of the whole queue (its sequential scan was cheapest
    then); with a brand's 250,000 queued every take read them all, and every brand's
    deliveries fell 30 s behind (bench/chaos.py retry-pending). Read off the take's plan."""
    endpoint = api.register("http://127.0.0.1:9/hooks")
    publish(app, api.brand, *(("deal.completed", {"n": n}) for n in range(PLANNED_AFTER + 1)))
    with app.app_context():
        pid = db.session.execute(text("SELECT pg_backend_pid()")).scalar()
        db.session.commit()
        for _ in range(PLANNED_AFTER + 1):  # the take prepared, its plan kept, on a tiny queue
            assert len(_take("0000aaaa", slots=1)) == 1
    seed_backlog(app, endpoint["id"], BACKLOG)
    with app.app_context(), plans_of_the_session(same_backend=pid) as plans:
        assert len(_take("0000bbbb", slots=3)) == 3
    [take] = [plan for plan in plans if "endpoint AS MATERIALIZED" in plan]
    assert "Seq Scan on webhook_delivery_queue" not in take, take


def test_a_walk_past_its_wrap_reads_no_row_after_its_cursor(app, api, other_api):
    """A walk that wrapped round and found nothing more before its cursor read, with its upper
    bound a filter, every queue row after the cursor to the end of the index: a brand's
    250,000 queued there cost every round 80-120 ms (bench/chaos.py backlog-recovery)."""
    first = other_api.register("http://127.0.0.1:9/first")  # ids sort by creation
    large = api.register("http://127.0.0.1:9/large")
    publish(app, other_api.brand, ("deal.completed", {"n": 0}))
    seed_backlog(app, large["id"], BACKLOG)
    with app.app_context(), plans_of_the_session(analyze=True) as plans:
        # From `first`: `large`, then round to `first`, then nothing more before the cursor.
        claimed = claim_attempts(
            slots=2, endpoint_limit=1, token="0000aaaa", lease=POLICY.lease, cursor=first["id"]
        )
    assert {attempt.endpoint_id for attempt in claimed.attempts} == {first["id"], large["id"]}
    [walk] = [plan for plan in plans if "walk(endpoint_id" in plan]
    removed = [int(n) for n in re.findall(r"Rows Removed by Filter: (\d+)", walk)]
    assert max(removed, default=0) < 100, walk


@contextlib.contextmanager
def plans_of_the_session(*, same_backend: int | None = None, analyze: bool = False):
    """The plans of the statements run on the session's connection meanwhile (auto_explain, as
    notices); `same_backend`: that connection must be this backend's, or the test means
    nothing (the pool hands out its last connection first)."""
    connection = db.session.connection()
    if same_backend is not None:
        assert connection.execute(text("SELECT pg_backend_pid()")).scalar() == same_backend
    plans: list[str] = []

    def keep(notice) -> None:
        plans.append(notice.message_primary or "")

    raw = connection.connection.driver_connection
    raw.add_notice_handler(keep)
    settings = {
        "log_min_duration": "0",
        "log_level": "notice",
        "log_analyze": "on" if analyze else "off",
    }
    connection.execute(text("LOAD 'auto_explain'"))
    for name, value in settings.items():
        connection.execute(text(f"SET auto_explain.{name} = '{value}'"))
    db.session.commit()
    try:
        yield plans
    finally:
        connection = db.session.connection()
        for name in settings:
            connection.execute(text(f"RESET auto_explain.{name}"))
        db.session.commit()
        raw.remove_notice_handler(keep)


# --- 2. One locked endpoint row stalls nothing ----------------------------------------------


def test_a_session_holding_an_endpoint_row_holds_back_no_record(
    app, app_environ, api, other_api, receivers, start_worker
):
    """The old record locked every endpoint of its batch and waited: one row held by anyone
    stalled the batch and the claim after it. Now nothing in a round waits for it."""
    receiver = receivers()
    mine = api.register(receiver.url)
    theirs = other_api.register(receiver.url)
    worker = start_worker()
    worker.wait_started()
    url = app_environ["DATABASE_URL"].replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url) as holder:
        holder.execute(
            "SELECT 1 FROM webhook_endpoints WHERE id = %s FOR NO KEY UPDATE", [theirs["id"]]
        )
        # Both brands' events in one transaction: claimed and recorded in one round.
        with app.app_context():
            ours = publish_event(brand_id=api.brand, name="deal.completed", data={"n": 1})
            other = publish_event(brand_id=other_api.brand, name="deal.completed", data={"n": 2})
            db.session.commit()
        # Before, neither was ever recorded while the row was held: the round failed forever.
        api.wait_delivery(ours.delivery_ids[0], "delivered", timeout=10, worker=worker)
        other_api.wait_delivery(other.delivery_ids[0], "delivered", timeout=10, worker=worker)
        assert mine["id"] != theirs["id"]
        holder.rollback()


# --- 3 and 4. One attempt of a delivery on the wire at a time --------------------------------


def test_a_worker_stalled_after_its_claim_never_sends_beside_the_one_that_took_over(
    app, api, brand, receivers, start_worker
):
    """Worker A stalls 10 s after its first claim (the failpoint: a process frozen for a
    while), past its leases' start window: it must not send them late, while worker B, which
    took them when they lapsed, has them on the wire. Overlaps are counted at the receiver, from
    each request's arrival to its answer or the sender's hang-up."""
    receiver = receivers(Reply(delay=2.5))
    api.register(receiver.url)
    delivery_ids = [
        ids[0] for _, ids in publish(app, brand, *(("deal.completed", {"n": n}) for n in range(6)))
    ]
    stalled = start_worker(WEBHOOK_TIMEOUT="3", FAILPOINTS="delivery.after_claim=sleep-once:10")
    poll(
        lambda: leased(app, delivery_ids),
        lambda held: bool(held),
        timeout=20,
        what="worker A's first leases",
        worker=stalled,
    )
    taking_over = start_worker(WEBHOOK_TIMEOUT="3")
    try:
        for delivery_id in delivery_ids:
            api.wait_delivery(delivery_id, "delivered", timeout=60)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{logs(stalled, taking_over)}") from None
    time.sleep(1)  # anything A might still send, it sends now
    assert receiver.overlaps() == [], logs(stalled, taking_over)
    assert "not started" in stalled.output()


@contextlib.contextmanager
def row_held(app_environ, delivery_id: str):
    """Another session holds the delivery's row (FOR UPDATE) until the block ends."""
    url = app_environ["DATABASE_URL"].replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url) as holder:
        holder.execute("SELECT 1 FROM webhook_deliveries WHERE id = %s FOR UPDATE", [delivery_id])
        yield
        holder.rollback()


def test_a_record_held_back_within_its_lease_sends_nothing_twice(
    app, app_environ, api, brand, receivers, start_worker
):
    """Another session holds the delivery's row for 6 s after the receiver answered: the
    record skips it and writes it in a later round, before the lease ends, so a second worker
    never takes it. Before, the record waited on the row (5 s), failed, waited again, and the
    lease (the timeout plus 5 s) lapsed: the second worker sent it again."""
    gate = threading.Event()
    receiver = receivers()
    receiver.reply_with(Reply(hold=gate))
    api.register(receiver.url)
    # A timeout well past the hold, so the attempt is answered, not timed out, when the gate opens.
    first = start_worker(WEBHOOK_TIMEOUT="10")
    [(_, [delivery_id])] = publish(app, brand, ("deal.completed", {"n": 1}))
    receiver.wait_for(1, timeout=20)
    second = start_worker(WEBHOOK_TIMEOUT="10")
    second.wait_started()
    with row_held(app_environ, delivery_id):
        gate.set()
        time.sleep(6)
    api.wait_delivery(delivery_id, "delivered", timeout=20, worker=first)
    time.sleep(2)
    assert [r.delivery_id for r in receiver.received] == [delivery_id], logs(first, second)


def test_a_record_held_back_past_its_lease_may_send_again_but_never_at_once(
    app, app_environ, api, brand, receivers, start_worker
):
    """Held for 15 s, past the lease: the second worker takes the delivery and sends it again
    (a receiver dedupes on X-Service-Delivery), after the first attempt ended, never beside it;
    the first worker's late result is discarded, its lease having gone to the second."""
    gate = threading.Event()
    receiver = receivers()
    receiver.reply_with(Reply(hold=gate))
    api.register(receiver.url)
    first = start_worker()
    [(_, [delivery_id])] = publish(app, brand, ("deal.completed", {"n": 1}))
    receiver.wait_for(1, timeout=20)
    second = start_worker()
    with row_held(app_environ, delivery_id):
        gate.set()
        receiver.wait_for(2, timeout=30)
    api.wait_delivery(delivery_id, "delivered", timeout=20, worker=second)
    assert receiver.overlaps() == [], logs(first, second)
    with app.app_context():
        logged = db.session.scalar(
            select(func.count()).where(WebhookAttempt.delivery_id == delivery_id)
        )
    assert logged == 1, logs(first, second)


def leased(app, delivery_ids: list[str]) -> set[str]:
    with app.app_context():
        held = set(
            db.session.scalars(
                text(
                    "SELECT delivery_id FROM webhook_delivery_leases WHERE delivery_id = ANY(:ids)"
                ),
                {"ids": delivery_ids},
            )
        )
        db.session.remove()
    return held


# --- 5. A subject is held only behind a pending delivery ------------------------------------

POLICY = RetryPolicy(schedule=(60,), disable_failures=1000, disable_window=timedelta(days=1))


def _outcome(status: int = 200) -> AttemptOutcome:
    return AttemptOutcome(
        requested_at=utcnow(),
        duration_ms=1,
        request_headers={},
        http_status=status,
        error=None if status == 200 else f"HTTP {status}",
    )


def _claim(token: str, now=None):
    claimed = claim_attempts(
        slots=10, endpoint_limit=4, token=token, lease=POLICY.lease, now=now
    ).attempts
    db.session.commit()
    return claimed


def _record(results) -> None:
    recorded = record_attempts(results, policy=POLICY)
    apply_news(news_of(results, recorded), policy=POLICY)
    db.session.commit()


def _end_by_record_success(app, brand, endpoint_id, first):
    _record([(first, _outcome())])


def _end_by_record_last_failure(app, brand, endpoint_id, first):
    # The schedule has one retry: the second failure is the last attempt.
    _record([(first, _outcome(500))])
    retry_at = db.session.get(QueuedDelivery, first.delivery_id).next_attempt_at
    [again] = [a for a in _claim("0000eeee", now=retry_at) if a.delivery_id == first.delivery_id]
    _record([(again, _outcome(500))])


def _end_by_disable(app, brand, endpoint_id, first):
    """Disabled and re-enabled at once, the earlier one in flight; its worker dies (the lease
    lapses) and the job ends it."""
    update_endpoint(brand_id=brand, endpoint_id=endpoint_id, policy=LOCAL, is_active=False)
    db.session.commit()
    update_endpoint(brand_id=brand, endpoint_id=endpoint_id, policy=LOCAL, is_active=True)
    db.session.execute(
        text("UPDATE webhook_delivery_leases SET leased_until = now() - interval '1 second'")
    )
    db.session.commit()
    run_bulk_jobs(app)


def _end_by_delete(app, brand, endpoint_id, first):
    delete_endpoint(brand_id=brand, endpoint_id=endpoint_id)
    db.session.commit()
    db.session.execute(
        text("UPDATE webhook_delivery_leases SET leased_until = now() - interval '1 second'")
    )
    db.session.commit()
    run_bulk_jobs(app)


def _end_by_service_disable(app, brand, endpoint_id, first):
    """A 410 disables it: its record ends the one in flight."""
    _record(
        [
            (
                first,
                AttemptOutcome(
                    requested_at=utcnow(),
                    duration_ms=1,
                    request_headers={},
                    http_status=410,
                    error="HTTP 410 Gone",
                    gone=True,
                ),
            )
        ]
    )
    run_bulk_jobs(app)


def _release_by_turning_ordering_off(app, brand, endpoint_id, first):
    update_endpoint(brand_id=brand, endpoint_id=endpoint_id, policy=LOCAL, ordering="none")
    db.session.commit()
    run_bulk_jobs(app)


@pytest.mark.parametrize(
    "end",
    [
        _end_by_record_success,
        _end_by_record_last_failure,
        _end_by_disable,
        _end_by_delete,
        _end_by_service_disable,
        _release_by_turning_ordering_off,
    ],
    ids=lambda end: end.__name__.removeprefix("_"),
)
def test_a_subject_is_held_only_behind_a_pending_delivery(app, brand, end):
    """Whatever path ends the earlier delivery of a subject (or turns ordering off), nothing
    stays held behind it: what the subject has next goes (or, on a closed endpoint, ends with
    the rest), and an event of the subject published afterwards is not held either."""
    with app.app_context():
        endpoint_id = register_endpoint(
            brand_id=brand,
            url="http://127.0.0.1:9/hooks",
            events=["deal.completed"],
            policy=LOCAL,
            ordering="subject",
        ).id
        db.session.commit()
        publish_event(brand_id=brand, name="deal.completed", data={"id": "deal_x", "n": 0})
        db.session.commit()
        [first] = _claim("0000aaaa")
        second = publish_event(
            brand_id=brand, name="deal.completed", data={"id": "deal_x", "n": 1}
        ).delivery_ids[0]
        db.session.commit()
        assert _claim("0000bbbb") == []  # held behind the first
        assert db.session.get(QueuedDelivery, second).held_behind == first.delivery_id

        end(app, brand, endpoint_id, first)

        db.session.expire_all()
        if db.session.get(WebhookEndpoint, endpoint_id).is_active:
            publish_event(brand_id=brand, name="deal.completed", data={"id": "deal_x", "n": 2})
            db.session.commit()
        # Nothing waits behind a delivery that is not pending.
        behind = db.session.execute(
            select(QueuedDelivery.delivery_id, WebhookDelivery.status)
            .join(WebhookDelivery, WebhookDelivery.id == QueuedDelivery.held_behind)
            .where(QueuedDelivery.endpoint_id == endpoint_id)
        ).all()
        assert all(status == "pending" for _, status in behind), behind
        statuses = dict(
            db.session.execute(
                select(WebhookDelivery.id, WebhookDelivery.status).where(
                    WebhookDelivery.endpoint_id == endpoint_id
                )
            ).all()
        )
        if db.session.get(WebhookEndpoint, endpoint_id).is_active:
            # The subject's next pending delivery is the one a claim takes.
            later = utcnow() + POLICY.lease + timedelta(seconds=1)
            taken = [a.delivery_id for a in _claim("0000cccc", now=later)]
            waiting = sorted(d for d, status in statuses.items() if status == "pending")
            assert taken and taken[0] == waiting[0], (taken, statuses)
        else:
            assert set(statuses.values()) <= {"failed", "delivered"}, statuses


def test_a_subject_held_behind_a_disabled_then_re_enabled_endpoints_lost_attempt_goes(
    app, api, brand, receivers, start_worker
):
    """The measured case, with processes: an ordered endpoint's first event is in flight when
    the endpoint is disabled and enabled again; its worker dies. The second event of the same
    deal must not wait forever behind a delivery that is no longer pending."""
    gate = threading.Event()
    receiver = receivers()
    receiver.reply_with(Reply(hold=gate))
    endpoint = api.register(receiver.url, ordering="subject")
    doomed = start_worker(WEBHOOK_TIMEOUT="5")
    [(_, [first])] = publish(app, brand, ("deal.completed", {"id": "deal_y", "n": 0}))
    receiver.wait_for(1, timeout=20)
    for active in (False, True):
        api.call("PATCH", f"webhook/{endpoint['id']}/update-endpoint", json={"isActive": active})
    [(_, [second])] = publish(app, brand, ("deal.completed", {"id": "deal_y", "n": 1}))
    doomed.kill()
    gate.set()
    successor = start_worker()
    detail = api.wait_delivery(second, "delivered", timeout=40, worker=successor)
    assert detail["heldBehind"] is None
    assert api.delivery(first)["status"] == "failed"


# --- 6. Requests that change a large queue do so in bounded batches --------------------------


def test_retry_pending_over_a_large_queue_answers_at_once_and_a_job_does_the_rest(app, api, client):
    endpoint = api.register("http://127.0.0.1:9/hooks")
    seed_backlog(app, endpoint["id"], REQUEST_BACKLOG, waiting_for_a_retry=True)
    answer = api.call("POST", f"webhook/{endpoint['id']}/retry-pending", 202)
    assert answer["due"] == REQUEST_BACKLOG
    # The request brought its first batch forward, unless the database was too loaded to do it
    # within the request's bound (the next test); the rest is the job's, in the workers.
    left = queued(app, endpoint["id"], waiting_for_a_retry=True)
    assert left in (REQUEST_BACKLOG - 1000, REQUEST_BACKLOG)
    run_bulk_jobs(app)
    assert queued(app, endpoint["id"], waiting_for_a_retry=True) == 0


def test_a_first_batch_too_slow_for_the_request_is_left_to_the_job(app, api, monkeypatch):
    """Under a loaded database the first batch cannot finish within the request's bound: it
    is undone, the request still answers (not a 503), and the job does every batch."""
    monkeypatch.setattr(bulk, "FIRST_BATCH_TIMEOUT", "1ms")
    endpoint = api.register("http://127.0.0.1:9/hooks")
    seed_backlog(app, endpoint["id"], REQUEST_BACKLOG, waiting_for_a_retry=True)
    answer = api.call("POST", f"webhook/{endpoint['id']}/retry-pending", 202)
    assert answer["due"] == REQUEST_BACKLOG
    assert queued(app, endpoint["id"], waiting_for_a_retry=True) == REQUEST_BACKLOG
    run_bulk_jobs(app)
    assert queued(app, endpoint["id"], waiting_for_a_retry=True) == 0


def test_a_delete_over_a_large_queue_stops_every_attempt_at_once_and_a_job_ends_the_rest(app, api):
    endpoint = api.register("http://127.0.0.1:9/hooks")
    seed_backlog(app, endpoint["id"], REQUEST_BACKLOG)
    api.call("DELETE", f"webhook/{endpoint['id']}/delete-endpoint")
    # Its first batch in the request, unless the database was too loaded (the test above).
    assert queued(app, endpoint["id"]) in (REQUEST_BACKLOG + 1 - 1000, REQUEST_BACKLOG + 1)
    with app.app_context():
        assert _claim("0000aaaa") == []  # nothing more is attempted
    run_bulk_jobs(app)
    assert queued(app, endpoint["id"]) == 0


# --- 7 and 8. A stop past its grace exits 0; a round leaves nothing on its connection --------


def test_a_stop_past_its_grace_exits_0(app, api, brand, receivers, start_worker):
    """Its records cannot be written within the grace (the failpoint holds them): the loop
    abandons them (their leases lapse) and the worker exits 0, not as a crash."""
    receiver = receivers()
    api.register(receiver.url)
    stopping = start_worker(FAILPOINTS="delivery.before_record=sleep:30")
    publish(app, brand, ("deal.completed", {"n": 1}))
    receiver.wait_for(1, timeout=20)
    time.sleep(0.5)  # the round with the result is in its failpoint
    stopping.process.send_signal(signal.SIGTERM)
    stopping.process.wait(30)
    assert stopping.process.returncode == 0, logs(stopping)
    assert "loop died" not in stopping.output()


def test_a_round_leaves_no_setting_on_its_connection_and_the_loop_closes_it(app, brand):
    """Behind a transaction-mode pooler a session setting lands on whichever server connection
    the pooler hands out next: each transaction of a round sets its own limits, and a stopped
    loop gives its connection back."""
    with app.app_context():
        register_endpoint(
            brand_id=brand, url="http://127.0.0.1:9/hooks", events=["deal.completed"], policy=LOCAL
        )
        publish_event(brand_id=brand, name="deal.completed", data={"n": 1})
        db.session.commit()
        checked_out = db.engine.pool.checkedout()
    loop = DeliveryLoop(app)
    try:
        poll(
            lambda: loop._beat_at,
            lambda beat: beat > 0,
            timeout=10,
            what="the loop's first round",
        )
    finally:
        loop.stop(grace=3)
    with app.app_context():
        assert db.engine.pool.checkedout() == checked_out
        # Every connection the pool holds now, the loop's included, has the server's defaults.
        connections = [db.engine.connect() for _ in range(db.engine.pool.checkedin())]
        try:
            for connection in connections:
                assert connection.exec_driver_sql("SHOW statement_timeout").scalar() == "0"
                assert connection.exec_driver_sql("SHOW lock_timeout").scalar() == "0"
        finally:
            for connection in connections:
                connection.close()


def test_disable_endpoint_from_the_round_runs_no_batch(app, brand):
    """The round disables in O(1): the job's batches are the runners'."""
    with app.app_context():
        endpoint = register_endpoint(
            brand_id=brand, url="http://127.0.0.1:9/hooks", events=["deal.completed"], policy=LOCAL
        ).id
        db.session.commit()
    seed_backlog(app, endpoint, 3000)
    with app.app_context():
        gone = AttemptOutcome(
            requested_at=utcnow(),
            duration_ms=1,
            request_headers={},
            http_status=410,
            error="HTTP 410 Gone",
            gone=True,
        )
        attempt = Attempt(
            delivery_id="whd_01m8hj34hbd67ygzk7c5jpxzkf",
            brand_id=brand,
            endpoint_id=endpoint,
            event_id="evt_01m8hj34hbd67ygzk7c5jpxzkf",
            event_name="deal.completed",
            attempt_number=1,
            body=b"{}",
            url="http://127.0.0.1:9/hooks",
            secret_ciphertext="",
            previous_secret_ciphertext=None,
            token="test",
        )
        assert disable_endpoint(
            endpoint, reason="test", now=utcnow(), by_service=True, failed=(attempt, gone)
        )
        db.session.commit()
    assert queued(app, endpoint) == 3001
